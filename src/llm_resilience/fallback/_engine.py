"""The fallback engine: ``FallbackChain`` tries clients in order under the chain's rules."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
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
from datetime import timedelta
from typing import Generic, TypeVar

from llm_resilience.errors import PerClientTimeoutError
from llm_resilience.fallback._breaker import _Breaker
from llm_resilience.fallback._options import (
    Classifier,
    Cooldown,
    RestartHook,
    StreamRestart,
    _OptionTypeError,
    _seconds,
)
from llm_resilience.fallback._sources import (
    _aclose,
    _AttemptTimedOut,
    _DirectSource,
    _Source,
    _ThreadedSource,
)
from llm_resilience.fallback._workers import _WORKERS
from llm_resilience.transient import is_transient

# Every part of the fallback chain logs as ``llm_resilience.fallback`` (a documented name).
logger = logging.getLogger("llm_resilience.fallback")

ClientT = TypeVar("ClientT")
ResultT = TypeVar("ResultT")
ChunkT = TypeVar("ChunkT")


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

    def layers_below(self) -> tuple[ClientT, ...]:
        """The clients, in the order they are tried (the core's layer contract)."""
        return self.clients

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
