"""The core limiter in LlamaIndex's own ``rate_limiter=`` slot.

Importing ``llama_index.resilience`` registers the core limiters as virtual subclasses of
``llama_index.core.rate_limiter.BaseRateLimiter``; any LlamaIndex LLM then calls their
``acquire()`` / ``async_acquire()`` once per request. The OpenAI LLM talks HTTP to a
local fault-injecting server; the limiter runs on a frozen clock, so its count of
permits is exact.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator

import llama_index.resilience  # noqa: F401  (registers the core limiters)
import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.rate_limiter import BaseRateLimiter

from llm_resilience.ratelimit import RedisTokenBucketRateLimiter, TokenBucketRateLimiter
from llm_resilience.testing import FaultInjectingServer

openai_llms = pytest.importorskip("llama_index.llms.openai")

REPLY = "Paris is the capital."
QUESTION = [ChatMessage(role=MessageRole.USER, content="Capital of France?")]


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


def test_importing_the_adapter_registers_both_limiters_as_llama_index_rate_limiters() -> None:
    code = (
        "import llama_index.resilience\n"
        "from llama_index.core.rate_limiter import BaseRateLimiter\n"
        "from llm_resilience.ratelimit import RedisTokenBucketRateLimiter as R, "
        "TokenBucketRateLimiter as T\n"
        "print(issubclass(T, BaseRateLimiter), issubclass(R, BaseRateLimiter))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]
    assert isinstance(TokenBucketRateLimiter(60), BaseRateLimiter)
    assert issubclass(RedisTokenBucketRateLimiter, BaseRateLimiter)


def test_openai_llm_takes_one_permit_per_sync_call(server: FaultInjectingServer) -> None:
    limiter = TokenBucketRateLimiter(60, clock=FrozenClock())
    llm: object = openai_llm(server, limiter)
    assert llm.rate_limiter is limiter  # type: ignore[attr-defined]

    assert llm.chat(QUESTION).message.content == REPLY  # type: ignore[attr-defined]
    assert llm.complete("Capital of France?").text == REPLY  # type: ignore[attr-defined]
    streamed = list(llm.stream_chat(QUESTION))  # type: ignore[attr-defined]
    assert streamed[-1].message.content == REPLY

    assert len(server.requests) == 3
    assert permits_left(limiter) == 60 - 3


async def test_openai_llm_takes_one_permit_per_async_call(server: FaultInjectingServer) -> None:
    limiter = TokenBucketRateLimiter(60, clock=FrozenClock())
    llm: object = openai_llm(server, limiter)

    assert (await llm.achat(QUESTION)).message.content == REPLY  # type: ignore[attr-defined]
    assert (await llm.acomplete("Capital of France?")).text == REPLY  # type: ignore[attr-defined]
    stream = await llm.astream_chat(QUESTION)  # type: ignore[attr-defined]
    streamed = [response async for response in stream]
    assert streamed[-1].message.content == REPLY

    assert len(server.requests) == 3
    assert permits_left(limiter) == 60 - 3


async def test_a_call_over_budget_waits_in_the_slot_and_goes_when_its_permit_comes(
    server: FaultInjectingServer,
) -> None:
    clock = FrozenClock()
    limiter = TokenBucketRateLimiter(60, clock=clock)
    llm: object = openai_llm(server, limiter)
    assert permits_left(limiter) == 60

    call = asyncio.create_task(llm.achat(QUESTION))  # type: ignore[attr-defined]
    deadline = time.monotonic() + 5
    while limiter.queued == 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.05)
    assert not call.done()
    assert server.requests == []  # held before any HTTP request

    clock.now = 1.0
    assert limiter.acquire(blocking=False) is False  # the waiting call goes first
    assert (await asyncio.wait_for(call, 5)).message.content == REPLY
    assert len(server.requests) == 1
