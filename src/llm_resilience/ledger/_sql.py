"""The persistent ledger: SQLite or PostgreSQL through SQLAlchemy.

Tables, statements and migration are in ``_schema``; connections and deadlines in
``_connections`` (with ``_watchdog`` and ``_connector``); storing the writes, and keeping
those the database does not take, in ``_writes`` and ``_pending``. This module holds the
operations: what a record, a settle, a hold and a read do, and in which bounded operation.

Concurrency: on SQLite every write is one transaction that takes the write lock up front
(``BEGIN IMMEDIATE``, WAL mode), and adds its cost to the running totals in SQL with an
exact decimal-text function registered on every connection (``_schema.DECIMAL_ADD``), so
the stored totals stay the decimal text every release reads. On a SQLite file the
per-call operations (``spend``, ``spends``, ``record``, ``settle``) run on ``sqlite3``
connections the ledger keeps itself (no pool checkout per call); everything else goes
through SQLAlchemy's pool. Both kinds are bounded alike. On a SQLite file a gate read is
kept per connection while ``PRAGMA data_version`` says nothing was committed since
(``_readcache``). On PostgreSQL ``spend``, ``spends`` and ``record`` run on psycopg
connections the ledger keeps itself likewise (no pool checkout, no SQLAlchemy compile
per call); a record, and a batch of records, is one statement (``_postgres``: insert the
entries, add their costs to their totals) that locks the totals in key order, as every
writer does, so writers never deadlock; one the database ends anyway (deadlock,
serialisation failure) is retried (``_writes``). ``reserve`` and schema changes serialise
on a transaction-scoped advisory lock. Any number of processes may open, write and
migrate the same database at once.

Time bounds (``T`` is ``operation_timeout``): every operation, from the moment it is
called, ends within ``T`` plus the watchdog's reaction (docs/benchmarks.md has the
measured reaction); how that bound is kept is in ``_connections``.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from sqlalchemy import delete

from llm_resilience import checks
from llm_resilience.ledger._connections import Connections, parse_url, unavailable
from llm_resilience.ledger._groups import Grouping, SpendReport, SpendRow, grouped_report
from llm_resilience.ledger._pending import DEFAULT_MAX_PENDING, PendingWrite, PendingWrites
from llm_resilience.ledger._postgres import psycopg_spends
from llm_resilience.ledger._protocol import (
    DEFAULT_RESERVATION_TTL,
    EntryFilters,
    LedgerEntry,
    Reservation,
    RunColumn,
    SpendWindow,
    Window,
    check_amount,
    check_entry_filters,
    check_hold_scope,
    check_limits,
    check_now,
    check_run_or_thread,
    check_scope,
    check_windows,
    exact_sum,
    refusal,
    window_key,
)
from llm_resilience.ledger._queries import Cursor, read_groups, read_page, read_run_spend
from llm_resilience.ledger._readcache import versioned_spends
from llm_resilience.ledger._schema import (
    holds,
    read_spend,
    read_spends,
    sum_slots,
)
from llm_resilience.ledger._watchdog import Operation
from llm_resilience.ledger._writes import Writes

__all__ = ["SqlCostLedger"]

logger = logging.getLogger(__name__)

#: `SqlCostLedger.arecord`'s waits for room in a write-behind queue, kept until done: a
#: caller cancelled meanwhile no longer holds its own.
_queueing: set[asyncio.Future[None]] = set()

#: Default bound on every ledger operation.
DEFAULT_OPERATION_TIMEOUT = timedelta(seconds=5)
#: Default bound on libpq's own connection attempt (whole seconds, 2 at least).
DEFAULT_CONNECT_TIMEOUT = timedelta(seconds=5)
#: The longest ``operation_timeout`` and ``connect_timeout`` accepted (a day).
MAX_OPERATION_TIMEOUT = checks.MAX_OPERATION_TIMEOUT
#: Rows per page of [`SqlCostLedger.iter_entries`][].
DEFAULT_PAGE_SIZE = 1000
#: The longest ``write_behind`` accepted: what a crash of the process may lose.
MAX_WRITE_BEHIND = timedelta(seconds=60)
# Write-behind: distinct gate reads remembered (windows and scopes x day and month).
_MAX_CACHED_READS = 256
_Result = TypeVar("_Result")
# The name the builder checks a URL with before any ledger opens.
_parse_url = parse_url

# Ledgers that may still hold pending writes when the process exits.
_live: weakref.WeakSet[SqlCostLedger] = weakref.WeakSet()


class SqlCostLedger:
    """A ledger in a SQL database, shared by every process that opens it.

    Examples:
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
      Past it the operation raises [`LedgerTimeoutError`][]
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
      Set: ``record`` queues the entry and returns, never waiting on the database, even
      while it is away; a thread of the ledger's commits the queue in batches every
      interval (sooner once 100 wait), and [`close`][] and the exit of the process
      store the rest. Only a full queue (``max_pending``) makes ``record`` wait, at most
      ``operation_timeout`` per call, for the writer to make room (``arecord`` waits in
      a worker thread), and only while the database answers, busy or not: a writer
      whose wait for the lock runs out while other writers commit (SQLite's write lock,
      PostgreSQL's ``lock_timeout``) tries again at once, one WARNING a minute says so,
      and an entry that found no room in time is kept anyway, the queue growing up to
      twice ``max_pending``: nothing is dropped (8 processes writing one SQLite file as
      fast as they can lost none: docs/benchmarks.md). In an outage (the database
      unreachable, or a SQLite file locked with nobody committing) the oldest entry is
      dropped at once, counted and warned, instead. Gates in this process count queued entries
      at once; the stored part of a gate's read is reused for up to this long, so other
      processes' spend reaches this process's gate within it. A crash (``kill -9``, power
      loss) loses at most the entries recorded in the last interval plus the time one
      flush takes (the whole queue during an outage). Strict-mode holds and
      ``settle`` stay immediate, but another process's queued entries are not seen by
      this process's holds: a strict budget shared by several processes should not use it.
    * ``echo``: log the SQL; parameters are never logged nor put in exception messages
      (``hide_parameters``), since a scope can be a user id.

    A ``record`` or ``settle`` the database cannot take (down, locked, too slow) does not
    fail: the write waits in memory ([`pending`][]), one WARNING names the error type,
    and it is written, once and in order, before the ledger's next operation, by
    [`close`][], or at process exit (what is still waiting then is logged with its count
    and money). Reads add the money still waiting to what the database says. When
    ``max_pending`` writes wait, the oldest is dropped and counted ([`dropped`][]).
    ``spend``, ``reserve`` and ``entries`` raise on failure (the budget gate turns that
    into a warning).

    The async methods run the sync ones in a worker thread, within the same bound counted
    from the call. What each operation costs is measured in docs/benchmarks.md.
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
        parsed = parse_url(url)
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
        if not isinstance(echo, bool):
            raise checks.OptionTypeError(f"echo must be True or False, got {echo!r}")
        self._timeout = self.operation_timeout.total_seconds()
        self._db = Connections(
            parsed,
            timeout=self._timeout,
            connect_timeout=self.connect_timeout.total_seconds(),
            echo=echo,
        )
        backend = self._db.backend
        self._pending = PendingWrites(max_pending, backend=backend)
        self._writes = Writes(
            self._db,
            self._pending,
            label=repr(self),
            behind_interval=None if self.write_behind is None else self._behind_seconds,
            # A full queue and a database that answers: ``record`` waits this long for
            # the writer to make room, so a fast writer never drops an entry.
            behind_wait=self._timeout,
            behind_name=f"llm-resilience-ledger-writer-{id(self):x}",
        )
        self._flusher = self._writes.flusher
        # Write-behind only: (windows, their keys) -> (stored amounts, read at, generation).
        self._stored: dict[tuple[Any, ...], tuple[tuple[Decimal, ...], float, int]] = {}
        # (windows, day) -> windows checked and their keys (see _plan).
        self._plans: dict[tuple[Any, ...], tuple[tuple[SpendWindow, ...], tuple[str, ...]]] = {}
        # PostgreSQL: (windows checked, their keys) -> the read's text and parameters.
        self._postgres_reads: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}
        try:
            self._db.open()
        except BaseException:
            self._db.close()
            raise
        _live.add(self)
        # A ledger dropped without close() takes its watchdog thread with it (and its
        # writer, which holds it weakly, ends at its next wake-up).
        weakref.finalize(self, self._db.watchdog.stop).atexit = False

    def __repr__(self) -> str:
        return f"SqlCostLedger({self.url!r})"

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self._db.url

    @property
    def pending(self) -> int:
        """Writes waiting in memory for the database (0 when every write is stored)."""
        return len(self._pending)

    @property
    def dropped(self) -> int:
        """Pending writes given up since the ledger opened: the oldest, when more than
        ``max_pending`` waited, and any the database refused outright."""
        return self._pending.dropped

    # -- writing ------------------------------------------------------------------------

    def record(self, entry: LedgerEntry) -> None:
        """Store ``entry`` and add its cost to its day's and month's totals, atomically.

        If the database does not take it within ``operation_timeout``, the entry waits
        in memory (see [`pending`][]) and this returns normally. With ``write_behind``
        the entry is queued and this returns at once (see the class).
        """
        if not isinstance(entry, LedgerEntry):
            raise TypeError(f"entry must be a LedgerEntry, got {type(entry).__name__}")
        if self._flusher is not None:
            self._writes.queue(entry)
            return
        self._writes.write("record", PendingWrite(entry), None)

    async def arecord(self, entry: LedgerEntry) -> None:
        """[`record`][] in a worker thread, bounded from this call (with
        ``write_behind``, queued on the event loop; a full queue is waited for in a
        worker thread, at most ``operation_timeout``: cancelled meanwhile, that thread
        still queues the entry, once, since the call it accounts for happened)."""
        if not isinstance(entry, LedgerEntry):
            raise TypeError(f"entry must be a LedgerEntry, got {type(entry).__name__}")
        if self._flusher is not None:
            if self._writes.must_wait():  # a full queue: wait for room off the loop
                # Shielded: a cancellation reaching the executor's future before its
                # thread starts would drop the work item, and the entry with it.
                queueing = asyncio.ensure_future(asyncio.to_thread(self._writes.queue, entry))
                _queueing.add(queueing)
                queueing.add_done_callback(_queueing.discard)
                await asyncio.shield(queueing)
            else:
                self._writes.queue(entry)  # a lock held for a few µs: no thread needed
            return
        await asyncio.to_thread(self._writes.write, "record", PendingWrite(entry), time.monotonic())

    def settle(self, reservation: Reservation, entry: LedgerEntry | None) -> None:
        """Release ``reservation`` and record ``entry`` (if not None) in one transaction.

        If the database does not take it, both wait in memory together and are written
        in one transaction later, so the hold never counts beside its entry.
        """
        self._writes.write("settle", _settlement(reservation, entry), None)

    async def asettle(self, reservation: Reservation, entry: LedgerEntry | None) -> None:
        """[`settle`][] in a worker thread, bounded from this call."""
        write = _settlement(reservation, entry)
        await asyncio.to_thread(self._writes.write, "settle", write, time.monotonic())

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
        operation = self._db.start(name, started)  # `operation` without a context manager
        try:
            if flush and len(self._pending):
                try:
                    self._writes.flush(operation, operation.started + operation.bound / 2)
                except Exception as error:
                    if not unavailable(error):
                        raise
                    # Already reported when kept; the read below counts them anyway.
            return read(operation)
        finally:
            self._db.end(operation)

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
            if self._db.direct:
                with self._db.direct_reads(operation) as (run, reads):
                    (stored,) = versioned_spends(run, reads, ((window, scope),), (key,), when)
                return exact_sum((stored, waiting))
            if self._db.postgres_direct:
                (stored,) = self._postgres_spends(operation, ((window, scope),), (key,), when)
                return exact_sum((stored, waiting))
            with self._db.connection(operation) as connection:
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
        """[`spend`][] in a worker thread, bounded from this call (with
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
            if self._db.direct:
                with self._db.direct_reads(operation) as (run, reads):
                    return versioned_spends(run, reads, checked, keys, when)
            if self._db.postgres_direct:
                return self._postgres_spends(operation, checked, keys, when)
            with self._db.connection(operation) as connection:
                return tuple(read_spends(connection, checked, when))

        def read(operation: Operation) -> tuple[Decimal, ...]:
            if not len(self._pending):  # nothing queued (the usual case): nothing to add
                return read_stored(operation)
            # Pending first: a write stored meanwhile is then counted twice, never missed.
            waiting = self._waiting(checked, keys)
            stored = read_stored(operation)
            return tuple(exact_sum(pair) for pair in zip(stored, waiting, strict=True))

        if self._flusher is None:
            return self._read("spend", started, read)
        # Write-behind: the stored part is reused while no write of this process has
        # landed since and it is younger than the interval; the queue is added each time.
        cache_key = (checked, keys)
        waiting = self._waiting(checked, keys)
        generation = self._writes.generation  # read after the queue: see ``_flush``
        fresh = time.monotonic()
        stored = self._cached(cache_key, generation, fresh)
        if stored is None:
            stored = self._read("spend", started, read_stored, flush=False)
            if len(self._stored) >= _MAX_CACHED_READS:
                self._stored.clear()
            self._stored[cache_key] = (stored, fresh, generation)
        return tuple(exact_sum(pair) for pair in zip(stored, waiting, strict=True))

    def _postgres_spends(
        self,
        operation: Operation,
        windows: tuple[SpendWindow, ...],
        keys: tuple[str, ...],
        when: datetime,
    ) -> tuple[Decimal, ...]:
        """The stored spends of ``windows`` (whose keys at ``when`` are ``keys``) on
        PostgreSQL: one statement on one of the ledger's own psycopg connections. Its
        text and every parameter but the time are kept per windows and keys (the keys
        fix each window's bounds): a gate reads the same all day."""
        memo = (windows, keys)
        known = self._postgres_reads.get(memo)
        if known is None:
            known = psycopg_spends(windows, when)
            if len(self._postgres_reads) >= _MAX_CACHED_READS:
                self._postgres_reads.clear()
            self._postgres_reads[memo] = known
        statement, parameters = known
        parameters = {**parameters, "now": when}
        with self._db.postgres_connection(operation) as cursor:
            rows = cursor.execute(statement, parameters).fetchall()
        return tuple(sum_slots(len(windows), rows))

    def _plan(
        self, windows: Sequence[SpendWindow], when: datetime
    ) -> tuple[tuple[SpendWindow, ...], tuple[str, ...]]:
        """``windows`` checked, and the key of each at ``when``, remembered per
        ``windows`` and day: a gate asks the same all day."""
        memo: tuple[Any, ...] | None = None
        if type(windows) in (list, tuple):
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
        """Write-behind: [`spends`][] when it needs no database (a fresh cached read),
        else None. For the async gate, which then needs no worker thread."""
        checked, keys = self._plan(windows, check_now(now))
        waiting = self._waiting(checked, keys)
        stored = self._cached((checked, keys), self._writes.generation, time.monotonic())
        if stored is None:
            return None
        return tuple(exact_sum(pair) for pair in zip(stored, waiting, strict=True))

    def spends(
        self, windows: Sequence[SpendWindow], *, now: datetime | None = None
    ) -> tuple[Decimal, ...]:
        """The spend of each ``(window, scope)`` pair at ``now``, in order: what
        [`spend`][] returns for each, read in one bounded operation and one statement
        (one round trip, one snapshot). The budget gate reads its day and month, scope
        and global, through this.

        Examples:
            >>> ledger.spends([("day", "tenant-1"), ("month", None)])  # doctest: +SKIP
            (Decimal('0.42'), Decimal('17.3'))
        """
        return self._spends(windows, now, None)

    async def aspends(
        self, windows: Sequence[SpendWindow], *, now: datetime | None = None
    ) -> tuple[Decimal, ...]:
        """[`spends`][] in a worker thread, bounded from this call (with
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
            with self._db.connection(operation, transaction=True) as connection:
                self._db.lock_ledger(connection)
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
            self._writes.generation += (
                1  # committed: the hold counts in this process's gates at once
            )
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

        Raises [`BudgetExceededError`][] naming the first limit
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
        """[`reserve`][] in a worker thread, bounded from this call."""
        return await asyncio.to_thread(self._reserve, amount, limits, scope, now, time.monotonic())

    def entries(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        scope: str | None = None,
        model: str | None = None,
        kind: str | None = None,
        run: str | None = None,
        thread: str | None = None,
    ) -> list[LedgerEntry]:
        """Stored entries with ``since <= timestamp < until`` (either bound optional) and
        the given ``scope``, ``model``, ``kind``, agent ``run`` (``run_id``) and
        ``thread`` (``thread_id``) (None: any), oldest first, read in one operation.
        Writes still pending are not listed until they are stored.

        Examples:
            >>> ledger.entries(since, until, model="gpt-4o")  # doctest: +SKIP
            >>> ledger.entries(run="run-7")  # doctest: +SKIP

        Bounded like every operation (the database's part of it): for reads of millions
        of rows use [`iter_entries`][], pass narrower bounds, or open the ledger with a
        larger ``operation_timeout``.
        """
        filters = check_entry_filters(since, until, scope, model, kind, run=run, thread=thread)
        return self._entries(filters, None)

    def _entries(self, filters: EntryFilters, started: float | None) -> list[LedgerEntry]:
        found, _ = self._page(filters, None, None, started)  # every row: one page
        found.sort(key=lambda entry: entry.timestamp)  # stable: rows of older forms
        return found

    async def aentries(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        scope: str | None = None,
        model: str | None = None,
        kind: str | None = None,
        run: str | None = None,
        thread: str | None = None,
    ) -> list[LedgerEntry]:
        """[`entries`][] in a worker thread, bounded from this call."""
        filters = check_entry_filters(since, until, scope, model, kind, run=run, thread=thread)
        return await asyncio.to_thread(self._entries, filters, time.monotonic())

    def iter_entries(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        scope: str | None = None,
        model: str | None = None,
        kind: str | None = None,
        run: str | None = None,
        thread: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> Iterator[LedgerEntry]:
        """[`entries`][], streamed: ``page_size`` rows (default 1,000) per read, so a
        month of entries never has to fit in memory.

        Examples:
            >>> for entry in ledger.iter_entries(since, until, scope="tenant-1"):  # doctest: +SKIP
            ...     print(entry.cost)

        Pages follow ``(timestamp, id)`` (keyset pagination: each page is an index range
        scan, however deep). Each page is one operation bounded by ``operation_timeout``,
        and no connection is held between pages, so a slow consumer holds no lock or
        snapshot. The pages are separate snapshots: an entry stored while the iteration
        runs is listed if it sorts after the page being read. Filters are checked on the
        call, before the first entry is asked for.
        """
        checked = check_entry_filters(since, until, scope, model, kind, run=run, thread=thread)
        checks.whole("page_size", page_size, minimum=1, maximum=checks.MAX_COUNT)
        return self._pages(checked, page_size)

    def aiter_entries(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        scope: str | None = None,
        model: str | None = None,
        kind: str | None = None,
        run: str | None = None,
        thread: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> AsyncIterator[LedgerEntry]:
        """[`iter_entries`][] for async callers: each page is read in a worker thread,
        bounded from when it is asked for; the event loop never waits on the database.

        Examples:
            >>> async for entry in ledger.aiter_entries(since, until):  # doctest: +SKIP
            ...     total += entry.cost
        """
        checked = check_entry_filters(since, until, scope, model, kind, run=run, thread=thread)
        checks.whole("page_size", page_size, minimum=1, maximum=checks.MAX_COUNT)
        return self._apages(checked, page_size)

    def _page(
        self,
        filters: EntryFilters,
        page_size: int | None,
        after: Cursor | None,
        started: float | None,
    ) -> tuple[list[LedgerEntry], Cursor | None]:
        """One page of entries after ``after`` (``page_size`` None: all of them), in one
        bounded operation."""

        def read(operation: Operation) -> tuple[list[LedgerEntry], Cursor | None]:
            with self._db.connection(operation) as connection:
                return read_page(
                    connection,
                    filters.since,
                    filters.until,
                    scope=filters.scope,
                    model=filters.model,
                    kind=filters.kind,
                    run=filters.run,
                    thread=filters.thread,
                    after=after,
                    limit=page_size,
                    postgres=self._db.postgres,
                )

        return self._read("entries", started, read)

    def _pages(self, filters: EntryFilters, page_size: int) -> Iterator[LedgerEntry]:
        cursor: Cursor | None = None
        while True:
            page, cursor = self._page(filters, page_size, cursor, None)
            yield from page
            if cursor is None:
                return

    async def _apages(self, filters: EntryFilters, page_size: int) -> AsyncIterator[LedgerEntry]:
        cursor: Cursor | None = None
        while True:
            page, cursor = await asyncio.to_thread(
                self._page, filters, page_size, cursor, time.monotonic()
            )
            for entry in page:
                yield entry
            if cursor is None:
                return

    def run_spend(self, *, run: str | None = None, thread: str | None = None) -> Decimal:
        """The exact cost of every entry of agent ``run`` (its ``run_id``), or of
        ``thread`` (``thread_id``): exactly one of the two, else ``TypeError``.

        Examples:
            >>> ledger.run_spend(run="run-7")  # doctest: +SKIP
            Decimal('0.0123')
            >>> ledger.run_spend(thread="thread-42")  # doctest: +SKIP
            Decimal('0.4571')

        One bounded operation: a ``SUM`` over the column's index (exact, as every sum of
        the ledger), plus the entries of that run still waiting in this process
        (write-behind's queue, or an outage's), which are spend already recorded.
        """
        column, value = check_run_or_thread(run, thread)
        return self._run_spend(column, value, None)

    async def arun_spend(self, *, run: str | None = None, thread: str | None = None) -> Decimal:
        """[`run_spend`][] in a worker thread, bounded from this call."""
        column, value = check_run_or_thread(run, thread)
        return await asyncio.to_thread(self._run_spend, column, value, time.monotonic())

    def _run_spend(self, column: RunColumn, value: str, started: float | None) -> Decimal:
        def read(operation: Operation) -> Decimal:
            # Pending first: a write stored meanwhile is then counted twice, never missed.
            waiting = self._pending.unwritten_run_cost(column, value)
            with self._db.connection(operation) as connection:
                stored = read_run_spend(connection, column, value, postgres=self._db.postgres)
            return exact_sum((stored, waiting))

        # Write-behind leaves storing the queue to its writer, as a gate's read does.
        return self._read("run_spend", started, read, flush=self._flusher is None)

    def report(
        self,
        by: Grouping = "day",
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        scope: str | None = None,
        run: str | None = None,
        thread: str | None = None,
    ) -> SpendReport:
        """This ledger's spend per ``by`` group over ``since <= timestamp < until``, of
        ``scope``, agent ``run`` and ``thread`` (None: all), grouped by the database in
        one bounded operation (exact sums).

        Examples:
            >>> ledger.report(by="model", since=first_of_month).rows  # doctest: +SKIP
            >>> ledger.report(by="run", thread="thread-42").rows  # doctest: +SKIP

        What a budget has left is policy, not storage: ``spend_report(ledger, ...,
        budget=)`` (`llm_resilience.spend`) adds it to the same report.
        """
        return grouped_report(self, by, since, until, scope=scope, run=run, thread=thread)

    def _spend_rows(
        self,
        by: Grouping,
        low: datetime | None,
        high: datetime | None,
        scope: str | None,
        *,
        run: str | None = None,
        thread: str | None = None,
    ) -> list[SpendRow]:
        """What `spend_report` reads: the rows grouped by the
        database in one bounded operation (``GROUP BY``; exact sums, see ``_queries``).
        Writes still pending are not in them (a report's ``remaining`` reads
        [`spend`][], which counts them)."""

        def read(operation: Operation) -> list[SpendRow]:
            with self._db.connection(operation) as connection:
                groups = read_groups(
                    connection,
                    by,
                    low,
                    high,
                    scope=scope,
                    postgres=self._db.postgres,
                    run=run,
                    thread=thread,
                )
            return [SpendRow(*group) for group in groups]

        return self._read("report", None, read)

    # -- closing ------------------------------------------------------------------------

    def close(self) -> None:
        """Store pending writes, then close the pooled connections and stop the
        watchdog; a later call opens new ones.

        Storing takes one bounded operation (``operation_timeout``), and more while the
        database is busy with other writers or the queue is longer than one stores: at
        most three ``operation_timeout`` in all, after waiting up to one for the
        write-behind writer's flush in progress. Writes still pending after that are
        logged (count and money) and kept for the next operation, or the exit of the
        process (which tries within the same bound).
        """
        if self._flusher is not None:
            self._flusher.stop(self._timeout)
        try:
            self._writes.store_pending("close")
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
            self._db.close()

    async def aclose(self) -> None:
        """[`close`][] in a worker thread."""
        await asyncio.to_thread(self.close)

    def _exit(self) -> None:
        try:
            self._writes.store_pending("exit")
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
