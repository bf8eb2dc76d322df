"""The cooldown circuit breaker: each client's failure history and skip deadline."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from llm_resilience.fallback._options import Cooldown
from llm_resilience.transient import retry_after_of

# Every part of the fallback chain logs as ``llm_resilience.fallback`` (a documented name).
logger = logging.getLogger("llm_resilience.fallback")


class _Breaker:
    """Per-client failure history and cooldown deadlines; thread-safe."""

    __slots__ = ("_clock", "_config", "_failures", "_lock", "_open_until")

    def __init__(self, config: Cooldown, size: int, clock: Callable[[], float]) -> None:
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: list[deque[float]] = [deque() for _ in range(size)]
        self._open_until: list[float] = [0.0] * size

    def order(self, size: int) -> list[int]:
        now = self._clock()
        with self._lock:
            ready = [i for i in range(size) if self._open_until[i] <= now]
            if ready:
                skipped = [i for i in range(size) if i not in ready]
                for i in skipped:
                    logger.info(
                        "Client %d is cooling down for another %.1fs; skipping it.",
                        i,
                        self._open_until[i] - now,
                    )
                return ready
            soonest = min(range(size), key=lambda i: self._open_until[i])
            return [soonest]

    def failed(self, index: int, error: BaseException | None) -> None:
        config = self._config
        now = self._clock()
        with self._lock:
            history = self._failures[index]
            history.append(now)
            while history and history[0] <= now - config.window:
                history.popleft()
            until = self._open_until[index]
            if len(history) >= config.failures:
                until = max(until, now + config.duration)
                history.clear()
            if config.honor_retry_after and error is not None:
                wait = retry_after_of(error)
                if wait is not None and wait > 0:
                    until = max(until, now + min(wait, config.max_retry_after))
            self._open_until[index] = until

    def succeeded(self, index: int) -> None:
        with self._lock:
            self._failures[index].clear()
