"""Every cost layer reads back what it was built with: budget, ledger, scope and gate."""

from __future__ import annotations

from typing import Any

from llm_resilience import CostBudget
from llm_resilience.ledger import InMemoryCostLedger

BUDGET = CostBudget(input_price_per_mtok=3, output_price_per_mtok=15, daily_limit=10)


def test_the_chat_and_embedding_cost_layers_read_back_budget_ledger_scope_and_gate(
    driver: Any,
) -> None:
    ledger = InMemoryCostLedger()
    layers = [
        driver.cost_tracked(driver.answering(), budget=BUDGET, ledger=ledger, scope="tenant-1"),
        driver.cost_tracked_embeddings(
            driver.embeddings(), budget=BUDGET, ledger=ledger, scope="tenant-1"
        ),
    ]
    for layer in layers:
        assert layer.budget is BUDGET
        assert layer.ledger is ledger
        assert layer.scope == "tenant-1"
        assert layer.gate.ledger is ledger
        assert layer.gate.budget is BUDGET
