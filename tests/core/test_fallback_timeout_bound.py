"""The async per-client timeout fires at its configured time, not some multiple of it.

Other tests prove that a hung attempt is cancelled and the next client answers; these
bound *when*: an attempt hung on a 0.25 s ``per_client_timeout`` ends within 5x that
(generous for a loaded machine), so a timeout ten times longer than configured fails
here. The bound is the behaviour under test, not a speed target.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from llm_resilience import FallbackChain, PerClientTimeoutError

TIMEOUT = 0.25
LOOSE_BOUND = 5 * TIMEOUT


class HungAttempts:
    """Members that hang until cancelled, remembering how long each attempt lasted."""

    def __init__(self) -> None:
        self.lasted: list[float] = []

    async def hang(self) -> str:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await asyncio.Event().wait()
        finally:
            self.lasted.append(loop.time() - started)
        return "never"

    async def stream(self) -> AsyncIterator[str]:
        yield await self.hang()


def call(index: int, client: Callable[[], Any]) -> Any:
    return client()


async def test_a_hung_async_attempt_is_cut_at_its_per_client_timeout_not_later() -> None:
    attempts = HungAttempts()

    async def backup() -> str:
        return "backup"

    chain = FallbackChain([attempts.hang, backup], per_client_timeout=TIMEOUT)
    assert await chain.ainvoke(call) == "backup"

    (lasted,) = attempts.lasted
    assert TIMEOUT * 0.8 <= lasted < LOOSE_BOUND


async def test_every_hung_async_attempt_is_bounded_and_the_last_raises_the_timeout() -> None:
    attempts = HungAttempts()
    chain = FallbackChain([attempts.hang, attempts.hang], per_client_timeout=TIMEOUT)

    with pytest.raises(PerClientTimeoutError):
        await chain.ainvoke(call)

    assert len(attempts.lasted) == 2
    assert all(TIMEOUT * 0.8 <= lasted < LOOSE_BOUND for lasted in attempts.lasted)


async def test_a_hung_async_stream_is_cut_at_its_per_client_timeout_not_later() -> None:
    attempts = HungAttempts()

    async def backup() -> AsyncIterator[str]:
        yield "backup"

    chain = FallbackChain([attempts.stream, backup], per_client_timeout=TIMEOUT)
    chunks = [chunk async for chunk in chain.astream(call)]

    assert chunks == ["backup"]
    (lasted,) = attempts.lasted
    assert TIMEOUT * 0.8 <= lasted < LOOSE_BOUND
