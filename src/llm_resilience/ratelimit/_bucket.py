"""The in-process token bucket, shared by threads and event loops alike."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from llm_resilience.errors import RateLimitQueueFullError, RequestExceedsCapacityError
from llm_resilience.ratelimit._protocol import (
    PERIOD_SECONDS,
    UNLIMITED_REQUESTS,
    BucketArithmetic,
    PermitContext,
    check_budgets,
    check_token_weight,
    non_negative_int,
    optional_positive_int,
    per_period,
)
from llm_resilience.telemetry import Outcome, record_rate_limit_wait

__all__ = ["TokenBucketRateLimiter"]


class TokenBucketRateLimiter(BucketArithmetic, PermitContext):
    """A token bucket for one process: callers over budget wait their turn.

    ```python
    limiter = TokenBucketRateLimiter(requests_per_minute=300)

    async with limiter:  # one permit
        await client.chat.completions.create(...)

    model = ChatOpenAI(rate_limiter=limiter)  # or LlamaIndex's OpenAI(rate_limiter=...)
    ```

    The bucket holds ``requests_per_minute`` permits, starts full, and gains
    ``max(1, requests_per_minute // 60)`` permits at the end of every 1-second step: 300
    rpm is a burst of 300 then 5 a second. Budgets under 60 rpm over-admit (30 rpm
    sustains 60 a minute) and the rest floor to a multiple of 60 (90 rpm sustains 60).

    Callers that find no permit wait first come, first served, whether they are threads
    or tasks on any number of event loops: one FIFO queue, no overtaking, no polling
    (each waiter sleeps until its permit is due or its predecessor hands over). With
    ``max_queued_requests`` set, a caller finding that many already waiting gets
    [`RateLimitQueueFullError`][] at once. A cancelled waiter
    leaves the queue and takes nothing.

    With ``tokens_per_minute`` a call also needs ``num_tokens`` token permits (its
    estimated prompt plus its max output tokens) from a second bucket with the same
    derivation; [`reconcile`][] settles the estimate against real usage afterwards.
    ``num_tokens`` over ``tokens_per_minute`` raises
    [`RequestExceedsCapacityError`][] at once. With
    ``requests_per_minute=None`` only tokens are limited (requests are not counted);
    giving neither budget raises ``ValueError`` naming both.

    ``clock`` (monotonic seconds) defaults to ``time.monotonic``, looked up on every
    reading, so ``freezegun``'s ``freeze_time`` (or anything else that patches
    ``time.monotonic``) moves the limiter; build the limiter inside the frozen time.
    A test can also pass its own callable, e.g. ``clock=lambda: now[0]``.

    Every acquire records ``llm_resilience.ratelimit.wait.duration`` (ms, on the limiter's
    clock) with its ``surface`` and ``outcome``: ``granted``; ``rejected`` (refused by
    ``blocking=False``, a full queue, or a weight over the capacity); ``cancelled`` (task
    cancelled, ``KeyboardInterrupt``); ``faulted`` (anything else, e.g. an invalid
    ``num_tokens`` or a failing clock).

    Waiters are woken by whoever holds the lock when their permit is granted, from any
    thread or loop; only the head of the queue keeps a timer (a ``loop.call_at`` or an
    ``Event.wait`` timeout) for the step that pays for it. A head whose event loop is
    blocked therefore holds up the queue behind it until its loop runs again or another
    caller arrives; a head whose loop was closed is dropped.
    """

    __slots__ = (
        "__weakref__",
        "_capacity",
        "_clock",
        "_lock",
        "_max_queued",
        "_origin",
        "_permits",
        "_permits_per_period",
        "_rpm",
        "_steps",
        "_tokens",
        "_tokens_per_period",
        "_tpm",
        "_waiters",
    )

    #: The per-minute request budget (the bucket's capacity), or None: requests unlimited.
    _rpm: int | None
    #: Request permits the bucket holds: ``_rpm``, or `UNLIMITED_REQUESTS`.
    _capacity: int
    #: How many callers may wait at once; None is unbounded.
    _max_queued: int | None
    #: The per-minute token budget, or None when calls are not weighed by tokens.
    _tpm: int | None
    #: Request permits added per step: ``max(1, rpm // 60)``.
    _permits_per_period: int
    #: Token permits added per step: ``max(1, tpm // 60)``, or None.
    _tokens_per_period: int | None
    #: Monotonic seconds; injectable so tests control time exactly.
    _clock: Callable[[], float]
    #: Guards the counters and the queue; held only for bookkeeping, never across a wait.
    _lock: threading.Lock
    #: Clock reading at construction: steps end at ``_origin + k * PERIOD_SECONDS``.
    _origin: float
    #: Steps already credited to the buckets.
    _steps: int
    #: Request permits in the bucket now (0 to ``_capacity``).
    _permits: int
    #: Token permits in the bucket now; negative after [`reconcile`][] charged a debt.
    _tokens: int
    #: Waiting callers in arrival order (an ordered set: O(1) removal on cancel).
    _waiters: OrderedDict[_Waiter, None]

    def __init__(
        self,
        requests_per_minute: int | None = None,
        max_queued_requests: int | None = None,
        tokens_per_minute: int | None = None,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._rpm, self._tpm = check_budgets(requests_per_minute, tokens_per_minute)
        self._max_queued = optional_positive_int("max_queued_requests", max_queued_requests)
        if clock is None:
            clock = _monotonic
        elif not callable(clock):
            raise TypeError(f"clock must be a callable returning seconds, got {clock!r}")
        if self._rpm is None:
            self._capacity = self._permits_per_period = UNLIMITED_REQUESTS
        else:
            self._capacity, self._permits_per_period = self._rpm, per_period(self._rpm)
        self._tokens_per_period = None if self._tpm is None else per_period(self._tpm)
        self._clock = clock
        self._lock = threading.Lock()
        self._origin = clock()
        self._steps = 0
        self._permits = self._capacity
        self._tokens = self._tpm or 0
        self._waiters = OrderedDict()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(requests_per_minute={self._rpm}, "
            f"max_queued_requests={self._max_queued}, tokens_per_minute={self._tpm})"
        )

    # -- the derivation, visible ------------------------------------------------------

    @property
    def queued(self) -> int:
        """How many callers are waiting now."""
        return len(self._waiters)

    # -- acquiring --------------------------------------------------------------------

    def acquire(self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat") -> bool:
        """Take one permit (and ``num_tokens`` token permits), waiting for them if needed.

        Returns True once granted, or False at once when ``blocking=False`` and the
        permit is not available now (or others are already waiting for theirs). Raises
        [`RateLimitQueueFullError`][] when the queue is full and
        [`RequestExceedsCapacityError`][] when ``num_tokens`` is
        more than ``tokens_per_minute``. Blocks the calling thread: from async code use
        [`aacquire`][].
        """
        started: float | None = None
        waiter: _Waiter | None = None
        try:
            # A plain int 0 (every call without a token budget) needs no checking.
            if num_tokens.__class__ is int and not num_tokens:
                weight = 0
            else:
                weight = check_token_weight(num_tokens, self._tpm)
            with self._lock:
                started = now = self._clock()
                if self._take_now(weight, now):
                    outcome: Outcome = "granted"
                elif not blocking:
                    outcome = "rejected"
                else:
                    waiter = self._enqueue(weight, None)
                    delay = self._poll(waiter, now)
            if waiter is not None:
                while not waiter.granted:
                    waiter.event.wait(delay)
                    with self._lock:
                        delay = self._poll(waiter, self._clock())
                outcome = "granted"
        except BaseException as exc:
            self._fail(exc, waiter, started, surface)
            raise
        self._record(surface, outcome, started, waiter)
        return outcome == "granted"

    async def aacquire(
        self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat"
    ) -> bool:
        """Async [`acquire`][]: waits without blocking the event loop, cancellably.

        A waiter cancelled while queued leaves the queue, consumes nothing, and the
        caller behind it takes its place at once.
        """
        started: float | None = None
        waiter: _Waiter | None = None
        try:
            # A plain int 0 (every call without a token budget) needs no checking.
            if num_tokens.__class__ is int and not num_tokens:
                weight = 0
            else:
                weight = check_token_weight(num_tokens, self._tpm)
            loop = asyncio.get_running_loop()
            with self._lock:
                started = now = self._clock()
                if self._take_now(weight, now):
                    outcome: Outcome = "granted"
                elif not blocking:
                    outcome = "rejected"
                else:
                    waiter = self._enqueue(weight, loop)
                    delay = self._poll(waiter, now)
            if waiter is not None:
                while not waiter.granted:
                    future = waiter.future
                    assert future is not None  # set by every _poll that leaves us waiting
                    timer = None
                    if delay is not None:
                        # epoll rounds up to 1 ms and the kernel adds ~0.1% slack to a
                        # long sleep: wake a little early and look again.
                        early = min(delay, 0.001 + delay / 500) if delay > 0.005 else 0.0
                        timer = loop.call_at(loop.time() + delay - early, _resolve, future)
                    try:
                        await future
                    finally:
                        if timer is not None:
                            timer.cancel()
                    with self._lock:
                        delay = self._poll(waiter, self._clock())
                outcome = "granted"
        except BaseException as exc:
            self._fail(exc, waiter, started, surface)
            raise
        self._record(surface, outcome, started, waiter)
        return outcome == "granted"

    async def async_acquire(self, num_tokens: int = 0) -> None:
        """LlamaIndex's name for [`aacquire`][] (blocking, surface ``chat``)."""
        await self.aacquire(num_tokens)

    def reconcile(self, estimated_tokens: int, actual_tokens: int) -> None:
        """Settle a granted call's token weight against its real usage.

        Unused tokens (``estimated_tokens - actual_tokens`` > 0) go back to the token
        bucket, up to its capacity; extra usage is charged, possibly below zero, and a
        bucket in debt holds every later caller until the steps have paid it off. A
        no-op without ``tokens_per_minute``.
        """
        estimated = non_negative_int("estimated_tokens", estimated_tokens)
        actual = non_negative_int("actual_tokens", actual_tokens)
        if self._tpm is None or estimated == actual:
            return
        with self._lock:
            self._tokens = min(self._tpm, self._tokens + estimated - actual)
            self._dispatch(self._clock())

    # -- bookkeeping, always under self._lock ---------------------------------------

    def _refill(self, now: float) -> None:
        steps = math.floor((now - self._origin) / PERIOD_SECONDS) - self._steps
        if steps <= 0:  # same step, or a clock that went backwards
            return
        self._steps += steps
        self._permits = min(self._capacity, self._permits + steps * self._permits_per_period)
        if self._tpm is not None and self._tokens_per_period is not None:
            self._tokens = min(self._tpm, self._tokens + steps * self._tokens_per_period)

    def _fits(self, weight: int) -> bool:
        return self._permits >= 1 and (self._tpm is None or weight <= self._tokens)

    def _take(self, weight: int) -> None:
        self._permits -= 1
        if self._tpm is not None:
            self._tokens -= weight

    def _refund(self, weight: int) -> None:
        self._permits = min(self._capacity, self._permits + 1)
        if self._tpm is not None:
            self._tokens = min(self._tpm, self._tokens + weight)

    def _due(self, weight: int) -> float:
        """When the step that lets a caller of ``weight`` through ends (clock seconds)."""
        steps = 0 if self._permits >= 1 else 1
        if self._tokens_per_period is not None and weight > self._tokens:
            steps = max(steps, -(-(weight - self._tokens) // self._tokens_per_period))
        return self._origin + (self._steps + steps) * PERIOD_SECONDS

    def _take_now(self, weight: int, now: float) -> bool:
        """Grant at once when nobody is queued ahead and the permits are there."""
        if self._waiters:
            self._dispatch(now)
            if self._waiters:
                return False
        else:
            self._refill(now)  # all `_dispatch` does with nobody queued
        # `_fits` and `_take`, inline: this runs on every call.
        tpm = self._tpm
        if self._permits < 1 or (tpm is not None and weight > self._tokens):
            return False
        self._permits -= 1
        if tpm is not None:
            self._tokens -= weight
        return True

    def _enqueue(self, weight: int, loop: asyncio.AbstractEventLoop | None) -> _Waiter:
        if self._max_queued is not None and len(self._waiters) >= self._max_queued:
            raise RateLimitQueueFullError(self._max_queued)
        waiter = _Waiter(weight, loop)
        self._waiters[waiter] = None
        return waiter

    def _dispatch(self, now: float) -> None:
        """Grant queued callers in arrival order while permits last; then make sure the
        new head is awake with a timer for its due time (the handoff)."""
        self._refill(now)
        waiters = self._waiters
        while waiters:
            head = next(iter(waiters))
            if head.loop is not None and head.loop.is_closed():
                waiters.popitem(last=False)  # its task can never resume: not a caller any more
                continue
            if not self._fits(head.weight):
                due = self._due(head.weight)
                # Wake the head only when its timer is missing or now too late; a head
                # already sleeping until ``due`` is left alone, so pokes cost nothing.
                if head.due is None or due < head.due:
                    head.due = due
                    head.wake()
                return
            waiters.popitem(last=False)
            self._take(head.weight)
            head.granted = True
            head.granted_at = now
            head.wake()

    def _poll(self, waiter: _Waiter, now: float) -> float | None:
        """One look by a waiter: grant what is due, then say how long to sleep (None:
        until woken, as it is not the head). Leaves ``waiter.granted`` set when granted."""
        waiter.due = None
        waiter.future = None
        self._dispatch(now)
        if waiter.granted:
            return None
        # Anything that happened before this look is accounted for in it: reset the wake
        # signal so only what happens after it can wake the waiter.
        if waiter.loop is None:
            waiter.event.clear()
        else:
            waiter.future = waiter.loop.create_future()
        if waiter.due is None:  # not the head: the predecessor's grant will wake it
            return None
        return max(0.0, waiter.due - now)

    # -- endings -----------------------------------------------------------------------

    def _fail(
        self, exc: BaseException, waiter: _Waiter | None, started: float | None, surface: str
    ) -> None:
        if waiter is not None:
            self._abandon(waiter)
        outcome: Outcome
        if isinstance(exc, (RateLimitQueueFullError, RequestExceedsCapacityError)):
            outcome = "rejected"
        elif isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
            outcome = "cancelled"
        else:
            outcome = "faulted"
        self._record(surface, outcome, started, None)

    def _abandon(self, waiter: _Waiter) -> None:
        """A waiter gives up (cancelled, interrupted, or faulted): it takes nothing, and
        the caller behind it, now at the head, is woken at once."""
        with self._lock:
            if waiter.granted:  # granted in the instant before the caller went away
                self._refund(waiter.weight)
            else:
                self._waiters.pop(waiter, None)
            try:
                now = self._clock()
            except Exception:  # a failing clock is what brought us here: refill nothing
                now = self._origin + self._steps * PERIOD_SECONDS
            self._dispatch(now)

    def _record(
        self, surface: str, outcome: Outcome, started: float | None, waiter: _Waiter | None
    ) -> None:
        if waiter is None and outcome == "granted":  # granted at once: no wait
            record_rate_limit_wait(0.0, surface=surface, outcome=outcome)
            return
        waited = 0.0
        if started is not None:
            if waiter is not None and waiter.granted:
                waited = waiter.granted_at - started
            elif outcome in ("cancelled", "faulted"):
                try:
                    waited = self._clock() - started
                except Exception:
                    waited = 0.0
        record_rate_limit_wait(max(0.0, waited) * 1000.0, surface=surface, outcome=outcome)


def _monotonic() -> float:
    # Looked up on every reading (not bound at import), so patching time.monotonic
    # (freezegun, a test's monkeypatch) moves every limiter built with the default clock.
    return time.monotonic()


class _Waiter:
    """One queued caller: a thread waiting on ``event`` or a task awaiting ``future``."""

    __slots__ = ("due", "event", "future", "granted", "granted_at", "loop", "weight")

    def __init__(self, weight: int, loop: asyncio.AbstractEventLoop | None) -> None:
        #: Token permits it needs besides its one request permit.
        self.weight = weight
        #: The event loop of an async waiter; None for a thread.
        self.loop = loop
        #: Set under the lock by whoever grants it.
        self.granted = False
        #: Clock reading at the grant.
        self.granted_at = 0.0
        #: Clock time its timer fires, while it is the head and armed; None otherwise.
        self.due: float | None = None
        #: A thread's wake signal (a task has no use for one).
        self.event = threading.Event() if loop is None else _NO_EVENT
        #: A task's wake signal for the current wait (a fresh one per look).
        self.future: asyncio.Future[None] | None = None

    def wake(self) -> None:
        """Wake the waiter from whichever thread or loop holds the limiter's lock."""
        if self.loop is None:
            self.event.set()
            return
        future = self.future
        if future is None:  # it is looking right now and will see the new state
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:  # same thread: resolve directly, no self-pipe write
            _resolve(future)
            return
        try:
            self.loop.call_soon_threadsafe(_resolve, future)
        except RuntimeError:  # its loop closed meanwhile; _dispatch drops it next time
            pass


_NO_EVENT = threading.Event()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
