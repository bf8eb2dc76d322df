"""Calls cancelled or abandoned at random points through the whole stack leave no hold.

``CostTrackedLLM(RateLimitedLLM(FallbackLLM))`` with a strict budget on a SQLite ledger,
real LlamaIndex ``OpenAI`` clients against slow local servers: async calls are
cancelled at random moments, sync streams are dropped after a random number of chunks.
Afterwards no strict-mode hold is left and the spend the ledger reports is exactly the
sum of its entries.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from decimal import Decimal
from pathlib import Path

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.resilience import CostTrackedLLM, FallbackLLM, RateLimitedLLM

from llm_resilience import CostBudget
from llm_resilience.ledger import SqlCostLedger
from llm_resilience.testing import Fault, FaultInjectingServer

SEED = 11
MESSAGES = [ChatMessage(role=MessageRole.USER, content="say ten words")]


def _live_holds(path: Path) -> int:
    with sqlite3.connect(path) as connection:
        (count,) = connection.execute("SELECT COUNT(*) FROM cost_ledger_reservations").fetchone()
    return int(count)


async def _steady(path: Path, *, within: float = 10.0) -> None:
    """Wait until no hold has been seen for half a second: writes a cancelled call
    started end in the background, within the ledger's operation bound."""
    loop = asyncio.get_running_loop()
    deadline, clear_since = loop.time() + within, None
    while loop.time() < deadline:
        if _live_holds(path):
            clear_since = None
        elif clear_since is None:
            clear_since = loop.time()
        elif loop.time() - clear_since > 0.5:
            return
        await asyncio.sleep(0.02)


async def test_calls_cancelled_or_dropped_at_random_points_leave_no_hold(tmp_path: Path) -> None:
    openai_llms = pytest.importorskip("llama_index.llms.openai")
    rng = random.Random(SEED)
    path = tmp_path / "spend.db"
    ledger = SqlCostLedger(f"sqlite:///{path}", operation_timeout=2)
    reply = "one two three four five six seven eight nine ten"
    with (
        FaultInjectingServer(reply=reply, default_fault=Fault.slow(0.01)) as primary,
        FaultInjectingServer(reply=reply, default_fault=Fault.slow(0.01)) as secondary,
    ):
        primary.script(*(rng.choice([Fault.slow(0.01), Fault.status(429)]) for _ in range(400)))
        members = [
            openai_llms.OpenAI(
                model=name, api_base=server.openai_base_url, api_key="t", max_retries=0
            )
            for name, server in (("gpt-4o-mini", primary), ("gpt-4o", secondary))
        ]
        llm = CostTrackedLLM(
            inner=RateLimitedLLM(
                inner=FallbackLLM(llms=members, per_client_timeout=10),
                requests_per_minute=30_000,
            ),
            budget=CostBudget(3, 15, daily_limit=1_000, strict=True),
            ledger=ledger,
        )

        async def achat() -> None:
            await llm.achat(MESSAGES)

        async def astream_chat() -> None:
            async for _ in await llm.astream_chat(MESSAGES):
                pass

        def dropped_stream(after: int) -> None:
            stream = llm.stream_chat(MESSAGES)
            for index, _ in enumerate(stream):
                if index == after:
                    break
            stream.close()

        tasks = [asyncio.create_task(rng.choice([achat, astream_chat])()) for _ in range(150)]
        loop = asyncio.get_running_loop()
        for task in tasks:
            loop.call_later(rng.uniform(0, 1.5), task.cancel)
        sync_calls = [asyncio.to_thread(dropped_stream, rng.randrange(0, 12)) for _ in range(20)]
        outcomes = await asyncio.gather(*tasks, *sync_calls, return_exceptions=True)
        cancelled = sum(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes)
        failed = [o for o in outcomes if isinstance(o, Exception)]
        assert failed == []
        # On a loaded machine more of them are still running when their time comes.
        assert cancelled > 30, "the seed must cancel a good share of the calls mid-way"

        await _steady(path)
    assert _live_holds(path) == 0
    entries = ledger.entries()
    assert entries, "completed and partly consumed calls are recorded"
    assert ledger.spend("day") == sum((entry.cost for entry in entries), Decimal(0))
    await ledger.aclose()
