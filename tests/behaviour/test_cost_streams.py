"""The cost layer in both adapters: streams closed, collected or cancelled by their consumer.

A stream its consumer closes early, lets go of or cancels after chunks arrived records
what it consumed (the usage reported so far, else the prompt and the delivered text
estimated) and settles its strict hold with it; one cancelled before its first chunk
records nothing and releases its hold.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import sqlite3
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from driver import PROMPT

from llm_resilience import BudgetExceededError, CostBudget
from llm_resilience.ledger import LedgerEntry, SqlCostLedger
from llm_resilience.testing import FaultInjectingServer
from llm_resilience.tokens import count_message_tokens, count_tokens

PRICES = {"input_price_per_mtok": 3, "output_price_per_mtok": 15}


def sql_tracked(
    driver: Any, tmp_path: Path, inner: Any, **budget: Any
) -> tuple[Any, SqlCostLedger]:
    ledger = SqlCostLedger("sqlite:///" + str(tmp_path / "spend.db"))
    options = {**PRICES, "daily_limit": 10, **budget}
    return driver.cost_tracked(inner, budget=CostBudget(**options), ledger=ledger), ledger


async def recorded(ledger: SqlCostLedger, count: int) -> list[LedgerEntry]:
    """The ledger's entries once it holds ``count`` (within 5 s): asyncio closes an
    abandoned async stream in a task of its own, a moment after the consumer let go."""
    deadline = time.monotonic() + 5
    # Polled: a ledger has no event to wait on.
    while len(entries := ledger.entries()) < count and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    return entries


def consumed(driver: Any, pieces: list[str]) -> tuple[int, int, bool]:
    """What a stream closed after ``pieces`` consumed, estimated (the fakes report their
    usage only with their last chunk)."""
    prompt = count_message_tokens([(driver.prompt_role, PROMPT)])
    return prompt, count_tokens("".join(pieces)), True


def test_an_early_closed_stream_records_what_it_consumed_and_settles_its_hold(
    driver: Any, tmp_path: Path
) -> None:
    inner = driver.answering("one two three four", model="fake-1")
    model, ledger = sql_tracked(driver, tmp_path, inner, strict=True)
    pieces = []
    for chunk in driver.open_stream(model, PROMPT):
        pieces.append(driver.chunk_text(chunk))
        if len(pieces) == 2:
            break  # the usage would only come with the last chunk

    (entry,) = ledger.entries()
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == consumed(driver, pieces)
    assert entry.model == "fake-1"
    assert (
        entry.cost == (Decimal(entry.input_tokens) * 3 + Decimal(entry.output_tokens) * 15) / 10**6
    )
    assert ledger.spend("day") == entry.cost  # the strict hold became the entry


def test_a_stream_read_to_its_usage_and_closed_records_the_reported_usage(
    driver: Any, tmp_path: Path
) -> None:
    model, ledger = sql_tracked(driver, tmp_path, driver.answering("one two"))
    reported = None
    for chunk in driver.open_stream(model, PROMPT):
        reported = driver.chunk_usage(chunk)
        if reported:
            break

    (entry,) = ledger.entries()
    assert reported is not None
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == (*reported, False)


def test_a_garbage_collected_stream_records_what_it_consumed(driver: Any, tmp_path: Path) -> None:
    model, ledger = sql_tracked(driver, tmp_path, driver.answering("one two three"))
    stream = driver.open_stream(model, PROMPT)
    first = driver.chunk_text(next(stream))

    del stream
    gc.collect()

    (entry,) = ledger.entries()
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == consumed(driver, [first])


async def test_an_async_stream_closed_with_aclose_records_what_it_consumed(
    driver: Any, tmp_path: Path
) -> None:
    model, ledger = sql_tracked(driver, tmp_path, driver.answering("one two three"), strict=True)
    stream = await driver.aopen_stream(model, PROMPT)

    first = driver.chunk_text(await stream.__anext__())
    await stream.aclose()

    (entry,) = await recorded(ledger, 1)
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == consumed(driver, [first])
    assert ledger.spend("day") == entry.cost


async def test_an_async_stream_cancelled_after_chunks_settles_its_hold_with_what_it_consumed(
    driver: Any, tmp_path: Path
) -> None:
    inner = driver.failing(model="failing-1", chunks_before_error=2, hang_seconds=30)
    model, ledger = sql_tracked(driver, tmp_path, inner, strict=True)
    pieces: list[str] = []
    both = asyncio.Event()

    async def consume() -> None:
        async for chunk in await driver.aopen_stream(model, PROMPT):
            pieces.append(driver.chunk_text(chunk))
            if len(pieces) == 2:
                both.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(both.wait(), timeout=5)
    task.cancel()  # the model hangs after two chunks: the task waits for the third
    with pytest.raises(asyncio.CancelledError):
        await task

    inner.release()
    (entry,) = await recorded(ledger, 1)
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == consumed(driver, pieces)
    assert entry.model == "failing-1"
    assert ledger.spend("day") == entry.cost  # the hold was replaced by the entry


async def test_a_cancelled_streams_entry_survives_a_second_cancellation_during_the_write(
    driver: Any, tmp_path: Path
) -> None:
    inner = driver.failing(chunks_before_error=1, hang_seconds=30)
    model, ledger = sql_tracked(driver, tmp_path, inner)
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in await driver.aopen_stream(model, PROMPT):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), timeout=5)
    # Another process holds the database's write lock, so the entry's write waits...
    locker = sqlite3.connect(tmp_path / "spend.db", isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        task.cancel()
        await asyncio.sleep(0.2)
        task.cancel()  # ...and the stream's task is cancelled again meanwhile.
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ledger.entries() == []
    finally:
        locker.execute("COMMIT")
        locker.close()
    inner.release()
    (entry,) = await recorded(ledger, 1)
    assert entry.estimated is True


async def test_a_stream_cancelled_before_its_first_chunk_records_nothing(
    driver: Any, tmp_path: Path
) -> None:
    inner = driver.failing(hang_seconds=30)  # hangs before its first chunk
    model, ledger = sql_tracked(driver, tmp_path, inner, strict=True)

    async def consume() -> None:
        async for _ in await driver.aopen_stream(model, PROMPT):
            pass

    task = asyncio.create_task(consume())
    while driver.calls(inner) == 0:  # noqa: ASYNC110 - a fake model's counter, polled
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    inner.release()
    assert ledger.entries() == []
    assert ledger.spend("day") == 0  # the hold is released


@pytest.fixture
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply="Paris is the capital of France.") as running:
        yield running


async def test_a_loop_of_early_closed_real_openai_streams_spends_until_the_budget_refuses(
    driver: Any, server: FaultInjectingServer, tmp_path: Path
) -> None:
    # Async only: a sync LlamaIndex loop after a sync LangChain one in the same process
    # hung now and then (not understood yet); LangChain's sync loop stays in its tree.
    inner = driver.provider_client("openai", server, "gpt-4o-mini")
    model, ledger = sql_tracked(driver, tmp_path, inner, daily_limit="0.002")
    spends: list[Decimal] = []
    refused = False

    for _ in range(100):
        try:
            stream = await driver.aopen_stream(model, PROMPT)
            try:
                async for chunk in stream:
                    if driver.chunk_text(chunk):
                        break  # the consumer has what it wanted
            finally:
                await stream.aclose()
        except BudgetExceededError:
            refused = True
            break
        await recorded(ledger, len(spends) + 1)
        spends.append(ledger.spend("day"))

    entries = ledger.entries()
    assert refused
    assert len(entries) == len(spends) == len(server.requests) >= 20  # every stream records
    assert all(earlier < later for earlier, later in itertools.pairwise(spends))
    assert all(e.estimated and e.model == "gpt-4o-mini" and e.output_tokens for e in entries)
    assert spends[-1] >= Decimal("0.002")
