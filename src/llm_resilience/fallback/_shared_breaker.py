"""The cooldown breaker shared by a fleet through a [`RedisCircuitStore`][].

Every decision of the local breaker (`_breaker`) is asked of the store instead, in one
round trip: which members to try and in what order (claiming a half-open member's one
trial call for this worker), a transient failure, a success. The local breaker always
learns this worker's outcomes and the cooldowns the fleet announces, so when the store is
away (a round trip failed or timed out) it decides alone, and nothing else changes.

Time bounds: every round trip is bounded by the store's ``operation_timeout``. A failure
or success reported from async code goes in a task of its own, so the call never waits
for it; a cancellation or a closed loop loses at most that one report (the fleet's count
misses one failure, or a success that the next one repeats).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, cast

from llm_resilience import telemetry
from llm_resilience.fallback._breaker import (
    CircuitState,
    MemberHealth,
    OpenReason,
    _Breaker,
    retry_after_wait,
)
from llm_resilience.fallback._circuit_script import BUSY, CLOSED, OPEN, PROBE, PROBE_OUT
from llm_resilience.fallback._circuit_store import FailedReply, RedisCircuitStore
from llm_resilience.fallback._options import Cooldown

logger = logging.getLogger("llm_resilience.fallback")

#: Attributes read, in order, for a client's model and its base URL.
_MODEL_ATTRIBUTES = ("model_name", "model", "model_id")
_URL_ATTRIBUTES = ("base_url", "openai_api_base", "anthropic_api_url", "api_base", "azure_endpoint")


def _plain_url(value: object) -> str | None:
    """``value`` as a URL without credentials or query, or None if it is not one."""
    if value is None or isinstance(value, bool):
        return None
    text = str(value)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return None
    host_path = rest.split("?", 1)[0].split("#", 1)[0]
    authority, slash, path = host_path.partition("/")
    authority = authority.rsplit("@", 1)[-1]  # never user:password@
    return f"{scheme}://{authority}{slash}{path}".rstrip("/")


def member_key(client: object) -> str | None:
    """A stable name for ``client`` across processes: ``"<class>:<model>@<base URL>"``,
    read from its attributes (any framework's: nothing is imported), or None when it
    carries neither a model nor a base URL.

    Examples:
        >>> class ChatOpenAI:
        ...     model_name = "gpt-4o-mini"
        ...     openai_api_base = "https://user:secret@api.example.com/v1?x=1"
        >>> member_key(ChatOpenAI())
        'ChatOpenAI:gpt-4o-mini@https://api.example.com/v1'
    """
    model = next(
        (
            value
            for name in _MODEL_ATTRIBUTES
            if isinstance(value := getattr(client, name, None), str) and value
        ),
        None,
    )
    url = next(
        (
            found
            for name in _URL_ATTRIBUTES
            if (found := _plain_url(getattr(client, name, None))) is not None
        ),
        None,
    )
    if model is None and url is None:
        return None
    text = type(client).__name__
    if model is not None:
        text += f":{model}"
    if url is not None:
        text += f"@{url}"
    return text


def member_keys(config: Cooldown, clients: Sequence[object]) -> tuple[str, ...]:
    """Each client's key in the shared store, from ``config.keys`` or derived; refuses
    (``ValueError`` naming ``Cooldown.keys``) keys that are missing, empty or repeated."""
    given = config.keys
    if given is not None and not callable(given):
        keys = tuple(given)
        if len(keys) != len(clients):
            raise ValueError(
                f"Cooldown.keys must hold one key per client ({len(clients)}); got {len(keys)}"
            )
        return keys
    derived: list[str] = []
    for position, client in enumerate(clients):
        key = given(client) if callable(given) else member_key(client)
        if not isinstance(key, str) or not key.strip():
            if callable(given):
                raise ValueError(
                    f"Cooldown.keys returned {key!r} for client {position}; it must return "
                    f"a non-empty string"
                )
            raise ValueError(
                f"Cooldown.keys: client {position} ({type(client).__name__}) names no model "
                f"or base URL to derive its shared key from; pass Cooldown(keys=[...]) with "
                f"one key per client"
            )
        derived.append(key)
    repeated = sorted({key for key in derived if derived.count(key) > 1})
    if repeated:
        raise ValueError(
            f"Cooldown.keys: clients share the key(s) {repeated}, so the fleet could not tell "
            f"them apart; pass Cooldown(keys=[...]) with one distinct key per client"
        )
    return tuple(derived)


def _utc(milliseconds: int) -> datetime:
    return datetime.fromtimestamp(milliseconds / 1000.0, UTC)


class _SharedBreaker:
    """The chain's breaker when ``Cooldown.shared`` is set: the fleet's, with a local one
    that decides alone while the store is away."""

    __slots__ = (
        "__weakref__",
        "_clock",
        "_config",
        "_dirty",
        "_held",
        "_keys",
        "_lease",
        "_local",
        "_store",
        "_tasks",
        "chain_id",
    )

    def __init__(
        self,
        config: Cooldown,
        keys: tuple[str, ...],
        clock: Callable[[], float],
        lease: float | None = None,
    ) -> None:
        assert config.shared is not None
        self._config = config
        self._store: RedisCircuitStore = config.shared
        self._keys = keys
        self._clock = clock
        self._local = _Breaker(config, len(keys), clock, watch=False)
        # Whether a success must be told to the fleet: it had failures counted, or the
        # member was open or half-open when last seen (unknown at first).
        self._dirty = [True] * len(keys)
        # The ids of this process's requests holding an in-flight entry of each member
        # (interchangeable: an outcome releases any one of them), and how long an entry
        # is leased for (the chain's per-attempt timeout, else the cooldown's duration).
        self._held: list[list[str]] = [[] for _ in keys]
        self._lease = lease if lease is not None else config.duration
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Distinguishes chains in the circuit-state metric.
        self.chain_id = self._local.chain_id
        telemetry.watch_circuit(self)

    # -- ordering ----------------------------------------------------------------------

    def order(self, candidates: Sequence[int]) -> list[int]:
        """Like `_Breaker.order`, as the fleet sees the members (one round trip)."""
        if not candidates:
            return []
        config = self._config
        reply = self._store.order(
            [self._keys[i] for i in candidates],
            config.duration,
            config.window,
            config.failures,
            self._lease,
        )
        return self._ordered(candidates, reply)

    async def aorder(self, candidates: Sequence[int]) -> list[int]:
        """Async [`order`][]: the round trip on this loop's async client."""
        if not candidates:
            return []
        config = self._config
        reply = await self._store.aorder(
            [self._keys[i] for i in candidates],
            config.duration,
            config.window,
            config.failures,
            self._lease,
        )
        return self._ordered(candidates, reply)

    def _ordered(self, candidates: Sequence[int], reply: Any) -> list[int]:
        if reply is None:
            return self._local.order(candidates)
        request, now_ms, views = reply
        ready: list[int] = []
        trial_out: list[int] = []
        cooling: list[tuple[int, int]] = []
        for index, view in zip(candidates, views, strict=True):
            if view.held:
                self._held[index].append(request)
            if view.code == BUSY:
                # Suspect, and the fleet's failures plus its requests in flight already
                # reach ``failures``: skipped as if open (asked last when all are).
                self._dirty[index] = True
                cooling.append((index, now_ms))
                continue
            if view.code == CLOSED:
                self._dirty[index] = view.failures > 0
                ready.append(index)
                continue
            self._dirty[index] = True
            if view.code == PROBE:
                logger.info(
                    "Client %d's fleet cooldown ended; this worker makes its one trial call.",
                    index,
                )
                ready.append(index)
            elif view.code == PROBE_OUT:
                trial_out.append(index)
            else:
                assert view.code == OPEN
                self._local.adopt(index, (view.open_until_ms - now_ms) / 1000.0, None)
                cooling.append((index, view.open_until_ms))
        if ready or trial_out:
            for index, until_ms in cooling:
                if until_ms == now_ms:
                    logger.info(
                        "Client %d is suspect and the fleet has enough requests out to it; "
                        "skipping it.",
                        index,
                    )
                    continue
                logger.info(
                    "Client %d is cooling down for the fleet for another %.1fs; skipping it.",
                    index,
                    (until_ms - now_ms) / 1000.0,
                )
            return ready + trial_out
        # Never refuse a request without asking anyone: the soonest back is asked.
        return [min(cooling, key=lambda pair: pair[1])[0]]

    # -- outcomes ------------------------------------------------------------------------

    def failed(self, index: int, error: BaseException | None) -> None:
        self._local.failed(index, error)
        self._dirty[index] = True
        config = self._config
        options: dict[str, Any] = {
            "duration": config.duration,
            "window": config.window,
            "failures": config.failures,
            "retry_after": retry_after_wait(config, error),
            "release": self._release(index),
        }
        key = self._keys[index]
        if self._in_loop():
            self._spawn(self._afailed(index, key, options))
        else:
            self._noted_failure(index, self._store.failed(key, **options))

    async def _afailed(self, index: int, key: str, options: dict[str, Any]) -> None:
        self._noted_failure(index, await self._store.afailed(key, **options))

    def _noted_failure(self, index: int, reply: FailedReply | None) -> None:
        if reply is not None and reply.opened:
            logger.warning(
                "Client %d (%s) opened for the fleet; every worker skips it until its "
                "cooldown ends.",
                index,
                self._keys[index],
            )
            telemetry.record_circuit_opening(
                {"chain": self.chain_id, "client": index, "member": self._keys[index]},
                view="fleet",
            )

    def _release(self, index: int) -> str | None:
        held = self._held[index]
        try:
            return held.pop()
        except IndexError:  # the member was not this request's first: it held nothing
            return None

    def succeeded(self, index: int) -> None:
        self._local.succeeded(index)
        key = self._keys[index]
        release = self._release(index)
        if not self._dirty[index]:
            # Nothing counted against it when last seen: only the in-flight entry goes,
            # after the answer (the call never waits for it).
            if release is None:
                return
            if self._in_loop():
                self._spawn(self._store.arelease(key, release))
            else:
                self._store.release_later(key, release)
            return
        if self._in_loop():
            self._spawn(self._asucceeded(index, key, release))
        else:
            self._noted_success(index, self._store.succeeded(key, release))

    async def _asucceeded(self, index: int, key: str, release: str | None) -> None:
        self._noted_success(index, await self._store.asucceeded(key, release))

    def _noted_success(self, index: int, was_half_open: bool | None) -> None:
        if was_half_open is None:
            return
        self._dirty[index] = False
        if was_half_open:
            logger.info("Client %d answered; closed for the fleet.", index)

    @staticmethod
    def _in_loop() -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    def _spawn(self, report: Any) -> None:
        # Kept referenced until done (the loop holds tasks weakly); bounded by the store's
        # operation_timeout.
        task = asyncio.get_running_loop().create_task(report)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- reading -------------------------------------------------------------------------

    def health(self) -> tuple[MemberHealth, ...]:
        """The fleet's view of every member (one round trip), or this process's own
        breaker's while the store is away (``view="local"``)."""
        config = self._config
        reply = self._store.read(self._keys, [config.window] * len(self._keys))
        if reply is None:
            local = self._local.health()
            return tuple(_with_key(member, self._keys[member.client]) for member in local)
        now_ms, members = reply
        now = self._clock()
        found = []
        for index, member in enumerate(members):
            state: CircuitState
            if member.open_until_ms > now_ms:
                state = "open"
            elif member.half_open:
                state = "half_open"
            else:
                state = "closed"
            remaining = (member.open_until_ms - now_ms) / 1000.0 if state == "open" else 0.0
            probing = state == "half_open" and member.probe_until_ms > now_ms
            found.append(
                MemberHealth(
                    client=index,
                    state=state,
                    failures=member.failures,
                    open_until=now + remaining if state == "open" else None,
                    retry_in=remaining,
                    reason=cast(OpenReason, member.reason) if state != "closed" else None,
                    view="fleet",
                    key=member.key,
                    open_until_utc=_utc(member.open_until_ms) if state == "open" else None,
                    prober=member.probe_owner if probing else None,
                )
            )
        return tuple(found)


def _with_key(member: MemberHealth, key: str) -> MemberHealth:
    return MemberHealth(
        client=member.client,
        state=member.state,
        failures=member.failures,
        open_until=member.open_until,
        retry_in=member.retry_in,
        reason=member.reason,
        view="local",
        key=key,
    )
