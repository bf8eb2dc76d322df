"""LlamaIndex wrappers refuse, at construction, options that would silently disable them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from llama_index.core.embeddings import MockEmbedding
from llama_index.resilience import CostTrackedEmbedding, CostTrackedLLM, FallbackLLM
from llama_index.resilience.testing import FakeFunctionCallingLLM

from llm_resilience import CostBudget

BUDGET = CostBudget(3, 15, daily_limit=10)


def _llm(**options: Any) -> CostTrackedLLM:
    return CostTrackedLLM(inner=FakeFunctionCallingLLM(), budget=BUDGET, **options)


def _embedding(**options: Any) -> CostTrackedEmbedding:
    return CostTrackedEmbedding(inner=MockEmbedding(embed_dim=8), budget=BUDGET, **options)


@pytest.mark.parametrize("build", [_llm, _embedding])
def test_a_ledger_given_as_a_url_string_is_refused_suggesting_sql_cost_ledger(build: Any) -> None:
    with pytest.raises(TypeError, match=r"ledger.*SqlCostLedger\('sqlite:///spend.db'\)"):
        build(ledger="sqlite:///spend.db")


@pytest.mark.parametrize("build", [_llm, _embedding])
@pytest.mark.parametrize("ledger", [42, object()])
def test_a_ledger_that_is_not_a_ledger_is_refused(build: Any, ledger: Any) -> None:
    with pytest.raises(TypeError, match="ledger must be a cost ledger"):
        build(ledger=ledger)


@pytest.mark.parametrize("build", [_llm, _embedding])
@pytest.mark.parametrize("scope", ["tenant\x00", "t" * 10_000, "key\ud800"])
def test_a_scope_no_ledger_can_store_is_refused_at_construction(build: Any, scope: str) -> None:
    with pytest.raises(ValueError, match="scope"):
        build(scope=scope)


def test_a_per_call_scope_no_ledger_can_store_is_refused_before_the_call() -> None:
    llm = _llm()
    with pytest.raises(ValueError, match="budget_scope"):
        llm.complete("hello", budget_scope="tenant\x00one")
    assert llm.gate.ledger.spend("day") == 0


@pytest.mark.parametrize("timeout", [1e10, 1e300, timedelta.max])
def test_a_per_client_timeout_beyond_the_documented_maximum_is_refused(timeout: Any) -> None:
    with pytest.raises(ValueError, match=r"per_client_timeout must be at most"):
        FallbackLLM(
            llms=[FakeFunctionCallingLLM(), FakeFunctionCallingLLM()], per_client_timeout=timeout
        )
