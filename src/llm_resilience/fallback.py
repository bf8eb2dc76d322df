"""The fallback engine: try clients in order, move on at once when one fails transiently.

The engine knows nothing about LangChain or LlamaIndex. It is handed the clients and,
per call, an *attempt*: a function of ``(index, client)`` that performs the request
against one client (returning a result, an awaitable, an iterable of chunks or an
async iterable of chunks). The adapters supply the attempt; every rule lives here.

>>> chain = FallbackChain(["primary", "secondary"], per_client_timeout=30)
>>> chain.invoke(lambda index, client: f"answered by {client}")
'answered by primary'

Rules, in short (``docs/fallback.md`` has the long form):

* each client is tried once, in order; a transient failure (see
  :mod:`llm_resilience.transient`) moves on at once, with no delay; anything else
  propagates at once; when every client failed, the last client's own exception object
  is raised;
* ``per_client_timeout`` bounds each attempt. When it fires the attempt counts as
  transient; if it was the last client the caller gets
  :class:`~llm_resilience.errors.PerClientTimeoutError` (a ``TimeoutError``). The
  caller's own cancellation is never rerouted;
* a stream that fails after yielding chunks is restarted from the beginning on the next
  client; chunks already yielded stay yielded and ``on_restart`` hooks are told;
* an optional :class:`Cooldown` skips, for a while, a client that keeps failing.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

from llm_resilience._checks import OptionTypeError, seconds
from llm_resilience.errors import PerClientTimeoutError
from llm_resilience.transient import is_transient, retry_after_of

__all__ = [
    "Cooldown",
    "FallbackChain",
    "StreamRestart",
    "self_retry_setting",
    "warn_if_self_retrying",
]

logger = logging.getLogger(__name__)

ClientT = TypeVar("ClientT")
ResultT = TypeVar("ResultT")
ChunkT = TypeVar("ChunkT")

Classifier = Callable[[BaseException], bool]


_OptionTypeError = OptionTypeError
_seconds = seconds


@dataclass(frozen=True, slots=True)
class Cooldown:
    """Opt-in circuit breaker for a fallback chain.

    A client that failed transiently ``failures`` times within ``window`` seconds is
    skipped for ``duration`` seconds, so a dead primary stops costing every request its
    full timeout. With ``honor_retry_after`` a 429/503 that carries ``retry-after-ms``
    or ``Retry-After`` (seconds or an HTTP date) skips that client for the time asked,
    capped at ``max_retry_after``. A success clears the client's failure count. If every
    client is cooling down, the one whose cooldown ends first is tried anyway: the chain
    never refuses a call without trying a provider.

    >>> Cooldown(failures=3, window=60, duration=30)
    Cooldown(failures=3, window=60.0, duration=30.0, honor_retry_after=True, max_retry_after=300.0)
    """

    #: Transient failures within ``window`` that open the breaker (>= 1).
    failures: int = 3
    #: Seconds over which failures are counted.
    window: float = 60.0
    #: Seconds a client is skipped once the breaker opens.
    duration: float = 30.0
    #: Whether a provider's ``Retry-After`` sets the client's cooldown.
    honor_retry_after: bool = True
    #: Upper bound, in seconds, on a cooldown taken from ``Retry-After``.
    max_retry_after: float = 300.0

    def __post_init__(self) -> None:
        if isinstance(self.failures, bool) or not isinstance(self.failures, int):
            raise _OptionTypeError(
                f"Cooldown.failures must be an integer >= 1; got {self.failures!r} "
                f"({type(self.failures).__name__})"
            )
        if self.failures < 1:
            raise ValueError(f"Cooldown.failures must be an integer >= 1; got {self.failures}")
        for name in ("window", "duration", "max_retry_after"):
            seconds = _seconds(f"Cooldown.{name}", getattr(self, name), allow_none=False)
            object.__setattr__(self, name, seconds)
        if not isinstance(self.honor_retry_after, bool):
            raise _OptionTypeError(
                f"Cooldown.honor_retry_after must be True or False; got {self.honor_retry_after!r}"
            )


@dataclass(frozen=True, slots=True)
class StreamRestart:
    """What an ``on_restart`` hook is told when a stream restarts on the next client."""

    #: Index of the client that failed mid-stream.
    failed_client: int
    #: Index of the client that will stream the response again from the beginning.
    next_client: int
    #: Content chunks the failed client had yielded (to be discarded by the consumer).
    chunks: int
    #: The failure (a ``TimeoutError`` when the per-client timeout fired).
    error: BaseException


RestartHook = Callable[[StreamRestart], object]


class _Breaker:
    """Per-client failure history and cooldown deadlines; thread-safe."""

    __slots__ = ("_clock", "_config", "_failures", "_lock", "_open_until")

    def __init__(self, config: Cooldown, size: int, clock: Callable[[], float]) -> None:
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: list[deque[float]] = [deque() for _ in range(size)]
        self._open_until: list[float] = [0.0] * size

    def order(self, size: int) -> list[int]:
        now = self._clock()
        with self._lock:
            ready = [i for i in range(size) if self._open_until[i] <= now]
            if ready:
                skipped = [i for i in range(size) if i not in ready]
                for i in skipped:
                    logger.info(
                        "Client %d is cooling down for another %.1fs; skipping it.",
                        i,
                        self._open_until[i] - now,
                    )
                return ready
            soonest = min(range(size), key=lambda i: self._open_until[i])
            return [soonest]

    def failed(self, index: int, error: BaseException | None) -> None:
        config = self._config
        now = self._clock()
        with self._lock:
            history = self._failures[index]
            history.append(now)
            while history and history[0] <= now - config.window:
                history.popleft()
            until = self._open_until[index]
            if len(history) >= config.failures:
                until = max(until, now + config.duration)
                history.clear()
            if config.honor_retry_after and error is not None:
                wait = retry_after_of(error)
                if wait is not None and wait > 0:
                    until = max(until, now + min(wait, config.max_retry_after))
            self._open_until[index] = until

    def succeeded(self, index: int) -> None:
        with self._lock:
            self._failures[index].clear()


class _AttemptTimedOut(Exception):
    """Internal: the per-client timeout fired on an attempt."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("per-client timeout")
        self.cause = cause


