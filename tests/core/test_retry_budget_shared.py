"""The retry budget shared through Redis (``RetryBudget(shared=RedisRetryBudgetStore(...))``).

Against the real Redis at 127.0.0.1:6379 (the ``redis_url`` fixture: skipped locally
without it, failing under ``CI=true``), each test in a namespace of its own. Budgets in one
process stand for workers (only the store joins them); one test runs worker processes.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from llm_resilience import FallbackChain, RedisRetryBudgetStore, RetryBudget, RetryPolicy
from llm_resilience.testing import FaultProxy

redis = pytest.importorskip("redis")

pytestmark = pytest.mark.redis

LOGGER = "llm_resilience.retry"


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    """A namespace of this test's own, deleted afterwards."""
    name = f"test-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{{{name}}}:*"):
        client.delete(key)
    client.close()


@pytest.fixture
def store(redis_url: str, namespace: str) -> Iterator[RedisRetryBudgetStore]:
    made = RedisRetryBudgetStore(redis_url, namespace=namespace)
    yield made
    made.close()


def worker(store: RedisRetryBudgetStore, **options: Any) -> RetryBudget:
    options.setdefault("ratio", 0.5)
    options.setdefault("min_per_second", 0)
    return RetryBudget(shared=store, **options)


def test_two_budgets_on_one_store_see_each_others_calls(store: RedisRetryBudgetStore) -> None:
    first, second = worker(store), worker(store)
    for _ in range(4):
        first.call_started()  # only the first worker has traffic
    # The second worker made no call, yet the fleet's 4 calls allow it 2 retries.
    assert [second.try_retry() for _ in range(3)] == [True, True, False]
    assert first.try_retry() is False  # and the first sees them spent
    assert second.counts().calls == 4
    assert second.counts().retries == 2


def test_the_ratio_applies_to_the_fleets_calls_not_each_workers(
    store: RedisRetryBudgetStore,
) -> None:
    fleet = [worker(store, ratio=0.2) for _ in range(4)]
    for budget in fleet:
        for _ in range(5):
            budget.call_started()  # 20 calls in all: 4 retries for the fleet
    granted = [budget.try_retry() for _ in range(3) for budget in fleet]
    assert sum(granted) == 4  # not 4 per worker (each local budget alone would allow 1)
    assert fleet[0].counts().allowed == pytest.approx(4.0)


def test_the_floor_is_the_fleets_once_not_per_worker(store: RedisRetryBudgetStore) -> None:
    fleet = [worker(store, ratio=0, min_per_second=0.05, window=60) for _ in range(3)]
    granted = [budget.try_retry() for budget in fleet for _ in range(3)]
    assert sum(granted) == 3  # 0.05 * 60: three for the whole fleet


def test_a_granted_retry_is_counted_in_the_local_budget_too(
    store: RedisRetryBudgetStore,
) -> None:
    budget = worker(store, ratio=1)
    budget.call_started()
    assert budget.try_retry() is True
    local = RetryBudget(ratio=1, min_per_second=0)
    assert budget._sums() == (1, 1)  # what decides if Redis goes away
    assert local.counts().calls == 0


def test_the_fleets_counts_leave_its_sliding_window(store: RedisRetryBudgetStore) -> None:
    budget = worker(store, ratio=1, window=0.2)
    budget.call_started()
    assert budget.try_retry() is True
    time.sleep(0.25)  # on Redis's clock: the call and the retry left the window
    assert budget.counts().calls == 0
    assert budget.try_retry() is False


async def test_async_layers_await_the_fleets_decisions(store: RedisRetryBudgetStore) -> None:
    first, second = worker(store), worker(store)
    for _ in range(2):
        await first.acall_started()
    assert await second.atry_retry() is True
    assert await second.atry_retry() is False
    assert first.counts().retries == 1


async def test_an_async_retry_policy_draws_from_the_fleets_budget(
    store: RedisRetryBudgetStore,
) -> None:
    other = worker(store)
    for _ in range(2):
        other.call_started()  # another worker's traffic: one retry for the fleet with ours
    waits: list[float] = []

    async def asleep(seconds: float) -> None:
        waits.append(seconds)

    policy = RetryPolicy(attempts=5, base_delay=1, jitter=0, asleep=asleep, budget=worker(store))
    tries = 0

    async def flaky() -> str:
        nonlocal tries
        tries += 1
        raise ConnectionError("reset")

    with pytest.raises(ConnectionError):
        await policy.acall(flaky)
    # 3 calls in the fleet allow 1.5 retries: one granted, the next refused at once.
    assert tries == 2
    assert waits == [1.0]


class CountingRedis(redis.Redis):  # type: ignore[misc]
    """A client that counts the commands it sends."""

    sent: list[str]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(str(args[0]))
        return super().execute_command(*args, **options)


