"""The SQL ledger's connections and deadlines: the engine, each operation's bound.

``Connections`` owns what ``SqlCostLedger`` needs to reach its database within
``operation_timeout``: the SQLAlchemy engine and its pool, the ``sqlite3`` connections
kept for the per-call operations on a SQLite file, the ``Watchdog`` that interrupts a
connection past its deadline, and PostgreSQL connections opened on helper threads
(``Connector``). What the ledger stores and reads is in ``_sql``, the writes kept
pending in ``_writes``, tables and statements in ``_schema``.

Within one operation (``T`` is ``operation_timeout``), waiting for a free connection,
opening one, waiting for a lock, and every statement share one deadline. Past it the
watchdog interrupts the connection in use (psycopg: its socket is shut down; sqlite3:
``interrupt()``, and the busy timeout is set to what is left of ``T`` before each use) and
the connection is discarded. PostgreSQL sessions also get ``lock_timeout``,
``statement_timeout`` and ``idle_in_transaction_session_timeout`` of ``T``, so the server
lets go of an abandoned statement's locks too.
"""

from __future__ import annotations

import functools
import math
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Connection, Dialect, Engine, make_url
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool

from llm_resilience import checks
from llm_resilience.errors import LedgerTimeoutError
from llm_resilience.ledger._connector import Connector
from llm_resilience.ledger._readcache import ReadCache
from llm_resilience.ledger._schema import (
    Run,
    driver_run,
    is_current,
    migrate,
    prepare_sqlite,
    sqlite_run,
)
from llm_resilience.ledger._watchdog import Operation, Watchdog

__all__ = [
    "MAX_OVERFLOW",
    "MIGRATION_TIMEOUT",
    "POOL_SIZE",
    "Connections",
    "contended",
    "must_retry",
    "parse_url",
    "unavailable",
]

#: Bound on opening a ledger whose tables must be created or migrated, waiting for
#: another process's migration included (building the totals of a first-release table
#: takes seconds per million rows: see docs/benchmarks.md).
MIGRATION_TIMEOUT = timedelta(minutes=10)
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


def parse_url(url: object) -> URL:
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


def timed_out(error: BaseException) -> bool:
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


#: SQLSTATEs with which PostgreSQL asks the client to run the transaction again: it was
#: rolled back, whole, to end a deadlock or keep transactions serialisable.
RETRY_SQLSTATES = ("40P01", "40001")  # deadlock_detected, serialization_failure


def must_retry(error: BaseException) -> bool:
    """Whether ``error`` is PostgreSQL asking for the transaction to be tried again."""
    return isinstance(error, sa_exc.DBAPIError) and (
        getattr(error.orig, "sqlstate", None) in RETRY_SQLSTATES
    )


def unavailable(error: BaseException) -> bool:
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


#: SQLSTATE of PostgreSQL's ``lock_timeout``: a lock wait the server ended.
LOCK_TIMEOUT_SQLSTATE = "55P03"


def contended(error: BaseException, operation: Operation) -> bool:
    """Whether ``error`` ended ``operation`` while it waited for a lock that other
    writers hold and pass on: the database answers but is busy, rather than away.

    SQLite: the operation ran out of time and, while it waited for the write lock,
    another connection committed (``Operation.others_committed``, noted only for
    operations that ``watch_commits``); a lock nobody commits under is away.
    PostgreSQL: the server's ``lock_timeout`` ended a lock wait (SQLSTATE 55P03).
    """
    if operation.others_committed and isinstance(error, LedgerTimeoutError):
        return True
    cause: BaseException | None = error
    for _ in range(4):  # the error, what it wraps, and so on: a short chain
        if cause is None:
            return False
        driver_error = getattr(cause, "orig", cause)
        if getattr(driver_error, "sqlstate", None) == LOCK_TIMEOUT_SQLSTATE:
            return True
        cause = cause.__cause__
    return False


def _raise_past_deadline(error: Exception, operation: Operation, interrupted: bool) -> None:
    """Raise ``LedgerTimeoutError`` for a database error that the deadline caused: the
    watchdog interrupted the connection, or a bound (pool, busy, lock) ran out."""
    if isinstance(error, sa_exc.SQLAlchemyError | sqlite3.Error | OSError) and (
        interrupted or timed_out(error)
    ):
        raise operation.timeout_error() from error


