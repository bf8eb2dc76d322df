"""Write-behind: the thread that stores a ledger's queued writes, every interval.

With ``SqlCostLedger(write_behind=...)`` a ``record`` queues its entry (in the ledger's
pending writes, which every read already counts) and returns; this thread stores the
queue in batches, one transaction per batch, and sooner once a batch's worth is waiting.
Flushes start on a fixed cadence: each is due one interval after the previous one
*started*, so an entry waits at most one interval for the flush that takes it and is
committed when that flush ends: a crash loses at most the entries of the last interval
plus one flush's duration. After a flush that found the database away the next try
waits a whole interval; after one that found it busy (its lock wait ran out while other
writers committed) the next try starts at once. The thread starts with the first queued
write, holds only a weak reference to its ledger (a ledger dropped without ``close()``
stops it), and ``stop()`` ends it within a bound.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Literal

__all__ = ["Flusher", "Outcome"]

logger = logging.getLogger(__name__)

#: What one flush found: the queue stored (or empty); the database busy with other
#: writers (try again at once); or away (try again an interval later).
Outcome = Literal["stored", "contended", "away"]


class Flusher:
    """Calls ``flush`` every ``interval`` seconds, counted from the start of the last
    call (or at once on `wake`), on a daemon thread of its own, started on the first
    `start` or `wake`. ``flush`` returns its `Outcome`: after ``"away"`` (or an
    exception) the next call waits a whole interval from its end; after ``"contended"``
    it comes at once."""

    __slots__ = ("_flush", "_interval", "_lock", "_name", "_stopping", "_thread", "_wake")

    def __init__(self, flush: Callable[[], Outcome], *, interval: float, name: str) -> None:
        # A weak method: the thread must not keep its ledger alive.
        self._flush = weakref.WeakMethod(flush)  # type: ignore[arg-type]
        self._interval = interval
        self._name = name
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Make sure the thread runs (a no-op once it does, and after `stop`)."""
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is not None or self._stopping:
                return
            thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            thread.start()
            self._thread = thread

    def wake(self) -> None:
        """Flush now rather than at the end of the interval."""
        self.start()
        self._wake.set()

    def stop(self, timeout: float) -> None:
        """End the thread, waiting at most ``timeout`` seconds for a flush in progress.

        A later `start` starts a new thread (a closed ledger used again).
        """
        with self._lock:
            thread, self._thread = self._thread, None
            self._stopping = True
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._lock:
            self._stopping = False
            self._wake.clear()

    def _run(self) -> None:
        me = threading.current_thread()
        due = time.monotonic() + self._interval
        while True:
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()
            if self._stopping or self._thread is not me:
                return
            flush = self._flush()
            if flush is None:
                return  # the ledger is gone
            # Due one interval after this flush starts, not after it ends.
            due = time.monotonic() + self._interval
            outcome: Outcome = "away"
            try:
                outcome = flush()
            except Exception as error:  # never end the thread: the writes stay queued
                # The type only: an error's text could quote the database's view of a row.
                logger.error(
                    "%s: storing queued writes failed (%s)", self._name, type(error).__name__
                )
            del flush
            if outcome == "contended":  # the lock changes hands: queue up for it again now
                due = time.monotonic()
            elif outcome == "away":  # try again a whole interval from now
                due = time.monotonic() + self._interval
