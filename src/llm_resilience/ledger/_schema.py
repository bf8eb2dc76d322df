"""The SQL ledger's tables, its reads and SQLite writes, and the additive migration.

(PostgreSQL's write statements are in ``_postgres``.)

Three tables, created on first open:

* ``cost_ledger``: one row per entry. The first release's columns (``id``,
  ``timestamp``, ``kind``, ``input_tokens``, ``output_tokens``, ``cost``) then ``pages``,
  ``model``, ``estimated``, ``surface``, ``scope``, ``entry_id``, then the cache and
  reasoning counts (``cache_read_tokens``, ``cache_write_tokens``,
  ``cache_write_1h_tokens``, ``reasoning_tokens``: nullable, NULL in rows written before
  them, read as 0), then the agent run and thread each entry belongs to (``run_id``,
  ``thread_id``: text, NULL outside an agent run and in older rows, each indexed, so a
  run's or a thread's spend is one index range read); a table of an older shape
  gets the missing columns by ``ALTER TABLE ... ADD COLUMN``, in that order, every row
  kept, and its running totals built from its rows. ``entry_id`` (unique, NULL for rows
  written before it existed) makes every write idempotent: writing an entry twice stores
  it once and adds it to the totals once.
* ``cost_ledger_totals``: the running total of every UTC day and month, globally
  (scope ``''``) and per scope, updated with each insert, so a window's spend is read
  from one primary-key prefix (1 row on SQLite, at most 16 on PostgreSQL) however long
  the ledger grows: 0.2-0.6 ms against 200-300 ms for a ``SUM`` over a million rows.
* ``cost_ledger_reservations``: strict mode's live holds (a handful of rows).

Money is exact: PostgreSQL stores unconstrained ``NUMERIC``; SQLite, whose ``NUMERIC``
affinity would turn ``'0.3'`` into a float, stores decimal text. The one exception is
the ``cost`` column of a SQLite table the first release created: it keeps its
``NUMERIC`` affinity (SQLite cannot change a column's type in place), so each row's
cost there is exact to 15 significant digits; the running totals stay exact.
Timestamps are UTC: ``TIMESTAMP WITH TIME ZONE`` on PostgreSQL, ``YYYY-MM-DD
HH:MM:SS.ffffff`` text (which sorts in time order) on SQLite.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    Numeric,
    Table,
    Text,
    bindparam,
    false,
    inspect,
    select,
    text,
    union_all,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.expression import CompoundSelect, Executable, TextClause
from sqlalchemy.types import TypeDecorator

from llm_resilience.ledger._protocol import (
    DETAIL_COLUMNS,
    RUN_COLUMNS,
    WINDOWS,
    LedgerEntry,
    Window,
    exact_sum,
    window_bounds,
    window_key,
)
from llm_resilience.money import EXACT

__all__ = [
    "DECIMAL_ADD",
    "Money",
    "UtcTime",
    "spends_parameters",
    "spends_statement",
    "sum_slots",
    "GLOBAL_SCOPE",
    "POSTGRES_TOTALS_SHARDS",
    "Run",
    "driver_run",
    "holds",
    "insert_entry",
    "is_current",
    "migrate",
    "prepare_sqlite",
    "read_spend",
    "read_spends",
    "sqlite_insert",
    "sqlite_release",
    "sqlite_run",
    "sqlite_spend",
    "sqlite_spends",
    "sqlite_spends_expiring",
    "sqlite_time",
]

#: Scope column value of the global (all scopes) running totals.
GLOBAL_SCOPE = ""
#: Rows each PostgreSQL running total is spread over. A writer adds to one at random, so
#: concurrent writers rarely wait for each other's row lock (held until their commit's
#: fsync) and their commits can share a WAL flush; a read sums at most this many rows.
POSTGRES_TOTALS_SHARDS = 16
#: SQLite function the ledger registers on its connections: exact decimal-text addition.
DECIMAL_ADD = "llm_resilience_decimal_add"


def _to_decimal(value: object) -> Decimal:
    """A stored amount as ``Decimal``: text and PostgreSQL numerics exactly; the floats
    a first-release SQLite ``NUMERIC`` column holds via their shortest repr (exact for
    amounts of up to 15 significant digits)."""
    if value is None:
        return Decimal(0)
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, Decimal | int | str):
        return Decimal(value)
    raise TypeError(f"unreadable amount of type {type(value).__name__} in the cost ledger")


def _to_utc(value: object) -> datetime:
    """A stored timestamp as an aware UTC datetime; naive values are UTC by contract."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"unreadable timestamp {value!r} in the cost ledger") from None
    elif isinstance(value, int | float):
        moment = datetime.fromtimestamp(value, UTC)
    else:
        raise TypeError(f"unreadable timestamp of type {type(value).__name__} in the cost ledger")
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _utc_day(value: object) -> str:
    """``YYYY-MM-DD`` of a stored timestamp's UTC date; text without an offset (ours, and
    ``...Z``) is sliced, not parsed, which makes building totals from rows 3x faster."""
    if isinstance(value, str) and value[4:5] == value[7:8] == "-":
        tail = value[10:]
        if "+" not in tail and "-" not in tail:
            return value[:10]
    return _to_utc(value).date().isoformat()


