"""The shared Redis limiter under load and under faults (issue 7: fail safe under faults).

Every test runs against the Redis at 127.0.0.1:6379, database 15 (the ``redis_url``
fixture of the repo-root conftest), flushed before and after. Faults come from a
:class:`~llm_resilience.testing.FaultProxy` between the limiter and that Redis:
``"silent"`` (connections accepted, nothing answers) or ``"reset"``; the shared server is
never stopped. Fault tests give the limiter a 0.25 s ``operation_timeout`` so a silent
case costs about a quarter of a second; the two load tests run for about 4.5 s each.

Grant times are checked against the bucket's arithmetic: created full at server time
``origin`` with capacity ``C`` and ``P`` permits per 1-second step, it can have granted at
most ``C + P * floor(t - origin)`` permits by time ``t``. Redis and the test read the same
host clock, so the client's wall-clock stamp of a grant is never before its due time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from llm_resilience.checks import OptionTypeError
from llm_resilience.errors import RateLimitBackendError
from llm_resilience.ratelimit import RedisTokenBucketRateLimiter
from llm_resilience.testing import FaultProxy

redis = pytest.importorskip("redis")

pytestmark = pytest.mark.redis

LOGGER = "llm_resilience.ratelimit"


def ours(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The limiter's own records: a client another test left for the collector may log
    asyncio's "Task exception was never retrieved" meanwhile, which says nothing here."""
    return [r for r in caplog.records if r.name.startswith(LOGGER)]


#: The fault tests' operation_timeout; the documented bound of a faulted acquire is twice it.
TIMEOUT = 0.25
BOUND = 2 * TIMEOUT
#: Scheduling slack on top of the documented bound (thread start-up, a loaded test host).
#: CI runs on 2 shared cores beside a second suite worker: 300 tasks and their log lines
#: took 0.79 s past the bound once (the worst of the crowd at 1.29 s). The fault lasts
#: for the whole crowd: an acquire with no bound would not return at all.
SLACK = 1.0
#: A short outage cooldown, so a test can watch the limiter go back to Redis.
COOLDOWN = 0.05
#: How long the load tests keep going once the full bucket's burst is spent: three or
#: four 1-second refill steps.
STEPS_WATCHED = 3.6


