"""Starts the suite's one minute-long scenario early, so it runs beside the other tests.

``long_stream.py`` streams a healthy sixty-second answer (see
``test_time_limits.py::test_a_healthy_sixty_second_stream_is_never_cut_by_the_recommended_limits``).
It runs in a process of its own, started when collection ends if that test was collected,
so it touches none of this process's threads, ports or event loops; the test waits for it
and checks what it printed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

LONG_STREAM_TEST = "test_a_healthy_sixty_second_stream_is_never_cut_by_the_recommended_limits"
_started: dict[str, subprocess.Popen[str]] = {}


def _start() -> subprocess.Popen[str]:
    script = Path(__file__).with_name("long_stream.py")
    return subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(item.name == LONG_STREAM_TEST for item in session.items):
        _started["run"] = _start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    run = _started.pop("run", None)
    if run is not None and run.poll() is None:
        run.kill()
        run.wait()


@pytest.fixture
def long_stream_run() -> subprocess.Popen[str]:
    """The scenario's process (started now if collection did not start it)."""
    return _started.pop("run", None) or _start()
