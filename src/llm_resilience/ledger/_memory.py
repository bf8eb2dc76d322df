"""The in-process ledger: exact, thread-safe, and forgotten when the process exits."""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import cast

from llm_resilience import checks
from llm_resilience.checks import duration, whole
from llm_resilience.ledger._groups import (
    Grouping,
    SpendReport,
    SpendRow,
    group_entries,
    grouped_report,
)
from llm_resilience.ledger._protocol import (
    DEFAULT_RESERVATION_TTL,
    ROW_COST,
    ROW_RUN_ID,
    ROW_SCOPE,
    ROW_THREAD_ID,
    ROW_TIMESTAMP,
    CheckedLimits,
    EntryRow,
    LedgerEntry,
    Reservation,
    RunColumn,
    SpendWindow,
    Window,
    _window_pairs,
    check_amount,
    check_entry_filters,
    check_hold_scope,
    check_limits,
    check_now,
    check_run_or_thread,
    check_scope,
    check_windows,
    entry_of_row,
    exact_sum,
    refusal,
    window_key,
    window_keys,
)
from llm_resilience.money import EXACT

__all__ = ["InMemoryCostLedger"]

_ZERO = Decimal(0)


def _entry_filter(
    since: datetime | None,
    until: datetime | None,
    scope: str | None,
    model: str | None,
    kind: str | None,
    run: str | None,
    thread: str | None,
) -> tuple[datetime | None, datetime | None, Callable[..., bool]]:
    """Checked bounds and a test ``wanted(entry, low, high)`` for the ``entries`` filters."""
    low, high, scope, model, kind, run, thread = check_entry_filters(
        since, until, scope, model, kind, run=run, thread=thread
    )

    def wanted(entry: LedgerEntry, low: datetime | None, high: datetime | None) -> bool:
        return (
            (low is None or entry.timestamp >= low)
            and (high is None or entry.timestamp < high)
            and (scope is None or entry.scope == scope)
            and (model is None or entry.model == model)
            and (kind is None or entry.kind == kind)
            and (run is None or entry.run_id == run)
            and (thread is None or entry.thread_id == thread)
        )

    return low, high, wanted


