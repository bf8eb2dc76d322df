"""Hedged streams (``stream``, ``astream`` with ``hedge_after=``): see
`_hedge` for the rules both call shapes follow.

A stream's first content chunk wins the race; until then each attempt's chunks are held.
A sync stream pulls each attempt on a worker thread into one queue; an async one pulls
each attempt in a task of its own, cancelled (closing its HTTP response) when it loses.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from typing import TYPE_CHECKING, Any, TypeVar

from llm_resilience.fallback._deadlines import TimeLimit, _AttemptClock, _TimeLimits
from llm_resilience.fallback._hedge import (
    LoserUsage,
    Members,
    Run,
    areport,
    loser_of,
    report,
    warn_hedging,
)
from llm_resilience.fallback._hedge_inbox import current_hedge_inbox
from llm_resilience.fallback._options import StreamRestart
from llm_resilience.fallback._routing import is_context_overflow
from llm_resilience.fallback._sources import AsyncOpened, _aclose, _close, opened
from llm_resilience.fallback._workers import _WORKERS

if TYPE_CHECKING:
    from llm_resilience.fallback._engine import FallbackChain
    from llm_resilience.fallback._options import RestartHook
    from llm_resilience.fallback._routing import RequestNeeds

__all__ = ["hedged_astream", "hedged_stream"]

ChunkT = TypeVar("ChunkT")


def _first_limit(limits: _TimeLimits) -> tuple[float, TimeLimit] | None:
    """The bound on an attempt's wait for its first content, and the option it comes from."""
    candidates: list[tuple[float, TimeLimit]] = []
    if limits.first_token is not None:
        candidates.append((limits.first_token, "first_token_timeout"))
    if limits.per_client is not None:
        candidates.append((limits.per_client, "per_client_timeout"))
    return min(candidates, key=lambda c: c[0]) if candidates else None


