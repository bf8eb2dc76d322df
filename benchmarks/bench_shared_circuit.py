"""A dead primary under 8 worker processes, with and without the shared circuit store.

Two parts:

1. **Outage.** 8 worker processes each make ``calls`` requests (20; 10 with ``--quick``)
   through a ``FallbackChain`` of a primary that hangs (the fault server's
   ``Fault.hang()``) and a healthy backup, ``per_client_timeout=0.3`` and
   ``Cooldown(failures=3, window=60, duration=30)``: once with each worker's own breaker,
   once with ``shared=RedisCircuitStore(...)``. Reported: calls that waited the full
   timeout on the primary, the time from the start until the first call anywhere in the
   fleet skipped the primary, and the requests the primary received.
2. **Cost.** In one process, the healthy path: ``p50`` of a bare ``PING``, of one
   ``order`` decision of the store (the one round trip a healthy call makes), and of a
   whole ``chain.invoke`` with a no-op attempt with and without the store; the ratio of
   each to the ``PING``. Then the retry budget's decisions (a call counted, a retry
   asked), local and shared through ``RedisRetryBudgetStore``.
3. **A real call.** ``p50`` of one chat completion through the ``openai`` SDK against
   the fault server on 127.0.0.1 (an answer at once: the cheapest real provider call
   there is), made directly and through a chain with no breaker, a local ``Cooldown``,
   a shared one, and a shared one plus a shared ``RetryBudget``; the ratio of each to
   the direct call.

    python benchmarks/bench_shared_circuit.py           # about 70 s on 2 CPUs
    python benchmarks/bench_shared_circuit.py --quick

Uses database 15 of ``LLM_RESILIENCE_BENCH_REDIS_URL`` (default
``redis://127.0.0.1:6379/15``) in a namespace of its own, deleted afterwards. Without a
Redis there it says so and exits 0.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import redis

from llm_resilience import (
    Cooldown,
    FallbackChain,
    RedisCircuitStore,
    RedisRetryBudgetStore,
    RetryBudget,
)
from llm_resilience.testing import Fault, FaultInjectingServer

URL = os.environ.get("LLM_RESILIENCE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")
WORKERS = 8
TIMEOUT = 0.3

_WORKER = f"""
import json, sys, time
import httpx
from llm_resilience import Cooldown, FallbackChain, RedisCircuitStore
redis_url, namespace, primary, backup, calls = sys.argv[1:6]
shared = RedisCircuitStore(redis_url, namespace=namespace) if namespace != "-" else None
clients = [httpx.Client(base_url=url, timeout=5) for url in (primary, backup)]
body = {{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]}}
keys = ["primary", "backup"] if shared is not None else None
chain = FallbackChain(clients, per_client_timeout={TIMEOUT}, cooldown=Cooldown(
    failures=3, window=60, duration=30, shared=shared, keys=keys))
clients[1].post("chat/completions", json=body)  # imports and connects before the start
tried = []
def ask(index, client):
    tried.append(index)
    client.post("chat/completions", json=body).raise_for_status()
    return index
print("ready", flush=True)
start = float(sys.stdin.readline())
time.sleep(max(0.0, start - time.time()))
calls_out = []
for _ in range(int(calls)):
    tried.clear()
    began = time.time()
    chain.invoke(ask)
    calls_out.append({{"at": began, "waited": time.time() - began, "tried": list(tried)}})
