"""The time limits of one attempt: the whole wait, the first token, the silence between chunks.

A chain has up to three limits, all counted in time spent *waiting on the member*: the
time the caller spends holding a chunk before asking for the next one never counts,
so a slow consumer cannot make a healthy member look slow (nor restart a finished
stream whose end-of-stream marker is already waiting).

* ``per_client_timeout``: every wait of the attempt, added up;
* ``first_token_timeout``: the waits until the first chunk that carries content;
* ``idle_timeout``: each single wait once content has started to flow.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from llm_resilience.checks import seconds

__all__ = ["TimeLimit", "_AttemptClock", "_TimeLimits"]

TimeLimit = Literal["per_client_timeout", "first_token_timeout", "idle_timeout"]


@dataclass(frozen=True, slots=True)
class _TimeLimits:
    """A chain's attempt limits in seconds (None: off), checked once at construction."""

    per_client: float | None = None
    first_token: float | None = None
    idle: float | None = None

    @classmethod
    def checked(
        cls,
        per_client_timeout: object = None,
        first_token_timeout: object = None,
        idle_timeout: object = None,
    ) -> _TimeLimits:
        return cls(
            seconds("per_client_timeout", per_client_timeout, allow_none=True),
            seconds("first_token_timeout", first_token_timeout, allow_none=True),
            seconds("idle_timeout", idle_timeout, allow_none=True),
        )

    @property
    def any(self) -> bool:
        """Whether a stream needs waits it can abandon (a sync one: a worker thread)."""
        return self.per_client is not None or self.first_token is not None or self.idle is not None

    def for_call(self) -> tuple[float, TimeLimit] | None:
        """The bound on a request/response call, and the option it comes from.

        A response that is not streamed arrives whole, so its first content is all of
        it: ``first_token_timeout`` bounds the whole call, as ``per_client_timeout``
        does, and the smaller of the two applies. ``idle_timeout`` has no gaps to watch.
        """
        limits: list[tuple[float, TimeLimit]] = []
        if self.first_token is not None:
            limits.append((self.first_token, "first_token_timeout"))
        if self.per_client is not None:
            limits.append((self.per_client, "per_client_timeout"))
        return min(limits, key=lambda limit: limit[0]) if limits else None

    def seconds_of(self, option: TimeLimit) -> float:
        value = {
            "per_client_timeout": self.per_client,
            "first_token_timeout": self.first_token,
            "idle_timeout": self.idle,
        }[option]
        assert value is not None
        return value

    def label(self, option: TimeLimit) -> str:
        """How log lines and errors say a limit: ``0:00:05 (first_token_timeout)``."""
        text = str(timedelta(seconds=self.seconds_of(option)))
        return text if option == "per_client_timeout" else f"{text} ({option})"


class _AttemptClock:
    """How long the next wait on one streaming attempt may last, and which limit ends it.

    The loop asks `next_wait` before each wait, and reports each wait that ended
    with a chunk through `waited`.
    """

    __slots__ = ("_content", "_limits", "_waited")

    def __init__(self, limits: _TimeLimits) -> None:
        self._limits = limits
        #: Seconds spent waiting on the member so far (consumer time excluded).
        self._waited = 0.0
        #: Whether a chunk with content has arrived.
        self._content = False

    def next_wait(self) -> tuple[float, TimeLimit] | None:
        """The longest the next wait may take (>= 0) and the limit it hits, or None."""
        limits = self._limits
        candidates: list[tuple[float, TimeLimit]] = []
        # The specific limits come first, so on a tie they name the failure.
        if limits.first_token is not None and not self._content:
            candidates.append((limits.first_token - self._waited, "first_token_timeout"))
        if limits.idle is not None and self._content:
            candidates.append((limits.idle, "idle_timeout"))
        if limits.per_client is not None:
            candidates.append((limits.per_client - self._waited, "per_client_timeout"))
        if not candidates:
            return None
        wait, option = min(candidates, key=lambda candidate: candidate[0])
        return max(0.0, wait), option

    def waited(self, elapsed: float, *, content: bool) -> None:
        """A wait of ``elapsed`` seconds ended with a chunk (``content``: it carried some)."""
        self._waited += elapsed
        self._content = self._content or content
