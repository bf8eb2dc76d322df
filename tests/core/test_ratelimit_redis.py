"""The shared Redis token bucket (SPEC section 3) against a real Redis.

Every test runs on database 15 of the Redis at 127.0.0.1:6379 (the ``redis_url`` fixture
of the repo-root conftest: skipped locally without it, failing under ``CI=true``), flushed
before and after. The bucket refills by the Redis server's clock in 1-second steps, so
tests that watch a refill wait for at most one real step; the rate test runs four worker
processes for about 13 s. Outages use a port with nothing listening, or a private
``redis-server`` the test starts and stops. Load beyond the connection pool, a silent or
resetting Redis, and cancellation mid round trip are in ``test_ratelimit_redis_faults.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from llm_resilience import telemetry
from llm_resilience.errors import (
    RateLimitBackendError,
    RateLimitQueueFullError,
    RequestExceedsCapacityError,
)
from llm_resilience.ratelimit import (
    RateLimiter,
    RedisTokenBucketRateLimiter,
    TokenBucketRateLimiter,
)
from llm_resilience.transient import is_transient

redis = pytest.importorskip("redis")

pytestmark = pytest.mark.redis

KEYWORDS = ("rate limit", "throttl", "timeout", "unavailable")
LOGGER = "llm_resilience.ratelimit"


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
def make(redis_url: str, db: Any) -> Iterator[Callable[..., RedisTokenBucketRateLimiter]]:
    """Build limiters on the test database (name ``bucket`` unless given); closes them."""
    made: list[RedisTokenBucketRateLimiter] = []

    def build(*args: Any, **options: Any) -> RedisTokenBucketRateLimiter:
        options.setdefault("name", "bucket")
        if "client" not in options:
            options.setdefault("redis_url", redis_url)
        limiter = RedisTokenBucketRateLimiter(*args, **options)
        made.append(limiter)
        return limiter

    yield build
    for limiter in made:
        limiter.close()


@pytest.fixture
def outcomes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, float]]:
    """Every (surface, outcome, ms) the limiters record on the wait histogram."""
    seen: list[tuple[str, str, float]] = []

    def record(milliseconds: float, *, surface: str, outcome: str) -> None:
        seen.append((surface, outcome, milliseconds))

    monkeypatch.setattr(telemetry, "record_rate_limit_wait", record)
    return seen


@pytest.fixture
def dead_url() -> str:
    """A Redis URL on a loopback port with nothing listening (connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


class CountingRedis(redis.Redis):  # type: ignore[misc]
    """A redis.Redis that counts the scripts it sends (EVALSHA and EVAL)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scripts: list[str] = []

    def evalsha(self, *args: Any) -> Any:
        self.scripts.append("EVALSHA")
        return super().evalsha(*args)

    def eval(self, *args: Any) -> Any:
        self.scripts.append("EVAL")
        return super().eval(*args)


def drain(limiter: RedisTokenBucketRateLimiter) -> int:
    """Take every permit free now; how many there were."""
    taken = 0
    while limiter.acquire(blocking=False):
        taken += 1
    return taken


# -- the derivation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rpm", "tpm"), [(1, None), (30, None), (59, 1), (60, 59), (90, 1000), (600, None), (6000, 90)]
)
def test_the_derivation_is_the_in_process_limiters(rpm: int, tpm: int | None) -> None:
    shared = RedisTokenBucketRateLimiter(rpm, 3, tpm, name="derivation")
    local = TokenBucketRateLimiter(rpm, 3, tpm)
    fields = (
        "requests_per_minute",
        "max_queued_requests",
        "tokens_per_minute",
        "period",
        "permits_per_period",
        "capacity",
        "token_capacity",
        "tokens_per_period",
        "queued",
    )
    assert {f: getattr(shared, f) for f in fields} == {f: getattr(local, f) for f in fields}
    assert shared.permits_per_period == max(1, rpm // 60)
    assert (shared.period, shared.capacity) == (1.0, rpm)
    assert isinstance(shared, RateLimiter)


def test_a_full_bucket_grants_its_capacity_at_once_then_refuses(make: Any, outcomes: Any) -> None:
    limiter = make(120)
    assert drain(limiter) == 120
    assert limiter.acquire(blocking=False) is False
    assert [o for _, o, _ in outcomes] == ["granted"] * 120 + ["rejected"] * 2


def test_budgets_under_60_floor_to_one_permit_a_second_and_others_to_whole_permits(
    make: Any,
) -> None:
    under, odd = make(30, name="under"), make(150, name="odd")
    assert (under.capacity, under.permits_per_period) == (30, 1)
    assert (odd.capacity, odd.permits_per_period) == (150, 2)
    assert (drain(under), drain(odd)) == (30, 150)


def test_an_empty_bucket_grants_its_next_permits_at_the_next_step_in_one_round_trip(
    redis_url: str, db: Any, make: Any
) -> None:
    client = CountingRedis.from_url(redis_url)
    make(60, client=client, name="warm-up").acquire()  # Redis now holds the script
    client.scripts.clear()
    limiter = make(120, client=client)  # 2 permits per step
    created = time.monotonic()
    assert drain(limiter) == 120

    limiter.acquire()  # due when the first step after the bucket's creation lands
    waited = time.monotonic() - created
    assert 0.9 < waited < 1.25
    scripts_before = len(client.scripts)
    assert limiter.acquire(blocking=False) is True  # the step's second permit
    assert limiter.acquire(blocking=False) is False
    # One script call per decision: the drain's 121, the waiter's 1 (it slept, never
    # polled), then 2 more.
    assert scripts_before == 121 + 1
    assert len(client.scripts) == 124
    client.close()


# -- sharing ----------------------------------------------------------------------------

_WORKER = """
import json, sys, time
from llm_resilience.ratelimit import RedisTokenBucketRateLimiter
url, name, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
limiter = RedisTokenBucketRateLimiter(600, name=name, redis_url=url)
print("ready", flush=True)
start = float(sys.stdin.readline())
time.sleep(max(0.0, start - time.time()))
stamps = []
while time.time() < start + seconds:
    limiter.acquire()
    stamps.append(time.time())
limiter.close()
print(json.dumps(stamps), flush=True)
"""


def test_four_processes_sharing_a_600_rpm_bucket_are_admitted_at_10_a_second(
    redis_url: str, db: Any
) -> None:
    # Fresh interpreters (as multiprocessing's spawn makes), started as scripts so that
    # nothing depends on how pytest imported this module. Redis and the workers share
    # this host's clock, so wall-clock stamps line up with the bucket's refill steps.
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, redis_url, "shared", "6.7"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        start = f"{time.time() + 0.2}\n"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(start)
            worker.stdin.flush()
        per_worker = [json.loads(worker.communicate(timeout=30)[0]) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    stamps = sorted(stamp for worker_stamps in per_worker for stamp in worker_stamps)
    created = stamps[0]  # the bucket's refill steps land at created + 1, + 2, ...
    burst_end = stamps[599]
    assert burst_end < created + 0.9  # the full bucket's 600 permits came before any refill

    # Permits arrive in batches of 10 at each step, so a window edge sitting on a step
    # would count a batch or not by chance: windows start half-way between steps. Four
    # steps a window: 40 permits, give or take 2 (a rate of 11 a second, or a bucket per
    # process, would count 44 or 160).
    starts = [created + k + 0.5 for k in range(3) if created + k + 0.5 > burst_end]
    counts = [sum(1 for s in stamps if start <= s < start + 4) for start in starts]
    assert len(counts) >= 2
    assert all(38 <= count <= 42 for count in counts), counts
    after_burst = [sum(1 for s in worker if s > burst_end) for worker in per_worker]
    assert min(after_burst) >= 0.1 * sum(after_burst), after_burst  # nobody is starved


def test_buckets_with_different_names_or_prefixes_are_independent(make: Any, db: Any) -> None:
    first, second = make(2, name="first"), make(2, name="second")
    other_prefix = make(2, name="first", key_prefix="tenant-b:")
    assert drain(first) == 2
    assert (drain(second), drain(other_prefix)) == (2, 2)
    assert sorted(db.keys()) == [
        b"llm-resilience:ratelimit:first",
        b"llm-resilience:ratelimit:second",
        b"tenant-b:first",
    ]
    assert first.key == "llm-resilience:ratelimit:first"


def test_a_bucket_key_expires_exactly_when_the_bucket_would_be_full_again(
    make: Any, db: Any
) -> None:
    limiter = make(60)  # 1 permit per step: n taken permits are back after n steps
    limiter.acquire()
    assert 0 < db.pttl(limiter.key) <= 1000
    drain(limiter)
    assert 59_000 < db.pttl(limiter.key) <= 60_000
    weighed = make(6000, tokens_per_minute=600, name="weighed")  # 10 tokens per step
    weighed.acquire(num_tokens=600)
    assert 59_000 < db.pttl(weighed.key) <= 60_000  # the token field takes longest


def test_a_give_back_to_a_full_bucket_leaves_no_key_behind(make: Any, db: Any) -> None:
    limiter = make(60, tokens_per_minute=600)
    limiter.reconcile(100, 0)  # a missing key is a full bucket, and stays missing
    assert db.exists(limiter.key) == 0


# -- waiting, order and the local queue --------------------------------------------------


async def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 2.0
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.005)


async def test_a_cancelled_waiter_leaves_the_queue_and_gives_its_permit_back(
    make: Any, db: Any, outcomes: Any
) -> None:
    limiter = make(60, max_queued_requests=1)
    created = time.monotonic()
    drain(limiter)
    waiter = asyncio.create_task(limiter.aacquire())
    await _until(lambda: limiter.queued == 1)

    started = time.monotonic()
    with pytest.raises(RateLimitQueueFullError) as refused:
        await limiter.aacquire()
    assert time.monotonic() - started < 0.1
    assert not is_transient(refused.value)

    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert limiter.queued == 0
    assert db.hget(limiter.key, "r") == b"0"  # the reservation (-1) was undone
    # Had the cancelled reservation been kept, the next caller would be due a step later.
    assert await limiter.aacquire() is True
    assert time.monotonic() - created < 1.4
    assert [o for _, o, _ in outcomes[-3:]] == ["rejected", "cancelled", "granted"]
    await limiter.aclose()


async def test_waiters_are_served_in_arrival_order_across_limiters_of_one_bucket(
    make: Any,
) -> None:
    # Two limiters on one bucket stand for two processes; 60 rpm grants one per step.
    one, two = make(60), make(60)
    drain(one)
    finished: list[str] = []

    async def take(limiter: RedisTokenBucketRateLimiter, label: str) -> None:
        await limiter.aacquire()
        finished.append(label)

    first = asyncio.create_task(take(two, "first"))
    await _until(lambda: two.queued == 1)
    second = asyncio.create_task(take(one, "second"))
    await _until(lambda: one.queued == 1)
    await first
    assert finished == ["first"]
    assert not second.done()  # due one step later
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    await one.aclose()
    await two.aclose()


def test_blocking_false_answers_at_once_without_reserving(make: Any, db: Any) -> None:
    limiter = make(60)
    drain(limiter)
    started = time.monotonic()
    assert limiter.acquire(blocking=False) is False
    assert time.monotonic() - started < 0.05
    assert db.hget(limiter.key, "r") == b"0"


def test_a_queue_bound_never_refuses_a_caller_a_free_permit_would_serve(make: Any) -> None:
    limiter = make(600, max_queued_requests=1)
    results: list[bool] = []
    errors: list[BaseException] = []

    def take() -> None:
        try:
            for _ in range(20):
                results.append(limiter.acquire())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert results == [True] * 160


async def test_sync_and_async_callers_share_the_bucket_and_with_takes_one_permit(
    make: Any,
) -> None:
    limiter = make(4)
    with limiter:
        pass
    async with limiter:
        pass
    await limiter.async_acquire()
    assert limiter.acquire() is True
    assert await limiter.aacquire(blocking=False) is False
    assert limiter.acquire(blocking=False) is False
    await limiter.aclose()


def test_the_async_methods_work_from_successive_event_loops_and_threads(make: Any) -> None:
    # redis.asyncio connections belong to one loop: each loop gets its own client, closed
    # when asyncio.run shuts that loop down.
    limiter = make(600)
    assert asyncio.run(limiter.aacquire()) is True
    assert asyncio.run(limiter.aacquire()) is True
    in_thread: list[bool] = []
    thread = threading.Thread(target=lambda: in_thread.append(asyncio.run(limiter.aacquire())))
    thread.start()
    thread.join()
    assert in_thread == [True]
    assert drain(limiter) == 597


async def test_a_given_client_serves_the_sync_and_async_paths(redis_url: str, make: Any) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=2.0)
    limiter = make(2, client=client)
    assert limiter.acquire() is True
    assert await limiter.aacquire() is True
    assert await limiter.aacquire(blocking=False) is False
    await limiter.aclose()
    limiter.close()
    assert client.ping() is True  # closing the limiter leaves your client alone
    client.close()


# -- tokens -----------------------------------------------------------------------------


def test_reconcile_gives_unused_tokens_back_and_charges_extra_usage_into_debt(
    make: Any,
) -> None:
    # 16 tokens per step may land mid-test; every threshold below has room for it.
    limiter = make(6000, tokens_per_minute=1000)
    assert limiter.acquire(num_tokens=900) is True
    assert limiter.acquire(num_tokens=200, blocking=False) is False
    limiter.reconcile(900, 500)  # 400 back
    assert limiter.acquire(num_tokens=450, blocking=False) is True
    limiter.reconcile(0, 2000)  # 2000 charged: deep in debt
    assert limiter.acquire(num_tokens=1, blocking=False) is False
    limiter.reconcile(10_000, 0)  # a give-back stops at the capacity
    assert limiter.acquire(num_tokens=1000, blocking=False) is True
    assert limiter.acquire(num_tokens=1, blocking=False) is False


def test_a_call_heavier_than_the_token_budget_fails_at_once_naming_both_numbers(
    make: Any, outcomes: Any
) -> None:
    limiter = make(60, tokens_per_minute=4000)
    with pytest.raises(RequestExceedsCapacityError) as raised:
        limiter.acquire(num_tokens=5000)
    message = str(raised.value)
    assert "5000" in message
    assert "4000" in message
    assert not is_transient(raised.value)
    assert outcomes[-1][1] == "rejected"
    assert limiter.acquire(num_tokens=4000, blocking=False) is True  # all it holds


def test_without_a_token_budget_the_weight_is_ignored(make: Any, db: Any) -> None:
    limiter = make(2)
    assert limiter.acquire(num_tokens=10**9) is True
    limiter.reconcile(10, 10**6)
    assert db.hkeys(limiter.key) == [b"r", b"ts"]


# -- a failing backend -------------------------------------------------------------------


#: No quiet second after a failure: each call really tries Redis (and fails).
EVERY_CALL_TRIES_REDIS = 1e-6


async def test_fail_open_grants_every_call_and_warns_once_per_outage(
    dead_url: str, outcomes: Any, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = RedisTokenBucketRateLimiter(
        1, name="open", redis_url=dead_url, outage_cooldown=EVERY_CALL_TRIES_REDIS
    )
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert [limiter.acquire() for _ in range(3)] == [True] * 3
        assert await limiter.aacquire() is True
        assert limiter.acquire(blocking=False) is True
        limiter.reconcile(5, 1)  # dropped, never raises
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].name == LOGGER
    assert "'open'" in warnings[0].getMessage()
    assert "fail_open" in warnings[0].getMessage()
    assert [o for _, o, _ in outcomes] == ["faulted"] * 5
    await limiter.aclose()


async def test_fail_closed_refuses_with_a_non_transient_error_and_warns_once(
    dead_url: str, outcomes: Any, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = RedisTokenBucketRateLimiter(
        60,
        name="closed",
        redis_url=dead_url,
        on_backend_error="fail_closed",
        outage_cooldown=EVERY_CALL_TRIES_REDIS,
    )
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(3):
            with pytest.raises(RateLimitBackendError) as refused:
                limiter.acquire(blocking=False)
        with pytest.raises(RateLimitBackendError):
            await limiter.aacquire()
    error = refused.value
    assert error.limiter_name == "closed"
    assert isinstance(error.__cause__, redis.ConnectionError)
    assert not is_transient(error)  # though its cause, a refused connection, is
    assert not any(word in str(error).lower() for word in KEYWORDS)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert [o for _, o, _ in outcomes] == ["faulted"] * 4
    await limiter.aclose()


def test_after_a_failure_calls_skip_redis_for_a_second(dead_url: str) -> None:
    client = CountingRedis.from_url(dead_url)
    limiter = RedisTokenBucketRateLimiter(60, name="quiet", client=client)
    assert [limiter.acquire() for _ in range(50)] == [True] * 50
    assert client.scripts == ["EVALSHA"]
    client.close()


def test_construction_never_connects(dead_url: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        limiter = RedisTokenBucketRateLimiter(60, name="lazy", redis_url=dead_url)
        assert limiter.queued == 0
    assert [r for r in caplog.records if r.name.startswith("llm_resilience")] == []


class PrivateRedis:
    """A throwaway redis-server on a free loopback port, to stop and start at will."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.server: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.server = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 5
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.02)

    def stop(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait()
            self.server = None


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(binary)
    try:
        yield server
    finally:
        server.stop()


def test_a_new_outage_warns_again_once_redis_has_answered_in_between(
    private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    private_redis.start()
    limiter = RedisTokenBucketRateLimiter(
        600, name="flaky", redis_url=private_redis.url, outage_cooldown=EVERY_CALL_TRIES_REDIS
    )
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert limiter.acquire() is True
        for _ in range(2):  # down, back, down, back
            private_redis.stop()
            assert [limiter.acquire() for _ in range(3)] == [True] * 3
            private_redis.start()
            assert limiter.acquire() is True
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO", "WARNING", "INFO"]
    limiter.close()


def test_the_script_is_sent_again_after_redis_forgets_it(
    redis_url: str, db: Any, make: Any
) -> None:
    client = CountingRedis.from_url(redis_url)
    limiter = make(60, client=client)
    db.script_flush()
    assert limiter.acquire() is True
    assert limiter.acquire() is True
    db.script_flush()
    assert limiter.acquire() is True
    assert limiter.acquire() is True
    sent = ["EVALSHA", "EVAL", "EVALSHA"]  # refused by sha, sent whole, then cached
    assert client.scripts == sent + sent
    assert db.hget(limiter.key, "r") == b"56"
    client.close()


# -- options ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"requests_per_minute": 0}, ValueError, "requests_per_minute must be an integer >= 1"),
        ({"requests_per_minute": True}, TypeError, "requests_per_minute must be an integer"),
        ({"requests_per_minute": 1.5}, TypeError, "requests_per_minute must be an integer"),
        ({"max_queued_requests": 0}, ValueError, "max_queued_requests must be an integer >= 1"),
        ({"tokens_per_minute": -1}, ValueError, "tokens_per_minute must be an integer >= 1"),
        ({"name": ""}, ValueError, "name must be a non-empty string"),
        ({"name": 7}, TypeError, "name must be a non-empty string"),
        ({"on_backend_error": "open"}, ValueError, "'fail_open' or 'fail_closed'"),
        ({"key_prefix": None}, TypeError, "key_prefix must be a string"),
        ({"redis_url": "http://127.0.0.1:6379"}, ValueError, "redis://"),
        ({"client": object()}, TypeError, "client must be a redis.Redis"),
    ],
)
def test_options_are_checked_at_construction_naming_the_option(
    options: dict[str, Any], error: type[Exception], words: str
) -> None:
    arguments: dict[str, Any] = {"requests_per_minute": 60, "name": "checked", **options}
    with pytest.raises(error, match=words.replace("(", r"\(")):
        RedisTokenBucketRateLimiter(**arguments)


def test_a_url_and_a_client_together_are_refused(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    with pytest.raises(ValueError, match="redis_url or client"):
        RedisTokenBucketRateLimiter(60, name="both", redis_url="redis://h:1/0", client=client)


def test_num_tokens_must_be_a_whole_number_of_at_least_zero(make: Any) -> None:
    limiter = make(60, tokens_per_minute=100)
    with pytest.raises(ValueError, match="num_tokens"):
        limiter.acquire(num_tokens=-1)
    with pytest.raises(TypeError, match="num_tokens"):
        limiter.acquire(num_tokens=True)


def test_importing_the_redis_limiter_module_does_not_import_redis() -> None:
    code = (
        "import sys, llm_resilience, llm_resilience.ratelimit, llm_resilience.ratelimit._redis; "
        "llm_resilience.ratelimit.RedisTokenBucketRateLimiter; print('redis' in sys.modules)"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert result.stdout.strip() == "False"
