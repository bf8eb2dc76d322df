"""ResilienceBuilder for LlamaIndex: the documented stack, its call order, and an agent on it."""

from __future__ import annotations

import asyncio
import logging
import warnings
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.schema import TextNode
from llama_index.core.tools import FunctionTool
from llama_index.core.vector_stores import SimpleVectorStore, VectorStoreQuery
from llama_index.resilience import (
    CostTrackedEmbedding,
    CostTrackedLLM,
    FallbackLLM,
    RateLimitedEmbedding,
    RateLimitedLLM,
    ResilienceBuilder,
    RetryingEmbedding,
    RetryingVectorStore,
)
from llama_index.resilience.testing import FakeFunctionCallingLLM, rate_limit_error
from pydantic import Field

from llm_resilience import BudgetExceededError, CostBudget, SqlCostLedger, TokenBucketRateLimiter
from llm_resilience.ledger import LedgerEntry

BUDGET = CostBudget(input_price_per_mtok=3, output_price_per_mtok=15, daily_limit=25)
QUESTION = [ChatMessage(role=MessageRole.USER, content="What is the capital of France?")]


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


class JournaledLLM(FakeFunctionCallingLLM):
    """The offline fake, noting each request it receives (before it answers or fails)."""

    journal: Any = Field(default=None, exclude=True)

    def _count(self) -> None:
        self.journal.append(f"provider {self.model_name}")
        super()._count()


def ask(llm: Any, how: str) -> Any:
    if how == "achat":
        return asyncio.run(llm.achat(QUESTION))
    if how == "stream_chat":
        *_, last = llm.stream_chat(QUESTION)
        return last
    return llm.chat(QUESTION)


def journaled_stack(
    tmp_path: Path, journal: list[str], *members: Any, budget: CostBudget = BUDGET
) -> tuple[Any, JournaledLedger]:
    ledger = JournaledLedger(f"sqlite:///{tmp_path / 'spend.db'}", journal)
    builder = ResilienceBuilder()
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


def test_the_documented_stack_nests_budget_outside_limiter_outside_fallback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    primary = FakeFunctionCallingLLM(model_name="primary", error=rate_limit_error())
    secondary = FakeFunctionCallingLLM(model_name="secondary", text="Paris.")
    embedding = MockEmbedding(embed_dim=8)
    store = SimpleVectorStore()
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        stack = (
            ResilienceBuilder()
            .use_fallback_chain([primary, secondary], per_client_timeout=30)
            .register_embeddings(embedding)
            .register_vector_store(store)
            .use_rate_limiting(chat_requests_per_minute=300, embedding_requests_per_minute=1200)
            .use_sql_cost_ledger(f"sqlite:///{tmp_path / 'spend.db'}")
            .use_cost_budgeting(BUDGET)
            .configure_resilience()
            .build()
        )
    assert [record.getMessage() for record in caplog.records] == []  # built without complaint

    llm = stack.chat
    assert isinstance(llm, CostTrackedLLM)
    assert llm.find_layer(RateLimitedLLM) is llm.inner
    assert llm.find_layer(FallbackLLM) is llm.inner.inner
    assert list(llm.find_layer(FallbackLLM).llms) == [primary, secondary]

    vectors = stack.embeddings
    assert isinstance(vectors, RetryingEmbedding)
    assert vectors.find_layer(CostTrackedEmbedding) is vectors.inner
    assert vectors.find_layer(RateLimitedEmbedding) is vectors.inner.inner
    assert vectors.find_layer(MockEmbedding) is embedding
    assert isinstance(stack.vector_store, RetryingVectorStore)
    assert stack.vector_store.find_layer(SimpleVectorStore) is store

    # Both surfaces spend against one persistent ledger; the store answers through retry.
    assert llm.chat(QUESTION).message.content == "Paris."
    query_vector = vectors.get_query_embedding("capital of France")
    stack.vector_store.add([TextNode(text="Paris", id_="paris", embedding=query_vector)])
    found = stack.vector_store.query(
        VectorStoreQuery(query_embedding=query_vector, similarity_top_k=1)
    )
    assert found.ids == ["paris"]
    ledger = llm.ledger
    assert isinstance(ledger, SqlCostLedger)
    assert ledger is vectors.inner.ledger
    assert sorted(entry.kind for entry in ledger.entries()) == ["chat", "embedding"]
    ledger.close()


