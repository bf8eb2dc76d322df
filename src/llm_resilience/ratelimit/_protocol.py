"""What every limiter of this package is, and the checks they share.

Both [`TokenBucketRateLimiter`][] (one process) and
[`RedisTokenBucketRateLimiter`][] (every process sharing a
Redis) follow one derivation from a per-minute budget:

* the bucket refills in discrete steps of `PERIOD_SECONDS` (1 s);
* each step adds ``max(1, per_minute // 60)`` permits (`per_period`), so 300 rpm
  adds 5 a second, 90 rpm floors to 1 a second (60 a minute) and 30 rpm rounds up to 1 a
  second (60 a minute: budgets under 60 over-admit);
* the bucket holds the whole per-minute budget and starts full, so an idle limiter
  absorbs a burst of one minute's worth of calls.

The same derivation applies to ``tokens_per_minute`` when a limiter weighs calls by tokens.
A limiter needs at least one of the two budgets; with ``tokens_per_minute`` alone
(``requests_per_minute=None``) requests are unlimited and only tokens are counted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from llm_resilience import checks
from llm_resilience.errors import RequestExceedsCapacityError
from llm_resilience.tokens import count_tokens
from llm_resilience.usage import estimate_request_tokens, reported_usage

__all__ = [
    "PERIOD_SECONDS",
    "UNLIMITED_REQUESTS",
    "RateLimiter",
    "check_budgets",
    "check_token_weight",
    "non_negative_int",
    "optional_positive_int",
    "per_period",
    "positive_int",
    "reconcile_with_usage",
    "request_weight",
    "weighs_tokens",
]

logger = logging.getLogger("llm_resilience.ratelimit")

#: Length of one replenishment step, in seconds.
PERIOD_SECONDS = 1.0

#: The request bucket of a tokens-only limiter (``requests_per_minute=None``): it holds
#: and regains this many permits every step, which no caller can use up, so requests
#: never wait and the arithmetic stays the same. Exact in a double (Redis's Lua numbers).
UNLIMITED_REQUESTS = 2**40


def per_period(per_minute: int) -> int:
    """Permits added per 1-second step for a per-minute budget: ``max(1, per_minute // 60)``.

    Examples:
        >>> [per_period(rpm) for rpm in (30, 60, 90, 300, 6000)]
        [1, 1, 1, 5, 100]
    """
    return max(1, per_minute // 60)


def positive_int(option: str, value: object) -> int:
    """``value`` if it is an ``int`` >= 1; else ``TypeError`` (not an int, or a bool) or
    ``ValueError`` (< 1), both naming ``option`` and the allowed range."""
    return checks.whole(option, value, minimum=1)


def optional_positive_int(option: str, value: object) -> int | None:
    """Like `positive_int`, but None (the option left unset) passes through."""
    return None if value is None else positive_int(option, value)


def check_budgets(
    requests_per_minute: object, tokens_per_minute: object
) -> tuple[int | None, int | None]:
    """The two per-minute budgets of a limiter, checked: each None or an ``int`` >= 1, and
    not both None (a limiter with neither would limit nothing).

    Examples:
        >>> check_budgets(None, 40_000)
        (None, 40000)
        >>> check_budgets(None, None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: give requests_per_minute, tokens_per_minute or both (integers >= 1): ...
    """
    if requests_per_minute is None and tokens_per_minute is None:
        raise ValueError(
            "give requests_per_minute, tokens_per_minute or both (integers >= 1): a rate "
            "limiter with neither would limit nothing"
        )
    return (
        optional_positive_int("requests_per_minute", requests_per_minute),
        optional_positive_int("tokens_per_minute", tokens_per_minute),
    )


def non_negative_int(option: str, value: object) -> int:
    """``value`` if it is an ``int`` >= 0, else ``TypeError``/``ValueError`` naming ``option``."""
    return checks.whole(option, value)


def check_token_weight(num_tokens: object, token_capacity: int | None) -> int:
    """Validate a call's token weight (an ``int`` >= 0) against the token bucket.

    Raises [`RequestExceedsCapacityError`][] when the weight
    exceeds ``token_capacity`` (the ``tokens_per_minute`` budget): such a call could
    never be granted. Without a token bucket the weight is checked and ignored.
    """
    weight = non_negative_int("num_tokens", num_tokens)
    if token_capacity is not None and weight > token_capacity:
        raise RequestExceedsCapacityError(
            weight, token_capacity, unit="tokens", option="tokens_per_minute"
        )
    return weight


@runtime_checkable
class RateLimiter(Protocol):
    """The limiter contract, shaped to fit both frameworks' ``rate_limiter=`` slots.

    One ``acquire`` satisfies LangChain's ``acquire(*, blocking=True) -> bool`` and
    LlamaIndex's ``acquire(num_tokens=0)``; ``aacquire`` is LangChain's async name and
    ``async_acquire`` LlamaIndex's. Each call takes one request permit and, with
    ``tokens_per_minute`` set, ``num_tokens`` token permits.
    """

    @property
    def requests_per_minute(self) -> int | None: ...
    @property
    def max_queued_requests(self) -> int | None: ...
    @property
    def tokens_per_minute(self) -> int | None: ...
    @property
    def period(self) -> float: ...
    @property
    def permits_per_period(self) -> int | None: ...
    @property
    def capacity(self) -> int | None: ...
    @property
    def token_capacity(self) -> int | None: ...
    @property
    def tokens_per_period(self) -> int | None: ...
    @property
    def queued(self) -> int: ...

    def acquire(self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat") -> bool:
        """Take a permit, waiting for it unless ``blocking=False``; False if refused."""
        ...

    async def aacquire(
        self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat"
    ) -> bool:
        """Async `acquire`."""
        ...

    async def async_acquire(self, num_tokens: int = 0) -> None:
        """LlamaIndex's name for `aacquire`."""
        ...

    def reconcile(self, estimated_tokens: int, actual_tokens: int) -> None:
        """Settle a call's token weight with its real usage (no-op without a token budget)."""
        ...

    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...
    async def __aenter__(self) -> Self: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...


class BucketArithmetic:
    """The seed's derivation, exposed read-only by both limiters (a mixin).

    Budgets spread over 1-second steps: ``max(1, rpm // 60)`` permits each step,
    ``rpm`` of capacity, full at the start. So budgets under 60 rpm over-admit (30 rpm
    sustains 60 a minute) and the rest round down to a multiple of 60 (90 rpm sustains
    60). The same holds for ``tokens_per_minute``. Kept visible, not "fixed". The request
    numbers are None for a tokens-only limiter (requests unlimited).
    """

    __slots__ = ()

    _rpm: int | None
    _max_queued: int | None
    _tpm: int | None
    #: ``max(1, rpm // 60)``, or `UNLIMITED_REQUESTS` for a tokens-only limiter.
    _permits_per_period: int
    _tokens_per_period: int | None

    @property
    def requests_per_minute(self) -> int | None:
        """The configured request budget per minute (shared by every user of the bucket),
        or None when only tokens are limited."""
        return self._rpm

    @property
    def max_queued_requests(self) -> int | None:
        """How many callers may wait at once (None: unbounded)."""
        return self._max_queued

    @property
    def tokens_per_minute(self) -> int | None:
        """The configured token budget per minute, or None when calls are not weighed."""
        return self._tpm

    @property
    def period(self) -> float:
        """Seconds between refills: 1.0."""
        return PERIOD_SECONDS

    @property
    def permits_per_period(self) -> int | None:
        """Request permits added each period: ``max(1, requests_per_minute // 60)``, or
        None when requests are unlimited."""
        return None if self._rpm is None else self._permits_per_period

    @property
    def capacity(self) -> int | None:
        """Most request permits the bucket holds (= ``requests_per_minute``; starts full),
        or None when requests are unlimited."""
        return self._rpm

    @property
    def token_capacity(self) -> int | None:
        """Most token permits the token bucket holds (= ``tokens_per_minute``), or None."""
        return self._tpm

    @property
    def tokens_per_period(self) -> int | None:
        """Token permits added each period: ``max(1, tokens_per_minute // 60)``, or None."""
        return self._tokens_per_period


class PermitContext:
    """``with limiter:`` and ``async with limiter:`` take one permit (a mixin).

    Nothing is given back on exit: a permit is spent by the request it admitted.
    """

    __slots__ = ()

    def acquire(self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat") -> bool:
        raise NotImplementedError

    async def aacquire(
        self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat"
    ) -> bool:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None

    async def __aenter__(self) -> Self:
        await self.aacquire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None


def weighs_tokens(limiter: object) -> bool:
    """Whether ``limiter`` weighs calls by tokens (it has a ``tokens_per_minute`` budget)."""
    return getattr(limiter, "tokens_per_minute", None) is not None


def request_weight(
    limiter: object,
    *,
    prompt: Sequence[tuple[str, str]] | None = None,
    texts: Sequence[str] | None = None,
    max_output_tokens: int | None = None,
) -> int:
    """The token weight one call takes from ``limiter``, before it is sent.

    0 when the limiter has no token budget (nothing is tokenized then). A chat call
    weighs its estimated ``prompt`` (``cl100k_base``, with chat framing) plus
    ``max_output_tokens``, its output cap (the call's own, else the model's; None counts
    as 0 here, since `reconcile_with_usage` settles the difference afterwards). An
    embedding call weighs its input ``texts``.

    Examples:
        >>> from llm_resilience.ratelimit import TokenBucketRateLimiter
        >>> limiter = TokenBucketRateLimiter(60, tokens_per_minute=10_000)
        >>> request_weight(limiter, prompt=[("user", "hello world")], max_output_tokens=100)
        109
        >>> request_weight(TokenBucketRateLimiter(60), prompt=[("user", "hello world")])
        0
    """
    if not weighs_tokens(limiter):
        return 0
    if texts is not None:
        return sum(count_tokens(text) for text in texts)
    return estimate_request_tokens(prompt or (), max_output_tokens)


def reconcile_with_usage(
    limiter: object,
    estimated_tokens: int,
    reported_input: int | None,
    reported_output: int | None,
    *,
    prompt: Sequence[tuple[str, str]],
) -> bool:
    """Settle a weighed call's permits with the usage its provider reported; True if settled.

    The one rule every wrapper follows after a successful chat call (or completed stream):

    * a limiter without ``tokens_per_minute`` weighs nothing, so has nothing to settle;
    * only a report settles (`reported_usage`: both counts,
      and an input above 0 for a non-empty ``prompt``); an estimate would only replace
      one guess with another, so the hold stands as taken;
    * a limiter that cannot settle (Redis down) logs a WARNING on
      ``llm_resilience.ratelimit`` naming the error type and returns False: the call has
      succeeded and must not fail for its bookkeeping.

    Examples:
        >>> from llm_resilience.ratelimit import TokenBucketRateLimiter
        >>> limiter = TokenBucketRateLimiter(60, tokens_per_minute=10_000)
        >>> reconcile_with_usage(limiter, 500, 0, 20, prompt=[("user", "hi")])  # 0 in: no report
        False
        >>> reconcile_with_usage(limiter, 500, 9, 20, prompt=[("user", "hi")])
        True
    """
    if getattr(limiter, "tokens_per_minute", None) is None:
        return False
    usage = reported_usage(reported_input, reported_output, prompt=prompt)
    if usage is None:
        return False
    try:
        limiter.reconcile(  # type: ignore[attr-defined]
            estimated_tokens, usage.input_tokens + usage.output_tokens
        )
    except Exception as exc:
        logger.warning(
            "Rate limiter could not reconcile a call's token weight (%s); the call succeeded "
            "and its estimated weight stands.",
            type(exc).__name__,
        )
        return False
    return True
