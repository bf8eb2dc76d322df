"""The fallback circuit shared through Redis (``Cooldown(shared=RedisCircuitStore(...))``).

Against the real Redis at 127.0.0.1:6379 (the ``redis_url`` fixture: skipped locally
without it, failing under ``CI=true``), each test in a namespace of its own. Chains in one
process stand for workers where only the store matters; the fleet tests run four worker
processes on real httpx clients (the OpenAI route; quick to start) against the fault server, with Redis behind a
``FaultProxy`` for the outage.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from llm_resilience import Cooldown, FallbackChain, RedisCircuitStore, telemetry
from llm_resilience.cli import main
from llm_resilience.testing import Fault, FaultInjectingServer, FaultProxy

redis = pytest.importorskip("redis")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.redis

LOGGER = "llm_resilience.fallback"


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
def store(redis_url: str, namespace: str) -> Iterator[RedisCircuitStore]:
    made = RedisCircuitStore(redis_url, namespace=namespace)
    yield made
    made.close()


def chain_on(store: RedisCircuitStore, **options: Any) -> FallbackChain[str]:
    options.setdefault("failures", 2)
    options.setdefault("duration", 30)
    return FallbackChain(
        ["primary", "backup"],
        cooldown=Cooldown(shared=store, keys=["primary", "backup"], **options),
    )


def primary_down(attempts: list[int]) -> Callable[[int, str], str]:
    def attempt(index: int, client: str) -> str:
        attempts.append(index)
        if index == 0:
            raise ConnectionError("connection refused")
        return client

    return attempt


def answering(attempts: list[int]) -> Callable[[int, str], str]:
    def attempt(index: int, client: str) -> str:
        attempts.append(index)
        return client

    return attempt


# -- the fleet's decisions ----------------------------------------------------------------


def test_failures_of_two_workers_add_up_and_open_the_member_for_both(
    store: RedisCircuitStore, redis_url: str, namespace: str
) -> None:
    other_store = RedisCircuitStore(redis_url, namespace=namespace)
    first, second = chain_on(store), chain_on(other_store)
    attempts: list[int] = []
    assert first.invoke(primary_down(attempts)) == "backup"
    assert second.health()[0].failures == 1  # one failure, counted for the fleet
    assert second.invoke(primary_down(attempts)) == "backup"
    assert attempts == [0, 1, 0, 1]
    # Neither chain failed twice on its own; the fleet did, so both skip the primary.
    attempts.clear()
    assert first.invoke(primary_down(attempts)) == "backup"
    assert second.invoke(primary_down(attempts)) == "backup"
    assert attempts == [1, 1]
    health = second.health()[0]
    assert (health.state, health.reason, health.view, health.key) == (
        "open",
        "failures",
        "fleet",
        "primary",
    )
    assert health.open_until_utc is not None
    assert 29 < health.retry_in <= 30
    other_store.close()


def test_one_worker_at_a_time_owns_the_probe_and_its_success_closes_the_member_for_all(
    store: RedisCircuitStore, redis_url: str, namespace: str
) -> None:
    prober_store = RedisCircuitStore(redis_url, namespace=namespace, worker_id="worker-a")
    other_store = RedisCircuitStore(redis_url, namespace=namespace, worker_id="worker-b")
    prober = chain_on(prober_store, duration=0.2, failures=1)
    other = chain_on(other_store, duration=0.2, failures=1)
    attempts: list[int] = []
    prober.invoke(primary_down(attempts))
    time.sleep(0.22)  # the cooldown ends
    probed: list[int] = []
    skipped: list[int] = []

    def slow_probe(index: int, client: str) -> str:
        probed.append(index)
        if index == 0:
            # While the probe is out, the other worker keeps skipping the primary.
            assert other.invoke(answering(skipped)) == "backup"
            member = other.health()[0]
            assert (member.state, member.prober) == ("half_open", "worker-a")
        return client

    assert prober.invoke(slow_probe) == "primary"
    assert probed == [0]
    assert skipped == [1]
    assert [m.state for m in other.health()] == ["closed", "closed"]
    skipped.clear()
    assert other.invoke(answering(skipped)) == "primary"
    prober_store.close()
    other_store.close()


def test_a_failed_probe_opens_the_member_again_for_a_full_duration(
    store: RedisCircuitStore,
) -> None:
    chain = chain_on(store, duration=0.2, failures=1)
    attempts: list[int] = []
    chain.invoke(primary_down(attempts))
    time.sleep(0.22)
    chain.invoke(primary_down(attempts))  # the probe fails
    member = chain.health()[0]
    assert (member.state, member.reason) == ("open", "probe_failed")
    assert 0.15 < member.retry_in <= 0.2
    assert attempts == [0, 1, 0, 1]


def test_a_retry_after_one_worker_receives_opens_the_member_for_the_fleet(
    store: RedisCircuitStore, redis_url: str, namespace: str
) -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.status(429, retry_after=20))
        clients = [
            openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0),
            openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0),
        ]
        cooldown = Cooldown(failures=5, shared=store, keys=["primary", "backup"])
        chain = FallbackChain(clients, cooldown=cooldown)
        other_store = RedisCircuitStore(redis_url, namespace=namespace)

        def ask(index: int, client: Any) -> int:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            return index

        assert chain.invoke(ask) == 1
        # Another worker's chain over the same member key: open for the time asked.
        peer = FallbackChain(
            clients, cooldown=Cooldown(failures=5, shared=other_store, keys=["primary", "b"])
        )
        member = peer.health()[0]
        assert (member.state, member.reason) == ("open", "retry_after")
        assert 19 < member.retry_in <= 20
        other_store.close()


async def test_async_calls_share_the_circuit_without_waiting_for_the_report(
    store: RedisCircuitStore,
) -> None:
    chain = chain_on(store, failures=1)

    async def attempt(index: int, client: str) -> str:
        if index == 0:
            raise ConnectionError("connection refused")
        return client

    assert await chain.ainvoke(attempt) == "backup"
    for _ in range(50):  # the failure is reported by a task of its own
        if chain.health()[0].state == "open":
            break
        await asyncio.sleep(0.01)
    assert chain.health()[0].state == "open"
    tried: list[int] = []

    async def recording(index: int, client: str) -> str:
        tried.append(index)
        return client

    assert await chain.ainvoke(recording) == "backup"
    assert tried == [1]
    await store.aclose()


def test_a_healthy_call_waits_for_one_round_trip_and_releases_its_place_after_answering(
    store: RedisCircuitStore, redis_url: str, namespace: str
) -> None:
    chain = chain_on(store)
    callers: list[str] = []
    real = store._client.evalsha

    def counting(*args: Any) -> Any:
        callers.append(threading.current_thread().name)
        return real(*args)

    store._client.evalsha = counting
    attempts: list[int] = []
    chain.invoke(answering(attempts))  # the first success per member clears what it held
    callers.clear()
    for _ in range(5):
        chain.invoke(answering(attempts))
    # One ``order`` each on the calling thread; the in-flight entry goes afterwards.
    assert callers.count(threading.current_thread().name) == 5
    client = redis.Redis.from_url(redis_url)
    for _ in range(50):
        if client.zcard(f"{{{namespace}}}:circuit:i:primary") == 0:
            break
        time.sleep(0.005)
    assert client.zcard(f"{{{namespace}}}:circuit:i:primary") == 0
    assert set(callers) - {threading.current_thread().name} == {"llm-resilience-circuit-release"}
    client.close()


def test_a_suspect_member_admits_only_failures_minus_counted_minus_in_flight(
    store: RedisCircuitStore, redis_url: str, namespace: str
) -> None:
    # Two workers' requests are out to the primary when a third worker's fails: with
    # failures=3 the fleet sends it nothing more until one of them comes back.
    workers = [
        chain_on(RedisCircuitStore(redis_url, namespace=namespace), failures=3) for _ in range(3)
    ]
    tried: list[tuple[int, int]] = []
    released = threading.Event()

    def hanging(worker: int) -> Callable[[int, str], str]:
        def attempt(index: int, client: str) -> str:
            tried.append((worker, index))
            if index == 0:
                released.wait(5)
                raise ConnectionError("connection refused")
            return client

        return attempt

    out = [threading.Thread(target=workers[w].invoke, args=(hanging(w),)) for w in (0, 1)]
    for thread in out:
        thread.start()
    for _ in range(100):
        if len(tried) == 2:
            break
        time.sleep(0.005)
    assert sorted(tried) == [(0, 0), (1, 0)]  # both in flight to the primary
    assert workers[2].invoke(primary_down([])) == "backup"  # before any failure: admitted
    tried.clear()
    attempts: list[int] = []
    # Counted 1 + in flight 2 = 3: skipped as if open, while the primary is not open.
    assert workers[2].invoke(primary_down(attempts)) == "backup"
    assert attempts == [1]
    assert workers[2].health()[0].state == "closed"
    released.set()
    for thread in out:
        thread.join(5)
    assert workers[2].health()[0].state == "open"  # 3 failures in total: opened


# -- Redis away ----------------------------------------------------------------------------


def _points(reader: Any) -> dict[str, dict[tuple[tuple[str, Any], ...], Any]]:
    """Every point the reader holds, by metric (one read: counters are deltas)."""
    found: dict[str, dict[tuple[tuple[str, Any], ...], Any]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points = found.setdefault(metric.name, {})
                for point in metric.data.data_points:
                    points[tuple(sorted(point.attributes.items()))] = point.value
    return found


def test_a_fleet_opening_is_counted_once_and_the_gauge_shows_the_member_open_by_key(
    store: RedisCircuitStore, redis_url: str, namespace: str, metric_reader: Any
) -> None:
    if metric_reader is None:
        pytest.skip("another OpenTelemetry SDK provider is installed in this process")
    other_store = RedisCircuitStore(redis_url, namespace=namespace)
    first, second = chain_on(store), chain_on(other_store)
    first.invoke(primary_down([]))
    second.invoke(primary_down([]))  # the fleet's second failure opens the primary

    points = _points(metric_reader)
    ours = {"primary", "backup"}
    states = {
        (dict(attributes)["chain"], dict(attributes).get("member")): value
        for attributes, value in points.get(telemetry.CIRCUIT_STATE, {}).items()
        if dict(attributes).get("member") in ours
    }
    openings = [
        (dict(attributes).get("member"), value)
        for attributes, value in points.get(telemetry.CIRCUIT_OPENINGS, {}).items()
        if dict(attributes).get("view") == "fleet"
    ]
    # Both workers' gauges show the primary open (2) and the backup closed (0) ...
    for chain in (first, second):
        assert states[(chain._breaker.chain_id, "primary")] == 2  # type: ignore[union-attr]
        assert states[(chain._breaker.chain_id, "backup")] == 0  # type: ignore[union-attr]
    # ... and the fleet counted one opening, by the worker whose failure opened it.
    assert openings == [("primary", 1)]
    other_store.close()


def test_a_dead_redis_leaves_the_local_breaker_in_charge_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = RedisCircuitStore("redis://127.0.0.1:1/0", namespace="nowhere", outage_cooldown=0.01)
    chain = chain_on(store)
    attempts: list[int] = []
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(4):
            time.sleep(0.011)  # every call tries Redis again, and still warns once
            assert chain.invoke(primary_down(attempts)) == "backup"
    assert attempts == [0, 1, 0, 1, 1, 1]  # the local breaker opened after 2 failures
    warnings = [r for r in caplog.records if "Shared circuit store" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert "ConnectionError" in warnings[0].getMessage()
    assert [m.view for m in chain.health()] == ["local", "local"]
    assert chain.health()[0].state == "open"


def test_a_silent_redis_bounds_each_call_by_operation_timeout_then_rejoins(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    with FaultProxy(("127.0.0.1", 6379)) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/{redis_url.rsplit('/', 1)[1]}"
        store = RedisCircuitStore(
            url, namespace=namespace, operation_timeout=0.05, outage_cooldown=0.05
        )
        chain = chain_on(store, failures=1)
        attempts: list[int] = []
        chain.invoke(primary_down(attempts))  # the fleet opens the primary
        proxy.mode = "silent"
        time.sleep(0.03)
        with caplog.at_level(logging.INFO, logger=LOGGER):
            started = time.monotonic()
            assert chain.invoke(answering(attempts)) == "backup"  # the local breaker knew
            assert time.monotonic() - started < 0.05 + 0.1
            proxy.mode = "forward"
            time.sleep(0.08)
            assert chain.invoke(answering(attempts)) == "backup"
        assert chain.health()[0].view == "fleet"
        messages = [r.getMessage() for r in caplog.records]
        assert sum("Redis failed (TimeoutError)" in m for m in messages) == 1
        assert sum("Redis answers again" in m for m in messages) == 1
        store.close()


# -- keys ------------------------------------------------------------------------------------


class _Model:
    def __init__(self, model: str, url: str | None) -> None:
        self.model_name = model
        self.openai_api_base = url


def test_member_keys_come_from_model_and_base_url_without_credentials(
    store: RedisCircuitStore,
) -> None:
    chain = FallbackChain(
        [_Model("gpt-4o", "https://key:secret@gw.example/v1"), _Model("gpt-4o-mini", None)],
        cooldown=Cooldown(shared=store),
    )
    assert [m.key for m in chain.health()] == [
        "_Model:gpt-4o@https://gw.example/v1",
        "_Model:gpt-4o-mini",
    ]
    named = FallbackChain(["a", "b"], cooldown=Cooldown(shared=store, keys=lambda c: f"k-{c}"))
    assert [m.key for m in named.health()] == ["k-a", "k-b"]


@pytest.mark.parametrize(
    ("options", "clients", "message"),
    [
        ({}, ["a", "b"], "client 0 (str) names no model or base URL"),
        ({}, [_Model("m", None), _Model("m", None)], "clients share the key"),
        ({"keys": ["x"]}, ["a", "b"], "one key per client (2); got 1"),
        ({"keys": lambda client: ""}, ["a", "b"], "returned '' for client 0"),
    ],
)
def test_keys_that_cannot_tell_members_apart_are_refused_naming_the_option(
    store: RedisCircuitStore, options: dict[str, Any], clients: list[Any], message: str
) -> None:
    with pytest.raises(ValueError, match=r"Cooldown\.keys") as caught:
        FallbackChain(clients, cooldown=Cooldown(shared=store, **options))
    assert message in str(caught.value)


def test_bad_store_options_are_refused_at_construction(store: RedisCircuitStore) -> None:
    with pytest.raises(ValueError, match=r"Cooldown.keys must name each member once"):
        Cooldown(shared=store, keys=["a", "a"])
    with pytest.raises(ValueError, match=r"give shared= too"):
        Cooldown(keys=["a", "b"])
    with pytest.raises(TypeError, match=r"Cooldown.shared must be None or a RedisCircuitStore"):
        Cooldown(shared="redis://127.0.0.1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"RedisCircuitStore.operation_timeout"):
        RedisCircuitStore("redis://127.0.0.1:6379/15", operation_timeout=0)
    with pytest.raises(TypeError, match=r"RedisCircuitStore.url_or_client"):
        RedisCircuitStore(6379)
    shown = repr(RedisCircuitStore("redis://user:hunter2@127.0.0.1:6379/15"))
    assert "hunter2" not in shown
    assert "127.0.0.1:6379/15" in shown


# -- llm-resilience health -------------------------------------------------------------------


def test_health_command_prints_every_member_and_exits_1_while_one_is_open(
    store: RedisCircuitStore, redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["health", "--redis", redis_url, "--namespace", namespace]
    assert main(argv) == 0
    assert "no members known" in capsys.readouterr().out
    chain = chain_on(store, failures=1)
    chain.invoke(answering([]))
    assert main(argv) == 0
    chain.invoke(primary_down([]))
    capsys.readouterr()
    assert main(argv) == 1
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["member", "state", "failures"]
    assert table[1].split()[:2] == ["backup", "closed"]
    assert table[2].split()[:2] == ["primary", "open"]
    assert "failures" in table[2]
    assert main([*argv, "--format", "json"]) == 1
    members = json.loads(capsys.readouterr().out)["members"]
    assert [(m["member"], m["state"], m["reason"]) for m in members] == [
        ("backup", "closed", None),
        ("primary", "open", "failures"),
    ]
    assert 29 < members[1]["retry_in"] <= 30


def test_health_command_exits_2_when_redis_does_not_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["health", "--redis", "redis://127.0.0.1:1/0", "--timeout", "0.2"]) == 2
    assert "did not answer" in capsys.readouterr().err


# -- the fleet: four worker processes ---------------------------------------------------------

_WORKER = """
import json, logging, sys, time
import httpx
from llm_resilience import Cooldown, FallbackChain, RedisCircuitStore
redis_url, namespace, primary_url, backup_url, seconds = sys.argv[1:6]
warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING and "Shared circuit store" in record.getMessage():
            warnings.append(record.getMessage())
