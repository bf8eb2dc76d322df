"""CostTrackedChatModel and CostTrackedEmbeddings: gate before, record after, exactly once."""

from __future__ import annotations

import asyncio
import itertools
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models import FakeListChatModel
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableBinding
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from langchain_llm_resilience import CostTrackedChatModel, FallbackChatModel
from langchain_llm_resilience.testing import ScriptedChatModel
from llm_resilience import BudgetExceededError, CostBudget, ModelPrice
from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry, SqlCostLedger
from llm_resilience.testing import FaultInjectingServer
from llm_resilience.tokens import count_message_tokens, count_tokens

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


# -- streams closed or cancelled by their consumer -------------------------------------------


def sql_tracked(
    tmp_path: Path, inner: Any, **budget: Any
) -> tuple[CostTrackedChatModel, SqlCostLedger]:
    ledger = SqlCostLedger("sqlite:///" + str(tmp_path / "spend.db"))
    options = {**PRICES, "daily_limit": 10, **budget}
    model = CostTrackedChatModel(inner=inner, budget=CostBudget(**options), ledger=ledger)
    return model, ledger


async def recorded(ledger: SqlCostLedger, count: int) -> list[LedgerEntry]:
    """The ledger's entries once it holds ``count`` (within 5 s): asyncio closes an
    abandoned async stream in a task of its own, a moment after the consumer let go."""
    deadline = time.monotonic() + 5
    # Polled: a ledger has no event to wait on.
    while len(entries := ledger.entries()) < count and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    return entries


def consumed(pieces: list[str]) -> tuple[int, int]:
    """What a stream of ``pieces`` closed early consumed, estimated: prompt "x" + the text."""
    return count_message_tokens([("human", "x")]), count_tokens("".join(pieces))


# The streams' early close, collection and cancellation, both adapters' loop of real
# OpenAI streams (async) are in tests/behaviour/test_cost_streams.py.


def test_a_chain_stream_closed_before_naming_its_member_is_priced_at_the_dearest_member(
    tmp_path: Path,
) -> None:
    chain = FallbackChatModel(
        models=[
            ScriptedChatModel(model="cheap-model", responses=["one two three"]),
            ScriptedChatModel(model="dear-model"),
        ]
    )
    prices = {"cheap-model": ModelPrice(1, 1), "dear-model": ModelPrice(100, 100)}
    # Surface prices of 0: an entry priced at the chain's (unnamed) model would cost nothing.
    model, ledger = sql_tracked(
        tmp_path, chain, input_price_per_mtok=0, output_price_per_mtok=0, prices=prices
    )
    stream = model.stream("x")
    first = next(stream).text
    stream.close()  # the member names itself only in its last chunk
    (entry,) = ledger.entries()
    assert entry.model == "dear-model"
    assert entry.cost == sum(consumed([first])) * Decimal(100) / 10**6


def test_a_loop_of_early_closed_real_openai_streams_spends_until_the_budget_refuses(
    tmp_path: Path,
) -> None:
    with FaultInjectingServer(reply="Paris is the capital of France.") as server:
        openai = ChatOpenAI(
            model="gpt-4o-mini", base_url=server.openai_base_url, api_key="t", max_retries=0
        )  # type: ignore[arg-type]
        model, ledger = sql_tracked(tmp_path, openai, daily_limit="0.001")
        spends = []
        refused = False
        for _ in range(100):
            try:
                for chunk in model.stream("Capital of France?"):
                    if chunk.text:
                        break  # the consumer has what it wanted
            except BudgetExceededError:
                refused = True
                break
            spends.append(ledger.spend("day"))
        requests = len(server.requests)
    entries = ledger.entries()
    assert refused
    assert len(entries) == len(spends) == requests >= 20  # every stream that ran records
    assert all(earlier < later for earlier, later in itertools.pairwise(spends))
    assert all(e.estimated and e.model == "gpt-4o-mini" and e.output_tokens for e in entries)
    assert spends[-1] >= Decimal("0.001")


def test_usage_is_estimated_and_flagged_when_the_provider_reports_none() -> None:
    model, ledger = tracked(ScriptedChatModel(report_usage=False, responses=["Paris."]))
    model.invoke("What is the capital of France?")
    (entry,) = ledger.entries()
    assert entry.estimated is True
    assert entry.input_tokens > 0
    assert entry.output_tokens == 2  # "Paris." in cl100k_base


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


# Ledger failures, bad options, the embeddings layer and strict holds up to each real
# member's own output cap (its profile's maximum without one), for both adapters:
# tests/behaviour/test_cost.py.


def test_a_cost_tracked_model_dumps_to_json_with_its_prices_and_limits_as_exact_text(
    recwarn: pytest.WarningsRecorder,
) -> None:
    # pydantic could not dump the budget's read-only price map: model_dump warned and
    # model_dump_json raised PydanticSerializationError, for any tool that logs a model's
    # configuration that way.
    import json

    budget = CostBudget(
        "2.5", 10, daily_limit="5.125", prices={"gpt-4o": ModelPrice("2.5", 10)}, strict=True
    )
    model = CostTrackedChatModel(
        inner=FakeListChatModel(responses=["x"]), budget=budget, ledger=InMemoryCostLedger()
    )
    dumped = json.loads(model.model_dump_json())["budget"]
    assert dumped["input_price_per_mtok"] == "2.5"
    assert dumped["daily_limit"] == "5.125"
    assert dumped["strict"] is True
    assert dumped["prices"]["gpt-4o"]["input_per_mtok"] == "2.5"
    assert dumped["prices"]["gpt-4o"]["output_per_mtok"] == "10"
    assert model.model_dump()["budget"] == dumped
    assert [str(w.message) for w in recwarn if "serializ" in str(w.message).lower()] == []