@pytest.fixture
def db(redis_url: str) -> Iterator[Any]:
    """A client on the test database, flushed before and after the test."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    try:
        yield client
    finally:
        client.flushdb()
        client.close()


@pytest.fixture
def proxy(redis_url: str) -> Iterator[FaultProxy]:
    """A fault proxy in front of the test Redis, forwarding until told otherwise."""
    target = urlsplit(redis_url)
    with FaultProxy((target.hostname or "127.0.0.1", target.port or 6379)) as running:
        yield running


def through(proxy: FaultProxy, redis_url: str, query: str = "") -> str:
    """``redis_url`` rerouted through ``proxy`` (with an optional query string)."""
    parts = urlsplit(redis_url)
    return urlunsplit(parts._replace(netloc=f"127.0.0.1:{proxy.port}", query=query))


def server_micros(db: Any) -> int:
    seconds, micros = db.time()
    return int(seconds) * 1_000_000 + int(micros)


def bucket_origin(db: Any, key: str, before_us: int) -> int:
    """When the bucket was created (server µs), from its refill mark ``ts``.

    ``ts`` moves in whole 1-second steps from the creation time, which fell less than a
    second after ``before_us``.
    """
    mark = int(db.hget(key, "ts"))
    return mark - (mark - before_us) // 1_000_000 * 1_000_000


def assert_grants_follow_the_bucket(
    stamps: list[float], origin: float, capacity: int, per_step: int, until: float
) -> None:
    """Nothing granted early, and once the burst is spent, ``per_step`` a step within 1%."""
    assert_nothing_granted_early(stamps, origin, capacity, per_step)
    assert_steps_grant_the_rate(stamps, origin, capacity, per_step, until)


def assert_nothing_granted_early(
    stamps: list[float], origin: float, capacity: int, per_step: int
) -> None:
    """By any time ``t`` at most ``capacity + per_step * floor(t - origin)`` were granted."""
    stamps = sorted(stamps)
    early = [
        (k, round(t - origin, 4))
        for k, t in enumerate(stamps, 1)
        if k > capacity + per_step * math.floor(t - origin)
    ]
    assert early == [], f"granted before the bucket held them: {early[:5]}"


def assert_steps_grant_the_rate(
    stamps: list[float], origin: float, capacity: int, per_step: int, until: float
) -> None:
    """Once the burst is spent, each whole window before ``until`` holds ``per_step``
    grants within 1%."""
    stamps = sorted(stamps)
    # Windows run from half-way between steps, so each holds exactly one step's batch.
    # A window counts once the bucket is empty at its start (callers are queued).
    windows: list[int] = []
    step = 0
    while origin + step + 1.5 <= until:
        start = origin + step + 0.5
        if sum(1 for t in stamps if t < start) >= capacity + per_step * step:
            windows.append(sum(1 for t in stamps if start <= t < start + 1))
        step += 1
    assert len(windows) >= 2, windows
    assert all(abs(count - per_step) <= per_step / 100 for count in windows), windows
    assert abs(sum(windows) - per_step * len(windows)) <= per_step * len(windows) / 100


def assert_every_permit_is_accounted_for(
    db: Any, key: str, origin_us: int, capacity: int, per_step: int, granted: int
) -> None:
    """The bucket holds exactly what its refills minus the granted permits leave.

    Holds while the bucket never refilled to capacity (the load tests keep it in debt):
    a permit consumed by a call that was not granted, or a reservation kept by a
    cancelled caller, would show up here.
    """
    mark, permits = int(db.hget(key, "ts")), int(db.hget(key, "r"))
    steps = (mark - origin_us) // 1_000_000
    assert permits == capacity + per_step * steps - granted


# -- saturation: more callers than connections -------------------------------------------


async def test_a_thousand_concurrent_async_callers_queue_for_connections_and_get_the_configured_rate(
    redis_url: str, db: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 6000 rpm: a burst of 6000, then 100 a second. A thousand callers share the client's
    # 16 connections; before the fix, calls beyond redis-py's pool of 100 raised
    # MaxConnectionsError and fail_open granted them unlimited.
    #
    # The rate is counted on the time Redis granted each permit (its due time, from the
    # script's reply), not on when the caller's task resumed: a thousand tasks on a loaded
    # 2-core host can resume a step's batch half a second late, which says nothing about
    # the limiter. What the callers see is checked too: no caller returns before its due
    # time or before the bucket held its permit, and every grant came from Redis.
    # A round trip queued behind a thousand tasks on a loaded 2-core host (the suite runs on
    # two workers) has outlasted the default 1 s bound and been granted locally; this test
    # is about connections and the rate, not the bound (test_..._bounds_... cover it), so
    # it gives Redis five.
    limiter = RedisTokenBucketRateLimiter(
        6000, name="crowd", redis_url=redis_url, operation_timeout=5.0
    )
    stamps: list[float] = []  # when each granted caller got control back (client clock)
    granted_at: list[float] = []  # when Redis granted it (the reply's due time)
    cancelled_due: list[float] = []  # due times of reservations given back by cancellation
    replies: dict[asyncio.Task[Any], float] = {}
    burst_spent = asyncio.Event()
    around_trip = RedisTokenBucketRateLimiter._around_trip

    async def recording_round_trip(
        self: RedisTokenBucketRateLimiter, mode: str, amount: int, due_us: int
    ) -> Any:
        reply = await around_trip(self, mode, amount, due_us)
        if reply is not None and reply[0] and mode in ("reserve", "try"):
            task = asyncio.current_task()
            assert task is not None
            replies[task] = reply[2] / 1e6
        return reply

    monkeypatch.setattr(RedisTokenBucketRateLimiter, "_around_trip", recording_round_trip)

    async def caller() -> None:
        task = asyncio.current_task()
        assert task is not None
        while True:
            replies.pop(task, None)
            try:
                await limiter.aacquire()
            except asyncio.CancelledError:
                if task in replies:  # reserved, then given back unused
                    cancelled_due.append(replies[task])
                raise
            stamps.append(time.time())
            granted_at.append(replies.get(task, math.nan))  # NaN: granted without Redis
            if len(stamps) == 6000:
                burst_spent.set()
            await asyncio.sleep(0)  # a call granted without a round trip must not hog the loop

    before_us = server_micros(db)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        callers = [asyncio.create_task(caller()) for _ in range(1000)]
        await asyncio.wait_for(burst_spent.wait(), 60)
        await asyncio.sleep(STEPS_WATCHED)
        until = time.time()
        for task in callers:  # the queued ones give their reservations back
            task.cancel()
        await asyncio.gather(*callers, return_exceptions=True)

    origin_us = bucket_origin(db, limiter.key, before_us)
    assert not any(math.isnan(due) for due in granted_at), "a grant Redis never made"
    # (Redis and the test read the same host clock; 1 ms covers timer rounding.)
    too_soon = [
        (due, stamp) for due, stamp in zip(granted_at, stamps, strict=True) if stamp < due - 0.001
    ]
    assert too_soon == [], f"callers returned before their permit was due: {too_soon[:5]}"
    assert_nothing_granted_early(stamps, origin_us / 1e6, 6000, 100)
    # Whole windows only up to the first permit a caller was cancelled before using: up
    # to there every permit Redis granted reached its caller.
    assert_steps_grant_the_rate(
        granted_at, origin_us / 1e6, 6000, 100, min([until, *cancelled_due])
    )
    assert_every_permit_is_accounted_for(db, limiter.key, origin_us, 6000, 100, len(stamps))
    assert ours(caplog) == []  # no call was taken for a Redis failure
    assert limiter.queued == 0
    assert asyncio.all_tasks() == {asyncio.current_task()}
    await limiter.aclose()
    limiter.close()


def test_sixty_four_threads_on_one_limiter_get_the_configured_rate(
    redis_url: str, db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = RedisTokenBucketRateLimiter(6000, name="threads", redis_url=redis_url)
    stamps: list[float] = []
    errors: list[BaseException] = []
    burst_spent, finished = threading.Event(), threading.Event()

    def caller() -> None:
        try:
            while not finished.is_set():
                limiter.acquire()
                stamps.append(time.time())
                if len(stamps) >= 6000:
                    burst_spent.set()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    before_us = server_micros(db)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        threads = [threading.Thread(target=caller) for _ in range(64)]
        for thread in threads:
            thread.start()
        assert burst_spent.wait(60)
        time.sleep(STEPS_WATCHED)
        until = time.time()
        finished.set()  # each thread ends after the reservation it holds is granted
        for thread in threads:
            thread.join()
    assert errors == []

    origin_us = bucket_origin(db, limiter.key, before_us)
    assert_grants_follow_the_bucket(stamps, origin_us / 1e6, 6000, 100, until)
    assert_every_permit_is_accounted_for(db, limiter.key, origin_us, 6000, 100, len(stamps))
    assert ours(caplog) == []
    limiter.close()


async def test_a_given_client_with_a_small_pool_queues_callers_instead_of_bypassing_the_limit(
    redis_url: str, db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # A plain (non-blocking) pool of 2 connections, bounded so no construction warning.
    client = redis.Redis.from_url(
        redis_url,
        max_connections=2,
        socket_timeout=1.0,
        socket_connect_timeout=1.0,
        retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
    )
    limiter = RedisTokenBucketRateLimiter(6000, name="small-pool", client=client)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        in_threads = await asyncio.gather(*(asyncio.to_thread(limiter.acquire) for _ in range(32)))
        in_tasks = await asyncio.gather(*(limiter.aacquire() for _ in range(500)))
    assert in_threads + in_tasks == [True] * 532
    # Every one of them took its permit from Redis (no refill lands in 6000's full bucket).
    assert int(db.hget(limiter.key, "r")) == 6000 - 532
    assert ours(caplog) == []
    await limiter.aclose()
    client.close()


def test_a_given_client_that_can_outlast_operation_timeout_is_named_in_a_warning(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    parts = urlsplit(redis_url)
    host, port, number = parts.hostname, parts.port, int(parts.path.strip("/") or 0)
    loose = redis.Redis(host=host, port=port, db=number, socket_timeout=5)
    bounded = redis.Redis(
        host=host,
        port=port,
        db=number,
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
        retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
    )
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        RedisTokenBucketRateLimiter(60, name="loose", client=loose)
        RedisTokenBucketRateLimiter(60, name="bounded", client=bounded)
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "'loose'" in message
    assert "socket_timeout=5" in message
    assert "operation_timeout" in message
    loose.close()
    bounded.close()


# -- a silent or resetting Redis -------------------------------------------------------------


def timed_sync_call(limiter: RedisTokenBucketRateLimiter) -> tuple[object, float]:
    started = time.monotonic()
    try:
        result: object = limiter.acquire()
    except RateLimitBackendError as exc:
        result = exc
    return result, time.monotonic() - started


async def timed_async_call(limiter: RedisTokenBucketRateLimiter) -> tuple[object, float]:
    started = time.monotonic()
    try:
        result: object = await limiter.aacquire()
    except RateLimitBackendError as exc:
        result = exc
    return result, time.monotonic() - started


def crowd_in_a_fault(
    limiter: RedisTokenBucketRateLimiter, proxy: FaultProxy, fault: str, path: str
) -> list[tuple[object, float]]:
    """One healthy call (connections open), then the fault, then a crowd of callers:
    64 threads, or 300 tasks on one event loop. Each caller's result and delay."""
    if path == "sync":
        assert limiter.acquire() is True
        proxy.mode = fault  # type: ignore[assignment]
        results: list[tuple[object, float]] = []
        threads = [
            threading.Thread(target=lambda: results.append(timed_sync_call(limiter)))
            for _ in range(64)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results

    async def scenario() -> list[tuple[object, float]]:
        assert await limiter.aacquire() is True
        proxy.mode = fault  # type: ignore[assignment]
        crowd = await asyncio.gather(*(timed_async_call(limiter) for _ in range(300)))
        await limiter.aclose()
        return list(crowd)

    return asyncio.run(scenario())


@pytest.mark.parametrize("path", ["sync", "async"])
@pytest.mark.parametrize("mode", ["fail_open", "fail_closed"])
@pytest.mark.parametrize("fault", ["silent", "reset"])
def test_a_faulty_redis_delays_an_acquire_at_most_two_operation_timeouts_then_enforcement_resumes(
    redis_url: str,
    db: Any,
    proxy: FaultProxy,
    caplog: pytest.LogCaptureFixture,
    fault: str,
    mode: str,
    path: str,
) -> None:
    limiter = RedisTokenBucketRateLimiter(
        60,
        name=f"{fault}-{mode}-{path}",
        redis_url=through(proxy, redis_url),
        on_backend_error=mode,  # type: ignore[arg-type]
        operation_timeout=TIMEOUT,
        outage_cooldown=COOLDOWN,
    )
    with caplog.at_level(logging.INFO, logger=LOGGER):
        started = time.monotonic()  # the healthy call's permit is taken just after
        crowd = crowd_in_a_fault(limiter, proxy, fault, path)
        worst = max(delay for _, delay in crowd)
        assert worst <= BOUND + SLACK, f"worst delay {worst:.3f}s"
        if mode == "fail_open":
            assert [result for result, _ in crowd] == [True] * len(crowd)
        else:
            assert all(isinstance(result, RateLimitBackendError) for result, _ in crowd)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1  # one per outage, not one per call
        assert mode in warnings[0].getMessage()

        proxy.mode = "forward"
        time.sleep(COOLDOWN)
        # Enforcing again: the bucket runs dry and refuses. Requests the silent proxy
        # held may reach Redis now and take a permit each, so at most 59 are left, plus
        # one for each second since the healthy call (60 a minute refill one a second;
        # a loaded machine takes over a second to get here).
        granted = 0
        while limiter.acquire(blocking=False):
            granted += 1
        refilled = int(time.monotonic() - started)
        assert 1 <= granted <= 59 + refilled
        assert limiter.acquire(blocking=False) is False
    assert caplog.records[-1].levelno == logging.INFO  # "Redis answers again"
    assert "answers again" in caplog.records[-1].getMessage()
    limiter.close()


def test_a_longer_socket_timeout_in_the_url_does_not_lift_the_bound(
    redis_url: str, db: Any, proxy: FaultProxy
) -> None:
    url = through(proxy, redis_url, "socket_timeout=30&socket_connect_timeout=30")
    limiter = RedisTokenBucketRateLimiter(60, name="url", redis_url=url, operation_timeout=TIMEOUT)
    assert limiter.acquire() is True
    proxy.mode = "silent"
    result, delay = timed_sync_call(limiter)
    assert result is True
    assert delay <= BOUND + SLACK
    limiter.close()


# -- cancellation ------------------------------------------------------------------------


async def test_a_call_cancelled_with_its_round_trip_in_flight_gives_back_the_permit_redis_granted(
    redis_url: str, db: Any, proxy: FaultProxy
) -> None:
    # One connection, so a leaked one would block the next call; a 2 s operation_timeout
    # leaves time to let the held request through.
    limiter = RedisTokenBucketRateLimiter(
        60,
        name="in-flight",
        redis_url=through(proxy, redis_url, "max_connections=1"),
        operation_timeout=2.0,
    )
    assert await limiter.aacquire() is True  # this loop's connection is open; 59 left
    proxy.mode = "silent"
    call = asyncio.create_task(limiter.aacquire())
    await asyncio.sleep(0.1)  # its script is sent and held by the proxy
    call.cancel()
    await asyncio.sleep(0.05)
    assert not call.done()  # it waits for the answer to the round trip it started
    proxy.mode = "forward"  # Redis runs the script: a grant nobody will use
    with pytest.raises(asyncio.CancelledError):
        await call
    assert db.hget(limiter.key, "r") == b"59"  # given back
    assert asyncio.all_tasks() == {asyncio.current_task()}
    # The only connection is back in the pool: the next call gets it.
    assert await asyncio.wait_for(limiter.aacquire(), 1.0) is True
    assert db.hget(limiter.key, "r") == b"58"
    await limiter.aclose()
    limiter.close()


async def test_a_call_cancelled_while_queued_for_a_connection_leaves_at_once_holding_nothing(
    redis_url: str, db: Any, proxy: FaultProxy
) -> None:
    limiter = RedisTokenBucketRateLimiter(
        60,
        name="queued",
        redis_url=through(proxy, redis_url, "max_connections=1"),
        operation_timeout=2.0,
    )
    assert await limiter.aacquire() is True  # 59 left
    proxy.mode = "silent"
    first = asyncio.create_task(limiter.aacquire())  # holds the only connection
    queued = asyncio.create_task(limiter.aacquire())  # waits for it
    await asyncio.sleep(0.1)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert not first.done()  # the queued call did not wait for the silent round trip
    proxy.mode = "forward"
    assert await first is True
    assert db.hget(limiter.key, "r") == b"58"  # the first call's permit; none for the other
    assert asyncio.all_tasks() == {asyncio.current_task()}
    await limiter.aclose()
    limiter.close()


# -- options ----------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["operation_timeout", "outage_cooldown"])
@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (0, ValueError, "greater than 0 seconds"),
        (-1.5, ValueError, "greater than 0 seconds"),
        (float("nan"), ValueError, "greater than 0 seconds"),
        (timedelta(days=366), ValueError, "at most"),
        (1e10, ValueError, "at most"),
        ("1", OptionTypeError, "a number of seconds"),
        (None, OptionTypeError, "a number of seconds"),
    ],
)
def test_durations_are_checked_at_construction_naming_the_option(
    option: str, value: object, error: type[Exception], words: str
) -> None:
    options: dict[str, Any] = {option: value}
    with pytest.raises(error, match=f"{option} must be .*{words}"):
        RedisTokenBucketRateLimiter(60, name="checked", **options)


@pytest.mark.parametrize(
    ("option", "longest"),
    [("operation_timeout", timedelta(days=1)), ("outage_cooldown", timedelta(days=365))],
)
def test_durations_are_bounded_to_a_day_for_the_round_trip_and_a_year_for_the_cooldown(
    option: str, longest: timedelta
) -> None:
    options: dict[str, Any] = {option: longest}
    assert getattr(RedisTokenBucketRateLimiter(60, name="longest", **options), option) == (
        longest.total_seconds()
    )
    options = {option: longest + timedelta(seconds=1)}
    days = f"{longest.days} day" + ("" if longest.days == 1 else "s")
    with pytest.raises(ValueError, match=rf"{option} must be at most .* \({days}\)"):
        RedisTokenBucketRateLimiter(60, name="too-long", **options)


def test_durations_take_seconds_or_a_timedelta() -> None:
    limiter = RedisTokenBucketRateLimiter(
        60, name="durations", operation_timeout=timedelta(milliseconds=250), outage_cooldown=5
    )
    assert (limiter.operation_timeout, limiter.outage_cooldown) == (0.25, 5.0)
    default = RedisTokenBucketRateLimiter(60, name="defaults")
    assert (default.operation_timeout, default.outage_cooldown) == (1.0, 1.0)
