"""A hedged chain's losing attempt under an agent run: its entry names the run, its cost
counts in the run's account."""

from __future__ import annotations

from llm_resilience import CostBudget
from llm_resilience.fallback._hedge_inbox import HedgeLoser, hedge_inbox
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.runs import RunBudget
from llm_resilience.runs.hedges import charge_hedges
from llm_resilience.usage import Usage

BUDGET = CostBudget(1_000_000, 1_000_000, global_monthly_limit=10**9)


def test_a_hedge_loser_of_a_run_attempt_is_recorded_for_the_run_and_counted_in_it() -> None:
    runs = RunBudget(BUDGET, InMemoryCostLedger(), limit=1000)
    spend = runs.open("run-1", thread_id="thread-1")
    with hedge_inbox() as inbox:
        attempt = spend.begin(model=None)
        charge_hedges(attempt)
        inbox.report(HedgeLoser(1, Usage(30, 5, estimated=False), None))
        attempt.finish(Usage(10, 10, estimated=False))
    entries = runs.ledger.entries()
    assert [(e.kind, e.run_id, e.thread_id, e.cost) for e in entries] == [
        ("hedge", "run-1", "thread-1", 35),
        ("chat", "run-1", "thread-1", 20),
    ]
    assert spend.spent == 55


async def test_an_async_hedge_loser_is_counted_in_the_run_too() -> None:
    runs = RunBudget(BUDGET, InMemoryCostLedger(), limit=1000)
    spend = await runs.aopen("run-1")
    with hedge_inbox() as inbox:
        attempt = await spend.abegin(model=None)
        charge_hedges(attempt)
        await inbox.areport(HedgeLoser(1, Usage(30, 5, estimated=False), None))
        await attempt.aabandon()
    assert spend.spent == 35
    assert [e.kind for e in runs.ledger.entries()] == ["hedge"]


def test_without_an_open_inbox_charging_hedges_does_nothing() -> None:
    runs = RunBudget(BUDGET, InMemoryCostLedger(), limit=1000)
    attempt = runs.open("run-1").begin(model=None)
    charge_hedges(attempt)  # no hedged chain below: nothing to bind
    attempt.abandon()
    assert runs.ledger.entries() == []
