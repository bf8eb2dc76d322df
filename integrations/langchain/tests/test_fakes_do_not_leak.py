"""The shipped failing fake can fail thousands of times without growing the process.

A fake that re-raised one exception object kept every raise alive through that object's
ever longer traceback (about 15 KB a call through a fallback chain): a soak test of a
user's stack would measure our fake, not their code.
"""

from __future__ import annotations

import gc
import logging
import tracemalloc
from collections.abc import Callable

import pytest

from langchain_llm_resilience import FallbackChatModel
from langchain_llm_resilience.testing import FailingChatModel, rate_limit_error

CALLS = 5_000
#: Bytes a call may leave behind, on average, in the second half of the run. The old
#: fake left about 14,000 (35 MB over 2,500 calls); fresh copies leave about 6.
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


def test_five_thousand_failing_calls_through_a_fallback_chain_leave_nothing_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # pytest keeps every captured record: 5,000 fallback warnings would be its growth.
    caplog.set_level(logging.ERROR, logger="llm_resilience.fallback")
    error = rate_limit_error()
    primary = FailingChatModel(error=error)
    chain = FallbackChatModel(models=[primary, FailingChatModel()])
    raised: list[BaseException] = []

    def call() -> None:
        try:
            chain.invoke("hello")
        except Exception as failure:  # the last member's rate limit error
            if not raised:
                raised.append(failure)

    growth = traced_growth(call, CALLS)

    assert growth < ALLOWED_BYTES_PER_CALL * (CALLS // 2), f"{growth} bytes kept"
    # The configured error itself was never raised, so it holds no traceback at all.
    assert error.__traceback__ is None
    assert primary.calls == CALLS
    assert type(raised[0]).__name__ == "RateLimitError"
