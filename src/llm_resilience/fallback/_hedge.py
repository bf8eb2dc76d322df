"""Hedged requests (``hedge_after=``): a slow first token starts the request on the next member.

A chain with ``hedge_after`` set keeps at most two attempts in flight. The first member
starts alone; when it has produced no content for ``hedge_after`` seconds, the next member
the chain would use (its order, routing and breaker decide) starts on the same request.
The first attempt to produce content wins: a stream's first content chunk, a call's
result. The other is cancelled:

* ``ainvoke``/``astream``: its task is cancelled, which closes its HTTP request;
* ``stream``: its iterator is closed by its worker at its next chunk (a thread blocked in
  the provider's read cannot be interrupted, so a primary that never sends a byte keeps
  its connection until its own timeout or the server's);
* ``invoke``: its worker thread is abandoned: the provider call runs to its end there and
  its result is discarded (Python threads cannot be interrupted).

Everything else is the chain's usual rules, applied to each attempt: a transient failure
moves on (if the other attempt is running it simply continues; if none is, the next
member starts at once), a non-transient one propagates and cancels the other, each
attempt has its own time limits, and a stream that fails after content restarts (or, under
``mid_stream="raise"``, raises) as usual, its restart racing again.

Spend stays true through a side channel to the cost layer
(:mod:`~llm_resilience.fallback._hedge_inbox`): an inbox the cost layer opens for each
call, captured by the engine when the call starts. The winner's usage flows as any
call's; a loser whose provider reported usage (a call that finished at the same moment,
a stream's opening usage event, or an abandoned sync call that finished later in its
worker) is reported to the inbox, which records it as its own ledger entry of kind
``"hedge"`` (:meth:`~llm_resilience.budget.BudgetTicket.record_hedge`). Callbacks and
events see only the winner.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from llm_resilience.checks import seconds
from llm_resilience.fallback._deadlines import TimeLimit, _AttemptClock, _TimeLimits
from llm_resilience.fallback._hedge_inbox import HedgeInbox, HedgeLoser, current_hedge_inbox
from llm_resilience.fallback._options import StreamRestart
from llm_resilience.fallback._routing import is_context_overflow
from llm_resilience.fallback._sources import _aclose, _close
from llm_resilience.fallback._workers import _WORKERS
from llm_resilience.usage import Usage

if TYPE_CHECKING:
    from llm_resilience.fallback._engine import FallbackChain
    from llm_resilience.fallback._options import RestartHook
    from llm_resilience.fallback._routing import RequestNeeds

__all__ = [
    "LoserUsage",
    "checked_hedge_after",
    "hedged_ainvoke",
    "hedged_astream",
    "hedged_invoke",
    "hedged_stream",
]

# Every part of the fallback chain logs as ``llm_resilience.fallback`` (a documented name).
logger = logging.getLogger("llm_resilience.fallback")

ResultT = TypeVar("ResultT")
ChunkT = TypeVar("ChunkT")

#: What an adapter reads from a losing attempt (a call's result, or the list of chunks a
#: stream delivered before it lost): the usage its provider reported and the model that
#: ran it, or None when nothing was reported. Called with the member's index and that.
LoserUsage = Callable[[int, Any], "tuple[Usage, str | None] | None"]


def checked_hedge_after(value: object, limits: _TimeLimits) -> float | None:
    """``hedge_after`` in seconds (None: off), shorter than the limits it must beat.

    A hedge that starts after the attempt's own ``first_token_timeout`` or
    ``per_client_timeout`` would never run: the attempt would already have timed out.
    """
    hedge_after = seconds("hedge_after", value, allow_none=True)
    if hedge_after is None:
        return None
    for option, limit in (
        ("first_token_timeout", limits.first_token),
        ("per_client_timeout", limits.per_client),
    ):
        if limit is not None and hedge_after >= limit:
            raise ValueError(
                f"hedge_after must be shorter than {option} ({limit:g} s), or the hedge "
                f"never starts; got {hedge_after:g}"
            )
    return hedge_after


# -- shared bookkeeping ------------------------------------------------------------------


class _Run:
    """One attempt in flight."""

    __slots__ = ("buffered", "index", "started", "stop")

    def __init__(self, index: int) -> None:
        #: The member's index.
        self.index = index
        #: ``time.monotonic()`` when it started.
        self.started = time.monotonic()
        #: A stream's chunks before its first content, held until it wins or loses.
        self.buffered: list[Any] = []
        #: Set when it is abandoned: a sync stream's worker stops at its next chunk.
        self.stop = threading.Event()


class _Members:
    """Which members are left to try, as the chain's order (routing may narrow it)."""

    __slots__ = ("order", "started")

    def __init__(self, order: list[int]) -> None:
        self.order = order
        self.started: set[int] = set()

    def next(self) -> int | None:
        for index in self.order:
            if index not in self.started:
                return index
        return None

    def take(self) -> int:
        index = self.next()
        assert index is not None
        self.started.add(index)
        return index

    def moves_on(self, chain: FallbackChain[Any], index: int, error: BaseException) -> bool:
        """The chain's rule for ``error``; a prompt too long also narrows what is left."""
        if index in self.order:
            return chain._moves_on(error, self.order, self.order.index(index))
        return is_context_overflow(error) or chain._is_transient(error)


