"""CostTrackedChatModel and CostTrackedEmbeddings: gate before, record after, exactly once."""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableBinding
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from langchain_llm_resilience import CostTrackedChatModel, CostTrackedEmbeddings, FallbackChatModel
from langchain_llm_resilience.testing import FailingChatModel, ScriptedChatModel
from llm_resilience import BudgetExceededError, CostBudget, ModelPrice
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.testing import FaultInjectingServer

PRICES = {"input_price_per_mtok": 3, "output_price_per_mtok": 15}


def tracked(
    inner: Any = None, scope: str | None = None, **budget: Any
) -> tuple[CostTrackedChatModel, InMemoryCostLedger]:
    ledger = InMemoryCostLedger()
    options = {**PRICES, "daily_limit": 10, **budget}
    model = CostTrackedChatModel(
        inner=inner or ScriptedChatModel(model="scripted-1", responses=["Paris is the capital."]),
        budget=CostBudget(**options),
        ledger=ledger,
        scope=scope,
    )
    return model, ledger


async def test_every_call_shape_records_exactly_one_entry_with_the_reported_usage() -> None:
    model, ledger = tracked()
    message = model.invoke("Capital of France?")
    await model.ainvoke("Capital of France?")
    list(model.stream("Capital of France?"))
    [c async for c in model.astream("Capital of France?")]
    entries = ledger.entries()
    assert len(entries) == 4
    usage = message.usage_metadata
    assert usage is not None
    first = entries[0]
    assert (first.input_tokens, first.output_tokens) == (
        usage["input_tokens"],
        usage["output_tokens"],
    )
    assert first.estimated is False
    assert first.model == "scripted-1"
    assert first.surface == first.kind == "chat"
    assert (
        first.cost
        == (Decimal(usage["input_tokens"]) * 3 + Decimal(usage["output_tokens"]) * 15) / 10**6
    )
    assert {(e.input_tokens, e.output_tokens) for e in entries} == {
        (first.input_tokens, first.output_tokens)
    }


async def test_a_spent_budget_refuses_before_the_inner_model_is_called() -> None:
    inner = ScriptedChatModel()
    model, ledger = tracked(inner, daily_limit=0)
    with pytest.raises(BudgetExceededError) as raised:
        model.invoke("x")
    assert raised.value.window == "day"
    with pytest.raises(BudgetExceededError):
        await model.ainvoke("x")
    with pytest.raises(BudgetExceededError):
        list(model.stream("x"))
    with pytest.raises(BudgetExceededError):
        [c async for c in model.astream("x")]
    assert inner.calls == 0
    assert ledger.entries() == []


def test_a_stream_is_gated_on_first_iteration_and_recorded_once_complete() -> None:
    model, ledger = tracked(ScriptedChatModel(responses=["one two three four"]))
    stream = model.stream("x")
    assert ledger.entries() == []
    first = next(stream)
    assert first.content
    assert ledger.entries() == []
    list(stream)
    assert len(ledger.entries()) == 1


def test_a_stream_closed_early_or_failing_records_nothing() -> None:
    model, ledger = tracked(ScriptedChatModel(responses=["one two three four"]))
    stream = model.stream("x")
    next(stream)
    stream.close()
    failing, failing_ledger = tracked(FailingChatModel(chunks_before_error=2))
    with pytest.raises(Exception, match="scripted"):
        list(failing.stream("x"))
    assert ledger.entries() == []
    assert failing_ledger.entries() == []


def test_usage_is_estimated_and_flagged_when_the_provider_reports_none() -> None:
    model, ledger = tracked(ScriptedChatModel(report_usage=False, responses=["Paris."]))
    model.invoke("What is the capital of France?")
    (entry,) = ledger.entries()
    assert entry.estimated is True
    assert entry.input_tokens > 0
    assert entry.output_tokens == 2  # "Paris." in cl100k_base


def test_the_entry_names_and_prices_the_fallback_leg_that_served() -> None:
    chain = FallbackChatModel(
        models=[FailingChatModel(), ScriptedChatModel(model="cheap-model-2025")]
    )
    model, ledger = tracked(chain, prices={"cheap-model": ModelPrice(1, 2)})
    message = model.invoke("x")
    (entry,) = ledger.entries()
    assert entry.model == "cheap-model-2025"
    usage = message.usage_metadata
    assert usage is not None
    assert (
        entry.cost
        == (Decimal(usage["input_tokens"]) * 1 + Decimal(usage["output_tokens"]) * 2) / 10**6
    )


def test_scopes_have_their_own_windows_and_the_per_call_scope_wins() -> None:
    model, ledger = tracked(scope="tenant-a")
    model.invoke("x")
    model.invoke("x", budget_scope="tenant-b")
    assert [e.scope for e in ledger.entries()] == ["tenant-a", "tenant-b"]
    assert ledger.spend("day", scope="tenant-a") == ledger.entries()[0].cost


