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
(`_hedge_inbox`): an inbox the cost layer opens for each
call, captured by the engine when the call starts. The winner's usage flows as any
call's; a loser whose provider reported usage (a call that finished at the same moment,
a stream's opening usage event, or an abandoned sync call that finished later in its
worker) is reported to the inbox, which records it as its own ledger entry of kind
``"hedge"`` (`record_hedge`). Callbacks and
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
    Awaitable,
    Callable,
    Sequence,
)
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from llm_resilience.checks import seconds
from llm_resilience.fallback._deadlines import _TimeLimits
from llm_resilience.fallback._hedge_inbox import HedgeInbox, HedgeLoser, current_hedge_inbox
from llm_resilience.fallback._routing import is_context_overflow
from llm_resilience.fallback._workers import _WORKERS
from llm_resilience.retry_budget import CallAttempts
from llm_resilience.usage import Usage

if TYPE_CHECKING:
    from llm_resilience.fallback._engine import FallbackChain
    from llm_resilience.fallback._routing import RequestNeeds

__all__ = [
    "LoserUsage",
    "Members",
    "Run",
    "areport",
    "checked_hedge_after",
    "hedged_ainvoke",
    "hedged_invoke",
    "loser_of",
    "report",
    "warn_hedging",
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


class Run:
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


class Members:
    """Which members are left to try, as the chain's order (routing may narrow it), and
    whether the call's retry budget lets it try one more (``calls``: its attempt counter)."""

    __slots__ = ("calls", "hedge_refused", "order", "started")

    def __init__(self, order: list[int], calls: CallAttempts | None = None) -> None:
        self.order = order
        self.started: set[int] = set()
        #: The call's attempts on the chain's retry budget, or None (no budget).
        self.calls = calls
        #: The budget refused this call a hedge: it is not asked again.
        self.hedge_refused = False

    def hedges(self) -> bool:
        """Whether a hedge may be waited for: a member is left and none was refused."""
        return not self.hedge_refused and self.next() is not None

    def grant_hedge(self) -> bool:
        """Whether the budget grants the hedge now due (counted); a refusal is final."""
        if self.calls is None or self.calls.may_retry():
            return True
        self.hedge_refused = True
        logger.warning("The retry budget refuses a hedge; the first attempt goes on alone.")
        return False

    async def agrant_hedge(self) -> bool:
        """Async [`grant_hedge`][]: awaits the shared budget's grant (if any)."""
        if self.calls is None or await self.calls.amay_retry():
            return True
        self.hedge_refused = True
        logger.warning("The retry budget refuses a hedge; the first attempt goes on alone.")
        return False

    def next(self) -> int | None:
        if self.calls is not None and not self.calls.may_fail_over():
            return None  # the call's attempt cap is reached: no member is left to it
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


def warn_hedging(chain: FallbackChain[Any], index: int, next_index: int) -> None:
    logger.warning(
        "Client %d sent nothing within %s (hedge_after); also trying client %d.",
        index,
        timedelta(seconds=chain.hedge_after or 0),
        next_index,
    )


def loser_of(usage_of: LoserUsage | None, index: int, outcome: object) -> HedgeLoser | None:
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


def report(inbox: HedgeInbox | None, loser: HedgeLoser | None) -> None:
    if inbox is not None and loser is not None:
        inbox.report(loser)


async def areport(inbox: HedgeInbox | None, loser: HedgeLoser | None) -> None:
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
        self.events: queue.SimpleQueue[tuple[Run, str, Any]] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.over = False
        #: The attempts still running when the race ended: their late results are spend.
        self.losers: set[Run] = set()
        self.inbox = inbox
        self.usage_of = usage_of

    def deliver(self, run: Run, kind: str, value: Any) -> None:
        with self.lock:
            if not self.over and not run.stop.is_set():
                self.events.put((run, kind, value))
                return
            lost = run in self.losers
        if lost and kind == "ok":
            report(self.inbox, loser_of(self.usage_of, run.index, value))

    def end(self, running: Sequence[Run]) -> None:
        with self.lock:
            self.over = True
            self.losers.update(running)
        while True:
            try:
                run, kind, value = self.events.get_nowait()
            except queue.Empty:
                return
            if run in self.losers and kind == "ok":
                report(self.inbox, loser_of(self.usage_of, run.index, value))


def hedged_invoke(
    chain: FallbackChain[Any],
    attempt: Callable[[int, Any], ResultT],
    *,
    needs: RequestNeeds | Sequence[RequestNeeds] | None = None,
    usage_of: LoserUsage | None = None,
) -> ResultT:
    """[`FallbackChain.invoke`][] with ``hedge_after``: see the module's docs."""
    assert chain.hedge_after is not None
    calls = chain._open_call()
    members = Members(chain._order(needs), calls)
    if calls is not None:
        attempt = calls.counted(attempt)
    if chain._member_retry is not None:
        attempt = chain._member_retry.call(attempt, calls)
    race = _CallRace(current_hedge_inbox(), usage_of)
    running: list[Run] = []
    limit = chain._timeout

    def start() -> None:
        index = members.take()
        client = chain.clients[index]
        run = Run(index)
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
            if len(running) == 1 and members.hedges():
                hedge_at = running[0].started + chain.hedge_after
                if now >= hedge_at:
                    if not members.grant_hedge():
                        continue
                    warn_hedging(chain, running[0].index, members.next())  # type: ignore[arg-type]
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
        # An error raised here holds this frame in its traceback: without the local
        # dropped, error, frame and the worker's frames (the provider's stream among
        # their locals) form a cycle only the cyclic GC frees (see `_sources`).
        value = None
        race.end(running)


async def hedged_ainvoke(
    chain: FallbackChain[Any],
    attempt: Callable[[int, Any], Awaitable[ResultT]],
    *,
    needs: RequestNeeds | Sequence[RequestNeeds] | None = None,
    usage_of: LoserUsage | None = None,
) -> ResultT:
    """[`FallbackChain.ainvoke`][] with ``hedge_after``: see the module's docs."""
    assert chain.hedge_after is not None
    order = await chain._aorder(needs)
    calls = await chain._aopen_call()
    members = Members(order, calls)
    if calls is not None:
        attempt = calls.counted(attempt)
    if chain._member_retry is not None:
        attempt = chain._member_retry.acall(attempt, calls)
    inbox = current_hedge_inbox()
    limit = chain._timeout
    tasks: dict[asyncio.Task[Any], Run] = {}

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
        tasks[task] = Run(index)

    won: asyncio.Task[Any] | None = None
    try:
        start()
        while True:
            timeout: float | None = None
            if len(tasks) == 1 and members.hedges():
                (only,) = tasks.values()
                timeout = max(0.0, only.started + chain.hedge_after - time.monotonic())
            done, _ = await asyncio.wait(
                tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                (only,) = tasks.values()
                if not await members.agrant_hedge():
                    continue
                warn_hedging(chain, only.index, members.next())  # type: ignore[arg-type]
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
                        try:
                            raise error
                        finally:
                            # Its traceback holds this frame: the frame must not hold it
                            # (nor its task) too, or the attempt's frames wait for the
                            # cyclic GC (see `_sources`).
                            del error, task, done
                    chain._failed(run.index, error)
                    if not tasks and members.next() is None:
                        try:
                            raise error
                        finally:
                            del error, task, done  # as above
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
                    await areport(inbox, loser_of(usage_of, run.index, task.result()))