def _hedging(chain: FallbackChain[Any], index: int, next_index: int) -> None:
    logger.warning(
        "Client %d sent nothing within %s (hedge_after); also trying client %d.",
        index,
        timedelta(seconds=chain.hedge_after or 0),
        next_index,
    )


def _loser(usage_of: LoserUsage | None, index: int, outcome: object) -> HedgeLoser | None:
    if usage_of is None:
        return None
    try:
        read = usage_of(index, outcome)
    except Exception:
        logger.debug("Reading a hedge loser's usage failed.", exc_info=True)
        return None
    if read is None:
        return None
    usage, model = read
    return HedgeLoser(index, usage, model)


def _report(inbox: HedgeInbox | None, loser: HedgeLoser | None) -> None:
    if inbox is not None and loser is not None:
        inbox.report(loser)


async def _areport(inbox: HedgeInbox | None, loser: HedgeLoser | None) -> None:
    if inbox is not None and loser is not None:
        await inbox.areport(loser)


class _TimedOut(Exception):
    """Internal: an attempt's own time limit fired inside its task."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("attempt time limit")
        self.cause = cause


# -- invoke ------------------------------------------------------------------------------


class _CallRace:
    """A sync call's attempts on worker threads, reporting to one queue until it ends.

    An attempt that finishes after the race ended (a loser, abandoned in its worker)
    never delivers: its result goes to the inbox as a loser's usage, or nowhere.
    """

    __slots__ = ("events", "inbox", "lock", "losers", "over", "usage_of")

    def __init__(self, inbox: HedgeInbox | None, usage_of: LoserUsage | None) -> None:
        self.events: queue.SimpleQueue[tuple[_Run, str, Any]] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.over = False
        #: The attempts still running when the race ended: their late results are spend.
        self.losers: set[_Run] = set()
        self.inbox = inbox
        self.usage_of = usage_of

    def deliver(self, run: _Run, kind: str, value: Any) -> None:
        with self.lock:
            if not self.over and not run.stop.is_set():
                self.events.put((run, kind, value))
                return
            lost = run in self.losers
        if lost and kind == "ok":
            _report(self.inbox, _loser(self.usage_of, run.index, value))

    def end(self, running: Sequence[_Run]) -> None:
        with self.lock:
            self.over = True
            self.losers.update(running)
        while True:
            try:
                run, kind, value = self.events.get_nowait()
            except queue.Empty:
                return
            if run in self.losers and kind == "ok":
                _report(self.inbox, _loser(self.usage_of, run.index, value))


def hedged_invoke(
    chain: FallbackChain[Any],
    attempt: Callable[[int, Any], ResultT],
    *,
    needs: RequestNeeds | Sequence[RequestNeeds] | None = None,
    usage_of: LoserUsage | None = None,
) -> ResultT:
    """:meth:`FallbackChain.invoke` with ``hedge_after``: see the module's docs."""
    assert chain.hedge_after is not None
    members = _Members(chain._order(needs))
    if chain._member_retry is not None:
        attempt = chain._member_retry.call(attempt)
    race = _CallRace(current_hedge_inbox(), usage_of)
    running: list[_Run] = []
    limit = chain._timeout

    def start() -> None:
        index = members.take()
        client = chain.clients[index]
        run = _Run(index)
        context = contextvars.copy_context()

        def work() -> None:
            try:
                result = context.run(attempt, index, client)
            except BaseException as error:
                race.deliver(run, "error", error)
                return
            race.deliver(run, "ok", result)

        running.append(run)
        _WORKERS.submit(work)

    try:
        start()
        while True:
            now = time.monotonic()
            deadlines: list[float] = []
            if len(running) == 1 and members.next() is not None:
                hedge_at = running[0].started + chain.hedge_after
                if now >= hedge_at:
                    _hedging(chain, running[0].index, members.next())  # type: ignore[arg-type]
                    start()
                    continue
                deadlines.append(hedge_at)
            if limit is not None:
                deadlines.extend(run.started + limit for run in running)
            wait = max(0.0, min(deadlines) - now) if deadlines else None
            try:
                run, kind, value = race.events.get(timeout=wait)
            except queue.Empty:
                now = time.monotonic()
                for run in [r for r in running if limit is not None and r.started + limit <= now]:
                    running.remove(run)
                    run.stop.set()
                    chain._failed(run.index, None)
                    if not running and members.next() is None:
                        cause = TimeoutError("the attempt's time limit ran out")
                        raise chain._timeout_error(run.index, cause) from cause
                    logger.warning(
                        "Client %d timed out after %s; trying next client.",
                        run.index,
                        chain._timeout_label,
                    )
                if not running:
                    start()
                continue
            if run not in running:
                continue
            running.remove(run)
            if kind == "ok":
                chain._succeeded(run.index)
                return value  # type: ignore[no-any-return]
            if not members.moves_on(chain, run.index, value):
                raise value
            chain._failed(run.index, value)
            if not running and members.next() is None:
                raise value
            if not is_context_overflow(value):  # routing logged why it moves on
                logger.warning("Client %d failed transiently; trying next client.", run.index)
            if not running:
                start()
    finally:
        race.end(running)


