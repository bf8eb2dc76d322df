"""Cost of one ``RedisTokenBucketRateLimiter`` decision on loopback, against a plain ``PING``.

Every acquire is one round trip (one ``EVALSHA`` of the bucket script), so its floor is a
``PING`` on the same connection. The budget is so large (10^9 rpm) that no call ever
waits: what is measured is the decision itself. Rows:

* ``PING``: ``client.ping()``, the round-trip anchor;
* ``EVALSHA (script alone)``: the bucket script sent by hand, without the limiter;
* ``acquire()``: the limiter, sync;
* the async twins over ``redis.asyncio`` (``await client.ping()``, ``await aacquire()``).

Method: each operation runs ``n`` times (5,000; 1,000 with ``--quick``) after 500 warm-up
calls, in rounds of 250 whose order rotates every round, so drift (CPU frequency, other
load) falls on all of them alike. Every call is timed on its own with
``time.perf_counter_ns``; the table gives p50, p99 and the mean in microseconds. The
telemetry histogram is the no-op of a bare ``opentelemetry-api``.

    python benchmarks/bench_redis_limiter.py            # about 10 s
    python benchmarks/bench_redis_limiter.py --quick

Uses database 15 of ``LLM_RESILIENCE_BENCH_REDIS_URL`` (default
``redis://127.0.0.1:6379/15``) and deletes only its own key. Without a Redis there it
says so and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlparse

import redis
import redis.asyncio

from llm_resilience.ratelimit import RedisTokenBucketRateLimiter
from llm_resilience.ratelimit import _redis as limiter_module

URL = os.environ.get("LLM_RESILIENCE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")
ROUND = 250
WARMUP = 500
HUGE_RPM = 10**9


def _percentile(sorted_ns: list[int], fraction: float) -> float:
    index = min(len(sorted_ns) - 1, round(fraction * (len(sorted_ns) - 1)))
    return sorted_ns[index] / 1000.0


def _row(name: str, samples: list[int], anchor: float | None) -> str:
    ordered = sorted(samples)
    p50, p99 = _percentile(ordered, 0.50), _percentile(ordered, 0.99)
    mean = statistics.fmean(ordered) / 1000.0
    versus = "1.00x" if anchor is None else f"{p50 / anchor:.2f}x"
    return f"| {name} | {p50:.1f} | {p99:.1f} | {mean:.1f} | {versus} |"


def _run_sync(operations: dict[str, Callable[[], object]], n: int) -> dict[str, list[int]]:
    samples: dict[str, list[int]] = {name: [] for name in operations}
    names = list(operations)
    for name in names:
        for _ in range(WARMUP):
            operations[name]()
    for round_index in range(n // ROUND):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            operation, bucket = operations[name], samples[name]
            for _ in range(ROUND):
                started = time.perf_counter_ns()
                operation()
                bucket.append(time.perf_counter_ns() - started)
    return samples


async def _run_async(
    operations: dict[str, Callable[[], Awaitable[object]]], n: int
) -> dict[str, list[int]]:
    samples: dict[str, list[int]] = {name: [] for name in operations}
    names = list(operations)
    for name in names:
        for _ in range(WARMUP):
            await operations[name]()
    for round_index in range(n // ROUND):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            operation, bucket = operations[name], samples[name]
            for _ in range(ROUND):
                started = time.perf_counter_ns()
                await operation()
                bucket.append(time.perf_counter_ns() - started)
    return samples


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 calls per row")
    args = parser.parse_args(argv)
    n = 1000 if args.quick else 5000

    target = urlparse(URL)
    try:
        socket.create_connection((target.hostname or "127.0.0.1", target.port or 6379), 0.5).close()
    except OSError:
        print(f"No Redis at {URL}: skipped.")
        return 0

    name = f"bench-{os.getpid()}"
    limiter = RedisTokenBucketRateLimiter(HUGE_RPM, name=name, redis_url=URL)
    client = redis.Redis.from_url(URL)
    script_args = limiter._args(limiter_module._RESERVE, 0, 0)
    client.script_load(limiter_module._SCRIPT)

    sync = _run_sync(
        {
            "PING": client.ping,
            "EVALSHA (script alone)": lambda: client.evalsha(*script_args),
            "acquire()": limiter.acquire,
        },
        n,
    )

    async def measure_async() -> dict[str, list[int]]:
        aclient = redis.asyncio.Redis.from_url(URL)
        try:
            return await _run_async({"PING": aclient.ping, "aacquire()": limiter.aacquire}, n)
        finally:
            await aclient.aclose()
            await limiter.aclose()

    asynchronous = asyncio.run(measure_async())
    client.delete(limiter.key)
    client.close()
    limiter.close()

    server = redis.Redis.from_url(URL).info("server")
    print(
        f"Python {platform.python_version()}, redis-py {redis.__version__}, "
        f"Redis {server['redis_version']} at {URL}, {os.cpu_count()} CPUs, "
        f"{n} calls per row (after {WARMUP} warm-up), microseconds per call.\n"
    )
    print("| operation | p50 µs | p99 µs | mean µs | p50 vs PING |")
    print("| --- | ---: | ---: | ---: | ---: |")
    anchor = _percentile(sorted(sync["PING"]), 0.5)
    for label, samples in sync.items():
        print(_row(f"sync {label}", samples, None if label == "PING" else anchor))
    anchor = _percentile(sorted(asynchronous["PING"]), 0.5)
    for label, samples in asynchronous.items():
        print(_row(f"async {label}", samples, None if label == "PING" else anchor))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