class Money(TypeDecorator[Decimal]):
    """Exact money: unconstrained ``NUMERIC`` on PostgreSQL, decimal text on SQLite."""

    impl = Numeric  # for SQL arithmetic (``total + excluded.total``); SQLite gets Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(Text())
        return dialect.type_descriptor(Numeric(asdecimal=True))

    def process_bind_param(self, value: Decimal | None, dialect: Dialect) -> Any:
        if value is None or dialect.name != "sqlite":
            return value
        return format(value, "f")  # plain digits: '1E-7' would read as a float literal

    def process_result_value(self, value: Any, dialect: Dialect) -> Decimal:
        return _to_decimal(value)


class UtcTime(TypeDecorator[datetime]):
    """UTC instants: ``TIMESTAMP WITH TIME ZONE`` on PostgreSQL, sortable text on SQLite."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(Text())
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if dialect.name == "sqlite":
            return _sqlite_time(value)
        return value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime:
        return _to_utc(value)


_metadata = MetaData()
_ledger = Table(
    "cost_ledger",
    _metadata,
    # INTEGER PRIMARY KEY is SQLite's rowid alias; BIGSERIAL on PostgreSQL.
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("timestamp", UtcTime(), nullable=False),
    Column("kind", Text, nullable=False),
    Column("input_tokens", Integer, nullable=False),
    Column("output_tokens", Integer, nullable=False),
    Column("cost", Money(), nullable=False),
    Column("pages", Integer, nullable=False, server_default=text("0")),
    Column("model", Text),
    Column("estimated", Boolean(create_constraint=False), nullable=False, server_default=false()),
    Column("surface", Text),
    Column("scope", Text),
    # NULL in rows written before ids existed; a unique index allows any number of NULLs.
    Column("entry_id", Text),
    # Parts of the input and output counts; NULL in rows written before they existed.
    *(Column(name, Integer) for name in DETAIL_COLUMNS),
    # The agent run and thread of the entry; NULL outside a run and in older rows.
    *(Column(name, Text) for name in RUN_COLUMNS),
    Index("ix_cost_ledger_timestamp", "timestamp"),
    Index("ux_cost_ledger_entry_id", "entry_id", unique=True),
    # Partial: the rows of no run (most calls) cost these indexes nothing to write, and
    # ``run_id = :run`` implies the condition, so both databases read a run through them.
    *(
        Index(
            f"ix_cost_ledger_{name}",
            name,
            sqlite_where=text(f"{name} IS NOT NULL"),
            postgresql_where=text(f"{name} IS NOT NULL"),
        )
        for name in RUN_COLUMNS
    ),
)
_totals = Table(
    "cost_ledger_totals",
    _metadata,
    Column("window_key", Text, primary_key=True),  # "day:2026-11-29", "month:2026-11"
    Column("scope", Text, primary_key=True),  # GLOBAL_SCOPE for the global total
    # PostgreSQL spreads each total over POSTGRES_TOTALS_SHARDS rows (SQLite uses shard 0).
    Column("shard", Integer, primary_key=True),
    Column("total", Money(), nullable=False),
)
#: Strict mode's live holds.
holds = Table(
    "cost_ledger_reservations",
    _metadata,
    Column("id", Text, primary_key=True),
    Column("amount", Money(), nullable=False),
    Column("scope", Text),
    Column("timestamp", UtcTime(), nullable=False),
    Column("expires", UtcTime(), nullable=False),
    Index("ix_cost_ledger_reservations_expires", "expires"),
)

# Columns added since the first release, in the order a migration adds them. Each is
# nullable or has a default that is the truth for older rows (they billed no pages).
_ADDED_COLUMNS = (
    ("pages", "INTEGER NOT NULL DEFAULT 0"),
    ("model", "TEXT"),
    ("estimated", "BOOLEAN NOT NULL DEFAULT FALSE"),
    ("surface", "TEXT"),
    ("scope", "TEXT"),
    ("entry_id", "TEXT"),
    *((name, "INTEGER") for name in DETAIL_COLUMNS),
    *((name, "TEXT") for name in RUN_COLUMNS),
)
_INDEXES = {
    table.name: {index.name for index in table.indexes} for table in (_ledger, _totals, holds)
}


def _spend_statement(scoped: bool) -> CompoundSelect[Decimal]:
    """Running total plus live holds of one window, as one statement: one snapshot, so a
    concurrent ``settle`` (hold gone, entry in) is never seen half done."""
    live = select(holds.c.amount).where(
        holds.c.expires > bindparam("now"),
        holds.c.timestamp >= bindparam("start"),
        holds.c.timestamp < bindparam("end"),
    )
    if scoped:
        live = live.where(holds.c.scope == bindparam("scope"))
    total = select(_totals.c.total).where(
        _totals.c.window_key == bindparam("window_key"),
        _totals.c.scope == bindparam("totals_scope"),
    )
    return union_all(total, live)


_SPEND = {False: _spend_statement(False), True: _spend_statement(True)}
_TOTALS_KEY = [_totals.c.window_key, _totals.c.scope, _totals.c.shard]


_SQLITE_ADD = (
    "INSERT INTO cost_ledger_totals (window_key, scope, shard, total) VALUES (?, ?, 0, ?) "
    "ON CONFLICT (window_key, scope, shard) DO UPDATE SET "
    f"total = {DECIMAL_ADD}(cost_ledger_totals.total, excluded.total)"
)
_SQLITE_SPEND_TOTAL = (
    "SELECT total FROM cost_ledger_totals WHERE window_key = :window_key "
    "AND scope = :totals_scope UNION ALL SELECT amount FROM cost_ledger_reservations "
    'WHERE expires > :now AND "timestamp" >= :start AND "timestamp" < :end'
)
_SQLITE_SPEND = {False: _SQLITE_SPEND_TOTAL, True: _SQLITE_SPEND_TOTAL + " AND scope = :scope"}
_SQLITE_RELEASE = "DELETE FROM cost_ledger_reservations WHERE id = ?"

#: Runs one SQLite statement: ``run(statement, parameters)`` returns the cursor (a list of
#: parameter rows runs it once per row).
Run = Callable[[str, Any], Any]


def _sqlite_time(moment: datetime) -> str:
    """A UTC instant as `UtcTime` stores it on SQLite: ``YYYY-MM-DD
    HH:MM:SS.ffffff``, the year always four digits (``strftime("%Y")`` writes year 1 as
    ``1``, text that neither sorts nor parses back)."""
    if moment.tzinfo is UTC:  # the usual case: the same text, its second's part kept
        key = (moment.toordinal(), moment.hour, moment.minute, moment.second)
        second = _SECOND_TEXT.get(key)
        if second is None:
            if len(_SECOND_TEXT) >= 1024:
                _SECOND_TEXT.clear()
            second = _SECOND_TEXT[key] = moment.isoformat(" ", "seconds")[:-6]  # no +00:00
        return f"{second}.{moment.microsecond:06d}"
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


# `_sqlite_time`'s text up to the second, by (ordinal day, hour, minute, second): every
# call of a second shares it (formatting an aware datetime costs more than a lookup).
_SECOND_TEXT: dict[tuple[int, int, int, int], str] = {}


# Window bounds as SQLite text, by window key: a gate reads the same window all day.
_BOUNDS_TEXT: dict[str, tuple[str, str]] = {}


def _sqlite_bounds(window: Window, key: str, when: datetime) -> tuple[str, str]:
    """``window_bounds(window, when)`` as SQLite text; ``key`` is the window's key."""
    found = _BOUNDS_TEXT.get(key)
    if found is None:
        start, end = window_bounds(window, when)
        if len(_BOUNDS_TEXT) > 64:  # a long-lived process crosses many days
            _BOUNDS_TEXT.clear()
        found = _BOUNDS_TEXT[key] = (_sqlite_time(start), _sqlite_time(end))
    return found


