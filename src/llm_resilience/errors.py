"""Every public exception of llm-resilience, under one root.

    LLMResilienceError
    ├── PerClientTimeoutError (also a builtin ``TimeoutError``)
    ├── BudgetExceededError
    └── RateLimitQueueFullError

Each carries its facts as attributes and states them in its message. None of the
messages of the non-transient errors contains the words the transient classifier
looks for (``rate limit``, ``throttl``, ``timeout``, ``unavailable``), and their
types are pinned non-transient as well, so a blown budget or a full local queue is
never mistaken for a provider outage by a fallback chain around them.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

__all__ = [
    "BudgetExceededError",
    "LLMResilienceError",
    "PerClientTimeoutError",
    "RateLimitQueueFullError",
]


class LLMResilienceError(Exception):
    """Root of every exception this library raises on purpose."""


class PerClientTimeoutError(LLMResilienceError, TimeoutError):
    """A fallback chain's ``per_client_timeout`` elapsed on the last client.

    Raised instead of a cancellation, so a total outage never looks like the caller
    going away. ``__cause__`` is the cancellation or timeout of that last attempt.
    """

    def __init__(self, client_index: int, timeout: timedelta) -> None:
        #: Position of the client whose attempt timed out (0 is the primary).
        self.client_index = client_index
        #: The configured per-client timeout.
        self.timeout = timeout
        super().__init__(f"Client {client_index} timed out after {timeout}; no client is left.")


class BudgetExceededError(LLMResilienceError):
    """The recorded spend of a budget window reached its limit.

    ``window`` is ``"day"`` or ``"month"``; ``limit`` and ``spend`` are exact ``Decimal``
    money in the currency the prices are quoted in.
    """

    def __init__(self, window: str, limit: Decimal, spend: Decimal, scope: str | None = None):
        self.window = window
        self.limit = limit
        self.spend = spend
        self.scope = scope
        where = f" for scope {scope!r}" if scope is not None else ""
        super().__init__(
            f"Spending limit reached{where}: the {window} window has spent {spend} "
            f"of its {limit} limit."
        )


class RateLimitQueueFullError(LLMResilienceError):
    """A limiter refused a request because its wait queue is full.

    The message names the queue bound; it deliberately avoids the words the transient
    classifier matches, and the type is pinned non-transient too.
    """

    def __init__(self, max_queued_requests: int) -> None:
        self.max_queued_requests = max_queued_requests
        super().__init__(
            f"Request refused: {max_queued_requests} callers are already queued for a permit "
            f"(max_queued_requests={max_queued_requests})."
        )
