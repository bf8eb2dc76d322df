"""The timing harness shared by the per-call benchmarks: interleaved, rotating rounds.

Each round times one batch per contender, the order rotating every round, so drift in
the machine's speed hits every contender alike; a cell is the median over rounds of the
per-call batch mean. ``gc`` stays enabled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["Samples", "Settings", "run_async", "run_sync"]


@dataclass
class Settings:
    rounds: int  # measured rounds, at most
    warmup: int  # rounds run first and thrown away
    batch_ns: int  # target wall time of one batch of one contender
    budget_s: float  # a scenario stops after this many seconds (at least min_rounds)
    min_rounds: int = 30
    probe: int = 30  # calls timed once to size the batches


#: Per-call batch means in ns, one per measured round, by contender.
Samples = dict[str, list[float]]


def _batch_size(per_call_ns: float, settings: Settings) -> int:
    return max(3, int(settings.batch_ns / per_call_ns))


def _order(names: list[str], round_: int) -> list[str]:
    shift = round_ % len(names)
    return names[shift:] + names[:shift]


def _done(s: Settings, round_: int, started: float) -> bool:
    measured = round_ - s.warmup
    if measured >= s.rounds:
        return True
    return measured >= s.min_rounds and time.perf_counter() - started > s.budget_s


def run_sync(calls: dict[str, Callable[[], object]], s: Settings) -> Samples:
    def timed(call: Callable[[], object], n: int) -> float:
        start = time.perf_counter_ns()
        for _ in range(n):
            call()
        return (time.perf_counter_ns() - start) / n

    started = time.perf_counter()
    batch = _batch_size(max(timed(call, s.probe) for call in calls.values()), s)
    samples: Samples = {name: [] for name in calls}
    round_ = 0
    while not _done(s, round_, started):
        for name in _order(list(calls), round_):
            mean = timed(calls[name], batch)
            if round_ >= s.warmup:
                samples[name].append(mean)
        round_ += 1
    return samples


def run_async(calls: dict[str, Callable[[], Awaitable[object]]], s: Settings) -> Samples:
    async def timed(call: Callable[[], Awaitable[object]], n: int) -> float:
        start = time.perf_counter_ns()
        for _ in range(n):
            await call()
        return (time.perf_counter_ns() - start) / n

    async def main() -> Samples:
        started = time.perf_counter()
        batch = _batch_size(max([await timed(call, s.probe) for call in calls.values()]), s)
        samples: Samples = {name: [] for name in calls}
        round_ = 0
        while not _done(s, round_, started):
            for name in _order(list(calls), round_):
                mean = await timed(calls[name], batch)
                if round_ >= s.warmup:
                    samples[name].append(mean)
            round_ += 1
        return samples

    return asyncio.run(main())
