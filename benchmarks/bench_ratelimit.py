"""Our ``TokenBucketRateLimiter`` against LangChain's and LlamaIndex's own limiters.

Three contenders, in one process, at the same budget ``R`` (6,000 rpm: ``r`` = 100
requests a second) and the same burst (a bucket of ``R`` permits):

* ``ours``: ``llm_resilience.ratelimit.TokenBucketRateLimiter(requests_per_minute=R)``;
* ``langchain``: ``langchain_core.rate_limiters.InMemoryRateLimiter(requests_per_second=R/60,
  check_every_n_seconds=0.1, max_bucket_size=R)`` (0.1 s is its default poll interval);
* ``llama_index``: ``llama_index.core.rate_limiter.TokenBucketRateLimiter(requests_per_minute=R)``.

Two load shapes, each a closed loop in which every caller takes a ticket (its arrival
order), acquires, notes the time, and asks again at once, so the queue never empties and
every permit is spoken for the moment it exists: 1,000 tasks on one event loop
(``aacquire``; LlamaIndex's ``async_acquire``) and 32 threads (sync ``acquire``).

Each run starts from an empty bucket at ``t0`` and, by the limiter's own refill model,
knows when its n-th permit after ``t0`` is free:

* ours: drained with ``acquire(blocking=False)`` until refused, within one 1-second step;
  permits ``R // 60`` at a time at the end of each later step (steps end at construction
  + k s; construction is bracketed by the clock);
* langchain: it starts empty, and its first call (``acquire(blocking=False)``, refused)
  starts credit accruing continuously at ``r``; from its public ``last`` and
  ``available_tokens``, permit n is free at ``last + (n - available_tokens) / r``. Credit
  only turns into grants when some waiter polls;
* llama_index: drained with sync ``acquire()`` until one had to sleep; from its private
  ``_last_refill_time`` and ``_request_tokens``, read once at that point, permit n is free
  at ``_last_refill_time + (n - _request_tokens) / r``.

Over the window ``[t0 + 1.5 s, + 10 s)`` (``--quick``: ``[t0 + 0.5 s, + 2 s)``; a whole
number of seconds that starts mid-step for ours, so no step sits on an edge):

* accuracy: grants in the window, per minute, against ``R``;
* lateness: the n-th grant since ``t0`` (by time) minus when permit n was free, p50 and
  p99; grant times are read by the caller just after ``acquire`` returns, so they include
  resuming it (and every caller resumed before it);
* fairness: Spearman's rank correlation between arrival tickets and grant order, over
  the grants in the window (1.0 is first come, first served); *overtaken*: the share of
  those grants that came more than one permit interval (``1/r``, 10 ms) after the grant
  of a caller who arrived later (threads granted together resume in the scheduler's
  order, some ms apart, which is not overtaking); *longest wait*: of every caller
  waiting in the window, counting those still waiting at its end (a FIFO queue of N
  callers waits N/r; a starved caller waits longer);
* CPU: ``time.process_time()`` over wall time across the window (1.0 is one core busy;
  the callers' own loop costs the same for all).

Lateness and the threads' fairness move with machine load (the output ends with the load
average): compare contenders within one run, on a quiet machine.

    python benchmarks/bench_ratelimit.py            # ~75 s
    python benchmarks/bench_ratelimit.py --quick    # ~17 s
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import platform
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from langchain_core.rate_limiters import InMemoryRateLimiter
from llama_index.core.rate_limiter import TokenBucketRateLimiter as LlamaIndexTokenBucket

from llm_resilience.ratelimit import TokenBucketRateLimiter

ASYNC_CALLERS = 1000
THREAD_CALLERS = 32
LANGCHAIN_POLL_S = 0.1  # InMemoryRateLimiter's default check_every_n_seconds

clock = time.monotonic  # the clock all three limiters read


@dataclass(frozen=True)
class Drained:
    """A limiter just emptied, with its two acquire methods and its refill schedule."""

    acquire: Callable[[], object]
    aacquire: Callable[[], Awaitable[object]]
    #: When the bucket was known to be empty.
    t0: float
    #: When the n-th permit after ``t0`` (n >= 1) is free, by the limiter's own model.
    free_at: Callable[[int], float]


@dataclass(frozen=True)
class Contender:
    name: str
    config: Callable[[int], str]
    drain: Callable[[int], Drained]


def _drain_ours(rpm: int) -> Drained:
    before = clock()
    limiter = TokenBucketRateLimiter(requests_per_minute=rpm)
    origin = (before + clock()) / 2  # its steps end at origin + k * period
    period, per_step = limiter.period, limiter.permits_per_period
    while True:
        asked = clock()
        took = limiter.acquire(blocking=False)
        answered = clock()
        step = math.floor((asked - origin) / period)
        # Empty, and unambiguously within one step: the next permits come at its end.
        if not took and step == math.floor((answered - origin) / period):
            break

    def free_at(n: int) -> float:
        return origin + (step + -(-n // per_step)) * period

    return Drained(limiter.acquire, limiter.aacquire, answered, free_at)


def _drain_langchain(rpm: int) -> Drained:
    rate = rpm / 60
    limiter = InMemoryRateLimiter(
        requests_per_second=rate, check_every_n_seconds=LANGCHAIN_POLL_S, max_bucket_size=rpm
    )
    # It starts empty; its first call starts the credit accruing (and gets nothing).
    if limiter.acquire(blocking=False) or limiter.last is None:
        raise RuntimeError("InMemoryRateLimiter granted its first call: not empty at start")
    # Its own state: credit ``available_tokens`` as of ``last``, + rate a second since.
    last, credit = limiter.last, limiter.available_tokens
    return Drained(limiter.acquire, limiter.aacquire, last, lambda n: last + (n - credit) / rate)


def _drain_llama_index(rpm: int) -> Drained:
    rate = rpm / 60
    limiter = LlamaIndexTokenBucket(requests_per_minute=rpm)
    while True:
        asked = clock()
        limiter.acquire()
        if clock() - asked > 0.5 / rate:  # it slept until a permit accrued: now it is empty
            break
    # Its own state (private attributes, read once while nobody else holds it): credit
    # ``_request_tokens`` as of ``_last_refill_time``, + rate a second since.
    last, credit = limiter._last_refill_time, limiter._request_tokens
    return Drained(
        limiter.acquire, limiter.async_acquire, last, lambda n: last + (n - credit) / rate
    )


CONTENDERS = (
    Contender(
        "ours",
        lambda rpm: (
            f"`TokenBucketRateLimiter(requests_per_minute={rpm})`: {rpm:,} permits, starts "
            f"full, +{max(1, rpm // 60)} at the end of every 1 s step; waiters queue FIFO and "
            "sleep until woken (timer for the head, hand-over for the rest)"
        ),
        _drain_ours,
    ),
    Contender(
        "langchain",
        lambda rpm: (
            f"`InMemoryRateLimiter(requests_per_second={rpm / 60:g}, "
            f"check_every_n_seconds={LANGCHAIN_POLL_S}, max_bucket_size={rpm})`: starts empty, "
            f"credit accrues continuously at {rpm / 60:g}/s (added when a poll finds >= 1), "
            f"capped at {rpm:,}; every waiter polls every {LANGCHAIN_POLL_S} s"
        ),
        _drain_langchain,
    ),
    Contender(
        "llama_index",
        lambda rpm: (
            f"`llama_index.core.rate_limiter.TokenBucketRateLimiter(requests_per_minute={rpm})`: "
            f"{rpm:,} permits, starts full, refills continuously at {rpm / 60:g}/s; every "
            "waiter sleeps until its computed refill time, then retries"
        ),
        _drain_llama_index,
    ),
)


@dataclass(frozen=True)
class Trace:
    drained: Drained
    #: Arrival time by ticket (tickets are handed out in arrival order).
    arrived: dict[int, float]
    #: (ticket, grant time), as the callers recorded them.
    grants: list[tuple[int, float]]
    start: float
    end: float
    #: Process CPU seconds per wall second over the window.
    cpu: float


async def _run_async(contender: Contender, rpm: int, warmup: float, window: float) -> Trace:
    tickets = itertools.count()
    arrived: dict[int, float] = {}
    grants: list[tuple[int, float]] = []
    drained = contender.drain(rpm)

    async def caller() -> None:
        acquire = drained.aacquire
        while True:
            ticket = next(tickets)
            arrived[ticket] = clock()
            await acquire()
            grants.append((ticket, clock()))

    tasks = [asyncio.create_task(caller()) for _ in range(ASYNC_CALLERS)]
    start = drained.t0 + warmup
    end = start + window
    await asyncio.sleep(start - clock())
    cpu_started, wall_started = time.process_time(), clock()
    await asyncio.sleep(end - clock())
    cpu = (time.process_time() - cpu_started) / (clock() - wall_started)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return Trace(drained, arrived, grants, start, end, cpu)


def _run_threads(contender: Contender, rpm: int, warmup: float, window: float) -> Trace:
    tickets = itertools.count()  # next() on it is atomic under the GIL
    arrived: dict[int, float] = {}
    grants: list[tuple[int, float]] = []
    stop = threading.Event()
    drained = contender.drain(rpm)

    def caller() -> None:
        acquire = drained.acquire
        while not stop.is_set():
            ticket = next(tickets)
            arrived[ticket] = clock()
            acquire()
            grants.append((ticket, clock()))

    threads = [threading.Thread(target=caller, daemon=True) for _ in range(THREAD_CALLERS)]
    for thread in threads:
        thread.start()
    start = drained.t0 + warmup
    end = start + window
    time.sleep(max(0.0, start - clock()))
    cpu_started, wall_started = time.process_time(), clock()
    time.sleep(max(0.0, end - clock()))
    cpu = (time.process_time() - cpu_started) / (clock() - wall_started)
    stop.set()  # each thread leaves once its current acquire is granted
    for thread in threads:
        thread.join(timeout=10.0)
    if any(thread.is_alive() for thread in threads):
        print(f"warning: {contender.name}: a thread still waited 10 s after the run")
    return Trace(drained, arrived, grants, start, end, cpu)


def _percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def spearman(ranks_a: list[int], ranks_b: list[int]) -> float:
    """Spearman's rho of two rankings of the same items, each a permutation of 0..m-1."""
    m = len(ranks_a)
    if m < 2:
        return float("nan")
    squared = sum((a - b) ** 2 for a, b in zip(ranks_a, ranks_b, strict=True))
    return 1.0 - 6.0 * squared / (m * (m * m - 1))


