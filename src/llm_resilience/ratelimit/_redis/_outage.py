"""The Redis limiter's outage breaker: skip a failing Redis for a while, log it once."""

from __future__ import annotations

import logging
from typing import Literal

from llm_resilience import telemetry
from llm_resilience._redis import Outage
from llm_resilience.errors import RateLimitBackendError

logger = logging.getLogger("llm_resilience.ratelimit")

BackendErrorMode = Literal["fail_open", "fail_closed"]


class OutageBreaker(Outage):
    """``Outage`` for a shared limiter, which also says what
    a call does when Redis failed (``on_backend_error``)."""

    __slots__ = ("_name", "_on_backend_error")

    def __init__(self, name: str, on_backend_error: BackendErrorMode, cooldown: float) -> None:
        action = (
            "granting permits without limiting"
            if on_backend_error == "fail_open"
            else "refusing permits"
        )
        super().__init__(
            f"Shared limiter {name!r}",
            f"{action} (on_backend_error={on_backend_error!r})",
            cooldown,
            logger,
        )
        self._name = name
        self._on_backend_error: BackendErrorMode = on_backend_error

    def backend_failed(self) -> telemetry.Outcome:
        """The outcome of a call Redis failed: ``faulted``, or raise with ``fail_closed``."""
        if self._on_backend_error == "fail_closed":
            raise RateLimitBackendError(self._name) from self._last_error
        return "faulted"
