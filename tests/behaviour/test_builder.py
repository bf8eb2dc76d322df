"""ResilienceBuilder in both adapters: the documented stack and its call order."""

from __future__ import annotations

import logging
import time
import warnings
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from driver import Mode

from llm_resilience import (
    BudgetExceededError,
    CostBudget,
    RetryBudget,
    RetryPolicy,
    SqlCostLedger,
    TokenBucketRateLimiter,
)
from llm_resilience.ledger import LedgerEntry
from llm_resilience.retry_budget import BudgetCounts

BUDGET = CostBudget(input_price_per_mtok=3, output_price_per_mtok=15, daily_limit=25)


class JournaledLedger(SqlCostLedger):
    """A real SQLite ledger that notes each read and write of the budget gate."""

    def __init__(self, url: str, journal: list[str]) -> None:
        super().__init__(url)
        self.journal = journal

    def spend(self, window: Any, **kwargs: Any) -> Decimal:
        self.journal.append(f"budget read ({window})")
        return super().spend(window, **kwargs)

    async def aspend(self, window: Any, **kwargs: Any) -> Decimal:
        self.journal.append(f"budget read ({window})")
        return await super().aspend(window, **kwargs)

    def record(self, entry: LedgerEntry) -> None:
        self.journal.append("ledger record")
        super().record(entry)

    async def arecord(self, entry: LedgerEntry) -> None:
        self.journal.append("ledger record")
        await super().arecord(entry)


class JournaledLimiter:
    """A real token bucket, with each permit taken noted (our own limiter protocol)."""

    def __init__(self, journal: list[str], requests_per_minute: int = 600) -> None:
        self.journal = journal
        self.bucket = TokenBucketRateLimiter(requests_per_minute)

    def acquire(self, *args: Any, **kwargs: Any) -> Any:
        self.journal.append("limiter acquire")
        return self.bucket.acquire(*args, **kwargs)

    async def aacquire(self, *args: Any, **kwargs: Any) -> Any:
        self.journal.append("limiter acquire")
        return await self.bucket.aacquire(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.bucket, name)


def journaled_stack(
    driver: Any, tmp_path: Path, journal: list[str], *members: Any, budget: CostBudget = BUDGET
) -> tuple[Any, JournaledLedger]:
    ledger = JournaledLedger(f"sqlite:///{tmp_path / 'spend.db'}", journal)
    builder = driver.builder()
    if len(members) > 1:
        builder.use_fallback_chain(list(members), per_client_timeout=30)
    else:
        builder.register_chat(members[0])
    stack = (
        builder.use_rate_limiting(chat_limiter=JournaledLimiter(journal))
        .use_cost_budgeting(budget, ledger)
        .build()
    )
    return stack.chat, ledger