def _ranks(values: list[int]) -> list[int]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0] * len(values)
    for rank, index in enumerate(order):
        ranks[index] = rank
    return ranks


def _overtaken(by_time: list[tuple[int, float]], start: float, end: float, slack: float) -> int:
    """Grants in ``[start, end)`` that came over ``slack`` s after a later arrival's."""
    count, latest_arrival, behind = 0, -1, 0
    for ticket, at in by_time:
        while by_time[behind][1] < at - slack:
            latest_arrival = max(latest_arrival, by_time[behind][0])
            behind += 1
        if start <= at < end and latest_arrival > ticket:
            count += 1
    return count


def _row(name: str, trace: Trace, rpm: int) -> str:
    by_time = sorted(trace.grants, key=lambda grant: grant[1])
    window = [
        (n, ticket, at)
        for n, (ticket, at) in enumerate(by_time, start=1)
        if trace.start <= at < trace.end
    ]
    per_minute = len(window) / (trace.end - trace.start) * 60
    error = (per_minute - rpm) / rpm * 100
    # The n-th grant since t0 against the n-th permit since t0.
    late_ms = sorted((at - trace.drained.free_at(n)) * 1000 for n, _, at in window)
    tickets = [ticket for _, ticket, _ in window]
    rho = spearman(_ranks(tickets), list(range(len(tickets))))
    # Callers granted together resume in the scheduler's order, some ms apart: only a
    # grant over one permit interval (60 / R s) after a later arrival's was overtaken.
    overtaken = _overtaken(by_time, trace.start, trace.end, 60 / rpm) / len(window) * 100
    granted = dict(trace.grants)
    # Every caller waiting at some point in the window, up to its grant or the end.
    longest = max(
        min(granted.get(ticket, trace.end), trace.end) - arrived
        for ticket, arrived in trace.arrived.items()
        if arrived < trace.end and granted.get(ticket, trace.end) >= trace.start
    )
    return (
        f"| {name} | {per_minute:,.0f} | {error:+.2f}% | {_percentile(late_ms, 0.5):.2f} "
        f"| {_percentile(late_ms, 0.99):.2f} | {rho:.4f} | {overtaken:.1f}% | {longest:.2f} "
        f"| {trace.cpu:.3f} |"
    )


