"""``mark=``: a per-chunk translation the chain's own loop applies, and async attempts
that return an awaitable of their stream.

Each case runs the same chain twice: once with ``mark=``, once with an attempt that
wraps each member's stream in a generator applying the same translation (what an
adapter did before ``mark=``). Both must deliver the same chunks, restart alike and
close the member's stream alike, on every path of the loop: plain, timed (a worker
thread), with member retries, hedged, and across a mid-stream restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from llm_resilience import FallbackChain, RetryPolicy, StreamRestart

#: The chain options of each path of the stream loop.
PATHS: dict[str, dict[str, Any]] = {
    "plain": {},
    "timed": {"per_client_timeout": 5.0},
    "member_retry": {"member_retry": RetryPolicy(attempts=2, base_delay=0, jitter=0)},
    "hedged": {"hedge_after": 5.0},
}


def mark(chunk: str, index: int) -> str:
    return f"{chunk}@{index}"


def members(closed: list[int]) -> list[Callable[[], Iterator[str]]]:
    """A member that fails after two chunks, then one that answers."""

    def breaking() -> Iterator[str]:
        try:
            yield from ("a", "b")
            raise ConnectionError("reset")
        finally:
            closed.append(0)

    def answering() -> Iterator[str]:
        try:
            yield from ("x", "y", "z")
        finally:
            closed.append(1)

    return [breaking, answering]


def amembers(closed: list[int]) -> list[Callable[[], AsyncIterator[str]]]:
    async def breaking() -> AsyncIterator[str]:
        try:
            yield "a"
            yield "b"
            raise ConnectionError("reset")
        finally:
            closed.append(0)

    async def answering() -> AsyncIterator[str]:
        try:
            for chunk in ("x", "y", "z"):
                yield chunk
        finally:
            closed.append(1)

    return [breaking, answering]


def wrapped(index: int, client: Callable[[], Iterator[str]]) -> Iterator[str]:
    stream = client()
    try:
        for chunk in stream:
            yield mark(chunk, index)
    finally:
        stream.close()


async def awrapped(index: int, client: Callable[[], AsyncIterator[str]]) -> AsyncIterator[str]:
    stream = client()
    try:
        async for chunk in stream:
            yield mark(chunk, index)
    finally:
        await stream.aclose()


@pytest.mark.parametrize("path", ["plain", "timed", "member_retry"])
def test_mark_delivers_what_an_attempt_marking_its_own_stream_delivers(path: str) -> None:
    outcomes = []
    for marked in (True, False):
        closed: list[int] = []
        restarts: list[StreamRestart] = []
        chain = FallbackChain(members(closed), on_restart=restarts.append, **PATHS[path])
        if marked:
            chunks = list(chain.stream(lambda i, c: c(), is_content=bool, mark=mark))
        else:
            chunks = list(chain.stream(wrapped, is_content=bool))
        outcomes.append((chunks, [(r.failed_client, r.chunks) for r in restarts], closed))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == ["a@0", "b@0", "x@1", "y@1", "z@1"]


def test_a_hedged_stream_marks_the_winners_chunks() -> None:
    chain = FallbackChain(members([])[1:] * 2, **PATHS["hedged"])
    assert list(chain.stream(lambda i, c: c(), mark=mark)) == ["x@0", "y@0", "z@0"]


def test_a_failing_mark_fails_its_attempt_as_a_failing_stream_would() -> None:
    def picky(chunk: str, index: int) -> str:
        if index == 0 and chunk == "b":
            raise ConnectionError("cannot translate")
        return mark(chunk, index)

    restarts: list[StreamRestart] = []
    chain = FallbackChain(members([])[1:] * 2, on_restart=restarts.append)
    stream = chain.stream(lambda i, c: iter(["a", "b"]) if i == 0 else c(), mark=picky)
    assert list(stream) == ["a@0", "x@1", "y@1", "z@1"]
    assert [(r.failed_client, r.chunks) for r in restarts] == [(0, 1)]


@pytest.mark.parametrize("path", ["plain", "timed", "member_retry", "hedged"])
async def test_async_mark_and_awaitable_attempts_deliver_what_a_marking_attempt_delivers(
    path: str,
) -> None:
    async def opening(index: int, client: Callable[[], AsyncIterator[str]]) -> Any:
        await asyncio.sleep(0)
        return client()  # a coroutine that returns the stream, as astream_chat does

    outcomes = []
    for attempt in (opening, lambda i, c: c(), awrapped):
        closed: list[int] = []
        restarts: list[StreamRestart] = []
        options = PATHS[path]
        chain = FallbackChain(amembers(closed), on_restart=restarts.append, **options)
        if attempt is awrapped:
            stream = chain.astream(attempt, is_content=bool)
        else:
            stream = chain.astream(attempt, is_content=bool, mark=mark)
        chunks = [chunk async for chunk in stream]
        outcomes.append((chunks, [(r.failed_client, r.chunks) for r in restarts], closed))
    assert outcomes[0] == outcomes[1] == outcomes[2]
    assert outcomes[0][0] == ["a@0", "b@0", "x@1", "y@1", "z@1"]


async def test_an_awaitable_attempt_is_awaited_only_when_iteration_starts() -> None:
    opened: list[int] = []

    async def answering() -> AsyncIterator[str]:
        yield "x"

    async def opening(index: int, client: Callable[[], AsyncIterator[str]]) -> Any:
        opened.append(index)
        return client()

    stream = FallbackChain([answering, answering]).astream(opening, mark=mark)
    assert opened == []
    assert await anext(stream) == "x@0"
    assert opened == [0]
    await stream.aclose()
