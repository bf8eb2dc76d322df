"""Token-bucket rate limiters: one process (:class:`TokenBucketRateLimiter`) or many
sharing a Redis (:class:`RedisTokenBucketRateLimiter`).

Both refill ``max(1, rpm // 60)`` permits every second into a bucket holding ``rpm``
permits that starts full, queue callers over budget first come first served, and plug
into LangChain's and LlamaIndex's ``rate_limiter=`` slots once the adapter packages are
imported.

>>> from llm_resilience.ratelimit import TokenBucketRateLimiter
>>> limiter = TokenBucketRateLimiter(requests_per_minute=300)
>>> limiter.permits_per_period, limiter.capacity
(5, 300)

The Redis limiter loads on first use, so importing this package never imports redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llm_resilience.ratelimit._bucket import TokenBucketRateLimiter
from llm_resilience.ratelimit._protocol import PERIOD_SECONDS, RateLimiter

if TYPE_CHECKING:
    from llm_resilience.ratelimit._redis import RedisTokenBucketRateLimiter

__all__ = [
    "PERIOD_SECONDS",
    "RateLimiter",
    "RedisTokenBucketRateLimiter",
    "TokenBucketRateLimiter",
]


def __getattr__(name: str) -> Any:
    if name == "RedisTokenBucketRateLimiter":
        from llm_resilience.ratelimit._redis import RedisTokenBucketRateLimiter

        globals()[name] = RedisTokenBucketRateLimiter
        return RedisTokenBucketRateLimiter
    raise AttributeError(f"module 'llm_resilience.ratelimit' has no attribute {name!r}")
