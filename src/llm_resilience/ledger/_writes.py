"""The SQL ledger's writes: each stored at once, or kept pending and stored in order.

A ``record`` or ``settle`` goes to the database within one bounded operation; when the
database does not take it (down, locked, too slow) it waits in
``PendingWrites`` and is stored, oldest first and in batches of ``FLUSH_BATCH``, before the
ledger's next operation. With write-behind, ``record`` only queues its entry and a
``Flusher`` thread stores the queue. The reads and holds are in ``_sql``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence

from sqlalchemy import delete
from sqlalchemy import exc as sa_exc

from llm_resilience.errors import LedgerTimeoutError
from llm_resilience.ledger._behind import Flusher, Outcome
from llm_resilience.ledger._connections import Connections, contended, must_retry, unavailable
from llm_resilience.ledger._pending import PendingWrite, PendingWrites
from llm_resilience.ledger._postgres import (
    batch_parameters,
    psycopg_statements,
    record_entries,
    record_entry,
    record_parameters,
)
from llm_resilience.ledger._protocol import LedgerEntry
from llm_resilience.ledger._schema import (
    SQLITE_RETURNING,
    holds,
    insert_entry,
    sqlite_insert,
    sqlite_insert_many,
    sqlite_release,
)
from llm_resilience.ledger._watchdog import Operation

__all__ = ["BEHIND_OVERFLOW", "CLOSE_BOUNDS", "FLUSH_BATCH", "Writes"]

# The ledger's own logger: its warnings keep the name users filter on.
logger = logging.getLogger("llm_resilience.ledger._sql")

# PostgreSQL's record (by whether the entry has a scope) and batch statements, as run on
# the ledger's own psycopg connections.
_RECORD, _BATCH = psycopg_statements()
#: Pending writes stored per transaction when the database answers again.
FLUSH_BATCH = 100
#: Tries of a PostgreSQL write the database asks to be retried (a deadlock or a
#: serialisation failure rolls the whole transaction back, so trying again is safe).
RETRY_ATTEMPTS = 5
#: The longest pause between two such tries, in seconds (each pause is random, up to
#: 5 ms x 2^try, so that the writers that collided do not collide again).
RETRY_PAUSE = 0.1
#: Write-behind, while the database answers: a record that waited a whole
#: ``operation_timeout`` for room keeps its entry anyway, the queue growing past
#: ``max_pending`` up to this many times it (then the oldest is dropped).
BEHIND_OVERFLOW = 2
#: ``close()`` and the exit hook keep storing, one bounded operation after another,
#: while the database is busy with other writers or the queue is longer than one
#: operation stores, for at most this many ``operation_timeout`` in all.
CLOSE_BOUNDS = 3
#: At most one WARNING per this many seconds says the writer found the database busy.
CONTENTION_WARNING_EVERY = 60.0


class Writes:
    """A ledger's writes to ``db``, kept in ``pending`` while the database fails.

    ``label`` names the ledger in log lines (its repr: the URL, password hidden).
    ``behind_interval`` (seconds, None: off) starts write-behind: ``queue`` then only
    queues, never touching the database, and a writer thread named ``behind_name``
    stores the queue every interval. While the database answers the writer (its last
    try stored, or ran out of time waiting for a lock that other writers hold and pass
    on: *contended*, and then the writer tries again at once), a full queue
    (``max_pending``) makes ``queue`` wait up to ``behind_wait`` seconds for room, and
    keep its entry even without room, up to ``BEHIND_OVERFLOW`` times ``max_pending``:
    nothing is dropped. While the writer finds the database away (unreachable, or
    locked with nobody committing), a full queue drops its oldest write at once,
    counted and warned, as in any outage.
    """

    def __init__(
        self,
        db: Connections,
        pending: PendingWrites,
        *,
        label: str,
        behind_interval: float | None,
        behind_wait: float,
        behind_name: str,
    ) -> None:
        self._db = db
        #: Writes waiting for the database, oldest first.
        self.pending = pending
        self._label = label
        self._flushing = threading.Lock()
        #: Bumped after every write this process makes, before the written entries leave
        #: ``pending``: a cached gate read taken under an older value is stale.
        self.generation = 0
        # Write-behind: whether the writer's last try found the database away, and
        # whether the queue has dropped a write since (one WARNING each per outage).
        self._behind_failing = False
        self._behind_dropping = False
        # Whether the queue grew past max_pending since the writer last caught up (one
        # WARNING each time), and the contended flushes not yet reported, since when.
        self._behind_over = False
        self._contended = 0
        self._contention_warned: float | None = None
        self._behind_wait = behind_wait
        #: The write-behind thread, or None without write-behind.
        self.flusher = (
            None
            if behind_interval is None
            else Flusher(self.flush_behind, interval=behind_interval, name=behind_name)
        )

    def _apply(self, operation: Operation, writes: Sequence[PendingWrite]) -> None:
        """Store ``writes`` in order, in one transaction (on PostgreSQL records alone are
        one statement). Entries already stored (same ``entry_id``) are skipped."""
        if self._db.postgres:
            self._apply_postgres(operation, writes)
            return
        if self._db.direct:
            with self._db.direct_reads(operation, transaction=True) as (run, reads):
                entries = [w.entry for w in writes if w.hold_id is None and w.entry is not None]
                batch = SQLITE_RETURNING and 1 < len(entries) == len(writes)
                if batch and all(entry.entry_id for entry in entries):
                    sqlite_insert_many(run, entries)  # a batch of records: one INSERT
                    reads.unaccounted()
                    return
                for write in writes:
                    if write.hold_id is not None:
                        sqlite_release(run, write.hold_id)
                        reads.unaccounted()  # the hold's amount is not known here
                    if write.entry is not None and sqlite_insert(run, write.entry):
                        reads.stored(write.entry)
            return
        with self._db.connection(operation, transaction=True) as connection:
            for write in writes:
                if write.hold_id is not None:
                    connection.execute(delete(holds).where(holds.c.id == write.hold_id))
                if write.entry is not None:
                    insert_entry(connection, write.entry)

    def _apply_postgres(self, operation: Operation, writes: Sequence[PendingWrite]) -> None:
        """`_apply` on PostgreSQL: the holds released first, then every entry in
        one statement that locks the totals in key order (so the writers of several
        processes never wait for each other in a cycle); a deadlock or serialisation
        failure the database reports anyway is tried again, a few times, within the
        operation's bound."""
        entries = [write.entry for write in writes if write.entry is not None]
        released = [write.hold_id for write in writes if write.hold_id is not None]

        def store() -> None:
            if not released and self._db.postgres_direct:
                with self._db.postgres_connection(operation) as cursor:  # one statement
                    if len(entries) == 1:
                        entry = entries[0]
                        cursor.execute(_RECORD[entry.scope is not None], record_parameters(entry))
                    else:
                        cursor.execute(_BATCH, batch_parameters(entries))
                return
            if not released:
                with self._db.connection(operation) as connection:  # one statement: atomic
                    if len(entries) == 1:
                        record_entry(connection, entries[0])
                    else:
                        record_entries(connection, entries)
                return
            with self._db.connection(operation, transaction=True) as connection:
                connection.execute(delete(holds).where(holds.c.id.in_(released)))
                if entries:
                    record_entries(connection, entries)

        attempt = 1
        while True:
            try:
                store()
                return
            except Exception as error:
                if not must_retry(error) or attempt >= RETRY_ATTEMPTS:
                    raise
                pause = random.uniform(0, min(RETRY_PAUSE, 0.005 * 2**attempt))
                if operation.remaining() <= pause:
                    raise
                logger.debug(
                    "%s retries a write the database asked to retry (%s), try %d",
                    self._label,
                    type(error).__name__,
                    attempt + 1,
                )
                time.sleep(pause)
                attempt += 1

    def flush(self, operation: Operation, until: float) -> int:
        """Store pending writes, oldest first, until none is left or ``until`` is near;
        returns how many left the queue.

        Raises the failure that stopped it (the writes stay pending). A write the
        database refuses outright (not a failure to answer) is dropped, counted and
        logged, so it cannot block the ones behind it. Does nothing while another thread
        is storing them.
        """
        if not len(self.pending) or not self._flushing.acquire(blocking=False):
            return 0
        done = 0
        try:
            with operation.phase(until):
                while batch := self.pending.oldest(FLUSH_BATCH):
                    if done and operation.remaining() < operation.bound / 4:
                        break  # the rest waits for the next operation, not past our bound
                    try:
                        self._apply(operation, batch)
                    except Exception as error:
                        if unavailable(error) or not isinstance(error, sa_exc.SQLAlchemyError):
                            raise
                        self._apply_one_by_one(operation, batch)
                    else:
                        self.generation += 1
                        self.pending.written(batch)
                    done += len(batch)
        finally:
            self._flushing.release()
        return done

    def _apply_one_by_one(self, operation: Operation, batch: Sequence[PendingWrite]) -> None:
        for write in batch:
            try:
                self._apply(operation, [write])
            except Exception as error:
                if unavailable(error) or not isinstance(error, sa_exc.SQLAlchemyError):
                    raise
                self.pending.refused(write)
                logger.error(
                    "%s dropped a pending %s that the database refused (%s); %d dropped so far.",
                    self._label,
                    "record" if write.hold_id is None else "settle",
                    type(error).__name__,
                    self.pending.dropped,
                )
            else:
                self.generation += 1
                self.pending.written([write])

    def write(self, name: str, write: PendingWrite, started: float | None) -> None:
        """Store ``write`` now, or keep it pending if the database does not take it."""
        try:
            operation = self._db.start(name, started)
        except LedgerTimeoutError as error:  # not even a connection slot in time
            self._keep(name, write, error)
            return
        try:
            if not len(self.pending):
                try:
                    self._apply(operation, [write])
                    self.generation += 1
                    return
                except Exception as error:
                    if not unavailable(error):
                        raise
                    self._keep(name, write, error)
                    return
            # Behind writes already waiting, so that they reach the database in order.
            dropped = self.pending.push(write.entry, write.hold_id)
            try:
                self.flush(operation, operation.deadline)
            except Exception as error:
                if not unavailable(error):
                    raise
                self._warn_kept(name, error, dropped)
                return
            if dropped:
                self._warn_kept(name, None, dropped)
        finally:
            self._db.end(operation)

    def _keep(self, name: str, write: PendingWrite, error: BaseException) -> None:
        self._warn_kept(name, error, self.pending.push(write.entry, write.hold_id))

    def _warn_kept(self, name: str, error: BaseException | None, dropped: bool) -> None:
        """One WARNING for a write that waits: the error's type only, never its text
        (which could quote the database's view of the row)."""
        full = (
            f" The queue was full: its oldest write was dropped "
            f"({self.pending.dropped} dropped so far)."
            if dropped
            else ""
        )
        if error is None:
            logger.warning("%s keeps writes waiting for the database.%s", self._label, full)
            return
        logger.warning(
            "%s could not %s (%s); the write waits in memory (%d pending) and is stored "
            "once the database answers.%s",
            self._label,
            name,
            type(error).__name__,
            len(self.pending),
            full,
        )

    def queue(self, entry: LedgerEntry) -> None:
        """Write-behind: queue ``entry`` for the writer thread. Never touches the
        database; waits (up to ``behind_wait``) only when `must_wait` says so."""
        assert self.flusher is not None
        if self.must_wait():
            # The writer falls behind a database that answers (slower than the callers,
            # or busy with other writers): wait for it to make room rather than drop
            # the oldest entry.
            self.flusher.wake()
            self.pending.wait_for_room(self._behind_wait)
        # While the database answers no entry is dropped, even without room (several
        # threads woken at once, or no room within the wait): the queue grows instead,
        # by at most one entry per waiting caller per ``behind_wait``, to a hard limit.
        capacity = self.pending.capacity
        limit = None if self._behind_failing else capacity * BEHIND_OVERFLOW
        if self.pending.push(entry, None, limit=limit) and not self._behind_dropping:
            self._behind_dropping = True  # one WARNING, not one per record
            self._warn_kept("record", None, True)
        if len(self.pending) > capacity and not self._behind_over:
            self._behind_over = True
            logger.warning(
                "%s: the writer is behind a busy database: its queue holds more than "
                "max_pending (%d) writes; records wait for room, up to %d writes kept.",
                self._label,
                capacity,
                limit or capacity,
            )
        if len(self.pending) >= FLUSH_BATCH and not self._behind_failing:
            self.flusher.wake()
        else:
            self.flusher.start()  # in an outage the writer tries again every interval

    def must_wait(self) -> bool:
        """Write-behind: whether `queue` would wait for room: the queue is full
        and the database answered the writer's last try (stored, or contended)."""
        return self.pending.full() and not self._behind_failing

    def flush_behind(self) -> Outcome:
        """The writer thread's work: store the queue, oldest first, in batches; says
        whether it did, or found the database contended or away."""
        if not len(self.pending):
            return "stored"
        started = time.monotonic()
        with self._db.operation("write") as operation:
            operation.watch_commits = True
            try:
                stored = self.flush(operation, operation.deadline)
            except Exception as error:
                if not unavailable(error):
                    raise
                if contended(error, operation):
                    self._behind_failing = False
                    self._warn_contended(error)
                    return "contended"
                # Kept, and counted by every read, until the database answers: one
                # WARNING per outage, not one per interval.
                if not self._behind_failing:
                    self._warn_kept("store queued writes", error, False)
                self._behind_failing = True
                return "away"
        self._behind_failing = self._behind_dropping = False
        if len(self.pending) < self.pending.capacity:
            self._behind_over = False
        if stored:
            logger.debug(
                "%s stored %d queued writes in %.1f ms",
                self._label,
                stored,
                (time.monotonic() - started) * 1000,
            )
        return "stored"

    def _warn_contended(self, error: BaseException) -> None:
        """At most one WARNING a minute: the writer's wait for a lock that other writers
        hold ran out (the error's type only, never its text)."""
        self._contended += 1
        now = time.monotonic()
        if (
            self._contention_warned is not None
            and now - self._contention_warned < CONTENTION_WARNING_EVERY
        ):
            return
        logger.warning(
            "%s: the database is busy with other writers: %d store(s) of queued writes "
            "ran out of time waiting for its lock (%s); the writer tries again at once, "
            "and a full queue makes records wait for room instead of dropping any.",
            self._label,
            self._contended,
            type(error).__name__,
        )
        self._contended = 0
        self._contention_warned = now

    def store_pending(self, name: str) -> None:
        """Store what is pending, whatever goes wrong: one bounded operation, then more
        while the database is busy with other writers or the queue outlasts one (for at
        most ``CLOSE_BOUNDS`` operation bounds in all)."""
        if not len(self.pending):
            return
        until: float | None = None
        step: float | None = None  # each operation's bound: operation_timeout
        while True:
            bound = None if until is None or step is None else min(step, until - time.monotonic())
            if bound is not None and bound <= 0:
                return
            try:
                with self._db.operation(name, bound=bound) as operation:
                    operation.watch_commits = True
                    if until is None:
                        step = operation.bound
                        until = operation.started + CLOSE_BOUNDS * step
                    try:
                        stored = self.flush(operation, operation.deadline)
                    except Exception as error:
                        if not unavailable(error) or not contended(error, operation):
                            raise
                        stored = -1  # busy: try again
            except Exception as error:
                if not unavailable(error):
                    raise
                return
            if not len(self.pending):
                return
            if not stored:  # the writer thread holds the queue: let it finish
                time.sleep(0.01)
