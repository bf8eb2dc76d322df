"""The persistent ledger: SQLite or PostgreSQL through SQLAlchemy.

Tables, statements and migration are in :mod:`._schema`; deadlines in :mod:`._watchdog`
and :mod:`._connector`; the writes waiting for the database in :mod:`._pending`.

Concurrency: on SQLite every write is one transaction that takes the write lock up front
(``BEGIN IMMEDIATE``, WAL mode), and adds its cost to the running totals in SQL with an
exact decimal-text function registered on every connection (``_schema.DECIMAL_ADD``), so
the stored totals stay the decimal text every release reads. On a SQLite file the
per-call operations (``spend``, ``spends``, ``record``, ``settle``) run on ``sqlite3``
connections the ledger keeps itself (no pool checkout per call); everything else goes
through SQLAlchemy's pool. Both kinds are bounded alike. On PostgreSQL a record is one
statement (insert the entry, add its cost to its totals); ``reserve`` and schema changes
serialise on a transaction-scoped advisory lock. Any number of processes may open,
write and migrate the same database at once.

Time bounds (``T`` is ``operation_timeout``): every operation, from the moment it is
called, ends within ``T`` plus the watchdog's reaction (measured on 2 cores under each
fault of ``tests/core/test_ledger_faults.py``: at most 12 ms). Inside it, waiting
for a free connection, opening one, waiting for a lock, and every statement share that
one deadline. Past it the watchdog interrupts the connection in use (psycopg: its socket
is shut down; sqlite3: ``interrupt()``, and the busy timeout is set to what is left of
``T`` before each use) and the connection is discarded. PostgreSQL sessions also get
``lock_timeout``, ``statement_timeout`` and ``idle_in_transaction_session_timeout`` of
``T``, so the server lets go of an abandoned statement's locks too.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import math
import random
import sqlite3
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from sqlalchemy import create_engine, delete, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Connection, Dialect, Engine, make_url
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool

from llm_resilience import checks
from llm_resilience.errors import LedgerTimeoutError
from llm_resilience.ledger._behind import Flusher
from llm_resilience.ledger._connector import Connector
from llm_resilience.ledger._groups import Grouping, SpendRow
from llm_resilience.ledger._pending import DEFAULT_MAX_PENDING, PendingWrite, PendingWrites
from llm_resilience.ledger._protocol import (
    DEFAULT_RESERVATION_TTL,
    LedgerEntry,
    Reservation,
    SpendWindow,
    Window,
    check_amount,
    check_entry_filters,
    check_hold_scope,
    check_limits,
    check_now,
    check_scope,
    check_windows,
    exact_sum,
    refusal,
    window_key,
)
from llm_resilience.ledger._queries import Cursor, read_groups, read_page
from llm_resilience.ledger._schema import (
    SQLITE_RETURNING,
    Run,
    driver_run,
    holds,
    insert_entry,
    is_current,
    migrate,
    prepare_sqlite,
    read_spend,
    read_spends,
    sqlite_insert,
    sqlite_insert_many,
    sqlite_release,
    sqlite_run,
    sqlite_spend,
    sqlite_spends,
)
from llm_resilience.ledger._watchdog import Operation, Watchdog

__all__ = ["SqlCostLedger"]

logger = logging.getLogger(__name__)

#: Default bound on every ledger operation.
DEFAULT_OPERATION_TIMEOUT = timedelta(seconds=5)
#: Default bound on libpq's own connection attempt (whole seconds, 2 at least).
DEFAULT_CONNECT_TIMEOUT = timedelta(seconds=5)
#: The longest ``operation_timeout`` and ``connect_timeout`` accepted (a day).
MAX_OPERATION_TIMEOUT = checks.MAX_OPERATION_TIMEOUT
#: Bound on opening a ledger whose tables must be created or migrated, waiting for
#: another process's migration included: building the totals of a first-release table
#: takes about 7 s per million SQLite rows (2 s on PostgreSQL).
MIGRATION_TIMEOUT = timedelta(minutes=10)
#: Rows per page of :meth:`SqlCostLedger.iter_entries`.
DEFAULT_PAGE_SIZE = 1000
#: Pending writes stored per transaction when the database answers again.
FLUSH_BATCH = 100
#: The longest ``write_behind`` accepted: what a crash of the process may lose.
MAX_WRITE_BEHIND = timedelta(seconds=60)
# Write-behind: queued writes past which ``record`` stores the queue itself.
_BEHIND_LIMIT = 10 * FLUSH_BATCH
# Write-behind: distinct gate reads remembered (windows and scopes x day and month).
_MAX_CACHED_READS = 256
#: Connections pooled per ledger, and the extra ones it may open under load: at most
#: this many operations run at once, the others wait (within their deadline).
POOL_SIZE, MAX_OVERFLOW = 5, 10
# Execution option read by the SQLite "begin" hook: the statement that opens the transaction.
_BEGIN = "llm_resilience_begin"
# Connection info key: the busy timeout (ms) last set on a SQLite connection, and how
# far from the wanted value it may be before it is set again.
_BUSY_MS = "llm_resilience_busy_ms"
_BUSY_SLACK_MS = 20
_URL_FORMS = (
    "'sqlite:///path/to/spend.db' (a file), 'sqlite://' (in memory), "
    "'postgresql+psycopg://user@host/db' or 'postgresql://user@host/db'"
)
_DRIVERS = {
    "sqlite": "sqlite",
    "sqlite+pysqlite": "sqlite",
    "postgresql": "postgresql",
    "postgresql+psycopg": "postgresql",
}
_Result = TypeVar("_Result")

# Ledgers that may still hold pending writes when the process exits.
_live: weakref.WeakSet[SqlCostLedger] = weakref.WeakSet()


def _parse_url(url: object) -> URL:
    """``url`` as a SQLAlchemy URL of a supported database, driver set to ours."""
    if not isinstance(url, str):
        raise checks.OptionTypeError(
            f"url must be a database URL string: {_URL_FORMS}; got {type(url).__name__}"
        )
    try:
        parsed = make_url(url)
    except (sa_exc.ArgumentError, ValueError):
        # The text is not echoed: a malformed URL may still hold a password.
        raise ValueError(
            f"url must be a database URL: {_URL_FORMS}; got text that is not one"
        ) from None
    backend = _DRIVERS.get(parsed.drivername)
    if backend is None:
        raise ValueError(
            f"url must be a SQLite or PostgreSQL URL with SqlCostLedger's driver: {_URL_FORMS}; "
            f"got a {parsed.drivername!r} URL"
        )
    return parsed.set(drivername="postgresql+psycopg") if backend == "postgresql" else parsed


def _timed_out(error: BaseException) -> bool:
    """Whether ``error`` is one of the bounds ending a wait: the pool's, SQLite's busy
    timeout (set to the time left), an interrupt, or PostgreSQL's lock or statement
    timeout."""
    if isinstance(error, sa_exc.TimeoutError | LedgerTimeoutError):
        return True
    cause = getattr(error, "orig", None)
    code = getattr(cause, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_INTERRUPT)
    return getattr(cause, "sqlstate", None) in ("55P03", "57014")  # lock_timeout, canceled


def _unavailable(error: BaseException) -> bool:
    """Whether ``error`` says the database could not be reached or did not answer in
    time (so a write is kept for later), rather than that it refused this write."""
    return isinstance(
        error,
        LedgerTimeoutError
        | sa_exc.OperationalError
        | sa_exc.InterfaceError
        | sa_exc.DisconnectionError
        | sa_exc.TimeoutError
        | OSError,
    ) or (isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated)


def _sqlite_begin(connection: Connection) -> None:
    statement = connection.get_execution_options().get(_BEGIN, "BEGIN")
    if statement is not None:
        sqlite_run(connection, statement, ())


def _milliseconds(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _close_quietly(dbapi_connection: Any) -> None:
    dbapi_connection.close()


class SqlCostLedger:
    """A ledger in a SQL database, shared by every process that opens it.

    >>> ledger = SqlCostLedger("sqlite:///spend.db")  # doctest: +SKIP
    >>> ledger = SqlCostLedger("postgresql://app@db/app", operation_timeout=2)  # doctest: +SKIP

    ``url`` is ``sqlite:///path.db`` (a file), ``sqlite://`` (in memory, this process only),
    or ``postgresql+psycopg://user@host/db`` (``postgresql://`` means the same; psycopg comes
    with the ``postgres`` extra); anything else raises ``ValueError`` naming these forms.
    Opening creates the tables or migrates older ones in place (columns added, every row
    kept, totals built from the rows), safely while other processes open it too. Open one
    ledger per process, after any fork, and share it between that process's threads.

    Options (each checked on construction; a bad value raises ``ValueError`` naming it):

    * ``operation_timeout`` (seconds or ``timedelta``, default 5 s, at most a day): bounds
      every operation, measured on our side of the connection, so a database that stops
      answering, or a SQLite file another process keeps locked, holds no call longer.
      Past it the operation raises :class:`~llm_resilience.ledger.LedgerTimeoutError`
      naming the operation, and the connection it used is discarded. Opening is bounded
      by it too, except creating or migrating tables (10 minutes).
    * ``connect_timeout`` (default 5 s): libpq's own bound on a PostgreSQL connection
      attempt (whole seconds, 2 at least, per address the host resolves to). Operations
      never wait for it longer than ``operation_timeout``; it bounds the helper thread
      that opens the connection (at most two per ledger).
    * ``reservation_ttl`` (default 15 minutes): how long an unsettled strict-mode hold
      counts toward spend.
    * ``max_pending`` (default 10,000): writes kept in memory while the database fails.
    * ``write_behind`` (seconds or ``timedelta``, default None, at most 60 s): trade a
      little durability for speed. None: ``record`` returns once its entry is committed.
      Set: ``record`` queues the entry and returns; a thread of the ledger's commits the
      queue in batches at least this often (sooner once 100 wait), and :meth:`close` and
      the exit of the process store the rest. Gates in this process count queued entries
      at once; the stored part of a gate's read is reused for up to this long, so other
      processes' spend reaches this process's gate within it. A crash (``kill -9``, power
      loss) loses at most the entries of the last interval. Strict-mode holds and
      ``settle`` stay immediate, but another process's queued entries are not seen by
      this process's holds: a strict budget shared by several processes should not use it.
    * ``echo``: log the SQL; parameters are never logged nor put in exception messages
      (``hide_parameters``), since a scope can be a user id.

    A ``record`` or ``settle`` the database cannot take (down, locked, too slow) does not
    fail: the write waits in memory (:attr:`pending`), one WARNING names the error type,
    and it is written, once and in order, before the ledger's next operation, by
    :meth:`close`, or at process exit (what is still waiting then is logged with its count
    and money). Reads add the money still waiting to what the database says. When
    ``max_pending`` writes wait, the oldest is dropped and counted (:attr:`dropped`).
    ``spend``, ``reserve`` and ``entries`` raise on failure (the budget gate turns that
    into a warning).

    Measured on 2 cores with a million entries in the month (``benchmarks/bench_ledger.py``):
    :meth:`spend` p50 0.02-0.3 ms on SQLite and 0.2-0.5 ms on PostgreSQL, idle to loaded;
    :meth:`spends` of the four windows a scoped budget needs 0.06 ms on SQLite and 0.28
    ms on PostgreSQL; 8 writer processes record about 22,000 entries a second on SQLite
    and 5,000 on PostgreSQL (``docs/benchmarks.md``). The async methods run the sync ones
    in a worker thread, within the same bound counted from the call.
    """

    #: Spend survives restarts and is shared by every process opening the database.
    persistent = True

    def __init__(
        self,
        url: str = "sqlite:///spend.db",
        *,
        operation_timeout: float | timedelta = DEFAULT_OPERATION_TIMEOUT,
        connect_timeout: float | timedelta = DEFAULT_CONNECT_TIMEOUT,
        reservation_ttl: float | timedelta = DEFAULT_RESERVATION_TTL,
        max_pending: int = DEFAULT_MAX_PENDING,
        write_behind: float | timedelta | None = None,
        echo: bool = False,
    ) -> None:
        parsed = _parse_url(url)
        #: Bound on every operation.
        self.operation_timeout = checks.duration(
            "operation_timeout", operation_timeout, maximum=MAX_OPERATION_TIMEOUT
        )
        #: libpq's bound on one PostgreSQL connection attempt.
        self.connect_timeout = checks.duration(
            "connect_timeout", connect_timeout, maximum=MAX_OPERATION_TIMEOUT
        )
        #: How long an unsettled hold counts toward spend.
        self.reservation_ttl = checks.duration("reservation_ttl", reservation_ttl)
        checks.whole("max_pending", max_pending, minimum=1, maximum=checks.MAX_COUNT)
        #: How often queued records are committed; None: each before ``record`` returns.
        self.write_behind = _write_behind(write_behind)
        self._behind_seconds = (
            0.0 if self.write_behind is None else self.write_behind.total_seconds()
        )
        self._behind_failing = False
        # Past this many queued writes, ``record`` stores them itself: always below
        # ``max_pending``, so the queue never drops an entry while the database answers.
        self._behind_limit = max(1, min(_BEHIND_LIMIT, max_pending // 2))
        if not isinstance(echo, bool):
            raise checks.OptionTypeError(f"echo must be True or False, got {echo!r}")
        self._timeout = self.operation_timeout.total_seconds()
        self._postgres = parsed.get_backend_name() == "postgresql"
        self._memory = not self._postgres and (
            parsed.database in (None, "", ":memory:")
            or "memory" in str(parsed.query.get("mode", ""))
        )
        self._local = threading.local()
        # A SQLite file without echo: the per-call operations (spend, record, settle) run
        # on connections of the ledger's own (see _direct), the rest on SQLAlchemy's pool.
        self._direct = not self._postgres and not self._memory and not echo
        # Idle direct connections, each with the busy timeout (ms) last set on it.
        self._idle: list[tuple[sqlite3.Connection, int | None]] = []
        self._engine = self._create_engine(parsed, echo=echo)
        backend = "postgresql" if self._postgres else "sqlite"
        self._watchdog = Watchdog(backend)
        self._connector = Connector() if self._postgres else None
        self._pending = PendingWrites(max_pending, backend=backend)
        self._flushing = threading.Lock()
        # Bumped after every write this process makes, before the written entries leave
        # ``_pending``: a cached gate read taken under an older value is stale.
        self._generation = 0
        # Write-behind only: (windows, their keys) -> (stored amounts, read at, generation).
        self._stored: dict[tuple[Any, ...], tuple[tuple[Decimal, ...], float, int]] = {}
        # Write-behind: (windows, day) -> windows checked and their keys (see _plan).
        self._plans: dict[tuple[Any, ...], tuple[tuple[SpendWindow, ...], tuple[str, ...]]] = {}
        self._flusher = (
            None
            if self.write_behind is None
            else Flusher(
                self._flush_behind,
                interval=self.write_behind.total_seconds(),
                name=f"llm-resilience-ledger-writer-{id(self):x}",
            )
        )
        # An in-memory SQLite database is one connection shared by every thread.
        self._slots = threading.BoundedSemaphore(1 if self._memory else POOL_SIZE + MAX_OVERFLOW)
        try:
            self._open()
        except BaseException:
            self._watchdog.stop()
            self._engine.dispose()
            raise
        _live.add(self)
        # A ledger dropped without close() takes its watchdog thread with it (and its
        # writer, which holds it weakly, ends at its next wake-up).
        weakref.finalize(self, self._watchdog.stop).atexit = False

    def _create_engine(self, parsed: URL, *, echo: bool) -> Engine:
        options: dict[str, Any] = {"echo": echo, "hide_parameters": True}
        if not self._memory:
            options.update(
                pool_size=POOL_SIZE, max_overflow=MAX_OVERFLOW, pool_timeout=self._timeout
            )
        if self._postgres:
            if "connect_timeout" not in parsed.query:
                # libpq counts whole seconds and treats anything under 2 as 2.
                seconds = self.connect_timeout.total_seconds()
                options["connect_args"] = {"connect_timeout": max(2, math.ceil(seconds))}
            try:
                engine = create_engine(parsed, **options)
            except ImportError as error:
                raise ImportError(
                    "SqlCostLedger needs psycopg for PostgreSQL: "
                    "pip install 'llm-resilience[postgres]'"
                ) from error
            event.listen(engine, "connect", self._postgres_connect)
        else:
            options["connect_args"] = {"timeout": self._timeout, "check_same_thread": False}
            if self._memory:
                options["poolclass"] = StaticPool
            engine = create_engine(parsed, **options)
            event.listen(engine, "connect", self._sqlite_connect)
            event.listen(engine, "begin", _sqlite_begin)
        event.listen(engine, "do_connect", self._do_connect)
        event.listen(engine, "close", self._forget)
        event.listen(engine, "invalidate", self._forget_invalidated)
        return engine

    def __repr__(self) -> str:
        return f"SqlCostLedger({self.url!r})"

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self._engine.url.render_as_string(hide_password=True)

    @property
    def pending(self) -> int:
        """Writes waiting in memory for the database (0 when every write is stored)."""
        return len(self._pending)

    @property
    def dropped(self) -> int:
        """Pending writes given up since the ledger opened: the oldest, when more than
        ``max_pending`` waited, and any the database refused outright."""
        return self._pending.dropped

    # -- connections --------------------------------------------------------------------

    def _current(self) -> Operation | None:
        operation: Operation | None = getattr(self._local, "operation", None)
        return operation

    def _do_connect(
        self, dialect: Dialect, record: ConnectionPoolEntry, cargs: Any, cparams: Any
    ) -> Any:
        operation = self._current()
        if operation is None:
            return None  # not ours: let SQLAlchemy connect
        if self._connector is not None:
            connection = self._connector.connect(
                lambda: dialect.connect(*cargs, **cparams), _close_quietly, operation
            )
        else:
            connection = dialect.connect(*cargs, **cparams)
        operation.attach(connection)  # the session setup below is bounded too
        return connection

    def _forget(self, dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        operation = self._current()
        if operation is not None:
            operation.forget(dbapi_connection)

    def _forget_invalidated(
        self, dbapi_connection: Any, record: ConnectionPoolEntry, error: BaseException | None
    ) -> None:
        self._forget(dbapi_connection, record)

    def _sqlite_connect(self, dbapi_connection: Any, record: ConnectionPoolEntry | None) -> None:
        # pysqlite would open transactions lazily and only before DML; we issue BEGIN
        # ourselves so reads are one snapshot and writers can take the lock up front.
        dbapi_connection.isolation_level = None
        operation = self._current()
        deadline = operation.phase_deadline if operation else time.monotonic() + self._timeout
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {_milliseconds(deadline - time.monotonic())}")
        # SQLite answers this pragma with "database is locked" at once, without the busy
        # timeout, while another process switches the mode or checkpoints on close (many
        # processes opening one file together): retry every 5-50 ms until the deadline.
        while True:
            try:
                cursor.execute("PRAGMA journal_mode = WAL")  # readers never wait for writers
                break
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() >= deadline:
                    raise
                time.sleep(random.uniform(0.005, 0.05))
        cursor.execute("PRAGMA synchronous = NORMAL")  # WAL: durable on checkpoint, never corrupt
        cursor.close()
        prepare_sqlite(dbapi_connection)

    def _postgres_connect(self, dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        # Session settings outside any transaction: UTC, so a first-release column of type
        # TIMESTAMP WITHOUT TIME ZONE stores UTC; and the server's own bounds, so a
        # statement or transaction we abandoned does not keep its locks.
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        cursor.execute("SET TIME ZONE 'UTC'")
        bound = _milliseconds(self._timeout)
        for setting in (
            "lock_timeout",
            "statement_timeout",
            "idle_in_transaction_session_timeout",
        ):
            cursor.execute(f"SET {setting} = {bound}")
        cursor.close()
        dbapi_connection.autocommit = autocommit

    @contextmanager
    def _operation(
        self, name: str, started: float | None = None, bound: float | None = None
    ) -> Iterator[Operation]:
        """One bounded operation: a connection slot, and a deadline the watchdog keeps."""
        operation = Operation(
            self._watchdog,
            name,
            self._timeout if bound is None else bound,
            time.monotonic() if started is None else started,
        )
        try:
            if not self._slots.acquire(timeout=max(0.0, operation.remaining())):
                raise operation.timeout_error()
            self._local.operation = operation
            try:
                yield operation
            finally:
                self._local.operation = None
                self._slots.release()
        finally:
            operation.finish()

    @contextmanager
    def _connection(
        self, operation: Operation, *, transaction: bool = False
    ) -> Iterator[Connection]:
        """A connection for one step of ``operation``: outside any transaction (each
        statement atomic and one snapshot), or in one transaction committed on exit
        (SQLite takes the write lock at once). Interrupted past the deadline, then
        discarded, and the error becomes :class:`LedgerTimeoutError`."""
        if operation.expired():
            raise operation.timeout_error()
        interrupted = False
        try:
            with self._engine.connect() as connection:
                operation.attach(connection.connection.dbapi_connection)
                try:
                    if self._postgres and not transaction:
                        connection.execution_options(isolation_level="AUTOCOMMIT")
                    elif not self._postgres:
                        self._bound_lock_waits(connection, operation)
                        begin = "BEGIN IMMEDIATE" if transaction else None
                        connection.execution_options(**{_BEGIN: begin})
                    if transaction:
                        with connection.begin():
                            yield connection
                    else:
                        yield connection
                finally:
                    interrupted = operation.detach()
                    if interrupted and not self._memory and not connection.invalidated:
                        connection.invalidate()
        except Exception as error:
            # A connection being set up when the deadline passed is attached, not pooled.
            interrupted = operation.detach() or interrupted
            if isinstance(error, sa_exc.SQLAlchemyError | sqlite3.Error | OSError) and (
                interrupted or _timed_out(error)
            ):
                raise operation.timeout_error() from error
            raise

    @staticmethod
    def _bound_lock_waits(connection: Connection, operation: Operation) -> None:
        """End SQLite's lock waits (its busy timeout) with ``operation``'s deadline.

        ``interrupt()`` does not stop a busy wait, so the timeout itself must fit. It is
        left alone when already no longer than the time left and short of it by at most
        20 ms, which spares a statement in the common case (a fresh operation on a
        pooled connection).
        """
        wanted = _milliseconds(operation.remaining())
        info = connection.connection.info
        current = info.get(_BUSY_MS)
        if current is None or not wanted - _BUSY_SLACK_MS <= current <= wanted:
            driver: Any = connection.connection.driver_connection
            driver.execute(f"PRAGMA busy_timeout = {wanted}")
            info[_BUSY_MS] = wanted

    @contextmanager
    def _direct_connection(
        self, operation: Operation, *, transaction: bool = False
    ) -> Iterator[Run]:
        """:meth:`_connection` for the per-call operations on a SQLite file, on a
        ``sqlite3`` connection the ledger keeps itself: no pool checkout, no SQLAlchemy
        connection, transaction or event per call (with a read and a write per call,
        the sync SQLite stack of ``benchmarks/bench_stack.py`` went from about 570 to
        410 µs a call on 2 cores).

        The same bounds: the operation's deadline ends lock waits (the busy timeout) and
        the watchdog interrupts a statement still running past it; an interrupted
        connection, or one that failed, is closed instead of kept; a transaction takes
        the write lock up front (``BEGIN IMMEDIATE``) and is committed on exit, rolled
        back on an error. Errors come out as from the engine (SQLAlchemy's, parameters
        hidden), and :class:`LedgerTimeoutError` past the deadline.
        """
        if operation.expired():
            raise operation.timeout_error()
        try:
            driver, busy_ms = self._idle.pop()
        except IndexError:
            driver, busy_ms = None, None
        kept = False
        interrupted = False
        try:
            try:
                if driver is None:
                    driver = self._connect_direct(operation)
                else:
                    operation.attach(driver)
                busy_ms = self._bound_direct_waits(driver, busy_ms, operation)
                run: Run = functools.partial(driver_run, driver)
                if transaction:
                    run("BEGIN IMMEDIATE", ())
                    yield run
                    run("COMMIT", ())
                else:
                    yield run
            finally:
                interrupted = operation.detach()
            if not interrupted and len(self._idle) < POOL_SIZE:
                self._idle.append((driver, busy_ms))
                kept = True
        except Exception as error:
            interrupted = operation.detach() or interrupted
            if isinstance(error, sa_exc.SQLAlchemyError | sqlite3.Error | OSError) and (
                interrupted or _timed_out(error)
            ):
                raise operation.timeout_error() from error
            raise
        finally:
            if driver is not None and not kept:
                with suppress(Exception):  # closing rolls back an open transaction
                    driver.close()

    def _connect_direct(self, operation: Operation) -> sqlite3.Connection:
        """A new direct connection, set up as the engine sets up its own, within the
        operation's deadline."""
        cargs, cparams = self._engine.dialect.create_connect_args(self._engine.url)
        cparams.update(timeout=max(0.0, operation.remaining()), check_same_thread=False)
        try:
            driver: sqlite3.Connection = sqlite3.connect(*cargs, **cparams)  # type: ignore[call-overload]
        except sqlite3.Error as error:
            raise sa_exc.DBAPIError.instance(
                None, None, error, sqlite3.Error, hide_parameters=True
            ) from error
        try:
            operation.attach(driver)
            self._sqlite_connect(driver, None)
        except BaseException as error:
            interrupted = operation.detach()
            driver.close()
            if isinstance(error, sqlite3.Error):
                if interrupted:
                    raise operation.timeout_error() from error
                raise sa_exc.DBAPIError.instance(
                    None, None, error, sqlite3.Error, hide_parameters=True
                ) from error
            raise
        return driver

    @staticmethod
    def _bound_direct_waits(
        driver: sqlite3.Connection, current: int | None, operation: Operation
    ) -> int:
        """:meth:`_bound_lock_waits` for a direct connection; returns the timeout set."""
        wanted = _milliseconds(operation.remaining())
        if current is None or not wanted - _BUSY_SLACK_MS <= current <= wanted:
            driver_run(driver, f"PRAGMA busy_timeout = {wanted}", ())
            return wanted
        return current

    def _close_direct(self) -> None:
        while self._idle:
            driver, _ = self._idle.pop()
            with suppress(Exception):
                driver.close()

    def _lock_ledger(self, connection: Connection) -> None:
        """Serialise PostgreSQL writers that read then write (reserve, migration) on one
        transaction-scoped advisory lock; SQLite's ``BEGIN IMMEDIATE`` already does."""
        if self._postgres:
            connection.exec_driver_sql(
                "SELECT pg_advisory_xact_lock("
                "hashtext('llm_resilience.cost_ledger:' || current_schema()))"
            )

    # -- schema -------------------------------------------------------------------------

    def _open(self) -> None:
        """Check the schema (a few catalogue reads, no lock); create or migrate it under
        the write lock only when something is missing."""
        with self._operation("open") as operation:
            with self._connection(operation) as connection:
                if is_current(connection):
                    return
            operation.extend(MIGRATION_TIMEOUT.total_seconds())
            with self._connection(operation, transaction=True) as connection:
                if self._postgres:
                    bound = _milliseconds(MIGRATION_TIMEOUT.total_seconds())
                    connection.exec_driver_sql(f"SET LOCAL lock_timeout = {bound}")
                    connection.exec_driver_sql(f"SET LOCAL statement_timeout = {bound}")
                self._lock_ledger(connection)
                migrate(connection, postgres=self._postgres)

    # -- writing ------------------------------------------------------------------------

    def _apply(self, operation: Operation, writes: Sequence[PendingWrite]) -> None:
        """Store ``writes`` in order, in one transaction (a lone PostgreSQL record: one
        statement). Entries already stored (same ``entry_id``) are skipped."""
        if self._postgres and len(writes) == 1 and writes[0].hold_id is None:
            with self._connection(operation) as connection:
                assert writes[0].entry is not None
                insert_entry(connection, writes[0].entry, postgres=True)
            return
        if self._direct:
            with self._direct_connection(operation, transaction=True) as run:
                entries = [w.entry for w in writes if w.hold_id is None and w.entry is not None]
                batch = SQLITE_RETURNING and 1 < len(entries) == len(writes)
                if batch and all(entry.entry_id for entry in entries):
                    sqlite_insert_many(run, entries)  # a batch of records: one INSERT
                    return
                for write in writes:
                    if write.hold_id is not None:
                        sqlite_release(run, write.hold_id)
                    if write.entry is not None:
                        sqlite_insert(run, write.entry)
            return
        with self._connection(operation, transaction=True) as connection:
            for write in writes:
                if write.hold_id is not None:
                    connection.execute(delete(holds).where(holds.c.id == write.hold_id))
                if write.entry is not None:
                    insert_entry(connection, write.entry, postgres=self._postgres)

    def _flush(self, operation: Operation, until: float, *, wait: bool = False) -> None:
        """Store pending writes, oldest first, until none is left or ``until`` is near.

        Raises the failure that stopped it (the writes stay pending). A write the
        database refuses outright (not a failure to answer) is dropped, counted and
        logged, so it cannot block the ones behind it. Does nothing while another thread
        is storing them (or, with ``wait``, until it is done, within the operation).
        """
        if not len(self._pending):
            return
        if not self._flushing.acquire(timeout=max(0.0, operation.remaining()) if wait else -1):
            return
        try:
            with operation.phase(until):
                stored = False
                while batch := self._pending.oldest(FLUSH_BATCH):
                    if stored and operation.remaining() < operation.bound / 4:
                        return  # the rest waits for the next operation, not past our bound
                    try:
                        self._apply(operation, batch)
                    except Exception as error:
                        if _unavailable(error) or not isinstance(error, sa_exc.SQLAlchemyError):
                            raise
                        self._apply_one_by_one(operation, batch)
                    else:
                        self._generation += 1
                        self._pending.written(batch)
                    stored = True
        finally:
            self._flushing.release()

    def _apply_one_by_one(self, operation: Operation, batch: Sequence[PendingWrite]) -> None:
        for write in batch:
            try:
                self._apply(operation, [write])
            except Exception as error:
                if _unavailable(error) or not isinstance(error, sa_exc.SQLAlchemyError):
                    raise
                self._pending.refused(write)
                logger.error(
                    "%r dropped a pending %s that the database refused (%s); %d dropped so far.",
                    self,
                    "record" if write.hold_id is None else "settle",
                    type(error).__name__,
                    self._pending.dropped,
                )
            else:
                self._generation += 1
                self._pending.written([write])

    def _write(self, name: str, write: PendingWrite, started: float | None) -> None:
        """Store ``write`` now, or keep it pending if the database does not take it."""
        with ExitStack() as stack:
            try:
                operation = stack.enter_context(self._operation(name, started))
            except LedgerTimeoutError as error:  # not even a connection slot in time
                self._keep(name, write, error)
                return
            if not len(self._pending):
                try:
                    self._apply(operation, [write])
                    self._generation += 1
                    return
                except Exception as error:
                    if not _unavailable(error):
                        raise
                    self._keep(name, write, error)
                    return
            # Behind writes already waiting, so that they reach the database in order.
            dropped = self._pending.push(write.entry, write.hold_id)
            try:
                self._flush(operation, operation.deadline)
            except Exception as error:
                if not _unavailable(error):
                    raise
                self._warn_kept(name, error, dropped)
                return
            if dropped:
                self._warn_kept(name, None, dropped)

    def _keep(self, name: str, write: PendingWrite, error: BaseException) -> None:
        self._warn_kept(name, error, self._pending.push(write.entry, write.hold_id))

    def _warn_kept(self, name: str, error: BaseException | None, dropped: bool) -> None:
        """One WARNING for a write that waits: the error's type only, never its text
        (which could quote the database's view of the row)."""
        full = (
            f" The queue was full: its oldest write was dropped "
            f"({self._pending.dropped} dropped so far)."
            if dropped
            else ""
        )
        if error is None:
            logger.warning("%r keeps writes waiting for the database.%s", self, full)
            return
        logger.warning(
            "%r could not %s (%s); the write waits in memory (%d pending) and is stored "
            "once the database answers.%s",
            self,
            name,
            type(error).__name__,
            len(self._pending),
            full,
        )

    def record(self, entry: LedgerEntry) -> None:
        """Store ``entry`` and add its cost to its day's and month's totals, atomically.

        If the database does not take it within ``operation_timeout``, the entry waits
        in memory (see :attr:`pending`) and this returns normally.
        """
        if not isinstance(entry, LedgerEntry):
            raise TypeError(f"entry must be a LedgerEntry, got {type(entry).__name__}")
        if self._flusher is not None:
            self._queue(entry)
            return
        self._write("record", PendingWrite(entry), None)

    async def arecord(self, entry: LedgerEntry) -> None:
        """:meth:`record` in a worker thread, bounded from this call."""
        if not isinstance(entry, LedgerEntry):
            raise TypeError(f"entry must be a LedgerEntry, got {type(entry).__name__}")
        if self._flusher is not None:
            self._queue(entry)  # a lock held for a few µs: no thread needed
            return
        await asyncio.to_thread(self._write, "record", PendingWrite(entry), time.monotonic())

    def _queue(self, entry: LedgerEntry) -> None:
        """Write-behind: queue ``entry`` for the writer thread."""
        assert self._flusher is not None
        if self._pending.push(entry, None):
            self._warn_kept("record", None, True)
        waiting = len(self._pending)
        if waiting >= self._behind_limit:
            # The writer thread falls behind: this caller stores the queue itself, so
            # that writing faster than the database takes never drops an entry.
            self._flush_behind(wait=True)
        elif waiting >= FLUSH_BATCH:
            self._flusher.wake()
        else:
            self._flusher.start()

    def _flush_behind(self, *, wait: bool = False) -> None:
        """The writer thread's work: store the queue, oldest first, in batches (with
        ``wait``, after the storing already under way, if any)."""
        if not len(self._pending):
            return
        with self._operation("write") as operation:
            try:
                self._flush(operation, operation.deadline, wait=wait)
            except Exception as error:
                if not _unavailable(error):
                    raise
                # Kept, and counted by every read, until the database answers: one
                # WARNING per outage, not one per interval.
                if not self._behind_failing:
                    self._warn_kept("store queued writes", error, False)
                self._behind_failing = True
            else:
                self._behind_failing = False

    def settle(self, reservation: Reservation, entry: LedgerEntry | None) -> None:
        """Release ``reservation`` and record ``entry`` (if not None) in one transaction.

        If the database does not take it, both wait in memory together and are written
        in one transaction later, so the hold never counts beside its entry.
        """
        self._write("settle", _settlement(reservation, entry), None)

    async def asettle(self, reservation: Reservation, entry: LedgerEntry | None) -> None:
        """:meth:`settle` in a worker thread, bounded from this call."""
        write = _settlement(reservation, entry)
        await asyncio.to_thread(self._write, "settle", write, time.monotonic())

    # -- reading ------------------------------------------------------------------------

    def _read(
        self,
        name: str,
        started: float | None,
        read: Callable[[Operation], _Result],
        *,
        flush: bool = True,
    ) -> _Result:
        """Run ``read`` after storing pending writes for at most half the bound (unless
        ``flush`` is False: a write-behind gate leaves that to the writer thread)."""
        with self._operation(name, started) as operation:
            if flush and len(self._pending):
                try:
                    self._flush(operation, operation.started + operation.bound / 2)
                except Exception as error:
                    if not _unavailable(error):
                        raise
                    # Already reported when kept; the read below counts them anyway.
            return read(operation)

    def _spend(
        self, window: Window, scope: str | None, now: datetime | None, started: float | None
    ) -> Decimal:
        if self._flusher is not None:
            return self._spends([(window, scope)], now, started)[0]
        when = check_now(now)
        scope = check_scope(scope)
        key = window_key(window, when)  # validates ``window`` before touching the database

        def read(operation: Operation) -> Decimal:
            # Pending first: a write stored meanwhile is then counted twice, never missed.
            waiting = self._pending.unwritten_cost(key, scope)
            if self._direct:
                with self._direct_connection(operation) as run:
                    return exact_sum((sqlite_spend(run, window, scope, when), waiting))
            with self._connection(operation) as connection:
                return exact_sum((read_spend(connection, window, scope, when), waiting))

        return self._read("spend", started, read)

    def spend(
        self, window: Window, *, scope: str | None = None, now: datetime | None = None
    ) -> Decimal:
        """Exact spend of the UTC ``window`` holding ``now``: the running total plus live
        holds plus pending writes, of ``scope`` only, or of every scope when None."""
        return self._spend(window, scope, now, None)

    async def aspend(
        self, window: Window, *, scope: str | None = None, now: datetime | None = None
    ) -> Decimal:
        """:meth:`spend` in a worker thread, bounded from this call (with
        ``write_behind``, on the event loop when the last read is still good)."""
        if self._flusher is not None:
            at_once = self._spends_at_once([(window, scope)], now)
            if at_once is not None:
                return at_once[0]
        return await asyncio.to_thread(self._spend, window, scope, now, time.monotonic())

    def _spends(
        self, windows: Sequence[SpendWindow], now: datetime | None, started: float | None
    ) -> tuple[Decimal, ...]:
        when = check_now(now)
        checked, keys = self._plan(windows, when)
        if not checked:
            return ()

        def read_stored(operation: Operation) -> tuple[Decimal, ...]:
            if self._direct:
                with self._direct_connection(operation) as run:
                    return tuple(sqlite_spends(run, checked, when))
            with self._connection(operation) as connection:
                return tuple(read_spends(connection, checked, when))

        def read(operation: Operation) -> tuple[Decimal, ...]:
            # Pending first: a write stored meanwhile is then counted twice, never missed.
            waiting = [
                self._pending.unwritten_cost(key, scope)
                for key, (_, scope) in zip(keys, checked, strict=True)
            ]
            stored = read_stored(operation)
            return tuple(exact_sum(pair) for pair in zip(stored, waiting, strict=True))

        if self._flusher is None:
            return self._read("spend", started, read)
        # Write-behind: the stored part is reused while no write of this process has
        # landed since and it is younger than the interval; the queue is added each time.
        cache_key = (checked, keys)
        waiting = self._waiting(checked, keys)
        generation = self._generation  # read after the queue: see ``_flush``
        fresh = time.monotonic()
        stored = self._cached(cache_key, generation, fresh)
        if stored is None:
            stored = self._read("spend", started, read_stored, flush=False)
            if len(self._stored) >= _MAX_CACHED_READS:
                self._stored.clear()
            self._stored[cache_key] = (stored, fresh, generation)
        return tuple(exact_sum(pair) for pair in zip(stored, waiting, strict=True))

    def _plan(
        self, windows: Sequence[SpendWindow], when: datetime
    ) -> tuple[tuple[SpendWindow, ...], tuple[str, ...]]:
        """``windows`` checked, and the key of each at ``when``. With write-behind the
        answer is remembered per ``windows`` and day: a gate asks the same all day."""
        memo: tuple[Any, ...] | None = None
        if self._flusher is not None and type(windows) in (list, tuple):
            try:
                memo = (tuple(windows), when.year, when.month, when.day)
                known = self._plans.get(memo)
            except TypeError:  # an unhashable pair: checked (and refused) below
                memo = known = None
            if known is not None:
                return known
        checked = tuple(check_windows(windows))
        plan = checked, tuple(window_key(window, when) for window, _ in checked)
        if memo is not None:
            if len(self._plans) >= _MAX_CACHED_READS:
                self._plans.clear()
            self._plans[memo] = plan
        return plan

    def _waiting(self, checked: Sequence[SpendWindow], keys: Sequence[str]) -> list[Decimal]:
        return self._pending.unwritten_costs(
            [(key, scope) for key, (_, scope) in zip(keys, checked, strict=True)]
        )

    def _cached(
        self, cache_key: tuple[Any, ...], generation: int, now: float
    ) -> tuple[Decimal, ...] | None:
        """Write-behind: the stored part of a gate read, if still good."""
        cached = self._stored.get(cache_key)
        if cached is None or cached[2] != generation or now - cached[1] >= self._behind_seconds:
            return None
        return cached[0]

    def _spends_at_once(
        self, windows: Sequence[SpendWindow], now: datetime | None
    ) -> tuple[Decimal, ...] | None:
        """Write-behind: :meth:`spends` when it needs no database (a fresh cached read),
        else None. For the async gate, which then needs no worker thread."""
        checked, keys = self._plan(windows, check_now(now))
        waiting = self._waiting(checked, keys)
        stored = self._cached((checked, keys), self._generation, time.monotonic())
        if stored is None:
            return None
        return tuple(exact_sum(pair) for pair in zip(stored, waiting, strict=True))

    def spends(
        self, windows: Sequence[SpendWindow], *, now: datetime | None = None
    ) -> tuple[Decimal, ...]:
        """The spend of each ``(window, scope)`` pair at ``now``, in order: what
        :meth:`spend` returns for each, read in one bounded operation and one statement
        (one round trip, one snapshot). The budget gate reads its day and month, scope
        and global, through this.

        >>> ledger.spends([("day", "tenant-1"), ("month", None)])  # doctest: +SKIP
        (Decimal('0.42'), Decimal('17.3'))
        """
        return self._spends(windows, now, None)

    async def aspends(
        self, windows: Sequence[SpendWindow], *, now: datetime | None = None
    ) -> tuple[Decimal, ...]:
        """:meth:`spends` in a worker thread, bounded from this call (with
        ``write_behind``, on the event loop when the last read is still good)."""
        if self._flusher is not None:
            at_once = self._spends_at_once(windows, now)
            if at_once is not None:
                return at_once
        return await asyncio.to_thread(self._spends, windows, now, time.monotonic())

    def _reserve(
        self,
        amount: Decimal,
        limits: Mapping[tuple[Window, str | None], Decimal],
        scope: str | None,
        now: datetime | None,
        started: float | None,
    ) -> Reservation:
        amount = check_amount(amount)
        checked = check_limits(limits)
        when = check_now(now)
        hold = Reservation(uuid.uuid4().hex, amount, check_hold_scope(limits, scope), when)

        def reserve(operation: Operation) -> Reservation:
            with self._connection(operation, transaction=True) as connection:
                self._lock_ledger(connection)
                # Holds dead both at ``now`` and on the real clock: a caller passing a past
                # ``now`` never deletes a hold that other callers still count.
                horizon = min(when, datetime.now(UTC))
                connection.execute(delete(holds).where(holds.c.expires <= horizon))
                for window, limit_scope, limit in checked:
                    waiting = self._pending.unwritten_cost(window_key(window, when), limit_scope)
                    stored = read_spend(connection, window, limit_scope, when)
                    error = refusal(
                        window, limit_scope, limit, exact_sum((stored, waiting)), amount
                    )
                    if error is not None:
                        raise error
                connection.execute(
                    holds.insert(),
                    {
                        "id": hold.id,
                        "amount": amount,
                        "scope": hold.scope,
                        "timestamp": when,
                        "expires": when + self.reservation_ttl,
                    },
                )
            self._generation += 1  # committed: the hold counts in this process's gates at once
            return hold

        return self._read("reserve", started, reserve)

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
        return self._reserve(amount, limits, scope, now, None)

    async def areserve(
        self,
        amount: Decimal,
        *,
        limits: Mapping[tuple[Window, str | None], Decimal],
        scope: str | None,
        now: datetime | None = None,
    ) -> Reservation:
        """:meth:`reserve` in a worker thread, bounded from this call."""
        return await asyncio.to_thread(self._reserve, amount, limits, scope, now, time.monotonic())

    def entries(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        scope: str | None = None,
        model: str | None = None,
        kind: str | None = None,
    ) -> list[LedgerEntry]:
        """Stored entries with ``since <= timestamp < until`` (either bound optional) and
        the given ``scope``, ``model`` and ``kind`` (None: any), oldest first, read in one
        operation. Writes still pending are not listed until they are stored.

        >>> ledger.entries(since, until, model="gpt-4o")  # doctest: +SKIP

        Bounded like every operation: a million SQLite rows take about 11 s here, of which
        the database's part (the bounded part) is under 5 s; for reads of several
        million rows use :meth:`iter_entries`, pass narrower bounds, or open the ledger
        with a larger ``operation_timeout``.
        """
        return self._entries(since, until, scope, model, kind, None)

    def _entries(
        self,
        since: datetime | None,
        until: datetime | None,
        scope: str | None,
        model: str | None,
        kind: str | None,
        started: float | None,
    ) -> list[LedgerEntry]:
        low, high, scope, model, kind = check_entry_filters(since, until, scope, model, kind)

        def read(operation: Operation) -> list[LedgerEntry]:
            with self._connection(operation) as connection:
                found, _ = read_page(
                    connection,
                    low,
                    high,
                    scope=scope,
                    model=model,
                    kind=kind,
                    after=None,
                    limit=None,
                    postgres=self._postgres,
                )
            found.sort(key=lambda entry: entry.timestamp)  # stable: rows of older forms
            return found

        return self._read("entries", started, read)

    async def aentries(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        scope: str | None = None,
        model: str | None = None,
        kind: str | None = None,
    ) -> list[LedgerEntry]:
        """:meth:`entries` in a worker thread, bounded from this call."""
        return await asyncio.to_thread(
            self._entries, since, until, scope, model, kind, time.monotonic()
        )

    def iter_entries(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        scope: str | None = None,
        model: str | None = None,
        kind: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> Iterator[LedgerEntry]:
        """:meth:`entries`, streamed: ``page_size`` rows (default 1,000) per read, so a
        month of entries never has to fit in memory.

        >>> for entry in ledger.iter_entries(since, until, scope="tenant-1"):  # doctest: +SKIP
        ...     print(entry.cost)

        Pages follow ``(timestamp, id)`` (keyset pagination: each page is an index range
        scan, however deep). Each page is one operation bounded by ``operation_timeout``,
        and no connection is held between pages, so a slow consumer holds no lock or
        snapshot. The pages are separate snapshots: an entry stored while the iteration
        runs is listed if it sorts after the page being read. Filters are checked on the
        call, before the first entry is asked for.
        """
        checked = check_entry_filters(since, until, scope, model, kind)
        checks.whole("page_size", page_size, minimum=1, maximum=checks.MAX_COUNT)
        return self._pages(*checked, page_size)

    def aiter_entries(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        scope: str | None = None,
        model: str | None = None,
        kind: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> AsyncIterator[LedgerEntry]:
        """:meth:`iter_entries` for async callers: each page is read in a worker thread,
        bounded from when it is asked for; the event loop never waits on the database.

        >>> async for entry in ledger.aiter_entries(since, until):  # doctest: +SKIP
        ...     total += entry.cost
        """
        checked = check_entry_filters(since, until, scope, model, kind)
        checks.whole("page_size", page_size, minimum=1, maximum=checks.MAX_COUNT)
        return self._apages(*checked, page_size)

    def _page(
        self,
        filters: tuple[datetime | None, datetime | None, str | None, str | None, str | None],
        page_size: int,
        after: Cursor | None,
        started: float | None,
    ) -> tuple[list[LedgerEntry], Cursor | None]:
        """One page of entries after ``after``, in one bounded operation."""
        low, high, scope, model, kind = filters

        def read(operation: Operation) -> tuple[list[LedgerEntry], Cursor | None]:
            with self._connection(operation) as connection:
                return read_page(
                    connection,
                    low,
                    high,
                    scope=scope,
                    model=model,
                    kind=kind,
                    after=after,
                    limit=page_size,
                    postgres=self._postgres,
                )

        return self._read("entries", started, read)

    def _pages(
        self,
        low: datetime | None,
        high: datetime | None,
        scope: str | None,
        model: str | None,
        kind: str | None,
        page_size: int,
    ) -> Iterator[LedgerEntry]:
        filters = (low, high, scope, model, kind)
        cursor: Cursor | None = None
        while True:
            page, cursor = self._page(filters, page_size, cursor, None)
            yield from page
            if cursor is None:
                return

    async def _apages(
        self,
        low: datetime | None,
        high: datetime | None,
        scope: str | None,
        model: str | None,
        kind: str | None,
        page_size: int,
    ) -> AsyncIterator[LedgerEntry]:
        filters = (low, high, scope, model, kind)
        cursor: Cursor | None = None
        while True:
            page, cursor = await asyncio.to_thread(
                self._page, filters, page_size, cursor, time.monotonic()
            )
            for entry in page:
                yield entry
            if cursor is None:
                return

    def _spend_rows(
        self, by: Grouping, low: datetime | None, high: datetime | None, scope: str | None
    ) -> list[SpendRow]:
        """What :func:`~llm_resilience.spend.spend_report` reads: the rows grouped by the
        database in one bounded operation (``GROUP BY``; exact sums, see ``_queries``).
        Writes still pending are not in them (a report's ``remaining`` reads
        :meth:`spend`, which counts them)."""

        def read(operation: Operation) -> list[SpendRow]:
            with self._connection(operation) as connection:
                groups = read_groups(
                    connection, by, low, high, scope=scope, postgres=self._postgres
                )
            return [SpendRow(*group) for group in groups]

        return self._read("report", None, read)

    # -- closing ------------------------------------------------------------------------

    def _store_pending(self, name: str) -> None:
        """Store what is pending within one operation's bound, whatever goes wrong."""
        if not len(self._pending):
            return
        try:
            with self._operation(name) as operation:
                self._flush(operation, operation.deadline)
        except Exception as error:
            if not _unavailable(error):
                raise

    def close(self) -> None:
        """Store pending writes (within ``operation_timeout``), then close the pooled
        connections and stop the watchdog; a later call opens new ones.

        Writes still pending after that are logged (count and money) and kept for the
        next operation, or the exit of the process.
        """
        if self._flusher is not None:
            self._flusher.stop(self._timeout)
        try:
            self._store_pending("close")
        finally:
            if len(self._pending):
                count, money = self._pending.summary()
                logger.warning(
                    "%r closed with %d writes (%s of spend) not yet stored; the next "
                    "operation or the exit of the process tries again.",
                    self,
                    count,
                    money,
                )
            self._watchdog.stop()
            self._engine.dispose()
            self._close_direct()

    async def aclose(self) -> None:
        """:meth:`close` in a worker thread."""
        await asyncio.to_thread(self.close)

    def _exit(self) -> None:
        try:
            self._store_pending("exit")
        except Exception:  # the loss is logged just below
            pass
        if len(self._pending):
            count, money = self._pending.summary()
            logger.warning(
                "%r: %d writes (%s of spend) were never stored: the process is exiting "
                "and the database did not take them.",
                self,
                count,
                money,
            )


def _write_behind(value: object) -> timedelta | None:
    if value is None:
        return None
    interval = checks.duration("write_behind", value)
    if interval > MAX_WRITE_BEHIND:
        raise ValueError(
            f"write_behind must be None or at most {MAX_WRITE_BEHIND.total_seconds():.0f} "
            f"seconds (what a crash may lose); got {value!r}"
        )
    return interval


def _settlement(reservation: Reservation, entry: LedgerEntry | None) -> PendingWrite:
    if not isinstance(reservation, Reservation):
        raise TypeError(f"reservation must be a Reservation, got {type(reservation).__name__}")
    if entry is not None and not isinstance(entry, LedgerEntry):
        raise TypeError(f"entry must be a LedgerEntry or None, got {type(entry).__name__}")
    return PendingWrite(entry, reservation.id)


@atexit.register
def _store_pending_at_exit() -> None:
    """Give every open ledger one bounded chance to store what it still holds."""
    for ledger in list(_live):
        ledger._exit()
