"""Writes the ledger could not make yet, kept in order until the database answers again.

A ``record`` or ``settle`` that fails because the database is down, locked or too slow
is not lost: it waits here, oldest first, and the ledger writes it before its next
operation. Each write carries its entry's unique ``entry_id``, so writing it again
after a failure that had in fact committed stores nothing twice. The queue is bounded:
when full, the oldest write is dropped and counted (write-behind may let it grow past
its capacity, to a limit of its own, while the database answers).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from llm_resilience.ledger._protocol import (
    WINDOWS,
    LedgerEntry,
    RunColumn,
    exact_sum,
    window_key,
)
from llm_resilience.telemetry import record_ledger_dropped, record_ledger_pending

__all__ = ["DEFAULT_MAX_PENDING", "PendingWrite", "PendingWrites"]

#: Writes one ledger keeps while its database does not answer: at about 0.5 KB each,
#: 10,000 hold a few MB and, at 10 calls a second, over 15 minutes of outage.
DEFAULT_MAX_PENDING = 10_000


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """A ``record`` (``hold_id`` None) or a ``settle`` (release ``hold_id``, then record
    ``entry`` if any), in the order the ledger was asked for them."""

    #: The entry to store, or None (a settle that only releases its hold).
    entry: LedgerEntry | None
    #: The strict-mode hold a settle releases, in the same transaction.
    hold_id: str | None = None
    #: Position in the queue: increasing, never reused.
    sequence: int = -1


class PendingWrites:
    """A bounded FIFO of `PendingWrite`, with the money it holds per window.

    Thread-safe. ``unwritten_cost`` lets a read add what is still waiting here, so a
    gate sees the spend it was told about even before it reaches the database.
    """

    __slots__ = (
        "_backend",
        "_keys",
        "_lock",
        "_room",
        "_sequence",
        "_totals",
        "_writes",
        "capacity",
        "dropped",
    )

    def __init__(self, capacity: int, *, backend: str) -> None:
        #: The most writes kept; the oldest is dropped to make room.
        self.capacity = capacity
        #: Writes given up so far (queue full, or refused by the database).
        self.dropped = 0
        self._backend = backend
        self._lock = threading.Lock()
        # Notified whenever writes leave the queue (see ``wait_for_room``).
        self._room = threading.Condition(self._lock)
        self._writes: deque[PendingWrite] = deque()
        self._sequence = 0
        # (window key, scope or None for every scope) -> money of the writes waiting.
        self._totals: dict[tuple[str, str | None], Decimal] = {}
        # (year, month, day) -> the keys of the windows holding that day.
        self._keys: dict[tuple[int, int, int], tuple[str, ...]] = {}

    def __len__(self) -> int:
        return len(self._writes)

    def push(
        self, entry: LedgerEntry | None, hold_id: str | None, *, limit: int | None = None
    ) -> bool:
        """Queue a write behind the others; True if the oldest were dropped to make room:
        at most ``limit`` writes are kept (None: ``capacity``)."""
        most = self.capacity if limit is None else limit
        dropped = 0
        with self._lock:
            self._sequence += 1
            self._writes.append(PendingWrite(entry, hold_id, self._sequence))
            self._count(entry, +1)
            while len(self._writes) > most:
                self._count(self._writes.popleft().entry, -1)
                dropped += 1
            self.dropped += dropped
        record_ledger_pending(+1, backend=self._backend)
        if dropped:
            record_ledger_pending(-dropped, backend=self._backend)
            record_ledger_dropped(dropped, backend=self._backend)
        return bool(dropped)

    def full(self) -> bool:
        """Whether the next `push` would drop the oldest write."""
        return len(self._writes) >= self.capacity

    def wait_for_room(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until the queue is not full; True if it is not."""
        with self._room:
            return self._room.wait_for(lambda: len(self._writes) < self.capacity, timeout)

    def oldest(self, count: int) -> list[PendingWrite]:
        """Up to ``count`` writes from the front, left in place."""
        with self._lock:
            return [self._writes[index] for index in range(min(count, len(self._writes)))]

    def written(self, writes: Sequence[PendingWrite]) -> None:
        """``writes`` (taken from the front) are stored: forget them."""
        self._remove(writes[-1].sequence, dropped=False)

    def refused(self, write: PendingWrite) -> None:
        """The database refused ``write`` (from the front) for good: drop and count it."""
        self._remove(write.sequence, dropped=True)

    def unwritten_cost(self, key: str, scope: str | None) -> Decimal:
        """Money waiting here for the window ``key`` (``"day:2026-11-29"``) and ``scope``
        (None: every scope)."""
        with self._lock:
            return self._totals.get((key, scope), Decimal(0))

    def unwritten_costs(self, windows: Sequence[tuple[str, str | None]]) -> list[Decimal]:
        """`unwritten_cost` of each ``(key, scope)``, under one lock."""
        zero = Decimal(0)
        with self._lock:
            return [self._totals.get(window, zero) for window in windows]

    def unwritten_run_cost(self, column: RunColumn, value: str) -> Decimal:
        """Money waiting here for the entries whose ``column`` (``run_id`` or
        ``thread_id``) is ``value``: a scan of the queue (at most ``capacity`` writes,
        usually none or one write-behind interval's), under the lock."""
        with self._lock:
            costs = [
                write.entry.cost
                for write in self._writes
                if write.entry is not None and getattr(write.entry, column) == value
            ]
        return exact_sum(costs)

    def summary(self) -> tuple[int, Decimal]:
        """How many writes wait, and the money of their entries."""
        with self._lock:
            writes = list(self._writes)
        return len(writes), exact_sum(w.entry.cost for w in writes if w.entry is not None)

    def _remove(self, through: int, *, dropped: bool) -> None:
        removed = 0
        with self._lock:
            # The money of the writes removed, per window and scope, taken off the totals
            # with one exact sum each: a write-behind batch holds 100 writes, and the
            # writers recording meanwhile wait for this lock.
            costs: dict[tuple[str, str | None], list[Decimal]] = {}
            while self._writes and self._writes[0].sequence <= through:
                entry = self._writes.popleft().entry
                removed += 1
                if entry is not None:
                    for window in self._windows(entry):
                        costs.setdefault(window, []).append(entry.cost)
            for window, amounts in costs.items():
                total = exact_sum((self._totals.get(window, Decimal(0)), -exact_sum(amounts)))
                if total:
                    self._totals[window] = total
                else:
                    self._totals.pop(window, None)
            if dropped:
                self.dropped += removed
            if removed:
                self._room.notify_all()
        if removed:
            record_ledger_pending(-removed, backend=self._backend)
            if dropped:
                record_ledger_dropped(removed, backend=self._backend)

    def _windows(self, entry: LedgerEntry) -> list[tuple[str, str | None]]:
        """The ``(window key, scope)`` totals ``entry`` counts in (under the lock)."""
        when = entry.timestamp
        day = (when.year, when.month, when.day)
        keys = self._keys.get(day)
        if keys is None:
            if len(self._keys) > 64:
                self._keys.clear()
            keys = self._keys[day] = tuple(window_key(window, when) for window in WINDOWS)
        scopes = (None,) if entry.scope is None else (None, entry.scope)
        return [(key, scope) for key in keys for scope in scopes]

    def _count(self, entry: LedgerEntry | None, sign: int) -> None:
        if entry is None:
            return
        amount = entry.cost if sign > 0 else -entry.cost
        for window in self._windows(entry):
            total = exact_sum((self._totals.get(window, Decimal(0)), amount))
            if total:
                self._totals[window] = total
            else:
                self._totals.pop(window, None)
