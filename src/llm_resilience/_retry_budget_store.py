"""``RedisRetryBudgetStore``: where a fleet of workers counts its calls and retries.

The store is storage only (no policy): a [`RetryBudget`][] passed ``shared=`` keeps its
``ratio``, floor and ``window`` and sends them with each decision, exactly as a
[`Cooldown`][] keeps its numbers and asks a [`RedisCircuitStore`][]. So the local budget
that decides while Redis is away is the same object with the same numbers.

Under the store's prefix (``{namespace}:retry_budget:``; the braces are a Redis Cluster
hash tag) one hash per window length, ``w:<window ms>``, holds the fleet's counts per
slice of ``window / 10``: field ``c:<slice>`` the calls started in it, ``r:<slice>`` the
retries granted in it. Each decision is one Lua script (``EVALSHA``) that reads Redis's
clock (``TIME``, so the hosts' clocks never matter), drops the slices that left the window,
and counts (a call) or decides and counts (a retry). The hash expires two windows after
its last write.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from datetime import timedelta
from typing import Any, Final

from llm_resilience._redis import Outage, arun_script, connect, pool_size, run_script
from llm_resilience.checks import MAX_DURATION, MAX_OPERATION_TIMEOUT, seconds

__all__ = [
    "DEFAULT_RETRY_BUDGET_NAMESPACE",
    "RedisRetryBudgetStore",
]

logger = logging.getLogger("llm_resilience.retry")

DEFAULT_RETRY_BUDGET_NAMESPACE: Final = "llm_resilience"
#: Default ``operation_timeout``: the call counts sit on every call's path, so a Redis
#: slower than this is treated as away.
DEFAULT_RETRY_BUDGET_OPERATION_TIMEOUT: Final = 0.1
#: Default ``outage_cooldown``: after a failed round trip, decisions are local without
#: trying Redis for this many seconds.
DEFAULT_RETRY_BUDGET_OUTAGE_COOLDOWN: Final = 1.0

#: Modes (ARGV[1]).
CALL: Final = "call"
RETRY: Final = "retry"
READ: Final = "read"

# KEYS[1]: the window's hash. ARGV = mode, slice_ms, slices, ratio, floor
# -> {granted (1/0; 1 for call and read), calls in the window, retries in the window}
SCRIPT: Final = """
local mode = ARGV[1]
local slice = tonumber(ARGV[2])
local slices = tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local number = math.floor(now / slice)
local oldest = number - slices
local calls, retries = 0, 0
local held = redis.call('HGETALL', KEYS[1])
local stale = {}
for i = 1, #held, 2 do
  local field = held[i]
  local n = tonumber(string.sub(field, 3))
  if n <= oldest or n > number then
    stale[#stale + 1] = field
  elseif string.sub(field, 1, 1) == 'c' then
    calls = calls + tonumber(held[i + 1])
  else
    retries = retries + tonumber(held[i + 1])
  end
end
if #stale > 0 then
  redis.call('HDEL', KEYS[1], unpack(stale))
end
local granted = 1
if mode == 'call' then
  redis.call('HINCRBY', KEYS[1], 'c:' .. number, 1)
  calls = calls + 1
elseif mode == 'retry' then
  local allowed = tonumber(ARGV[4]) * calls + tonumber(ARGV[5])
  if retries + 1 > allowed then
    granted = 0
  else
    redis.call('HINCRBY', KEYS[1], 'r:' .. number, 1)
    retries = retries + 1
  end
end
if mode ~= 'read' then
  redis.call('PEXPIRE', KEYS[1], 2 * slice * slices)
end
return {granted, calls, retries}
"""

#: Redis's name for the script (EVALSHA).
SCRIPT_SHA: Final = hashlib.sha1(SCRIPT.encode()).hexdigest()


def _duration(option: str, value: object, maximum: timedelta = MAX_DURATION) -> float:
    amount = seconds(f"RedisRetryBudgetStore.{option}", value, maximum=maximum)
    assert amount is not None  # None is not allowed
    return amount


def _safe_url(url: str) -> str:
    """``url`` without its credentials, for reprs and logs."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "redis://?"
    host = rest.rsplit("@", 1)[-1].split("?", 1)[0]
    return f"{scheme}://{host}"


class RedisRetryBudgetStore:
    """The calls and retries of a fleet's [`RetryBudget`][], counted in Redis.

    Examples:
        >>> store = RedisRetryBudgetStore("redis://127.0.0.1:6379/0")  # doctest: +SKIP
        >>> budget = RetryBudget(ratio=0.2, min_per_second=1, shared=store)  # doctest: +SKIP

    Pass it as ``RetryBudget(shared=...)``: every worker whose budget uses the same
    ``namespace`` (and ``window``) counts its calls and retries in one sliding window, so
    ``ratio`` bounds the *fleet's* retries against the fleet's calls, and the floor
    (``min_per_second * window``) is the fleet's, once, not per worker.

    **Cost.** Each decision is one round trip (one Lua script, ``EVALSHA``): one per call
    counted, one per retry or hedge asked for. Nothing else.

    **Redis away** (refused, reset, silent, slower than ``operation_timeout``, a failing
    script): the budget decides on its own local counts (which always learn this worker's
    calls and retries), one WARNING per outage is logged on ``llm_resilience.retry`` (an
    INFO when Redis answers again), and for ``outage_cooldown`` seconds decisions do not
    try Redis. A call is never failed or held because the store is away; a decision waits
    at most ``operation_timeout`` for it (twice that when it queued for a connection
    behind a round trip that failed).

    Args:
        url_or_client: A ``redis://`` URL (the store builds its clients, bounded as
            below, and [`close`][] closes them) or your own ``redis.Redis`` (left open;
            its own timeouts and retries bound the sync calls: a WARNING at construction
            says when they exceed ``operation_timeout``).
        namespace: Prefix of every key (``{namespace}:retry_budget:...``); fleets that
            share a Redis but not their budget use different namespaces.
        operation_timeout: Seconds (or ``timedelta``) one round trip may take (default
            0.1): the connect and read timeouts of clients built from a URL, and a
            deadline on each async round trip.
        outage_cooldown: Seconds (or ``timedelta``) decisions stay local after a failed
            round trip (default 1.0).

    Raises ``TypeError``/``ValueError`` naming the option for bad input; ``ImportError``
    without redis-py (``pip install 'llm-resilience[redis]'``). Nothing connects at
    construction.
    """

    __slots__ = (
        "_async_clients",
        "_client",
        "_errors",
        "_gate",
        "_no_script",
        "_outage",
        "_owns_client",
        "_prefix",
        "_url",
        "namespace",
        "operation_timeout",
        "outage_cooldown",
    )

    def __init__(
        self,
        url_or_client: Any,
        *,
        namespace: str = DEFAULT_RETRY_BUDGET_NAMESPACE,
        operation_timeout: float | timedelta = DEFAULT_RETRY_BUDGET_OPERATION_TIMEOUT,
        outage_cooldown: float | timedelta = DEFAULT_RETRY_BUDGET_OUTAGE_COOLDOWN,
    ) -> None:
        if not isinstance(namespace, str) or not namespace or "}" in namespace:
            raise ValueError(
                f"RedisRetryBudgetStore.namespace must be a non-empty string without '}}'; "
                f"got {namespace!r}"
            )
        timeout = _duration("operation_timeout", operation_timeout, MAX_OPERATION_TIMEOUT)
        #: Seconds one round trip to Redis may take.
        self.operation_timeout = timeout
        #: Seconds decisions stay local after a failed round trip.
        self.outage_cooldown = _duration("outage_cooldown", outage_cooldown)
        #: The prefix of every key (fleets that share it share their budget).
        self.namespace = namespace
        self._prefix = f"{{{namespace}}}:retry_budget:"
        if isinstance(url_or_client, str):
            url: str | None = url_or_client
            client = None
            self._url = _safe_url(url_or_client)
        elif callable(getattr(url_or_client, "evalsha", None)):
            url, client = None, url_or_client
            self._url = f"client={type(url_or_client).__name__}"
        else:
            raise TypeError(
                f"RedisRetryBudgetStore.url_or_client must be a redis:// URL or a "
                f"redis.Redis; got {type(url_or_client).__name__}"
            )
        label = f"Shared retry budget {namespace!r}"
        connected = connect(
            url, client, timeout, who="RedisRetryBudgetStore", label=label, logger=logger
        )
        self._client = connected.sync
        self._async_clients = connected.loops
        self._owns_client = connected.owned
        self._errors = connected.errors
        self._no_script = connected.no_script
        self._gate = threading.BoundedSemaphore(pool_size(self._client))
        self._outage = Outage(
            label, "each worker's budget decides on its own counts", self.outage_cooldown, logger
        )

    def __repr__(self) -> str:
        return f"RedisRetryBudgetStore({self._url!r}, namespace={self.namespace!r})"

    @property
    def available(self) -> bool:
        """False while Redis is taken as away (the last round trip failed)."""
        return not self._outage.in_outage

    def close(self) -> None:
        """Close the connections of a client this store built (not one you passed)."""
        if self._owns_client:
            self._client.close()

    async def aclose(self) -> None:
        """Close this event loop's async client now (``asyncio.run`` closes it anyway)."""
        await self._async_clients.aclose()

    # -- the decisions (one round trip each; None when Redis is away) ---------------

    def _args(
        self, mode: str, window: float, slices: int, ratio: float = 0.0, floor: float = 0.0
    ) -> tuple[list[str], list[object]]:
        window_ms = max(slices, round(window * 1000))
        slice_ms = max(1, window_ms // slices)
        return [f"{self._prefix}w:{window_ms}"], [mode, slice_ms, slices, repr(ratio), repr(floor)]

    def call(self, window: float, slices: int) -> tuple[int, int] | None:
        """Count one call of the fleet; the fleet's calls and retries in the window."""
        return _counts(self._call(*self._args(CALL, window, slices)))

    async def acall(self, window: float, slices: int) -> tuple[int, int] | None:
        """Async [`call`][]."""
        return _counts(await self._acall(*self._args(CALL, window, slices)))

    def retry(self, window: float, slices: int, ratio: float, floor: float) -> bool | None:
        """Take one retry if the fleet's window allows ``ratio * calls + floor``."""
        return _granted(self._call(*self._args(RETRY, window, slices, ratio, floor)))

    async def aretry(self, window: float, slices: int, ratio: float, floor: float) -> bool | None:
        """Async [`retry`][]."""
        return _granted(await self._acall(*self._args(RETRY, window, slices, ratio, floor)))

    def read(self, window: float, slices: int) -> tuple[int, int] | None:
        """The fleet's calls and retries in the window, counting nothing."""
        return _counts(self._call(*self._args(READ, window, slices)))

    # -- round trips -----------------------------------------------------------------

    def _call(self, keys: list[str], args: list[object]) -> Any:
        return run_script(
            self._outage,
            self._gate,
            self._client,
            self._errors,
            self._no_script,
            (SCRIPT, SCRIPT_SHA),
            keys,
            args,
        )

    async def _acall(self, keys: list[str], args: list[object]) -> Any:
        return await arun_script(
            self._outage,
            self._async_clients,
            self.operation_timeout,
            self._errors,
            self._no_script,
            (SCRIPT, SCRIPT_SHA),
            keys,
            args,
        )


def _counts(raw: Any) -> tuple[int, int] | None:
    return None if raw is None else (int(raw[1]), int(raw[2]))


def _granted(raw: Any) -> bool | None:
    return None if raw is None else bool(int(raw[0]))