async def hedged_ainvoke(
    chain: FallbackChain[Any],
    attempt: Callable[[int, Any], Awaitable[ResultT]],
    *,
    needs: RequestNeeds | Sequence[RequestNeeds] | None = None,
    usage_of: LoserUsage | None = None,
) -> ResultT:
    """:meth:`FallbackChain.ainvoke` with ``hedge_after``: see the module's docs."""
    assert chain.hedge_after is not None
    members = _Members(chain._order(needs))
    if chain._member_retry is not None:
        attempt = chain._member_retry.acall(attempt)
    inbox = current_hedge_inbox()
    limit = chain._timeout
    tasks: dict[asyncio.Task[Any], _Run] = {}

    async def bounded(index: int, client: Any) -> Any:
        if limit is None:
            return await attempt(index, client)
        scope: asyncio.Timeout | None = None
        try:
            async with asyncio.timeout(limit) as scope:
                return await attempt(index, client)
        except TimeoutError as error:
            if scope is not None and scope.expired():
                raise _TimedOut(error.__cause__ or error) from None
            raise

    def start() -> None:
        index = members.take()
        task = asyncio.ensure_future(bounded(index, chain.clients[index]))
        tasks[task] = _Run(index)

    won: asyncio.Task[Any] | None = None
    try:
        start()
        while True:
            timeout: float | None = None
            if len(tasks) == 1 and members.next() is not None:
                (only,) = tasks.values()
                timeout = max(0.0, only.started + chain.hedge_after - time.monotonic())
            done, _ = await asyncio.wait(
                tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                (only,) = tasks.values()
                _hedging(chain, only.index, members.next())  # type: ignore[arg-type]
                start()
                continue
            # Both may be done at once: the earlier-started attempt wins the tie.
            for task in sorted(done, key=lambda t: tasks[t].started):
                run = tasks.pop(task)
                if task.cancelled():
                    # The client cancelled itself, no limit fired: never rerouted.
                    raise asyncio.CancelledError
                error = task.exception()
                if error is None:
                    won = task
                    chain._succeeded(run.index)
                    return task.result()  # type: ignore[no-any-return]
                if isinstance(error, _TimedOut):
                    chain._failed(run.index, None)
                    if not tasks and members.next() is None:
                        raise chain._timeout_error(run.index, error.cause) from error.cause
                    logger.warning(
                        "Client %d timed out after %s; trying next client.",
                        run.index,
                        chain._timeout_label,
                    )
                else:
                    if not members.moves_on(chain, run.index, error):
                        raise error
                    chain._failed(run.index, error)
                    if not tasks and members.next() is None:
                        raise error
                    if not is_context_overflow(error):
                        logger.warning(
                            "Client %d failed transiently; trying next client.", run.index
                        )
                if not tasks:
                    start()
    finally:
        losers = dict(tasks)
        for task in losers:
            task.cancel()
        if losers:
            # Awaited, so no task outlives the call, even when the caller was cancelled.
            await asyncio.wait(losers)
        if won is not None:
            for task, run in losers.items():
                if not task.cancelled() and task.exception() is None:
                    await _areport(inbox, _loser(usage_of, run.index, task.result()))


# -- streams -----------------------------------------------------------------------------


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
    """:meth:`FallbackChain.stream` with ``hedge_after``: see the module's docs.

    Each attempt is pulled by a worker thread into one queue; chunks before an attempt's
    first content are held until it wins (then yielded) or loses (then read for usage).
    """
    assert chain.hedge_after is not None
    members = _Members(chain._order(needs))
    if chain._member_retry is not None:
        attempt = chain._member_retry.stream(attempt)
    inbox = current_hedge_inbox()
    events: queue.SimpleQueue[tuple[_Run, str, Any]] = queue.SimpleQueue()
    running: list[_Run] = []
    first_limit = _first_limit(chain._limits)
    keeps_text = text_of is not None and chain.mid_stream == "raise"

    def start() -> None:
        index = members.take()
        client = chain.clients[index]
        run = _Run(index)
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
                events.put((run, "error", error))
            finally:
                if iterator is not None and run.stop.is_set():
                    _close(iterator)

        running.append(run)
        _WORKERS.submit(lambda: context.run(produce))

    def abandon(run: _Run) -> None:
        running.remove(run)
        run.stop.set()

    try:
        while True:
            # -- the race: until one attempt delivers content ---------------------------
            start()
            winner: _Run | None = None
            first: Any = None
            while winner is None:
                now = time.monotonic()
                deadlines: list[float] = []
                if len(running) == 1 and members.next() is not None:
                    hedge_at = running[0].started + chain.hedge_after
                    if now >= hedge_at:
                        _hedging(chain, running[0].index, members.next())  # type: ignore[arg-type]
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
                _report(inbox, _loser(usage_of, loser.index, list(loser.buffered)))
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
            failure: BaseException
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
        for run in list(running):
            abandon(run)


def _expired(
    runs: Iterable[_Run], first_limit: tuple[float, TimeLimit] | None, now: float
) -> list[_Run]:
    """The attempts whose wait for their first content has run out."""
    if first_limit is None:
        return []
    return [run for run in runs if run.started + first_limit[0] <= now]


def _after_content(
    chain: FallbackChain[Any],
    members: _Members,
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
        raise failure
    chain._log_stream_failure(index, True, content, timed_out=timed_out)
    return next_index


def _next_of(
    events: queue.SimpleQueue[tuple[_Run, str, Any]], run: _Run, deadline: float | None
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
    attempt: Callable[[int, Any], AsyncIterable[ChunkT]],
    *,
    is_content: Callable[[ChunkT], bool] | None = None,
    on_restart: RestartHook | None = None,
    needs: RequestNeeds | Sequence[RequestNeeds] | None = None,
    text_of: Callable[[ChunkT], str] | None = None,
    usage_of: LoserUsage | None = None,
) -> AsyncGenerator[ChunkT, None]:
    """:meth:`FallbackChain.astream` with ``hedge_after``: see the module's docs.

    Each attempt is pulled by a task of its own into one queue; a loser's task is
    cancelled and closes its stream (the member's HTTP response) before the next chunk
    is yielded, and no task outlives the stream.
    """
    assert chain.hedge_after is not None
    members = _Members(chain._order(needs))
    if chain._member_retry is not None:
        attempt = chain._member_retry.astream(attempt)
    inbox = current_hedge_inbox()
    events: asyncio.Queue[tuple[_Run, str, Any]] = asyncio.Queue()
    tasks: dict[_Run, asyncio.Task[None]] = {}
    first_limit = _first_limit(chain._limits)
    keeps_text = text_of is not None and chain.mid_stream == "raise"

    async def produce(run: _Run, client: Any) -> None:
        iterator: AsyncIterator[ChunkT] | None = None
        try:
            iterator = aiter(attempt(run.index, client))
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
        run = _Run(index)
        tasks[run] = asyncio.ensure_future(produce(run, chain.clients[index]))

    async def abandon(run: _Run, *, cancel: bool = True) -> None:
        task = tasks.pop(run)
        if cancel:
            task.cancel()
        await asyncio.wait([task])

    async def next_event(
        deadline: float | None, of: _Run | None = None
    ) -> tuple[_Run, str, Any] | None:
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
            winner: _Run | None = None
            first: Any = None
            while winner is None:
                now = time.monotonic()
                deadlines: list[float] = []
                if len(tasks) == 1 and members.next() is not None:
                    (only,) = tasks
                    hedge_at = only.started + chain.hedge_after
                    if now >= hedge_at:
                        _hedging(chain, only.index, members.next())  # type: ignore[arg-type]
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
                await _areport(inbox, _loser(usage_of, loser.index, list(loser.buffered)))
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
            failure: BaseException
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
        for run in list(tasks):
            await abandon(run)
