"""The core limiter in each framework's own ``rate_limiter=`` slot.

Importing an adapter registers the core limiters as virtual subclasses of its framework's
``BaseRateLimiter``, so the framework's own OpenAI model accepts one and takes one permit
per request, in every call shape (LangChain's batches and LlamaIndex's completions too).
The model talks HTTP to a local fault-injecting server; the limiter runs on a frozen
clock, so its count of permits is exact.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from driver import Mode

from llm_resilience.ratelimit import RedisTokenBucketRateLimiter, TokenBucketRateLimiter
from llm_resilience.testing import FaultInjectingServer

REPLY = "Paris is the capital."


class FrozenClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server() -> Iterator[FaultInjectingServer]:
    # A fresh server (fresh port) per test: langchain-openai caches its async HTTP client
    # per base URL, and every async test has its own event loop.
    with FaultInjectingServer(reply=REPLY) as running:
        yield running


def permits_left(limiter: TokenBucketRateLimiter) -> int:
    left = 0
    while limiter.acquire(blocking=False):
        left += 1
    return left


def test_importing_the_adapter_registers_both_limiters_as_the_frameworks_rate_limiters(
    driver: Any,
) -> None:
    base = driver.slot_base()
    code = (
        f"import {driver.adapter_module()}\n"
        f"from {base.__module__} import {base.__name__} as B\n"
        "from llm_resilience.ratelimit import RedisTokenBucketRateLimiter as R, "
        "TokenBucketRateLimiter as T\n"
        "print(issubclass(T, B), issubclass(R, B))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]
    assert isinstance(TokenBucketRateLimiter(60), base)
    assert issubclass(RedisTokenBucketRateLimiter, base)


async def test_the_frameworks_openai_model_takes_one_permit_per_call(
    driver: Any, mode: Mode, server: FaultInjectingServer
) -> None:
    limiter = TokenBucketRateLimiter(60, clock=FrozenClock())
    model = driver.openai_in_slot(server.openai_base_url, limiter)
    assert model.rate_limiter is limiter

    assert (await driver.run(model, mode)).text == REPLY

    assert len(server.requests) == 1
    assert permits_left(limiter) == 60 - 1


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_the_frameworks_other_call_shape_takes_one_permit_per_request(
    driver: Any, asynchronous: bool, server: FaultInjectingServer
) -> None:
    # LangChain's batch of two prompts, LlamaIndex's completion.
    limiter = TokenBucketRateLimiter(60, clock=FrozenClock())
    model = driver.openai_in_slot(server.openai_base_url, limiter)

    sent = await driver.other_requests(model, asynchronous)

    assert len(server.requests) == sent
    assert permits_left(limiter) == 60 - sent


async def test_a_call_over_budget_waits_in_the_slot_and_goes_when_its_permit_comes(
    driver: Any, server: FaultInjectingServer
) -> None:
    clock = FrozenClock()
    limiter = TokenBucketRateLimiter(60, clock=clock)
    model = driver.openai_in_slot(server.openai_base_url, limiter)
    assert permits_left(limiter) == 60

    call = asyncio.create_task(driver.run(model, "acall"))
    deadline = time.monotonic() + 5
    while limiter.queued == 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.05)
    assert not call.done()
    assert server.requests == []  # held before any HTTP request

    clock.now = 1.0
    assert limiter.acquire(blocking=False) is False  # the waiting call goes first
    assert (await asyncio.wait_for(call, 5)).text == REPLY
    assert len(server.requests) == 1