def hedged_stream(
    chain: FallbackChain[Any],
    attempt: Callable[[int, Any], Iterable[ChunkT]],
    *,
    is_content: Callable[[ChunkT], bool] | None = None,
    on_restart: RestartHook | None = None,
    needs: RequestNeeds | Sequence[RequestNeeds] | None = None,
    text_of: Callable[[ChunkT], str] | None = None,
    usage_of: LoserUsage | None = None,
) -> Iterator[ChunkT]:
    """[`FallbackChain.stream`][] with ``hedge_after``: see the module's docs.

    Each attempt is pulled by a worker thread into one queue; chunks before an attempt's
    first content are held until it wins (then yielded) or loses (then read for usage).
    """
    assert chain.hedge_after is not None
    calls = chain._open_call()
    members = Members(chain._order(needs), calls)
    if calls is not None:
        attempt = calls.counted(attempt)
    if chain._member_retry is not None:
        attempt = chain._member_retry.stream(attempt, calls)
    inbox = current_hedge_inbox()
    events: queue.SimpleQueue[tuple[Run, str, Any]] = queue.SimpleQueue()
    running: list[Run] = []
    abandoning = threading.Lock()  # no attempt queues its error once it is abandoned
    first_limit = _first_limit(chain._limits)
    keeps_text = text_of is not None and chain.mid_stream == "raise"

    def start() -> None:
        index = members.take()
        client = chain.clients[index]
        run = Run(index)
        context = contextvars.copy_context()

        def produce() -> None:
            iterator: Iterator[ChunkT] | None = None
            try:
                iterator = iter(attempt(index, client))
                for chunk in iterator:
                    events.put((run, "chunk", chunk))
                    if run.stop.is_set():
                        return
                events.put((run, "end", None))
            except BaseException as error:
                if iterator is not None:
                    _close(iterator)
                    iterator = None
                # Not once abandoned: nobody reads it, and the queue (which this frame
                # holds) would tie it into a cycle only the cyclic GC frees (`_sources`).
                with abandoning:
                    if not run.stop.is_set():
                        events.put((run, "error", error))
            finally:
                if iterator is not None and run.stop.is_set():
                    _close(iterator)

        running.append(run)
        _WORKERS.submit(lambda: context.run(produce))

    def abandon(run: Run) -> None:
        running.remove(run)
        with abandoning:
            run.stop.set()

    try:
        while True:
            # -- the race: until one attempt delivers content ---------------------------
            start()
            winner: Run | None = None
            first: Any = None
            while winner is None:
                now = time.monotonic()
                deadlines: list[float] = []
                if len(running) == 1 and members.hedges():
                    hedge_at = running[0].started + chain.hedge_after
                    if now >= hedge_at:
                        if not members.grant_hedge():
                            continue
                        warn_hedging(chain, running[0].index, members.next())  # type: ignore[arg-type]
                        start()
                        continue
                    deadlines.append(hedge_at)
                if first_limit is not None:
                    deadlines.extend(run.started + first_limit[0] for run in running)
                wait = max(0.0, min(deadlines) - now) if deadlines else None
                try:
                    run, kind, value = events.get(timeout=wait)
                except queue.Empty:
                    now = time.monotonic()
                    for run in _expired(running, first_limit, now):
                        abandon(run)
                        chain._failed(run.index, None)
                        assert first_limit is not None
                        if not running and members.next() is None:
                            cause = TimeoutError("the wait for the first chunk ran out")
                            raise chain._timeout_error(run.index, cause, first_limit[1]) from cause
                        chain._log_stream_failure(run.index, False, 0, timed_out=first_limit[1])
                    if not running:
                        start()
                    continue
                if run not in running:
                    continue  # an abandoned attempt's late word
                if kind == "chunk":
                    if is_content is None or is_content(value):
                        winner, first = run, value
                    else:
                        run.buffered.append(value)
                    continue
                if kind == "end":
                    winner = run  # an answer with no content at all is still an answer
                    continue
                abandon(run)
                if not members.moves_on(chain, run.index, value):
                    raise value
                chain._failed(run.index, value)
                if not running and members.next() is None:
                    raise value
                if not is_context_overflow(value):  # routing logged why it moves on
                    chain._log_stream_failure(run.index, False, 0, timed_out=None)
                if not running:
                    start()
            for loser in [run for run in running if run is not winner]:
                abandon(loser)
                report(inbox, loser_of(usage_of, loser.index, list(loser.buffered)))
            # -- the winner, alone ------------------------------------------------------
            index = winner.index
            held, winner.buffered = winner.buffered, []
            yield from held
            if first is None:  # it ended without content
                running.remove(winner)
                chain._succeeded(index)
                return
            clock = _AttemptClock(chain._limits)
            clock.waited(time.monotonic() - winner.started, content=True)
            content = 1
            delivered = [text_of(first)] if keeps_text and text_of is not None else []
            yield first
            failure: BaseException | None
            timed_out: TimeLimit | None = None
            while True:
                wait_for = clock.next_wait()
                began = time.monotonic()
                deadline = None if wait_for is None else began + wait_for[0]
                item = _next_of(events, winner, deadline)
                if item is None:
                    assert wait_for is not None
                    timed_out = wait_for[1]
                    failure = TimeoutError("the wait for the next chunk ran out")
                    chain._failed(index, None)
                    break
                kind, value = item
                if kind == "end":
                    running.remove(winner)
                    chain._succeeded(index)
                    return
                if kind == "error":
                    if not members.moves_on(chain, index, value):
                        raise value
                    chain._failed(index, value)
                    failure = value
                    break
                carries = is_content is None or is_content(value)
                clock.waited(time.monotonic() - began, content=carries)
                if carries:
                    content += 1
                    if keeps_text and text_of is not None:
                        delivered.append(text_of(value))
                yield value
            # -- the winner failed after content: restart (or raise) -------------------
            abandon(winner)
            next_index = _after_content(
                chain, members, index, content, delivered, failure, timed_out
            )
            chain._restarted(on_restart, StreamRestart(index, next_index, content, failure))
    finally:
        # An error raised here holds this frame in its traceback: without the locals
        # dropped, error, frame and the worker's frames (the provider's stream among
        # their locals) form a cycle only the cyclic GC frees (see `_sources`).
        value = item = failure = None
        for run in list(running):
            abandon(run)
        _drain(events)  # what the attempts queued before they were abandoned


