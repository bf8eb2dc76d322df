"""The async gate refuses at exactly the limit, as the sync gate does (SPEC section 4).

``abegin`` must read the same windows and apply the same ``spend >= limit`` rule as
``begin``: a spend one cent under a limit is admitted, a spend equal to it is refused with
the window, the limit and the spend. Run on the in-memory ledger and on SQLite, each
window on its own, a scope's limit and the global one.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from llm_resilience.budget import BudgetGate, CostBudget
from llm_resilience.errors import BudgetExceededError
from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry, SqlCostLedger

NOON = datetime(2026, 3, 14, 12, tzinfo=UTC)
FIRST_OF_MONTH = datetime(2026, 3, 1, 8, tzinfo=UTC)


@pytest.fixture(params=["memory", "sqlite"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield InMemoryCostLedger()
        return
    opened = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
    try:
        yield opened
    finally:
        opened.close()


def spend(ledger: Any, amount: str, *, when: datetime = NOON, scope: str | None = None) -> None:
    ledger.record(LedgerEntry(when, "chat", cost=Decimal(amount), scope=scope))


def gate(budget: CostBudget, ledger: Any) -> BudgetGate:
    return BudgetGate(budget, ledger, now=lambda: NOON)


@pytest.mark.parametrize(
    ("budget", "when", "window"),
    [
        (CostBudget(daily_limit="0.50"), NOON, "day"),
        (CostBudget(daily_limit="100", monthly_limit="0.50"), FIRST_OF_MONTH, "month"),
    ],
    ids=["day", "month"],
)
async def test_the_async_gate_admits_below_the_limit_and_refuses_at_exactly_the_limit(
    ledger: Any, budget: CostBudget, when: datetime, window: str
) -> None:
    async_gate = gate(budget, ledger)
    spend(ledger, "0.49", when=when)

    ticket = await async_gate.abegin("chat")
    await ticket.aabandon()

    spend(ledger, "0.01", when=when)
    with pytest.raises(BudgetExceededError) as refused:
        await async_gate.abegin("chat")
    assert (refused.value.window, refused.value.limit, refused.value.spend) == (
        window,
        Decimal("0.50"),
        Decimal("0.50"),
    )
    # The sync gate agrees, on the same ledger.
    with pytest.raises(BudgetExceededError):
        async_gate.begin("chat")


async def test_the_async_gate_refuses_a_scope_at_its_own_limit_and_everyone_at_the_global_one(
    ledger: Any,
) -> None:
    async_gate = gate(CostBudget(daily_limit="0.50", global_daily_limit="1.00"), ledger)
    spend(ledger, "0.50", scope="tenant-1")

    with pytest.raises(BudgetExceededError) as refused:
        await async_gate.abegin("chat", scope="tenant-1")
    assert (refused.value.scope, refused.value.spend) == ("tenant-1", Decimal("0.50"))
    await (await async_gate.abegin("chat", scope="tenant-2")).aabandon()

    spend(ledger, "0.50", scope="tenant-2")  # the global day reaches 1.00 exactly
    with pytest.raises(BudgetExceededError) as refused:
        await async_gate.abegin("chat", scope="tenant-3")
    assert (refused.value.scope, refused.value.limit, refused.value.spend) == (
        None,
        Decimal("1.00"),
        Decimal("1.00"),
    )


async def test_an_async_limit_of_zero_refuses_the_first_call(ledger: Any) -> None:
    with pytest.raises(BudgetExceededError) as refused:
        await gate(CostBudget(daily_limit=0), ledger).abegin("chat")
    assert (refused.value.limit, refused.value.spend) == (Decimal("0"), Decimal("0"))
