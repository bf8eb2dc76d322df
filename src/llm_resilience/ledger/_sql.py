"""The persistent ledger: SQLite or PostgreSQL through SQLAlchemy.

Three tables, created on first open:

* ``cost_ledger``: one row per entry. The first release's columns (``id``,
  ``timestamp``, ``kind``, ``input_tokens``, ``output_tokens``, ``cost``) then ``pages``,
  ``model``, ``estimated``, ``surface``, ``scope``; a table of the first release's shape
  gets the new columns by ``ALTER TABLE ... ADD COLUMN``, in that order, every row kept,
  and its running totals built from its rows.
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

Concurrency: on SQLite every write is one transaction that takes the write lock up front
(``BEGIN IMMEDIATE``, WAL mode, 30 s busy timeout). On PostgreSQL a record is one
statement (insert the entry, add its cost to its totals); ``reserve`` and schema setup
serialise on a transaction-scoped advisory lock. Any number of processes may open,
write and migrate the same database at once.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
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
    create_engine,
    delete,
    event,
    false,
    inspect,
    select,
    text,
    union_all,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection, Dialect, Engine, make_url
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool
from sqlalchemy.sql.expression import CompoundSelect, Executable, TextClause
from sqlalchemy.types import TypeDecorator

from llm_resilience.ledger._protocol import (
    DEFAULT_RESERVATION_TTL,
    WINDOWS,
    LedgerEntry,
    Reservation,
    Window,
    check_amount,
    check_limits,
    check_now,
    check_scope,
    exact_sum,
    refusal,
    window_bounds,
    window_key,
)

__all__ = ["SqlCostLedger"]

#: How long a SQLite writer waits for another process's write lock before failing.
SQLITE_BUSY_TIMEOUT = timedelta(seconds=30)
#: How long a PostgreSQL statement waits for a lock held by another worker.
POSTGRES_LOCK_TIMEOUT = timedelta(seconds=30)
#: Scope column value of the global (all scopes) running totals.
GLOBAL_SCOPE = ""
#: Rows each PostgreSQL running total is spread over. A writer adds to one at random, so
#: concurrent writers rarely wait for each other's row lock (held until their commit's
#: fsync) and their commits can share a WAL flush; a read sums at most this many rows.
POSTGRES_TOTALS_SHARDS = 16
_TIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f"
# Execution option read by the SQLite "begin" hook: the statement that opens the transaction.
_BEGIN = "llm_resilience_begin"


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
    raise TypeError(f"unreadable amount {value!r} in the cost ledger")


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
        raise TypeError(f"unreadable timestamp {value!r} in the cost ledger")
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _utc_day(value: object) -> str:
    """``YYYY-MM-DD`` of a stored timestamp's UTC date; text without an offset (ours, and
    ``...Z``) is sliced, not parsed, which makes building totals from rows 3x faster."""
    if isinstance(value, str) and value[4:5] == value[7:8] == "-":
        tail = value[10:]
        if "+" not in tail and "-" not in tail:
            return value[:10]
    return f"{_to_utc(value):%Y-%m-%d}"


class _Money(TypeDecorator[Decimal]):
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


class _UtcTime(TypeDecorator[datetime]):
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
        moment = value.astimezone(UTC)
        return moment.strftime(_TIME_FORMAT) if dialect.name == "sqlite" else moment

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime:
        return _to_utc(value)


_metadata = MetaData()
_ledger = Table(
    "cost_ledger",
    _metadata,
    # INTEGER PRIMARY KEY is SQLite's rowid alias; BIGSERIAL on PostgreSQL.
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("timestamp", _UtcTime(), nullable=False),
    Column("kind", Text, nullable=False),
    Column("input_tokens", Integer, nullable=False),
    Column("output_tokens", Integer, nullable=False),
    Column("cost", _Money(), nullable=False),
    Column("pages", Integer, nullable=False, server_default=text("0")),
    Column("model", Text),
    Column("estimated", Boolean(create_constraint=False), nullable=False, server_default=false()),
    Column("surface", Text),
    Column("scope", Text),
    Index("ix_cost_ledger_timestamp", "timestamp"),
)
_totals = Table(
    "cost_ledger_totals",
    _metadata,
    Column("window_key", Text, primary_key=True),  # "day:2026-11-29", "month:2026-11"
    Column("scope", Text, primary_key=True),  # GLOBAL_SCOPE for the global total
    # PostgreSQL spreads each total over POSTGRES_TOTALS_SHARDS rows (SQLite uses shard 0).
    Column("shard", Integer, primary_key=True),
    Column("total", _Money(), nullable=False),
)
_holds = Table(
    "cost_ledger_reservations",
    _metadata,
    Column("id", Text, primary_key=True),
    Column("amount", _Money(), nullable=False),
    Column("scope", Text),
    Column("timestamp", _UtcTime(), nullable=False),
    Column("expires", _UtcTime(), nullable=False),
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
)


def _spend_statement(scoped: bool) -> CompoundSelect[Decimal]:
    """Running total plus live holds of one window, as one statement: one snapshot, so a
    concurrent ``settle`` (hold gone, entry in) is never seen half done."""
    holds = select(_holds.c.amount).where(
        _holds.c.expires > bindparam("now"),
        _holds.c.timestamp >= bindparam("start"),
        _holds.c.timestamp < bindparam("end"),
    )
    if scoped:
        holds = holds.where(_holds.c.scope == bindparam("scope"))
    total = select(_totals.c.total).where(
        _totals.c.window_key == bindparam("window_key"),
        _totals.c.scope == bindparam("totals_scope"),
    )
    return union_all(total, holds)


_SPEND = {False: _spend_statement(False), True: _spend_statement(True)}
_INSERT_ENTRY = _ledger.insert()
_TOTALS_KEY = [_totals.c.window_key, _totals.c.scope, _totals.c.shard]


def _postgres_record_statement(scoped: bool) -> TextClause:
    """Insert an entry and add its cost to its totals in one statement: one round trip,
    atomic without a transaction. Totals are locked in key order, so two writers never
    wait for each other in a cycle."""
    # '' is GLOBAL_SCOPE.
    totals = "(:day, ''), (:month, '')" + (", (:day, :scope), (:month, :scope)" if scoped else "")
    return text(
        f"""
        WITH entry AS (
            INSERT INTO cost_ledger ("timestamp", kind, input_tokens, output_tokens, cost,
                                     pages, model, estimated, surface, scope)
            VALUES (:timestamp, :kind, :input_tokens, :output_tokens, :cost,
                    :pages, :model, :estimated, :surface, :scope)
            RETURNING cost
        )
        INSERT INTO cost_ledger_totals (window_key, scope, shard, total)
        SELECT totals.window_key, totals.scope, :shard, entry.cost
        FROM entry CROSS JOIN (VALUES {totals}) AS totals (window_key, scope)
        ORDER BY totals.window_key, totals.scope
        ON CONFLICT (window_key, scope, shard)
        DO UPDATE SET total = cost_ledger_totals.total + EXCLUDED.total
        """
    ).bindparams(
        bindparam("timestamp", type_=_UtcTime()),
        bindparam("cost", type_=_Money()),
        bindparam("estimated", type_=Boolean()),
    )


_POSTGRES_RECORD = {
    False: _postgres_record_statement(False),
    True: _postgres_record_statement(True),
}
_replace = sqlite.insert(_totals)
_SQLITE_REPLACE = _replace.on_conflict_do_update(
    index_elements=_TOTALS_KEY, set_={"total": _replace.excluded.total}
)
_SQLITE_CURRENT = select(_totals.c.window_key, _totals.c.scope, _totals.c.total).where(
    _totals.c.window_key.in_([bindparam("day"), bindparam("month")]),
    _totals.c.scope.in_([bindparam("global"), bindparam("scope")]),
    _totals.c.shard == 0,
)


def _sqlite_connect(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
    # pysqlite would open transactions lazily and only before DML; we issue BEGIN
    # ourselves so reads are one snapshot and writers can take the lock up front.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT.total_seconds() * 1000)}")
    _enable_wal(cursor)
    cursor.execute("PRAGMA synchronous = NORMAL")  # WAL: durable on checkpoint, never corrupt
    cursor.close()


def _enable_wal(cursor: Any) -> None:
    """Put the database in WAL mode (readers never wait for the writer).

    SQLite answers this pragma with "database is locked" at once, without consulting
    the busy timeout, while another process switches the mode or checkpoints on close,
    which happens when many processes open one file together: retry for up to the busy
    timeout, every 5-50 ms.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT.total_seconds()
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                raise
            time.sleep(random.uniform(0.005, 0.05))