def _as_sqlalchemy(error: Exception) -> Exception:
    """A psycopg error as SQLAlchemy's error for it (parameters hidden), as the engine
    raises it, so the ledger's checks (``unavailable``, ``must_retry``) read it alike."""
    module = type(error).__module__
    if not module.startswith("psycopg"):
        return error
    import psycopg

    if not isinstance(error, psycopg.Error):
        return error
    wrapped: Exception = sa_exc.DBAPIError.instance(
        None, None, error, psycopg.Error, hide_parameters=True
    )
    return wrapped


def _sqlite_begin(connection: Connection) -> None:
    statement = connection.get_execution_options().get(_BEGIN, "BEGIN")
    if statement is not None:
        sqlite_run(connection, statement, ())


def _begin_write(run: Run, operation: Operation) -> int | None:
    """``BEGIN IMMEDIATE`` on a direct SQLite connection: the write lock, waited for
    within the operation's deadline (the busy timeout).

    With ``operation.watch_commits`` returns the connection's ``data_version`` read just
    before, and when the wait for the lock runs out, notes whether another connection
    committed meanwhile (``operation.others_committed``): a lock that changes hands is
    contention; one nobody commits under is a database that is away (another connection
    keeps it locked). Else returns None.
    """
    if not operation.watch_commits:
        run("BEGIN IMMEDIATE", ())
        return None
    ((before,),) = run("PRAGMA data_version", ())
    assert isinstance(before, int)
    try:
        run("BEGIN IMMEDIATE", ())
    except sa_exc.DBAPIError as error:
        if timed_out(error):
            # Out of the watchdog's reach first (its alarm is due now and must not cut
            # this read short; the connection is closed after the error anyway), and a
            # 1 ms busy timeout: the read must not wait out another bound.
            operation.detach()
            with suppress(sa_exc.DBAPIError, ValueError):
                run("PRAGMA busy_timeout = 1", ())
                ((after,),) = run("PRAGMA data_version", ())
                if after != before:
                    operation.others_committed = True
        raise
    return before


