"""Retrying a failed call: the policy behind every ``Retrying*`` wrapper.

A [`RetryPolicy`][] runs a call up to ``attempts`` times (4 by default: the first
try and 3 retries), waiting between tries ``base_delay * 2**n`` seconds (1, 2, 4, ...)
plus up to ``jitter`` seconds at random, never more than ``max_delay``. A provider's
``Retry-After`` (or ``retry-after-ms``) replaces that wait when it is at most
``max_delay``. When the attempts run out, the last attempt's own exception is raised.

What is retried is decided by `is_retryable`: every ``Exception`` except

* [`BudgetExceededError`][] and the limiter's refusals
  ([`RateLimitQueueFullError`][],
  [`RateLimitBackendError`][],
  [`RequestExceedsCapacityError`][]): asking again cannot
  change their answer, and a retry would spend a queue slot or a budget check;
* ``NotImplementedError``: the method does not exist on the wrapped object;
* an upstream "budget exhausted"
  ([`is_budget_exhausted`][llm_resilience.transient.is_budget_exhausted]: HTTP 402,
  OpenAI's ``insufficient_quota`` 429, Anthropic's ``billing_error``, a gateway's
  ``budget_exceeded``): the account stays spent however often it is asked;
* errors that carry a status that is certainly permanent (400, 401, 403, 404 and 422 by
  default, found as `status_code_of` finds statuses):
  retrying a bad request or a bad key only delays the failure.

Cancellation (``asyncio.CancelledError``), ``KeyboardInterrupt``, ``SystemExit`` and
other non-``Exception`` errors are never retried. The error's explicit causes
(``raise ... from ...``) are looked at too, so a wrapped refusal stays a refusal.

Examples:
    >>> policy = RetryPolicy(attempts=3, base_delay=0.5, jitter=0)
    >>> policy.delays()
    (0.5, 1.0)
    >>> calls = []
    >>> def flaky():
    ...     calls.append(1)
    ...     if len(calls) < 3:
    ...         raise ConnectionError("reset")
    ...     return "ok"
    >>> RetryPolicy(jitter=0, sleep=lambda seconds: None).call(flaky)
    'ok'
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import tenacity

from llm_resilience import checks
from llm_resilience.errors import (
    BudgetExceededError,
    RateLimitBackendError,
    RateLimitQueueFullError,
    RequestExceedsCapacityError,
)
from llm_resilience.retry_budget import (
    CallAttempts,
    RetryBudget,
    acall_attempts,
    call_attempts,
    retry_budget_option,
)
from llm_resilience.self_retry import warn_of_multiplied_retries
from llm_resilience.transient import is_budget_exhausted, retry_after_of, status_code_of

__all__ = [
    "DEFAULT_PERMANENT_STATUS_CODES",
    "RetryPolicy",
    "is_retryable",
    "materialise_once",
    "policy_option",
    "warn_of_multiplied_retries",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Statuses that no retry can fix: bad request, unauthorised, forbidden, not found,
#: unprocessable content.
DEFAULT_PERMANENT_STATUS_CODES: frozenset[int] = frozenset({400, 401, 403, 404, 422})

_NEVER_RETRIED: tuple[type[BaseException], ...] = (
    BudgetExceededError,
    RateLimitQueueFullError,
    RateLimitBackendError,
    RequestExceedsCapacityError,
    NotImplementedError,
)

_MAX_CAUSE_DEPTH = 8
#: The most attempts a policy may make; more is a loop, not a policy.
MAX_ATTEMPTS = 100


def is_retryable(
    exc: BaseException,
    *,
    permanent_status_codes: frozenset[int] = DEFAULT_PERMANENT_STATUS_CODES,
) -> bool:
    """Whether [`RetryPolicy`][] tries again after ``exc`` (see the module docstring).

    Examples:
        >>> is_retryable(ConnectionError())
        True
        >>> is_retryable(KeyboardInterrupt())
        False
    """
    if is_budget_exhausted(exc):
        return False
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < _MAX_CAUSE_DEPTH:
        seen.add(id(current))
        if not isinstance(current, Exception) or isinstance(current, _NEVER_RETRIED):
            return False
        if status_code_of(current) in permanent_status_codes:
            return False
        current = current.__cause__
    return True


def materialise_once(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """``(args, kwargs)`` with every one-shot iterator (a generator, ``iter(...)``) read
    into a list, so each attempt of a call sees the same input; other values untouched."""
    return (
        tuple(list(value) if isinstance(value, Iterator) else value for value in args),
        {
            key: list(value) if isinstance(value, Iterator) else value
            for key, value in kwargs.items()
        },
    )


def _attempts(value: object) -> int:
    # The first try included: 1 means no retry at all.
    return checks.whole("RetryPolicy.attempts", value, minimum=1, maximum=MAX_ATTEMPTS)


def _delay(option: str, value: object, zero: str) -> float:
    # 0 is a legitimate wait here (tenacity's wait_none, Polly's zero delay): retry at once.
    amount = checks.seconds(f"RetryPolicy.{option}", value, zero=zero)
    assert amount is not None
    return amount


# The defaults look ``time.sleep``, ``asyncio.sleep`` and ``time.time`` up on every use
# (not bound at import or construction), as the limiters read their clock: patching them
# (a test's monkeypatch, freezegun) reaches every policy built with the defaults.
def _sleep(seconds: float) -> None:
    time.sleep(seconds)


async def _asleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


def _now() -> float:
    return time.time()


@dataclass(frozen=True, slots=True, repr=False)
class RetryPolicy:
    """How often and how patiently to retry a call; see the module docstring for what.

    Examples:
        >>> from llm_resilience import RetryPolicy
        >>> RetryPolicy()
        RetryPolicy(attempts=4, base_delay=1.0, max_delay=30.0, jitter=1.0)
        >>> RetryPolicy(attempts=0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: RetryPolicy.attempts must be an integer from 1 to 100, got 0

    Durations are seconds (int or float) or a ``timedelta``, 0 or more (0 is no wait;
    a negative one raises ``ValueError`` naming the option). ``sleep``/``asleep`` and
    ``now`` (the wall clock, for ``Retry-After`` given as an HTTP date) are
    injectable so tests prove the schedule without waiting. [`from_tenacity`][]
    builds a policy from your own tenacity arguments instead.
    """

    #: Tries in all, the first included (1 means never retry).
    attempts: int = 4
    #: Seconds before the first retry; each later wait doubles it (0: retry at once).
    base_delay: float = 1.0
    #: The longest wait between two tries, and the longest ``Retry-After`` honoured
    #: (0: never wait).
    max_delay: float = 30.0
    #: Up to this many seconds added at random to each backoff wait (0 for none), so
    #: many callers failing together do not retry together.
    jitter: float = 1.0
    #: Statuses that are never retried.
    permanent_status_codes: frozenset[int] = field(
        default=DEFAULT_PERMANENT_STATUS_CODES, repr=False
    )
    #: Waits between sync tries (default: ``time.sleep``, looked up at each wait).
    sleep: Callable[[float], None] = field(default=_sleep, repr=False, compare=False)
    #: Waits between async tries (default: ``asyncio.sleep``, looked up at each wait).
    asleep: Callable[[float], Awaitable[None]] = field(default=_asleep, repr=False, compare=False)
    #: The wall clock (seconds since the epoch), to read a ``Retry-After`` date (default:
    #: ``time.time``, looked up at each reading).
    now: Callable[[], float] = field(default=_now, repr=False, compare=False)
    #: The [`RetryBudget`][] every retry draws from (None, the default: unbounded): a
    #: retry it refuses is not made, and the attempt's own error is raised at once.
    budget: RetryBudget | None = field(default=None, repr=False, compare=False)
    _tenacity: Mapping[str, Any] | None = field(
        default=None, repr=False, compare=True, hash=False, init=False
    )

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "attempts", _attempts(self.attempts))
        set_(self, "base_delay", _delay("base_delay", self.base_delay, "no wait"))
        set_(self, "max_delay", _delay("max_delay", self.max_delay, "no wait"))
        set_(self, "jitter", _delay("jitter", self.jitter, "no jitter"))
        codes = self.permanent_status_codes
        if isinstance(codes, (str, bytes)) or not isinstance(codes, Iterable):
            raise checks.OptionTypeError(
                "RetryPolicy.permanent_status_codes must be a collection of HTTP status "
                f"integers between 400 and 599; got {codes!r}"
            )
        normalised = frozenset(codes)
        for code in normalised:
            if isinstance(code, bool) or not isinstance(code, int) or not 400 <= code <= 599:
                raise ValueError(
                    "RetryPolicy.permanent_status_codes must hold HTTP status integers "
                    f"between 400 and 599; got {code!r}"
                )
        set_(self, "permanent_status_codes", normalised)
        retry_budget_option(self.budget, "RetryPolicy.budget")
        for name in ("sleep", "asleep", "now"):
            if not callable(getattr(self, name)):
                raise checks.OptionTypeError(
                    f"RetryPolicy.{name} must be callable; got {getattr(self, name)!r}"
                )

    def __repr__(self) -> str:
        if self._tenacity is not None:
            given = ", ".join(f"{key}={value!r}" for key, value in self._tenacity.items())
            return f"RetryPolicy.from_tenacity({given})"
        budget = "" if self.budget is None else f", budget={self.budget!r}"
        return (
            f"RetryPolicy(attempts={self.attempts}, base_delay={self.base_delay}, "
            f"max_delay={self.max_delay}, jitter={self.jitter}{budget})"
        )

    @classmethod
    def from_tenacity(cls, **tenacity_kwargs: Any) -> RetryPolicy:
        """A policy that is your tenacity configuration, whole.

        The keywords are ``tenacity.Retrying``'s (``stop``, ``wait``, ``retry``,
        ``reraise``, ``before_sleep``, ``sleep``, ...); each call builds a fresh
        ``Retrying`` (or ``AsyncRetrying`` for async calls) from them. None of this
        policy's rules apply: your ``retry`` predicate must itself refuse cancellation,
        [`BudgetExceededError`][] and the limiter's refusals
        (`is_retryable` does all of that), and without ``reraise=True`` tenacity
        raises its own ``RetryError`` when the attempts run out.

        Examples:
            >>> import tenacity
            >>> policy = RetryPolicy.from_tenacity(
            ...     stop=tenacity.stop_after_attempt(2),
            ...     retry=tenacity.retry_if_exception(is_retryable),
            ...     reraise=True,
            ... )
        """
        try:
            tenacity.Retrying(**tenacity_kwargs)
        except TypeError as error:
            raise checks.OptionTypeError(
                f"RetryPolicy.from_tenacity takes tenacity.Retrying's keywords: {error}"
            ) from None
        policy = cls()
        object.__setattr__(policy, "_tenacity", dict(tenacity_kwargs))
        return policy

    @property
    def is_custom(self) -> bool:
        """Whether this policy is a tenacity configuration of your own."""
        return self._tenacity is not None

    @property
    def max_attempts(self) -> int | None:
        """Tries in all, or None when a custom configuration decides (unknown here)."""
        return None if self._tenacity is not None else self.attempts

    def delays(self) -> tuple[float, ...]:
        """The backoff waits between tries, without jitter or ``Retry-After``."""
        return tuple(self._backoff(retry) for retry in range(1, self.attempts))

    def _backoff(self, retry: int) -> float:
        # ``retry`` counts from 1: the wait before the first retry is ``base_delay``.
        exponent = min(retry - 1, 64)
        return min(self.max_delay, self.base_delay * 2.0**exponent)

    def _wait(self, state: tenacity.RetryCallState) -> float:
        outcome = state.outcome
        error = outcome.exception() if outcome is not None else None
        if error is not None:
            asked = retry_after_of(error, now=self.now)
            if asked is not None and asked <= self.max_delay:
                return asked
        delay = self._backoff(state.attempt_number)
        if self.jitter:
            delay += random.uniform(0, self.jitter)  # spreads retries; not a secret
        return min(delay, self.max_delay)

    def _retry(self, state: tenacity.RetryCallState) -> bool:
        outcome = state.outcome
        if outcome is None or not outcome.failed:
            return False
        error = outcome.exception()
        assert error is not None
        return is_retryable(error, permanent_status_codes=self.permanent_status_codes)

    def _budgeted(self, calls: CallAttempts) -> Callable[[tenacity.RetryCallState], bool]:
        """The retry predicate of one call drawing from the budget: the policy's rule
        first, then (unless the attempts are used up anyway) the budget's grant."""

        def retry(state: tenacity.RetryCallState) -> bool:
            if not self._retry(state) or state.attempt_number >= self.attempts:
                return False
            if calls.may_retry():
                return True
            self._refused(state)
            return False

        return retry

    def _abudgeted(
        self, calls: CallAttempts
    ) -> Callable[[tenacity.RetryCallState], Awaitable[bool]]:
        """Async [`_budgeted`][]: awaits the shared budget's grant (if any)."""

        async def retry(state: tenacity.RetryCallState) -> bool:
            if not self._retry(state) or state.attempt_number >= self.attempts:
                return False
            if await calls.amay_retry():
                return True
            self._refused(state)
            return False

        return retry

    def _refused(self, state: tenacity.RetryCallState) -> None:
        logger.warning(
            "Attempt %d of %d failed (%s); the retry budget refuses a retry, so it is "
            "raised at once.",
            state.attempt_number,
            self.attempts,
            type(state.outcome.exception()).__name__ if state.outcome else "?",
        )

    def _log(self, state: tenacity.RetryCallState) -> None:
        outcome = state.outcome
        error = outcome.exception() if outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        logger.warning(
            "Attempt %d of %d failed (%s); retrying in %.2f s.",
            state.attempt_number,
            self.attempts,
            type(error).__name__,
            wait,
        )

    def _kwargs(
        self, sleep: Any, calls: CallAttempts | None = None, *, asynchronous: bool = False
    ) -> dict[str, Any]:
        if self._tenacity is not None:
            return dict(self._tenacity)
        budgeted = self._abudgeted if asynchronous else self._budgeted
        return {
            "stop": tenacity.stop_after_attempt(self.attempts),
            "wait": self._wait,
            "retry": self._retry if calls is None else budgeted(calls),
            "reraise": True,
            "sleep": sleep,
            "before_sleep": self._log,
        }

    def call(self, function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``function(*args, **kwargs)`` under this policy; one-shot iterators among the
        arguments are read once (`materialise_once`) so every try sees them."""
        args, kwargs = materialise_once(args, kwargs)
        calls = self._open_call()
        retrying = tenacity.Retrying(**self._kwargs(self.sleep, calls))
        if calls is not None:
            function = calls.counted(function)
        return retrying(function, *args, **kwargs)

    async def acall(self, function: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Async [`call`][]: awaits ``function(*args, **kwargs)`` under this policy."""
        args, kwargs = materialise_once(args, kwargs)
        calls = await self._aopen_call()
        retrying = tenacity.AsyncRetrying(**self._kwargs(self.asleep, calls, asynchronous=True))
        if calls is not None:
            function = calls.acounted(function)
        result: T = await retrying(function, *args, **kwargs)
        return result

    def _open_call(self) -> CallAttempts | None:
        # A custom tenacity configuration owns its whole schedule: no budget applies.
        return call_attempts(self.budget) if self._tenacity is None else None

    async def _aopen_call(self) -> CallAttempts | None:
        """Async [`_open_call`][]: awaits the shared budget's count (if any)."""
        return await acall_attempts(self.budget) if self._tenacity is None else None


def policy_option(value: object) -> RetryPolicy:
    """The ``policy=`` option of a retrying wrapper: a [`RetryPolicy`][], or None for
    the default one."""
    if value is None:
        return RetryPolicy()
    if not isinstance(value, RetryPolicy):
        raise TypeError(
            f"policy must be an llm_resilience.RetryPolicy or None; got {type(value).__name__}"
        )
    return value
