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

from llm_resilience.errors import PerClientTimeoutError, StreamInterruptedError
from llm_resilience.fallback._breaker import MemberHealth, _Breaker, _closed
from llm_resilience.fallback._deadlines import TimeLimit, _AttemptClock, _TimeLimits
from llm_resilience.fallback._member_retry import _MemberRetry, member_retry_option
from llm_resilience.fallback._options import (
    Classifier,
    Cooldown,
    RestartHook,
    StreamRestart,
    _OptionTypeError,
    checked_mid_stream,
)
from llm_resilience.fallback._routing import (
    MemberProfile,
    RequestNeeds,
    _Routing,
    is_context_overflow,
)
from llm_resilience.fallback._sources import (
    _aclose,
    _AttemptTimedOut,
    _DirectSource,
    _Source,
    _ThreadedSource,
)
from llm_resilience.fallback._workers import _WORKERS
from llm_resilience.retry import RetryPolicy
from llm_resilience.transient import is_transient

# Every part of the fallback chain logs as ``llm_resilience.fallback`` (a documented name).
logger = logging.getLogger("llm_resilience.fallback")

ClientT = TypeVar("ClientT")
ResultT = TypeVar("ResultT")
ChunkT = TypeVar("ChunkT")


_SENTINEL_END = object()