def _decimal_add(total: object, amount: object) -> str:
    """SQLite function `DECIMAL_ADD`: the exact sum of two stored amounts, as the
    decimal text the ledger stores (SQLite's own ``+`` would add floats)."""
    if type(total) is str and type(amount) is str:  # what the ledger stores: decimal text
        return format(EXACT.add(Decimal(total), Decimal(amount)), "f")
    return format(exact_sum((_to_decimal(total), _to_decimal(amount))), "f")


def prepare_sqlite(driver: sqlite3.Connection) -> None:
    """Register the ledger's SQL functions on a new SQLite connection."""
    driver.create_function(DECIMAL_ADD, 2, _decimal_add, deterministic=True)


def driver_run(driver: sqlite3.Connection, statement: str, parameters: Any) -> Any:
    """``statement`` on SQLite's own cursor, inside ``driver``'s transaction (if any).

    A failure comes out as SQLAlchemy's error for it, its parameters hidden (a scope can
    be a user id), as from the ledger's engine. Returns a cursor (iterate it for rows;
    ``rowcount``).
    """
    try:
        if isinstance(parameters, list):
            return driver.executemany(statement, parameters)
        return driver.execute(statement, parameters)
    except sqlite3.Error as error:
        raise sa_exc.DBAPIError.instance(
            statement, parameters, error, sqlite3.Error, hide_parameters=True
        ) from error


