"""The fallback engine: ``FallbackChain`` tries clients in order under the chain's rules."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from concurrent.futures import Future
from datetime import timedelta
from types import AsyncGeneratorType, GeneratorType
from typing import Generic, TypeVar

from llm_resilience.checks import KnownKeywords
from llm_resilience.errors import PerClientTimeoutError, StreamInterruptedError
from llm_resilience.fallback._breaker import MemberHealth, _Breaker, _closed
from llm_resilience.fallback._continuation import (
    _Delivered,
    _HeldWhitespace,
    is_prefill_rejection,
    prefilled_attempt,
    split_prefill,
)
from llm_resilience.fallback._deadlines import TimeLimit, _AttemptClock, _TimeLimits
from llm_resilience.fallback._hedge import (
    LoserUsage,
    checked_hedge_after,
    hedged_ainvoke,
    hedged_invoke,
)
from llm_resilience.fallback._hedge_stream import hedged_astream, hedged_stream
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
    resolve_member_profiles,
)
from llm_resilience.fallback._shared_breaker import _SharedBreaker, member_keys
from llm_resilience.fallback._sources import (
    AsyncOpened,
    Mark,
    _aclose,
    _AttemptTimedOut,
    _close,
    _ThreadedSource,
    amarked,
    marked,
    opened,
)
from llm_resilience.fallback._workers import _WORKERS
from llm_resilience.retry import RetryPolicy
from llm_resilience.retry_budget import (
    CallAttempts,
    RetryBudget,
    acall_attempts,
    call_attempts,
    retry_budget_option,
)
from llm_resilience.self_retry import warn_if_self_retrying
from llm_resilience.transient import is_transient

# Every part of the fallback chain logs as ``llm_resilience.fallback`` (a documented name).
logger = logging.getLogger("llm_resilience.fallback")

ClientT = TypeVar("ClientT")
ResultT = TypeVar("ResultT")
ChunkT = TypeVar("ChunkT")


_SENTINEL_END = object()


def _may_fail_over(calls: CallAttempts | None) -> bool:
    """Whether a call may go on to another member: its attempt cap, if any, allows it."""
    return calls is None or calls.may_fail_over()


class FallbackChain(KnownKeywords, Generic[ClientT]):
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
    default transient rule ([`is_transient`][]), for example
    with ``TransientClassifier.with_server_errors()``. ``cooldown`` enables the circuit
    breaker. ``on_restart`` is called with a [`StreamRestart`][] whenever a stream
    goes on after a failure mid-way. ``mid_stream`` (default ``"restart"``) decides what a
    stream that fails after it delivered content does: ``"continue"`` carries on from the
    delivered text on a next client whose profile accepts an assistant prefill (others
    restart), ``"raise"`` raises
    [`StreamInterruptedError`][] instead of restarting; a
    failure before any content still falls through quietly. ``clock`` is the monotonic
    clock the breaker reads.

    ``member_profiles`` (one [`MemberProfile`][] or None per client) is what the chain
    knows of each client: a prompt too long for one client goes on to the next client
    whose ``context_window`` is larger (never back, never to one not known to be larger),
    and a call's ``needs=`` (a [`RequestNeeds`][], or one per client) skips the clients
    known not to support it; see `llm_resilience.fallback._routing`. ``profile_of``
    (an adapter's reader, e.g. of a framework's model profile; see
    `member_profile`) says what is known of a client
    otherwise; the fields ``member_profiles`` declares win over it.

    ``member_retry`` (a [`RetryPolicy`][]; default None: each client
    once) retries a client that answered 429 or a 5xx before moving on: a
    ``Retry-After`` within the policy's ``max_delay`` is waited out exactly, other
    failures wait the policy's backoff; a stream only before its first chunk; the waits
    count toward the attempt's time bound (see `_member_retry`).

    ``hedge_after`` (seconds or ``timedelta``; default None: off, shorter than
    ``first_token_timeout`` and ``per_client_timeout``) hedges a slow first token: the next
    client also gets the request, and the first to produce content wins, the other is
    cancelled (see `_hedge`). Each call shape then takes a
    ``hedge_usage`` reader, so a loser's reported usage can be recorded as spend.

    ``retry_budget`` (a [`RetryBudget`][]; default None: the ``member_retry`` policy's
    ``budget``, if any) bounds the chain's retries: each call counts once, each
    same-member retry and each hedge must be granted (a refused retry moves on, a refused
    hedge is not started: nothing waits), and its ``max_attempts_per_call`` caps a call's
    attempts of every kind, fallbacks included (past it the call fails with the last
    error).

    Raises ``ValueError``/``TypeError`` naming the option for bad input.
    """

    __slots__ = (
        "_breaker",
        "_classifier",
        "_limits",
        "_member_retry",
        "_on_restart",
        "_retry_budget",
        "_routing",
        "_timeout",
        "_timeout_label",
        "_timeout_option",
        "clients",
        "cooldown",
        "first_token_timeout",
        "hedge_after",
        "idle_timeout",
        "member_retry",
        "mid_stream",
        "per_client_timeout",
        "routed_needs",
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
        profile_of: Callable[[ClientT], MemberProfile | None] | None = None,
        member_retry: RetryPolicy | None = None,
        hedge_after: float | timedelta | None = None,
        retry_budget: RetryBudget | None = None,
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
        #: Seconds without a first token before the next client also gets the request
        #: (hedged requests, `_hedge`), or None (off).
        self.hedge_after: float | None = checked_hedge_after(hedge_after, limits)
        if classifier is not None and not callable(classifier):
            raise _OptionTypeError(
                f"classifier must be a callable taking an exception (for example a "
                f"TransientClassifier); got {classifier!r}"
            )
        if cooldown is not None and not isinstance(cooldown, Cooldown):
            raise _OptionTypeError(f"cooldown must be None or a Cooldown(...); got {cooldown!r}")
        if on_restart is not None and not callable(on_restart):
            raise _OptionTypeError(f"on_restart must be a callable; got {on_restart!r}")
        #: What a stream that fails after delivering content does: "restart", "continue"
        #: or "raise".
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
        self._breaker: _Breaker | _SharedBreaker | None = None
        if cooldown is not None and cooldown.shared is not None:
            keys = member_keys(cooldown, self.clients)
            self._breaker = _SharedBreaker(cooldown, keys, clock, self._timeout)
        elif cooldown is not None:
            self._breaker = _Breaker(cooldown, len(self.clients), clock)
        self._on_restart = on_restart
        if profile_of is not None:
            member_profiles = resolve_member_profiles(
                member_profiles, [profile_of(client) for client in self.clients]
            )
        self._routing = _Routing(member_profiles, len(self.clients), option="member_profiles")
        #: The [`RequestNeeds`][] fields some client is known to lack: a request needing
        #: none of them goes to every client, so an adapter need not work out whether a
        #: request carries the others (``needs=None`` routes the same).
        self.routed_needs: frozenset[str] = self._routing.known_lacking()
        policy = member_retry_option(member_retry)
        #: The policy a failing client is retried under before the chain moves on, or None.
        self.member_retry: RetryPolicy | None = policy
        self._member_retry = (
            _MemberRetry(policy, self._timeout, clock) if policy is not None else None
        )
        budget = retry_budget_option(retry_budget)
        #: The budget the chain's retries and hedges draw from, or None (unbounded).
        self._retry_budget = budget if budget is not None or policy is None else policy.budget
        for position, client in enumerate(self.clients):
            warn_if_self_retrying(client, position=position)

    def layers_below(self) -> tuple[ClientT, ...]:
        """The clients, in the order they are tried (the core's layer contract)."""
        return self.clients

    def variant(self, clients: Sequence[ClientT]) -> FallbackChain[ClientT]:
        """This chain over ``clients``, each a variant of the member at its position (the
        same model with tools or an output format bound), sharing this chain's memory.

        The variant keeps every option and shares, member by member, the circuit
        (failures, cooldowns, trial calls) and what the chain learnt of its members (one
        that refused an assistant prefill): a failure met through either counts for both,
        and [`health`][] of either reads it. An adapter whose framework makes a new
        model for each binding (LangChain's ``bind_tools``, which ``create_agent`` calls
        at every step) builds its bound chain with it, so the binding never forgets.
        Raises ``ValueError`` when ``clients`` does not hold one client per member.

        Examples:
            >>> chain = FallbackChain(["a", "b"], cooldown=Cooldown(failures=1))
            >>> def attempt(index, client):
            ...     if index == 0:
            ...         raise ConnectionError("connection reset")
            ...     return f"answered by {client}"
            >>> chain.variant(["a with tools", "b with tools"]).invoke(attempt)
            'answered by b with tools'
            >>> [member.state for member in chain.health()]
            ['open', 'closed']
        """
        clients = tuple(clients)
        if len(clients) != len(self.clients):
            raise ValueError(
                f"a variant of a chain holds one client per member ({len(self.clients)}); "
                f"got {len(clients)}"
            )
        variant: FallbackChain[ClientT] = object.__new__(FallbackChain)
        for name in FallbackChain.__slots__:
            setattr(variant, name, getattr(self, name))
        variant.clients = clients
        return variant

    @property
    def durations(self) -> dict[str, float | None]:
        """Every duration option of the chain, read back as seconds as ``float`` (None: off).

        The one read-back form, whatever spelling built the chain (``30``, ``30.0`` or
        ``timedelta(seconds=30)``), so an adapter shows and keys on the same value.

        Examples:
            >>> FallbackChain(["a", "b"], per_client_timeout=timedelta(seconds=30)).durations
            {'per_client_timeout': 30.0, 'first_token_timeout': None, 'idle_timeout': None, \
'hedge_after': None}
        """
        return {
            "per_client_timeout": self.per_client_timeout,
            "first_token_timeout": self.first_token_timeout,
            "idle_timeout": self.idle_timeout,
            "hedge_after": self.hedge_after,
        }

    def health(self) -> tuple[MemberHealth, ...]:
        """Each client's circuit, in client order: state, failures in window, open until.

        Without a ``cooldown`` every client reads ``"closed"`` with no failures counted.
        """
        if self._breaker is None:
            return _closed(len(self.clients))
        return self._breaker.health()

    # -- bookkeeping shared by every call shape ------------------------------------

    def _order(self, needs: RequestNeeds | Sequence[RequestNeeds] | None = None) -> list[int]:
        # What the request needs comes first: the breaker orders only the members that
        # can take it, so a capable member cooling down is still asked when it is the
        # soonest back among them, and an incapable one never stands in for it.
        everyone = list(range(len(self.clients)))
        capable = everyone if needs is None else self._routing.eligible(everyone, needs)
        if self._breaker is None:
            return capable
        return self._breaker.order(capable)

    async def _aorder(
        self, needs: RequestNeeds | Sequence[RequestNeeds] | None = None
    ) -> list[int]:
        """Async `_order`: a shared breaker's round trip runs on the loop's client."""
        everyone = list(range(len(self.clients)))
        capable = everyone if needs is None else self._routing.eligible(everyone, needs)
        if self._breaker is None:
            return capable
        return await self._breaker.aorder(capable)

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

    def _open_call(self) -> CallAttempts | None:
        """One call's attempt counter on the chain's retry budget (the call counted)."""
        return call_attempts(self._retry_budget)

    async def _aopen_call(self) -> CallAttempts | None:
        """Async [`_open_call`][]: awaits the shared budget's count (if any)."""
        return await acall_attempts(self._retry_budget)

    @property
    def retry_budget(self) -> RetryBudget | None:
        """The [`RetryBudget`][] the chain's retries and hedges draw from, or None."""
        return self._retry_budget

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
        hedge_usage: LoserUsage | None = None,
    ) -> ResultT:
        """Run ``attempt(index, client)`` against each client in turn until one succeeds.

        The attempt is bounded by ``per_client_timeout`` or ``first_token_timeout``,
        whichever is smaller (a response that is not streamed arrives whole, so its first
        content is all of it). With a bound, each attempt runs on a worker thread (carrying the
        caller's context variables) so that a hung provider cannot stall the caller;
        an attempt abandoned at its timeout keeps its thread until the provider call
        returns, and its result is discarded. Worker threads are reused (see
        `_Workers`), so a timed attempt costs a hand-off, not a thread start.
        """
        if self.hedge_after is not None:
            return hedged_invoke(self, attempt, needs=needs, usage_of=hedge_usage)
        order = self._order(needs)
        calls = None if self._retry_budget is None else self._open_call()
        if calls is not None:
            attempt = calls.counted(attempt)
        if self._member_retry is not None:
            attempt = self._member_retry.call(attempt, calls)
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
                if position == last or not _may_fail_over(calls):
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
                if position == last or not _may_fail_over(calls):
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

        def run(future: Future[ResultT]) -> None:
            try:
                future.set_result(context.run(attempt, index, client))
            except BaseException as error:
                future.set_exception(error)
                # The error's traceback holds this frame: drop the future (see `_sources`).
                del future

        # The future is passed, not closed over: a closure cell is shared with the caller,
        # and only this frame's own reference can be dropped once the caller has gone.
        _WORKERS.submit(functools.partial(run, future))
        try:
            try:
                return future.result(timeout=self._timeout)
            except TimeoutError as error:
                if not future.done():
                    raise _AttemptTimedOut(error) from None
                # The attempt raised a TimeoutError of its own, or finished right at the
                # deadline: either way its own outcome is the answer.
                return future.result()
        except _AttemptTimedOut:
            raise
        except BaseException:
            # The attempt's own error, from a finished future: its traceback holds this
            # frame, which must not keep the future (holding the error) alive, or the
            # attempt's frames (a provider's stream among their locals) wait for the
            # cyclic GC (see `_sources`).
            del future
            raise

    async def ainvoke(
        self,
        attempt: Callable[[int, ClientT], Awaitable[ResultT]],
        *,
        needs: RequestNeeds | Sequence[RequestNeeds] | None = None,
        hedge_usage: LoserUsage | None = None,
    ) -> ResultT:
        """Async [`invoke`][]: ``await attempt(index, client)`` on each client in turn.

        The bound (as in [`invoke`][]) cancels the attempt's await; the caller's own
        cancellation propagates at once and is never rerouted.
        """
        if self.hedge_after is not None:
            return await hedged_ainvoke(self, attempt, needs=needs, usage_of=hedge_usage)
        # Without a breaker or a retry budget nothing here waits: no coroutine is awaited.
        order = self._order(needs) if self._breaker is None else await self._aorder(needs)
        calls = None if self._retry_budget is None else await self._aopen_call()
        if calls is not None:
            attempt = calls.counted(attempt)
        if self._member_retry is not None:
            attempt = self._member_retry.acall(attempt, calls)
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
                    if position == last or not _may_fail_over(calls):
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
                if position == last or not _may_fail_over(calls):
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
        continue_attempt: Callable[[int, ClientT, str], Iterable[ChunkT]] | None = None,
        drop_text: Callable[[ChunkT, int], ChunkT] | None = None,
        hedge_usage: LoserUsage | None = None,
        mark: Mark | None = None,
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
        content raises [`StreamInterruptedError`][] instead of
        restarting; ``text_of`` gives a content chunk's text for its ``delivered_text``.

        Under ``mid_stream="continue"`` a next client whose profile accepts an assistant
        prefill is called as ``continue_attempt(index, client, prefill)`` (the delivered
        text, trailing whitespace removed) and streams the rest; ``drop_text(chunk, n)``
        returns ``chunk`` without the first ``n`` characters of its text, so whitespace
        the consumer already holds is not delivered twice. Without ``continue_attempt``
        and ``text_of`` the stream restarts (see `_continuation`).

        ``mark(chunk, index)``, if given, translates every chunk of the client at
        ``index`` (of ``attempt`` and ``continue_attempt`` alike) before anything else
        reads it: an adapter's mark of the member that served, applied in this loop
        rather than by a generator of its own around each member's stream.
        """
        if self.hedge_after is not None:
            yield from hedged_stream(
                self,
                attempt if mark is None else marked(attempt, mark),
                is_content=is_content,
                on_restart=on_restart,
                needs=needs,
                text_of=text_of,
                usage_of=hedge_usage,
            )
            return
        order = self._order(needs)
        calls = None if self._retry_budget is None else self._open_call()
        plain = attempt if calls is None else calls.counted(attempt)
        if self._member_retry is not None:
            plain = self._member_retry.stream(plain, calls)
        can_continue = self._continues(continue_attempt, text_of)
        kept_text = self._kept_text(text_of)
        held = _Delivered(keeps_text=kept_text is not None)
        position = 0
        prefill: str | None = None
        # Without time limits no wait is bounded: the clock is neither asked nor told, and
        # the attempt is pulled here, one ``next`` a chunk, with no worker and no source.
        timed = self._limits.any
        while True:
            index = order[position]
            client = self.clients[index]
            current = plain
            trim: _HeldWhitespace[ChunkT] | None = None
            if prefill is not None:
                assert continue_attempt is not None
                assert text_of is not None
                current = prefilled_attempt(continue_attempt, prefill)
                if calls is not None:
                    current = calls.counted(current)
                if self._member_retry is not None:
                    current = self._member_retry.stream(current, calls)
                trim = _HeldWhitespace(split_prefill(held.text())[1], text_of, drop_text)
            source: _ThreadedSource[ChunkT] | None = None
            clock: _AttemptClock | None = None
            if timed:
                source = _ThreadedSource(current, index, client)
                clock = _AttemptClock(self._limits)
            iterator: Iterator[ChunkT] | None = None
            began = 0.0
            started = False
            finished = False
            content = 0
            try:
                while True:
                    wait: tuple[float, TimeLimit] | None = None
                    try:
                        if source is None:
                            # Created at the first pull, so a failure to start is the
                            # attempt's, as a failure mid-way is.
                            if iterator is None:
                                iterator = iter(current(index, client))
                            chunk = next(iterator)
                        else:
                            assert clock is not None
                            wait = clock.next_wait()
                            began = time.monotonic()
                            chunk = source.next(None if wait is None else wait[0])
                        if mark is not None:
                            chunk = mark(chunk, index)
                    except StopIteration:
                        finished = True
                        break
                    except _AttemptTimedOut as timed_out:
                        assert wait is not None
                        held.settle(content)
                        step = self._after_stream_failure(
                            timed_out.cause, wait[1], order, position, started, content, held,
                            prefill, can_continue, calls,
                        )  # fmt: skip
                        position, prefill, restart = step
                        if restart is not None:
                            self._restarted(on_restart, restart)
                        break
                    except BaseException as error:
                        held.settle(content)
                        step = self._after_stream_failure(
                            error, None, order, position, started, content, held, prefill,
                            can_continue, calls,
                        )  # fmt: skip
                        position, prefill, restart = step
                        if restart is not None:
                            self._restarted(on_restart, restart)
                        break
                    if trim is not None:
                        chunk = trim(chunk)
                    carries = is_content is None or is_content(chunk)
                    if clock is not None:
                        clock.waited(time.monotonic() - began, content=carries)
                    started = True
                    if carries:
                        content += 1
                        if kept_text is not None:
                            held.add(kept_text(chunk))
                    yield chunk
                if finished:
                    self._succeeded(index)
                    return
            finally:
                if source is not None:
                    source.close()
                elif iterator is not None and not (finished and type(iterator) is GeneratorType):
                    _close(iterator)  # a generator that ran to its end is closed already

    async def astream(
        self,
        attempt: Callable[[int, ClientT], AsyncOpened[ChunkT]],
        *,
        is_content: Callable[[ChunkT], bool] | None = None,
        on_restart: RestartHook | None = None,
        needs: RequestNeeds | Sequence[RequestNeeds] | None = None,
        text_of: Callable[[ChunkT], str] | None = None,
        continue_attempt: Callable[[int, ClientT, str], AsyncOpened[ChunkT]] | None = None,
        drop_text: Callable[[ChunkT, int], ChunkT] | None = None,
        hedge_usage: LoserUsage | None = None,
        mark: Mark | None = None,
    ) -> AsyncIterator[ChunkT]:
        """Async [`stream`][]. ``on_restart`` hooks may be coroutine functions; an
        attempt may return its async iterable or an awaitable of it (a coroutine method
        that returns a stream, as LlamaIndex's ``astream_chat``), awaited as the
        attempt starts.

        A time limit that fires cancels the wait for the next chunk (closing the
        attempt's HTTP request); the caller's own cancellation propagates at once.
        """
        if self.hedge_after is not None:
            hedged = hedged_astream(
                self,
                attempt if mark is None else amarked(attempt, mark),
                is_content=is_content,
                on_restart=on_restart,
                needs=needs,
                text_of=text_of,
                usage_of=hedge_usage,
            )
            try:
                async for chunk in hedged:
                    yield chunk
            finally:
                await hedged.aclose()  # closed with this stream: no attempt outlives it
            return
        # Without a breaker or a retry budget nothing here waits: no coroutine is awaited.
        order = self._order(needs) if self._breaker is None else await self._aorder(needs)
        calls = None if self._retry_budget is None else await self._aopen_call()
        plain = attempt if calls is None else calls.counted(attempt)
        if self._member_retry is not None:
            plain = self._member_retry.astream(plain, calls)
        can_continue = self._continues(continue_attempt, text_of)
        kept_text = self._kept_text(text_of)
        held = _Delivered(keeps_text=kept_text is not None)
        position = 0
        prefill: str | None = None
        loop = asyncio.get_running_loop()
        # Without time limits no wait is bounded: the clock is neither asked nor told.
        timed = self._limits.any
        while True:
            index = order[position]
            client = self.clients[index]
            current = plain
            trim: _HeldWhitespace[ChunkT] | None = None
            if prefill is not None:
                assert continue_attempt is not None
                assert text_of is not None
                current = prefilled_attempt(continue_attempt, prefill)
                if calls is not None:
                    current = calls.counted(current)
                if self._member_retry is not None:
                    current = self._member_retry.astream(current, calls)
                trim = _HeldWhitespace(split_prefill(held.text())[1], text_of, drop_text)
            clock = _AttemptClock(self._limits) if timed else None
            iterator: AsyncIterator[ChunkT] | None = None
            began = 0.0
            started = False
            finished = False
            content = 0
            try:
                while True:
                    wait: tuple[float, TimeLimit] | None = None
                    scope: asyncio.Timeout | None = None
                    try:
                        if clock is None:
                            if iterator is None:
                                # `opened`'s rule, without its coroutine for a stream.
                                stream = current(index, client)
                                iterator = (
                                    aiter(stream)  # type: ignore[arg-type]
                                    if hasattr(stream, "__aiter__")
                                    else await opened(stream)
                                )
                            chunk = await anext(iterator)
                        else:
                            wait = clock.next_wait()
                            began = loop.time()
                            if wait is None:
                                if iterator is None:
                                    iterator = await opened(current(index, client))
                                chunk = await anext(iterator)
                            else:
                                # A chunk that is ready (or the end of the stream) is taken
                                # even when no time is left: only a wait can run out.
                                async with asyncio.timeout(wait[0]) as scope:
                                    if iterator is None:
                                        iterator = await opened(current(index, client))
                                    chunk = await anext(iterator)
                        if mark is not None:
                            chunk = mark(chunk, index)
                    except StopAsyncIteration:
                        finished = True
                        break
                    except BaseException as error:
                        timed_out = (
                            scope is not None
                            and scope.expired()
                            and isinstance(error, TimeoutError)
                        )
                        option = wait[1] if timed_out and wait is not None else None
                        held.settle(content)
                        step = self._after_stream_failure(
                            error, option, order, position, started, content, held, prefill,
                            can_continue, calls,
                        )  # fmt: skip
                        position, prefill, restart = step
                        if restart is not None:
                            await self._arestarted(on_restart, restart)
                        break
                    if trim is not None:
                        chunk = trim(chunk)
                    carries = is_content is None or is_content(chunk)
                    if clock is not None:
                        clock.waited(loop.time() - began, content=carries)
                    started = True
                    if carries:
                        content += 1
                        if kept_text is not None:
                            held.add(kept_text(chunk))
                    yield chunk
            finally:
                # An async generator that ran to its end is closed already.
                if iterator is not None and not (finished and type(iterator) is AsyncGeneratorType):
                    await _aclose(iterator)
            if finished:
                self._succeeded(index)
                return

    def _continues(self, continue_attempt: object, text_of: object) -> bool:
        if self.mid_stream != "continue":
            return False
        return continue_attempt is not None and text_of is not None

    def _kept_text(self, text_of: Callable[[ChunkT], str] | None) -> Callable[[ChunkT], str] | None:
        """``text_of`` where a policy reads the delivered text ("raise" reports it,
        "continue" sends it), else None: a restart needs only the count of chunks."""
        return text_of if self.mid_stream != "restart" else None

    def _after_stream_failure(
        self,
        error: BaseException,
        option: TimeLimit | None,
        order: list[int],
        position: int,
        started: bool,
        content: int,
        held: _Delivered,
        prefill: str | None,
        can_continue: bool,
        calls: CallAttempts | None = None,
    ) -> tuple[int, str | None, StreamRestart | None]:
        """Where a stream goes after its attempt at ``order[position]`` failed.

        ``option`` is the time limit that fired (None: ``error`` is the member's own).
        Returns the next position, the prefill that attempt carries (None: from the
        beginning) and what the ``on_restart`` hooks are told (None: nothing); raises
        what the caller gets when the stream goes nowhere. Called in the ``except``
        block of the failure, so a bare failure re-raised keeps its traceback.
        """
        index = order[position]
        if prefill is not None and not content and option is None and is_prefill_rejection(error):
            # The member answered, so it is healthy: it gets the request again, plain.
            self._routing.refused_prefill(index)
            again = StreamRestart(index, index, held.chunks, error, continued=False)
            held.clear()
            return position, None, again
        if option is None and not self._moves_on(error, order, position):
            try:
                raise error
            finally:
                del error  # its traceback holds this frame (see `_sources`)
        self._failed(index, None if option is not None else error)
        if content and self.mid_stream == "raise":
            raise self._interrupted(index, content, [held.text()]) from error
        if position == len(order) - 1 or not _may_fail_over(calls):
            if option is not None:
                cause = error.__cause__ or error
                raise self._timeout_error(index, cause, option) from cause
            try:
                raise error
            finally:
                del error  # as above
        following = order[position + 1]
        next_prefill = None
        if can_continue and self._routing.accepts_prefill(following):
            next_prefill = held.prefill()
        if next_prefill is not None:
            logger.warning(
                "Streaming client %d failed mid-stream after %d token(s); client %d "
                "continues from the text delivered.",
                index,
                content,
                following,
            )
            return (
                position + 1,
                next_prefill,
                StreamRestart(index, following, held.chunks, error, continued=True),
            )
        if option is not None or not is_context_overflow(error):  # routing logged why
            self._log_stream_failure(index, started, content, timed_out=option)
        restart: StreamRestart | None = None
        if started or held.chunks:
            restart = StreamRestart(index, following, held.chunks, error)
        held.clear()
        return position + 1, None, restart

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
