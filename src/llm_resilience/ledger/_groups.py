"""How a ledger's entries add up per group: the rows a spend report is made of.

Storage owns the grouping ([`SqlCostLedger`][] groups in the
database, the in-memory ledger here, with `group_entries`) and the report of rows it
makes (`grouped_report`: ordered, totalled; a ledger's ``report()``). What a budget
has left is policy: `llm_resilience.spend.spend_report` adds it, and re-exports these
names.

Examples:
    >>> from datetime import UTC, datetime
    >>> entry = LedgerEntry(datetime(2026, 11, 29, 12, tzinfo=UTC), "chat", cost=Decimal("0.1"))
    >>> [(row.key, row.cost, row.calls) for row in group_entries([entry, entry], "day")]
    [('2026-11-29', Decimal('0.2'), 2)]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal, get_args

from llm_resilience.ledger._protocol import LedgerEntry, check_entry_filters
from llm_resilience.money import exact_sum

__all__ = [
    "GROUPINGS",
    "GROUP_FIELDS",
    "Grouping",
    "SpendReport",
    "SpendRow",
    "check_grouping",
    "entry_key",
    "group_entries",
    "grouped_report",
]

Grouping = Literal["day", "month", "model", "kind", "surface", "scope", "run", "thread"]
#: Every grouping a report accepts, in the order the docs list them.
GROUPINGS: tuple[Grouping, ...] = get_args(Grouping)
#: The entry field each grouping other than a time reads (run and thread: their ids).
GROUP_FIELDS: dict[str, str] = {
    "model": "model",
    "kind": "kind",
    "surface": "surface",
    "scope": "scope",
    "run": "run_id",
    "thread": "thread_id",
}


@dataclass(frozen=True, slots=True)
class SpendRow:
    """Sums over the entries of one group (or all of them, for a report's total).

    Examples:
        >>> row = SpendRow("gpt-4o", Decimal("0.3"), calls=4, input_tokens=1500,
        ...                output_tokens=300, estimated_calls=1)
        >>> row.estimated_share
        0.25
    """

    #: The group: ``'2026-11-29'`` (day), ``'2026-11'`` (month), a model, kind, surface,
    #: scope, run id or thread id; None for entries without one (unknown model, unscoped,
    #: outside any agent run) and for a total.
    key: str | None
    #: Exact money of the group's entries.
    cost: Decimal
    #: Entries (calls, or other billed things such as OCR pages) in the group.
    calls: int
    #: Input (prompt) tokens of the group.
    input_tokens: int
    #: Output (completion) tokens of the group.
    output_tokens: int
    #: Entries whose token counts were estimated rather than reported by the provider.
    estimated_calls: int

    @property
    def estimated_share(self) -> float:
        """``estimated_calls / calls``: how much of the group rests on estimates (0.0
        when the group has no calls)."""
        return self.estimated_calls / self.calls if self.calls else 0.0


@dataclass(frozen=True, slots=True)
class SpendReport:
    """Spend per group over ``[since, until)``, for ``scope`` or every scope.

    Examples:
        >>> report = SpendReport("day", None, None, None, rows=(), total=EMPTY_ROW)
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
    #: Only from `spend_report` with a budget: money left today
    #: (``"day"``) and this month (``"month"``) for the scope, ``limit - spend`` but not
    #: below 0; a window without a limit is absent.
    remaining: Mapping[str, Decimal] = field(default_factory=dict)
    #: The agent run reported on (its entries' ``run_id``); None: every entry.
    run: str | None = None
    #: The conversation thread reported on (``thread_id``); None: every entry.
    thread: str | None = None


#: The sums of no entries.
EMPTY_ROW = SpendRow(None, Decimal(0), 0, 0, 0, 0)
# Groupings whose keys are times: rows sorted by key rather than by cost.
_BY_TIME = ("day", "month")


def check_grouping(by: object) -> Grouping:
    """``by`` if it is a grouping, else ``ValueError`` naming ``by`` and the choices."""
    for grouping in GROUPINGS:
        if by == grouping and isinstance(by, str):
            return grouping
    choices = ", ".join(repr(each) for each in GROUPINGS)
    raise ValueError(f"by must be one of {choices}; got {by!r}")


def entry_key(entry: LedgerEntry, by: Grouping) -> str | None:
    """The group ``entry`` falls in: its UTC day or month, or its model, kind, surface,
    scope, ``run_id`` or ``thread_id`` (None when it has none).

    Examples:
        >>> from datetime import UTC, datetime
        >>> entry = LedgerEntry(datetime(2026, 11, 29, 23, tzinfo=UTC), "chat")
        >>> entry_key(entry, "day"), entry_key(entry, "month"), entry_key(entry, "model")
        ('2026-11-29', '2026-11', None)
    """
    # isoformat, not strftime: "%Y" writes year 1 as "1", a key that sorts wrongly.
    if by == "day":
        return entry.timestamp.date().isoformat()
    if by == "month":
        return entry.timestamp.date().isoformat()[:7]
    value: str | None = getattr(entry, GROUP_FIELDS[by])
    return value or None


def group_entries(entries: Iterable[LedgerEntry], by: Grouping) -> list[SpendRow]:
    """One unsorted row per group of ``entries``, summed exactly in Python: what the
    in-memory ledger and any third-party ledger's report use."""
    sums: dict[str | None, list[Any]] = {}
    for entry in entries:
        key = entry_key(entry, by)
        group = sums.get(key)
        if group is None:
            group = sums[key] = [[], 0, 0, 0, 0]
        group[0].append(entry.cost)
        group[1] += 1
        group[2] += entry.input_tokens
        group[3] += entry.output_tokens
        group[4] += entry.estimated
    return [
        SpendRow(key, exact_sum(costs), calls, tokens_in, tokens_out, estimated)
        for key, (costs, calls, tokens_in, tokens_out, estimated) in sums.items()
    ]


def grouped_report(
    ledger: Any,
    by: object = "day",
    since: datetime | None = None,
    until: datetime | None = None,
    *,
    scope: str | None = None,
    run: str | None = None,
    thread: str | None = None,
) -> SpendReport:
    """``ledger``'s entries over ``since <= timestamp < until`` summed per ``by`` group,
    ordered and totalled (no ``remaining``: that needs a budget).

    ``by`` is ``"day"`` or ``"month"`` (UTC), ``"model"``, ``"kind"``, ``"surface"``,
    ``"scope"``, ``"run"`` or ``"thread"`` (the entries' ``run_id``/``thread_id``;
    anything else: ``ValueError`` naming ``by`` and these); ``since`` and ``until`` are
    timezone-aware (naive: ``ValueError``); ``scope``, ``run`` and ``thread`` keep one
    scope's, agent run's or thread's entries (None: all). A ledger with a
    ``_spend_rows(by, since, until, scope, run=, thread=)`` method (both of ours) sums
    where its data is; any other is read through ``entries(since, until)`` and summed
    here.
    """
    grouping = check_grouping(by)
    checked = check_entry_filters(since, until, scope, None, None, run=run, thread=thread)
    low, high, scope = checked.since, checked.until, checked.scope
    grouped = getattr(ledger, "_spend_rows", None)
    if grouped is not None:
        rows: list[SpendRow] = grouped(
            grouping, low, high, scope, run=checked.run, thread=checked.thread
        )
    else:
        chosen = (
            entry
            for entry in ledger.entries(low, high)
            if (scope is None or entry.scope == scope)
            and (checked.run is None or entry.run_id == checked.run)
            and (checked.thread is None or entry.thread_id == checked.thread)
        )
        rows = group_entries(chosen, grouping)
    return SpendReport(
        by=grouping,
        since=low,
        until=high,
        scope=scope,
        rows=_sorted(rows, grouping),
        total=_total(rows),
        run=checked.run,
        thread=checked.thread,
    )


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
