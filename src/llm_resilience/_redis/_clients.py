"""Redis client plumbing: bounded timeouts, connection slots, one async client per loop.

Shared by the rate limiter's bucket and the fallback chain's circuit store, so both bound
every round trip the same way: `connect` builds the clients from a URL or wraps the
caller's, and says when a caller's client lets a sync round trip outlast the bound.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Final

#: Connections per pool of a client built from a URL (one pool for the sync methods, one per
#: event loop for the async methods) unless the URL says otherwise (``?max_connections=64``).
DEFAULT_MAX_CONNECTIONS: Final = 16


def _load_redis(who: str = "RedisTokenBucketRateLimiter") -> Any:
    # Typed loosely on purpose: redis is an optional extra, and the core type-checks
    # without it installed.
    try:
        return import_module("redis")
    except ImportError as exc:
        raise ImportError(f"{who} needs redis-py: pip install 'llm-resilience[redis]'") from exc


class LoopClients:
    """One ``redis.asyncio`` client per event loop, with its connection slots.

    redis.asyncio connections belong to the loop that opened them, so each loop gets a
    client from ``factory`` and as many slots as that client's pool has connections.
    """

    __slots__ = ("_clients", "_factory", "_lock")

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        #: Per event loop: its redis.asyncio client, the async generator closing it, and
        #: the slots its round trips take (one per pooled connection).
        self._clients: dict[
            asyncio.AbstractEventLoop, tuple[Any, AsyncGenerator[None], asyncio.Semaphore]
        ] = {}

    async def get(self) -> tuple[Any, asyncio.Semaphore]:
        """This loop's client and slots, built on first use."""
        # Each client comes with an async generator parked at its yield; a loop's
        # ``shutdown_asyncgens`` (which ``asyncio.run`` calls before closing the loop)
        # closes the generator and so the client, while the loop can still do it cleanly.
        loop = asyncio.get_running_loop()
        entry = self._clients.get(loop)
        if entry is not None:
            return entry[0], entry[2]
        client = self._factory()
        closer = _closing(client)
        await anext(closer)
        gate = asyncio.Semaphore(_pool_size(client))
        with self._lock:
            for stale in [other for other in self._clients if other.is_closed()]:
                del self._clients[stale]
            self._clients[loop] = (client, closer, gate)
        return client, gate

    async def aclose(self) -> None:
        """Close this event loop's client now, if it has one."""
        with self._lock:
            entry = self._clients.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry[1].aclose()


async def _closing(client: Any) -> AsyncGenerator[None]:
    try:
        yield
    finally:
        await client.aclose()


def _no_retry(retry_module: Any) -> Any:
    # redis-py retries a failed command by default (10 times, backed off, in redis-py 8):
    # against a silent server each attempt costs a full read timeout, so one acquire
    # would stall for many times operation_timeout. A stale pooled connection (a Redis
    # restart) is noticed and replaced when it is taken from the pool, not by a retry.
    backoff = import_module("redis.backoff")
    return retry_module.Retry(backoff.NoBackoff(), 0)


def _pool_size(client: Any) -> int:
    """How many connections ``client``'s pool may open: the number of round-trip slots."""
    size = getattr(getattr(client, "connection_pool", None), "max_connections", None)
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        return size
    return DEFAULT_MAX_CONNECTIONS


def _cap_timeouts(client: Any, timeout: float) -> None:
    """Cap the connect and read timeouts of ``client``'s future connections at ``timeout``.

    A URL's own ``socket_timeout``/``socket_connect_timeout`` win over keyword options in
    redis-py's ``from_url``: a smaller one is kept, a larger one is capped. redis-py 8
    also keeps ``orig_*`` copies, restored after a server maintenance event; capped too.
    """
    settings = client.connection_pool.connection_kwargs
    for option in ("socket_timeout", "socket_connect_timeout"):
        value = settings.get(option)
        settings[option] = timeout if value is None else min(value, timeout)
    for option in ("orig_socket_timeout", "orig_socket_connect_timeout"):
        value = settings.get(option)
        if value is not None:
            settings[option] = min(value, timeout)


def _unbounded_settings(client: Any, timeout: float) -> list[str]:
    """The settings of ``client`` that let a sync round trip outlast ``timeout``."""
    settings = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if not isinstance(settings, dict):
        return []
    found = []
    read = settings.get("socket_timeout")
    # redis-py connects with the read timeout when no connect timeout is given.
    connect = settings.get("socket_connect_timeout") or read
    for option, value in (("socket_timeout", read), ("socket_connect_timeout", connect)):
        if value is None or value > timeout:
            found.append(f"{option}={'unset' if value is None else value}")
    retry = settings.get("retry")
    retries = getattr(retry, "_retries", 0) if retry is not None else 0
    if retries != 0:
        found.append(f"{retries} retries")
    return found


