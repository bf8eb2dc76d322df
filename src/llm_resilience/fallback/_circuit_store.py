"""``RedisCircuitStore``: where a fleet of workers keeps its fallback members' circuits."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from llm_resilience._redis import Outage, arun_script, connect, pool_size, run_script
from llm_resilience.checks import MAX_DURATION, MAX_OPERATION_TIMEOUT, seconds
from llm_resilience.fallback._circuit_script import (
    FAILED,
    ORDER,
    READ,
    RELEASE,
    SCRIPT,
    SCRIPT_SHA,
    SUCCEEDED,
)

__all__ = ["DEFAULT_CIRCUIT_NAMESPACE", "RedisCircuitStore"]

logger = logging.getLogger("llm_resilience.fallback")

DEFAULT_CIRCUIT_NAMESPACE: Final = "llm_resilience"
#: Default ``operation_timeout`` of the circuit store, in seconds: it sits on every call's
#: path, so a Redis slower than this is treated as away (it answers in well under a
#: millisecond when healthy: docs/benchmarks.md).
DEFAULT_CIRCUIT_OPERATION_TIMEOUT: Final = 0.1
#: Default ``outage_cooldown``: after a failed round trip, calls use the local breaker
#: without trying Redis for this many seconds.
DEFAULT_CIRCUIT_OUTAGE_COOLDOWN: Final = 1.0


@dataclass(frozen=True, slots=True)
class OrderView:
    """One member as the fleet sees it when a request is ordered."""

    code: int
    #: Server milliseconds since the epoch when the cooldown ends (0: none).
    open_until_ms: int
    #: The fleet's failures in the window (counted only when closed).
    failures: int
    #: Whether this request took an in-flight entry of the member (released by its outcome).
    held: bool = False


@dataclass(frozen=True, slots=True)
class FailedReply:
    open_until_ms: int
    #: Whether this failure opened the member (it was not open before).
    opened: bool
    failures: int


@dataclass(frozen=True, slots=True)
class FleetMember:
    """One member's shared circuit as Redis holds it (``read``)."""

    key: str
    open_until_ms: int
    half_open: bool
    probe_owner: str | None
    probe_until_ms: int
    reason: str | None
    opened_at_ms: int
    failures: int


def _duration(option: str, value: object, maximum: timedelta = MAX_DURATION) -> float:
    amount = seconds(f"RedisCircuitStore.{option}", value, maximum=maximum)
    assert amount is not None  # None is not allowed
    return amount