@pytest.mark.parametrize("how", ["chat", "achat", "stream_chat"])
def test_a_call_reads_the_budget_then_takes_a_permit_then_calls_the_provider_then_records(
    tmp_path: Path, how: str
) -> None:
    journal: list[str] = []
    llm, ledger = journaled_stack(tmp_path, journal, JournaledLLM(journal=journal))

    assert ask(llm, how).message.content
    assert journal == [
        "budget read (day)",
        "limiter acquire",
        "provider fake-model",
        "ledger record",
    ]
    ledger.close()


@pytest.mark.parametrize("how", ["chat", "achat"])
def test_a_blown_budget_touches_neither_the_limiter_nor_the_provider(
    tmp_path: Path, how: str
) -> None:
    journal: list[str] = []
    tiny = CostBudget(input_price_per_mtok=3, output_price_per_mtok=15, daily_limit="0.000001")
    llm, ledger = journaled_stack(tmp_path, journal, JournaledLLM(journal=journal), budget=tiny)
    ask(llm, how)  # spends more than the whole day's limit
    journal.clear()

    with pytest.raises(BudgetExceededError):
        ask(llm, how)
    assert journal == ["budget read (day)"]
    ledger.close()


@pytest.mark.parametrize("how", ["chat", "achat"])
def test_one_permit_covers_a_whole_fallback_sequence_with_a_failing_primary(
    tmp_path: Path, how: str
) -> None:
    journal: list[str] = []
    primary = JournaledLLM(journal=journal, model_name="primary", error=rate_limit_error())
    secondary = JournaledLLM(journal=journal, model_name="secondary")
    llm, ledger = journaled_stack(tmp_path, journal, primary, secondary)

    assert ask(llm, how).message.content
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


async def test_the_built_llm_drives_a_function_agent_with_tools(tmp_path: Path) -> None:
    multiplied: list[tuple[int, int]] = []

    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        multiplied.append((a, b))
        return a * b

    call = ToolSelection(tool_id="call_1", tool_name="multiply", tool_kwargs={"a": 6, "b": 7})
    primary = FakeFunctionCallingLLM(tool_call=call, error=rate_limit_error())
    secondary = FakeFunctionCallingLLM(
        model_name="secondary", tool_call=call, text="6 times 7 is 42."
    )
    stack = (
        ResilienceBuilder()
        .use_fallback_chain([primary, secondary])
        .use_rate_limiting(chat_requests_per_minute=300)
        .use_sql_cost_ledger(f"sqlite:///{tmp_path / 'spend.db'}")
        .use_cost_budgeting(BUDGET)
        .build()
    )
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn=multiply)], llm=stack.chat)

    result = await agent.run("What is 6 times 7?")

    assert multiplied == [(6, 7)]
    assert result.response.content == "6 times 7 is 42."
    ledger = stack.chat.ledger
    # The agent asked the LLM twice (the tool call, then the answer): two entries.
    assert [entry.model for entry in ledger.entries()] == ["secondary", "secondary"]
    ledger.close()


def test_a_surface_of_the_wrong_framework_type_is_refused_at_registration() -> None:
    with pytest.raises(TypeError, match=r"register_chat\(model\) must be a LlamaIndex LLM"):
        ResilienceBuilder().register_chat(MockEmbedding(embed_dim=8))
    with pytest.raises(TypeError, match=r"register_vector_store\(vector_store\) must be a Llama"):
        ResilienceBuilder().register_vector_store("not a store")