def _sqlite_begin(connection: Connection) -> None:
    statement = connection.get_execution_options().get(_BEGIN, "BEGIN")
    if statement is not None:
        connection.exec_driver_sql(statement)


def _postgres_connect(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
    # Session settings outside any transaction: UTC so a first-release column of type
    # TIMESTAMP WITHOUT TIME ZONE stores UTC, and a bound on lock waits.
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True
    cursor = dbapi_connection.cursor()
    cursor.execute("SET TIME ZONE 'UTC'")
    lock_ms = int(POSTGRES_LOCK_TIMEOUT.total_seconds() * 1000)
    cursor.execute(f"SET lock_timeout = {lock_ms}")
    cursor.close()
    dbapi_connection.autocommit = autocommit


class SqlCostLedger:
    """A ledger in a SQL database, shared by every process that opens it.

    >>> ledger = SqlCostLedger("sqlite:///spend.db")  # doctest: +SKIP
    >>> ledger = SqlCostLedger("postgresql+psycopg://app@db/app")  # doctest: +SKIP

    ``url`` is any SQLAlchemy URL of a SQLite or PostgreSQL database (``psycopg`` comes
    with the ``postgres`` extra); other databases raise ``ValueError``. Opening creates
    the tables, or migrates a table of the first release's shape in place (columns
    added, every row kept, totals built from the rows: about 7 s per million SQLite
    rows), safely while other processes open it too. Open one ledger per process, after
    any fork, and share it between that process's threads and wrappers.

    Failures raise, they are never swallowed (the budget gate turns them into warnings):
    opening raises if the database cannot be reached; a PostgreSQL server that does not
    answer fails a connection after ``connect_timeout`` seconds (5; libpq counts whole
    seconds, 2 at least), a lock held by another worker fails a statement after 30 s, as
    does a SQLite file another writer keeps locked.

    Measured on 2 cores with a million entries in the month (``benchmarks/bench_ledger.py``):
    :meth:`spend` p50 0.2-0.3 ms on SQLite and about 0.5 ms on PostgreSQL; 8 writer
    processes record 1,000-1,400 entries a second on either. Holds count toward spend
    for ``reservation_ttl`` (15 minutes) unless settled. ``echo=True`` logs the SQL
    (counts and money only). The async methods run the sync ones in a worker thread.
    """

    #: Spend survives restarts and is shared by every process opening the database.
    persistent = True

    def __init__(
        self,
        url: str = "sqlite:///spend.db",
        *,
        reservation_ttl: timedelta = DEFAULT_RESERVATION_TTL,
        echo: bool = False,
        connect_timeout: float = 5.0,
    ) -> None:
        if not isinstance(reservation_ttl, timedelta) or reservation_ttl <= timedelta(0):
            raise ValueError(
                f"reservation_ttl must be a positive timedelta, got {reservation_ttl!r}"
            )
        if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, int | float):
            raise TypeError(f"connect_timeout must be seconds > 0, got {connect_timeout!r}")
        if connect_timeout <= 0:
            raise ValueError(f"connect_timeout must be seconds > 0, got {connect_timeout!r}")
        #: How long an unsettled hold counts toward spend.
        self.reservation_ttl = reservation_ttl
        self._engine = self._create_engine(url, echo=echo, connect_timeout=connect_timeout)
        self._postgres = self._engine.dialect.name == "postgresql"
        # An in-memory SQLite database is one connection shared by every thread.
        self._guard: AbstractContextManager[object] = (
            threading.Lock() if isinstance(self._engine.pool, StaticPool) else nullcontext()
        )
        try:
            self._prepare()
        except BaseException:
            self._engine.dispose()
            raise

    @staticmethod
    def _create_engine(url: str, *, echo: bool, connect_timeout: float) -> Engine:
        parsed = make_url(url)
        backend = parsed.get_backend_name()
        if backend == "sqlite":
            memory = parsed.database in (None, "", ":memory:") or "memory" in str(
                parsed.query.get("mode", "")
            )
            engine = create_engine(
                parsed,
                echo=echo,
                connect_args={
                    "timeout": SQLITE_BUSY_TIMEOUT.total_seconds(),
                    "check_same_thread": False,
                },
                **({"poolclass": StaticPool} if memory else {}),
            )
            event.listen(engine, "connect", _sqlite_connect)
            event.listen(engine, "begin", _sqlite_begin)
            return engine
        if backend == "postgresql":
            connect_args: dict[str, Any] = {}
            if "connect_timeout" not in parsed.query:
                # libpq counts whole seconds and treats anything under 2 as 2.
                connect_args["connect_timeout"] = max(2, round(connect_timeout))
            engine = create_engine(parsed, echo=echo, connect_args=connect_args)
            event.listen(engine, "connect", _postgres_connect)
            return engine
        raise ValueError(
            f"SqlCostLedger supports SQLite and PostgreSQL URLs, got a {backend!r} URL"
        )

    def __repr__(self) -> str:
        return f"SqlCostLedger({self._engine.url.render_as_string(hide_password=True)!r})"

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self._engine.url.render_as_string(hide_password=True)

    # -- transactions -------------------------------------------------------------------

    @contextmanager
    def _single_statement(self) -> Iterator[Connection]:
        """A connection outside any transaction, for statements that are each atomic and
        one snapshot: reads, and PostgreSQL's one-statement record."""
        with self._guard, self._engine.connect() as connection:
            if self._postgres:
                connection.execution_options(isolation_level="AUTOCOMMIT")
            else:
                connection.execution_options(**{_BEGIN: None})
            yield connection

    @contextmanager
    def _write(self, *, exclusive: bool = False) -> Iterator[Connection]:
        """One transaction, committed on exit. SQLite takes the write lock at once;
        ``exclusive`` also serialises PostgreSQL writers on the ledger's advisory lock."""
        with self._guard, self._engine.connect() as connection:
            if not self._postgres:
                connection.execution_options(**{_BEGIN: "BEGIN IMMEDIATE"})
            with connection.begin():
                if exclusive and self._postgres:
                    connection.execute(
                        text(
                            "SELECT pg_advisory_xact_lock("
                            "hashtext('llm_resilience.cost_ledger:' || current_schema()))"
                        )
                    )
                yield connection

    # -- schema -------------------------------------------------------------------------

    def _prepare(self) -> None:
        """Create or migrate the tables, under the write lock so concurrent openers
        take turns and each sees what the one before it did."""
        with self._write(exclusive=True) as connection:
            _metadata.create_all(connection)
            present = {column["name"] for column in inspect(connection).get_columns("cost_ledger")}
            for name, definition in _ADDED_COLUMNS:
                if name not in present:
                    connection.exec_driver_sql(
                        f"ALTER TABLE cost_ledger ADD COLUMN {name} {definition}"
                    )
            for index in _ledger.indexes:  # create_all skips a table that already existed
                index.create(connection, checkfirst=True)
            no_totals = connection.execute(select(_totals.c.window_key).limit(1)).first() is None
            if no_totals and connection.execute(select(_ledger.c.id).limit(1)).first():
                self._build_totals(connection)

    def _build_totals(self, connection: Connection) -> None:
        """Fill the empty totals table from every row (a first-release table's history).

        Rows are summed per UTC day and scope, days then into months. PostgreSQL sums
        exactly in SQL; SQLite's ``SUM`` would use floats, so its rows are added up here
        (about 7 s per million rows; PostgreSQL about 2 s).
        """
        days: dict[tuple[str, str | None], Decimal] = {}
        if self._postgres:
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

    # -- writing ------------------------------------------------------------------------

    def _insert(self, connection: Connection, entry: LedgerEntry) -> None:
        fields = {
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
        }
        if self._postgres:
            fields["day"] = window_key("day", entry.timestamp)
            fields["month"] = window_key("month", entry.timestamp)
            fields["shard"] = random.randrange(POSTGRES_TOTALS_SHARDS)
            connection.execute(_POSTGRES_RECORD[entry.scope is not None], fields)
            return
        connection.execute(_INSERT_ENTRY, fields)
        keys = _totals_keys(entry.timestamp, entry.scope)
        # SQLite cannot add decimal text exactly; the write lock makes read-then-write safe.
        current: dict[tuple[str, str], Decimal] = {
            (key, scope): total
            for key, scope, total in connection.execute(
                _SQLITE_CURRENT,
                {
                    "day": window_key("day", entry.timestamp),
                    "month": window_key("month", entry.timestamp),
                    "global": GLOBAL_SCOPE,
                    "scope": GLOBAL_SCOPE if entry.scope is None else entry.scope,
                },
            )
        }
        connection.execute(
            _SQLITE_REPLACE,
            [
                {
                    "window_key": key,
                    "scope": scope,
                    "shard": 0,
                    "total": exact_sum((current.get((key, scope), Decimal(0)), entry.cost)),
                }
                for key, scope in keys
            ],
        )

    def record(self, entry: LedgerEntry) -> None:
        """Store ``entry`` and add its cost to its day's and month's totals, atomically."""
        if not isinstance(entry, LedgerEntry):
            raise TypeError(f"entry must be a LedgerEntry, got {entry!r}")
        # PostgreSQL: one statement, atomic on its own; SQLite: one write transaction.
        with self._single_statement() if self._postgres else self._write() as connection:
            self._insert(connection, entry)

    async def arecord(self, entry: LedgerEntry) -> None:
        """:meth:`record` in a worker thread."""
        await asyncio.to_thread(self.record, entry)

    def reserve(
        self,
        amount: Decimal,
        *,
        limits: Mapping[tuple[Window, str | None], Decimal],
        scope: str | None,
        now: datetime | None = None,
    ) -> Reservation:
        """Hold ``amount`` if every limit admits it, atomically across processes.

        Raises :class:`~llm_resilience.errors.BudgetExceededError` naming the first limit
        (in ``limits`` order) that ``spend + amount`` would exceed, holding nothing.
        """
        amount = check_amount(amount)
        checked = check_limits(limits)
        when = check_now(now)
        hold = Reservation(uuid.uuid4().hex, amount, check_scope(scope), when)
        with self._write(exclusive=True) as connection:
            # Holds dead both at ``now`` and on the real clock: a caller passing a past
            # ``now`` never deletes a hold that other callers still count.
            horizon = min(when, datetime.now(UTC))
            connection.execute(delete(_holds).where(_holds.c.expires <= horizon))
            for window, limit_scope, limit in checked:
                spent = self._spend(connection, window, limit_scope, when)
                error = refusal(window, limit_scope, limit, spent, amount)
                if error is not None:
                    raise error
            connection.execute(
                _holds.insert(),
                {
                    "id": hold.id,
                    "amount": amount,
                    "scope": hold.scope,
                    "timestamp": when,
                    "expires": when + self.reservation_ttl,
                },
            )
        return hold

    async def areserve(
        self,
        amount: Decimal,
        *,
        limits: Mapping[tuple[Window, str | None], Decimal],
        scope: str | None,
        now: datetime | None = None,
    ) -> Reservation:
        """:meth:`reserve` in a worker thread."""
        return await asyncio.to_thread(
            lambda: self.reserve(amount, limits=limits, scope=scope, now=now)
        )

    def settle(self, reservation: Reservation, entry: LedgerEntry | None) -> None:
        """Release ``reservation`` and record ``entry`` (if not None) in one transaction."""
        if entry is not None and not isinstance(entry, LedgerEntry):
            raise TypeError(f"entry must be a LedgerEntry or None, got {entry!r}")
        with self._write() as connection:
            connection.execute(delete(_holds).where(_holds.c.id == reservation.id))
            if entry is not None:
                self._insert(connection, entry)

    async def asettle(self, reservation: Reservation, entry: LedgerEntry | None) -> None:
        """:meth:`settle` in a worker thread."""
        await asyncio.to_thread(self.settle, reservation, entry)

    # -- reading ------------------------------------------------------------------------

    def _spend(
        self, connection: Connection, window: Window, scope: str | None, when: datetime
    ) -> Decimal:
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

    def spend(
        self, window: Window, *, scope: str | None = None, now: datetime | None = None
    ) -> Decimal:
        """Exact spend of the UTC ``window`` holding ``now``: the running total plus
        live holds, of ``scope`` only, or of every scope when ``scope`` is None."""
        when = check_now(now)
        scope = check_scope(scope)
        window_key(window, when)  # validates ``window`` before touching the database
        with self._single_statement() as connection:
            return self._spend(connection, window, scope, when)

    async def aspend(
        self, window: Window, *, scope: str | None = None, now: datetime | None = None
    ) -> Decimal:
        """:meth:`spend` in a worker thread."""
        return await asyncio.to_thread(lambda: self.spend(window, scope=scope, now=now))

    def entries(
        self, since: datetime | None = None, until: datetime | None = None
    ) -> list[LedgerEntry]:
        """Entries with ``since <= timestamp < until`` (either bound optional), oldest first."""
        low = None if since is None else check_now(since)
        high = None if until is None else check_now(until)
        # SQLite compares timestamps as text, exact for the format we write; a day of
        # slack, then an exact filter and sort here, keeps rows an older writer stored in
        # another ISO 8601 form ('T', an offset) in their true place.
        slack = timedelta(0) if self._postgres else timedelta(days=1)
        statement = select(_ledger).order_by(_ledger.c.timestamp, _ledger.c.id)
        if low is not None:
            statement = statement.where(_ledger.c.timestamp >= low - slack)
        if high is not None:
            statement = statement.where(_ledger.c.timestamp < high + slack)
        with self._single_statement() as connection:
            rows = connection.execute(statement).all()
        found = [
            LedgerEntry(
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
            )
            for row in rows
            if (low is None or row.timestamp >= low) and (high is None or row.timestamp < high)
        ]
        found.sort(key=lambda entry: entry.timestamp)  # stable: already sorted but for such rows
        return found

    def close(self) -> None:
        """Close the pooled connections; a later call opens new ones."""
        self._engine.dispose()


def _totals_keys(when: datetime, scope: str | None) -> list[tuple[str, str]]:
    """The running totals an entry at ``when`` adds to, sorted: the order PostgreSQL
    writers lock them in."""
    scopes = (GLOBAL_SCOPE,) if scope is None else (GLOBAL_SCOPE, scope)
    return sorted((window_key(window, when), each) for window in WINDOWS for each in scopes)
