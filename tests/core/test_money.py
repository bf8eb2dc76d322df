"""Money has one home: one check, one exact context, one price, one cost rule."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from llm_resilience import budget, money, usage
from llm_resilience.ledger import LedgerEntry
from llm_resilience.ledger._protocol import exact_sum as ledger_exact_sum
from llm_resilience.money import ModelPrice, cost_of, exact_sum
from llm_resilience.usage import Usage

NOW = datetime(2026, 3, 14, 12, tzinfo=UTC)


def test_prices_limits_and_ledger_entries_read_money_the_same_way() -> None:
    assert ModelPrice(" 0.10 ", 0).input_per_mtok == Decimal("0.10")
    assert budget.CostBudget(daily_limit="0.10").daily_limit == Decimal("0.10")
    assert LedgerEntry(NOW, "chat", cost="0.10").cost == Decimal("0.10")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0.1, TypeError),
        (True, TypeError),
        ("-1", ValueError),
        ("NaN", ValueError),
        ("x", ValueError),
    ],
)
def test_bad_money_is_refused_alike_everywhere_naming_the_option(
    value: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="input_per_mtok"):
        ModelPrice(value, 0)  # type: ignore[arg-type]
    with pytest.raises(error, match="daily_limit"):
        budget.CostBudget(daily_limit=value)  # type: ignore[arg-type]
    with pytest.raises(error, match="cost"):
        LedgerEntry(NOW, "chat", cost=value)  # type: ignore[arg-type]


def test_a_cost_is_exact_past_the_default_contexts_28_digits() -> None:
    price = ModelPrice("123456789012345.123456789012345678", 0)  # 33 digits
    cost = cost_of(Usage(2_147_483_647, 0, estimated=False), price)
    assert cost == Decimal("265121435515140433.743650515141624616127666")  # 42 digits
    assert exact_sum([cost, Decimal("1e-24")]) == Decimal(
        "265121435515140433.743650515141624616127667"
    )
    assert exact_sum([Decimal("0.1")] * 3) == Decimal("0.3")


def test_the_old_import_paths_name_the_same_objects() -> None:
    assert budget.ModelPrice is money.ModelPrice
    assert ledger_exact_sum is money.exact_sum


def test_usage_no_longer_re_exports_the_money_rules() -> None:
    # Cut at 0.1.0 (docs/migrating.md): usage sits below money, so it cannot name them.
    assert not hasattr(usage, "cost_of")
    assert not hasattr(usage, "TOKENS_PER_MTOK")


def test_budget_and_usage_no_longer_import_each_other() -> None:
    probe = (
        "import sys, llm_resilience.usage; "
        "assert 'llm_resilience.budget' not in sys.modules, 'usage imported budget'"
    )
    subprocess.run([sys.executable, "-c", probe], check=True)
