"""A fallback chain's opt-in features cost nothing when off: a healthy call, in every
call shape of both adapters, runs none of their code.

Every Python function the call runs (on its thread and on any thread it starts) is
recorded with ``sys.setprofile``/``threading.setprofile``. With a feature off, no function
of the core modules that implement it runs, beyond the one check that it is off
(`TimeLimits.any`). With it on, the same call runs them: the positive control that shows
the recording sees that code when it is used.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from driver import Mode

from llm_resilience import Cooldown, RetryPolicy
from llm_resilience import fallback as fallback_package

_FALLBACK = Path(fallback_package.__file__).parent
_ASYNCIO = Path(asyncio.__file__).parent
_ASYNCIO_TIMEOUTS = "asyncio/timeouts.py"

#: Each opt-in feature: the options that turn it on, and the core modules only it runs.
FEATURES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "hedging": ({"hedge_after": 5.0}, ("_hedge.py", "_hedge_stream.py")),
    "time limits": (  # an async call's bound is an ``asyncio.timeout`` scope
        {"first_token_timeout": 5.0, "idle_timeout": 5.0, "per_client_timeout": 10.0},
        ("_deadlines.py", "_workers.py", _ASYNCIO_TIMEOUTS),
    ),
    "member retry": (
        {"member_retry": RetryPolicy(attempts=2, base_delay=0)},
        ("_member_retry.py",),
    ),
    "cooldown": ({"cooldown": Cooldown(failures=3, window=1, duration=1)}, ("_breaker.py",)),
}
#: The checks that a feature is off, the only functions of its modules an off call runs.
OFF_CHECKS = {("_deadlines.py", "any")}


@contextmanager
def functions_run() -> Iterator[set[tuple[str, str]]]:
    """(file, function) of every function of ``llm_resilience.fallback`` (by file name)
    and of ``asyncio`` (``asyncio/`` and its file name) run inside the block, on this
    thread and on threads started inside it."""
    seen: set[tuple[str, str]] = set()

    def record(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            path = Path(frame.f_code.co_filename)
            if path.parent == _FALLBACK:
                seen.add((path.name, frame.f_code.co_name))
            elif path.parent == _ASYNCIO:
                seen.add((f"asyncio/{path.name}", frame.f_code.co_name))

    sys.setprofile(record)
    threading.setprofile(record)
    try:
        yield seen
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


async def run_recorded(driver: Any, chain: Any, mode: Mode) -> set[tuple[str, str]]:
    await driver.run(chain, mode)  # first use: anything made once is made here
    with functions_run() as seen:
        reply = await driver.run(chain, mode)
    assert reply.text == "from the primary"
    return seen


@pytest.mark.parametrize("feature", sorted(FEATURES))
async def test_a_feature_left_off_runs_none_of_its_code(
    driver: Any, mode: Mode, feature: str
) -> None:
    _, modules = FEATURES[feature]
    chain = driver.fallback([driver.answering("from the primary"), driver.answering()])

    seen = await run_recorded(driver, chain, mode)

    assert {run for run in seen if run[0] in modules} - OFF_CHECKS == set()
    assert any(name == "_engine.py" for name, _ in seen)  # the chain itself was recorded


@pytest.mark.parametrize("feature", sorted(FEATURES))
async def test_a_feature_turned_on_runs_its_code(driver: Any, mode: Mode, feature: str) -> None:
    options, modules = FEATURES[feature]
    chain = driver.fallback([driver.answering("from the primary"), driver.answering()], **options)

    seen = await run_recorded(driver, chain, mode)

    assert {run for run in seen if run[0] in modules} - OFF_CHECKS
