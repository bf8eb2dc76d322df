"""A retry budget: the retries of every layer bounded as a share of the traffic.

Each retry layer (``member_retry``, [`RetryPolicy`][], a chain's hedged requests) asks
more of a provider that is already failing; alone each looks harmless, together they
multiply an outage's load. A [`RetryBudget`][] bounds them all, as Envoy's retry budgets,
gRPC's retry throttling and Finagle's ``RetryBudget`` do: over a sliding ``window``,

    retries allowed = ratio * calls + min_per_second * window

where ``calls`` are the calls that started in the window (each call counts once, however
many attempts it makes) and ``retries`` every extra attempt granted in it. With the
defaults (``ratio=0.2``, ``min_per_second=0.1``, ``window=60``) and 1,000 calls a minute,
at most 200 + 6 = 206 retries a minute are sent; with 10 calls a minute, 2 + 6 = 8, so a
quiet service can still retry. A retry the budget refuses is not waited for: a same-member
retry gives the member up (the chain moves on as usual), a hedge is not started, a
``RetryPolicy`` raises the attempt's own error at once.

``max_attempts_per_call`` caps one call's attempts of every kind together (the first
tries, same-member retries, fallbacks and hedges of a chain's call; the tries of one
``RetryPolicy`` call): the attempt past it is not made and the call fails with the last
attempt's own error.

The window is kept in 10 slices of ``window / 10`` seconds, so a count leaves the window
within one slice of its age (bounded memory, whatever the traffic). The counts are this
process's (thread-safe), unless ``shared=`` a [`RedisRetryBudgetStore`][]: then the fleet's
calls and retries are counted together in Redis (one round trip per decision), so
``ratio`` applies to the fleet's traffic, and this process's own counts decide only while
Redis is away.

Examples:
    >>> clock = [0.0]
    >>> budget = RetryBudget(ratio=0.5, min_per_second=0, window=60, clock=lambda: clock[0])
    >>> for _ in range(4):
    ...     budget.call_started()
    >>> [budget.try_retry() for _ in range(3)]
    [True, True, False]
    >>> clock[0] = 61.0  # the calls and retries have left the window
    >>> budget.try_retry()
    False
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from llm_resilience import checks
from llm_resilience._retry_budget_store import RedisRetryBudgetStore

__all__ = [
    "SLICES",
    "BudgetCounts",
    "CallAttempts",
    "RedisRetryBudgetStore",
    "RetryBudget",
    "acall_attempts",
    "call_attempts",
    "retry_budget_option",
]

T = TypeVar("T")

#: Slices of a window: a count leaves the window within ``window / SLICES`` of its age.
SLICES = 10


@dataclass(frozen=True, slots=True)
class BudgetCounts:
    """What a budget holds over its window right now."""

    #: Calls started in the window.
    calls: int
    #: Retries granted in the window.
    retries: int
    #: Retries the window allows in all: ``ratio * calls + min_per_second * window``.
    allowed: float


class RetryBudget:
    """At most ``ratio`` retries per call over a sliding ``window``, plus a floor.

    Examples:
        >>> RetryBudget(ratio=0.2, min_per_second=0.1, window=60)
        RetryBudget(ratio=0.2, min_per_second=0.1, window=60.0, max_attempts_per_call=None)
        >>> RetryBudget(ratio=2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: RetryBudget.ratio must be a number from 0 to 1, got 2

    ``ratio`` (0 to 1; default 0.2): retries allowed per call in the window.
    ``min_per_second`` (>= 0; default 0.1): retries per second allowed whatever the
    traffic, so a quiet service can still retry. ``window`` (seconds or a
    ``timedelta``, above 0; default 60). ``max_attempts_per_call`` (None, the default,
    or >= 1): attempts of every kind one call may make. ``shared`` (None, the default,
    or a [`RedisRetryBudgetStore`][]): count the fleet's calls and retries in Redis, so
    the window holds every worker's traffic and the floor is the fleet's; while Redis is
    away (one WARNING per outage) this budget's own counts decide, and no decision waits
    more than the store's ``operation_timeout``. ``clock`` is the monotonic clock of the
    local counts (a shared window runs on Redis's clock). Thread-safe; usable from sync
    and async code alike (a refusal never waits; the async layers await the shared
    decision with [`acall_started`][] and [`atry_retry`][]).
    """

    __slots__ = (
        "_calls",
        "_clock",
        "_lock",
        "_retries",
        "_slice",
        "_starts",
        "max_attempts_per_call",
        "min_per_second",
        "ratio",
        "shared",
        "window",
    )

    def __init__(
        self,
        ratio: float = 0.2,
        *,
        min_per_second: float = 0.1,
        window: float | Any = 60.0,
        max_attempts_per_call: int | None = None,
        shared: RedisRetryBudgetStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: Retries allowed per call started in the window (0 to 1).
        self.ratio = _fraction("RetryBudget.ratio", ratio)
        #: Retries per second allowed whatever the traffic.
        self.min_per_second = _non_negative("RetryBudget.min_per_second", min_per_second)
        seconds = checks.seconds("RetryBudget.window", window, allow_none=False)
        assert seconds is not None
        #: Seconds the counts are kept.
        self.window: float = seconds
        #: Attempts of every kind one call may make, or None (no cap).
        self.max_attempts_per_call = (
            None
            if max_attempts_per_call is None
            else checks.whole("RetryBudget.max_attempts_per_call", max_attempts_per_call, minimum=1)
        )
        if shared is not None and not isinstance(shared, RedisRetryBudgetStore):
            raise checks.OptionTypeError(
                f"RetryBudget.shared must be None or an "
                f"llm_resilience.RedisRetryBudgetStore(...); got {type(shared).__name__}"
            )
        #: The store the fleet's counts are kept in, or None (this process's own).
        self.shared = shared
        if not callable(clock):
            raise checks.OptionTypeError(f"RetryBudget.clock must be callable; got {clock!r}")
        self._clock = clock
        self._lock = threading.Lock()
        self._slice = self.window / SLICES
        # One slot per slice: the slice number it holds, its calls and its retries.
        self._starts = [-1] * SLICES
        self._calls = [0] * SLICES
        self._retries = [0] * SLICES

    def __repr__(self) -> str:
        return (
            f"RetryBudget(ratio={self.ratio:g}, min_per_second={self.min_per_second:g}, "
            f"window={self.window}, max_attempts_per_call={self.max_attempts_per_call}"
            + ("" if self.shared is None else f", shared={self.shared!r}")
            + ")"
        )

    @property
    def floor(self) -> float:
        """Retries the window allows with no traffic at all: ``min_per_second * window``."""
        return self.min_per_second * self.window

    # -- the decisions --------------------------------------------------------------

    def call_started(self) -> None:
        """Count one call (its first attempt); every layer calls it once per call."""
        self._count_call()
        if self.shared is not None:
            self.shared.call(self.window, SLICES)

    async def acall_started(self) -> None:
        """Async [`call_started`][]: awaits the shared store's count (if any)."""
        self._count_call()
        if self.shared is not None:
            await self.shared.acall(self.window, SLICES)

    def try_retry(self) -> bool:
        """Grant one retry if the window allows it (and count it); never waits.

        Shared: the fleet's window decides (one round trip); while Redis is away, this
        budget's own counts do."""
        if self.shared is not None:
            granted = self.shared.retry(self.window, SLICES, self.ratio, self.floor)
            if granted is not None:
                return self._noted(granted)
        return self._try_local()

    async def atry_retry(self) -> bool:
        """Async [`try_retry`][]: awaits the shared store's decision (if any)."""
        if self.shared is not None:
            granted = await self.shared.aretry(self.window, SLICES, self.ratio, self.floor)
            if granted is not None:
                return self._noted(granted)
        return self._try_local()

    def counts(self) -> BudgetCounts:
        """The calls and retries in the window now, and the retries it allows (the
        fleet's when shared and Redis answers; this process's otherwise)."""
        held = None if self.shared is None else self.shared.read(self.window, SLICES)
        if held is None:
            with self._lock:
                held = self._sums()
        calls, retries = held
        return BudgetCounts(calls, retries, self.ratio * calls + self.floor)

    def _count_call(self) -> None:
        with self._lock:
            self._calls[self._slot()] += 1

    def _noted(self, granted: bool) -> bool:
        # The fleet granted a retry: this process's own counts learn it too, so they are
        # current the moment Redis goes away.
        if granted:
            with self._lock:
                self._retries[self._slot()] += 1
        return granted

    def _try_local(self) -> bool:
        with self._lock:
            calls, retries = self._sums()
            if retries + 1 > self.ratio * calls + self.floor:
                return False
            self._retries[self._slot()] += 1
            return True

    def open_call(self) -> CallAttempts:
        """Count a call and return its attempt counter (a ``CallAttempts``)."""
        self.call_started()
        return CallAttempts(self)

    async def aopen_call(self) -> CallAttempts:
        """Async [`open_call`][]: awaits the shared count (if any)."""
        await self.acall_started()
        return CallAttempts(self)

    # -- the sliding window ---------------------------------------------------------

    def _slot(self) -> int:
        number = int(self._clock() // self._slice)
        slot = number % SLICES
        if self._starts[slot] != number:
            self._starts[slot] = number
            self._calls[slot] = 0
            self._retries[slot] = 0
        return slot

    def _sums(self) -> tuple[int, int]:
        number = int(self._clock() // self._slice)
        calls = retries = 0
        for slot in range(SLICES):
            if number - SLICES < self._starts[slot] <= number:
                calls += self._calls[slot]
                retries += self._retries[slot]
        return calls, retries


class CallAttempts:
    """One call's attempts, counted against its budget's ``max_attempts_per_call``.

    A layer opens one per call ([`RetryBudget.open_call`][]), counts each attempt it
    starts ([`started`][]), and asks before each extra one: [`may_retry`][] for a retry
    or a hedge (the cap, then the budget's window), [`may_fail_over`][] for the next
    member (the cap only: a fallback is the chain's normal work, not a retry).
    """

    __slots__ = ("_lock", "budget", "made")

    def __init__(self, budget: RetryBudget) -> None:
        #: The budget the call draws from.
        self.budget = budget
        #: Attempts started so far.
        self.made = 0
        self._lock = threading.Lock()

    def started(self) -> None:
        """One attempt of the call started."""
        with self._lock:
            self.made += 1

    def _room(self) -> bool:
        cap = self.budget.max_attempts_per_call
        return cap is None or self.made < cap

    def may_fail_over(self) -> bool:
        """Whether the call may try another member (its attempt cap allows one more)."""
        with self._lock:
            return self._room()

    def may_retry(self) -> bool:
        """Whether the call may retry or hedge: the cap allows it and the budget grants it."""
        with self._lock:
            if not self._room():
                return False
        return self.budget.try_retry()

    async def amay_retry(self) -> bool:
        """Async [`may_retry`][]: awaits the shared budget's grant (if any)."""
        with self._lock:
            if not self._room():
                return False
        return await self.budget.atry_retry()

    def counted(self, attempt: Callable[..., T]) -> Callable[..., T]:
        """``attempt`` counting each of its calls as an attempt started."""

        def counting(*args: Any, **kwargs: Any) -> T:
            self.started()
            return attempt(*args, **kwargs)

        return counting

    def acounted(self, attempt: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        """The coroutine function twin of [`counted`][] (tenacity awaits only those)."""

        async def counting(*args: Any, **kwargs: Any) -> T:
            self.started()
            return await attempt(*args, **kwargs)

        return counting


def call_attempts(budget: RetryBudget | None) -> CallAttempts | None:
    """A call's attempt counter on ``budget`` (the call counted), or None without one."""
    return None if budget is None else budget.open_call()


async def acall_attempts(budget: RetryBudget | None) -> CallAttempts | None:
    """Async [`call_attempts`][]: awaits the shared count (if any)."""
    return None if budget is None else await budget.aopen_call()


def retry_budget_option(value: object, option: str = "retry_budget") -> RetryBudget | None:
    """An option that takes None or a [`RetryBudget`][]."""
    if value is None or isinstance(value, RetryBudget):
        return value
    raise checks.OptionTypeError(
        f"{option} must be None or an llm_resilience.RetryBudget(...); got {type(value).__name__}"
    )


def _fraction(option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ValueError(f"{option} must be a number from 0 to 1, got {value!r}")
        raise checks.OptionTypeError(f"{option} must be a number from 0 to 1, got {value!r}")
    return float(value)


def _non_negative(option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise checks.OptionTypeError(f"{option} must be a number >= 0, got {value!r}")
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{option} must be a finite number >= 0, got {value!r}")
    return float(value)