def _expired(
    runs: Iterable[Run], first_limit: tuple[float, TimeLimit] | None, now: float
) -> list[Run]:
    """The attempts whose wait for their first content has run out."""
    if first_limit is None:
        return []
    return [run for run in runs if run.started + first_limit[0] <= now]


def _after_content(
    chain: FallbackChain[Any],
    members: Members,
    index: int,
    content: int,
    delivered: list[str],
    failure: BaseException,
    timed_out: TimeLimit | None,
) -> int:
    """The chain's rule for a winner that failed after content: raise, or the next member."""
    if chain.mid_stream == "raise":
        raise chain._interrupted(index, content, delivered) from failure
    next_index = members.next()
    if next_index is None:
        if timed_out is not None:
            raise chain._timeout_error(index, failure, timed_out) from failure
        try:
            raise failure
        finally:
            del failure  # its traceback holds this frame (see `_sources`)
    chain._log_stream_failure(index, True, content, timed_out=timed_out)
    return next_index


def _drain(events: queue.SimpleQueue[Any] | asyncio.Queue[Any]) -> None:
    """Empty ``events``: an error left there would wait for the cyclic GC (its
    traceback holds the frame of the producer that holds the queue)."""
    while not events.empty():
        events.get_nowait()


def _next_of(
    events: queue.SimpleQueue[tuple[Run, str, Any]], run: Run, deadline: float | None
) -> tuple[str, Any] | None:
    """``run``'s next event, skipping abandoned attempts' late ones; None at ``deadline``."""
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            owner, kind, value = events.get(timeout=wait)
        except queue.Empty:
            return None
        if owner is run:
            return kind, value


