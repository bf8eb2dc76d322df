"""The cooldown circuit breaker: each client's failure history, skip deadline and trial call.

A client's breaker is *closed* (tried in order), *open* (skipped until its cooldown ends)
or *half-open* (its cooldown ended; the next request gives it one trial call while every
other request keeps going to the other clients). The trial's outcome decides: a success
closes the breaker at once, a transient failure opens it again for a full ``duration``.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from llm_resilience.fallback._options import Cooldown
from llm_resilience.telemetry import record_circuit_opening, watch_circuit
from llm_resilience.transient import retry_after_of

__all__ = ["MemberHealth"]

# Every part of the fallback chain logs as ``llm_resilience.fallback`` (a documented name).
logger = logging.getLogger("llm_resilience.fallback")

CircuitState = Literal["closed", "open", "half_open"]
#: Why a member is open: its failures reached ``Cooldown.failures``, a ``Retry-After``
#: asked for the time, or its trial call failed.
OpenReason = Literal["failures", "retry_after", "probe_failed"]

_chain_ids = itertools.count()


@dataclass(frozen=True, slots=True)
class MemberHealth:
    """One client's circuit as [`FallbackChain.health`][] reports it.

    Examples:
        >>> chain.health()[0]  # doctest: +SKIP
        MemberHealth(client=0, state='open', failures=0, open_until=1234.5, retry_in=12.5)
    """

    #: Index of the client in the chain.
    client: int
    #: ``"closed"`` (tried in order), ``"open"`` (skipped) or ``"half_open"`` (its cooldown
    #: ended; the next request makes one trial call to it).
    state: CircuitState
    #: Transient failures counted in the current ``window`` (cleared when the breaker opens).
    failures: int
    #: Time on the chain's clock (``time.monotonic()`` by default) when the cooldown ends;
    #: None when the client is not cooling down.
    open_until: float | None
    #: Seconds until the cooldown ends (0.0 when the client is not cooling down).
    retry_in: float
    #: Why the client is open or half-open (None when closed).
    reason: OpenReason | None = None
    #: ``"fleet"``: read from the shared store ([`Cooldown`][]'s ``shared``);
    #: ``"local"``: this process's own breaker (no store, or the store is away).
    view: Literal["local", "fleet"] = "local"
    #: The member's key in the shared store (None without one).
    key: str | None = None
    #: When the cooldown ends on the wall clock (UTC; the Redis server's clock for the
    #: fleet), or None when the client is not cooling down.
    open_until_utc: datetime | None = None
    #: The worker that owns the half-open trial call (fleet view only), or None.
    prober: str | None = None


class _Breaker:
    """Per-client failure history, cooldown deadlines and trial calls; thread-safe."""

    __slots__ = (
        "__weakref__",
        "_clock",
        "_config",
        "_failures",
        "_half_open",
        "_lock",
        "_open_until",
        "_reason",
        "_standalone",
        "_trial_until",
        "chain_id",
    )

    def __init__(
        self, config: Cooldown, size: int, clock: Callable[[], float], *, watch: bool = True
    ) -> None:
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: list[deque[float]] = [deque() for _ in range(size)]
        self._open_until: list[float] = [0.0] * size
        # True from the moment a client's breaker opens until a call to it succeeds.
        self._half_open: list[bool] = [False] * size
        # While a trial call is out, other requests leave the client for last. A trial
        # whose outcome never comes back (a caller cancelled it, or it raised an error the
        # chain does not reroute) frees the slot after one ``duration``.
        self._trial_until: list[float] = [0.0] * size
        self._reason: list[OpenReason | None] = [None] * size
        #: Distinguishes chains in the circuit-state metric.
        self.chain_id = next(_chain_ids)
        # A breaker inside a shared one only stands in for the fleet's: it is not watched
        # and its openings are not counted (the fleet's are).
        self._standalone = watch
        if watch:
            watch_circuit(self)

    async def aorder(self, candidates: Sequence[int]) -> list[int]:
        """[`order`][], for the async call shapes (nothing here waits)."""
        return self.order(candidates)

    def adopt(self, index: int, remaining: float, reason: OpenReason | None) -> None:
        """The fleet holds ``index`` open for another ``remaining`` seconds: so does this
        breaker, so that it carries the cooldown on if the shared store goes away."""
        now = self._clock()
        with self._lock:
            if now + remaining > self._open_until[index]:
                self._open_until[index] = now + remaining
                self._half_open[index] = True
                self._trial_until[index] = 0.0
                self._failures[index].clear()
                self._reason[index] = reason

    def order(self, candidates: Sequence[int]) -> list[int]:
        """``candidates`` (the clients that may take the request, in chain order) in the
        order to try them: those not cooling down, then those with a trial call out; when
        every candidate cools down, the one whose cooldown ends first, alone."""
        now = self._clock()
        with self._lock:
            ready: list[int] = []
            trial_out: list[int] = []
            for i in candidates:
                if self._open_until[i] > now:
                    continue
                if not self._half_open[i]:
                    ready.append(i)
                elif self._trial_until[i] <= now:
                    self._trial_until[i] = now + self._config.duration
                    logger.info("Client %d's cooldown ended; giving it one trial call.", i)
                    ready.append(i)
                else:
                    trial_out.append(i)
            if ready or trial_out:
                for i in candidates:
                    if self._open_until[i] > now:
                        logger.info(
                            "Client %d is cooling down for another %.1fs; skipping it.",
                            i,
                            self._open_until[i] - now,
                        )
                # A client with a trial call out is still better than no answer.
                return ready + trial_out
            # Never refuse a request without asking anyone: the soonest back is asked.
            soonest = min(candidates, key=lambda i: self._open_until[i])
            return [soonest]

    def failed(self, index: int, error: BaseException | None) -> None:
        config = self._config
        now = self._clock()
        with self._lock:
            history = self._failures[index]
            until = self._open_until[index]
            reason = self._reason[index]
            if self._half_open[index] and until <= now:
                # The trial call failed: the client is not back yet.
                until = now + config.duration
                reason = "probe_failed"
                history.clear()
            else:
                history.append(now)
                while history and history[0] <= now - config.window:
                    history.popleft()
                if len(history) >= config.failures:
                    if now + config.duration > until:
                        until, reason = now + config.duration, "failures"
                    history.clear()
            wait = retry_after_wait(config, error)
            if wait > 0 and now + wait > until:
                until, reason = now + wait, "retry_after"
            opened = until > now and self._open_until[index] <= now
            if until > now:
                self._half_open[index] = True
                self._trial_until[index] = 0.0
                self._reason[index] = reason
            self._open_until[index] = until
        if opened and self._standalone:
            record_circuit_opening({"chain": self.chain_id, "client": index}, view="local")

    def succeeded(self, index: int) -> None:
        with self._lock:
            if self._half_open[index]:
                logger.info("Client %d answered its trial call; using it again.", index)
            self._failures[index].clear()
            self._half_open[index] = False
            self._trial_until[index] = 0.0
            self._open_until[index] = 0.0
            self._reason[index] = None

    def health(self) -> tuple[MemberHealth, ...]:
        now = self._clock()
        window = self._config.window
        with self._lock:
            members = []
            for i, history in enumerate(self._failures):
                until = self._open_until[i]
                state: CircuitState
                if until > now:
                    state = "open"
                elif self._half_open[i]:
                    state = "half_open"
                else:
                    state = "closed"
                counted = sum(1 for at in history if at > now - window)
                members.append(
                    MemberHealth(
                        client=i,
                        state=state,
                        failures=counted,
                        open_until=until if state == "open" else None,
                        retry_in=until - now if state == "open" else 0.0,
                        reason=None if state == "closed" else self._reason[i],
                    )
                )
        return tuple(members)


def retry_after_wait(config: Cooldown, error: BaseException | None) -> float:
    """Seconds ``error``'s ``Retry-After`` asks a client to be skipped (capped), else 0."""
    if not config.honor_retry_after or error is None:
        return 0.0
    wait = retry_after_of(error)
    if wait is None or wait <= 0:
        return 0.0
    return min(wait, config.max_retry_after)


def _closed(size: int) -> tuple[MemberHealth, ...]:
    """Health of a chain without a breaker: every client closed, nothing counted."""
    return tuple(
        MemberHealth(client=i, state="closed", failures=0, open_until=None, retry_in=0.0)
        for i in range(size)
    )