def sqlite_run(connection: Connection, statement: str, parameters: Any) -> Any:
    """`driver_run` on ``connection``'s SQLite connection, in its transaction (if
    any). With ``echo`` on, the statement goes through SQLAlchemy instead, so it is
    logged like every other.

    SQLite's per-call statements run on the driver's own cursor: SQLAlchemy's work per
    statement (compiled-cache lookup, bind processing, result wrapping) is ~10x SQLite's
    own on these one-row statements. Values are bound as the column types above bind them.
    """
    if connection.engine.echo:
        return connection.exec_driver_sql(statement, parameters)
    driver: sqlite3.Connection = connection.connection.driver_connection  # type: ignore[assignment]
    return driver_run(driver, statement, parameters)


def _runner(connection: Connection) -> Run:
    return functools.partial(sqlite_run, connection)


def _totals_keys(when: datetime, scope: str | None) -> list[tuple[str, str]]:
    """The running totals an entry at ``when`` adds to, sorted: the order PostgreSQL
    writers lock them in."""
    scopes = (GLOBAL_SCOPE,) if scope is None else (GLOBAL_SCOPE, scope)
    return sorted((window_key(window, when), each) for window in WINDOWS for each in scopes)


def entry_columns(entry: LedgerEntry) -> dict[str, Any]:
    """``entry``'s values by column of ``cost_ledger`` (but ``id``), as the entry holds
    them: each backend's statement converts what its driver needs (SQLite: the
    timestamp's and the cost's text)."""
    return {
        "timestamp": entry.timestamp,
        "kind": entry.kind,
        "input_tokens": entry.input_tokens,
        "output_tokens": entry.output_tokens,
        "cost": entry.cost,
        "pages": entry.pages,
        "model": entry.model,
        "estimated": entry.estimated,
        "surface": entry.surface,
        "scope": entry.scope,
        "entry_id": entry.entry_id,
        "cache_read_tokens": entry.cache_read_tokens,
        "cache_write_tokens": entry.cache_write_tokens,
        "cache_write_1h_tokens": entry.cache_write_1h_tokens,
        "reasoning_tokens": entry.reasoning_tokens,
        "run_id": entry.run_id,
        "thread_id": entry.thread_id,
    }


