"""Token-bucket rate limiters: one process ([`TokenBucketRateLimiter`][]) or many
sharing a Redis ([`RedisTokenBucketRateLimiter`][]).

Both refill ``max(1, rpm // 60)`` permits every second into a bucket holding ``rpm``
permits that starts full, queue callers over budget first come first served, and plug
into LangChain's and LlamaIndex's ``rate_limiter=`` slots once the adapter packages are
imported. ``tokens_per_minute`` adds a token bucket; with ``requests_per_minute=None``
it is the only limit.

Examples:
    >>> from llm_resilience.ratelimit import TokenBucketRateLimiter
    >>> limiter = TokenBucketRateLimiter(requests_per_minute=300)
    >>> limiter.permits_per_period, limiter.capacity
    (5, 300)

The Redis limiter loads on first use, so importing this package never imports redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from llm_resilience.checks import known_keywords
from llm_resilience.ratelimit._bucket import TokenBucketRateLimiter
from llm_resilience.ratelimit._protocol import (
    PERIOD_SECONDS,
    RateLimiter,
    reconcile_with_usage,
    request_weight,
    weighs_tokens,
)

if TYPE_CHECKING:
    from llm_resilience.ratelimit._redis import RedisTokenBucketRateLimiter

__all__ = [
    "PERIOD_SECONDS",
    "LimiterOptions",
    "RateLimiter",
    "RedisTokenBucketRateLimiter",
    "TokenBucketRateLimiter",
    "limiter_for",
    "reconcile_with_usage",
    "request_weight",
    "weighs_tokens",
]


class LimiterOptions(TypedDict, total=False):
    """The keywords a rate-limited wrapper takes for its limiter, each optional.

    `limiter_for(**options)` turns them into the limiter; a wrapper typed
    `**options: Unpack[LimiterOptions]` shows and checks these keywords in IDEs and mypy.
    """

    #: Request permits per minute (an integer >= 1), or None: requests unlimited.
    requests_per_minute: int | None
    #: How many callers may wait at once; None (the default) waits without bound.
    max_queued_requests: int | None
    #: Token permits per minute (prompt estimate plus output cap per call), or None.
    tokens_per_minute: int | None
    #: A limiter shared with other wrappers, instead of the three numbers.
    limiter: Any


_OPTION_NAMES = tuple(LimiterOptions.__annotations__)


def limiter_for(**options: Unpack[LimiterOptions]) -> Any:
    """The limiter a wrapper waits on: ``limiter`` as given, or one built from the numbers.

    The rule every rate-limited wrapper follows: either budgets (a new
    [`TokenBucketRateLimiter`][] from ``requests_per_minute``, ``tokens_per_minute``
    or both, with ``max_queued_requests`` if set; tokens alone leave requests unlimited)
    or ``limiter`` (a limiter shared with other wrappers, which carries its own
    numbers). Raises ``ValueError`` for neither, both, or numbers given alongside a
    shared limiter; ``TypeError`` for a limiter without ``acquire``/``aacquire``, or for a
    keyword that is not one of `LimiterOptions` (naming the closest one).

    Examples:
        >>> limiter_for(requests_per_minute=300).capacity
        300
        >>> limiter_for(tokens_per_minute=40_000).requests_per_minute is None
        True
    """
    known_keywords("limiter_for", options, _OPTION_NAMES)
    requests_per_minute = options.get("requests_per_minute")
    max_queued_requests = options.get("max_queued_requests")
    tokens_per_minute = options.get("tokens_per_minute")
    limiter = options.get("limiter")
    if limiter is not None:
        if requests_per_minute is not None:
            raise ValueError(
                "give either requests_per_minute or limiter, not both: a shared limiter "
                "carries its own requests_per_minute"
            )
        extras = [
            name
            for name, value in (
                ("max_queued_requests", max_queued_requests),
                ("tokens_per_minute", tokens_per_minute),
            )
            if value is not None
        ]
        if extras:
            raise ValueError(
                f"{' and '.join(extras)} configure the limiter built from "
                f"requests_per_minute; set them on the limiter passed as limiter="
            )
        if not callable(getattr(limiter, "acquire", None)) or not callable(
            getattr(limiter, "aacquire", None)
        ):
            raise TypeError(
                f"limiter must have acquire() and aacquire() (an llm_resilience "
                f"TokenBucketRateLimiter or RedisTokenBucketRateLimiter); got "
                f"{type(limiter).__module__}.{type(limiter).__qualname__}"
            )
        return limiter
    if requests_per_minute is None and tokens_per_minute is None:
        raise ValueError(
            "give requests_per_minute, tokens_per_minute (integers >= 1; either or both) "
            "or limiter (a shared rate limiter)"
        )
    return TokenBucketRateLimiter(requests_per_minute, max_queued_requests, tokens_per_minute)


def __getattr__(name: str) -> Any:
    if name == "RedisTokenBucketRateLimiter":
        from llm_resilience.ratelimit._redis import RedisTokenBucketRateLimiter

        globals()[name] = RedisTokenBucketRateLimiter
        return RedisTokenBucketRateLimiter
    raise AttributeError(f"module 'llm_resilience.ratelimit' has no attribute {name!r}")