print(json.dumps(calls_out), flush=True)
"""


def _outage(shared: bool, calls: int) -> dict[str, float]:
    namespace = f"bench-{uuid.uuid4().hex[:8]}" if shared else "-"
    with (
        FaultInjectingServer(default_fault=Fault.hang(0.5)) as primary,
        FaultInjectingServer() as backup,
    ):
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _WORKER,
                    URL,
                    namespace,
                    primary.openai_base_url,
                    backup.openai_base_url,
                    str(calls),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for _ in range(WORKERS)
        ]
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        start = time.time() + 0.2
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(f"{start}\n")
            worker.stdin.flush()
        results = [json.loads(worker.communicate(timeout=120)[0]) for worker in workers]
        primary_requests = sum(1 for r in primary.requests if r.path.endswith("completions"))
    if shared:
        _drop(namespace)
    every = [call for result in results for call in result]
    timed_out = sum(1 for call in every if call["tried"][0] == 0 and call["waited"] >= TIMEOUT)
    skips = [call["at"] for call in every if 0 not in call["tried"]]
    return {
        "calls": len(every),
        "timed_out": timed_out,
        "first_skip": (min(skips) - start) if skips else float("nan"),
        "primary_requests": primary_requests,
    }


def _drop(namespace: str) -> None:
    client = redis.Redis.from_url(URL)
    for key in client.scan_iter(f"{{{namespace}}}:*"):
        client.delete(key)
    client.close()


def _p50(samples: list[int]) -> float:
    return statistics.median(samples) / 1000.0


def _sampled(operations: dict[str, Callable[[], object]], n: int) -> list[tuple[str, float]]:
    """p50 (us) of each operation over ``n`` calls, in rounds whose order rotates."""
    samples: dict[str, list[int]] = {name: [] for name in operations}
    for _ in range(200):
        for operation in operations.values():
            operation()
    names = list(operations)
    for round_number in range(max(1, n // 250)):
        rotated = names[round_number % len(names) :] + names[: round_number % len(names)]
        for name in rotated:
            operation = operations[name]
            for _ in range(250):
                began = time.perf_counter_ns()
                operation()
                samples[name].append(time.perf_counter_ns() - began)
    return [(name, _p50(samples[name])) for name in names]


def _cost(n: int) -> list[tuple[str, float]]:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(URL)
    store = RedisCircuitStore(URL, namespace=namespace)
    budget_store = RedisRetryBudgetStore(URL, namespace=namespace)
    shared = FallbackChain(["a", "b"], cooldown=Cooldown(shared=store, keys=["bench-a", "bench-b"]))
    local = FallbackChain(["a", "b"], cooldown=Cooldown())
    # ratio 1 and a floor far above what the loop asks: every retry is granted.
    local_budget = RetryBudget(ratio=1, min_per_second=1000)
    shared_budget = RetryBudget(ratio=1, min_per_second=1000, shared=budget_store)

    def noop(index: int, member: str) -> str:
        return member

    rows = _sampled(
        {
            "PING": client.ping,
            "store.order (one decision)": lambda: store.order(["bench-a", "bench-b"], 30.0, 60.0),
            "invoke, local Cooldown": lambda: local.invoke(noop),
            "invoke, shared Cooldown": lambda: shared.invoke(noop),
            "budget call, local": local_budget.call_started,
            "budget call, shared": shared_budget.call_started,
            "budget retry, local": local_budget.try_retry,
            "budget retry, shared": shared_budget.try_retry,
        },
        n,
    )
    store.close()
    budget_store.close()
    client.close()
    _drop(namespace)
    return rows


def _real_call(n: int) -> list[tuple[str, float]]:
    import openai

    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    store = RedisCircuitStore(URL, namespace=namespace)
    budget_store = RedisRetryBudgetStore(URL, namespace=namespace)
    with FaultInjectingServer() as server:
        members = [
            openai.OpenAI(base_url=server.openai_base_url, api_key="bench", max_retries=0)
            for _ in range(2)
        ]
        keys = ["bench-openai-a", "bench-openai-b"]
        messages: list[Any] = [{"role": "user", "content": "hi"}]

        def ask(index: int, member: openai.OpenAI) -> object:
            return member.chat.completions.create(model="m", messages=messages)

        chains = {
            "chain, no breaker": FallbackChain(members),
            "chain, local Cooldown": FallbackChain(members, cooldown=Cooldown()),
            "chain, shared Cooldown": FallbackChain(
                members, cooldown=Cooldown(shared=store, keys=keys)
            ),
            "chain, shared Cooldown + budget": FallbackChain(
                members,
                cooldown=Cooldown(shared=store, keys=keys),
                retry_budget=RetryBudget(shared=budget_store),
            ),
        }
        operations: dict[str, Callable[[], object]] = {
            "direct (openai SDK)": lambda: ask(0, members[0])
        }
        for name, chain in chains.items():
            operations[name] = functools.partial(chain.invoke, ask)
        rows = _sampled(operations, n)
    store.close()
    budget_store.close()
    _drop(namespace)
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args(argv).quick
    target = urlparse(URL)
    try:
        socket.create_connection((target.hostname or "127.0.0.1", target.port or 6379), 1).close()
    except OSError:
        print(f"No Redis at {URL}; skipping.")
        return 0
    print(f"Python {platform.python_version()} on {platform.platform()}, {os.cpu_count()} CPUs")
    calls = 10 if quick else 20
    print(
        f"\nOutage: {WORKERS} worker processes x {calls} calls, primary hangs, "
        f"per_client_timeout={TIMEOUT}s, Cooldown(failures=3, duration=30)\n"
    )
    print(
        f"{'breaker':<10} {'calls':>6} {'waited timeout':>15} {'first skip':>11} {'primary reqs':>13}"
    )
    for label, shared in (("per worker", False), ("shared", True)):
        row = _outage(shared, calls)
        print(
            f"{label:<10} {row['calls']:>6} {row['timed_out']:>15} "
            f"{row['first_skip']:>10.2f}s {row['primary_requests']:>13}"
        )
    n = 2000 if quick else 10000
    print(f"\nHealthy path, p50 of {n} calls each (microseconds):\n")
    rows = _cost(n)
    _print_against(rows, "PING")
    n = 1000 if quick else 4000
    print(f"\nA real call (openai SDK, fault server on 127.0.0.1), p50 of {n} calls each:\n")
    _print_against(_real_call(n), "direct")
    return 0


def _print_against(rows: list[tuple[str, float]], anchor_name: str) -> None:
    """One line a row: its p50 and its ratio to the first row's."""
    anchor = rows[0][1]
    for name, p50 in rows:
        print(f"{name:<32} {p50:>9.1f} us  {p50 / anchor:>5.2f}x {anchor_name}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