def _safe_url(url: str) -> str:
    """``url`` without its credentials, for reprs and logs."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "redis://?"
    host = rest.rsplit("@", 1)[-1].split("?", 1)[0]
    return f"{scheme}://{host}"


class RedisCircuitStore:
    """The circuits of a fallback chain's members, shared through Redis by every worker.

    Examples:
        >>> store = RedisCircuitStore("redis://127.0.0.1:6379/0")  # doctest: +SKIP
        >>> chain = FallbackChain(  # doctest: +SKIP
        ...     [primary, backup], cooldown=Cooldown(failures=3, window=60, shared=store)
        ... )

    Pass it as ``Cooldown(shared=...)``: every worker whose chain names a member by the
    same key (see [`Cooldown`][]'s ``keys``) counts that member's transient failures in
    one window, so the fleet opens it after ``failures`` failures *in total*, for every
    worker at once; a ``Retry-After`` one worker receives opens it for all; when the
    cooldown ends exactly one worker at a time owns the trial call (an atomic claim that
    lapses after one ``duration`` if its outcome never comes back), the others keep
    skipping the member; and a success closes it for all.

    **In flight.** The member a request tries first takes an entry in the fleet's count
    of requests in flight to it (leased for the chain's per-attempt timeout, else
    ``duration``, so a lost outcome frees it); once the member has a failure counted, a
    request is admitted only while failures plus requests in flight stay below
    ``failures`` (refused, it skips the member as if open). So a dead member receives at
    most ``failures`` requests, or as many as were in flight at once when it died, before
    it opens, whatever the number of workers.

    **Cost.** Each decision is one round trip (one Lua script, ``EVALSHA``): one when a
    request is ordered; one per transient failure; one on a success. A success on a
    member with nothing counted only releases its in-flight entry, after the answer is
    returned (async: a task of its own; sync: this store's releasing thread), so the
    call waits for one round trip (docs/benchmarks.md measures it against a bare
    ``PING``).

    **Redis away** (refused, reset, silent, slower than ``operation_timeout``, a failing
    script): the chain uses its own local breaker (which always learns this worker's
    outcomes, and the cooldowns the fleet announced), one WARNING per outage is logged
    on ``llm_resilience.fallback`` (an INFO when Redis answers again), and for
    ``outage_cooldown`` seconds calls do not try Redis. A call is never failed because the
    store is away; it waits at most ``operation_timeout`` for it (twice that when it
    queued for a connection behind a round trip that failed).

    Args:
        url_or_client: A ``redis://`` URL (the store builds its clients, bounded as
            below, and [`close`][] closes them) or your own ``redis.Redis`` (left open;
            its own timeouts and retries bound the sync calls: a WARNING at construction
            says when they exceed ``operation_timeout``).
        namespace: Prefix of every key (``{namespace}:circuit:...``); fleets that share a
            Redis but not their circuits use different namespaces.
        operation_timeout: Seconds (or ``timedelta``) one round trip may take (default
            0.1): the connect and read timeouts of clients built from a URL, and a
            deadline on each async round trip.
        outage_cooldown: Seconds (or ``timedelta``) calls skip Redis after a failed round
            trip (default 1.0).
        worker_id: How this worker is named in the probe's owner (default
            ``"<hostname>:<pid>"``, read at each claim, so a forked worker is itself).

    Raises ``TypeError``/``ValueError`` naming the option for bad input; ``ImportError``
    without redis-py (``pip install 'llm-resilience[redis]'``). Nothing connects at
    construction.
    """

    __slots__ = (
        "_async_clients",
        "_client",
        "_errors",
        "_gate",
        "_label",
        "_no_script",
        "_outage",
        "_owns_client",
        "_prefix",
        "_releaser_pid",
        "_releases",
        "_url",
        "_worker_id",
        "namespace",
        "operation_timeout",
        "outage_cooldown",
    )

    def __init__(
        self,
        url_or_client: Any,
        *,
        namespace: str = DEFAULT_CIRCUIT_NAMESPACE,
        operation_timeout: float | timedelta = DEFAULT_CIRCUIT_OPERATION_TIMEOUT,
        outage_cooldown: float | timedelta = DEFAULT_CIRCUIT_OUTAGE_COOLDOWN,
        worker_id: str | None = None,
    ) -> None:
        if not isinstance(namespace, str) or not namespace or "}" in namespace:
            raise ValueError(
                f"RedisCircuitStore.namespace must be a non-empty string without '}}'; "
                f"got {namespace!r}"
            )
        if worker_id is not None and (not isinstance(worker_id, str) or not worker_id):
            raise ValueError(
                f"RedisCircuitStore.worker_id must be None or a non-empty string; got {worker_id!r}"
            )
        timeout = _duration("operation_timeout", operation_timeout, MAX_OPERATION_TIMEOUT)
        #: Seconds one round trip to Redis may take.
        self.operation_timeout = timeout
        #: Seconds calls skip Redis after a failed round trip.
        self.outage_cooldown = _duration("outage_cooldown", outage_cooldown)
        #: The prefix of every key (fleets that share it share their circuits).
        self.namespace = namespace
        self._prefix = f"{{{namespace}}}:circuit:"
        self._worker_id = worker_id
        if isinstance(url_or_client, str):
            url: str | None = url_or_client
            client = None
            self._url = _safe_url(url_or_client)
        elif callable(getattr(url_or_client, "evalsha", None)):
            url, client = None, url_or_client
            self._url = f"client={type(url_or_client).__name__}"
        else:
            raise TypeError(
                f"RedisCircuitStore.url_or_client must be a redis:// URL or a redis.Redis; "
                f"got {type(url_or_client).__name__}"
            )
        self._label = f"Shared circuit store {namespace!r}"
        connected = connect(
            url, client, timeout, who="RedisCircuitStore", label=self._label, logger=logger
        )
        self._client = connected.sync
        self._async_clients = connected.loops
        self._owns_client = connected.owned
        self._errors = connected.errors
        self._no_script = connected.no_script
        self._gate = threading.BoundedSemaphore(pool_size(self._client))
        self._outage = Outage(
            self._label, "each worker uses its own breaker", self.outage_cooldown, logger
        )
        self._releases: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self._releaser_pid = 0

    # -- reading back ----------------------------------------------------------------

    @property
    def worker_id(self) -> str:
        """This worker's name as a probe's owner."""
        return self._worker_id or f"{socket.gethostname()}:{os.getpid()}"

    @property
    def available(self) -> bool:
        """False while Redis is taken as away (the last round trip failed)."""
        return not self._outage.in_outage

    def __repr__(self) -> str:
        return f"RedisCircuitStore({self._url!r}, namespace={self.namespace!r})"

    def close(self) -> None:
        """Close the connections of a client this store built (not one you passed)."""
        self._releaser_pid = 0  # the releasing thread, if any, ends
        self._releases.put(("", ""))
        if self._owns_client:
            self._client.close()

    async def aclose(self) -> None:
        """Close this event loop's async client now (``asyncio.run`` closes it anyway)."""
        await self._async_clients.aclose()

    # -- the decisions (one round trip each; None when Redis is away) ---------------

    def _keys(self, members: Sequence[str]) -> list[str]:
        keys = [self._prefix + "members"]
        for member in members:
            keys += [
                self._prefix + "m:" + member,
                self._prefix + "f:" + member,
                self._prefix + "i:" + member,
            ]
        return keys

    def _order_args(
        self, members: Sequence[str], duration: float, window: float, failures: int, lease: float
    ) -> tuple[list[str], list[object]]:
        args: list[object] = [
            ORDER,
            self.worker_id,
            _ms(duration),
            _ms(window),
            failures,
            max(1, _ms(lease)),
            uuid.uuid4().hex,
            *members,
        ]
        return self._keys(members), args

    def _failed_args(
        self,
        member: str,
        duration: float,
        window: float,
        failures: int,
        retry_after: float,
        release: str | None,
    ) -> tuple[list[str], list[object]]:
        entry = uuid.uuid4().hex  # two failures in one millisecond both count
        args: list[object] = [
            FAILED,
            self.worker_id,
            _ms(duration),
            _ms(window),
            failures,
            _ms(retry_after),
            entry,
            release or "",
        ]
        return self._keys([member]), args

    def order(
        self,
        members: Sequence[str],
        duration: float,
        window: float,
        failures: int = 1,
        lease: float = 30.0,
    ) -> tuple[str, int, list[OrderView]] | None:
        """The fleet's view of ``members`` (claiming the probe of each whose cooldown
        ended and whose probe is free, and an in-flight entry of the one tried first),
        with the request's id (what releases the entry) and the server's time (ms)."""
        keys, args = self._order_args(members, duration, window, failures, lease)
        return _order_reply(str(args[6]), self._call(keys, args))

    async def aorder(
        self,
        members: Sequence[str],
        duration: float,
        window: float,
        failures: int = 1,
        lease: float = 30.0,
    ) -> tuple[str, int, list[OrderView]] | None:
        """Async [`order`][]."""
        keys, args = self._order_args(members, duration, window, failures, lease)
        return _order_reply(str(args[6]), await self._acall(keys, args))

    def failed(
        self,
        member: str,
        *,
        duration: float,
        window: float,
        failures: int,
        retry_after: float,
        release: str | None = None,
    ) -> FailedReply | None:
        """Count a transient failure of ``member`` (and its ``Retry-After``, 0: none),
        releasing the in-flight entry of request ``release``."""
        return _failed_reply(
            self._call(*self._failed_args(member, duration, window, failures, retry_after, release))
        )

    async def afailed(
        self,
        member: str,
        *,
        duration: float,
        window: float,
        failures: int,
        retry_after: float,
        release: str | None = None,
    ) -> FailedReply | None:
        """Async [`failed`][]."""
        return _failed_reply(
            await self._acall(
                *self._failed_args(member, duration, window, failures, retry_after, release)
            )
        )

    def succeeded(self, member: str, release: str | None = None) -> bool | None:
        """Close ``member`` for the fleet (releasing request ``release``'s in-flight
        entry); whether it was half-open (None: Redis away)."""
        raw = self._call(self._keys([member]), [SUCCEEDED, release or ""])
        return None if raw is None else bool(int(raw[1]))

    async def asucceeded(self, member: str, release: str | None = None) -> bool | None:
        """Async [`succeeded`][]."""
        raw = await self._acall(self._keys([member]), [SUCCEEDED, release or ""])
        return None if raw is None else bool(int(raw[1]))

    async def arelease(self, member: str, request: str) -> None:
        """Release request ``request``'s in-flight entry of ``member`` (a healthy success)."""
        await self._acall(self._keys([member]), [RELEASE, request])

    def release_later(self, member: str, request: str) -> None:
        """[`arelease`][] from sync code without waiting: this store's releasing thread
        (a daemon, one per process, started at the first release) sends it, batched with
        any others queued meanwhile; a release lost with the process lapses with its lease."""
        self._releases.put((member, request))
        if self._releaser_pid != os.getpid():
            self._releaser_pid = os.getpid()
            threading.Thread(
                target=self._release_queued, name="llm-resilience-circuit-release", daemon=True
            ).start()

    def _release_queued(self) -> None:
        pid = os.getpid()
        while self._releaser_pid == pid:
            batch: dict[str, list[str]] = {}
            member, request = self._releases.get()
            batch.setdefault(member, []).append(request)
            try:
                while True:
                    member, request = self._releases.get_nowait()
                    batch.setdefault(member, []).append(request)
            except queue.Empty:
                pass
            batch.pop("", None)  # close()'s wake-up
            for member, requests in batch.items():
                if self._releaser_pid != pid:
                    return
                try:
                    self._call(self._keys([member]), [RELEASE, *requests])
                except Exception:
                    return

    def read(
        self, members: Sequence[str], windows: Sequence[float]
    ) -> tuple[int, list[FleetMember]] | None:
        """Every one of ``members`` as Redis holds it, with the server's time (ms)."""
        raw = self._call(self._keys(members), [READ, *(_ms(w) for w in windows)])
        return None if raw is None else _read_reply(members, raw)

    def known(self) -> dict[str, float] | None:
        """Every member key the fleet has ordered a request for, with its ``window``."""
        if self._outage.skipping():
            return None
        try:
            with self._gate:
                raw = self._client.hgetall(self._prefix + "members")
        except self._errors as exc:
            self._outage.note_failure(exc)
            return None
        self._outage.note_success()
        return {_text(key): int(value) / 1000.0 for key, value in raw.items()}

    # -- round trips -----------------------------------------------------------------

    def _call(self, keys: list[str], args: list[object]) -> Any:
        return run_script(
            self._outage,
            self._gate,
            self._client,
            self._errors,
            self._no_script,
            (SCRIPT, SCRIPT_SHA),
            keys,
            args,
        )

    async def _acall(self, keys: list[str], args: list[object]) -> Any:
        return await arun_script(
            self._outage,
            self._async_clients,
            self.operation_timeout,
            self._errors,
            self._no_script,
            (SCRIPT, SCRIPT_SHA),
            keys,
            args,
        )


def _ms(value: float) -> int:
    return round(value * 1000)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _order_reply(request: str, raw: Any) -> tuple[str, int, list[OrderView]] | None:
    if raw is None:
        return None
    values = [int(v) for v in raw]
    views = [
        OrderView(values[i], values[i + 1], values[i + 2], bool(values[i + 3]))
        for i in range(1, len(values), 4)
    ]
    return request, values[0], views


def _failed_reply(raw: Any) -> FailedReply | None:
    if raw is None:
        return None
    _, open_until, opened, failures = (int(v) for v in raw)
    return FailedReply(open_until, bool(opened), failures)


def _read_reply(members: Sequence[str], raw: Any) -> tuple[int, list[FleetMember]]:
    now = int(raw[0])
    found = []
    for position, member in enumerate(members):
        base = 1 + 7 * position
        open_until, half, owner, probe_until, reason, opened_at, failures = raw[base : base + 7]
        found.append(
            FleetMember(
                key=member,
                open_until_ms=int(open_until),
                half_open=_text(half) == "1",
                probe_owner=_text(owner) or None,
                probe_until_ms=int(probe_until),
                reason=_text(reason) or None,
                opened_at_ms=int(opened_at),
                failures=int(failures),
            )
        )
    return now, found