def milliseconds(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _close_quietly(dbapi_connection: Any) -> None:
    dbapi_connection.close()


class Connections:
    """The engine and connections of one ledger, each use bounded by an operation.

    ``parsed`` comes from ``parse_url``; ``timeout`` is ``operation_timeout`` and
    ``connect_timeout`` libpq's bound, both in seconds. ``echo`` logs the SQL, never its
    parameters. ``operation`` opens a bounded operation; ``connection`` and
    ``direct_connection`` lend a connection for one step of it.
    """

    def __init__(self, parsed: URL, *, timeout: float, connect_timeout: float, echo: bool) -> None:
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        #: Whether the database is PostgreSQL (else SQLite).
        self.postgres = parsed.get_backend_name() == "postgresql"
        #: Whether the database is an in-memory SQLite database of this process.
        self.memory = not self.postgres and (
            parsed.database in (None, "", ":memory:")
            or "memory" in str(parsed.query.get("mode", ""))
        )
        self._local = threading.local()
        #: A SQLite file without echo: the per-call operations (spend, record, settle)
        #: run on connections of our own (``direct_connection``), the rest on
        #: SQLAlchemy's pool.
        self.direct = not self.postgres and not self.memory and not echo
        # Idle direct connections, each with the busy timeout (ms) last set on it and the
        # gate reads made on it (see ``direct_reads``).
        self._idle: list[tuple[sqlite3.Connection, int | None, ReadCache]] = []
        # PostgreSQL without echo: the per-call operations (record, spends) run on
        # psycopg connections of our own too (``postgres_connection``): idle ones here,
        # each as the one cursor it is used through.
        self.postgres_direct = self.postgres and not echo
        self._postgres_idle: list[Any] = []
        #: The SQLAlchemy engine: its pool serves every operation but the direct ones.
        self.engine = self._create_engine(parsed, echo=echo)
        #: The backend's name, for threads and log lines.
        self.backend = "postgresql" if self.postgres else "sqlite"
        self.watchdog = Watchdog(self.backend)
        self._connector = Connector() if self.postgres else None
        # An in-memory SQLite database is one connection shared by every thread.
        self._slots = _Slots(1 if self.memory else POOL_SIZE + MAX_OVERFLOW)

    def _create_engine(self, parsed: URL, *, echo: bool) -> Engine:
        options: dict[str, Any] = {"echo": echo, "hide_parameters": True}
        if not self.memory:
            options.update(
                pool_size=POOL_SIZE, max_overflow=MAX_OVERFLOW, pool_timeout=self._timeout
            )
        if self.postgres:
            if "connect_timeout" not in parsed.query:
                # libpq counts whole seconds and treats anything under 2 as 2.
                seconds = self._connect_timeout
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
            if self.memory:
                options["poolclass"] = StaticPool
            engine = create_engine(parsed, **options)
            event.listen(engine, "connect", self._sqlite_connect)
            event.listen(engine, "begin", _sqlite_begin)
        event.listen(engine, "do_connect", self._do_connect)
        event.listen(engine, "close", self._forget)
        event.listen(engine, "invalidate", self._forget_invalidated)
        return engine

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self.engine.url.render_as_string(hide_password=True)

    def close(self) -> None:
        """Close the pooled and direct connections and stop the watchdog; a later
        operation opens new ones."""
        self.watchdog.stop()
        self.engine.dispose()
        self._close_direct()
        while self._postgres_idle:
            with suppress(Exception):
                self._postgres_idle.pop().connection.close()

    def current(self) -> Operation | None:
        operation: Operation | None = getattr(self._local, "operation", None)
        return operation

    def _do_connect(
        self, dialect: Dialect, record: ConnectionPoolEntry, cargs: Any, cparams: Any
    ) -> Any:
        operation = self.current()
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
        operation = self.current()
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
        operation = self.current()
        deadline = operation.phase_deadline if operation else time.monotonic() + self._timeout
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {milliseconds(deadline - time.monotonic())}")
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

    def _postgres_connect(self, dbapi_connection: Any, record: ConnectionPoolEntry | None) -> None:
        # Session settings outside any transaction: UTC, so a first-release column of type
        # TIMESTAMP WITHOUT TIME ZONE stores UTC; and the server's own bounds, so a
        # statement or transaction we abandoned does not keep its locks.
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        cursor.execute("SET TIME ZONE 'UTC'")
        bound = milliseconds(self._timeout)
        for setting in (
            "lock_timeout",
            "statement_timeout",
            "idle_in_transaction_session_timeout",
        ):
            cursor.execute(f"SET {setting} = {bound}")
        cursor.close()
        dbapi_connection.autocommit = autocommit

    def operation(
        self, name: str, started: float | None = None, bound: float | None = None
    ) -> _Bounded:
        """One bounded operation: a connection slot, and a deadline the watchdog keeps
        (``with connections.operation("spend") as operation: ...``)."""
        return _Bounded(self, name, started, bound)

    def start(
        self, name: str, started: float | None = None, bound: float | None = None
    ) -> Operation:
        """`operation` without the ``with``: the caller must `end` it."""
        operation = Operation(
            self.watchdog,
            name,
            self._timeout if bound is None else bound,
            time.monotonic() if started is None else started,
        )
        try:
            if not self._slots.acquire(operation.phase_deadline):
                raise operation.timeout_error()
        except BaseException:
            operation.finish()
            raise
        self._local.operation = operation
        return operation

    def end(self, operation: Operation) -> None:
        """End ``operation`` (from `start`): its slot freed, its alarm cancelled."""
        try:
            self._local.operation = None
            self._slots.release()
        finally:
            operation.finish()

    @contextmanager
    def connection(
        self, operation: Operation, *, transaction: bool = False
    ) -> Iterator[Connection]:
        """A connection for one step of ``operation``: outside any transaction (each
        statement atomic and one snapshot), or in one transaction committed on exit
        (SQLite takes the write lock at once). Interrupted past the deadline, then
        discarded, and the error becomes ``LedgerTimeoutError``."""
        if operation.expired():
            raise operation.timeout_error()
        interrupted = False
        try:
            with self.engine.connect() as connection:
                operation.attach(connection.connection.dbapi_connection)
                try:
                    if self.postgres and not transaction:
                        connection.execution_options(isolation_level="AUTOCOMMIT")
                    elif not self.postgres:
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
                    if interrupted and not self.memory and not connection.invalidated:
                        connection.invalidate()
        except Exception as error:
            # A connection being set up when the deadline passed is attached, not pooled.
            _raise_past_deadline(error, operation, operation.detach() or interrupted)
            raise

    @staticmethod
    def _bound_lock_waits(connection: Connection, operation: Operation) -> None:
        """End SQLite's lock waits (its busy timeout) with ``operation``'s deadline.

        ``interrupt()`` does not stop a busy wait, so the timeout itself must fit. It is
        left alone when already no longer than the time left and short of it by at most
        20 ms, which spares a statement in the common case (a fresh operation on a
        pooled connection).
        """
        wanted = milliseconds(operation.remaining())
        info = connection.connection.info
        current = info.get(_BUSY_MS)
        if current is None or not wanted - _BUSY_SLACK_MS <= current <= wanted:
            driver: Any = connection.connection.driver_connection
            driver.execute(f"PRAGMA busy_timeout = {wanted}")
            info[_BUSY_MS] = wanted

    def direct_connection(self, operation: Operation, *, transaction: bool = False) -> _DirectRun:
        """``connection`` for the per-call operations on a SQLite file, on a
        ``sqlite3`` connection the ledger keeps itself: no pool checkout, no SQLAlchemy
        connection, transaction or event per call.

        The same bounds: the operation's deadline ends lock waits (the busy timeout) and
        the watchdog interrupts a statement still running past it; an interrupted
        connection, or one that failed, is closed instead of kept; a transaction takes
        the write lock up front (``BEGIN IMMEDIATE``) and is committed on exit, rolled
        back on an error. Errors come out as from the engine (SQLAlchemy's, parameters
        hidden), and ``LedgerTimeoutError`` past the deadline.
        """
        return _DirectRun(self, operation, transaction)

    def direct_reads(self, operation: Operation, *, transaction: bool = False) -> _Direct:
        """`direct_connection`, with the gate reads kept on that connection
        (``_readcache``): valid while its ``PRAGMA data_version`` is unchanged. In a
        transaction, tell them what it stores (``ReadCache.stored``,
        ``ReadCache.unaccounted``); they are brought up to date when it commits."""
        return _Direct(self, operation, transaction)

    def _connect_direct(self, operation: Operation) -> sqlite3.Connection:
        """A new direct connection, set up as the engine sets up its own, within the
        operation's deadline."""
        cargs, cparams = self.engine.dialect.create_connect_args(self.engine.url)
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
        """``_bound_lock_waits`` for a direct connection; returns the timeout set."""
        left = operation.phase_deadline - time.monotonic()  # `Operation.remaining`
        wanted = math.ceil(left * 1000) if left > 0.001 else 1  # `milliseconds(left)`
        if current is None or not wanted - _BUSY_SLACK_MS <= current <= wanted:
            driver_run(driver, f"PRAGMA busy_timeout = {wanted}", ())
            return wanted
        return current

    def _close_direct(self) -> None:
        while self._idle:
            driver, _, _ = self._idle.pop()
            with suppress(Exception):
                driver.close()

    def postgres_connection(self, operation: Operation) -> _PostgresDirect:
        """A psycopg connection in autocommit for one step of ``operation`` on
        PostgreSQL, kept by the ledger itself, lent as its one cursor (kept with it): no
        pool checkout, no SQLAlchemy connection or statement compilation per call, no
        cursor made per statement (each of the ledger's per-call statements is one round
        trip, atomic on its own).

        The same bounds as `connection`: opened on a helper thread within the deadline
        (``Connector``) with the same session settings (UTC, the server-side
        timeouts); the watchdog shuts its socket down past the deadline. A connection
        that failed or was interrupted is closed, never reused. psycopg's errors come out
        as SQLAlchemy's (parameters hidden), and ``LedgerTimeoutError`` past the deadline.
        """
        return _PostgresDirect(self, operation)

    def _connect_postgres(self, operation: Operation) -> Any:
        """A new direct PostgreSQL connection, set up as the engine's, in autocommit."""
        assert self._connector is not None
        dialect = self.engine.dialect
        cargs, cparams = dialect.create_connect_args(self.engine.url)
        if "connect_timeout" not in cparams:
            cparams["connect_timeout"] = max(2, math.ceil(self._connect_timeout))
        driver = self._connector.connect(
            lambda: dialect.connect(*cargs, **cparams), _close_quietly, operation
        )
        try:
            operation.attach(driver)
            self._postgres_connect(driver, None)
            driver.autocommit = True
        except BaseException:
            operation.detach()
            driver.close()
            raise
        return driver

    def lock_ledger(self, connection: Connection) -> None:
        """Serialise PostgreSQL writers that read then write (reserve, migration) on one
        transaction-scoped advisory lock; SQLite's ``BEGIN IMMEDIATE`` already does."""
        if self.postgres:
            connection.exec_driver_sql(
                "SELECT pg_advisory_xact_lock("
                "hashtext('llm_resilience.cost_ledger:' || current_schema()))"
            )

    def open(self) -> None:
        """Check the schema (a few catalogue reads, no lock); create or migrate it under
        the write lock only when something is missing."""
        with self.operation("open") as operation:
            with self.connection(operation) as connection:
                if is_current(connection):
                    return
            operation.extend(MIGRATION_TIMEOUT.total_seconds())
            with self.connection(operation, transaction=True) as connection:
                if self.postgres:
                    bound = milliseconds(MIGRATION_TIMEOUT.total_seconds())
                    # Every server-side bound of the session, the migration's for its
                    # transaction: a migration on a busy machine may wait longer than
                    # the operation's bound between two of its statements.
                    for setting in (
                        "lock_timeout",
                        "statement_timeout",
                        "idle_in_transaction_session_timeout",
                    ):
                        connection.exec_driver_sql(f"SET LOCAL {setting} = {bound}")
                self.lock_ledger(connection)
                migrate(connection, postgres=self.postgres)


class _Slots:
    """A counting semaphore for the operations' connection slots: `threading.Semaphore`
    without its per-call Python overhead when a slot is free (the usual case)."""

    __slots__ = ("_free", "_freed", "_lock", "_waiting")

    def __init__(self, count: int) -> None:
        self._free = count
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._waiting = 0

    def acquire(self, deadline: float) -> bool:
        """Take a slot, waiting at most until ``deadline`` (``time.monotonic()``); False
        if none was free by then."""
        with self._lock:
            if self._free > 0:
                self._free -= 1
                return True
            self._waiting += 1
            try:
                while self._free <= 0:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._freed.wait(left)
                self._free -= 1
                return True
            finally:
                self._waiting -= 1

    def release(self) -> None:
        with self._lock:
            self._free += 1
            if self._waiting:
                self._freed.notify()


class _Bounded:
    """`Connections.operation`'s context manager (a class: a generator-based one
    costs several microseconds per operation)."""

    __slots__ = ("_args", "_connections", "_operation")

    def __init__(
        self, connections: Connections, name: str, started: float | None, bound: float | None
    ) -> None:
        self._connections = connections
        self._args = (name, started, bound)
        self._operation: Operation | None = None

    def __enter__(self) -> Operation:
        self._operation = self._connections.start(*self._args)
        return self._operation

    def __exit__(self, *exc_info: object) -> None:
        assert self._operation is not None
        self._connections.end(self._operation)


class _Direct:
    """`Connections.direct_reads`: a direct SQLite connection lent for one step of an
    operation, with the gate reads kept on it. A class rather than a generator-based
    context manager: this runs twice per gate read and write.

    Entering: an idle connection (or a new one), attached to the operation, its busy
    timeout fitted to the time left; in a transaction, the write lock taken
    (``BEGIN IMMEDIATE``). Leaving: committed (in a transaction) and kept, or, after an
    error or an interrupt, closed; an error the deadline caused comes out as
    ``LedgerTimeoutError``.
    """

    __slots__ = (
        "_busy_ms",
        "_connections",
        "_driver",
        "_operation",
        "_reads",
        "_run",
        "_transaction",
    )

    def __init__(self, connections: Connections, operation: Operation, transaction: bool) -> None:
        self._connections = connections
        self._operation = operation
        self._transaction = transaction

    def __enter__(self) -> tuple[Run, ReadCache]:
        operation = self._operation
        if time.monotonic() >= operation.phase_deadline:  # `Operation.expired`, inlined
            raise operation.timeout_error()
        connections = self._connections
        driver: sqlite3.Connection | None
        try:
            driver, busy_ms, reads = connections._idle.pop()
        except IndexError:
            driver, busy_ms, reads = None, None, ReadCache()
        try:
            if driver is None:
                driver = connections._connect_direct(operation)
            else:
                operation.attach(driver)
            self._busy_ms = connections._bound_direct_waits(driver, busy_ms, operation)
            run: Run = functools.partial(driver_run, driver)
            if self._transaction:
                # Our own commit leaves this connection's data_version as it was: the
                # reads kept on it are brought up to date with what we store, if
                # nobody else committed since they were made, else forgotten.
                try:
                    before = _begin_write(run, operation)
                    ((version,),) = run("PRAGMA data_version", ())
                    if before is not None and version != before:
                        operation.others_committed = True  # while we waited for the lock
                    reads.begin_write(version)
                except BaseException:
                    reads.ended()
                    raise
        except BaseException as error:
            interrupted = operation.detach()
            try:
                if isinstance(error, Exception):
                    _raise_past_deadline(error, operation, operation.detach() or interrupted)
            finally:
                if driver is not None:
                    with suppress(Exception):  # closing rolls back an open transaction
                        driver.close()
            raise
        self._driver = driver
        self._reads = reads
        self._run = run
        return run, reads

    def __exit__(self, error_type: object, error: BaseException | None, traceback: object) -> None:
        operation = self._operation
        reads = self._reads
        kept = False
        interrupted = False
        try:
            try:
                if self._transaction:
                    if error is not None:
                        reads.ended()
                    else:
                        try:
                            self._run("COMMIT", ())
                        except BaseException:
                            reads.ended()
                            raise
                        reads.committed()
            finally:
                interrupted = operation.detach()
            idle = self._connections._idle
            if error is None and not interrupted and len(idle) < POOL_SIZE:
                idle.append((self._driver, self._busy_ms, reads))
                kept = True
        except Exception as failure:
            _raise_past_deadline(failure, operation, operation.detach() or interrupted)
            raise
        finally:
            if not kept:
                with suppress(Exception):  # closing rolls back an open transaction
                    self._driver.close()
        if isinstance(error, Exception):
            _raise_past_deadline(error, operation, operation.detach() or interrupted)


class _DirectRun(_Direct):
    """`Connections.direct_connection`: `_Direct` lending only the statement runner."""

    __slots__ = ()

    def __enter__(self) -> Run:  # type: ignore[override]
        run, reads = super().__enter__()
        if self._transaction:
            reads.unaccounted()  # a caller that does not say what it stored
        return run


class _PostgresDirect:
    """`Connections.postgres_connection`'s context manager. A class rather than a
    generator-based one: this runs once per gate read and per record."""

    __slots__ = ("_connections", "_cursor", "_operation")

    def __init__(self, connections: Connections, operation: Operation) -> None:
        self._connections = connections
        self._operation = operation
        self._cursor: Any = None

    def __enter__(self) -> Any:
        operation = self._operation
        if time.monotonic() >= operation.phase_deadline:  # `Operation.expired`, inlined
            raise operation.timeout_error()
        try:
            cursor = self._connections._postgres_idle.pop()
        except IndexError:
            try:
                cursor = self._connections._connect_postgres(operation).cursor()
            except BaseException as error:
                interrupted = operation.detach()
                if isinstance(error, Exception):
                    self._raise(error, interrupted)
                raise
        else:
            operation.attach(cursor.connection)
        self._cursor = cursor
        return cursor

    def __exit__(self, error_type: object, error: BaseException | None, traceback: object) -> None:
        cursor = self._cursor
        interrupted = self._operation.detach()
        idle = self._connections._postgres_idle
        if error is None and not interrupted and len(idle) < POOL_SIZE:
            idle.append(cursor)
            return
        with suppress(Exception):
            cursor.connection.close()
        if isinstance(error, Exception):
            self._raise(error, interrupted)

    def _raise(self, error: Exception, interrupted: bool) -> None:
        """Raise ``error`` as SQLAlchemy's (``LedgerTimeoutError`` past the deadline);
        return only for an error that stays as it is, for the caller to re-raise."""
        operation = self._operation
        wrapped = _as_sqlalchemy(error)
        _raise_past_deadline(wrapped, operation, operation.detach() or interrupted)
        if wrapped is not error:
            raise wrapped from error