# Connection options that mean the same to redis.asyncio; the rest (sync retry objects,
# connect callbacks, internal bookkeeping) do not carry over.
_PORTABLE_OPTIONS: Final = frozenset(
    {
        "host",
        "port",
        "path",
        "db",
        "username",
        "password",
        "credential_provider",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_keepalive_options",
        "client_name",
        "protocol",
        "health_check_interval",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_data",
        "ssl_ca_path",
        "ssl_check_hostname",
        "ssl_min_version",
        "ssl_ciphers",
        "ssl_password",
    }
)


def _async_twin(client: Any) -> Any:
    """A ``redis.asyncio.Redis`` reaching the same server as the sync ``client``."""
    asyncio_redis = import_module("redis.asyncio")
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        raise TypeError(
            f"the async methods need a client with a connection_pool to copy; "
            f"{type(client).__name__} has none"
        )
    options = {k: v for k, v in pool.connection_kwargs.items() if k in _PORTABLE_OPTIONS}
    kind = pool.connection_class.__name__
    connection_class = getattr(asyncio_redis.connection, kind, asyncio_redis.connection.Connection)
    retry = _no_retry(import_module("redis.asyncio.retry"))
    twin_pool = asyncio_redis.ConnectionPool(
        connection_class=connection_class,
        retry=retry,
        max_connections=_pool_size(client),
        **options,
    )
    twin = asyncio_redis.Redis(connection_pool=twin_pool)
    # The twin owns its pool: closing it must disconnect the pool (redis-py's from_pool,
    # spelled so that redis 5.0 understands it too).
    twin.auto_close_connection_pool = True
    return twin


@dataclass(frozen=True, slots=True)
class Connected:
    """The clients `connect` built (or wrapped) and the errors that mean "Redis failed"."""

    #: The sync ``redis.Redis``.
    sync: Any
    #: One ``redis.asyncio`` client per event loop.
    loops: LoopClients
    #: Whether closing is ours (a client built from a URL) or the caller's.
    owned: bool
    #: redis-py's errors and ``OSError`` (which includes the deadline's ``TimeoutError``).
    errors: tuple[type[BaseException], ...]
    #: The error of an EVALSHA whose script the server lost (then EVAL sends it).
    no_script: type[BaseException]


def connect(
    url: str | None, client: Any, timeout: float, *, who: str, label: str, logger: Any
) -> Connected:
    """Clients bounded by ``timeout``: built from ``url`` (retries off, connect and read
    timeouts capped), or ``client`` wrapped, with a WARNING on ``logger`` when its own
    settings let a sync round trip outlast ``timeout``. Nothing connects here."""
    redis = _load_redis(who)
    errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
    if client is None:
        assert url is not None
        options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "max_connections": DEFAULT_MAX_CONNECTIONS,
        }
        # A URL is parsed here (a bad one fails now); no connection is made until a call.
        sync = redis.Redis.from_url(url, retry=_no_retry(import_module("redis.retry")), **options)
        _cap_timeouts(sync, timeout)

        def async_factory() -> Any:
            asyncio_redis = import_module("redis.asyncio")
            retry = _no_retry(import_module("redis.asyncio.retry"))
            built = asyncio_redis.Redis.from_url(url, retry=retry, **options)
            _cap_timeouts(built, timeout)
            return built

        return Connected(
            sync, LoopClients(async_factory), True, errors, redis.exceptions.NoScriptError
        )
    if not callable(getattr(client, "evalsha", None)):
        raise TypeError(f"client must be a redis.Redis, got {type(client).__name__}")
    loose = _unbounded_settings(client, timeout)
    if loose:
        logger.warning(
            "%s: the client passed has %s, so a silent Redis can hold a sync call longer "
            "than operation_timeout (%ss); build it with socket_timeout and "
            "socket_connect_timeout <= %s and retry=Retry(NoBackoff(), 0). The async "
            "methods keep the bound.",
            label,
            ", ".join(loose),
            timeout,
            timeout,
        )
    return Connected(
        client,
        LoopClients(lambda: _async_twin(client)),
        False,
        errors,
        redis.exceptions.NoScriptError,
    )
