"""An outage breaker for a Redis-backed part: skip a failing Redis for a while, log it once."""

from __future__ import annotations

import logging
import threading
import time


class Outage:
    """Whether a Redis-backed part skips Redis now, and the one WARNING per outage.

    A failure opens it for ``cooldown`` seconds; a call that queued for a connection also
    skips Redis once a round trip failed after it arrived. A success closes it. The
    WARNING names the part (``label``), the error's type (never its text) and what the
    part does meanwhile (``degraded``); an INFO tells the recovery.
    """

    __slots__ = (
        "_cooldown",
        "_degraded",
        "_in_outage",
        "_label",
        "_last_error",
        "_lock",
        "_logger",
        "_outage_until",
        "failures",
    )

    def __init__(self, label: str, degraded: str, cooldown: float, logger: logging.Logger) -> None:
        self._label = label
        self._degraded = degraded
        self._cooldown = cooldown
        self._logger = logger
        self._lock = threading.Lock()
        self._in_outage = False
        self._outage_until = 0.0
        #: Round trips failed so far: a queued call that sees it change skips Redis.
        self.failures = 0
        self._last_error: BaseException | None = None

    @property
    def in_outage(self) -> bool:
        """Whether the last round trip failed (and none has answered since)."""
        return self._in_outage

    def skipping(self, failures_seen: int | None = None) -> bool:
        """Whether to go on without trying Redis: within the cooldown of a failure, or
        (for a call that queued for a connection) Redis failed since it arrived and has
        not answered since."""
        if not self._in_outage:
            return False
        if failures_seen is not None and failures_seen != self.failures:
            return True
        return time.monotonic() < self._outage_until

    def note_failure(self, exc: BaseException) -> None:
        """A round trip failed: open (or extend) the outage; the first failure logs."""
        with self._lock:
            self._last_error = exc
            self._outage_until = time.monotonic() + self._cooldown
            self.failures += 1
            first = not self._in_outage
            self._in_outage = True
        if first:
            # The error's type only, as for the ledgers: its text is not ours to publish.
            self._logger.warning(
                "%s: Redis failed (%s); %s until it answers again.",
                self._label,
                type(exc).__name__,
                self._degraded,
            )

    def note_success(self) -> None:
        """Redis answered: close the outage, logging the recovery once."""
        if self._in_outage:
            with self._lock:
                recovered, self._in_outage = self._in_outage, False
            if recovered:
                self._logger.info("%s: Redis answers again.", self._label)