_SENTINEL_END = object()


class FallbackChain(Generic[ClientT]):
    """Try ``clients`` in order; fall through to the next one on transient failures.

    ``clients`` needs at least 2 entries. ``per_client_timeout`` is None (unbounded,
    the default) or seconds > 0 as a float or ``timedelta``. ``classifier`` replaces the
    default transient rule (:func:`~llm_resilience.transient.is_transient`), for example
    with ``TransientClassifier.with_server_errors()``. ``cooldown`` enables the circuit
    breaker. ``on_restart`` is called with a :class:`StreamRestart` whenever a stream
    restarts on the next client. ``clock`` is the monotonic clock the breaker reads.

    Raises ``ValueError``/``TypeError`` naming the option for bad input.
    """

    __slots__ = (
        "_breaker",
        "_classifier",
        "_on_restart",
        "_timeout",
        "_timeout_label",
        "clients",
        "cooldown",
        "per_client_timeout",
    )

    def __init__(
        self,
        clients: Sequence[ClientT],
        *,
        per_client_timeout: float | timedelta | None = None,
        classifier: Classifier | None = None,
        cooldown: Cooldown | None = None,
        on_restart: RestartHook | None = None,
        clock: Callable[[], float] = time.monotonic,
        clients_option: str = "clients",
    ) -> None:
        if isinstance(clients, (str, bytes)) or not isinstance(clients, Sequence):
            raise _OptionTypeError(
                f"{clients_option} must be a list of at least 2 clients; "
                f"got {type(clients).__name__}"
            )
        if len(clients) < 2:
            raise ValueError(
                f"{clients_option} must hold at least 2 clients for a fallback chain; "
                f"got {len(clients)}"
            )
        timeout = _seconds("per_client_timeout", per_client_timeout, allow_none=True)
        if classifier is not None and not callable(classifier):
            raise _OptionTypeError(
                f"classifier must be a callable taking an exception (for example a "
                f"TransientClassifier); got {classifier!r}"
            )
        if cooldown is not None and not isinstance(cooldown, Cooldown):
            raise _OptionTypeError(f"cooldown must be None or a Cooldown(...); got {cooldown!r}")
        if on_restart is not None and not callable(on_restart):
            raise _OptionTypeError(f"on_restart must be a callable; got {on_restart!r}")
        #: The clients, in the order they are tried.
        self.clients: tuple[ClientT, ...] = tuple(clients)
        #: The per-client timeout in seconds, or None.
        self.per_client_timeout: float | None = timeout
        #: The circuit-breaker configuration, or None.
        self.cooldown = cooldown
        self._timeout = timeout
        self._timeout_label = str(timedelta(seconds=timeout)) if timeout is not None else ""
        self._classifier: Classifier = classifier if classifier is not None else is_transient
        self._breaker = _Breaker(cooldown, len(self.clients), clock) if cooldown else None
        self._on_restart = on_restart

    # -- bookkeeping shared by every call shape ------------------------------------

    def _order(self) -> list[int]:
        if self._breaker is None:
            return list(range(len(self.clients)))
        return self._breaker.order(len(self.clients))

    def _failed(self, index: int, error: BaseException | None) -> None:
        if self._breaker is not None:
            self._breaker.failed(index, error)

    def _succeeded(self, index: int) -> None:
        if self._breaker is not None:
            self._breaker.succeeded(index)

    def _timeout_error(self, index: int, cause: BaseException) -> PerClientTimeoutError:
        assert self._timeout is not None
        error = PerClientTimeoutError(index, timedelta(seconds=self._timeout))
        error.__cause__ = cause
        return error

    def _is_transient(self, error: BaseException) -> bool:
        return self._classifier(error)

    # -- request/response ----------------------------------------------------------

    def invoke(self, attempt: Callable[[int, ClientT], ResultT]) -> ResultT:
        """Run ``attempt(index, client)`` against each client in turn until one succeeds.

        With a ``per_client_timeout``, each attempt runs on a worker thread (carrying the
        caller's context variables) so that a hung provider cannot stall the caller;
        an attempt abandoned at its timeout keeps its thread until the provider call
        returns, and its result is discarded. Worker threads are reused (see
        :class:`_Workers`), so a timed attempt costs a hand-off, not a thread start.
        """
        order = self._order()
        last = len(order) - 1
        for position, index in enumerate(order):
            client = self.clients[index]
            try:
                if self._timeout is None:
                    result = attempt(index, client)
                else:
                    result = self._run_on_thread(attempt, index, client)
            except _AttemptTimedOut as timed_out:
                self._failed(index, None)
                if position == last:
                    raise self._timeout_error(index, timed_out.cause) from timed_out.cause
                logger.warning(
                    "Client %d timed out after %s; trying next client.",
                    index,
                    self._timeout_label,
                )
                continue
            except BaseException as error:
                if not self._is_transient(error):
                    raise
                self._failed(index, error)
                if position == last:
                    raise
                logger.warning("Client %d failed transiently; trying next client.", index)
                continue
            self._succeeded(index)
            return result
        raise AssertionError("unreachable: the last client either returns or raises")

    def _run_on_thread(
        self, attempt: Callable[[int, ClientT], ResultT], index: int, client: ClientT
    ) -> ResultT:
        assert self._timeout is not None
        future: Future[ResultT] = Future()
        context = contextvars.copy_context()

        def run() -> None:
            try:
                future.set_result(context.run(attempt, index, client))
            except BaseException as error:
                future.set_exception(error)

        _WORKERS.submit(run)
        try:
            return future.result(timeout=self._timeout)
        except TimeoutError as error:
            if future.done():
                # The attempt raised a TimeoutError of its own, or finished right at the
                # deadline: either way its own outcome is the answer.
                return future.result()
            raise _AttemptTimedOut(error) from None

    async def ainvoke(self, attempt: Callable[[int, ClientT], Awaitable[ResultT]]) -> ResultT:
        """Async :meth:`invoke`: ``await attempt(index, client)`` on each client in turn.

        The per-client timeout cancels the attempt's await; the caller's own
        cancellation propagates at once and is never rerouted.
        """
        order = self._order()
        last = len(order) - 1
        for position, index in enumerate(order):
            client = self.clients[index]
            scope: asyncio.Timeout | None = None
            try:
                if self._timeout is None:
                    result = await attempt(index, client)
                else:
                    async with asyncio.timeout(self._timeout) as scope:
                        result = await attempt(index, client)
            except BaseException as error:
                if scope is not None and scope.expired() and isinstance(error, TimeoutError):
                    self._failed(index, None)
                    if position == last:
                        cause = error.__cause__ or error
                        raise self._timeout_error(index, cause) from cause
                    logger.warning(
                        "Client %d timed out after %s; trying next client.",
                        index,
                        self._timeout_label,
                    )
                    continue
                if not self._is_transient(error):
                    raise
                self._failed(index, error)
                if position == last:
                    raise
                logger.warning("Client %d failed transiently; trying next client.", index)
                continue
            self._succeeded(index)
            return result
        raise AssertionError("unreachable: the last client either returns or raises")

    # -- streaming -----------------------------------------------------------------

    def stream(
        self,
        attempt: Callable[[int, ClientT], Iterable[ChunkT]],
        *,
        is_content: Callable[[ChunkT], bool] | None = None,
        on_restart: RestartHook | None = None,
    ) -> Iterator[ChunkT]:
        """Yield the chunks of ``attempt(index, client)``, falling through on failure.

        Before the first chunk a transient failure or timeout tries the next client
        quietly; after chunks were yielded the next client restarts the request from the
        beginning (the chunks already yielded stay yielded) and ``on_restart`` hooks are
        called. ``is_content`` decides which chunks count as tokens in the mid-stream log
        line (default: all). The per-client timeout spans the whole attempt, consumer
        time included. The attempt is created when iteration starts, not before.
        """
        order = self._order()
        last = len(order) - 1
        for position, index in enumerate(order):
            client = self.clients[index]
            source: _Source[ChunkT]
            if self._timeout is None:
                source = _DirectSource(attempt, index, client)
            else:
                source = _ThreadedSource(attempt, index, client, self._timeout)
            started = False
            content = 0
            try:
                while True:
                    try:
                        chunk = source.next()
                    except StopIteration:
                        break
                    except _AttemptTimedOut as timed_out:
                        self._failed(index, None)
                        if position == last:
                            raise self._timeout_error(index, timed_out.cause) from timed_out.cause
                        self._log_stream_failure(index, started, content, timed_out=True)
                        if started:
                            self._restarted(
                                on_restart,
                                StreamRestart(index, order[position + 1], content, timed_out.cause),
                            )
                        break
                    except BaseException as error:
                        if not self._is_transient(error):
                            raise
                        self._failed(index, error)
                        if position == last:
                            raise
                        self._log_stream_failure(index, started, content, timed_out=False)
                        if started:
                            self._restarted(
                                on_restart,
                                StreamRestart(index, order[position + 1], content, error),
                            )
                        break
                    started = True
                    if is_content is None or is_content(chunk):
                        content += 1
                    yield chunk
                if source.finished:
                    self._succeeded(index)
                    return
            finally:
                source.close()
        raise AssertionError("unreachable: the last client either finishes or raises")

    async def astream(
        self,
        attempt: Callable[[int, ClientT], AsyncIterable[ChunkT]],
        *,
        is_content: Callable[[ChunkT], bool] | None = None,
        on_restart: RestartHook | None = None,
    ) -> AsyncIterator[ChunkT]:
        """Async :meth:`stream`. ``on_restart`` hooks may be coroutine functions."""
        order = self._order()
        last = len(order) - 1
        loop = asyncio.get_running_loop()
        for position, index in enumerate(order):
            client = self.clients[index]
            deadline = None if self._timeout is None else loop.time() + self._timeout
            iterator: AsyncIterator[ChunkT] | None = None
            started = False
            finished = False
            content = 0
            try:
                while True:
                    scope: asyncio.Timeout | None = None
                    expired = False
                    try:
                        if deadline is None:
                            if iterator is None:
                                iterator = aiter(attempt(index, client))
                            chunk = await anext(iterator)
                        else:
                            # A chunk ready without suspending would slip past an expired
                            # timeout_at (it only cancels at the next await), so a slow
                            # consumer is checked against the deadline here.
                            if loop.time() >= deadline:
                                expired = True
                                raise TimeoutError("per-client timeout elapsed")
                            async with asyncio.timeout_at(deadline) as scope:
                                if iterator is None:
                                    iterator = aiter(attempt(index, client))
                                chunk = await anext(iterator)
                    except StopAsyncIteration:
                        finished = True
                        break
                    except BaseException as error:
                        timed_out = expired or (
                            scope is not None
                            and scope.expired()
                            and isinstance(error, TimeoutError)
                        )
                        if not timed_out and not self._is_transient(error):
                            raise
                        self._failed(index, None if timed_out else error)
                        if position == last:
                            if timed_out:
                                cause = error.__cause__ or error
                                raise self._timeout_error(index, cause) from cause
                            raise
                        self._log_stream_failure(index, started, content, timed_out=timed_out)
                        if started:
                            restart = StreamRestart(index, order[position + 1], content, error)
                            await self._arestarted(on_restart, restart)
                        break
                    started = True
                    if is_content is None or is_content(chunk):
                        content += 1
                    yield chunk
            finally:
                if iterator is not None:
                    await _aclose(iterator)
            if finished:
                self._succeeded(index)
                return
        raise AssertionError("unreachable: the last client either finishes or raises")

    def _log_stream_failure(
        self, index: int, started: bool, content: int, *, timed_out: bool
    ) -> None:
        if started:
            logger.warning(
                "Streaming client %d failed mid-stream after %d token(s); "
                "restarting with next client.",
                index,
                content,
            )
        elif timed_out:
            logger.warning(
                "Streaming client %d timed out after %s before streaming; trying next client.",
                index,
                self._timeout_label,
            )
        else:
            logger.warning(
                "Streaming client %d failed transiently before streaming; trying next client.",
                index,
            )

    def _hooks(self, extra: RestartHook | None) -> list[RestartHook]:
        return [hook for hook in (self._on_restart, extra) if hook is not None]

    def _restarted(self, extra: RestartHook | None, restart: StreamRestart) -> None:
        for hook in self._hooks(extra):
            outcome = hook(restart)
            if inspect.isawaitable(outcome):
                if inspect.iscoroutine(outcome):
                    outcome.close()  # never awaited; closing avoids a RuntimeWarning
                raise TypeError("a sync stream cannot await an async on_restart hook")

    async def _arestarted(self, extra: RestartHook | None, restart: StreamRestart) -> None:
        for hook in self._hooks(extra):
            outcome = hook(restart)
            if inspect.isawaitable(outcome):
                await outcome


