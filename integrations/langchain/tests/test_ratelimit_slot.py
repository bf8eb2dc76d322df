"""The core limiter in LangChain's own ``rate_limiter=`` slot, where LangChain alone differs.

A plain ``ChatOpenAI`` calls ``acquire(blocking=True)`` once per request; what both
frameworks share is in tests/behaviour/test_ratelimit_slot.py. The model talks HTTP to a
local fault-injecting server; the limiter runs on a frozen clock.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from langchain_openai import ChatOpenAI

import langchain_llm_resilience  # noqa: F401  (registers the core limiters)
from llm_resilience.ratelimit import TokenBucketRateLimiter
from llm_resilience.testing import FaultInjectingServer


class FrozenClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server() -> Iterator[FaultInjectingServer]:
    # A fresh server (fresh port) per test: langchain-openai caches its async HTTP client
    # per base URL, and every async test has its own event loop.
    with FaultInjectingServer(reply="Paris is the capital.") as running:
        yield running


def chat_model(server: FaultInjectingServer, limiter: TokenBucketRateLimiter) -> ChatOpenAI:
    return ChatOpenAI(
        model="gpt-4o-mini",
        base_url=server.openai_base_url,
        api_key="t",  # type: ignore[arg-type]
        max_retries=0,
        timeout=10,
        rate_limiter=limiter,  # type: ignore[arg-type]
    )


def permits_left(limiter: TokenBucketRateLimiter) -> int:
    left = 0
    while limiter.acquire(blocking=False):
        left += 1
    return left


def test_chat_openai_takes_one_permit_per_prompt_of_a_batch(server: FaultInjectingServer) -> None:
    # One permit per call in every call shape, and the registration, are shared:
    # tests/behaviour/test_ratelimit_slot.py.
    limiter = TokenBucketRateLimiter(60, clock=FrozenClock())
    model = chat_model(server, limiter)

    assert len(model.batch(["one", "two"])) == 2

    assert len(server.requests) == 2
    assert permits_left(limiter) == 60 - 2
