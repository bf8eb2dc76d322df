"""The token bucket of :class:`TokenBucketRateLimiter`, kept in Redis and shared by every process.

Every decision is one round trip: one Lua script reads the bucket (a hash at
``key_prefix + name``), refills it by the Redis server's clock (``TIME``, so the hosts'
clocks never matter), and either grants at once or *reserves* the caller's permit and
answers when it is due. The caller then sleeps until that moment and goes, with no retry
and no polling. Reservations are taken in the order the calls reach Redis, so callers
are served first come first served across every process and host; the cost is that a
reservation is a commitment (see :class:`RedisTokenBucketRateLimiter` for what
cancellation and crashes do to it).

redis-py is an optional extra (``pip install 'llm-resilience[redis]'``) and is imported
only when a limiter is built.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import AsyncGenerator
from importlib import import_module
from typing import Any, Final, Literal, get_args

from llm_resilience import telemetry
from llm_resilience.errors import (
    RateLimitBackendError,
    RateLimitQueueFullError,
    RequestExceedsCapacityError,
)
from llm_resilience.ratelimit._protocol import (
    PERIOD_SECONDS,
    BucketArithmetic,
    PermitContext,
    check_token_weight,
    non_negative_int,
    optional_positive_int,
    per_period,
    positive_int,
)

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "DEFAULT_REDIS_URL",
    "BackendErrorMode",
    "RedisTokenBucketRateLimiter",
]

logger = logging.getLogger("llm_resilience.ratelimit")

DEFAULT_REDIS_URL: Final = "redis://127.0.0.1:6379/0"
DEFAULT_KEY_PREFIX: Final = "llm-resilience:ratelimit:"
BackendErrorMode = Literal["fail_open", "fail_closed"]

#: After a backend failure, calls skip Redis for this many seconds and apply
#: ``on_backend_error`` at once, so a dead or black-holed server costs one connect attempt
#: per second instead of one per call.
_OUTAGE_RETRY_SECONDS = 1.0
#: Socket connect and read timeouts of a client built from ``redis_url`` (a URL's own
#: ``socket_timeout``/``socket_connect_timeout`` query options win). Redis answers in
#: well under a millisecond; a second of silence is an outage.
_SOCKET_TIMEOUT_SECONDS = 1.0

# Modes of the script (ARGV[1]).
_RESERVE: Final = "reserve"  # grant now, or reserve the permit and answer when it is due
_TRY: Final = "try"  # grant now, or refuse without reserving anything
_REFUND: Final = "refund"  # give back a reservation that is not due yet
_ADJUST: Final = "adjust"  # add to the token field (negative: charge), capped at capacity

# One script, one round trip per decision. Fields: r = request permits, t = token permits,
# ts = start of the current refill period, in server microseconds. A missing key is a full
# bucket, so the key expires exactly when the bucket would have refilled to capacity
# (and is deleted when a refund or give-back fills it): expiry never changes an answer.
# Numbers are written with %.0f because Lua's default tostring keeps 14 digits and
# microsecond timestamps have 16.
_SCRIPT: Final = """
local key = KEYS[1]
local mode = ARGV[1]
local capacity = tonumber(ARGV[2])
local per_period = tonumber(ARGV[3])
local token_capacity = tonumber(ARGV[4])
local tokens_per_period = tonumber(ARGV[5])
local amount = tonumber(ARGV[6])
local due = tonumber(ARGV[7])
local period = tonumber(ARGV[8])
local weighed = token_capacity > 0

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local state = redis.call('HMGET', key, 'r', 't', 'ts')
local permits = tonumber(state[1]) or capacity
local tokens = tonumber(state[2]) or token_capacity
local last = tonumber(state[3]) or now
if last > now then last = now end
local steps = math.floor((now - last) / period)
if steps > 0 then
  permits = math.min(capacity, permits + steps * per_period)
  if weighed then tokens = math.min(token_capacity, tokens + steps * tokens_per_period) end
  last = last + steps * period
end