async def test_the_documented_stack_nests_budget_outside_limiter_outside_fallback(
    driver: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    primary, secondary = driver.failing(), driver.answering("Paris.", model="secondary")
    embeddings = driver.embeddings(8)
    store = driver.vector_store(embeddings)
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        stack = (
            driver.builder()
            .use_fallback_chain([primary, secondary], per_client_timeout=30)
            .register_embeddings(embeddings)
            .register_vector_store(store)
            .use_rate_limiting(chat_requests_per_minute=300, embedding_requests_per_minute=1200)
            .use_sql_cost_ledger(f"sqlite:///{tmp_path / 'spend.db'}")
            .use_cost_budgeting(BUDGET)
            .configure_resilience()
            .build()
        )
    assert [record.getMessage() for record in caplog.records] == []  # built without complaint
    kinds = driver.layer_types()

    chat = stack.chat
    assert isinstance(chat, kinds["cost"])
    assert chat.find_layer(kinds["rate"]) is chat.inner
    assert chat.find_layer(kinds["fallback"]) is chat.inner.inner
    assert driver.members_of(chat.find_layer(kinds["fallback"])) == [primary, secondary]

    vectors = stack.embeddings
    assert isinstance(vectors, kinds["retry_embeddings"])
    assert vectors.find_layer(kinds["cost_embeddings"]) is vectors.inner
    assert vectors.find_layer(kinds["rate_embeddings"]) is vectors.inner.inner
    assert vectors.find_layer(type(embeddings)) is embeddings
    assert isinstance(stack.vector_store, kinds["retry_store"])
    assert stack.vector_store.find_layer(type(store)) is store

    # Both surfaces spend against one persistent ledger; the store answers through retry.
    assert (await driver.run(chat, "call")).text == "Paris."
    assert await driver.embed(vectors, ["Paris"], "query") == 1
    found = driver.store_and_find(stack.vector_store, embeddings, "Paris is the capital of France.")
    assert found == "Paris is the capital of France."
    ledger = chat.gate.ledger
    assert isinstance(ledger, SqlCostLedger)
    assert ledger is vectors.inner.gate.ledger
    assert sorted(entry.kind for entry in ledger.entries()) == ["chat", "embedding"]
    ledger.close()


async def test_a_call_reads_the_budget_then_takes_a_permit_then_calls_the_provider_then_records(
    driver: Any, mode: Mode, tmp_path: Path
) -> None:
    journal: list[str] = []
    chat, ledger = journaled_stack(driver, tmp_path, journal, driver.journaled(journal))

    assert (await driver.run(chat, mode)).text
    assert journal == [
        "budget read (day)",
        "limiter acquire",
        "provider fake-model",
        "ledger record",
    ]
    ledger.close()


@pytest.mark.parametrize("mode", ["call", "acall"])
async def test_a_blown_budget_touches_neither_the_limiter_nor_the_provider(
    driver: Any, mode: Mode, tmp_path: Path
) -> None:
    journal: list[str] = []
    tiny = CostBudget(input_price_per_mtok=3, output_price_per_mtok=15, daily_limit="0.000001")
    chat, ledger = journaled_stack(
        driver, tmp_path, journal, driver.journaled(journal), budget=tiny
    )
    await driver.run(chat, mode)  # spends more than the whole day's limit
    journal.clear()

    with pytest.raises(BudgetExceededError):
        await driver.run(chat, mode)
    assert journal == ["budget read (day)"]
    ledger.close()


@pytest.mark.parametrize("mode", ["call", "acall"])
async def test_one_permit_covers_a_whole_fallback_sequence_with_a_failing_primary(
    driver: Any, mode: Mode, tmp_path: Path
) -> None:
    journal: list[str] = []
    primary = driver.journaled(journal, model="primary", failing=True)
    secondary = driver.journaled(journal, model="secondary")
    chat, ledger = journaled_stack(driver, tmp_path, journal, primary, secondary)

    assert (await driver.run(chat, mode)).text
    assert journal == [
        "budget read (day)",
        "limiter acquire",
        "provider primary",
        "provider secondary",
        "ledger record",
    ]
    (entry,) = ledger.entries()
    assert entry.model == "secondary"  # priced for the member that served
    ledger.close()


def test_budgeting_without_a_ledger_warns_once_as_a_bare_cost_layer_does(
    driver: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="llm_resilience"):
        driver.cost_tracked(driver.answering(), budget=BUDGET)
    (bare,) = [record.getMessage() for record in caplog.records]
    assert "SqlCostLedger" in bare
    caplog.clear()

    with caplog.at_level(logging.WARNING, logger="llm_resilience"):
        builder = (
            driver.builder()
            .register_chat(driver.answering())
            .register_embeddings(driver.embeddings(8))
            .use_cost_budgeting(BUDGET)
            .use_cost_budgeting(BUDGET)  # idempotent: no second ledger, no second warning
        )
        builder.build()
        stack = builder.build()
    assert [record.getMessage() for record in caplog.records] == [bare]
    assert [record.name for record in caplog.records] == ["llm_resilience.budget"]
    assert stack.chat.gate.ledger is stack.embeddings.gate.ledger


def test_a_surface_registered_twice_is_refused_at_the_call_and_the_builder_still_builds(
    driver: Any,
) -> None:
    primary, secondary = driver.answering(model="a"), driver.answering(model="b")
    chat = driver.builder().use_fallback_chain([primary, secondary])
    with pytest.raises(ValueError, match="member of use_fallback_chain's chain"):
        chat.register_chat(primary)
    assert driver.members_of(chat.build().chat) == [primary, secondary]

    embeddings = driver.embeddings(8)
    retried = driver.builder().register_embeddings(embeddings).configure_resilience()
    with pytest.raises(ValueError, match="drop this register_embeddings"):
        retried.register_embeddings(embeddings)
    built = retried.build().embeddings
    assert isinstance(built, driver.layer_types()["retry_embeddings"])
    assert built.inner is embeddings


def test_a_surface_of_the_wrong_framework_type_is_refused_at_registration(driver: Any) -> None:
    title = driver.framework_title
    with pytest.raises(TypeError, match=rf"register_chat\(model\) must be a {title}"):
        driver.builder().register_chat(driver.embeddings(8))
    with pytest.raises(TypeError, match=rf"use_fallback_chain\(models\[1\]\) must be a {title}"):
        driver.builder().use_fallback_chain([driver.answering(), "gpt-4o"])
    with pytest.raises(
        TypeError, match=rf"register_vector_store\(vector_store\) must be a {title}"
    ):
        driver.builder().register_vector_store("not a store")


def test_use_fallback_chain_forwards_a_retry_budget_and_refuses_a_misspelled_one(
    driver: Any,
) -> None:
    budget = RetryBudget(ratio=0.1)
    primary, secondary = driver.answering(model="a"), driver.answering(model="b")
    chat = driver.builder().use_fallback_chain([primary, secondary], retry_budget=budget)
    assert chat.build().chat._chain.retry_budget is budget
    with pytest.raises(TypeError, match="did you mean 'retry_budget'"):
        driver.builder().use_fallback_chain([primary, secondary], retry_budgt=budget)
    with pytest.raises(TypeError, match="retry_budget"):
        driver.builder().use_fallback_chain([primary, secondary], retry_budget=0.2)


@pytest.mark.parametrize("mode", ["call", "acall"])
async def test_a_built_chain_draws_its_member_retries_from_the_retry_budget(
    driver: Any, mode: Mode
) -> None:
    spent = RetryBudget(ratio=0, min_per_second=0)  # no retry at all
    primary = driver.failing(model="a")
    secondary = driver.answering("the backup", model="b")
    chat = (
        driver.builder()
        .use_fallback_chain(
            [primary, secondary],
            member_retry=RetryPolicy(attempts=3, base_delay=5, jitter=0),
            retry_budget=spent,
        )
        .build()
        .chat
    )
    started = time.monotonic()
    assert (await driver.run(chat, mode)).text == "the backup"
    assert time.monotonic() - started < 1  # no 5 s wait: the refused retry moved on at once
    assert spent.counts() == BudgetCounts(calls=1, retries=0, allowed=0.0)
