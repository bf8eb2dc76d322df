"""``FallbackMiddleware``: failover and retries for a LangChain v1 agent's model calls.

Translation only. Each model call of the agent is run by the core's
[`FallbackChain`][llm_resilience.FallbackChain] over the request's own model and the
fallbacks (what is transient, the time limits, ``Retry-After``, the cooldown circuit,
member retries), one attempt at a time: each attempt is ``handler(request)`` with the
member as the request's model, so every attempt is a model run of its own, with its own
streamed message id, and the answer is the one attempt that succeeded (two attempts'
tokens or tool-call arguments are never merged). What the agent's stream is told of each
attempt is the core's [`AttemptEvent`][llm_resilience.AttemptEvent]; how many attempts a
run may make is its [`AttemptCap`][llm_resilience.AttemptCap]; what a request may carry
to another provider is the core's rule (``cache_control`` dropped, server tools refused).
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from datetime import timedelta
from typing import Annotated, Any, NotRequired
from uuid import UUID

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ModelRequest,
    ModelResponse,
    PrivateStateAttr,
)
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool
from langchain_core.tracers.context import register_configure_hook
from langgraph.errors import GraphBubbleUp
from langgraph.runtime import Runtime

from langchain_llm_resilience.fallback import _carries_images, _known_profile
from llm_resilience.checks import KnownKeywords
from llm_resilience.errors import NoCapableMemberError, PerClientTimeoutError
from llm_resilience.fallback import (
    Cooldown,
    FallbackChain,
    RequestNeeds,
    content_without_cache_control,
    is_server_tool,
    of_classes,
    same_provider,
    without_cache_control,
)
from llm_resilience.retry import RetryPolicy
from llm_resilience.retry_budget import RetryBudget
from llm_resilience.runs import AttemptCap, AttemptEvent, superseded_reason, timed_out_by

__all__ = ["RUN_KEY", "FallbackMiddleware"]

#: The agent state key holding the run the attempt cap counts for (private: never in
#: the agent's input or output).
RUN_KEY = "llm_resilience_attempt_run"

#: The LangChain classes that take Anthropic's ``cache_control`` marks (a subclass too:
#: Bedrock's ``ChatAnthropicBedrock``); every other member gets the request without them.
_CACHE_CONTROL_CLASSES = (
    ("langchain_anthropic", "ChatAnthropic"),
    ("langchain_google_vertexai", "ChatAnthropicVertex"),
)

#: How many request models keep a chain (and its circuit) at once.
_CHAINS_KEPT = 32


class _AttemptState(AgentState[Any]):
    llm_resilience_attempt_run: NotRequired[Annotated[str | None, PrivateStateAttr]]


class FallbackMiddleware(AgentMiddleware[Any, Any, Any], KnownKeywords):
    """Failover and retries around every model call of a ``create_agent`` agent.

    Examples:
        >>> from langchain.agents import create_agent
        >>> agent = create_agent(
        ...     ChatOpenAI(model="gpt-4o", max_retries=0),
        ...     tools=[search],
        ...     middleware=[FallbackMiddleware(
        ...         ChatAnthropic(model="claude-sonnet-4-5", max_retries=0),
        ...         first_token_timeout=10, idle_timeout=5, max_attempts_per_run=8,
        ...         member_retry=RetryPolicy(max_attempts=2, max_delay=5))],
        ... )  # doctest: +SKIP

    Each model call tries the request's model, then ``fallback_models`` in order, under
    the core's rules: a transient failure (429, 503, a dropped connection, a timeout)
    moves on at once, anything else propagates; ``member_retry`` retries a member first
    (waiting out a ``Retry-After`` within its ``max_delay``); ``cooldown`` skips a member
    that keeps failing, its state kept across the agent's calls; ``retry_budget`` (a
    [`RetryBudget`][llm_resilience.RetryBudget], local or shared by the fleet through
    Redis) bounds the same-member retries and hedges of every model call as a share of
    the traffic (a refused retry moves on at once). The time limits
    (seconds or ``timedelta``; None: off) are the chain's: ``per_client_timeout`` bounds
    each attempt, ``first_token_timeout`` the wait for its first streamed token (a call
    that is not streamed: its whole answer), ``idle_timeout`` each silence once tokens
    flow. ``max_attempts_per_run`` (default 10) caps one agent run's attempts, retries
    and fallbacks together; the one past it raises ``AttemptCapExceededError`` (from the
    last failure). A ``BudgetExceededError``, a limiter's refusal and LangGraph's
    ``GraphBubbleUp`` are never retried nor failed over.

    The agent's ``stream_mode="custom"`` gets each attempt's
    [`AttemptEvent`][llm_resilience.AttemptEvent] payload (``"started"``,
    ``"superseded"`` with why, ``"succeeded"``), each naming the ``message_id`` the
    attempt's tokens carry in ``stream_mode="messages"``: drop a superseded attempt's.

    A fallback of another class than Anthropic's gets the request without
    ``cache_control`` marks (model settings, messages, tools); a provider's built-in
    server tool is never sent to another provider: that attempt raises
    ``NoCapableMemberError``. Members known (from their model profile) not to take tools
    or images are skipped. Raises ``TypeError``/``ValueError`` naming the option for no
    fallback, a fallback that is not a ``BaseChatModel``, a bad limit, or a keyword it
    does not take (naming the closest).
    """

    state_schema = _AttemptState

    def __init__(
        self,
        *fallback_models: BaseChatModel,
        per_client_timeout: float | timedelta | None = None,
        first_token_timeout: float | timedelta | None = None,
        idle_timeout: float | timedelta | None = None,
        classifier: Callable[[BaseException], bool] | None = None,
        cooldown: Cooldown | None = None,
        member_retry: RetryPolicy | None = None,
        retry_budget: RetryBudget | None = None,
        max_attempts_per_run: int = 10,
        name: str | None = None,
    ) -> None:
        super().__init__()
        if not fallback_models:
            raise ValueError("FallbackMiddleware needs at least one fallback model")
        for position, model in enumerate(fallback_models):
            if not isinstance(model, BaseChatModel):
                raise TypeError(
                    f"fallback_models[{position}] must be a LangChain chat model "
                    f"(BaseChatModel); got {type(model).__name__}"
                )
        self._options: dict[str, Any] = {
            "per_client_timeout": per_client_timeout,
            "first_token_timeout": first_token_timeout,
            "idle_timeout": idle_timeout,
            "classifier": classifier,
            "cooldown": cooldown,
            "member_retry": member_retry,
            "retry_budget": retry_budget,
        }
        # Checked now, on a chain whose primary stands in for the request's model.
        template = self._new_chain(_Placeholder(), fallback_models)
        #: The models tried after the request's own, in order.
        self.fallback_models: tuple[BaseChatModel, ...] = tuple(fallback_models)
        #: Each limit, as seconds (None: off).
        self.durations = template.durations
        #: The per-run cap on attempts (retries and fallbacks together).
        self.attempt_cap = AttemptCap(max_attempts_per_run)
        self._name = name
        self._chains: OrderedDict[int, tuple[BaseChatModel, FallbackChain[BaseChatModel]]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """The middleware's node name in the agent graph."""
        return self._name or "FallbackMiddleware"

    def __repr__(self) -> str:
        models = ", ".join(type(model).__name__ for model in self.fallback_models)
        return f"FallbackMiddleware({models}, max_attempts_per_run={self.attempt_cap.max_attempts})"

    # -- the run ---------------------------------------------------------------------

    def before_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return {RUN_KEY: _new_run_id(runtime)}

    async def abefore_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return {RUN_KEY: _new_run_id(runtime)}

    def after_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        run = state.get(RUN_KEY) if isinstance(state, dict) else None
        if run is not None:
            self.attempt_cap.close(run)
        return None

    async def aafter_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self.after_agent(state, runtime)

    # -- the model calls ---------------------------------------------------------------

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage:
        call = _Call(self, request)
        chain = self._chain_for(request.model)
        timed = any(value is not None for value in self.durations.values())

        def attempt(index: int, model: BaseChatModel) -> Iterator[Any]:
            return call.run(model, handler, threaded=timed)

        answer: Any = None
        try:
            for item in chain.stream(attempt, needs=_needs(request)):
                if isinstance(item, _Answer):
                    answer = item.response
        except GraphBubbleUp:
            raise
        except BaseException as error:
            call.gave_up(error)
            raise
        call.succeeded(answer)
        return answer  # type: ignore[no-any-return]

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage:
        call = _Call(self, request)
        chain = self._chain_for(request.model)
        timed = any(value is not None for value in self.durations.values())

        def attempt(index: int, model: BaseChatModel) -> AsyncIterator[Any]:
            return call.arun(model, handler, tasked=timed)

        answer: Any = None
        try:
            async for item in chain.astream(attempt, needs=_needs(request)):
                if isinstance(item, _Answer):
                    answer = item.response
        except GraphBubbleUp:
            raise
        except BaseException as error:
            call.gave_up(error)
            raise
        call.succeeded(answer)
        return answer  # type: ignore[no-any-return]

    # -- chains ------------------------------------------------------------------------

    def _new_chain(
        self, primary: Any, fallbacks: Sequence[BaseChatModel]
    ) -> FallbackChain[BaseChatModel]:
        return FallbackChain(
            [primary, *fallbacks],
            **self._options,
            clients_option="models",
            profile_of=_profile_of,
        )

    def _chain_for(self, model: BaseChatModel) -> FallbackChain[BaseChatModel]:
        """The chain for calls on ``model``: one per request model, kept (with its
        circuit) across the agent's calls, the least recently used dropped past 32."""
        with self._lock:
            kept = self._chains.pop(id(model), None)
            if kept is None or kept[0] is not model:
                kept = (model, self._new_chain(model, self.fallback_models))
            self._chains[id(model)] = kept
            while len(self._chains) > _CHAINS_KEPT:
                self._chains.popitem(last=False)
            return kept[1]