logging.getLogger("llm_resilience.fallback").addHandler(Keep())
store = RedisCircuitStore(redis_url, namespace=namespace, operation_timeout=0.05,
                          outage_cooldown=0.2)
clients = [httpx.Client(base_url=url, timeout=2) for url in (primary_url, backup_url)]
body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
chain = FallbackChain(clients, cooldown=Cooldown(failures=4, window=30, duration=0.5,
                      shared=store, keys=["primary", "backup"]))
attempts = []
def ask(index, client):
    attempts.append((time.time(), index))
    client.post("chat/completions", json=body).raise_for_status()
    return index
clients[1].post("chat/completions", json=body).raise_for_status()  # imports and connects now
print("ready", flush=True)
start = float(sys.stdin.readline())
time.sleep(max(0.0, start - time.time()))
served, slowest = [], 0.0
while time.time() < start + float(seconds):
    began = time.monotonic()
    served.append((time.time(), chain.invoke(ask)))
    slowest = max(slowest, time.monotonic() - began)
    time.sleep(0.01)
print(json.dumps({"attempts": attempts, "served": served, "warnings": warnings,
                  "slowest": slowest}), flush=True)
"""


def _fleet(
    redis_url: str, namespace: str, primary: str, backup: str, seconds: float
) -> tuple[list[subprocess.Popen[str]], float]:
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, redis_url, namespace, primary, backup, str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for worker in workers:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "ready"
    start = time.time() + 0.1
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write(f"{start}\n")
        worker.stdin.flush()
    return workers, start


def _results(workers: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    try:
        return [json.loads(worker.communicate(timeout=20)[0]) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()


def _primary_attempts(results: list[dict[str, Any]], until: float) -> list[tuple[float, int]]:
    """(time, worker) of every attempt on the primary before ``until``, in time order."""
    return sorted(
        (at, worker)
        for worker, result in enumerate(results)
        for at, index in result["attempts"]
        if index == 0 and at < until
    )


def test_a_fleet_of_four_opens_a_dead_primary_after_failures_in_total_and_one_worker_probes(
    redis_url: str, namespace: str
) -> None:
    with (
        FaultInjectingServer(default_fault=Fault.status(503)) as primary,
        FaultInjectingServer() as backup,
    ):
        workers, start = _fleet(
            redis_url, namespace, primary.openai_base_url, backup.openai_base_url, 1.8
        )
        time.sleep(max(0.0, start + 0.9 - time.time()))
        primary.default_fault = Fault.ok()  # the primary comes back
        recovered = time.time()
        results = _results(workers)
    dead = _primary_attempts(results, recovered)
    # The bound: at most ``failures`` (4, one per worker: the fleet's count holds
    # the requests in flight as well as the failures, so the first wave cannot exceed
    # both) requests reach the dead primary before the fleet opens it, never the 16 four
    # separate breakers would need; afterwards one probe per 0.5 s cooldown, by one worker.
    first_wave = [at for at, _ in dead if at < dead[0][0] + 0.25]
    assert 1 <= len(first_wave) <= 4, dead
    probes = [at for at, _ in dead if at >= dead[0][0] + 0.25]
    assert 1 <= len(probes) <= 2
    assert all(later - earlier > 0.4 for earlier, later in itertools.pairwise(probes))
    periods = (recovered - dead[0][0]) // 0.5 + 1
    assert len(dead) <= 4 + periods, dead  # failures + one probe per cooldown period
    # Recovery closes it for all: every worker's last calls are served by the primary.
    for result in results:
        assert [index for _, index in result["served"][-5:]] == [0] * 5
        assert all(index in (0, 1) for _, index in result["served"])
        assert result["warnings"] == []


def test_a_fleet_whose_redis_goes_silent_mid_outage_only_warns_and_its_local_breakers_take_over(
    redis_url: str, namespace: str
) -> None:
    with (
        FaultInjectingServer(default_fault=Fault.status(503)) as primary,
        FaultInjectingServer() as backup,
        FaultProxy(("127.0.0.1", 6379)) as proxy,
    ):
        proxied = f"redis://127.0.0.1:{proxy.port}/{redis_url.rsplit('/', 1)[1]}"
        workers, start = _fleet(
            proxied, namespace, primary.openai_base_url, backup.openai_base_url, 1.5
        )
        time.sleep(max(0.0, start + 0.3 - time.time()))
        proxy.mode = "silent"  # the fleet opened the primary; now Redis goes silent
        silent = time.time()
        results = _results(workers)
    during = _primary_attempts(results, float("inf"))
    after_silence = [(at, worker) for at, worker in during if at >= silent]
    # Each local breaker carries the fleet's cooldown on, then probes on its own: at most
    # one request per worker per 0.5 s cooldown while Redis is silent (1.2 s: 3 periods).
    for worker in range(4):
        mine = [at for at, who in after_silence if who == worker]
        assert len(mine) <= 3, mine
    for result in results:
        assert len(result["warnings"]) == 1  # one warning per outage, per worker
        assert "TimeoutError" in result["warnings"][0]
        assert all(index == 1 for at, index in result["served"] if at >= silent)
        # No call waited for Redis longer than its bounds (0.05 s, twice when queued).
        assert result["slowest"] < 0.5
