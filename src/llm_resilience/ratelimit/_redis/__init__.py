"""The token bucket of [`TokenBucketRateLimiter`][], kept in Redis and shared by every process.

Every decision is one round trip: one Lua script reads the bucket (a hash at
``key_prefix + name``), refills it by the Redis server's clock (``TIME``, so the hosts'
clocks never matter), and either grants at once or *reserves* the caller's permit and
answers when it is due. The caller then sleeps until that moment and goes, with no retry
and no polling. Reservations are taken in the order the calls reach Redis, so callers
are served first come first served across every process and host; the cost is that a
reservation is a commitment (see [`RedisTokenBucketRateLimiter`][] for what
cancellation and crashes do to it).

Every round trip is bounded in time (``operation_timeout``) and first takes one of as
many local slots as the client has connections, so more callers than connections queue
for a connection instead of failing as if Redis were down.

redis-py is an optional extra (``pip install 'llm-resilience[redis]'``) and is imported
only when a limiter is built.

One job per module: ``_script`` (the Lua script), ``_outage`` (the outage breaker, on
`llm_resilience._redis`, whose clients and bounds it shares) and ``_limiter``
([`RedisTokenBucketRateLimiter`][]).
"""

from llm_resilience._redis import DEFAULT_MAX_CONNECTIONS
from llm_resilience.checks import MAX_OPERATION_TIMEOUT
from llm_resilience.ratelimit._redis._limiter import (
    DEFAULT_KEY_PREFIX,
    DEFAULT_OPERATION_TIMEOUT,
    DEFAULT_OUTAGE_COOLDOWN,
    DEFAULT_REDIS_URL,
    RedisTokenBucketRateLimiter,
)
from llm_resilience.ratelimit._redis._outage import BackendErrorMode

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_OPERATION_TIMEOUT",
    "DEFAULT_OUTAGE_COOLDOWN",
    "DEFAULT_REDIS_URL",
    "MAX_OPERATION_TIMEOUT",
    "BackendErrorMode",
    "RedisTokenBucketRateLimiter",
]
