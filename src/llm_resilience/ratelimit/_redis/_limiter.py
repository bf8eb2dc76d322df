"""``RedisTokenBucketRateLimiter``: the shared bucket's options, waiting and cancellation."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from datetime import timedelta
from typing import Any, Final, get_args

from llm_resilience import telemetry
from llm_resilience._redis import connect, pool_size
from llm_resilience.checks import MAX_DURATION, MAX_OPERATION_TIMEOUT, seconds
from llm_resilience.errors import (
    RateLimitQueueFullError,
    RequestExceedsCapacityError,
)
from llm_resilience.ratelimit._protocol import (
    UNLIMITED_REQUESTS,
    BucketArithmetic,
    PermitContext,
    check_budgets,
    check_token_weight,
    non_negative_int,
    optional_positive_int,
    per_period,
)
from llm_resilience.ratelimit._redis._outage import BackendErrorMode, OutageBreaker
from llm_resilience.ratelimit._redis._script import (
    _ADJUST,
    _NEVER_DUE,
    _PERIOD_MICROSECONDS,
    _REFUND,
    _RESERVE,
    _SCRIPT,
    _SCRIPT_SHA,
    _TRY,
    _parse,
    _Reply,
)

logger = logging.getLogger("llm_resilience.ratelimit")

DEFAULT_REDIS_URL: Final = "redis://127.0.0.1:6379/0"
DEFAULT_KEY_PREFIX: Final = "llm-resilience:ratelimit:"

#: Default ``operation_timeout``: the most one round trip to Redis may take, in seconds.
#: A second of silence is an outage (Redis's usual answer time: docs/benchmarks.md).
DEFAULT_OPERATION_TIMEOUT: Final = 1.0
#: Default ``outage_cooldown``: after a failure, calls skip Redis for this many seconds and
#: apply ``on_backend_error`` at once, so a dead or silent server costs one timeout per
#: second instead of one per call.
DEFAULT_OUTAGE_COOLDOWN: Final = 1.0


def _duration(option: str, value: object, maximum: timedelta = MAX_DURATION) -> float:
    amount = seconds(option, value, maximum=maximum)
    assert amount is not None  # None is not allowed
    return amount


class RedisTokenBucketRateLimiter(BucketArithmetic, PermitContext):
    """[`TokenBucketRateLimiter`][]'s bucket, shared through Redis by every process and host.

    Examples:
        >>> limiter = RedisTokenBucketRateLimiter(600, name="openai-chat")  # doctest: +SKIP
        >>> with limiter:  # doctest: +SKIP
        ...     call_the_model()

    The same derivation as the in-process limiter: ``max(1, rpm // 60)`` permits each
    1-second period, capacity ``rpm``, starting full; ``tokens_per_minute`` adds a token
    bucket refilled alike, kept in the same Redis hash. Every process that names the same
    bucket (``key_prefix + name``) shares it, and must configure it with the same numbers:
    each call refills by its own limiter's numbers. ``requests_per_minute=None`` limits
    tokens only (giving neither budget raises ``ValueError``). Time is the Redis
    server's (``TIME``), so a frozen or patched clock in a test does not move the bucket.

    **Order.** A call over budget reserves its permit in Redis and sleeps until it is due,
    so callers are served in the order their calls reach Redis, across every process,
    with one round trip per call and no retries. A waiter that is cancelled (or
    interrupted) gives its reservation back; callers already waiting keep their due
    times, so the returned permit (like tokens given back by [`reconcile`][]) goes to
    whoever asks next, not to them. A process that dies while waiting wastes its one
    reserved permit.

    **Cancellation** of [`aacquire`][] leaves nothing behind: no permit, no task, no
    connection. Cancelled while queued for a connection, it leaves at once; cancelled
    while its round trip is in flight, it lets that round trip finish (at most
    ``operation_timeout``), gives back any permit it was granted, then raises
    ``CancelledError``; cancelled while sleeping on a
    reservation, it gives the reservation back. (A sync [`acquire`][] interrupted by
    ``KeyboardInterrupt`` mid round trip may waste that one permit.)

    **max_queued_requests** bounds the callers waiting *in this process* (each process
    has its own bound): a call that would have to wait while that many are waiting is
    refused with [`RateLimitQueueFullError`][], after a
    non-reserving round trip that grants it if a permit is free right now.

    **Connections.** Nothing connects at construction. Each round trip first takes one of
    as many slots as the client's pool has connections (``max_connections``): a client
    built from ``redis_url`` has `DEFAULT_MAX_CONNECTIONS` (16) per pool, or the
    URL's ``?max_connections=``. So any number of concurrent callers queue for a
    connection and are granted at the configured rate; running out of connections is
    never taken for a Redis outage. ``client`` takes your own ``redis.Redis`` instead
    (left open by [`close`][]), and its pool's ``max_connections`` sizes the slots; if
    other code shares that client, give it a ``BlockingConnectionPool``, or a pool
    emptied by them fails the limiter's calls like a backend error. The async methods
    use a ``redis.asyncio`` client built from the same options; its connections belong
    to one event loop, so each loop gets its own client (and slots), closed when the loop
    shuts down through ``asyncio.run`` (or by [`aclose`][]).

    **Time bounds.** ``operation_timeout`` (seconds or ``timedelta``, default 1 s)
    bounds each round trip. The async methods enforce it on our side, as a deadline on
    the whole round trip (connect, script, reply). The sync methods cannot interrupt a
    blocking socket, so a client built from ``redis_url`` uses it as its connect timeout
    and its read timeout (a URL's own ``socket_timeout``/``socket_connect_timeout`` can
    only lower them) and has redis-py's retries turned off: a server that accepts
    connections but never answers, or resets them, fails a sync round trip within
    ``operation_timeout`` too. A call queued for a connection waits for the round trips
    ahead of it; once one of them has failed, it skips Redis. So under a silent or
    resetting Redis an acquire returns (``fail_open``) or raises (``fail_closed``)
    within ``2 * operation_timeout`` (one round trip ahead of it, then its own), usually
    within one. Your own ``client`` keeps its own timeouts and retries on the sync
    methods (redis-py's defaults: 5 s reads, 10 retries); the limiter logs a WARNING at
    construction when they allow more than ``operation_timeout``.

    **Backend errors** (any redis-py error: refused, reset, lost or silent connection, a
    failing script): ``on_backend_error="fail_open"`` (the default) grants the permit
    without limiting; ``"fail_closed"`` raises
    [`RateLimitBackendError`][] (pinned non-transient, so a
    fallback chain does not mistake it for a provider outage), even with
    ``blocking=False``. Either way the histogram records outcome ``faulted``, one WARNING
    is logged on ``llm_resilience.ratelimit`` per outage (and an INFO when Redis answers
    again), and for ``outage_cooldown`` (seconds or ``timedelta``, default 1 s) after a
    failure calls apply the mode without trying Redis. The first call after that tries
    Redis again, and enforcement resumes as soon as it answers. A round trip that timed
    out may still reach Redis later (a server that was frozen, not gone) and take its
    permit there. [`reconcile`][] never raises for a backend error: the adjustment is
    dropped.

    Keys expire when the bucket would have refilled to capacity, so idle buckets vanish.
    A duration that is zero, negative, or longer than a day (``operation_timeout``) or
    365 days (``outage_cooldown``) raises ``ValueError`` naming the option.
    """

    __slots__ = (
        "_async_clients",
        "_capacity",
        "_client",
        "_gate",
        "_in_flight",
        "_key",
        "_lock",
        "_max_queued",
        "_name",
        "_no_script_error",
        "_on_backend_error",
        "_operation_timeout",
        "_outage",
        "_outage_cooldown",
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
        requests_per_minute: int | None = None,
        max_queued_requests: int | None = None,
        tokens_per_minute: int | None = None,
        *,
        name: str,
        redis_url: str = DEFAULT_REDIS_URL,
        client: Any = None,
        on_backend_error: BackendErrorMode = "fail_open",
        key_prefix: str = DEFAULT_KEY_PREFIX,
        operation_timeout: float | timedelta = DEFAULT_OPERATION_TIMEOUT,
        outage_cooldown: float | timedelta = DEFAULT_OUTAGE_COOLDOWN,
    ) -> None:
        self._rpm, self._tpm = check_budgets(requests_per_minute, tokens_per_minute)
        self._max_queued = optional_positive_int("max_queued_requests", max_queued_requests)
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
        timeout = _duration("operation_timeout", operation_timeout, MAX_OPERATION_TIMEOUT)
        self._operation_timeout = timeout
        self._outage_cooldown = _duration("outage_cooldown", outage_cooldown)
        if not isinstance(redis_url, str):
            raise TypeError(f"redis_url must be a string such as {DEFAULT_REDIS_URL!r}")
        if client is not None and redis_url != DEFAULT_REDIS_URL:
            raise ValueError("pass redis_url or client, not both")
        self._name = name
        self._key = key_prefix + name
        self._on_backend_error: BackendErrorMode = on_backend_error
        if self._rpm is None:  # the script's request field then never runs out
            self._capacity = self._permits_per_period = UNLIMITED_REQUESTS
        else:
            self._capacity, self._permits_per_period = self._rpm, per_period(self._rpm)
        self._tokens_per_period = None if self._tpm is None else per_period(self._tpm)

        connected = connect(
            redis_url if client is None else None,
            client,
            timeout,
            who="RedisTokenBucketRateLimiter",
            label=f"Shared limiter {name!r}",
            logger=logger,
        )
        self._redis_error: tuple[type[BaseException], ...] = connected.errors
        self._no_script_error: type[BaseException] = connected.no_script
        self._client = connected.sync
        self._owns_client = connected.owned
        self._async_clients = connected.loops
        #: The sync round trips' slots: one per connection of the client's pool.
        self._gate = threading.BoundedSemaphore(pool_size(self._client))
        self._lock = threading.Lock()
        #: Callers of this process sleeping on a reservation.
        self._waiting = 0
        #: Reserving round trips in flight (each may come back as a waiter).
        self._in_flight = 0
        self._outage = OutageBreaker(name, on_backend_error, self._outage_cooldown)

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
    def operation_timeout(self) -> float:
        """Seconds one round trip to Redis may take (default 1.0)."""
        return self._operation_timeout

    @property
    def outage_cooldown(self) -> float:
        """Seconds calls skip Redis after a failure (default 1.0)."""
        return self._outage_cooldown

    @property
    def queued(self) -> int:
        """Callers of this process waiting for a reserved permit right now."""
        return self._waiting

    # -- acquiring -----------------------------------------------------------------

    def acquire(self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat") -> bool:
        """Take one permit (and ``num_tokens`` token permits), waiting if over budget.

        Returns True when granted (or, with ``fail_open``, when Redis failed); False at
        once with ``blocking=False`` if nothing is free now. Raises
        [`RateLimitQueueFullError`][],
        [`RequestExceedsCapacityError`][] (``num_tokens`` over
        ``tokens_per_minute``) or, with ``fail_closed``,
        [`RateLimitBackendError`][]. Blocks the calling
        thread: from async code use [`aacquire`][].
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
        """Async [`acquire`][]: the wait is an ``asyncio.sleep``, cancellable at any point.

        A cancelled call consumes nothing: a permit it was granted or reserved is given
        back before ``CancelledError`` propagates (which waits for a round trip in flight,
        at most ``operation_timeout``).
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
        """LlamaIndex's name for a blocking [`aacquire`][]."""
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
        await self._async_clients.aclose()

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
            return self._outage.backend_failed()
        granted, wait_us, _ = reply
        if not granted:
            return self._refused(blocking)
        if wait_us > 0:
            try:
                time.sleep(wait_us / 1_000_000)
            except BaseException:
                # Given back even when it fell due meanwhile: this caller will not use it.
                self._round_trip(_REFUND, weight, _NEVER_DUE)
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
            return self._outage.backend_failed()
        granted, wait_us, _ = reply
        if not granted:
            return self._refused(blocking)
        if wait_us > 0:
            try:
                await asyncio.sleep(wait_us / 1_000_000)
            except BaseException:
                # Given back even when it fell due meanwhile (the cancellation can land
                # after the sleep ended), in a task of its own so that a second
                # cancellation cannot stop the refund half-way; the round trip bounds it.
                refund = asyncio.ensure_future(self._around_trip(_REFUND, weight, _NEVER_DUE))
                await _to_the_end(refund)
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
            self._capacity,
            self._permits_per_period,
            self._tpm or 0,
            self._tokens_per_period or 0,
            amount,
            due_us,
            _PERIOD_MICROSECONDS,
        )

    def _round_trip(self, mode: str, amount: int, due_us: int) -> _Reply | None:
        """Run the script (EVALSHA, EVAL if the server lost it); None if Redis failed."""
        if self._outage.skipping():
            return None
        failures_seen = self._outage.failures
        with self._gate:
            if self._outage.skipping(failures_seen):
                return None
            args = self._args(mode, amount, due_us)
            try:
                try:
                    raw = self._client.evalsha(*args)
                except self._no_script_error:
                    raw = self._client.eval(_SCRIPT, *args[1:])
            except self._redis_error as exc:
                self._outage.note_failure(exc)
                return None
        self._outage.note_success()
        return _parse(raw)

    async def _around_trip(self, mode: str, amount: int, due_us: int) -> _Reply | None:
        """Async `_round_trip`; a cancelled caller leaves no permit taken behind."""
        if self._outage.skipping():
            return None
        failures_seen = self._outage.failures
        client, gate = await self._async_clients.get()
        async with gate:  # cancelled while queued here, the call holds nothing yet
            if self._outage.skipping(failures_seen):
                return None
            # The round trip runs in a task of its own so that cancelling the caller
            # cannot cut it between the script and its reply (which would lose the
            # answer, and with it a permit Redis already gave).
            exchange = asyncio.ensure_future(self._exchange(client, mode, amount, due_us))
            try:
                raw = await asyncio.shield(exchange)
            except asyncio.CancelledError:
                await self._abandon(client, exchange, mode, amount)
                raise
            except self._redis_error as exc:
                self._outage.note_failure(exc)
                return None
        self._outage.note_success()
        return _parse(raw)

    async def _exchange(self, client: Any, mode: str, amount: int, due_us: int) -> Any:
        """One script call on ``client``, within ``operation_timeout`` (else TimeoutError)."""
        args = self._args(mode, amount, due_us)
        async with asyncio.timeout(self._operation_timeout):
            try:
                return await client.evalsha(*args)
            except self._no_script_error:
                return await client.eval(_SCRIPT, *args[1:])

    async def _abandon(
        self, client: Any, exchange: asyncio.Future[Any], mode: str, amount: int
    ) -> None:
        """The caller was cancelled while ``exchange`` was in flight: let it end, then
        give back whatever permit it took, so the cancelled call consumes nothing."""
        await _to_the_end(exchange)
        reply = self._outcome_of_exchange(exchange)
        if reply is None or not reply[0] or mode not in (_RESERVE, _TRY):
            return
        undo = asyncio.ensure_future(self._exchange(client, _REFUND, amount, _NEVER_DUE))
        await _to_the_end(undo)
        self._outcome_of_exchange(undo)

    def _outcome_of_exchange(self, exchange: asyncio.Future[Any]) -> _Reply | None:
        """A finished exchange's reply (noting success or failure), None if it failed."""
        if exchange.cancelled():
            return None
        error = exchange.exception()
        if error is None:
            self._outage.note_success()
            return _parse(exchange.result())
        if isinstance(error, self._redis_error):
            self._outage.note_failure(error)
        return None

    @staticmethod
    def _record(started: float, surface: str, outcome: telemetry.Outcome) -> None:
        waited_ms = (time.monotonic() - started) * 1000.0
        telemetry.record_rate_limit_wait(waited_ms, surface=surface, outcome=outcome)


async def _to_the_end(task: asyncio.Future[Any]) -> None:
    """Wait until ``task`` is done, however often the caller is cancelled meanwhile.

    Only for tasks bounded in time (a round trip under its deadline); the caller re-raises
    its cancellation afterwards. The task's own result or error is left to read.
    """
    while not task.done():
        try:
            await asyncio.shield(task)
        except (Exception, asyncio.CancelledError):
            pass


def _outcome_of(exc: BaseException) -> telemetry.Outcome:
    if isinstance(exc, (RateLimitQueueFullError, RequestExceedsCapacityError)):
        return "rejected"
    if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
        return "cancelled"
    return "faulted"