-- Periods until the request and token fields are both >= 0 (both pay off every reservation).
local function periods_until_paid(p, t)
  local n = 0
  if p < 0 then n = math.ceil(-p / per_period) end
  if weighed and t < 0 then n = math.max(n, math.ceil(-t / tokens_per_period)) end
  return n
end

local granted = 1
local due_at = now
if mode == 'reserve' then
  permits = permits - 1
  if weighed then tokens = tokens - amount end
  local n = periods_until_paid(permits, tokens)
  if n > 0 then due_at = last + n * period end
elseif mode == 'try' then
  if permits < 1 or (weighed and tokens < amount) then
    local n = periods_until_paid(permits - 1, tokens - amount)
    return {0, last + n * period - now, now}
  end
  permits = permits - 1
  if weighed then tokens = tokens - amount end
elseif mode == 'refund' then
  if now >= due then return {0, 0, now} end
  permits = math.min(capacity, permits + 1)
  if weighed then tokens = math.min(token_capacity, tokens + amount) end
elseif mode == 'adjust' then
  tokens = math.min(token_capacity, tokens + amount)
end

local n = 0
if permits < capacity then n = math.ceil((capacity - permits) / per_period) end
if weighed and tokens < token_capacity then
  n = math.max(n, math.ceil((token_capacity - tokens) / tokens_per_period))
end
if n == 0 then
  redis.call('DEL', key)
else
  redis.call('HSET', key, 'r', string.format('%.0f', permits), 'ts', string.format('%.0f', last))
  if weighed then redis.call('HSET', key, 't', string.format('%.0f', tokens)) end
  redis.call('PEXPIRE', key, math.ceil((last + n * period - now) / 1000))
