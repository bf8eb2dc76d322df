"""The shipped failing fakes can fail a thousand times without growing the process.

A fake that re-raised one exception object kept every raise alive through that object's
ever longer traceback (about 15 KB a call through a LangChain fallback chain, 7 KB through
a LlamaIndex one): a soak test of a user's stack would measure our fake, not their code.
"""

from __future__ import annotations

import gc
import logging
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

#: The leak grew linearly with the calls, so 1,000 show it as plainly as 5,000 did: the
#: old fakes (a fake raising its one configured object) keep 4.4 MB (LlamaIndex) and 7.4 MB
#: (LangChain) over the 500 traced calls, 18 and 30 times the allowance below.
CALLS = 1_000
#: Bytes a call may leave behind, on average, in the second half of the run. The old
#: fakes left about 14,000 (LangChain) and 6,800 (LlamaIndex); fresh copies leave under 10.
ALLOWED_BYTES_PER_CALL = 500


def traced_growth(call: Callable[[], None], calls: int) -> int:
    """Bytes the second half of ``calls`` calls left allocated, as ``tracemalloc`` sees them.

    The first half runs untraced (tracing makes a call about five times slower): it fills
    whatever caches a first call fills, so only what each call keeps can remain.
    """
    for _ in range(calls // 2):
        call()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(calls - calls // 2):
            call()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_a_thousand_failing_calls_through_a_fallback_chain_leave_nothing_behind(
    driver: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # pytest keeps every captured record: 1,000 fallback warnings would be its growth.
    caplog.set_level(logging.ERROR, logger="llm_resilience.fallback")
    error = driver.rate_limit_error()
    primary = driver.failing(error)
    chain = driver.fallback([primary, driver.failing()])
    raised: list[BaseException] = []

    def call() -> None:
        try:
            driver.run_sync(chain)
        except Exception as failure:  # the last member's rate limit error
            if not raised:
                raised.append(failure)

    growth = traced_growth(call, CALLS)

    assert growth < ALLOWED_BYTES_PER_CALL * (CALLS // 2), f"{growth} bytes kept"
    # The configured error itself was never raised, so it holds no traceback at all.
    assert error.__traceback__ is None
    assert driver.calls(primary) == CALLS
    assert type(raised[0]).__name__ == "RateLimitError"