class FallbackChain(Generic[ClientT]):
    """Try ``clients`` in order; fall through to the next one on transient failures.

    ``clients`` needs at least 2 entries. Three time limits, each None (off, the
    default) or seconds > 0 as a float or ``timedelta``, count only time spent waiting on
    a member (never time the consumer holds a chunk); when one fires the attempt counts
    as a transient failure:

    * ``per_client_timeout`` bounds all of an attempt's waits together;
    * ``first_token_timeout`` bounds the wait for a stream's first content chunk, and
      for a call (``invoke``/``ainvoke``) the whole response, which arrives at once;
    * ``idle_timeout`` bounds each wait for the next chunk once a stream's content
      has started, so a stream gone silent restarts on the next client.

    ``classifier`` replaces the
    default transient rule (:func:`~llm_resilience.transient.is_transient`), for example
    with ``TransientClassifier.with_server_errors()``. ``cooldown`` enables the circuit
    breaker. ``on_restart`` is called with a :class:`StreamRestart` whenever a stream
    restarts on the next client. ``mid_stream="raise"`` (default ``"restart"``) makes a
    stream that fails after it delivered content raise
    :class:`~llm_resilience.errors.StreamInterruptedError` instead of restarting; a
    failure before any content still falls through quietly. ``clock`` is the monotonic
    clock the breaker reads.

    ``member_profiles`` (one :class:`MemberProfile` or None per client) is what the chain
    knows of each client: a prompt too long for one client goes on to the next client
    whose ``context_window`` is larger (never back, never to one not known to be larger),
    and a call's ``needs=`` (a :class:`RequestNeeds`, or one per client) skips the clients
    known not to support it; see :mod:`llm_resilience.fallback._routing`.

    ``member_retry`` (a :class:`~llm_resilience.RetryPolicy`; default None: each client
    once) retries a client that answered 429 or a 5xx before moving on: a
    ``Retry-After`` within the policy's ``max_delay`` is waited out exactly, other
    failures wait the policy's backoff; a stream only before its first chunk; the waits
    count toward the attempt's time bound (see :mod:`~llm_resilience.fallback._member_retry`).

    Raises ``ValueError``/``TypeError`` naming the option for bad input.
    """

    __slots__ = (
        "_breaker",
        "_classifier",
        "_limits",
        "_member_retry",
        "_on_restart",
        "_routing",
        "_timeout",
        "_timeout_label",
        "_timeout_option",
        "clients",
        "cooldown",
        "first_token_timeout",
        "idle_timeout",
        "member_retry",
        "mid_stream",
        "per_client_timeout",
    )

    def __init__(
        self,
        clients: Sequence[ClientT],
        *,
        per_client_timeout: float | timedelta | None = None,
        first_token_timeout: float | timedelta | None = None,
        idle_timeout: float | timedelta | None = None,
        classifier: Classifier | None = None,
        cooldown: Cooldown | None = None,
        on_restart: RestartHook | None = None,
        mid_stream: str = "restart",
        member_profiles: Sequence[MemberProfile | None] | None = None,
        member_retry: RetryPolicy | None = None,
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
        limits = _TimeLimits.checked(per_client_timeout, first_token_timeout, idle_timeout)
        if classifier is not None and not callable(classifier):
            raise _OptionTypeError(
                f"classifier must be a callable taking an exception (for example a "
                f"TransientClassifier); got {classifier!r}"
            )
        if cooldown is not None and not isinstance(cooldown, Cooldown):
            raise _OptionTypeError(f"cooldown must be None or a Cooldown(...); got {cooldown!r}")
        if on_restart is not None and not callable(on_restart):
            raise _OptionTypeError(f"on_restart must be a callable; got {on_restart!r}")
        #: What a stream that fails after delivering content does: "restart" or "raise".
        self.mid_stream = checked_mid_stream(mid_stream)
        #: The clients, in the order they are tried.
        self.clients: tuple[ClientT, ...] = tuple(clients)
        #: The per-client timeout in seconds, or None.
        self.per_client_timeout: float | None = limits.per_client
        #: The first-token timeout in seconds, or None.
        self.first_token_timeout: float | None = limits.first_token
        #: The idle timeout (longest silence mid-stream) in seconds, or None.
        self.idle_timeout: float | None = limits.idle
        #: The circuit-breaker configuration, or None.
        self.cooldown = cooldown
        self._limits = limits
        # A request/response attempt's bound: the smaller of per_client_timeout and
        # first_token_timeout (a response that is not streamed arrives whole).
        call_limit = limits.for_call()
        self._timeout = call_limit[0] if call_limit else None
        self._timeout_option: TimeLimit = call_limit[1] if call_limit else "per_client_timeout"
        self._timeout_label = limits.label(call_limit[1]) if call_limit else ""
        self._classifier: Classifier = classifier if classifier is not None else is_transient
        self._breaker = _Breaker(cooldown, len(self.clients), clock) if cooldown else None
        self._on_restart = on_restart
        self._routing = _Routing(member_profiles, len(self.clients), option="member_profiles")
        policy = member_retry_option(member_retry)
        #: The policy a failing client is retried under before the chain moves on, or None.
        self.member_retry: RetryPolicy | None = policy
        self._member_retry = (
            _MemberRetry(policy, self._timeout, clock) if policy is not None else None
        )

    def layers_below(self) -> tuple[ClientT, ...]:
        """The clients, in the order they are tried (the core's layer contract)."""
        return self.clients

    def health(self) -> tuple[MemberHealth, ...]:
        """Each client's circuit, in client order: state, failures in window, open until.

        Without a ``cooldown`` every client reads ``"closed"`` with no failures counted.
        """
        if self._breaker is None:
            return _closed(len(self.clients))
        return self._breaker.health()

    # -- bookkeeping shared by every call shape ------------------------------------

    def _order(self, needs: RequestNeeds | Sequence[RequestNeeds] | None = None) -> list[int]:
        if self._breaker is None:
            order = list(range(len(self.clients)))
        else:
            order = self._breaker.order(len(self.clients))
        return self._routing.eligible(order, needs)

    def _failed(self, index: int, error: BaseException | None) -> None:
        if self._breaker is not None:
            if is_context_overflow(error):
                # A member that refused a prompt as too long has answered: it is healthy.
                self._breaker.succeeded(index)
                return
            self._breaker.failed(index, error)

    def _succeeded(self, index: int) -> None:
        if self._breaker is not None:
            self._breaker.succeeded(index)

    def _timeout_error(
        self, index: int, cause: BaseException, option: TimeLimit | None = None
    ) -> PerClientTimeoutError:
        option = option or self._timeout_option
        limit = timedelta(seconds=self._limits.seconds_of(option))
        error = PerClientTimeoutError(index, limit, option=option)
        error.__cause__ = cause
        return error

    def _is_transient(self, error: BaseException) -> bool:
        return self._classifier(error)

    def _moves_on(self, error: BaseException, order: list[int], position: int) -> bool:
        """Whether ``error`` sends the request on; a prompt too long also narrows ``order``."""
        if is_context_overflow(error):
            return self._routing.after_overflow(order, position, error)
        return self._is_transient(error)

    # -- request/response ----------------------------------------------------------

    def invoke(
        self,
        attempt: Callable[[int, ClientT], ResultT],
        *,
        needs: RequestNeeds | Sequence[RequestNeeds] | None = None,
    ) -> ResultT:
        """Run ``attempt(index, client)`` against each client in turn until one succeeds.

        The attempt is bounded by ``per_client_timeout`` or ``first_token_timeout``,
        whichever is smaller (a response that is not streamed arrives whole, so its first
        content is all of it). With a bound, each attempt runs on a worker thread (carrying the
        caller's context variables) so that a hung provider cannot stall the caller;
        an attempt abandoned at its timeout keeps its thread until the provider call
        returns, and its result is discarded. Worker threads are reused (see
        :class:`_Workers`), so a timed attempt costs a hand-off, not a thread start.
        """
        order = self._order(needs)
        if self._member_retry is not None:
            attempt = self._member_retry.call(attempt)
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
                if not self._moves_on(error, order, position):
                    raise
                last = len(order) - 1
                self._failed(index, error)
                if position == last:
                    raise
                if not is_context_overflow(error):  # routing logged why it moves on
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

    async def ainvoke(
        self,
        attempt: Callable[[int, ClientT], Awaitable[ResultT]],
        *,
        needs: RequestNeeds | Sequence[RequestNeeds] | None = None,
    ) -> ResultT:
        """Async :meth:`invoke`: ``await attempt(index, client)`` on each client in turn.

        The bound (as in :meth:`invoke`) cancels the attempt's await; the caller's own
        cancellation propagates at once and is never rerouted.
        """
        order = self._order(needs)
        if self._member_retry is not None:
            attempt = self._member_retry.acall(attempt)
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
                if not self._moves_on(error, order, position):
                    raise
                last = len(order) - 1
                self._failed(index, error)
                if position == last:
                    raise
                if not is_context_overflow(error):  # routing logged why it moves on
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
        needs: RequestNeeds | Sequence[RequestNeeds] | None = None,
        text_of: Callable[[ChunkT], str] | None = None,
    ) -> Iterator[ChunkT]:
        """Yield the chunks of ``attempt(index, client)``, falling through on failure.

        Before the first chunk a transient failure or timeout tries the next client
        quietly; after chunks were yielded the next client restarts the request from the
        beginning (the chunks already yielded stay yielded) and ``on_restart`` hooks are
        called. ``is_content`` decides which chunks carry content: those count as tokens
        in the mid-stream log line, and the first one ends the ``first_token_timeout``
        wait (default: every chunk). The time limits count only waits for the next
        chunk: time the consumer spends between chunks is never held against a client.
        With any limit set, a worker thread pulls the attempt. The attempt is created
        when iteration starts, not before. Under ``mid_stream="raise"`` a failure after
        content raises :class:`~llm_resilience.errors.StreamInterruptedError` instead of
        restarting; ``text_of`` gives a content chunk's text for its ``delivered_text``.
        """
        order = self._order(needs)
        if self._member_retry is not None:
            attempt = self._member_retry.stream(attempt)
        last = len(order) - 1
        for position, index in enumerate(order):
            client = self.clients[index]
            source: _Source[ChunkT]
            if self._limits.any:
                source = _ThreadedSource(attempt, index, client)
            else:
                source = _DirectSource(attempt, index, client)
            clock = _AttemptClock(self._limits)
            started = False
            content = 0
            delivered: list[str] = []
            try:
                while True:
                    wait = clock.next_wait()
                    began = time.monotonic()
                    try:
                        chunk = source.next(None if wait is None else wait[0])
                    except StopIteration:
                        break
                    except _AttemptTimedOut as timed_out:
                        assert wait is not None
                        option = wait[1]
                        self._failed(index, None)
                        if content and self.mid_stream == "raise":
                            interrupted = self._interrupted(index, content, delivered)
                            raise interrupted from timed_out.cause
                        if position == last:
                            raise self._timeout_error(
                                index, timed_out.cause, option
                            ) from timed_out.cause
                        self._log_stream_failure(index, started, content, timed_out=option)
                        if started:
                            self._restarted(
                                on_restart,
                                StreamRestart(index, order[position + 1], content, timed_out.cause),
                            )
                        break
                    except BaseException as error:
                        if not self._moves_on(error, order, position):
                            raise
                        last = len(order) - 1
                        self._failed(index, error)
                        if content and self.mid_stream == "raise":
                            raise self._interrupted(index, content, delivered) from error
                        if position == last:
                            raise
                        if not is_context_overflow(error):  # routing logged why it moves on
                            self._log_stream_failure(index, started, content, timed_out=None)
                        if started:
                            self._restarted(
                                on_restart,
                                StreamRestart(index, order[position + 1], content, error),
                            )
                        break
                    carries = is_content is None or is_content(chunk)
                    clock.waited(time.monotonic() - began, content=carries)
                    started = True
                    if carries:
                        content += 1
                        if text_of is not None and self.mid_stream == "raise":
                            delivered.append(text_of(chunk))
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
        needs: RequestNeeds | Sequence[RequestNeeds] | None = None,
        text_of: Callable[[ChunkT], str] | None = None,
    ) -> AsyncIterator[ChunkT]:
        """Async :meth:`stream`. ``on_restart`` hooks may be coroutine functions.

        A time limit that fires cancels the wait for the next chunk (closing the
        attempt's HTTP request); the caller's own cancellation propagates at once.
        """
        order = self._order(needs)
        if self._member_retry is not None:
            attempt = self._member_retry.astream(attempt)
        last = len(order) - 1
        loop = asyncio.get_running_loop()
        for position, index in enumerate(order):
            client = self.clients[index]
            clock = _AttemptClock(self._limits)
            iterator: AsyncIterator[ChunkT] | None = None
            started = False
            finished = False
            content = 0
            delivered: list[str] = []
            try:
                while True:
                    wait = clock.next_wait()
                    scope: asyncio.Timeout | None = None
                    began = loop.time()
                    try:
                        if wait is None:
                            if iterator is None:
                                iterator = aiter(attempt(index, client))
                            chunk = await anext(iterator)
                        else:
                            # A chunk that is ready (or the end of the stream) is taken
                            # even when no time is left: only a wait can run out.
                            async with asyncio.timeout(wait[0]) as scope:
                                if iterator is None:
                                    iterator = aiter(attempt(index, client))
                                chunk = await anext(iterator)
                    except StopAsyncIteration:
                        finished = True
                        break
                    except BaseException as error:
                        timed_out = (
                            scope is not None
                            and scope.expired()
                            and isinstance(error, TimeoutError)
                        )
                        if not timed_out and not self._moves_on(error, order, position):
                            raise
                        last = len(order) - 1
                        option = wait[1] if timed_out and wait is not None else None
                        self._failed(index, None if timed_out else error)
                        if content and self.mid_stream == "raise":
                            raise self._interrupted(index, content, delivered) from error
                        if position == last:
                            if option is not None:
                                cause = error.__cause__ or error
                                raise self._timeout_error(index, cause, option) from cause
                            raise
                        if option is not None or not is_context_overflow(error):
                            self._log_stream_failure(index, started, content, timed_out=option)
                        if started:
                            restart = StreamRestart(index, order[position + 1], content, error)
                            await self._arestarted(on_restart, restart)
                        break
                    carries = is_content is None or is_content(chunk)
                    clock.waited(loop.time() - began, content=carries)
                    started = True
                    if carries:
                        content += 1
                        if text_of is not None and self.mid_stream == "raise":
                            delivered.append(text_of(chunk))
                    yield chunk
            finally:
                if iterator is not None:
                    await _aclose(iterator)
            if finished:
                self._succeeded(index)
                return
        raise AssertionError("unreachable: the last client either finishes or raises")

    def _interrupted(
        self, index: int, content: int, delivered: list[str]
    ) -> StreamInterruptedError:
        logger.warning(
            "Streaming client %d failed mid-stream after %d token(s); mid_stream='raise', "
            "so it is not restarted.",
            index,
            content,
        )
        return StreamInterruptedError(index, content, "".join(delivered))

    def _log_stream_failure(
        self, index: int, started: bool, content: int, *, timed_out: TimeLimit | None
    ) -> None:
        if timed_out == "first_token_timeout":
            logger.warning(
                "Streaming client %d sent no token within %s; trying next client.",
                index,
                self._limits.label(timed_out),
            )
        elif timed_out == "idle_timeout":
            logger.warning(
                "Streaming client %d went silent for %s after %d token(s); "
                "restarting with next client.",
                index,
                self._limits.label(timed_out),
                content,
            )
        elif started:
            logger.warning(
                "Streaming client %d failed mid-stream after %d token(s); "
                "restarting with next client.",
                index,
                content,
            )
        elif timed_out is not None:
            logger.warning(
                "Streaming client %d timed out after %s before streaming; trying next client.",
                index,
                self._limits.label(timed_out),
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