class _Source(Generic[ChunkT]):
    """One streaming attempt, pulled chunk by chunk."""

    finished: bool

    def next(self) -> ChunkT:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _DirectSource(_Source[ChunkT]):
    """No timeout: pull the attempt's iterator in the caller's thread."""

    __slots__ = ("_attempt", "_client", "_index", "_iterator", "finished")

    def __init__(
        self, attempt: Callable[[int, Any], Iterable[ChunkT]], index: int, client: Any
    ) -> None:
        self._attempt = attempt
        self._index = index
        self._client = client
        self._iterator: Iterator[ChunkT] | None = None
        self.finished = False

    def next(self) -> ChunkT:
        if self._iterator is None:
            self._iterator = iter(self._attempt(self._index, self._client))
        try:
            return next(self._iterator)
        except StopIteration:
            self.finished = True
            raise

    def close(self) -> None:
        if self._iterator is not None:
            _close(self._iterator)


class _ThreadedSource(_Source[ChunkT]):
    """With a timeout: a worker thread pulls the attempt; the caller waits with a deadline.

    The deadline is fixed when the attempt starts, so time the consumer spends between
    chunks counts against it. An abandoned worker stops at its next chunk.
    """

    __slots__ = ("_deadline", "_queue", "_stop", "finished")

    def __init__(
        self,
        attempt: Callable[[int, Any], Iterable[ChunkT]],
        index: int,
        client: Any,
        timeout: float,
    ) -> None:
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._deadline = time.monotonic() + timeout
        self.finished = False
        context = contextvars.copy_context()

        def produce() -> None:
            iterator: Iterator[ChunkT] | None = None
            try:
                iterator = iter(attempt(index, client))
                for chunk in iterator:
                    self._queue.put(("chunk", chunk))
                    if self._stop.is_set():
                        return
                self._queue.put(("end", None))
            except BaseException as error:
                # Close a failed iterator before the consumer hears of the failure, so it
                # is released before the next client starts.
                if iterator is not None:
                    _close(iterator)
                    iterator = None
                self._queue.put(("error", error))
            finally:
                if iterator is not None and self._stop.is_set():
                    _close(iterator)

        _WORKERS.submit(lambda: context.run(produce))

    def next(self) -> ChunkT:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise _AttemptTimedOut(TimeoutError("per-client timeout elapsed"))
        try:
            kind, value = self._queue.get(timeout=remaining)
        except queue.Empty:
            raise _AttemptTimedOut(TimeoutError("per-client timeout elapsed")) from None
        if kind == "chunk":
            return value  # type: ignore[no-any-return]
        if kind == "end":
            self.finished = True
            raise StopIteration
        raise value

    def close(self) -> None:
        self._stop.set()


