"""An agent run's model attempts: how many it may make, and what a UI is told of each.

* [`AttemptCap`][] counts the attempts of each run (retries and fallbacks together) and
  refuses the one past the cap with [`AttemptCapExceededError`][], so an outage cannot
  turn one agent turn into hundreds of calls. It remembers at most ``max_runs`` runs
  (least recently used forgotten first) and is safe to share between threads.
* [`AttemptEvent`][] is one attempt's lifecycle step, as an agent streams it beside the
  attempt's tokens: ``started``, ``superseded`` (its tokens are not the answer; ``reason``
  says why) and ``succeeded``. Each names the attempt's ``message_id``, the id its
  streamed tokens carry, so a consumer drops a superseded attempt's tokens by id.
* [`superseded_reason`][] is why an attempt was given up: its error's type name, or
  which time limit ended it. Never the error's text, which may quote the prompt.

Examples:
    >>> event = AttemptEvent("superseded", run_id="r1", attempt=1, model="gpt-4o",
    ...                      message_id="lc_run--1", reason="RateLimitError")
    >>> event.payload()["type"], event.payload()["reason"]
    ('llm_resilience.attempt', 'RateLimitError')
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal, get_args

from llm_resilience.errors import AttemptCapExceededError

__all__ = [
    "ATTEMPT_EVENT_TYPE",
    "AttemptCap",
    "AttemptEvent",
    "AttemptKind",
    "superseded_reason",
    "timed_out_by",
]

#: The ``"type"`` of every attempt event's payload: how a consumer of an agent's custom
#: stream tells it from the other events there.
ATTEMPT_EVENT_TYPE = "llm_resilience.attempt"

AttemptKind = Literal["started", "superseded", "succeeded"]
_KINDS: tuple[str, ...] = get_args(AttemptKind)

#: The reasons a time limit gives, by the limit that fired.
_TIMEOUT_REASONS = ("timeout", "first_token_timeout", "idle_timeout")


@dataclass(frozen=True, slots=True)
class AttemptEvent:
    """One step of one model attempt of an agent run, as a UI is told it.

    ``kind`` is ``"started"``, ``"superseded"`` (the attempt's tokens are not the answer:
    drop those with its ``message_id``) or ``"succeeded"``; ``attempt`` counts the run's
    attempts from 1 (retries and fallbacks together); ``model`` is the model's name;
    ``reason`` (superseded only) is an error type name or ``"timeout"``,
    ``"first_token_timeout"``, ``"idle_timeout"``; ``estimate`` is a money estimate shown
    with a budget downgrade (None otherwise). Raises ``ValueError`` for another kind.

    Examples:
        >>> AttemptEvent("started", run_id="r1", attempt=1, model="m", message_id=None).kind
        'started'
    """

    #: ``"started"``, ``"superseded"`` or ``"succeeded"``.
    kind: AttemptKind
    #: The agent run the attempt belongs to.
    run_id: str
    #: The run's attempt number, from 1.
    attempt: int
    #: The model's name, or None when it has none.
    model: str | None
    #: The id the attempt's streamed message carries (None: not known yet).
    message_id: str | None
    #: Why a superseded attempt was given up (a type name or a time limit), else None.
    reason: str | None = None
    #: A money estimate shown with the attempt (a budget downgrade), else None.
    estimate: Decimal | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be one of {', '.join(_KINDS)}; got {self.kind!r}")
        if isinstance(self.attempt, bool) or not isinstance(self.attempt, int) or self.attempt < 1:
            raise ValueError(f"attempt must be an int >= 1; got {self.attempt!r}")

    def payload(self) -> dict[str, Any]:
        """The event as a JSON-safe dict whose ``"type"`` is ``"llm_resilience.attempt"``
        (money as a string, exact)."""
        return {
            "type": ATTEMPT_EVENT_TYPE,
            "kind": self.kind,
            "run_id": self.run_id,
            "attempt": self.attempt,
            "model": self.model,
            "message_id": self.message_id,
            "reason": self.reason,
            "estimate": None if self.estimate is None else str(self.estimate),
        }


def superseded_reason(error: BaseException | None, *, timed_out: str | None = None) -> str:
    """Why an attempt was given up: the limit that ended it, else its error's type name.

    ``timed_out`` is the time limit that fired (``"per_client_timeout"`` reads as
    ``"timeout"``, the others by name); without one, ``error``'s type name
    (``"RateLimitError"``), or ``"timeout"`` when there is neither (an attempt abandoned
    by its deadline). Never the error's text.

    Examples:
        >>> superseded_reason(ConnectionError("reset by 10.0.0.7"))
        'ConnectionError'
        >>> superseded_reason(None, timed_out="idle_timeout")
        'idle_timeout'
    """
    if timed_out is not None:
        reason = "timeout" if timed_out == "per_client_timeout" else timed_out
        if reason not in _TIMEOUT_REASONS:
            raise ValueError(
                f"timed_out must be per_client_timeout, first_token_timeout or idle_timeout; "
                f"got {timed_out!r}"
            )
        return reason
    if error is None:
        return "timeout"
    return type(error).__name__


def timed_out_by(
    *,
    first_token_timeout: float | None,
    idle_timeout: float | None,
    tokens: int,
    since_last: float,
) -> str:
    """Which time limit ended an attempt its deadline abandoned: the option's name.

    Read from what the attempt saw: ``tokens`` streamed, and ``since_last`` seconds since
    its last token (or since it started, before any). No token within
    ``first_token_timeout`` is ``"first_token_timeout"``; a silence of ``idle_timeout``
    after tokens is ``"idle_timeout"``; anything else ``"per_client_timeout"``.

    Examples:
        >>> timed_out_by(first_token_timeout=2.0, idle_timeout=None, tokens=0, since_last=2.0)
        'first_token_timeout'
        >>> timed_out_by(first_token_timeout=2.0, idle_timeout=1.0, tokens=3, since_last=1.0)
        'idle_timeout'
    """
    # A deadline fires a little after its limit; never before it.
    if tokens == 0 and first_token_timeout is not None and since_last >= first_token_timeout:
        return "first_token_timeout"
    if tokens > 0 and idle_timeout is not None and since_last >= idle_timeout:
        return "idle_timeout"
    return "per_client_timeout"


class AttemptCap:
    """At most ``max_attempts`` model attempts per agent run, retries and fallbacks together.

    Examples:
        >>> cap = AttemptCap(2)
        >>> cap.take("r1"), cap.take("r1")
        (1, 2)
        >>> cap.take("r1")
        Traceback (most recent call last):
        ...
        llm_resilience.errors.AttemptCapExceededError: Run 'r1' made 2 model attempts, \