def insert_entry(connection: Connection, entry: LedgerEntry) -> None:
    """Store ``entry`` on SQLite through ``connection`` and add its cost to its totals,
    unless its id is already stored (`sqlite_insert`; PostgreSQL's is in ``_postgres``)."""
    sqlite_insert(_runner(connection), entry)


def sqlite_insert(run: Run, entry: LedgerEntry) -> bool:
    """Store ``entry`` on SQLite and add its cost to its totals, unless its id is already
    stored: two statements, inside the caller's transaction. True if it was stored.

    The totals are added in SQL by `DECIMAL_ADD` (exact decimal text, the stored
    form every release reads), so no read of them is needed first.
    """
    cost = format(entry.cost, "f")
    if run(_SQLITE_INSERT, _sqlite_row(entry, cost)).rowcount == 0:
        return False  # written before (a write that failed late, or the same entry twice)
    # `_totals_keys`, written out: its sorted order, as tuples without a sort per call.
    day = window_key("day", entry.timestamp)
    month = window_key("month", entry.timestamp)
    scope = entry.scope
    if scope is None:
        run(_sqlite_add_rows(2), (day, GLOBAL_SCOPE, cost, month, GLOBAL_SCOPE, cost))
    else:
        day_rows = (day, GLOBAL_SCOPE, cost, day, scope, cost)
        run(_sqlite_add_rows(4), (*day_rows, month, GLOBAL_SCOPE, cost, month, scope, cost))
    return True


@functools.cache
def _sqlite_add_rows(count: int) -> str:
    """`_SQLITE_ADD` for ``count`` totals in one statement (one execution, not one per
    total), its parameters one tuple of every row's values."""
    rows = ", ".join(["(?, ?, 0, ?)"] * count)
    return _SQLITE_ADD.replace("(?, ?, 0, ?)", rows)


_ENTRY_COLUMNS = (
    '"timestamp", kind, input_tokens, output_tokens, cost, pages, model, estimated, '
    "surface, scope, entry_id, cache_read_tokens, cache_write_tokens, "
    "cache_write_1h_tokens, reasoning_tokens, run_id, thread_id"
)
_ENTRY_COLUMN_COUNT = _ENTRY_COLUMNS.count(",") + 1
#: ``INSERT ... RETURNING`` (which rows a batch stored) needs SQLite 3.35.
SQLITE_RETURNING = sqlite3.sqlite_version_info >= (3, 35)


_SQLITE_INSERT = (
    f"INSERT INTO cost_ledger ({_ENTRY_COLUMNS}) VALUES "
    f"({', '.join('?' * _ENTRY_COLUMN_COUNT)}) ON CONFLICT (entry_id) DO NOTHING"
)


