"""Redis plumbing shared by the parts that keep state in Redis (storage layer: no policy).

[`RedisTokenBucketRateLimiter`][] and [`RedisCircuitStore`][] both build their clients
here (`connect`: every round trip bounded by ``operation_timeout``, redis-py's retries
off, one ``redis.asyncio`` client per event loop with its connection slots) and both
skip a failing Redis the same way (`Outage`: one WARNING per outage, an INFO on
recovery), and run one Lua script a decision the same way (`run_script`,
`arun_script`: None while Redis is away). redis-py is an optional extra, imported
only when a client is built.
"""

from llm_resilience._redis._clients import (
    DEFAULT_MAX_CONNECTIONS,
    Connected,
    LoopClients,
    connect,
)
from llm_resilience._redis._clients import _pool_size as pool_size
from llm_resilience._redis._outage import Outage
from llm_resilience._redis._script import arun_script, run_script

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "Connected",
    "LoopClients",
    "Outage",
    "arun_script",
    "connect",
    "pool_size",
    "run_script",
]