# -- one model call ----------------------------------------------------------------------


class _Answer:
    """The last item of an attempt that succeeded: the handler's response."""

    __slots__ = ("response",)

    def __init__(self, response: Any) -> None:
        self.response = response


#: Stands for one token an attempt streamed (the chain's content, for its time limits).
_TOKEN = object()


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Attempt:
    """What one attempt has done so far (read to tell a UI why it was superseded)."""

    __slots__ = ("error", "finished", "last", "message_id", "model", "number", "tokens")

    def __init__(self, number: int, model: str | None) -> None:
        self.number = number
        self.model = model
        self.message_id: str | None = None
        self.error: BaseException | None = None
        self.tokens = 0
        self.last = time.monotonic()
        self.finished = False


class _Call:
    """One model call of the agent: its attempts, their events, their requests."""

    def __init__(self, middleware: FallbackMiddleware, request: ModelRequest[Any]) -> None:
        self._middleware = middleware
        self._request = request
        state: Any = request.state
        run = state.get(RUN_KEY) if isinstance(state, dict) else None
        self._run: str = run if isinstance(run, str) else uuid.uuid4().hex
        runtime = request.runtime
        self._write: Callable[[Any], None] | None = getattr(runtime, "stream_writer", None)
        self._current: _Attempt | None = None
        self._lock = threading.Lock()

    def _emit(self, attempt: _Attempt, kind: Any, reason: str | None = None) -> None:
        if self._write is None:
            return
        event = AttemptEvent(
            kind,
            run_id=self._run,
            attempt=attempt.number,
            model=attempt.model,
            message_id=attempt.message_id,
            reason=reason,
        )
        self._write(event.payload())

    def _begin(self, model: BaseChatModel) -> tuple[_Attempt, ModelRequest[Any]]:
        """Supersede the attempt before (if still open), count this one, build its request."""
        with self._lock:
            previous = self._current
            if previous is not None and not previous.finished:
                previous.finished = True
                self._emit(previous, "superseded", self._reason(previous, None))
            cause = previous.error if previous is not None else None
            try:
                number = self._middleware.attempt_cap.take(self._run)
            except BaseException as capped:
                raise capped from cause
            attempt = _Attempt(number, _model_name(model))
            self._current = attempt
        return attempt, self._portable(model)

    def _reason(self, attempt: _Attempt, error: BaseException | None) -> str:
        error = error or attempt.error
        if isinstance(error, PerClientTimeoutError):
            return superseded_reason(None, timed_out=error.option)
        if error is not None:
            return superseded_reason(error)
        durations = self._middleware.durations
        return superseded_reason(
            None,
            timed_out=timed_out_by(
                first_token_timeout=durations["first_token_timeout"],
                idle_timeout=durations["idle_timeout"],
                tokens=attempt.tokens,
                since_last=time.monotonic() - attempt.last,
            ),
        )

    def gave_up(self, error: BaseException) -> None:
        """The chain raised: the open attempt's tokens are not the answer either."""
        with self._lock:
            attempt = self._current
            if attempt is not None and not attempt.finished:
                attempt.finished = True
                self._emit(attempt, "superseded", self._reason(attempt, error))

    def succeeded(self, response: Any) -> None:
        with self._lock:
            attempt = self._current
            if attempt is None:
                return
            attempt.finished = True
            if attempt.message_id is None:
                attempt.message_id = _message_id(response)
            self._emit(attempt, "succeeded")

    def _probe(self, attempt: _Attempt, on_token: Callable[[], None] | None) -> _AttemptProbe:
        def started(message_id: str) -> None:
            attempt.message_id = message_id
            self._emit(attempt, "started")

        def token(message_id: str | None) -> None:
            if attempt.tokens == 0 and message_id and message_id != attempt.message_id:
                attempt.message_id = message_id  # the provider's own id, as streamed
            attempt.tokens += 1
            attempt.last = time.monotonic()
            if on_token is not None:
                on_token()

        return _AttemptProbe(started, token)

    # -- sync ---------------------------------------------------------------------------

    def run(
        self,
        model: BaseChatModel,
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
        *,
        threaded: bool,
    ) -> Iterator[Any]:
        attempt, request = self._begin(model)
        if not threaded:
            probe = self._probe(attempt, None)
            token = _PROBE.set(probe)
            try:
                response = handler(request)
            except BaseException as error:
                attempt.error = error
                raise
            finally:
                _PROBE.reset(token)
            yield _Answer(response)
            return
        # Under a time limit the chain must see each token as it comes: the handler runs
        # on a thread of its own and its tokens are forwarded. An attempt its deadline
        # abandons keeps that thread until the provider call returns (the chain's rule for
        # sync calls); its tokens then carry a message id already superseded.
        inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        probe = self._probe(attempt, lambda: inbox.put(_TOKEN))
        context = contextvars.copy_context()
        context.run(_PROBE.set, probe)

        def work() -> None:
            try:
                inbox.put(_Answer(context.run(handler, request)))
            except BaseException as error:
                inbox.put(_Failure(error))

        threading.Thread(target=work, name="llm-resilience-attempt", daemon=True).start()
        while True:
            item = inbox.get()
            if item is _TOKEN:
                yield item
            elif isinstance(item, _Failure):
                attempt.error = item.error
                raise item.error
            else:
                yield item
                return

    # -- async --------------------------------------------------------------------------

    async def arun(
        self,
        model: BaseChatModel,
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
        *,
        tasked: bool,
    ) -> AsyncIterator[Any]:
        attempt, request = self._begin(model)
        if not tasked:
            probe = self._probe(attempt, None)
            token = _PROBE.set(probe)
            try:
                response = await handler(request)
            except BaseException as error:
                attempt.error = error
                raise
            finally:
                _PROBE.reset(token)
            yield _Answer(response)
            return
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[Any] = asyncio.Queue()

        def arrived() -> None:
            loop.call_soon_threadsafe(inbox.put_nowait, _TOKEN)

        probe = self._probe(attempt, arrived)
        context = contextvars.copy_context()
        context.run(_PROBE.set, probe)
        task = asyncio.create_task(_awaited(handler(request)), context=context)
        getter: asyncio.Future[Any] | None = None
        try:
            while True:
                getter = asyncio.ensure_future(inbox.get())
                done, _ = await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    getter = None
                    yield _TOKEN
                    continue
                try:
                    response = task.result()
                except BaseException as error:
                    attempt.error = error
                    raise
                yield _Answer(response)
                return
        finally:
            # A deadline or the caller's cancellation closes this attempt: its request
            # is cancelled with it, nothing left running.
            if getter is not None:
                getter.cancel()
            if not task.done():
                task.cancel()
                try:
                    await task
                except BaseException:  # its outcome is no longer anyone's
                    pass

    # -- what the request may carry --------------------------------------------------------

    def _portable(self, model: BaseChatModel) -> ModelRequest[Any]:
        """The request as ``model`` may take it (the core's rule), with ``model`` in it."""
        request = self._request
        if model is request.model:
            return request
        for tool in request.tools:
            if is_server_tool(tool) and not same_provider(model, request.model):
                raise NoCapableMemberError({_position(self._middleware, model): ("server_tools",)})
        overrides: dict[str, Any] = {"model": model}
        if not of_classes(model, _CACHE_CONTROL_CLASSES):
            settings, changed = without_cache_control(request.model_settings)
            if changed:
                overrides["model_settings"] = dict(settings)
            system = request.system_message
            if system is not None:
                content, changed = content_without_cache_control(system.content)
                if changed:
                    overrides["system_message"] = system.model_copy(update={"content": content})
            messages, changed_any = [], False
            for message in request.messages:
                content, changed = content_without_cache_control(message.content)
                messages.append(
                    message.model_copy(update={"content": content}) if changed else message
                )
                changed_any = changed_any or changed
            if changed_any:
                overrides["messages"] = messages
            tools, changed_any = [], False
            for tool in request.tools:
                tool, changed = _tool_without_cache_control(tool)
                tools.append(tool)
                changed_any = changed_any or changed
            if changed_any:
                overrides["tools"] = tools
        return request.override(**overrides)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _tool_without_cache_control(tool: BaseTool | dict[str, Any]) -> tuple[Any, bool]:
    if isinstance(tool, BaseTool):
        if not tool.extras:
            return tool, False
        extras, changed = without_cache_control(tool.extras)
        if not changed:
            return tool, False
        return tool.model_copy(update={"extras": dict(extras) or None}), True
    stripped, changed = without_cache_control(tool)
    return (dict(stripped) if changed else tool), changed