def _sqlite_row(entry: LedgerEntry, cost: str) -> tuple[Any, ...]:
    """``entry``'s values in `_ENTRY_COLUMNS` order, as SQLite stores them (``cost`` is
    its cost's text)."""
    return (
        _sqlite_time(entry.timestamp),
        entry.kind,
        entry.input_tokens,
        entry.output_tokens,
        cost,
        entry.pages,
        entry.model,
        entry.estimated,
        entry.surface,
        entry.scope,
        entry.entry_id,
        entry.cache_read_tokens,
        entry.cache_write_tokens,
        entry.cache_write_1h_tokens,
        entry.reasoning_tokens,
        entry.run_id,
        entry.thread_id,
    )


@functools.cache
def _sqlite_insert_many(count: int) -> str:
    row = "(" + ", ".join("?" * _ENTRY_COLUMN_COUNT) + ")"
    return (
        f"INSERT INTO cost_ledger ({_ENTRY_COLUMNS}) VALUES {', '.join([row] * count)} "
        "ON CONFLICT (entry_id) DO NOTHING RETURNING entry_id"
    )


def sqlite_insert_many(run: Run, entries: Sequence[LedgerEntry]) -> None:
    """Store ``entries`` on SQLite and add their costs to their totals, skipping any whose
    id is already stored (or repeated): one ``INSERT`` for the rows, one upsert per
    total touched, inside the caller's transaction.

    `sqlite_insert` once per entry stores the same; this is for the write-behind
    batches, which it keeps from running SQL (and the decimal function) per entry. Every
    entry must have an ``entry_id``, and SQLite must have ``RETURNING``.
    """
    values: list[Any] = []
    for entry in entries:
        values += _sqlite_row(entry, format(entry.cost, "f"))
    statement = _sqlite_insert_many(len(entries))
    stored = {entry_id for (entry_id,) in run(statement, tuple(values))}
    # Costs by UTC day and scope first: a batch is mostly one day and a few scopes.
    costs: dict[tuple[datetime, str | None], list[Decimal]] = {}
    for entry in entries:
        if entry.entry_id not in stored:
            continue  # stored before, or a repeat within the batch
        stored.discard(entry.entry_id)
        day = entry.timestamp.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        costs.setdefault((day, entry.scope), []).append(entry.cost)
    totals: dict[tuple[str, str], list[Decimal]] = {}
    for (day, scope), amounts in costs.items():
        for key in _totals_keys(day, scope):
            totals.setdefault(key, []).extend(amounts)
    if totals:
        run(
            _SQLITE_ADD,
            [
                (key, each, format(exact_sum(costs), "f"))
                for (key, each), costs in sorted(totals.items())
            ],
        )


def sqlite_release(run: Run, hold_id: str) -> None:
    """Delete the hold ``hold_id`` on SQLite (nothing if it is gone already)."""
    run(_SQLITE_RELEASE, (hold_id,))


def read_spend(
    connection: Connection, window: Window, scope: str | None, when: datetime
) -> Decimal:
    """Stored spend of the ``window`` holding ``when``: running total plus live holds."""
    if connection.dialect.name == "sqlite":
        return sqlite_spend(_runner(connection), window, scope, when)
    start, end = window_bounds(window, when)
    parameters: dict[str, Any] = {
        "window_key": window_key(window, when),
        "totals_scope": GLOBAL_SCOPE if scope is None else scope,
        "now": when,
        "start": start,
        "end": end,
    }
    if scope is not None:
        parameters["scope"] = scope
    statement: Executable = _SPEND[scope is not None]
    return exact_sum(connection.execute(statement, parameters).scalars())


def sqlite_spend(run: Run, window: Window, scope: str | None, when: datetime) -> Decimal:
    """`read_spend` on SQLite, through ``run``."""
    key = window_key(window, when)
    start, end = _sqlite_bounds(window, key, when)
    parameters: dict[str, Any] = {
        "window_key": key,
        "totals_scope": GLOBAL_SCOPE if scope is None else scope,
        "now": _sqlite_time(when),
        "start": start,
        "end": end,
    }
    if scope is not None:
        parameters["scope"] = scope
    rows = run(_SQLITE_SPEND[scope is not None], parameters)
    return exact_sum(_to_decimal(total) for (total,) in rows)