class _Workers:
    """Daemon threads for timed sync attempts: an idle one is reused, else one is started.

    Starting a thread per attempt cost ~0.4 ms a call on a loaded 2-core machine
    (``docs/benchmarks.md``); handing work to an idle thread costs ~0.05 ms. Never
    bounded and never queued: an attempt abandoned at its timeout keeps its worker until
    the provider returns, and the next attempt simply gets another one, so a hung
    provider cannot starve later calls. A worker idle for ``idle_timeout`` seconds exits.
    """

    __slots__ = ("_idle", "_idle_timeout", "_lock")

    def __init__(self, idle_timeout: float = 60.0) -> None:
        self._lock = threading.Lock()
        #: Inboxes of the idle workers, the most recently idle last (its cache is warm).
        self._idle: list[queue.SimpleQueue[Callable[[], object]]] = []
        self._idle_timeout = idle_timeout

    def submit(self, work: Callable[[], object]) -> None:
        """Run ``work()`` on a worker thread; ``work`` must not raise (it reports itself)."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(
                target=self._serve, args=(inbox,), name="llm-resilience-attempt", daemon=True
            ).start()
        inbox.put(work)

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], object]]) -> None:
        while True:
            try:
                work = inbox.get(timeout=self._idle_timeout)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:
                        self._idle.remove(inbox)
                        return
                # A caller took this inbox just as the wait ran out; its work is coming.
                continue
            work()
            del work  # drop the attempt's closure (and its result) before idling
            with self._lock:
                self._idle.append(inbox)


_WORKERS = _Workers()


def _close(iterator: object) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            logger.debug("Closing an abandoned stream failed.", exc_info=True)


async def _aclose(iterator: object) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:
            logger.debug("Closing an abandoned stream failed.", exc_info=True)


# -- inner models that retry by themselves ----------------------------------------------

_CLIENT_ATTRIBUTES = ("root_client", "client", "_client", "root_async_client", "async_client")
_warned: set[tuple[str, int]] = set()
_warned_lock = threading.Lock()


def self_retry_setting(model: object) -> tuple[str, int] | None:
    """The setting through which ``model`` retries on its own, as ``(name, retries)``.

    Looks at the model's ``max_retries`` and, when that is unset, at the
    ``max_retries`` of the SDK client it holds (``ChatOpenAI(max_retries=None)`` leaves
    the openai client's default of 2 in force). Returns None when no retrying is found.
    """
    own = getattr(model, "max_retries", None)
    if isinstance(own, int) and not isinstance(own, bool):
        return ("max_retries", own) if own > 0 else None
    for attribute in _CLIENT_ATTRIBUTES:
        try:
            client = getattr(model, attribute, None)
        except Exception:
            continue
        retries = getattr(client, "max_retries", None) if client is not None else None
        if isinstance(retries, int) and not isinstance(retries, bool) and retries > 0:
            return (f"{attribute}.max_retries", retries)
    return None


def warn_if_self_retrying(model: object, *, position: int, role: str = "fallback chain") -> None:
    """Warn once per model object that its own retries delay failover."""
    setting = self_retry_setting(model)
    if setting is None:
        return
    key = (type(model).__qualname__, id(model))
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    name, retries = setting
    label = getattr(model, "model_name", None) or getattr(model, "model", None) or ""
    described = f"{type(model).__name__}({label})" if label else type(model).__name__
    logger.warning(
        "Client %d of the %s, %s, retries by itself (%s=%d): each failure waits out its "
        "whole retry schedule before failover. Build it with max_retries=0.",
        position,
        role,
        described,
        name,
        retries,
    )
