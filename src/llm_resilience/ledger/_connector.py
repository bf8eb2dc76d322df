"""Opening PostgreSQL connections within an operation's deadline.

libpq's ``connect_timeout`` counts whole seconds and treats anything under 2 as 2, and a
connection that is still being opened has no socket the watchdog could shut down. So
each new connection is opened on a short-lived helper thread while the operation waits
for it only as long as its own deadline allows. A connection that arrives after the
operation gave up is closed. At most `MAX_CONNECTING` attempts run at once per
ledger; each ends within ``connect_timeout`` (per address the host name resolves to).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from llm_resilience.ledger._watchdog import Operation

__all__ = ["MAX_CONNECTING", "Connector"]

#: Connection attempts one ledger runs at once; more callers wait for one to end (within
#: their deadline). Against a server that accepts and never answers, this also bounds
#: the helper threads left waiting for libpq's ``connect_timeout``.
MAX_CONNECTING = 2


class _Attempt:
    __slots__ = ("_close", "_lock", "abandoned", "done", "error", "result")

    def __init__(self, close: Callable[[Any], None]) -> None:
        self._close = close
        self._lock = threading.Lock()
        self.done = threading.Event()
        self.abandoned = False
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self, open_connection: Callable[[], Any], lanes: threading.Semaphore) -> None:
        try:
            self.result = open_connection()
        except BaseException as error:  # handed to the waiting caller
            self.error = error
        finally:
            with self._lock:
                self.done.set()
                if self.abandoned and self.result is not None:
                    with suppress(Exception):
                        self._close(self.result)
            lanes.release()

    def abandon(self) -> bool:
        """Give up on the attempt; False if it has ended meanwhile (use its outcome)."""
        with self._lock:
            if self.done.is_set():
                return False
            self.abandoned = True
            return True

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


class Connector:
    """Opens connections on helper threads so no caller waits past its deadline."""

    __slots__ = ("_lanes",)

    def __init__(self) -> None:
        self._lanes = threading.BoundedSemaphore(MAX_CONNECTING)

    def connect(
        self,
        open_connection: Callable[[], Any],
        close: Callable[[Any], None],
        operation: Operation,
    ) -> Any:
        """The connection ``open_connection`` returns, or ``LedgerTimeoutError`` once
        ``operation``'s deadline passes (the connection is then closed when it arrives)."""
        if not self._lanes.acquire(timeout=max(0.0, operation.remaining())):
            raise operation.timeout_error()
        attempt = _Attempt(close)
        try:
            threading.Thread(
                target=attempt.run,
                args=(open_connection, self._lanes),
                name="llm-resilience-ledger-connect",
                daemon=True,
            ).start()
        except BaseException:
            self._lanes.release()
            raise
        if attempt.done.wait(max(0.0, operation.remaining())) or not attempt.abandon():
            return attempt.outcome()
        raise operation.timeout_error()