def test_a_chain_on_a_shared_budget_costs_one_round_trip_per_call_and_per_retry(
    redis_url: str, namespace: str
) -> None:
    client = CountingRedis.from_url(redis_url, socket_timeout=0.1, socket_connect_timeout=0.1)
    client.sent = []
    store = RedisRetryBudgetStore(client, namespace=namespace)
    store.read(60, 10)  # the script is loaded (a first EVALSHA may need an EVAL)
    client.sent = []
    chain = FallbackChain(["a", "b"], retry_budget=worker(store, ratio=1))
    assert chain.invoke(lambda index, member: member) == "a"
    assert len(client.sent) == 1  # the call counted: one script
    assert store.retry(60, 10, 1.0, 0.0) is True
    assert client.sent[0] in {"EVALSHA", "EVAL"}
    assert len(client.sent) == 2  # a retry decided: one more
    client.close()


def test_bad_store_options_are_refused_at_construction(redis_url: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        RedisRetryBudgetStore(redis_url, namespace="a}b")
    with pytest.raises(ValueError, match="operation_timeout"):
        RedisRetryBudgetStore(redis_url, operation_timeout=-1)
    with pytest.raises(TypeError, match="url_or_client"):
        RedisRetryBudgetStore(42)
    with pytest.raises(TypeError, match="outage_cooldow"):
        RedisRetryBudgetStore(redis_url, outage_cooldow=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="shared"):
        RetryBudget(shared="redis://127.0.0.1:6379")  # type: ignore[arg-type]


def test_the_store_shows_no_credentials(namespace: str) -> None:
    store = RedisRetryBudgetStore("redis://user:s3cret@127.0.0.1:6379/15", namespace=namespace)
    budget = RetryBudget(shared=store)
    assert "s3cret" not in repr(store) + repr(budget)
    assert "shared=RedisRetryBudgetStore('redis://127.0.0.1:6379/15'" in repr(budget)


# -- Redis away ----------------------------------------------------------------------------


def test_a_dead_redis_leaves_the_local_budget_in_charge_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = RedisRetryBudgetStore(
        "redis://127.0.0.1:1/0", namespace="nowhere", outage_cooldown=0.001
    )
    budget = RetryBudget(ratio=0.5, min_per_second=0, shared=store)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(4):
            budget.call_started()  # every decision tries Redis, and still warns once
        assert [budget.try_retry() for _ in range(3)] == [True, True, False]
    warnings = [r for r in caplog.records if "Shared retry budget" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert "ConnectionError" in warnings[0].getMessage()
    assert store.available is False


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_silent_redis_bounds_each_decision_by_operation_timeout_then_rejoins(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture, asynchronous: bool
) -> None:
    with FaultProxy(("127.0.0.1", 6379)) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/{redis_url.rsplit('/', 1)[1]}"
        # A bound of 0.2 s: the rejoining round trip opens a new connection through the
        # proxy, which a loaded machine (two suite workers) took past 0.05 s once.
        store = RedisRetryBudgetStore(
            url, namespace=namespace, operation_timeout=0.2, outage_cooldown=0.05
        )
        other = worker(RedisRetryBudgetStore(redis_url, namespace=namespace))
        budget = worker(store)
        budget.call_started()
        budget.call_started()  # local and fleet: 2 calls, 1 retry allowed
        for _ in range(4):
            other.call_started()  # the fleet: 6 calls, 3 retries allowed
        proxy.mode = "silent"
        with caplog.at_level(logging.INFO, logger=LOGGER):
            started = time.monotonic()
            if asynchronous:
                granted = [await budget.atry_retry() for _ in range(2)]
            else:
                granted = [budget.try_retry() for _ in range(2)]
            # The first decision waited one operation_timeout; the second skipped Redis.
            assert time.monotonic() - started < 0.2 + 0.1
            assert granted == [True, False]  # the local counts decided: 2 calls, 1 retry
            proxy.mode = "forward"
            await asyncio.sleep(0.06)
            # Rejoined: the fleet's 6 calls allow 3, none taken there yet.
            assert (await budget.atry_retry() if asynchronous else budget.try_retry()) is True
        assert store.available is True
        messages = [r.getMessage() for r in caplog.records]
        assert sum("Redis failed (TimeoutError)" in m for m in messages) == 1
        assert sum("Redis answers again" in m for m in messages) == 1
        store.close()


# -- a fleet of processes -------------------------------------------------------------------

WORKER = """
import sys
from llm_resilience import RedisRetryBudgetStore, RetryBudget
store = RedisRetryBudgetStore(sys.argv[1], namespace=sys.argv[2], operation_timeout=1)
budget = RetryBudget(ratio=0.1, min_per_second=0, shared=store)
for _ in range(50):
    budget.call_started()
sys.stdin.readline()  # every worker has counted its calls
print(sum(budget.try_retry() for _ in range(20)))
"""


def test_four_worker_processes_share_one_budget_of_a_tenth_of_their_calls(
    redis_url: str, namespace: str
) -> None:
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, redis_url, namespace],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    probe = worker(RedisRetryBudgetStore(redis_url, namespace=namespace), ratio=0.1)
    deadline = time.monotonic() + 4
    while probe.counts().calls < 200 and time.monotonic() < deadline:
        time.sleep(0.02)
    outputs = [w.communicate("go\n", timeout=4)[0] for w in workers]
    # 200 calls in the fleet allow 20 retries in all (alone, each worker would take 5).
    assert sum(int(out) for out in outputs) == 20