def _position(middleware: FallbackMiddleware, model: BaseChatModel) -> int:
    for position, fallback in enumerate(middleware.fallback_models, start=1):
        if fallback is model:
            return position
    return 0


# -- the attempt probe -----------------------------------------------------------------------


class _AttemptProbe(BaseCallbackHandler):
    """Sees one attempt's model run: its id when it starts, each token it streams."""

    run_inline = True  # called in the run's own thread or task, never on an executor

    def __init__(self, started: Callable[[str], None], token: Callable[[str | None], None]) -> None:
        self._started = started
        self._token = token
        self._run: UUID | None = None

    def __repr__(self) -> str:
        return "_AttemptProbe()"

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        if self._run is None:  # the attempt's own model run; any below it is its business
            self._run = run_id
            self._started(f"lc_run--{run_id}")

    def on_llm_new_token(
        self,
        token: str | list[str | dict[str, Any]],
        *,
        chunk: Any = None,
        run_id: UUID,
        **kwargs: Any,
    ) -> None:
        if run_id != self._run:
            return
        message = getattr(chunk, "message", None)
        self._token(getattr(message, "id", None))


#: The probe of the attempt running in this context, put into every callback manager
#: configured under it (LangChain's configure hook), so the attempt's model run reports
#: to it without the handler passing anything.
_PROBE: contextvars.ContextVar[_AttemptProbe | None] = contextvars.ContextVar(
    "llm_resilience_attempt_probe", default=None
)
register_configure_hook(_PROBE, inheritable=True)


# -- helpers ----------------------------------------------------------------------------------


class _Placeholder:
    """Stands for the request's model while the options are checked at construction."""


def _profile_of(model: Any) -> Any:
    return _known_profile(model) if isinstance(model, BaseChatModel) else None


def _needs(request: ModelRequest[Any]) -> RequestNeeds:
    return RequestNeeds(
        tool_calling=bool(request.tools),
        image_inputs=_carries_images(list(request.messages)),
        structured_output=False,
    )


def _new_run_id(runtime: Runtime[Any]) -> str:
    info = getattr(runtime, "execution_info", None)
    run_id = getattr(info, "run_id", None)
    # Without a run id in the config, each invocation is a run of its own.
    return str(run_id) if run_id else uuid.uuid4().hex


def _model_name(model: BaseChatModel) -> str | None:
    for attribute in ("model_name", "model"):
        value = getattr(model, attribute, None)
        if isinstance(value, str):
            return value
    return None


def _message_id(response: Any) -> str | None:
    result = getattr(response, "result", None)
    messages = result if isinstance(result, list) else [response]
    for message in messages:
        if isinstance(message, AIMessage):
            return message.id
    return None