class InMemoryCostLedger:
    """A ledger in this process's memory: the default, and lost on restart.

    Examples:
        >>> from datetime import UTC, datetime
        >>> ledger = InMemoryCostLedger()
        >>> now = datetime(2026, 11, 29, 10, tzinfo=UTC)
        >>> ledger.record(LedgerEntry(now, "chat", cost=Decimal("0.1")))
        >>> ledger.record(LedgerEntry(now, "ocr", pages=3, cost=Decimal("0.2")))
        >>> ledger.spend("day", now=now)
        Decimal('0.3')

    Running totals per UTC day and month (globally and per scope) make [`spend`][]
    O(1) plus the live holds; one lock makes [`reserve`][] atomic across threads.
    Holds count toward spend for ``reservation_ttl`` (15 minutes by default) unless
    settled first. [`entries`][] returns the latest ``max_entries`` (100,000, about
    30 MB; None keeps all) so a long-lived process does not grow without bound; spend
    always counts every entry, and [`run_spend`][] every entry of a run or thread still
    listed or recorded to since. Share one instance between every wrapper of the process; use
    [`SqlCostLedger`][] to keep spend across restarts and
    processes.
    """

    __slots__ = (
        "_entries",
        "_holds",
        "_lock",
        "_max_runs",
        "_rows",
        "_runs",
        "_totals",
        "reservation_ttl",
    )

    #: Default bound on the entries kept for [`entries`][].
    DEFAULT_MAX_ENTRIES = 100_000

    #: Spend does not survive the process: the budget gate warns when this ledger is used.
    persistent = False

    #: [`arecord`][] is [`record`][] called in place (`inline_recorder`).
    _arecord_records = True

    def __init__(
        self,
        *,
        reservation_ttl: timedelta = DEFAULT_RESERVATION_TTL,
        max_entries: int | None = DEFAULT_MAX_ENTRIES,
    ) -> None:
        #: How long an unsettled hold counts toward spend.
        self.reservation_ttl = duration("reservation_ttl", reservation_ttl)
        self._lock = threading.Lock()
        if max_entries is not None:
            whole("max_entries", max_entries, minimum=1)
        # A gate's entries arrive as rows (`_record_row`) and are built when first read.
        self._entries: deque[LedgerEntry | EntryRow] = deque(maxlen=max_entries)
        # Whether ``_entries`` may hold a row not built into its entry yet.
        self._rows = False
        self._totals: dict[tuple[str, str | None], Decimal] = {}
        self._holds: dict[str, Reservation] = {}
        # (run_id or thread_id, its value) -> exact cost, least recently recorded first.
        self._runs: dict[tuple[RunColumn, str], Decimal] = {}
        # Each entry adds to a run and a thread: twice the entries kept keeps the total
        # of every run and thread that has an entry listed.
        self._max_runs = None if max_entries is None else 2 * max_entries

    def __repr__(self) -> str:
        return f"InMemoryCostLedger(entries={len(self._entries)}, holds={len(self._holds)})"

    def record(self, entry: LedgerEntry) -> None:
        """Store ``entry``; it counts toward its UTC day and month at once."""
        if not isinstance(entry, LedgerEntry):
            raise TypeError(f"entry must be a LedgerEntry, got {entry!r}")
        with self._lock:
            self._add(entry)

    async def arecord(self, entry: LedgerEntry) -> None:
        """[`record`][]; it never waits for more than the lock's brief hold."""
        self.record(entry)

    def _record_row(self, row: EntryRow) -> None:
        """[`record`][] of the entry ``row`` stands for (a budget gate's `checked_row`,
        checked already), kept as the row until an entry is read (`row_recorder`)."""
        with self._lock:
            self._entries.append(row)
            self._rows = True
            self._count(
                row[ROW_COST],
                row[ROW_SCOPE],
                row[ROW_TIMESTAMP],
                row[ROW_RUN_ID],
                row[ROW_THREAD_ID],
            )

    def spend(
        self, window: Window, *, scope: str | None = None, now: datetime | None = None
    ) -> Decimal:
        """Exact spend of the UTC ``window`` holding ``now``: entries plus live holds,
        of ``scope`` only, or of every scope when ``scope`` is None."""
        when = check_now(now)
        key = (window_key(window, when), check_scope(scope))
        with self._lock:
            return self._spend(key, window, when)

    async def aspend(
        self, window: Window, *, scope: str | None = None, now: datetime | None = None
    ) -> Decimal:
        """[`spend`][], for async callers."""
        return self.spend(window, scope=scope, now=now)

    def spends(
        self, windows: Sequence[SpendWindow], *, now: datetime | None = None
    ) -> tuple[Decimal, ...]:
        """The spend of each ``(window, scope)`` pair at one instant, in order: what
        [`spend`][] would return for each, read under one hold of the lock.

        Examples:
            >>> ledger = InMemoryCostLedger()
            >>> ledger.spends([("day", None), ("month", "tenant-1")])
            (Decimal('0'), Decimal('0'))
        """
        when = check_now(now)
        checked = check_windows(windows)
        with self._lock:
            return tuple(
                self._spend((window_key(window, when), scope), window, when)
                for window, scope in checked
            )

    async def aspends(
        self, windows: Sequence[SpendWindow], *, now: datetime | None = None
    ) -> tuple[Decimal, ...]:
        """[`spends`][], for async callers."""
        return self.spends(windows, now=now)

    def _gate_spends(self, limits: CheckedLimits, now: datetime) -> list[Decimal]:
        """[`spends`][] of ``limits``' windows, for a budget gate of ours (`gate_reader`):
        their windows and scopes were checked when the budget was built and the call
        admitted, and ``now`` is the gate's UTC clock, so nothing is checked again; the
        same totals and live holds are read, under one hold of the lock."""
        day, month = _window_pairs.get(now.toordinal()) or window_keys(now)
        spends: list[Decimal] = []
        with self._lock:
            if self._holds:
                for window, scope, _ in limits.triples:
                    key = (day if window == "day" else month, scope)
                    spends.append(self._spend(key, window, now))
            else:  # no hold to add: the running totals are the spend
                totals = self._totals
                for window, scope, _ in limits.triples:
                    spends.append(totals.get((day if window == "day" else month, scope), _ZERO))
        return spends

    def reserve(
        self,
        amount: Decimal,
        *,
        limits: Mapping[tuple[Window, str | None], Decimal],
        scope: str | None,
        now: datetime | None = None,
    ) -> Reservation:
        """Hold ``amount`` if every limit admits it, all under one lock.

        Raises [`BudgetExceededError`][] naming the first limit
        (in ``limits`` order) that ``spend + amount`` would exceed, holding nothing.
        """
        amount = check_amount(amount)
        checked = check_limits(limits)
        when = check_now(now)
        hold = Reservation(uuid.uuid4().hex, amount, check_hold_scope(limits, scope), when)
        # Forget holds that are dead both at ``now`` and on the real clock, so a caller
        # passing a past ``now`` never drops a hold that other callers still count.
        horizon = min(when, datetime.now(UTC)) - self.reservation_ttl
        with self._lock:
            for dead in [key for key, held in self._holds.items() if held.timestamp <= horizon]:
                del self._holds[dead]
            for window, limit_scope, limit in checked:
                spent = self._spend((window_key(window, when), limit_scope), window, when)
                error = refusal(window, limit_scope, limit, spent, amount)
                if error is not None:
                    raise error
            self._holds[hold.id] = hold
        return hold

    async def areserve(
        self,
        amount: Decimal,
        *,
        limits: Mapping[tuple[Window, str | None], Decimal],
        scope: str | None,
        now: datetime | None = None,
    ) -> Reservation:
        """[`reserve`][], for async callers."""
        return self.reserve(amount, limits=limits, scope=scope, now=now)

    def settle(self, reservation: Reservation, entry: LedgerEntry | None) -> None:
        """Release ``reservation`` and record ``entry`` (if not None) atomically."""
        if entry is not None and not isinstance(entry, LedgerEntry):
            raise TypeError(f"entry must be a LedgerEntry or None, got {entry!r}")
        with self._lock:
            self._holds.pop(reservation.id, None)
            if entry is not None:
                self._add(entry)

    async def asettle(self, reservation: Reservation, entry: LedgerEntry | None) -> None:
        """[`settle`][], for async callers."""
        self.settle(reservation, entry)

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
        """Entries with ``since <= timestamp < until`` (either bound optional) and the
        given ``scope``, ``model``, ``kind``, agent ``run`` (``run_id``) and ``thread``
        (``thread_id``) (None: any), oldest first.

        Examples:
            >>> InMemoryCostLedger().entries(kind="ocr", run="run-7")
            []
        """
        low, high, wanted = _entry_filter(since, until, scope, model, kind, run, thread)
        with self._lock:
            chosen = [entry for entry in self._built() if wanted(entry, low, high)]
        chosen.sort(key=lambda entry: entry.timestamp)  # stable: ties keep recording order
        return chosen

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
        """[`entries`][], for async callers."""
        return self.entries(
            since, until, scope=scope, model=model, kind=kind, run=run, thread=thread
        )

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
        page_size: int = 1000,
    ) -> Iterator[LedgerEntry]:
        """[`entries`][] as an iterator (the entries are in memory already; this and
        ``page_size`` are for code written against [`SqlCostLedger.iter_entries`][])."""
        checks.whole("page_size", page_size, minimum=1, maximum=checks.MAX_COUNT)
        return iter(
            self.entries(since, until, scope=scope, model=model, kind=kind, run=run, thread=thread)
        )

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
        page_size: int = 1000,
    ) -> AsyncIterator[LedgerEntry]:
        """[`iter_entries`][] for async callers (as [`SqlCostLedger.aiter_entries`][])."""
        chosen = self.iter_entries(
            since,
            until,
            scope=scope,
            model=model,
            kind=kind,
            run=run,
            thread=thread,
            page_size=page_size,
        )

        async def entries() -> AsyncIterator[LedgerEntry]:
            for entry in chosen:
                yield entry

        return entries()

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
        """This ledger's spend per ``by`` group over ``since <= timestamp < until``
        (``"day"``, ``"month"``, ``"model"``, ``"kind"``, ``"surface"``, ``"scope"``,
        ``"run"`` or ``"thread"``), of ``scope``, ``run`` and ``thread`` (None: all).

        Examples:
            >>> InMemoryCostLedger().report(by="model").rows
            ()

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
        return group_entries(self.entries(low, high, scope=scope, run=run, thread=thread), by)

    def run_spend(self, *, run: str | None = None, thread: str | None = None) -> Decimal:
        """The exact cost of every entry recorded for agent ``run`` (its ``run_id``), or
        for ``thread`` (``thread_id``): exactly one of the two, else ``TypeError``.

        Examples:
            >>> from datetime import UTC, datetime
            >>> ledger = InMemoryCostLedger()
            >>> now = datetime(2026, 11, 29, 10, tzinfo=UTC)
            >>> ledger.record(LedgerEntry(now, "chat", cost=Decimal("0.1"), run_id="r1"))
            >>> ledger.record(LedgerEntry(now, "chat", cost=Decimal("0.2"), run_id="r1"))
            >>> ledger.run_spend(run="r1"), ledger.run_spend(thread="t1")
            (Decimal('0.3'), Decimal('0'))

        A running total per run and per thread, read in O(1), counts entries that
        ``max_entries`` no longer lists; the totals of the ``max_entries`` runs and
        threads recorded to most recently are kept (so every run or thread with an entry
        still listed), older ones are forgotten and read 0.
        """
        key = check_run_or_thread(run, thread)
        with self._lock:
            return self._runs.get(key, _ZERO)

    async def arun_spend(self, *, run: str | None = None, thread: str | None = None) -> Decimal:
        """[`run_spend`][], for async callers."""
        return self.run_spend(run=run, thread=thread)

    def close(self) -> None:
        """Nothing to release; the entries stay readable."""

    def _add(self, entry: LedgerEntry) -> None:
        """Keep ``entry`` and add its cost to the running totals it counts toward; the
        caller holds the lock."""
        self._entries.append(entry)
        self._count(entry.cost, entry.scope, entry.timestamp, entry.run_id, entry.thread_id)

    def _count(
        self,
        cost: Decimal,
        scope: str | None,
        when: datetime,
        run_id: str | None,
        thread_id: str | None,
    ) -> None:
        """Add an entry's ``cost`` to the running totals it counts toward: its UTC day and
        month, globally and for its ``scope``, and its run's and thread's; the caller
        holds the lock."""
        totals, zero, add = self._totals, _ZERO, EXACT.add
        day, month = _window_pairs.get(when.toordinal()) or window_keys(when)  # kept per day
        key: tuple[str, str | None] = (day, None)
        totals[key] = add(totals.get(key, zero), cost)
        if scope is not None:
            key = (day, scope)
            totals[key] = add(totals.get(key, zero), cost)
        key = (month, None)
        totals[key] = add(totals.get(key, zero), cost)
        if scope is not None:
            key = (month, scope)
            totals[key] = add(totals.get(key, zero), cost)
        if run_id is not None:
            self._add_run(("run_id", run_id), cost)
        if thread_id is not None:
            self._add_run(("thread_id", thread_id), cost)

    def _built(self) -> deque[LedgerEntry]:
        """``_entries`` with every row built into its entry (once: they are kept built);
        the caller holds the lock."""
        if self._rows:
            entries = self._entries
            self._entries = deque(
                (entry_of_row(each) if type(each) is tuple else each for each in entries),
                maxlen=entries.maxlen,
            )
            self._rows = False
        return cast("deque[LedgerEntry]", self._entries)

    def _add_run(self, key: tuple[RunColumn, str], cost: Decimal) -> None:
        """Add ``cost`` to a run's or thread's total, now the most recent; the caller
        holds the lock."""
        runs = self._runs
        runs[key] = EXACT.add(runs.pop(key, _ZERO), cost)  # re-inserted: the newest
        if self._max_runs is not None and len(runs) > self._max_runs:
            del runs[next(iter(runs))]  # the run or thread recorded to least recently

    def _spend(self, key: tuple[str, str | None], window: Window, when: datetime) -> Decimal:
        """Total plus live holds of one window and scope; the caller holds the lock."""
        total = self._totals.get(key, _ZERO)
        if not self._holds:
            return total
        held = (
            hold.amount
            for hold in self._holds.values()
            if hold.timestamp + self.reservation_ttl > when
            and window_key(window, hold.timestamp) == key[0]
            and (key[1] is None or hold.scope == key[1])
        )
        return exact_sum((total, *held))
