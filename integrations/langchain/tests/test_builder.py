"""ResilienceBuilder for LangChain: the documented stack, its call order, and an agent on it."""

from __future__ import annotations

import asyncio
import logging
import warnings
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_core.vectorstores import InMemoryVectorStore
from pydantic import Field

from langchain_llm_resilience import (
    CostTrackedChatModel,
    CostTrackedEmbeddings,
    FallbackChatModel,
    RateLimitedChatModel,
    RateLimitedEmbeddings,
    ResilienceBuilder,
    RetryingEmbeddings,
    RetryingVectorStore,
)
from langchain_llm_resilience.testing import FailingChatModel, ScriptedChatModel
from llm_resilience import BudgetExceededError, CostBudget, SqlCostLedger, TokenBucketRateLimiter
from llm_resilience.ledger import LedgerEntry

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


class JournaledModel(ScriptedChatModel):
    """The offline scripted model, noting each request it serves."""

    journal: Any = Field(default=None, exclude=True)

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        self.journal.append(f"provider {self.model_name}")
        return super()._generate(*args, **kwargs)

    async def _agenerate(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> Any:
        # The scripted model answers async calls through _generate: note the request once.
        self.journal.append(f"provider {self.model_name}")
        return ScriptedChatModel._generate(self, messages, stop, **kwargs)

    def _stream(self, *args: Any, **kwargs: Any) -> Any:
        self.journal.append(f"provider {self.model_name}")
        yield from super()._stream(*args, **kwargs)


class JournaledFailure(FailingChatModel):
    """A primary that fails with a 429, noting each request it receives."""

    journal: Any = Field(default=None, exclude=True)

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        self.journal.append(f"provider {self.model_name}")
        return super()._generate(*args, **kwargs)

    async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
        self.journal.append(f"provider {self.model_name}")
        return await super()._agenerate(*args, **kwargs)


def ask(model: Any, how: str, prompt: str = "Capital of France?") -> Any:
    if how == "ainvoke":
        return asyncio.run(model.ainvoke(prompt))
    if how == "stream":
        chunks = list(model.stream(prompt))
        return sum(chunks[1:], chunks[0])
    return model.invoke(prompt)


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
    primary, secondary = FailingChatModel(), ScriptedChatModel(model="secondary")
    embeddings = DeterministicFakeEmbedding(size=8)
    store = InMemoryVectorStore(embedding=embeddings)
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        stack = (
            ResilienceBuilder()
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

    chat = stack.chat
    assert isinstance(chat, CostTrackedChatModel)
    assert chat.find_layer(RateLimitedChatModel) is chat.inner
    assert chat.find_layer(FallbackChatModel) is chat.inner.inner
    assert chat.find_layer(FallbackChatModel).models == [primary, secondary]
    assert chat.find_layer(ScriptedChatModel) is secondary

    vectors = stack.embeddings
    assert isinstance(vectors, RetryingEmbeddings)
    assert vectors.find_layer(CostTrackedEmbeddings) is vectors.inner
    assert vectors.find_layer(RateLimitedEmbeddings) is vectors.inner.inner
    assert vectors.find_layer(DeterministicFakeEmbedding) is embeddings
    assert isinstance(stack.vector_store, RetryingVectorStore)
    assert stack.vector_store.find_layer(InMemoryVectorStore) is store

    # Both surfaces spend against one persistent ledger.
    assert chat.invoke("Capital of France?").content
    assert len(vectors.embed_query("Paris")) == 8
    stack.vector_store.add_texts(["Paris is the capital of France."])
    assert stack.vector_store.similarity_search("capital", k=1)[0].page_content.startswith("Paris")
    ledger = chat.gate.ledger
    assert isinstance(ledger, SqlCostLedger)
    assert ledger is vectors.inner.gate.ledger
    assert sorted(entry.kind for entry in ledger.entries()) == ["chat", "embedding"]
    ledger.close()


@pytest.mark.parametrize("how", ["invoke", "ainvoke", "stream"])
def test_a_call_reads_the_budget_then_takes_a_permit_then_calls_the_provider_then_records(
    tmp_path: Path, how: str
) -> None:
    journal: list[str] = []
    chat, ledger = journaled_stack(tmp_path, journal, JournaledModel(journal=journal))

    assert ask(chat, how).content
    assert journal == [
        "budget read (day)",
        "limiter acquire",
        "provider scripted-chat",
        "ledger record",
    ]
    ledger.close()


@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
def test_a_blown_budget_touches_neither_the_limiter_nor_the_provider(
    tmp_path: Path, how: str
) -> None:
    journal: list[str] = []
    tiny = CostBudget(input_price_per_mtok=3, output_price_per_mtok=15, daily_limit="0.000001")
    chat, ledger = journaled_stack(tmp_path, journal, JournaledModel(journal=journal), budget=tiny)
    ask(chat, how)  # spends more than the whole day's limit
    journal.clear()

    with pytest.raises(BudgetExceededError):
        ask(chat, how)
    assert journal == ["budget read (day)"]
    ledger.close()


@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
def test_one_permit_covers_a_whole_fallback_sequence_with_a_failing_primary(
    tmp_path: Path, how: str
) -> None:
    journal: list[str] = []
    primary = JournaledFailure(journal=journal)
    secondary = JournaledModel(journal=journal, model="secondary")
    chat, ledger = journaled_stack(tmp_path, journal, primary, secondary)

    assert ask(chat, how).content
    assert journal == [
        "budget read (day)",
        "limiter acquire",
        "provider failing-chat",
        "provider secondary",
        "ledger record",
    ]
    (entry,) = ledger.entries()
    assert entry.model == "secondary"  # priced for the member that served
    ledger.close()


def test_the_built_chat_model_drives_create_agent_with_tools(tmp_path: Path) -> None:
    from langchain.agents import create_agent

    @tool
    def magic_function(input: int) -> int:
        """Apply a magic function to an input."""
        return input + 2

    stack = (
        ResilienceBuilder()
        .use_fallback_chain([FailingChatModel(), ScriptedChatModel(model="secondary")])
        .use_rate_limiting(chat_requests_per_minute=300)
        .use_sql_cost_ledger(f"sqlite:///{tmp_path / 'spend.db'}")
        .use_cost_budgeting(BUDGET)
        .build()
    )
    agent = create_agent(model=stack.chat, tools=[magic_function])

    result = agent.invoke({"messages": [HumanMessage("What is the value of magic_function(3)?")]})

    assert [m.content for m in result["messages"] if m.type == "tool"] == ["5"]
    assert result["messages"][-1].type == "ai"
    ledger = stack.chat.gate.ledger
    # The agent asked the model twice (the tool call, then the answer): two entries.
    assert [entry.model for entry in ledger.entries()] == ["secondary", "secondary"]
    ledger.close()


def test_a_surface_of_the_wrong_framework_type_is_refused_at_registration() -> None:
    with pytest.raises(
        TypeError, match="register_chat\\(model\\) must be a LangChain BaseChatModel"
    ):
        ResilienceBuilder().register_chat(DeterministicFakeEmbedding(size=8))
    with pytest.raises(TypeError, match=r"use_fallback_chain\(models\[1\]\) must be a LangChain"):
        ResilienceBuilder().use_fallback_chain([ScriptedChatModel(), "gpt-4o"])
