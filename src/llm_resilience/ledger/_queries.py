"""The SQL ledger's reads for exploring spend: filtered pages of entries, and sums per group.

Both run inside one bounded operation of [`SqlCostLedger`][]
each; neither writes.

* `read_page`: entries oldest first, filtered by time, scope, model, kind, run and
  thread, at most
  ``limit`` of them after a keyset cursor on ``(timestamp, id)``, so a caller can walk a
  month of rows page by page without holding a connection (or an offset scan) between
  pages.
* `read_groups`: count, tokens and exact cost per day, month, model, kind, surface,
  scope, run or thread, grouped by the database. PostgreSQL adds ``NUMERIC`` costs exactly in
  ``SUM``. SQLite stores costs as decimal text and its ``SUM`` would add floats, so the
  query calls an aggregate registered on the connection (`_ExactSum`) that adds
  each group's costs as ``Decimal`` while SQLite groups the rows: exact, and no row
  leaves the database.
* `read_run_spend`: the exact cost of one agent run's (or thread's) entries, one ``SUM``
  over the partial index on ``run_id`` (``thread_id``), the same exact sums.

Day and month keys come from the timestamp column: on PostgreSQL ``to_char`` in the
session's time zone (the ledger sets UTC); on SQLite the first 10 or 7 characters of the
``YYYY-MM-DD HH:MM:SS.ffffff`` UTC text the ledger writes.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import ColumnElement, DateTime, Text, and_, case, func, or_, select, type_coerce
from sqlalchemy.engine import Connection

from llm_resilience.ledger._groups import GROUP_FIELDS, Grouping
from llm_resilience.ledger._protocol import LedgerEntry, RunColumn, exact_sum
from llm_resilience.ledger._schema import _as_stored, _ledger, _to_decimal

__all__ = ["Cursor", "GroupSums", "read_groups", "read_page", "read_run_spend"]

#: Where a page ended: the last row's raw timestamp (as the database returned it) and id.
Cursor = tuple[Any, int]
#: One group: key, exact cost, calls, input tokens, output tokens, estimated calls.
GroupSums = tuple[str | None, Decimal, int, int, int, int]
# Name of the exact-sum aggregate registered on SQLite connections.
_EXACT_SUM = "llm_resilience_exact_sum"
# Decimal places a recorded cost may have (LedgerEntry's bound), and 10 to that power.
_PLACES = 24
_SCALE = 10**_PLACES


class _ExactSum:
    """SQLite aggregate: the exact sum of decimal-text (or numeric) costs, as text.

    Plain decimal text (what the ledger writes) is added as an integer count of
    10**-24 units, about 4x faster than ``Decimal`` additions, and the result keeps the
    most decimal places of any input, as ``Decimal`` addition (and PostgreSQL's ``SUM``)
    does; anything else is added as ``Decimal``.
    """

    def __init__(self) -> None:
        self.units = 0
        self.places = 0
        self.other = Decimal(0)

    def step(self, value: object) -> None:
        if isinstance(value, str):
            whole, _, fraction = value.partition(".")
            if (
                len(fraction) <= _PLACES
                and whole.isdigit()
                and (fraction.isdigit() or not fraction)
            ):
                self.units += int(whole) * _SCALE + int(fraction.ljust(_PLACES, "0"))
                self.places = max(self.places, len(fraction))
                return
        self.other = exact_sum((self.other, _to_decimal(value)))

    def finalize(self) -> str:
        # Every input had at most ``places`` decimals, so the digits cut here are zeros.
        digits = str(self.units).rjust(_PLACES + 1, "0")
        whole, fraction = digits[:-_PLACES], digits[-_PLACES:][: self.places]
        total = Decimal(f"{whole}.{fraction}" if fraction else whole)
        return format(exact_sum((total, self.other)), "f")


def _raw_timestamp(postgres: bool) -> ColumnElement[Any]:
    """The timestamp column as the driver returns it, for exact keyset comparisons."""
    if postgres:
        return type_coerce(_ledger.c.timestamp, DateTime(timezone=True))
    return type_coerce(_ledger.c.timestamp, Text())


def _widened(bound: datetime, slack: timedelta) -> datetime | None:
    """``bound + slack``, or None (no bound in SQL) when that passes the last or first
    ``datetime``: every stored time is within the slack of such a bound, so only the exact
    filter applied in Python can cut there."""
    try:
        return bound + slack
    except OverflowError:
        return None


def _filters(
    low: datetime | None,
    high: datetime | None,
    *,
    scope: str | None,
    model: str | None,
    kind: str | None,
    slack: timedelta,
    run: str | None = None,
    thread: str | None = None,
) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    lower = None if low is None else _widened(low, -slack)
    upper = None if high is None else _widened(high, slack)
    if lower is not None:
        conditions.append(_ledger.c.timestamp >= lower)
    if upper is not None:
        conditions.append(_ledger.c.timestamp < upper)
    for column, value in (
        (_ledger.c.scope, scope),
        (_ledger.c.model, model),
        (_ledger.c.kind, kind),
        (_ledger.c.run_id, run),
        (_ledger.c.thread_id, thread),
    ):
        if value is not None:
            conditions.append(column == value)
    return conditions


def read_page(
    connection: Connection,
    low: datetime | None,
    high: datetime | None,
    *,
    scope: str | None,
    model: str | None,
    kind: str | None,
    after: Cursor | None,
    limit: int | None,
    postgres: bool,
    run: str | None = None,
    thread: str | None = None,
) -> tuple[list[LedgerEntry], Cursor | None]:
    """Entries with ``low <= timestamp < high`` and the given scope, model, kind, run and
    thread (None: any), ordered by ``(timestamp, id)``, after ``after``; at most ``limit``
    rows read.

    Returns the entries and the cursor to pass for the next page, None when this page was
    the last (or ``limit`` is None: everything in one read). On SQLite the time bounds
    get a day of slack in SQL and are applied exactly here,
    so a page may hold fewer entries than rows read; rows an older writer stored in
    another ISO 8601 form are still found, though in the text's order.
    """
    raw = _raw_timestamp(postgres)
    slack = timedelta(0) if postgres else timedelta(days=1)
    # After a cursor, the cursor is the only lower bound (it is past ``low`` already): given
    # two, SQLite may range-scan the index from the lower one, re-reading earlier pages.
    lower = low if after is None else None
    statement = select(_ledger, raw.label("raw_timestamp")).where(
        *_filters(
            lower, high, scope=scope, model=model, kind=kind, slack=slack, run=run, thread=thread
        )
    )
    if after is not None:
        stamp, last_id = after
        # The first condition alone lets the timestamp index bound the scan; the second
        # makes the cut exact between rows of the same timestamp.
        statement = statement.where(
            raw >= stamp, or_(raw > stamp, and_(raw == stamp, _ledger.c.id > last_id))
        )
    statement = statement.order_by(raw, _ledger.c.id)
    if limit is not None:
        statement = statement.limit(limit)
    rows = connection.execute(statement).all()
    found = [
        _as_stored(
            timestamp=row.timestamp,
            kind=row.kind or "unknown",
            input_tokens=row.input_tokens or 0,
            output_tokens=row.output_tokens or 0,
            cost=row.cost,
            pages=row.pages or 0,
            model=row.model or None,
            estimated=bool(row.estimated),
            surface=row.surface or None,
            scope=row.scope or None,
            entry_id=row.entry_id or None,
            cache_read_tokens=row.cache_read_tokens or 0,
            cache_write_tokens=row.cache_write_tokens or 0,
            cache_write_1h_tokens=row.cache_write_1h_tokens or 0,
            reasoning_tokens=row.reasoning_tokens or 0,
            run_id=row.run_id or None,
            thread_id=row.thread_id or None,
        )
        for row in rows
        if (low is None or row.timestamp >= low) and (high is None or row.timestamp < high)
    ]
    if limit is None or len(rows) < limit:
        return found, None
    return found, (rows[-1].raw_timestamp, rows[-1].id)


def _key(by: Grouping, postgres: bool) -> ColumnElement[Any]:
    if by in ("day", "month"):
        if postgres:
            pattern = "YYYY-MM-DD" if by == "day" else "YYYY-MM"
            return func.to_char(_ledger.c.timestamp, pattern)
        return func.substr(_raw_timestamp(False), 1, 10 if by == "day" else 7)
    column: ColumnElement[Any] = _ledger.c[GROUP_FIELDS[by]]
    return column


def _exact_cost_sum(connection: Connection, postgres: bool) -> ColumnElement[Any]:
    """``SUM(cost)``, exact: PostgreSQL's over ``NUMERIC``; on SQLite `_ExactSum`,
    registered on ``connection`` for it."""
    if postgres:
        return func.sum(_ledger.c.cost)
    driver: Any = connection.connection.driver_connection
    driver.create_aggregate(_EXACT_SUM, 1, _ExactSum)
    summed: ColumnElement[Any] = getattr(func, _EXACT_SUM)(type_coerce(_ledger.c.cost, Text()))
    return summed


def read_run_spend(
    connection: Connection, column: RunColumn, value: str, *, postgres: bool
) -> Decimal:
    """The exact cost of the entries whose ``column`` (``run_id`` or ``thread_id``) is
    ``value``: one aggregate over that column's index, however long the ledger is."""
    summed = _exact_cost_sum(connection, postgres)
    statement = select(type_coerce(summed, Text())).where(_ledger.c[column] == value)
    return _to_decimal(connection.execute(statement).scalar())


def read_groups(
    connection: Connection,
    by: Grouping,
    low: datetime | None,
    high: datetime | None,
    *,
    scope: str | None,
    postgres: bool,
    run: str | None = None,
    thread: str | None = None,
) -> list[GroupSums]:
    """Sums per ``by`` key of the entries with ``low <= timestamp < high`` (exact bounds
    in SQL: on SQLite, text comparisons, exact for the form the ledger writes) and
    ``scope``, ``run`` and ``thread`` (None: any), in no particular order. NULL and
    empty keys are one group, keyed None."""
    key = _key(by, postgres).label("key")
    cost = _exact_cost_sum(connection, postgres)
    statement = (
        select(
            key,
            type_coerce(cost, Text()).label("cost"),
            func.count().label("calls"),
            func.coalesce(func.sum(_ledger.c.input_tokens), 0).label("input_tokens"),
            func.coalesce(func.sum(_ledger.c.output_tokens), 0).label("output_tokens"),
            func.sum(case((_ledger.c.estimated, 1), else_=0)).label("estimated"),
        )
        .where(
            *_filters(
                low,
                high,
                scope=scope,
                model=None,
                kind=None,
                slack=timedelta(0),
                run=run,
                thread=thread,
            )
        )
        .group_by(key)
    )
    merged: dict[str | None, list[Any]] = {}
    for row in connection.execute(statement):
        name = row.key or None
        sums = [_to_decimal(row.cost), row.calls, row.input_tokens, row.output_tokens]
        sums.append(row.estimated or 0)
        if name in merged:  # NULL and '' both mean unknown
            old = merged[name]
            sums = [
                exact_sum((old[0], sums[0])),
                *(a + b for a, b in zip(old[1:], sums[1:], strict=True)),
            ]
        merged[name] = sums
    return [
        (name, sums[0], int(sums[1]), int(sums[2]), int(sums[3]), int(sums[4]))
        for name, sums in merged.items()
    ]
