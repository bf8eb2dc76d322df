"""The Redis limiter's outage breaker: skip a failing Redis for a while, log it once."""

from __future__ import annotations

import logging
import threading
import time
from typing import Literal

from llm_resilience import telemetry
from llm_resilience.errors import RateLimitBackendError

logger = logging.getLogger("llm_resilience.ratelimit")

BackendErrorMode = Literal["fail_open", "fail_closed"]


class OutageBreaker:
    """Whether a shared limiter skips Redis, and what it does when Redis failed.

    A failure opens it for ``cooldown`` seconds; a call that queued for a connection also
    skips Redis once a round trip failed after it arrived. A success closes it.
    """

    __slots__ = (
        "_cooldown",
        "_in_outage",
        "_last_error",
        "_lock",
        "_name",
        "_on_backend_error",
        "_outage_until",
        "failures",
    )

    def __init__(self, name: str, on_backend_error: BackendErrorMode, cooldown: float) -> None:
        self._name = name
        self._on_backend_error: BackendErrorMode = on_backend_error
        self._cooldown = cooldown
        self._lock = threading.Lock()
        self._in_outage = False
        self._outage_until = 0.0
        #: Round trips failed so far: a queued call that sees it change skips Redis.
        self.failures = 0
        self._last_error: BaseException | None = None

    def skipping(self, failures_seen: int | None = None) -> bool:
        """Whether to apply ``on_backend_error`` without trying Redis: within the cooldown
        of a failure, or (for a call that queued for a connection) Redis failed since it
        arrived and has not answered since."""
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
            action = (
                "granting permits without limiting"
                if self._on_backend_error == "fail_open"
                else "refusing permits"
            )
            # The error's type only, as for the ledgers: its text is not ours to publish.
            logger.warning(
                "Shared limiter %r: Redis failed (%s); %s (on_backend_error=%r) until it "
                "answers again.",
                self._name,
                type(exc).__name__,
                action,
                self._on_backend_error,
            )

    def note_success(self) -> None:
        """Redis answered: close the outage, logging the recovery once."""
        if self._in_outage:
            with self._lock:
                recovered, self._in_outage = self._in_outage, False
            if recovered:
                logger.info("Shared limiter %r: Redis answers again.", self._name)

    def backend_failed(self) -> telemetry.Outcome:
        """The outcome of a call Redis failed: ``faulted``, or raise with ``fail_closed``."""
        if self._on_backend_error == "fail_closed":
            raise RateLimitBackendError(self._name) from self._last_error
        return "faulted"
