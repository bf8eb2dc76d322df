"""Every public exception of llm-resilience, under one root.

    LLMResilienceError
    ├── PerClientTimeoutError (also a builtin ``TimeoutError``)
    ├── BudgetExceededError
    ├── RateLimitQueueFullError
    ├── RateLimitBackendError
    ├── RequestExceedsCapacityError (also a builtin ``ValueError``)
    ├── NoCapableMemberError (also a builtin ``ValueError``)
    ├── StreamInterruptedError
    ├── AttemptCapExceededError
    └── LedgerTimeoutError (also a builtin ``TimeoutError``)

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
    "AttemptCapExceededError",
    "BudgetExceededError",
    "LLMResilienceError",
    "LedgerTimeoutError",
    "NoCapableMemberError",
    "PerClientTimeoutError",
    "RateLimitBackendError",
    "RateLimitQueueFullError",
    "RequestExceedsCapacityError",
    "StreamInterruptedError",
]


class LLMResilienceError(Exception):
    """Root of every exception this library raises on purpose."""


class PerClientTimeoutError(LLMResilienceError, TimeoutError):
    """A fallback chain's time limit elapsed on the last client.

    The limit is ``per_client_timeout``, or ``first_token_timeout``/``idle_timeout``
    (named by ``option``). Raised instead of a cancellation, so a total outage never looks
    like the caller going away. ``__cause__`` is the cancellation or timeout of that last
    attempt.
    """

    def __init__(
        self, client_index: int, timeout: timedelta, option: str = "per_client_timeout"
    ) -> None:
        #: Position of the client whose attempt timed out (0 is the primary).
        self.client_index = client_index
        #: The configured limit that elapsed.
        self.timeout = timeout
        #: Which option set it: ``per_client_timeout``, ``first_token_timeout`` or
        #: ``idle_timeout``.
        self.option = option
        limit = str(timeout) if option == "per_client_timeout" else f"{timeout} ({option})"
        super().__init__(f"Client {client_index} timed out after {limit}; no client is left.")


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


class RateLimitBackendError(LLMResilienceError):
    """A shared limiter refused a permit because its backend (Redis) failed to answer.

    Raised only by a limiter built with ``on_backend_error="fail_closed"``; ``__cause__``
    is the backend's own error. ``limiter_name`` is the limiter's ``name``. Pinned
    non-transient: the limiter's store is down, not the provider, so a fallback chain
    around it must not reroute the call.
    """

    def __init__(self, limiter_name: str) -> None:
        self.limiter_name = limiter_name
        super().__init__(
            f"Permit refused: the shared limiter {limiter_name!r} cannot reach its Redis "
            "server, and on_backend_error='fail_closed' refuses permits until it answers."
        )


class RequestExceedsCapacityError(LLMResilienceError, ValueError):
    """A limiter was asked for more than its bucket can ever hold.

    Such a request could never be granted, so it fails at once instead of waiting
    forever: e.g. ``num_tokens=5000`` on a limiter with ``tokens_per_minute=4000``.
    ``requested`` and ``capacity`` are counted in ``unit`` (``"tokens"`` or
    ``"requests"``); ``option`` names the setting that fixes the capacity. Pinned
    non-transient: retrying elsewhere cannot make the request smaller.
    """

    def __init__(self, requested: int, capacity: int, *, unit: str, option: str) -> None:
        self.requested = requested
        self.capacity = capacity
        self.unit = unit
        self.option = option
        super().__init__(
            f"Request needs {requested} {unit} but the bucket holds at most {capacity} "
            f"({option}={capacity}); it could never be granted."
        )


class NoCapableMemberError(LLMResilienceError, ValueError):
    """No member of a fallback chain may take a request, by what the chain knows of them.

    Raised before any provider is called when every member is known (from its model
    profile or a declared [`MemberProfile`][]) to lack
    something the request carries. ``missing`` maps each member's position to the
    capabilities it lacks (``"tool_calling"``, ``"image_inputs"``,
    ``"structured_output"``), for every member. A ``cooldown`` never causes it: a capable
    member cooling down is still asked when no capable member is ready. Not transient:
    another provider cannot change the request.
    """

    def __init__(self, missing: dict[int, tuple[str, ...]]) -> None:
        #: Member position -> the capabilities the request needs and that member lacks.
        self.missing = missing
        lacks = "; ".join(
            f"member {index} lacks {', '.join(names)}" for index, names in sorted(missing.items())
        )
        super().__init__(
            f"No member of the fallback chain can take this request: {lacks}. Remove what "
            f"the request carries, or add a member that supports it."
        )


class StreamInterruptedError(LLMResilienceError):
    """A stream failed after it delivered content, under ``mid_stream="raise"``.

    Raised instead of restarting the request on the next member, so a consumer that
    concatenates chunks never reads a failed prefix followed by a second answer. The
    content chunks already yielded stay yielded: ``delivered_text`` is their text (for
    a retry or a "continue" button), ``chunks`` their count and ``client_index`` the
    member that failed. ``__cause__`` is the member's own failure (a ``TimeoutError``
    when a time limit of the chain fired). The message never quotes the delivered text,
    which is provider output. Not transient: an outer chain does not restart it either.
    """

    def __init__(self, client_index: int, chunks: int, delivered_text: str) -> None:
        #: Position of the member whose stream failed (0 is the primary).
        self.client_index = client_index
        #: Content chunks that member had yielded before it failed.
        self.chunks = chunks
        #: The text of those chunks, concatenated ("" when the chunks carry no text).
        self.delivered_text = delivered_text
        super().__init__(
            f"The stream of client {client_index} broke off after {chunks} content "
            f"chunk(s) ({len(delivered_text)} characters delivered); with "
            f"mid_stream='raise' it is not restarted on another client."
        )


class AttemptCapExceededError(LLMResilienceError):
    """An agent run made as many model attempts (retries and fallbacks together) as it may.

    Raised instead of starting one more attempt, so an outage cannot turn one agent turn
    into hundreds of calls. ``__cause__`` is the failure of the last attempt made. Not
    transient: no other member or retry is tried after it.
    """

    def __init__(self, max_attempts: int, run_id: str) -> None:
        #: The cap: attempts one run may make.
        self.max_attempts = max_attempts
        #: The run that reached it.
        self.run_id = run_id
        super().__init__(
            f"Run {run_id!r} made {max_attempts} model attempts, its cap "
            f"(max_attempts_per_run={max_attempts}); no further attempt is made."
        )


class LedgerTimeoutError(LLMResilienceError, TimeoutError):
    """A ledger operation did not finish within the ledger's ``operation_timeout``.

    Raised once the connection the operation was using has been interrupted and
    discarded, so nothing of it keeps running in this process. ``operation`` names it
    (``"spend"``, ``"reserve"``, ``"entries"``, ``"open"``, ...) and ``timeout`` is the
    bound. The message never carries SQL parameters (a scope can be a user id).
    """

    def __init__(self, operation: str, timeout: timedelta) -> None:
        #: The ledger operation that ran out of time.
        self.operation = operation
        #: The bound it exceeded.
        self.timeout = timeout
        super().__init__(
            f"The cost ledger's {operation} did not finish within its bound of "
            f"{timeout.total_seconds():g} s; it was abandoned and its database connection "
            f"discarded."
        )
