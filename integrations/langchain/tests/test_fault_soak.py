"""A seeded fault-injection run through the whole stack: nothing hangs, leaks or is lost.

400 mixed calls (``invoke``, ``ainvoke``, ``stream``, ``astream``; sync ones on
threads) go through ``CostTrackedChatModel(RateLimitedChatModel(FallbackChatModel))``
with real ``ChatOpenAI``/``ChatAnthropic`` clients over HTTP, a strict budget on a SQLite
ledger and the shared Redis limiter, while at random:

* the primary provider answers 429, 503 or cuts its stream mid-body;
* another connection locks the SQLite ledger (``BEGIN EXCLUSIVE``) for up to 0.4 s;
* Redis goes silent or resets every connection (a :class:`FaultProxy` in front of it).

At the end: no call took longer than the documented bound, no strict-mode hold is left,
and the ledger holds exactly one entry per call, each call's own (every prompt has a
different number of words, which the server reports as its input tokens).
"""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_openai import ChatOpenAI

from langchain_llm_resilience import (
    CostTrackedChatModel,
    FallbackChatModel,
    RateLimitedChatModel,
)
from llm_resilience import CostBudget, RedisTokenBucketRateLimiter
from llm_resilience.ledger import SqlCostLedger
from llm_resilience.testing import Fault, FaultInjectingServer, FaultProxy

SEED = 20261130
# The faults come in spells of 0.05-0.4 s every 0.1-0.6 s, whatever the number of calls:
# 400 calls (several seconds) meet dozens of spells of each, as 1,000 did.
CALLS = 400
CONCURRENCY = 16
OPERATION_TIMEOUT = 0.2
PER_CLIENT_TIMEOUT = 10.0


def _chaos(stop: threading.Event, rng: random.Random, fault: Any, heal: Any) -> None:
    """Apply ``fault`` and ``heal`` in turns, for random spells, until ``stop``."""
    while not stop.is_set():
        stop.wait(rng.uniform(0.1, 0.6))
        if stop.is_set():
            break
        fault(rng)
        stop.wait(rng.uniform(0.05, 0.4))
        heal()


def _live_holds(path: Path) -> int:
    with sqlite3.connect(path) as connection:
        (count,) = connection.execute("SELECT COUNT(*) FROM cost_ledger_reservations").fetchone()
    return int(count)


@pytest.mark.redis
async def test_four_hundred_calls_under_random_faults_are_bounded_leave_no_hold_and_record_once(
    tmp_path: Path, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_resilience")
    rng = random.Random(SEED)
    path = tmp_path / "spend.db"
    ledger = SqlCostLedger(f"sqlite:///{path}", operation_timeout=OPERATION_TIMEOUT)
    redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = FaultProxy(("127.0.0.1", redis_port)).start()
    limiter = RedisTokenBucketRateLimiter(
        requests_per_minute=600_000,
        name=f"soak-{uuid.uuid4().hex}",
        redis_url=f"redis://127.0.0.1:{proxy.port}/{redis_url.rsplit('/', 1)[1]}",
    )
    faults = [Fault.status(429), Fault.status(503), Fault.drop_mid_stream(after_chunks=2)]
    with (
        FaultInjectingServer(reply="one two three four five", name="primary") as primary,
        FaultInjectingServer(reply="six seven eight", name="secondary") as secondary,
    ):
        primary.script(*(rng.choice([Fault.ok(), *faults]) for _ in range(2 * CALLS)))
        chain = FallbackChatModel(
            models=[
                ChatOpenAI(
                    model="gpt-4o-mini",
                    base_url=primary.openai_base_url,
                    api_key="test",  # type: ignore[arg-type]
                    max_retries=0,
                    stream_usage=True,
                ),
                ChatAnthropic(
                    model="claude-haiku-4-5",
                    base_url=secondary.anthropic_base_url,
                    api_key="test",  # type: ignore[arg-type]
                    max_retries=0,
                    max_tokens=64,
                ),
            ],
            per_client_timeout=PER_CLIENT_TIMEOUT,
        )
        model = CostTrackedChatModel(
            inner=RateLimitedChatModel(inner=chain, limiter=limiter),
            budget=CostBudget(3, 15, daily_limit=1_000_000, strict=True),
            ledger=ledger,
        )

        locker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

        def lock(rng: random.Random) -> None:
            locker.execute("BEGIN EXCLUSIVE")

        def unlock() -> None:
            locker.execute("COMMIT")

        def break_redis(rng: random.Random) -> None:
            proxy.mode = rng.choice(["silent", "reset"])

        def heal_redis() -> None:
            proxy.mode = "forward"

        stop = threading.Event()
        chaos = [
            threading.Thread(target=_chaos, args=(stop, random.Random(SEED + 1), lock, unlock)),
            threading.Thread(
                target=_chaos, args=(stop, random.Random(SEED + 2), break_redis, heal_redis)
            ),
        ]
        for thread in chaos:
            thread.start()

        durations: list[float] = []
        served: Counter[int] = Counter()
        gate = asyncio.Semaphore(CONCURRENCY)

        async def call(index: int, kind: str) -> None:
            words = index + 1  # the server reports a prompt's words as its input tokens
            prompt = " ".join(["word"] * words)
            async with gate:
                started = time.monotonic()
                if kind == "invoke":
                    await asyncio.to_thread(model.invoke, prompt)
                elif kind == "ainvoke":
                    await model.ainvoke(prompt)
                elif kind == "stream":
                    await asyncio.to_thread(lambda: list(model.stream(prompt)))
                else:
                    async for _ in model.astream(prompt):
                        pass
                durations.append(time.monotonic() - started)
                served[words] += 1

        kinds = ["invoke", "ainvoke", "stream", "astream"]
        try:
            await asyncio.gather(*(call(i, rng.choice(kinds)) for i in range(CALLS)))
        finally:
            stop.set()
            for thread in chaos:
                thread.join()
            proxy.mode = "forward"
            locker.close()

        await ledger.aclose()  # writes whatever waited for the ledger to answer again
        proxy.stop()
        secondary_requests = len(secondary.requests)

    # The documented bound (docs/operations.md): the ledger adds at most 2 x its
    # operation_timeout (a read before, a write after), the Redis limiter 2 x its own
    # (1 s by default), each provider attempt at most the per-client timeout; plus a
    # second of scheduling margin on a loaded 2-core machine.
    bound = 2 * OPERATION_TIMEOUT + 2 * 1.0 + PER_CLIENT_TIMEOUT + 1.0
    assert len(durations) == CALLS
    assert max(durations) < bound
    assert _live_holds(path) == 0
    recorded = Counter(entry.input_tokens for entry in SqlCostLedger(f"sqlite:///{path}").entries())
    # The server counts a chat turn's words, so every prompt maps to its own count.
    assert sorted(recorded.values()) == [1] * CALLS
    assert len(recorded) == CALLS == len(served)

    # The faults did happen: the run proves nothing otherwise.
    warned = Counter(
        record.name.split(".")[1]
        for record in caplog.records
        if record.name.startswith("llm_resilience.")
    )
    assert warned["ledger"] > 0  # writes kept for later
    assert warned["budget"] > 0  # gate reads that let calls through ungated
    assert warned["ratelimit"] > 0  # Redis outages
    assert secondary_requests > CALLS // 10
