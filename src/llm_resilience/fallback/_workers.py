"""Reused daemon threads that run timed sync attempts."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class _Workers:
    """Daemon threads for timed sync attempts: an idle one is reused, else one is started.

    Starting a thread per attempt cost ~0.4 ms a call on a loaded 2-core machine
    (``docs/benchmarks.md``); handing work to an idle thread costs ~0.05 ms. Never
    bounded and never queued: an attempt abandoned at its timeout keeps its worker until
    the provider returns, and the next attempt simply gets another one, so a hung
    provider cannot starve later calls. A worker idle for ``idle_timeout`` seconds exits.
    """

    __slots__ = ("_idle", "_idle_timeout", "_lock")

    def __init__(self, idle_timeout: float = 60.0) -> None:
        self._lock = threading.Lock()
        #: Inboxes of the idle workers, the most recently idle last (its cache is warm).
        self._idle: list[queue.SimpleQueue[Callable[[], object]]] = []
        self._idle_timeout = idle_timeout

    def submit(self, work: Callable[[], object]) -> None:
        """Run ``work()`` on a worker thread; ``work`` must not raise (it reports itself)."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(
                target=self._serve, args=(inbox,), name="llm-resilience-attempt", daemon=True
            ).start()
        inbox.put(work)

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], object]]) -> None:
        while True:
            try:
                work = inbox.get(timeout=self._idle_timeout)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:
                        self._idle.remove(inbox)
                        return
                # A caller took this inbox just as the wait ran out; its work is coming.
                continue
            work()
            del work  # drop the attempt's closure (and its result) before idling
            with self._lock:
                self._idle.append(inbox)


_WORKERS = _Workers()