its cap (max_attempts_per_run=2); no further attempt is made.

    [`take`][] counts one attempt of a run and returns its number, or raises
    [`AttemptCapExceededError`][] once the run has made ``max_attempts``; [`close`][]
    forgets a finished run. At most ``max_runs`` (default 10,000) runs are remembered,
    the least recently used forgotten first, so a process serving many runs holds a
    bounded table. Thread-safe. Raises ``ValueError``/``TypeError`` naming the option for
    a count that is not an int >= 1.
    """

    __slots__ = ("_lock", "_runs", "max_attempts", "max_runs")

    def __init__(self, max_attempts: int, *, max_runs: int = 10_000) -> None:
        #: Attempts one run may make.
        self.max_attempts = _count("max_attempts", max_attempts)
        #: Runs remembered at once.
        self.max_runs = _count("max_runs", max_runs)
        self._runs: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"AttemptCap({self.max_attempts}, max_runs={self.max_runs})"

    def take(self, run_id: str) -> int:
        """Count one attempt of ``run_id``; its number from 1, or raise at the cap."""
        with self._lock:
            made = self._runs.pop(run_id, 0)
            self._runs[run_id] = made  # most recently used last
            if made >= self.max_attempts:
                raise AttemptCapExceededError(self.max_attempts, run_id)
            self._runs[run_id] = made + 1
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)
            return made + 1

    def attempts(self, run_id: str) -> int:
        """How many attempts ``run_id`` has made (0 for a run not remembered)."""
        with self._lock:
            return self._runs.get(run_id, 0)

    def close(self, run_id: str) -> None:
        """Forget ``run_id`` (a finished run); a run not remembered is ignored."""
        with self._lock:
            self._runs.pop(run_id, None)


def _count(option: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{option} must be an int >= 1; got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{option} must be an int >= 1; got {value}")
    return value