async def hedged_astream(
    chain: FallbackChain[Any],
    attempt: Callable[[int, Any], AsyncOpened[ChunkT]],
    *,
    is_content: Callable[[ChunkT], bool] | None = None,
    on_restart: RestartHook | None = None,
    needs: RequestNeeds | Sequence[RequestNeeds] | None = None,
    text_of: Callable[[ChunkT], str] | None = None,
    usage_of: LoserUsage | None = None,
) -> AsyncGenerator[ChunkT, None]:
    """[`FallbackChain.astream`][] with ``hedge_after``: see the module's docs.

    Each attempt is pulled by a task of its own into one queue; a loser's task is
    cancelled and closes its stream (the member's HTTP response) before the next chunk
    is yielded, and no task outlives the stream.
    """
    assert chain.hedge_after is not None
    order = await chain._aorder(needs)
    calls = await chain._aopen_call()
    members = Members(order, calls)
    if calls is not None:
        attempt = calls.counted(attempt)
    if chain._member_retry is not None:
        attempt = chain._member_retry.astream(attempt, calls)
    inbox = current_hedge_inbox()
    events: asyncio.Queue[tuple[Run, str, Any]] = asyncio.Queue()
    tasks: dict[Run, asyncio.Task[None]] = {}
    first_limit = _first_limit(chain._limits)
    keeps_text = text_of is not None and chain.mid_stream == "raise"

    async def produce(run: Run, client: Any) -> None:
        iterator: AsyncIterator[ChunkT] | None = None
        try:
            iterator = await opened(attempt(run.index, client))
            async for chunk in iterator:
                events.put_nowait((run, "chunk", chunk))
            events.put_nowait((run, "end", None))
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            events.put_nowait((run, "error", error))
        finally:
            if iterator is not None:
                await _aclose(iterator)  # closes the member's HTTP response

    def start() -> None:
        index = members.take()
        run = Run(index)
        tasks[run] = asyncio.ensure_future(produce(run, chain.clients[index]))

    async def abandon(run: Run, *, cancel: bool = True) -> None:
        task = tasks.pop(run)
        if cancel:
            task.cancel()
        await asyncio.wait([task])

    async def next_event(
        deadline: float | None, of: Run | None = None
    ) -> tuple[Run, str, Any] | None:
        """The next event (of ``of`` only, if given), or None at ``deadline`` (monotonic)."""
        while True:
            try:
                if deadline is None:
                    item = await events.get()
                else:
                    wait = max(0.0, deadline - time.monotonic())
                    async with asyncio.timeout(wait):
                        item = await events.get()
            except TimeoutError:
                return None
            if item[0] in tasks and (of is None or item[0] is of):
                return item

    try:
        while True:
            start()
            winner: Run | None = None
            first: Any = None
            while winner is None:
                now = time.monotonic()
                deadlines: list[float] = []
                if len(tasks) == 1 and members.hedges():
                    (only,) = tasks
                    hedge_at = only.started + chain.hedge_after
                    if now >= hedge_at:
                        if not await members.agrant_hedge():
                            continue
                        warn_hedging(chain, only.index, members.next())  # type: ignore[arg-type]
                        start()
                        continue
                    deadlines.append(hedge_at)
                if first_limit is not None:
                    deadlines.extend(run.started + first_limit[0] for run in tasks)
                item = await next_event(min(deadlines) if deadlines else None)
                if item is None:
                    now = time.monotonic()
                    for run in _expired(list(tasks), first_limit, now):
                        await abandon(run)
                        chain._failed(run.index, None)
                        assert first_limit is not None
                        if not tasks and members.next() is None:
                            cause = TimeoutError("the wait for the first chunk ran out")
                            raise chain._timeout_error(run.index, cause, first_limit[1]) from cause
                        chain._log_stream_failure(run.index, False, 0, timed_out=first_limit[1])
                    if not tasks:
                        start()
                    continue
                run, kind, value = item
                if kind == "chunk":
                    if is_content is None or is_content(value):
                        winner, first = run, value
                    else:
                        run.buffered.append(value)
                    continue
                if kind == "end":
                    winner = run
                    continue
                await abandon(run)
                if not members.moves_on(chain, run.index, value):
                    raise value
                chain._failed(run.index, value)
                if not tasks and members.next() is None:
                    raise value
                if not is_context_overflow(value):
                    chain._log_stream_failure(run.index, False, 0, timed_out=None)
                if not tasks:
                    start()
            for loser in [run for run in tasks if run is not winner]:
                await abandon(loser)
                await areport(inbox, loser_of(usage_of, loser.index, list(loser.buffered)))
            index = winner.index
            held, winner.buffered = winner.buffered, []
            for chunk in held:
                yield chunk
            if first is None:
                await abandon(winner, cancel=False)
                chain._succeeded(index)
                return
            clock = _AttemptClock(chain._limits)
            clock.waited(time.monotonic() - winner.started, content=True)
            content = 1
            delivered = [text_of(first)] if keeps_text and text_of is not None else []
            yield first
            failure: BaseException | None
            timed_out: TimeLimit | None = None
            while True:
                wait_for = clock.next_wait()
                began = time.monotonic()
                deadline = None if wait_for is None else began + wait_for[0]
                item = await next_event(deadline, of=winner)
                if item is None:
                    assert wait_for is not None
                    timed_out = wait_for[1]
                    failure = TimeoutError("the wait for the next chunk ran out")
                    chain._failed(index, None)
                    break
                _, kind, value = item
                if kind == "end":
                    await abandon(winner, cancel=False)  # it is closing its stream
                    chain._succeeded(index)
                    return
                if kind == "error":
                    if not members.moves_on(chain, index, value):
                        raise value
                    chain._failed(index, value)
                    failure = value
                    break
                carries = is_content is None or is_content(value)
                clock.waited(time.monotonic() - began, content=carries)
                if carries:
                    content += 1
                    if keeps_text and text_of is not None:
                        delivered.append(text_of(value))
                yield value
            await abandon(winner)
            next_index = _after_content(
                chain, members, index, content, delivered, failure, timed_out
            )
            await chain._arestarted(on_restart, StreamRestart(index, next_index, content, failure))
    finally:
        # As in `hedged_stream`: the frame must not hold an error raised from it.
        value = item = failure = None
        for run in list(tasks):
            await abandon(run)
        _drain(events)
