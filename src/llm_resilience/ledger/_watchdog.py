"""Deadlines kept on our side of the connection: a frozen database cannot hold a call.

A server that stops answering (or a network that drops every packet) leaves the client
blocked in a socket read that nothing on the server side will ever end: the kernel still
acknowledges what we send, so TCP keepalives and server timeouts never fire. The
`Watchdog` (one daemon thread per ledger, a heap of deadlines, no thread per
call) ends such a wait when an `Operation` overruns: it shuts down the socket of
the psycopg connection the operation is using (the blocked read returns and psycopg
raises) or calls ``interrupt()`` on a sqlite3 connection. The operation then discards the
connection instead of returning it to the pool.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any

from llm_resilience.errors import LedgerTimeoutError

__all__ = ["Operation", "Watchdog", "interrupt_connection"]


def interrupt_connection(dbapi_connection: Any) -> None:
    """Make whatever ``dbapi_connection`` is waiting for return with an error, at once.

    psycopg: shut the socket down (on a duplicate of its descriptor, so psycopg's own
    stays valid until it closes it); the blocked read sees end-of-file and psycopg
    raises ``OperationalError``. sqlite3: ``interrupt()`` aborts the running statement.
    """
    pgconn = getattr(dbapi_connection, "pgconn", None)
    if pgconn is not None:
        try:
            descriptor = os.dup(pgconn.socket)
        except Exception:  # closed or broken already: nothing can be waiting on it
            return
        try:
            duplicate = socket.socket(fileno=descriptor)
        except OSError:
            os.close(descriptor)
            return
        with duplicate, suppress(OSError):
            duplicate.shutdown(socket.SHUT_RDWR)
        return
    interrupt = getattr(dbapi_connection, "interrupt", None)
    if interrupt is not None:
        with suppress(Exception):  # a closed connection: nothing to interrupt
            interrupt()


#: An armed alarm, as kept in the watchdog's heap: ``(deadline, sequence, callback)``.
#: A tuple, so that the heap orders alarms without calling back into Python.
_Alarm = tuple[float, int, Callable[[], None]]


class Watchdog:
    """Calls each armed callback once its deadline (``time.monotonic()``) has passed.

    Examples:
        >>> watchdog = Watchdog("doc")
        >>> fired = threading.Event()
        >>> alarm = watchdog.arm(time.monotonic() + 0.01, fired.set)
        >>> fired.wait(2)
        True
        >>> watchdog.stop()

    The thread starts on the first `arm` and ends with `stop`; arming again
    after that starts a new one. It wakes only when an alarm is due or one earlier than
    the next it sleeps for is armed, not for every operation. Callbacks run on the
    watchdog's thread and must be quick.
    """

    __slots__ = (
        "_arms",
        "_condition",
        "_heap",
        "_linger",
        "_lock",
        "_name",
        "_sequence",
        "_thread",
        "_wakes_at",
    )

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()  # taken directly on the per-operation paths
        self._condition = threading.Condition(self._lock)
        # Live alarms only (a cancelled or fired one is removed at once): about one per
        # operation running now, so removing from the middle is cheap.
        self._heap: list[_Alarm] = []
        self._sequence = itertools.count()
        self._thread: threading.Thread | None = None
        self._wakes_at = math.inf  # when the thread wakes up next unless notified
        # Alarms armed so far, and the span (deadline - arm time) of the last one: with
        # no alarm left the thread still sleeps that long before sleeping for good, so
        # a steady stream of operations, each armed and cancelled in turn, never has to
        # wake it (waking a thread per operation costs more than the operation's SQL).
        self._arms = 0
        self._linger = 0.0

    def arm(self, deadline: float, callback: Callable[[], None]) -> _Alarm:
        """Call ``callback`` at ``deadline`` unless `cancel` comes first."""
        alarm = (deadline, next(self._sequence), callback)
        with self._lock:
            self._arms += 1
            linger = deadline - time.monotonic()
            self._linger = 60.0 if linger > 60.0 else linger if linger > 0.0 else 0.0
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"llm-resilience-watchdog-{self._name}", daemon=True
                )
                self._wakes_at = math.inf
                self._thread.start()
            heapq.heappush(self._heap, alarm)
            if deadline < self._wakes_at:
                self._wakes_at = deadline
                self._condition.notify()
        return alarm

    def cancel(self, alarm: _Alarm) -> None:
        """Forget ``alarm``; nothing happens if it has fired already."""
        with self._lock:
            heap = self._heap
            if heap and heap[-1] is alarm:  # the usual case: the only alarm, or the last
                heap.pop()
                return
            for index, armed in enumerate(heap):
                if armed is alarm:
                    heap[index] = heap[-1]
                    heap.pop()
                    heapq.heapify(heap)
                    return

    def stop(self) -> None:
        """End the thread; pending alarms are dropped."""
        with self._condition:
            thread, self._thread = self._thread, None
            self._heap = []
            self._condition.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1)

    def _run(self) -> None:
        me = threading.current_thread()
        arms = -1  # the count of alarms when an empty heap was last seen
        with self._condition:
            while self._thread is me:
                now = time.monotonic()
                if not self._heap:
                    if arms == self._arms:  # nothing armed for a whole linger: sleep
                        self._wakes_at = math.inf
                        self._condition.wait()
                    else:  # alarms come and go: sleep as long as one lasts, then look
                        arms = self._arms
                        self._wakes_at = now + self._linger
                        self._condition.wait(self._linger)
                    continue
                if self._heap[0][0] > now:
                    self._wakes_at = self._heap[0][0]
                    self._condition.wait(self._wakes_at - now)
                    continue
                _, _, callback = heapq.heappop(self._heap)  # fired: a later cancel() is a no-op
                self._condition.release()
                try:
                    callback()
                except Exception:  # a failing interrupt must not end the watchdog
                    pass
                finally:
                    self._condition.acquire()


class Operation:
    """One ledger operation's deadline, and the connection to interrupt past it.

    The operation runs for at most ``bound`` seconds from ``started``. A *phase* (see
    `phase`) may end earlier. When the current phase's deadline passes, the
    watchdog interrupts the connection attached at that moment (`attach`), and
    `detach` reports it so the caller discards that connection.
    """

    __slots__ = (
        "_alarm",
        "_connection",
        "_finished",
        "_interrupted",
        "_lock",
        "_watchdog",
        "bound",
        "deadline",
        "name",
        "others_committed",
        "phase_deadline",
        "started",
        "watch_commits",
    )

    def __init__(self, watchdog: Watchdog, name: str, bound: float, started: float) -> None:
        #: What the operation is, for errors and logs: ``"record"``, ``"spend"``, ...
        self.name = name
        #: Its bound, in seconds.
        self.bound = bound
        #: When it started (``time.monotonic()``).
        self.started = started
        #: When it must have ended.
        self.deadline = started + bound
        #: When the current phase must have ended (at the latest ``deadline``).
        self.phase_deadline = self.deadline
        self._watchdog = watchdog
        self._lock = threading.Lock()
        self._connection: Any = None
        self._interrupted = False
        self._finished = False
        #: Set by the caller: on SQLite, note whether other connections commit while
        #: this operation waits for the write lock (a ``PRAGMA data_version`` around
        #: each ``BEGIN IMMEDIATE``: one statement more per transaction).
        self.watch_commits = False
        #: Whether, while this operation waited for the write lock, another connection
        #: committed: the database was contended, not away (see ``watch_commits``).
        self.others_committed = False
        self._alarm = watchdog.arm(self.deadline, self._fire)

    def remaining(self) -> float:
        """Seconds left in the current phase (<= 0 once it is over)."""
        return self.phase_deadline - time.monotonic()

    def expired(self) -> bool:
        return self.remaining() <= 0

    def timeout_error(self) -> LedgerTimeoutError:
        return LedgerTimeoutError(self.name, timedelta(seconds=self.bound))

    @contextmanager
    def phase(self, until: float) -> Iterator[None]:
        """Bound the steps inside by ``until`` too (never later than the deadline)."""
        self._rearm(min(until, self.deadline))
        try:
            yield
        finally:
            self._rearm(self.deadline)

    def extend(self, bound: float) -> None:
        """Let the operation run for ``bound`` seconds from its start instead."""
        self.bound = bound
        self.deadline = self.started + bound
        self._rearm(self.deadline)

    def _rearm(self, deadline: float) -> None:
        with self._lock:
            if self._finished:
                return
            self._watchdog.cancel(self._alarm)
            self.phase_deadline = deadline
            self._alarm = self._watchdog.arm(deadline, self._fire)

    def attach(self, dbapi_connection: Any) -> None:
        """``dbapi_connection`` is the one this operation is now waiting on."""
        with self._lock:
            if self._connection is not dbapi_connection:
                self._connection = dbapi_connection
                self._interrupted = False
            if time.monotonic() >= self.phase_deadline:  # the alarm rang before we got here
                self._interrupted = True
                interrupt_connection(dbapi_connection)

    def forget(self, dbapi_connection: Any) -> None:
        """``dbapi_connection`` is about to be closed: never touch its socket again."""
        with self._lock:
            if self._connection is dbapi_connection:
                self._connection = None

    def detach(self) -> bool:
        """Stop watching the attached connection; True if it was interrupted."""
        with self._lock:
            self._connection = None
            interrupted, self._interrupted = self._interrupted, False
            return interrupted

    def finish(self) -> None:
        with self._lock:
            self._finished = True
            self._connection = None
            self._watchdog.cancel(self._alarm)

    def _fire(self) -> None:
        # Holding the lock while interrupting: a connection being closed waits in
        # forget(), so its descriptor cannot be reused under us.
        with self._lock:
            if self._finished or self._connection is None:
                return
            self._interrupted = True
            interrupt_connection(self._connection)
