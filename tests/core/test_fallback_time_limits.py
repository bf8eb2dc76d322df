"""The fallback engine's time limits: first token, idle stream, and consumer time.

Clients are plain callables, as in ``test_fallback.py``. Limits are 0.1-0.3 s and slow
clients sleep a few tenths of a second, so the file runs in a couple of seconds. A
client that "hangs" blocks on an event released when the test ends.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from llm_resilience import FallbackChain, PerClientTimeoutError, StreamRestart

LOGGER = "llm_resilience.fallback"
#: The ``held_stream`` fixture: a provider's stream for a failing attempt to hold.
HeldStream = Callable[[threading.Event], Iterator[str]]


def call(index: int, client: Callable[[], Any]) -> Any:
    return client()


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    return lambda: [r.getMessage() for r in caplog.records if r.name == LOGGER]


def backup() -> Iterator[str]:
    yield from ("b0", "b1")


async def abackup() -> AsyncIterator[str]:
    yield "b0"
    yield "b1"


# -- options ---------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["first_token_timeout", "idle_timeout"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "must be greater than 0 seconds; got 0"),
        (-1.5, "must be greater than 0 seconds; got -1.5"),
        (float("nan"), "must be greater than 0 seconds"),
        (400 * 86400, "must be at most 31536000 seconds (365 days)"),
        ("5", "must be None, a number of seconds (int or float) or a datetime.timedelta"),
        (True, "must be None, a number of seconds (int or float) or a datetime.timedelta"),
    ],
)
def test_a_bad_time_limit_is_refused_at_construction_naming_the_option(
    option: str, value: Any, message: str
) -> None:
    with pytest.raises(ValueError) as raised:
        FallbackChain([backup, backup], **{option: value})
    assert str(raised.value).startswith(f"{option} {message}")


def test_time_limits_are_off_by_default_and_read_back_in_seconds() -> None:
    assert FallbackChain([backup, backup]).first_token_timeout is None
    assert FallbackChain([backup, backup]).idle_timeout is None
    chain = FallbackChain(
        [backup, backup], first_token_timeout=timedelta(milliseconds=1500), idle_timeout=5
    )
    assert (chain.first_token_timeout, chain.idle_timeout) == (1.5, 5.0)


# -- first token ------------------------------------------------------------------------


def test_a_sync_stream_whose_first_token_is_late_moves_on_within_the_limit(
    gate: threading.Event, warnings: Callable[[], list[str]]
) -> None:
    def late() -> Iterator[str]:
        gate.wait(5)
        yield "too late"

    restarts: list[StreamRestart] = []
    chain = FallbackChain([late, backup], first_token_timeout=0.2, on_restart=restarts.append)
    began = time.monotonic()
    assert list(chain.stream(call)) == ["b0", "b1"]
    assert 0.18 < time.monotonic() - began < 1.0
    assert restarts == []  # nothing was delivered, so nothing restarts
    assert warnings() == [
        "Streaming client 0 sent no token within 0:00:00.200000 (first_token_timeout); "
        "trying next client."
    ]


async def test_an_async_stream_whose_first_token_is_late_moves_on_within_the_limit(
    warnings: Callable[[], list[str]],
) -> None:
    async def late() -> AsyncIterator[str]:
        await asyncio.sleep(5)
        yield "too late"

    chain = FallbackChain([late, abackup], first_token_timeout=0.2)
    began = asyncio.get_running_loop().time()
    assert [chunk async for chunk in chain.astream(call)] == ["b0", "b1"]
    assert 0.18 < asyncio.get_running_loop().time() - began < 1.0
    assert len(warnings()) == 1


def test_chunks_without_content_do_not_count_as_the_first_token(gate: threading.Event) -> None:
    def role_then_silence() -> Iterator[str]:
        yield ""  # a role-only opening chunk, as OpenAI sends at once
        gate.wait(5)
        yield "late"

    restarts: list[StreamRestart] = []
    chain = FallbackChain(
        [role_then_silence, backup], first_token_timeout=0.2, on_restart=restarts.append
    )
    assert list(chain.stream(call, is_content=bool)) == ["", "b0", "b1"]
    # The empty chunk was delivered, so the consumer hears of the restart; no content
    # was, so there is nothing to drop.
    assert [(r.failed_client, r.next_client, r.chunks) for r in restarts] == [(0, 1, 0)]
    assert isinstance(restarts[0].error, TimeoutError)


async def test_a_first_token_within_the_limit_lets_a_slow_stream_finish() -> None:
    async def slow() -> AsyncIterator[str]:
        for chunk in ("a0", "a1", "a2"):
            await asyncio.sleep(0.1)
            yield chunk

    # Each gap is shorter than first_token_timeout, and the whole answer is longer:
    # only the wait for the first token is bounded.
    chain = FallbackChain([slow, abackup], first_token_timeout=0.2)
    assert [chunk async for chunk in chain.astream(call)] == ["a0", "a1", "a2"]


def test_first_token_timeout_bounds_a_whole_sync_call(
    gate: threading.Event, warnings: Callable[[], list[str]]
) -> None:
    def late() -> str:
        gate.wait(5)
        return "too late"

    chain = FallbackChain([late, lambda: "second"], first_token_timeout=0.2)
    began = time.monotonic()
    assert chain.invoke(call) == "second"
    assert time.monotonic() - began < 1.0
    assert warnings() == [
        "Client 0 timed out after 0:00:00.200000 (first_token_timeout); trying next client."
    ]


async def test_first_token_timeout_bounds_a_whole_async_call_when_below_the_per_client_one() -> (
    None
):
    async def late() -> str:
        await asyncio.sleep(5)
        return "too late"

    async def second() -> str:
        return "second"

    chain = FallbackChain([late, second], first_token_timeout=0.1, per_client_timeout=30)
    assert await chain.ainvoke(call) == "second"
    with pytest.raises(PerClientTimeoutError) as raised:
        await FallbackChain([late, late], first_token_timeout=0.1).ainvoke(call)
    assert raised.value.option == "first_token_timeout"
    assert raised.value.timeout == timedelta(seconds=0.1)
    assert str(raised.value) == (
        "Client 1 timed out after 0:00:00.100000 (first_token_timeout); no client is left."
    )


# -- idle -------------------------------------------------------------------------------


def test_a_sync_stream_that_goes_silent_restarts_on_the_next_client(
    gate: threading.Event, warnings: Callable[[], list[str]]
) -> None:
    def stalls() -> Iterator[str]:
        yield "a0"
        yield "a1"
        gate.wait(5)
        yield "never"

    restarts: list[StreamRestart] = []
    chain = FallbackChain([stalls, backup], idle_timeout=0.2, on_restart=restarts.append)
    began = time.monotonic()
    assert list(chain.stream(call)) == ["a0", "a1", "b0", "b1"]
    assert 0.18 < time.monotonic() - began < 1.0
    assert [(r.failed_client, r.next_client, r.chunks) for r in restarts] == [(0, 1, 2)]
    assert isinstance(restarts[0].error, TimeoutError)
    assert warnings() == [
        "Streaming client 0 went silent for 0:00:00.200000 (idle_timeout) after 2 token(s); "
        "restarting with next client."
    ]


async def test_an_async_stream_that_goes_silent_restarts_and_its_generator_is_closed() -> None:
    closed = asyncio.Event()

    async def stalls() -> AsyncIterator[str]:
        try:
            yield "a0"
            await asyncio.sleep(5)
            yield "never"
        finally:
            closed.set()

    restarts: list[StreamRestart] = []
    chain = FallbackChain([stalls, abackup], idle_timeout=0.2, on_restart=restarts.append)
    assert [chunk async for chunk in chain.astream(call)] == ["a0", "b0", "b1"]
    assert closed.is_set()
    assert [(r.failed_client, r.chunks) for r in restarts] == [(0, 1)]
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_idle_timeout_does_not_bound_the_wait_before_the_first_token() -> None:
    async def thinks_first() -> AsyncIterator[str]:
        yield ""
        await asyncio.sleep(0.3)  # a reasoning model before its first token
        yield "a0"
        yield "a1"

    chain = FallbackChain([thinks_first, abackup], idle_timeout=0.1)
    assert [c async for c in chain.astream(call, is_content=bool)] == ["", "a0", "a1"]


async def test_a_stream_with_gaps_below_the_idle_timeout_is_never_cut() -> None:
    async def ticking() -> AsyncIterator[str]:
        for tick in range(8):
            await asyncio.sleep(0.05)
            yield f"t{tick}"

    # 0.4 s in all, under limits that each are shorter than the whole answer.
    chain = FallbackChain([ticking, abackup], idle_timeout=0.15, first_token_timeout=0.15)
    assert [c async for c in chain.astream(call)] == [f"t{tick}" for tick in range(8)]


def test_the_last_stream_going_silent_raises_a_timeout_error_naming_idle_timeout(
    gate: threading.Event,
) -> None:
    def stalls() -> Iterator[str]:
        yield "a"
        gate.wait(5)
        yield "never"

    received: list[str] = []
    stream = FallbackChain([stalls, stalls], idle_timeout=0.1).stream(call)
    with pytest.raises(PerClientTimeoutError) as raised:
        received.extend(stream)
    assert received == ["a", "a"]
    assert raised.value.option == "idle_timeout"
    assert raised.value.client_index == 1
    assert isinstance(raised.value.__cause__, TimeoutError)


# -- consumer time ------------------------------------------------------------------------


def test_a_finished_sync_stream_is_not_restarted_when_the_consumer_holds_its_last_chunk() -> None:
    def answer() -> Iterator[str]:
        yield from ("a0", "a1")

    restarts: list[StreamRestart] = []
    chain = FallbackChain(
        [answer, backup],
        per_client_timeout=0.1,
        first_token_timeout=0.1,
        idle_timeout=0.1,
        on_restart=restarts.append,
    )
    received = []
    for chunk in chain.stream(call):
        received.append(chunk)
        time.sleep(0.15)  # longer than every limit, after every chunk, the last included
    assert received == ["a0", "a1"]
    assert restarts == []


async def test_a_finished_async_stream_is_not_restarted_when_the_consumer_holds_its_last_chunk() -> (
    None
):
    async def answer() -> AsyncIterator[str]:
        for chunk in ("a0", "a1"):
            await asyncio.sleep(0.01)
            yield chunk
        await asyncio.sleep(0.01)  # the end of the stream is a wait of its own

    restarts: list[StreamRestart] = []
    chain = FallbackChain(
        [answer, abackup], per_client_timeout=0.1, idle_timeout=0.1, on_restart=restarts.append
    )
    received = []
    async for chunk in chain.astream(call):
        received.append(chunk)
        await asyncio.sleep(0.15)
    assert received == ["a0", "a1"]
    assert restarts == []


async def test_the_per_client_timeout_still_adds_up_every_wait_on_the_member() -> None:
    async def slow() -> AsyncIterator[str]:
        for chunk in ("a0", "a1", "a2", "a3"):
            await asyncio.sleep(0.08)
            yield chunk

    restarts: list[StreamRestart] = []
    chain = FallbackChain([slow, abackup], per_client_timeout=0.2, on_restart=restarts.append)
    # 0.08 s per wait: the third wait ends past 0.2 s of waiting in all.
    assert [c async for c in chain.astream(call)] == ["a0", "a1", "b0", "b1"]
    assert [(r.failed_client, r.chunks) for r in restarts] == [(0, 2)]


# -- cancellation -------------------------------------------------------------------------


async def test_the_callers_cancellation_during_a_timed_wait_is_never_rerouted() -> None:
    waiting = asyncio.Event()
    second_called = False

    async def slow() -> AsyncIterator[str]:
        yield "a0"
        waiting.set()
        await asyncio.sleep(5)
        yield "never"

    async def second() -> AsyncIterator[str]:
        nonlocal second_called
        second_called = True
        yield "b0"

    chain = FallbackChain([slow, second], first_token_timeout=1, idle_timeout=1)

    async def consume() -> None:
        async for _ in chain.astream(call):
            pass

    task = asyncio.create_task(consume())
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not second_called
    assert asyncio.all_tasks() == {asyncio.current_task()}


def test_a_sync_stream_left_early_releases_its_worker_at_the_next_chunk() -> None:
    closed = threading.Event()

    def endless() -> Iterator[str]:
        try:
            while True:
                time.sleep(0.01)
                yield "tick"
        finally:
            closed.set()

    stream = FallbackChain([endless, backup], idle_timeout=1).stream(call)
    assert next(stream) == "tick"
    stream.close()  # the consumer leaves after one chunk
    assert closed.wait(1), "the worker kept pulling an abandoned stream"


@pytest.mark.usefixtures("without_cyclic_gc")
def test_a_failed_timed_attempt_frees_the_provider_stream_it_held_without_the_cyclic_gc(
    held_stream: HeldStream,
) -> None:
    closed = threading.Event()

    def failing() -> Iterator[str]:
        held = held_stream(closed)  # a live stream in the failing frame's locals
        raise ConnectionError(f"connection reset with {held} open")
        yield "never"

    chain = FallbackChain([failing, backup], idle_timeout=1)
    assert list(chain.stream(call)) == ["b0", "b1"]
    assert closed.is_set(), "the failed attempt's stream waits for the cyclic GC"


@pytest.mark.usefixtures("without_cyclic_gc")
def test_a_failed_timed_call_frees_what_its_attempt_held_without_the_cyclic_gc(
    held_stream: HeldStream,
) -> None:
    closed = threading.Event()

    def failing() -> str:
        held = held_stream(closed)
        raise ConnectionError(f"connection reset with {held} open")

    chain = FallbackChain([failing, lambda: "second"], per_client_timeout=1)
    assert chain.invoke(call) == "second"
    assert closed.is_set(), "the failed attempt's frames wait for the cyclic GC"


@pytest.mark.usefixtures("without_cyclic_gc")
def test_a_timed_call_failing_after_its_time_limit_frees_what_its_attempt_held(
    held_stream: HeldStream, gate: threading.Event
) -> None:
    closed, ended = threading.Event(), threading.Event()

    def late_failing() -> str:
        held = held_stream(closed)
        try:
            gate.wait(5)  # released once the chain has moved on
            raise ConnectionError(f"connection reset with {held} open")
        finally:
            ended.set()

    def second() -> str:
        gate.set()
        return "second"

    chain = FallbackChain([late_failing, second], per_client_timeout=0.2)
    assert chain.invoke(call) == "second"
    assert ended.wait(2), "the abandoned attempt never ended"
    assert closed.wait(2), "the abandoned attempt's frames wait for the cyclic GC"


@pytest.mark.usefixtures("without_cyclic_gc")
def test_a_timed_stream_failing_after_its_time_limit_frees_the_provider_stream_it_held(
    held_stream: HeldStream, gate: threading.Event
) -> None:
    closed, ended = threading.Event(), threading.Event()

    def late_failing() -> Iterator[str]:
        held = held_stream(closed)
        try:
            gate.wait(5)  # released once the chain has moved on
            raise ConnectionError(f"connection reset with {held} open")
        finally:
            ended.set()
        yield "never"

    def second() -> Iterator[str]:
        gate.set()
        yield from backup()

    chain = FallbackChain([late_failing, second], first_token_timeout=0.2)
    assert list(chain.stream(call)) == ["b0", "b1"]
    assert ended.wait(2), "the abandoned attempt never ended"
    assert closed.wait(2), "the abandoned attempt's late error waits for the cyclic GC"


@pytest.mark.usefixtures("without_cyclic_gc")
@pytest.mark.parametrize("timed", [False, True], ids=["untimed", "timed"])
@pytest.mark.parametrize(
    "error", [ValueError, ConnectionError], ids=["non-transient", "transient-last"]
)
def test_a_stream_that_fails_for_good_frees_the_provider_stream_its_attempt_held(
    held_stream: HeldStream, error: type[Exception], timed: bool
) -> None:
    closed = threading.Event()

    def reset() -> Iterator[str]:
        raise ConnectionError("reset")
        yield "never"

    def failing() -> Iterator[str]:
        held = held_stream(closed)
        raise error(f"failed with {held} open")
        yield "never"

    chain = FallbackChain([reset, failing], idle_timeout=1 if timed else None)
    with pytest.raises(error):
        list(chain.stream(call))
    assert closed.is_set(), "the failed attempt's stream waits for the cyclic GC"


@pytest.mark.usefixtures("without_cyclic_gc")
@pytest.mark.parametrize(
    "error", [ValueError, ConnectionError], ids=["non-transient", "transient-last"]
)
async def test_an_async_stream_that_fails_for_good_frees_the_provider_stream_its_attempt_held(
    held_stream: HeldStream, error: type[Exception]
) -> None:
    closed = threading.Event()

    async def reset() -> AsyncIterator[str]:
        raise ConnectionError("reset")
        yield "never"

    async def failing() -> AsyncIterator[str]:
        held = held_stream(closed)
        raise error(f"failed with {held} open")
        yield "never"

    chain = FallbackChain([reset, failing])
    with pytest.raises(error):
        [chunk async for chunk in chain.astream(call)]
    assert closed.is_set(), "the failed attempt's stream waits for the cyclic GC"