@functools.cache
def spends_statement(scoped: tuple[bool, ...], *, expiring: bool = False) -> str:
    """Running totals plus live holds of several windows as one statement, each row
    tagged with its window's position: one round trip, one snapshot. ``expiring`` adds a
    third column (SQLite's read cache): each counted hold's expiry, NULL on a total."""
    total_expiry, hold_expiry = (", NULL AS expires", ", expires") if expiring else ("", "")
    parts: list[str] = []
    for slot, has_scope in enumerate(scoped):
        parts.append(
            f"SELECT {slot} AS slot, total AS amount{total_expiry} FROM cost_ledger_totals "
            f"WHERE window_key = :key{slot} AND scope = :totals_scope{slot}"
        )
        live = (
            f"SELECT {slot}, amount{hold_expiry} FROM cost_ledger_reservations "
            f'WHERE expires > :now AND "timestamp" >= :start{slot} AND "timestamp" < :end{slot}'
        )
        parts.append(live + (f" AND scope = :scope{slot}" if has_scope else ""))
    return " UNION ALL ".join(parts)


@functools.cache
def _postgres_spends(statement: str) -> TextClause:
    return text(statement)


def spends_parameters(
    windows: Sequence[tuple[Window, str | None]], when: datetime, *, sqlite: bool
) -> dict[str, Any]:
    parameters: dict[str, Any] = {"now": _sqlite_time(when) if sqlite else when}
    for slot, (window, scope) in enumerate(windows):
        key = window_key(window, when)
        start, end = _sqlite_bounds(window, key, when) if sqlite else window_bounds(window, when)
        parameters[f"key{slot}"] = key
        parameters[f"totals_scope{slot}"] = GLOBAL_SCOPE if scope is None else scope
        parameters[f"start{slot}"] = start
        parameters[f"end{slot}"] = end
        if scope is not None:
            parameters[f"scope{slot}"] = scope
    return parameters


def sum_slots(count: int, rows: Iterable[tuple[int, Any]]) -> list[Decimal]:
    amounts: list[list[Decimal]] = [[] for _ in range(count)]
    for slot, amount in rows:
        amounts[slot].append(_to_decimal(amount))
    return [exact_sum(each) for each in amounts]


def read_spends(
    connection: Connection, windows: Sequence[tuple[Window, str | None]], when: datetime
) -> list[Decimal]:
    """Stored spend of each ``(window, scope)`` holding ``when``, in order, read in one
    statement: what `read_spend` returns for each, from one snapshot."""
    if connection.dialect.name == "sqlite":
        return sqlite_spends(_runner(connection), windows, when)
    statement = spends_statement(tuple(scope is not None for _, scope in windows))
    parameters = spends_parameters(windows, when, sqlite=False)
    return sum_slots(len(windows), connection.execute(_postgres_spends(statement), parameters))


def sqlite_spends(
    run: Run, windows: Sequence[tuple[Window, str | None]], when: datetime
) -> list[Decimal]:
    """`read_spends` on SQLite, through ``run``."""
    statement = spends_statement(tuple(scope is not None for _, scope in windows))
    parameters = spends_parameters(windows, when, sqlite=True)
    return sum_slots(len(windows), run(statement, parameters))


def sqlite_spends_expiring(
    run: Run, windows: Sequence[tuple[Window, str | None]], when: datetime
) -> tuple[list[Decimal], str | None]:
    """`sqlite_spends`, and the earliest expiry (SQLite text) of the holds counted (None
    when none is): until then, and while nothing is committed, the answer stands."""
    statement = spends_statement(tuple(scope is not None for _, scope in windows), expiring=True)
    parameters = spends_parameters(windows, when, sqlite=True)
    amounts: list[list[Decimal]] = [[] for _ in windows]
    first: str | None = None
    for slot, amount, expires in run(statement, parameters):
        amounts[slot].append(_to_decimal(amount))
        if expires is not None and (first is None or expires < first):
            first = expires
    return [exact_sum(each) for each in amounts], first


