"""Both adapters' wrappers refuse, at construction, options that would silently disable them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from llm_resilience import CostBudget

BUDGET = CostBudget(3, 15, daily_limit=10)
LAYERS = ["chat", "embeddings"]


def layer(driver: Any, kind: str, **options: Any) -> Any:
    if kind == "chat":
        return driver.cost_tracked(driver.answering(), budget=BUDGET, **options)
    return driver.cost_tracked_embeddings(driver.embeddings(), budget=BUDGET, **options)


@pytest.mark.parametrize("kind", LAYERS)
def test_a_ledger_given_as_a_url_string_is_refused_suggesting_sql_cost_ledger(
    driver: Any, kind: str
) -> None:
    with pytest.raises(TypeError, match=r"ledger.*SqlCostLedger\('sqlite:///spend.db'\)"):
        layer(driver, kind, ledger="sqlite:///spend.db")


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("ledger", [42, object()])
def test_a_ledger_that_is_not_a_ledger_is_refused(driver: Any, kind: str, ledger: Any) -> None:
    with pytest.raises(TypeError, match="ledger must be a cost ledger"):
        layer(driver, kind, ledger=ledger)


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("scope", ["tenant\x00", "t" * 10_000, "key\ud800"])
def test_a_scope_no_ledger_can_store_is_refused_at_construction(
    driver: Any, kind: str, scope: str
) -> None:
    with pytest.raises(ValueError, match="scope"):
        layer(driver, kind, scope=scope)


def test_a_per_call_scope_no_ledger_can_store_is_refused_before_the_call(driver: Any) -> None:
    inner = driver.answering()
    model = driver.cost_tracked(inner, budget=BUDGET)
    with pytest.raises(ValueError, match="budget_scope"):
        driver.run_sync(model, budget_scope="tenant\x00one")
    assert model.gate.ledger.spend("day") == 0
    assert driver.calls(inner) == 0


@pytest.mark.parametrize("timeout", [1e10, 1e300, timedelta.max])
def test_a_per_client_timeout_beyond_the_documented_maximum_is_refused(
    driver: Any, timeout: Any
) -> None:
    with pytest.raises(ValueError, match=r"per_client_timeout must be at most"):
        driver.fallback([driver.answering(), driver.answering()], per_client_timeout=timeout)
