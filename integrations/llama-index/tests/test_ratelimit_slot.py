"""The core limiter in LlamaIndex's own ``rate_limiter=`` slot, for completions.

Any LlamaIndex LLM calls ``acquire()`` / ``async_acquire()`` once per request; what both
frameworks share is in tests/behaviour/test_ratelimit_slot.py. The OpenAI LLM talks HTTP
to a local fault-injecting server; the limiter runs on a frozen clock.
"""

from __future__ import annotations

from collections.abc import Iterator

import llama_index.resilience  # noqa: F401  (registers the core limiters)
import pytest

from llm_resilience.ratelimit import TokenBucketRateLimiter
from llm_resilience.testing import FaultInjectingServer

openai_llms = pytest.importorskip("llama_index.llms.openai")

REPLY = "Paris is the capital."


class FrozenClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply=REPLY) as running:
        yield running


def openai_llm(server: FaultInjectingServer, limiter: TokenBucketRateLimiter) -> object:
    return openai_llms.OpenAI(
        model="gpt-4o-mini",
        api_base=server.openai_base_url,
        api_key="t",
        max_retries=0,
        timeout=10,
        rate_limiter=limiter,
    )


def permits_left(limiter: TokenBucketRateLimiter) -> int:
    left = 0
    while limiter.acquire(blocking=False):
        left += 1
    return left


def test_openai_llm_takes_one_permit_per_completion(server: FaultInjectingServer) -> None:
    # One permit per chat call in every call shape, and the registration, are shared:
    # tests/behaviour/test_ratelimit_slot.py.
    limiter = TokenBucketRateLimiter(60, clock=FrozenClock())
    llm: object = openai_llm(server, limiter)

    assert llm.complete("Capital of France?").text == REPLY  # type: ignore[attr-defined]
    assert len(server.requests) == 1
    assert permits_left(limiter) == 60 - 1


async def test_openai_llm_takes_one_permit_per_async_completion(
    server: FaultInjectingServer,
) -> None:
    limiter = TokenBucketRateLimiter(60, clock=FrozenClock())
    llm: object = openai_llm(server, limiter)

    assert (await llm.acomplete("Capital of France?")).text == REPLY  # type: ignore[attr-defined]
    assert len(server.requests) == 1
    assert permits_left(limiter) == 60 - 1
