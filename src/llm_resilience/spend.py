"""Spend reports: what a ledger's entries cost, summed per day, month, model, kind,
surface, scope, agent run or thread, with what a budget has left.

Examples:
    >>> from datetime import UTC, datetime
    >>> from decimal import Decimal
    >>> from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry
    >>> ledger = InMemoryCostLedger()
    >>> noon = datetime(2026, 11, 29, 12, tzinfo=UTC)
    >>> ledger.record(LedgerEntry(noon, "chat", 1000, 200, Decimal("0.1"), model="gpt-4o"))
    >>> ledger.record(LedgerEntry(noon, "chat", 500, 100, Decimal("0.2"), model="gpt-4o"))
    >>> report = spend_report(ledger, by="model")
    >>> [(row.key, row.cost, row.calls) for row in report.rows]
    [('gpt-4o', Decimal('0.3'), 2)]

Money is exact (``Decimal``) in every row and total, from every ledger. Reports hold
counts and money only, never prompt or response text. This module imports nothing heavy;
``to_dataframe`` and plots build on it elsewhere. A report sits above the budget (it says
what the budget has left) and the ledgers (whose rows, `SpendRow`, it orders and
totals): it is the one way to report, ``spend_report(ledger, ...)``.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from decimal import Decimal
from typing import Any

from llm_resilience.budget import CostBudget
from llm_resilience.ledger._groups import (
    GROUPINGS,
    Grouping,
    SpendReport,
    SpendRow,
    check_grouping,
    entry_key,
    group_entries,
    grouped_report,
)
from llm_resilience.ledger._protocol import check_now

__all__ = [
    "GROUPINGS",
    "Grouping",
    "SpendReport",
    "SpendRow",
    "check_grouping",
    "entry_key",
    "group_entries",
    "spend_report",
]


def _remaining(
    ledger: Any, budget: CostBudget, scope: str | None, now: datetime
) -> dict[str, Decimal]:
    """Money left per window: the tightest of the limits that gate a call of ``scope``
    ([`limits_for`][llm_resilience.CostBudget.limits_for], the gate's own rule)."""
    left: dict[str, Decimal] = {}
    for window, spend_scope, limit in budget.limits_for(scope):
        room = max(Decimal(0), limit - ledger.spend(window, scope=spend_scope, now=now))
        left[window] = min(left.get(window, room), room)
    return left


def spend_report(
    ledger: Any,
    by: Grouping = "day",
    since: datetime | None = None,
    until: datetime | None = None,
    *,
    scope: str | None = None,
    run: str | None = None,
    thread: str | None = None,
    budget: CostBudget | None = None,
    now: datetime | None = None,
) -> SpendReport:
    """Spend of ``ledger`` per ``by`` group, over ``since <= timestamp < until``.

    Examples:
        >>> from llm_resilience.ledger import InMemoryCostLedger
        >>> spend_report(InMemoryCostLedger(), by="month").rows
        ()

    ``by`` is ``"day"`` or ``"month"`` (UTC), ``"model"``, ``"kind"``, ``"surface"``,
    ``"scope"``, ``"run"`` or ``"thread"`` (the agent run and conversation thread the
    entries name, `LedgerEntry.run_id` and ``thread_id``; anything else: ``ValueError``
    naming ``by`` and these). ``since`` and ``until`` are timezone-aware (naive:
    ``ValueError``). ``scope``, ``run`` and ``thread`` limit the report to one scope's,
    run's or thread's entries (None: all): ``spend_report(ledger, by="run",
    thread="thread-42")`` is what each run of a conversation cost. With a [`CostBudget`][],
    `SpendReport.remaining` says what is left of the day and month holding ``now``
    (default: the current UTC time), read with the ledger's ``spend`` (holds included),
    against the same limits the gate applies to a call of ``scope``.

    Without a budget it is what our ledgers' own ``report(by, since, until, scope=,
    run=, thread=)`` gives. A ledger with a ``_spend_rows`` method (both of ours) sums
    where its data is; any other is read through ``entries(since, until)`` and summed.
    """
    if budget is not None and not isinstance(budget, CostBudget):
        raise TypeError(f"budget must be a CostBudget or None, got {type(budget).__name__}")
    moment = check_now(now)
    report = grouped_report(ledger, by, since, until, scope=scope, run=run, thread=thread)
    if budget is None:
        return report
    return dataclasses.replace(report, remaining=_remaining(ledger, budget, report.scope, moment))