def _table(title: str, rows: list[str], rpm: int) -> str:
    head = [
        f"### {title}",
        "",
        f"| limiter | admitted / min (configured {rpm:,}) | error | lateness p50 (ms) "
        "| lateness p99 (ms) | fairness (Spearman) | overtaken | longest wait (s) "
        "| CPU / wall |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    return "\n".join([*head, *rows])


def _machine() -> str:
    load = " ".join(f"{value:.1f}" for value in os.getloadavg())
    return (
        f"Python {platform.python_version()} on {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {load}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="2 s windows (~17 s in all)")
    parser.add_argument("--rpm", type=int, default=6000, help="the budget R (default 6000)")
    args = parser.parse_args(argv)
    rpm: int = args.rpm
    if rpm < 60 or rpm % 60:
        # Ours floors the budget to whole permits a second: only then are the rates equal.
        parser.error("--rpm must be a multiple of 60")
    # Whole seconds, starting half a step in, so a 1-second step never sits on an edge.
    warmup, window = (0.5, 2.0) if args.quick else (1.5, 10.0)

    started = time.perf_counter()
    out = [f"Machine: {_machine()}", "", f"Budget R = {rpm:,} rpm; configuration:", ""]
    out += [f"* {c.name}: {c.config(rpm)}" for c in CONTENDERS]
    out += [
        "",
        f"Same sustained rate ({rpm / 60:g}/s) and burst ({rpm:,}) for all; each run drains the "
        f"bucket to empty at t0, lets the callers pile up for {warmup:g} s, then measures "
        f"{window:g} s. Lateness: n-th grant minus when the n-th permit was free by the "
        "limiter's own refill model. Overtaken: grants that came over one permit interval "
        f"({60_000 / rpm:g} ms) after a later arrival's. CPU: process CPU s per wall s "
        "while the callers wait.",
        "",
    ]
    print("\n".join(out), flush=True)

    async_rows = []
    for contender in CONTENDERS:
        trace = asyncio.run(_run_async(contender, rpm, warmup, window))
        async_rows.append(_row(contender.name, trace, rpm))
    print(_table(f"{ASYNC_CALLERS:,} async callers, one event loop", async_rows, rpm))
    print(flush=True)

    thread_rows = []
    for contender in CONTENDERS:
        trace = _run_threads(contender, rpm, warmup, window)
        thread_rows.append(_row(contender.name, trace, rpm))
    print(_table(f"{THREAD_CALLERS} threads, sync acquire", thread_rows, rpm))
    load = os.getloadavg()[0]
    print(f"\n{time.perf_counter() - started:.1f} s; load average at the end {load:.1f}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