def test_streams_ask_openai_compatible_providers_for_their_usage() -> None:
    with FaultInjectingServer(reply="Paris is the capital of France.") as server:
        openai = ChatOpenAI(
            model="gpt-4o-mini", base_url=server.openai_base_url, api_key="t", max_retries=0
        )  # type: ignore[arg-type]
        plain = list(openai.stream("Capital of France?"))
        assert all(
            chunk.usage_metadata is None for chunk in plain
        )  # custom base_url: no usage asked
        model, ledger = tracked(openai)
        list(model.stream("Capital of France?"))
    (entry,) = ledger.entries()
    assert entry.estimated is False
    assert entry.model is not None
    assert entry.model.startswith("gpt-4o-mini")


def test_tools_pass_through_and_tool_calls_are_recorded() -> None:
    @tool
    def magic_function(input: int) -> int:
        """Apply a magic function to an input."""
        return input + 2

    model, ledger = tracked()
    bound = model.bind_tools([magic_function], tool_choice="any")
    assert isinstance(bound, RunnableBinding)
    message = bound.invoke("What is magic_function(3)?")
    assert isinstance(message, AIMessage)
    assert message.tool_calls[0]["args"] == {"input": 3}
    assert len(ledger.entries()) == 1


class BrokenLedger(InMemoryCostLedger):
    def __init__(self, *, reads: bool, writes: bool) -> None:
        super().__init__()
        self.reads, self.writes = reads, writes

    def spend(self, *args: Any, **kwargs: Any) -> Decimal:
        if not self.reads:
            raise OSError("disk gone")
        return super().spend(*args, **kwargs)

    def record(self, entry: Any) -> None:
        if not self.writes:
            raise OSError("disk full")
        super().record(entry)


@pytest.mark.parametrize(("reads", "writes"), [(False, True), (True, False)])
def test_ledger_failures_degrade_to_a_warning_and_the_call_succeeds(
    reads: bool, writes: bool, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = BrokenLedger(reads=reads, writes=writes)
    model = CostTrackedChatModel(
        inner=ScriptedChatModel(responses=["ok"]),
        budget=CostBudget(**PRICES, daily_limit=1),
        ledger=ledger,
    )
    with caplog.at_level(logging.WARNING, logger="llm_resilience.budget"):
        assert model.invoke("x").content == "ok"
    assert any(r.name == "llm_resilience.budget" for r in caplog.records)


async def test_embeddings_are_estimated_recorded_per_batch_and_refused_when_spent() -> None:
    ledger = InMemoryCostLedger()
    embeddings = CostTrackedEmbeddings(
        inner=DeterministicFakeEmbedding(size=4),
        budget=CostBudget(embedding_price_per_mtok="0.02", daily_limit="0.0000001"),
        ledger=ledger,
    )
    embeddings.embed_documents(["hello world", "hello"])
    (entry,) = ledger.entries()
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == (3, 0, True)
    assert entry.cost == Decimal("0.00000006")
    await embeddings.aembed_query("hello world")
    assert len(ledger.entries()) == 2
    with pytest.raises(BudgetExceededError):
        embeddings.embed_query("more")  # 0.0000001 reached
    assert len(ledger.entries()) == 2


@pytest.mark.parametrize(
    ("params", "error", "word"),
    [
        ({"budget": {"daily_limit": 1}}, TypeError, "budget"),
        ({"scope": ""}, ValueError, "scope"),
    ],
)
def test_bad_options_fail_at_construction_naming_the_option(
    params: dict[str, Any], error: type[Exception], word: str
) -> None:
    options: dict[str, Any] = {
        "inner": ScriptedChatModel(),
        "budget": CostBudget(**PRICES, daily_limit=1),
    }
    options.update(params)
    with pytest.raises(error, match=word):
        CostTrackedChatModel(**options)


def test_a_strict_hold_covers_the_dearest_fallback_leg() -> None:
    chain = FallbackChatModel(
        models=[FailingChatModel(model="dear-model"), ScriptedChatModel(model="cheap-model")]
    )
    budget = CostBudget(
        daily_limit="0.05",
        strict=True,
        prices={"dear-model": ModelPrice(100, 100), "cheap-model": ModelPrice(1, 1)},
    )
    model = CostTrackedChatModel(inner=chain, budget=budget, ledger=InMemoryCostLedger())
    # 1,000 output tokens at the dear leg's price (0.1) would not fit the 0.05 left, even
    # though the cheap leg (0.001) is the one that would answer this time.
    with pytest.raises(BudgetExceededError):
        model.invoke("x", max_tokens=1000)
    answer = model.invoke("x", max_tokens=100)  # 0.01 at the dear price: fits
    assert answer.response_metadata["model_name"] == "cheap-model"
