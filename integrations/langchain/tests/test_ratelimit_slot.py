"""The core limiter in LangChain's own ``rate_limiter=`` slot.

Importing ``langchain_llm_resilience`` registers the core limiters as virtual subclasses
of ``langchain_core.rate_limiters.BaseRateLimiter``, so a plain ``ChatOpenAI`` accepts one
(its pydantic field checks ``isinstance``) and calls ``acquire(blocking=True)`` /
``aacquire(blocking=True)`` once per request. The model talks HTTP to a local
fault-injecting server; the limiter runs on a frozen clock, so its count of permits is
exact.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from langchain_core.rate_limiters import BaseRateLimiter
from langchain_openai import ChatOpenAI

import langchain_llm_resilience  # noqa: F401  (registers the core limiters)
from llm_resilience.ratelimit import RedisTokenBucketRateLimiter, TokenBucketRateLimiter
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


def test_importing_the_adapter_registers_both_limiters_as_langchain_rate_limiters() -> None:
    code = (
        "import langchain_llm_resilience\n"
        "from langchain_core.rate_limiters import BaseRateLimiter\n"
        "from llm_resilience.ratelimit import RedisTokenBucketRateLimiter as R, "
        "TokenBucketRateLimiter as T\n"
        "print(issubclass(T, BaseRateLimiter), issubclass(R, BaseRateLimiter))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]
    assert isinstance(TokenBucketRateLimiter(60), BaseRateLimiter)
    assert issubclass(RedisTokenBucketRateLimiter, BaseRateLimiter)


def test_chat_openai_takes_one_permit_per_sync_call(server: FaultInjectingServer) -> None:
    limiter = TokenBucketRateLimiter(60, clock=FrozenClock())
    model = chat_model(server, limiter)
    assert model.rate_limiter is limiter

    assert model.invoke("Capital of France?").content == "Paris is the capital."
    chunks = list(model.stream("Capital of France?"))
    assert "".join(str(chunk.content) for chunk in chunks) == "Paris is the capital."
    assert len(model.batch(["one", "two"])) == 2

    assert len(server.requests) == 4
    assert permits_left(limiter) == 60 - 4


async def test_chat_openai_takes_one_permit_per_async_call(server: FaultInjectingServer) -> None:
    limiter = TokenBucketRateLimiter(60, clock=FrozenClock())
    model = chat_model(server, limiter)

    assert (await model.ainvoke("Capital of France?")).content == "Paris is the capital."
    text = "".join([str(chunk.content) async for chunk in model.astream("Capital of France?")])
    assert text == "Paris is the capital."

    assert len(server.requests) == 2
    assert permits_left(limiter) == 60 - 2


async def test_a_call_over_budget_waits_in_the_slot_and_goes_when_its_permit_comes(
    server: FaultInjectingServer,
) -> None:
    clock = FrozenClock()
    limiter = TokenBucketRateLimiter(60, clock=clock)
    model = chat_model(server, limiter)
    assert permits_left(limiter) == 60

    call = asyncio.create_task(model.ainvoke("Capital of France?"))
    deadline = time.monotonic() + 5
    while limiter.queued == 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.05)
    assert not call.done()
    assert server.requests == []  # held before any HTTP request

    clock.now = 1.0
    assert limiter.acquire(blocking=False) is False  # the waiting call goes first
    assert (await asyncio.wait_for(call, 5)).content == "Paris is the capital."
    assert len(server.requests) == 1
