"""Spend reports: what a ledger's entries cost, summed per day, month, model, kind,
surface or scope, with what a budget has left.

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
what the budget has left) and the ledgers (whose rows, :class:`SpendRow`, it orders and
totals): it is the one way to report, ``spend_report(ledger, ...)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from llm_resilience.budget import CostBudget
from llm_resilience.ledger._groups import (
    GROUPINGS,
    Grouping,
    SpendRow,
    check_grouping,
    entry_key,
    group_entries,
)
from llm_resilience.ledger._protocol import check_entry_filters, check_now
from llm_resilience.money import exact_sum

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

# Groupings whose keys are times: rows sorted by key rather than by cost.
_BY_TIME = ("day", "month")


@dataclass(frozen=True, slots=True)
class SpendReport:
    """Spend per group over ``[since, until)``, for ``scope`` or every scope.

    >>> report = SpendReport("day", None, None, None, rows=(), total=_EMPTY)
    >>> report.total.cost, dict(report.remaining)
    (Decimal('0'), {})
    """

    #: What the rows are grouped by.
    by: Grouping
    #: Inclusive lower bound of the entries' timestamps (UTC), or None.
    since: datetime | None
    #: Exclusive upper bound (UTC), or None.
    until: datetime | None
    #: The scope reported on; None: every scope (unscoped entries included).
    scope: str | None
    #: One row per group: by key ascending for day and month, else by cost descending
    #: (ties by key, unknown last).
    rows: tuple[SpendRow, ...]
    #: Sums over every row; its key is None.
    total: SpendRow
    #: Only with a budget: money left today (``"day"``) and this month (``"month"``) for
    #: the scope, ``limit - spend`` but not below 0; a window without a limit is absent.
    remaining: Mapping[str, Decimal] = field(default_factory=dict)


_EMPTY = SpendRow(None, Decimal(0), 0, 0, 0, 0)


def _sorted(rows: Iterable[SpendRow], by: Grouping) -> tuple[SpendRow, ...]:
    if by in _BY_TIME:
        return tuple(sorted(rows, key=lambda row: (row.key is None, row.key or "")))
    return tuple(sorted(rows, key=lambda row: (-row.cost, row.key is None, row.key or "")))


def _total(rows: Iterable[SpendRow]) -> SpendRow:
    rows = list(rows)
    return SpendRow(
        None,
        exact_sum(row.cost for row in rows),
        sum(row.calls for row in rows),
        sum(row.input_tokens for row in rows),
        sum(row.output_tokens for row in rows),
        sum(row.estimated_calls for row in rows),
    )


def _remaining(
    ledger: Any, budget: CostBudget, scope: str | None, now: datetime
) -> dict[str, Decimal]:
    """Money left per window: the tightest of the limits that gate a call of ``scope``
    (:meth:`~llm_resilience.CostBudget.limits_for`, the gate's own rule)."""
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
    budget: CostBudget | None = None,
    now: datetime | None = None,
) -> SpendReport:
    """Spend of ``ledger`` per ``by`` group, over ``since <= timestamp < until``.

    >>> from llm_resilience.ledger import InMemoryCostLedger
    >>> spend_report(InMemoryCostLedger(), by="month").rows
    ()

    ``by`` is ``"day"`` or ``"month"`` (UTC), ``"model"``, ``"kind"``, ``"surface"`` or
    ``"scope"`` (anything else: ``ValueError`` naming ``by`` and these). ``since`` and
    ``until`` are timezone-aware (naive: ``ValueError``). ``scope`` limits the report to
    one scope's entries (None: all). With a :class:`~llm_resilience.CostBudget`,
    :attr:`SpendReport.remaining` says what is left of the day and month holding ``now``
    (default: the current UTC time), read with the ledger's ``spend`` (holds included),
    against the same limits the gate applies to a call of ``scope``.

    A ledger with a ``_spend_rows(by, since, until, scope)`` method (both of ours) sums
    where its data is: :class:`~llm_resilience.ledger.SqlCostLedger` groups in the
    database. Any other ledger is read through ``entries(since, until)`` and summed here.
    """
    grouping = check_grouping(by)
    low, high, scope, _, _ = check_entry_filters(since, until, scope, None, None)
    if budget is not None and not isinstance(budget, CostBudget):
        raise TypeError(f"budget must be a CostBudget or None, got {type(budget).__name__}")
    moment = check_now(now)
    grouped = getattr(ledger, "_spend_rows", None)
    if grouped is not None:
        rows: list[SpendRow] = grouped(grouping, low, high, scope)
    else:
        chosen = (
            entry for entry in ledger.entries(low, high) if scope is None or entry.scope == scope
        )
        rows = group_entries(chosen, grouping)
    remaining = {} if budget is None else _remaining(ledger, budget, scope, moment)
    return SpendReport(
        by=grouping,
        since=low,
        until=high,
        scope=scope,
        rows=_sorted(rows, grouping),
        total=_total(rows),
        remaining=remaining,
    )