def sqlite_time(moment: datetime) -> str:
    """A UTC instant as the SQLite ledger stores and compares it (``YYYY-MM-DD
    HH:MM:SS.ffffff``)."""
    return _sqlite_time(moment)


def _as_stored(**fields: Any) -> LedgerEntry:
    """An entry exactly as the database holds it, not checked again: a row written by an
    older release, before today's bounds (a longer scope, more decimal places), is read
    back rather than refused, and reading a million rows skips a million checks."""
    entry = object.__new__(LedgerEntry)
    for name, value in fields.items():
        object.__setattr__(entry, name, value)
    return entry


# -- schema -------------------------------------------------------------------------------


def is_current(connection: Connection) -> bool:
    """Whether every table, column and index exists and the totals are built: a few
    catalogue reads, so opening an up-to-date ledger takes no lock."""
    inspector = inspect(connection)
    if not set(_INDEXES) <= set(inspector.get_table_names()):
        return False
    present = {column["name"] for column in inspector.get_columns("cost_ledger")}
    if any(name not in present for name, _ in _ADDED_COLUMNS):
        return False
    for table, wanted in _INDEXES.items():
        if not wanted <= {index["name"] for index in inspector.get_indexes(table)}:
            return False
    return not _needs_totals(connection)


def _needs_totals(connection: Connection) -> bool:
    no_totals = connection.execute(select(_totals.c.window_key).limit(1)).first() is None
    return no_totals and connection.execute(select(_ledger.c.id).limit(1)).first() is not None


def migrate(connection: Connection, *, postgres: bool) -> None:
    """Create or migrate the tables. The caller holds the write lock, so concurrent
    openers take turns and each sees what the one before it did."""
    _metadata.create_all(connection)
    present = {column["name"] for column in inspect(connection).get_columns("cost_ledger")}
    for name, definition in _ADDED_COLUMNS:
        if name not in present:
            connection.exec_driver_sql(f"ALTER TABLE cost_ledger ADD COLUMN {name} {definition}")
    for index in (*_ledger.indexes, *holds.indexes):  # create_all skips existing tables
        index.create(connection, checkfirst=True)
    if _needs_totals(connection):
        _build_totals(connection, postgres=postgres)


def _build_totals(connection: Connection, *, postgres: bool) -> None:
    """Fill the empty totals table from every row (a first-release table's history).

    Rows are summed per UTC day and scope, days then into months. PostgreSQL sums
    exactly in SQL; SQLite's ``SUM`` would use floats, so its rows are added up here
    (about 7 s per million rows; PostgreSQL about 2 s).
    """
    days: dict[tuple[str, str | None], Decimal] = {}
    if postgres:
        per_day = text(
            """SELECT to_char("timestamp", 'YYYY-MM-DD'), scope, SUM(cost)"""
            " FROM cost_ledger GROUP BY 1, 2"
        )
        for day, scope, total in connection.execute(per_day):
            days[(day, scope)] = _to_decimal(total)
    else:
        rows = text('SELECT "timestamp", scope, cost FROM cost_ledger')
        for stamp, scope, cost in connection.execute(rows.execution_options(yield_per=10_000)):
            key = (_utc_day(stamp), scope)
            days[key] = exact_sum((days.get(key, Decimal(0)), _to_decimal(cost)))
    totals: dict[tuple[str, str], Decimal] = {}
    for (day, scope), total in days.items():
        for window in (f"day:{day}", f"month:{day[:7]}"):
            for each in (GLOBAL_SCOPE,) if not scope else (GLOBAL_SCOPE, scope):
                key = (window, each)
                totals[key] = exact_sum((totals.get(key, Decimal(0)), total))
    connection.execute(
        _totals.insert(),
        [
            {"window_key": key, "scope": scope, "shard": 0, "total": total}
            for (key, scope), total in totals.items()
        ],
    )