end
return {granted, due_at - now, due_at}
"""
_SCRIPT_SHA: Final = hashlib.sha1(_SCRIPT.encode()).hexdigest()
_PERIOD_MICROSECONDS: Final = round(PERIOD_SECONDS * 1_000_000)

# (granted, microseconds until due, due time in server microseconds)
_Reply = tuple[bool, int, int]


def _load_redis() -> Any:
    # Typed loosely on purpose: redis is an optional extra, and the core type-checks
    # without it installed.
    try:
        return import_module("redis")
    except ImportError as exc:
        raise ImportError(
            "RedisTokenBucketRateLimiter needs redis-py: pip install 'llm-resilience[redis]'"
        ) from exc


class RedisTokenBucketRateLimiter(BucketArithmetic, PermitContext):
    """:class:`TokenBucketRateLimiter`'s bucket, shared through Redis by every process and host.

    >>> limiter = RedisTokenBucketRateLimiter(600, name="openai-chat")  # doctest: +SKIP
    >>> with limiter:  # doctest: +SKIP
    ...     call_the_model()

    The same derivation as the in-process limiter: ``max(1, rpm // 60)`` permits each
    1-second period, capacity ``rpm``, starting full; ``tokens_per_minute`` adds a token
    bucket refilled alike, kept in the same Redis hash. Every process that names the same
    bucket (``key_prefix + name``) shares it, and must configure it with the same numbers:
    each call refills by its own limiter's numbers.

    **Order.** A call over budget reserves its permit in Redis and sleeps until it is due,
    so callers are served in the order their calls reach Redis, across every process,
    with one round trip per call and no retries. A waiter that is cancelled (or
    interrupted) gives its reservation back if it is not due yet; callers already waiting
    keep their due times, so the returned permit (like tokens given back by
    :meth:`reconcile`) goes to whoever asks next, not to them. A process that dies while
    waiting wastes its one reserved permit, as does a caller cancelled while its round
    trip is in flight.

    **max_queued_requests** bounds the callers waiting *in this process* (each process
    has its own bound): a call that would have to wait while that many are waiting is
    refused with :class:`~llm_resilience.errors.RateLimitQueueFullError`, after a
    non-reserving round trip that grants it if a permit is free right now.

    **Backend errors** (any redis-py error: refused, lost or slow connection, a failing
    script): ``on_backend_error="fail_open"`` (the default) grants the permit unlimited;
    ``"fail_closed"`` raises :class:`~llm_resilience.errors.RateLimitBackendError` (pinned
    non-transient, so a fallback chain does not mistake it for a provider outage), even
    with ``blocking=False``. Either way the histogram records outcome ``faulted``, one
    WARNING is logged on ``llm_resilience.ratelimit`` per outage (and an INFO when Redis
    answers again), and for 1 s after a failure calls apply the mode without trying
    Redis. :meth:`reconcile` never raises for a backend error: the adjustment is dropped.

    **Connections.** Nothing connects at construction. A client built from ``redis_url``
    gives each connect and each read 1 s and retries once, at once. ``client`` takes your
    own ``redis.Redis`` instead (left open by :meth:`close`); the async methods then use a
    ``redis.asyncio`` client built from its connection options. redis.asyncio connections
    belong to one event loop, so each loop gets its own client, closed when the loop shuts
    down through ``asyncio.run`` (or by :meth:`aclose`).

    Keys expire when the bucket would have refilled to capacity, so idle buckets vanish.
    """

    __slots__ = (
        "_async_clients",
        "_async_factory",
        "_client",
        "_in_flight",
        "_in_outage",
        "_key",
        "_last_error",
        "_lock",
        "_max_queued",
        "_name",
        "_no_script_error",
        "_on_backend_error",
        "_outage_until",
        "_owns_client",
        "_permits_per_period",
        "_redis_error",
        "_rpm",
        "_tokens_per_period",
        "_tpm",
        "_waiting",
    )

    def __init__(
        self,
        requests_per_minute: int,
        max_queued_requests: int | None = None,
        tokens_per_minute: int | None = None,
        *,
        name: str,
        redis_url: str = DEFAULT_REDIS_URL,
        client: Any = None,
        on_backend_error: BackendErrorMode = "fail_open",
        key_prefix: str = DEFAULT_KEY_PREFIX,
    ) -> None:
        self._rpm = positive_int("requests_per_minute", requests_per_minute)
        self._max_queued = optional_positive_int("max_queued_requests", max_queued_requests)
        self._tpm = optional_positive_int("tokens_per_minute", tokens_per_minute)
        if not isinstance(name, str):
            raise TypeError(
                f"name must be a non-empty string naming the shared bucket, got {name!r}"
            )
        if not name:
            raise ValueError(
                f"name must be a non-empty string naming the shared bucket, got {name!r}"
            )
        if not isinstance(key_prefix, str):
            raise TypeError(f"key_prefix must be a string, got {key_prefix!r}")
        if on_backend_error not in get_args(BackendErrorMode):
            raise ValueError(
                f"on_backend_error must be 'fail_open' or 'fail_closed', got {on_backend_error!r}"
            )
        if not isinstance(redis_url, str):
            raise TypeError(f"redis_url must be a string such as {DEFAULT_REDIS_URL!r}")
        if client is not None and redis_url != DEFAULT_REDIS_URL:
            raise ValueError("pass redis_url or client, not both")
        self._name = name
        self._key = key_prefix + name
        self._on_backend_error: BackendErrorMode = on_backend_error
        self._permits_per_period = per_period(self._rpm)
        self._tokens_per_period = None if self._tpm is None else per_period(self._tpm)

        redis = _load_redis()
        self._redis_error: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._no_script_error: type[BaseException] = redis.exceptions.NoScriptError
        if client is None:
            options = {
                "socket_timeout": _SOCKET_TIMEOUT_SECONDS,
                "socket_connect_timeout": _SOCKET_TIMEOUT_SECONDS,
            }
            # A URL is parsed here (a bad one fails now); no connection is made until a call.
            self._client = redis.Redis.from_url(
                redis_url, retry=_one_retry(import_module("redis.retry")), **options
            )
            self._owns_client = True
            url = redis_url

            def async_factory() -> Any:
                asyncio_redis = import_module("redis.asyncio")
                retry = _one_retry(import_module("redis.asyncio.retry"))
                return asyncio_redis.Redis.from_url(url, retry=retry, **options)
        else:
            if not callable(getattr(client, "evalsha", None)):
                raise TypeError(f"client must be a redis.Redis, got {type(client).__name__}")
            self._client = client
            self._owns_client = False

            def async_factory() -> Any:
                return _async_twin(client)

        self._async_factory = async_factory
        #: Per event loop: its redis.asyncio client and the async generator closing it.
        self._async_clients: dict[asyncio.AbstractEventLoop, tuple[Any, AsyncGenerator[None]]] = {}
        self._lock = threading.Lock()
        #: Callers of this process sleeping on a reservation.
        self._waiting = 0
        #: Reserving round trips in flight (each may come back as a waiter).
        self._in_flight = 0
        self._in_outage = False
        self._outage_until = 0.0
        self._last_error: BaseException | None = None

    # -- the derivation, read-only ---------------------------------------------------

    @property
    def name(self) -> str:
        """The bucket's name; processes using the same name (and prefix) share it."""
        return self._name

    @property
    def key(self) -> str:
        """The Redis key of the bucket's hash: ``key_prefix + name``."""
        return self._key

    @property
    def on_backend_error(self) -> BackendErrorMode:
        """What a call does when Redis fails: ``fail_open`` grants, ``fail_closed`` raises."""
        return self._on_backend_error

    @property
    def queued(self) -> int:
        """Callers of this process waiting for a reserved permit right now."""
        return self._waiting

    # -- acquiring -----------------------------------------------------------------

    def acquire(self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat") -> bool:
        """Take one permit (and ``num_tokens`` token permits), waiting if over budget.

        Returns True when granted (or, with ``fail_open``, when Redis failed); False at
        once with ``blocking=False`` if nothing is free now. Raises
        :class:`~llm_resilience.errors.RateLimitQueueFullError`,
        :class:`~llm_resilience.errors.RequestExceedsCapacityError` (``num_tokens`` over
        ``tokens_per_minute``) or, with ``fail_closed``,
        :class:`~llm_resilience.errors.RateLimitBackendError`. Blocks the calling
        thread: from async code use :meth:`aacquire`.
        """
        started = time.monotonic()
        try:
            outcome = self._acquire(num_tokens, blocking)
        except BaseException as exc:
            self._record(started, surface, _outcome_of(exc))
            raise
        self._record(started, surface, outcome)
        return outcome != "rejected"

    async def aacquire(
        self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat"
    ) -> bool:
        """Async :meth:`acquire`: the wait is an ``asyncio.sleep``, cancellable at any point.

        A waiter cancelled before its permit is due gives the reservation back.
        """
        started = time.monotonic()
        try:
            outcome = await self._aacquire(num_tokens, blocking)
        except BaseException as exc:
            self._record(started, surface, _outcome_of(exc))
            raise
        self._record(started, surface, outcome)
        return outcome != "rejected"

    async def async_acquire(self, num_tokens: int = 0) -> None:
        """LlamaIndex's name for a blocking :meth:`aacquire`."""
        await self.aacquire(num_tokens)

    def reconcile(self, estimated_tokens: int, actual_tokens: int) -> None:
        """Give back (or charge) ``estimated_tokens - actual_tokens`` on the token bucket.

        A charge may take the bucket below zero, delaying later callers until refills pay
        it off; a give-back never lifts it above ``tokens_per_minute``. One round trip; a
        no-op without ``tokens_per_minute``, and never raises for a backend error.
        """
        estimated = non_negative_int("estimated_tokens", estimated_tokens)
        actual = non_negative_int("actual_tokens", actual_tokens)
        if self._tpm is None or estimated == actual:
            return
        self._round_trip(_ADJUST, estimated - actual, 0)

    def close(self) -> None:
        """Close the connections of a client this limiter built (not one you passed)."""
        if self._owns_client:
            self._client.close()

    async def aclose(self) -> None:
        """Close this event loop's async client now (``asyncio.run`` closes it anyway)."""
        with self._lock:
            entry = self._async_clients.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry[1].aclose()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(requests_per_minute={self._rpm}, "
            f"max_queued_requests={self._max_queued}, "
            f"tokens_per_minute={self._tpm}, name={self._name!r})"
        )

    # -- internals -----------------------------------------------------------------

    def _claim(self, blocking: bool) -> bool:
        """Whether this call may reserve (and so wait): blocking, and the local queue has room."""
        if not blocking:
            return False
        with self._lock:
            bound = self._max_queued
            if bound is not None and self._waiting + self._in_flight >= bound:
                return False
            self._in_flight += 1
            return True

    def _settle(self, reserving: bool, reply: _Reply | None) -> None:
        # One step from in flight to waiting, so the local bound never sees a gap.
        with self._lock:
            if reserving:
                self._in_flight -= 1
            if reply is not None and reply[0] and reply[1] > 0:
                self._waiting += 1

    def _acquire(self, num_tokens: int, blocking: bool) -> telemetry.Outcome:
        weight = check_token_weight(num_tokens, self._tpm)
        reserving = self._claim(blocking)
        reply: _Reply | None = None
        try:
            reply = self._round_trip(_RESERVE if reserving else _TRY, weight, 0)
        finally:
            self._settle(reserving, reply)
        if reply is None:
            return self._backend_failed()
        granted, wait_us, due_us = reply
        if not granted:
            return self._refused(blocking)
        if wait_us > 0:
            try:
                time.sleep(wait_us / 1_000_000)
            except BaseException:
                self._round_trip(_REFUND, weight, due_us)
                raise
            finally:
                with self._lock:
                    self._waiting -= 1
        return "granted"

    async def _aacquire(self, num_tokens: int, blocking: bool) -> telemetry.Outcome:
        weight = check_token_weight(num_tokens, self._tpm)
        reserving = self._claim(blocking)
        reply: _Reply | None = None
        try:
            reply = await self._around_trip(_RESERVE if reserving else _TRY, weight, 0)
        finally:
            self._settle(reserving, reply)
        if reply is None:
            return self._backend_failed()
        granted, wait_us, due_us = reply
        if not granted:
            return self._refused(blocking)
        if wait_us > 0:
            try:
                await asyncio.sleep(wait_us / 1_000_000)
            except BaseException:
                await self._around_trip(_REFUND, weight, due_us)
                raise
            finally:
                with self._lock:
                    self._waiting -= 1
        return "granted"

    def _refused(self, blocking: bool) -> telemetry.Outcome:
        if blocking:
            # Only a blocking call whose local queue was full is ever refused.
            assert self._max_queued is not None
            raise RateLimitQueueFullError(self._max_queued)
        return "rejected"

    def _args(self, mode: str, amount: int, due_us: int) -> tuple[object, ...]:
        return (
            _SCRIPT_SHA,
            1,
            self._key,
            mode,
            self._rpm,
            self._permits_per_period,
            self._tpm or 0,
            self._tokens_per_period or 0,
            amount,
            due_us,
            _PERIOD_MICROSECONDS,
        )

    def _round_trip(self, mode: str, amount: int, due_us: int) -> _Reply | None:
        """Run the script (EVALSHA, EVAL if the server lost it); None if Redis failed."""
        if self._skipping():
            return None
        args = self._args(mode, amount, due_us)
        try:
            try:
                raw = self._client.evalsha(*args)
            except self._no_script_error:
                raw = self._client.eval(_SCRIPT, *args[1:])
        except self._redis_error as exc:
            self._note_failure(exc)
            return None
        self._note_success()
        return _parse(raw)

    async def _around_trip(self, mode: str, amount: int, due_us: int) -> _Reply | None:
        if self._skipping():
            return None
        args = self._args(mode, amount, due_us)
        try:
            client = await self._async_client()
            try:
                raw = await client.evalsha(*args)
            except self._no_script_error:
                raw = await client.eval(_SCRIPT, *args[1:])
        except self._redis_error as exc:
            self._note_failure(exc)
            return None
        self._note_success()
        return _parse(raw)

    async def _async_client(self) -> Any:
        # redis.asyncio connections belong to the loop that opened them: one client per
        # loop. Each comes with an async generator parked at its yield; a loop's
        # ``shutdown_asyncgens`` (which ``asyncio.run`` calls before closing the loop)
        # closes the generator and so the client, while the loop can still do it cleanly.
        loop = asyncio.get_running_loop()
        entry = self._async_clients.get(loop)
        if entry is not None:
            return entry[0]
        client = self._async_factory()
        closer = _closing(client)
        await anext(closer)
        with self._lock:
            for stale in [other for other in self._async_clients if other.is_closed()]:
                del self._async_clients[stale]
            self._async_clients[loop] = (client, closer)
        return client

    def _skipping(self) -> bool:
        return self._in_outage and time.monotonic() < self._outage_until

    def _note_failure(self, exc: BaseException) -> None:
        with self._lock:
            self._last_error = exc
            self._outage_until = time.monotonic() + _OUTAGE_RETRY_SECONDS
            first = not self._in_outage
            self._in_outage = True
        if first:
            action = (
                "granting permits without limiting"
                if self._on_backend_error == "fail_open"
                else "refusing permits"
            )
            logger.warning(
                "Shared limiter %r: Redis failed (%s: %s); %s (on_backend_error=%r) until it "
                "answers again.",
                self._name,
                type(exc).__name__,
                exc,
                action,
                self._on_backend_error,
            )

    def _note_success(self) -> None:
        if self._in_outage:
            with self._lock:
                recovered, self._in_outage = self._in_outage, False
            if recovered:
                logger.info("Shared limiter %r: Redis answers again.", self._name)

    def _backend_failed(self) -> telemetry.Outcome:
        if self._on_backend_error == "fail_closed":
            raise RateLimitBackendError(self._name) from self._last_error
        return "faulted"

    @staticmethod
    def _record(started: float, surface: str, outcome: telemetry.Outcome) -> None:
        waited_ms = (time.monotonic() - started) * 1000.0
        telemetry.record_rate_limit_wait(waited_ms, surface=surface, outcome=outcome)


async def _closing(client: Any) -> AsyncGenerator[None]:
    try:
        yield
    finally:
        await client.aclose()


def _outcome_of(exc: BaseException) -> telemetry.Outcome:
    if isinstance(exc, (RateLimitQueueFullError, RequestExceedsCapacityError)):
        return "rejected"
    if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
        return "cancelled"
    return "faulted"


def _parse(raw: Any) -> _Reply:
    granted, wait_us, due_us = raw
    return bool(int(granted)), int(wait_us), int(due_us)


def _one_retry(retry_module: Any) -> Any:
    # One immediate retry recovers a pooled connection that went stale (a Redis restart);
    # redis-py's default of several backed-off retries would stall every call in an outage.
    backoff = import_module("redis.backoff")
    return retry_module.Retry(backoff.NoBackoff(), 1)


# Connection options that mean the same to redis.asyncio; the rest (sync retry objects,
# connect callbacks, internal bookkeeping) do not carry over.
_PORTABLE_OPTIONS: Final = frozenset(
    {
        "host",
        "port",
        "path",
        "db",
        "username",
        "password",
        "credential_provider",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_keepalive_options",
        "client_name",
        "protocol",
        "health_check_interval",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_data",
        "ssl_ca_path",
        "ssl_check_hostname",
        "ssl_min_version",
        "ssl_ciphers",
        "ssl_password",
    }
)


def _async_twin(client: Any) -> Any:
    """A ``redis.asyncio.Redis`` reaching the same server as the sync ``client``."""
    asyncio_redis = import_module("redis.asyncio")
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        raise TypeError(
            f"the async methods need a client with a connection_pool to copy; "
            f"{type(client).__name__} has none"
        )
    options = {k: v for k, v in pool.connection_kwargs.items() if k in _PORTABLE_OPTIONS}
    kind = pool.connection_class.__name__
    connection_class = getattr(asyncio_redis.connection, kind, asyncio_redis.connection.Connection)
    retry = _one_retry(import_module("redis.asyncio.retry"))
    twin_pool = asyncio_redis.ConnectionPool(
        connection_class=connection_class, retry=retry, **options
    )
    twin = asyncio_redis.Redis(connection_pool=twin_pool)
    # The twin owns its pool: closing it must disconnect the pool (redis-py's from_pool,
    # spelled so that redis 5.0 understands it too).
    twin.auto_close_connection_pool = True
    return twin
