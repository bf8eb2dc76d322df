"""LangChain wrappers refuse, at construction, options that would silently disable them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding

from langchain_llm_resilience import (
    CostTrackedChatModel,
    CostTrackedEmbeddings,
    FallbackChatModel,
)
from langchain_llm_resilience.testing import ScriptedChatModel
from llm_resilience import CostBudget

BUDGET = CostBudget(3, 15, daily_limit=10)


def _chat(**options: Any) -> CostTrackedChatModel:
    return CostTrackedChatModel(inner=ScriptedChatModel(), budget=BUDGET, **options)


def _embeddings(**options: Any) -> CostTrackedEmbeddings:
    return CostTrackedEmbeddings(inner=DeterministicFakeEmbedding(size=8), budget=BUDGET, **options)


@pytest.mark.parametrize("build", [_chat, _embeddings])
def test_a_ledger_given_as_a_url_string_is_refused_suggesting_sql_cost_ledger(build: Any) -> None:
    with pytest.raises(TypeError, match=r"ledger.*SqlCostLedger\('sqlite:///spend.db'\)"):
        build(ledger="sqlite:///spend.db")


@pytest.mark.parametrize("build", [_chat, _embeddings])
@pytest.mark.parametrize("ledger", [42, object()])
def test_a_ledger_that_is_not_a_ledger_is_refused(build: Any, ledger: Any) -> None:
    with pytest.raises(TypeError, match="ledger must be a cost ledger"):
        build(ledger=ledger)


@pytest.mark.parametrize("build", [_chat, _embeddings])
@pytest.mark.parametrize("scope", ["tenant\x00", "t" * 10_000, "key\ud800"])
def test_a_scope_no_ledger_can_store_is_refused_at_construction(build: Any, scope: str) -> None:
    with pytest.raises(ValueError, match="scope"):
        build(scope=scope)


def test_a_per_call_scope_no_ledger_can_store_is_refused_before_the_call() -> None:
    inner = ScriptedChatModel(responses=["hi"])
    model = CostTrackedChatModel(inner=inner, budget=BUDGET)
    with pytest.raises(ValueError, match="budget_scope"):
        model.invoke("hello", budget_scope="tenant\x00one")
    assert model.gate.ledger.spend("day") == 0


@pytest.mark.parametrize("timeout", [1e10, 1e300, timedelta.max])
def test_a_per_client_timeout_beyond_the_documented_maximum_is_refused(timeout: Any) -> None:
    with pytest.raises(ValueError, match=r"per_client_timeout must be at most"):
        FallbackChatModel(
            models=[ScriptedChatModel(), ScriptedChatModel()], per_client_timeout=timeout
        )
