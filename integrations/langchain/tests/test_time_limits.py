"""A healthy minute-long LangChain stream under the recommended time limits (the limits
themselves, in both adapters and every call shape, are in
``tests/behaviour/test_time_limits.py``).
"""

from __future__ import annotations

import json
import subprocess

import pytest


@pytest.mark.timeout(180)
def test_a_healthy_sixty_second_stream_is_never_cut_by_the_recommended_limits(
    long_stream_run: subprocess.Popen[str],
) -> None:
    """A 60 s answer with a token every 2 s finishes under first_token_timeout=5 and
    idle_timeout=5: no restart, nothing sent to the secondary. The stream runs in its own
    process (``long_stream.py``), started by the conftest when collection ends."""
    out, err = long_stream_run.communicate(timeout=170)
    assert long_stream_run.returncode == 0, err[-2000:]
    outcome = json.loads(out)
    assert outcome["seconds"] >= 30 * 2.0
    assert outcome["whole"] is True
    assert outcome["restarts"] == 0
    assert outcome["secondary_requests"] == 0
