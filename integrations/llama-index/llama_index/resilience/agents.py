"""``RunBudgetLLM``: a run budget for LlamaIndex agents, as the LLM the agent calls.

LlamaIndex's ``FunctionAgent``, ``ReActAgent``, ``CodeActAgent`` and ``AgentWorkflow``
are workflows; every model call they make (each step, a retry after a bad parse,
``early_stopping_method="generate"``, structured output, and a tool that calls a model)
goes through an ``LLM`` inside a step of the run. So the run budget is an LLM layer that
knows which run a call belongs to: the workflow tags every step of a run with its
``llamaindex.run_id`` (the handler's ``run_id``) in the instrumentation tags, which
LlamaIndex copies into each step's task and into a tool's thread. One layer works for
every agent class and for custom workflows, with no subclass and no extra step, and a
side call made with a layer sharing the same [`RunBudget`][llm_resilience.runs.RunBudget]
is charged to the same run.

The rules are the core's (`llm_resilience.runs`): each attempt passes
[`RunSpend.begin`][llm_resilience.runs.RunSpend.begin] before it is sent (strict: its worst
case held in the run's account and the day/month windows) and is recorded once, its
ledger entry naming ``run_id`` and ``thread_id``; the downgrade choice is
[`RunSpend.choose`][llm_resilience.runs.RunSpend.choose]; the final answer of a run its budget
stopped is [`spent_message`][llm_resilience.runs.ending.spent_message]. This module reads
the run and thread from LlamaIndex and translates the rest.
"""

from __future__ import annotations

import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import contextmanager
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.dispatcher import (  # type: ignore[attr-defined]
    active_instrument_tags,
    instrument_tags,
)
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import LLM, ToolSelection
from llama_index.resilience._delegate import (
    AnyResponse,
    CallKind,
    Request,
    aclose_stream,
    undecorated_call,
)
from llama_index.resilience._tool_request import TOOL_REQUEST_KEY, ToolRequest, function_calling
from llama_index.resilience._usage import llm_name, num_output, prompt_pairs
from llama_index.resilience.cost import MeteredLLM, _Call
from llama_index.resilience.events import RunBudgetDowngradeEvent, RunBudgetSpentEvent

from llm_resilience import checks
from llm_resilience.budget import CostBudget, dearest_model, served_model
from llm_resilience.errors import BudgetExceededError
from llm_resilience.ledger import CostLedger
from llm_resilience.metering import Meter
from llm_resilience.runs import Choice, Per, RunAttempt, RunBudget, RunSpend
from llm_resilience.runs.ending import spent_message
from llm_resilience.runs.hedges import charge_hedges
from llm_resilience.usage import Usage, output_cap

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

__all__ = [
    "DOWNGRADED_KEY",
    "RUN_ID_TAG",
    "SPENT_KEY",
    "THREAD_ID_TAG",
    "RunBudgetLLM",
    "agent_thread",
]

#: The instrumentation tag a LlamaIndex workflow puts on every step of a run: its run id.
RUN_ID_TAG = "llamaindex.run_id"
#: The instrumentation tag that names a run's conversation thread (see `agent_thread`).
THREAD_ID_TAG = "thread_id"
#: ``ChatResponse.additional_kwargs`` key marking an answer of the cheaper LLM.
DOWNGRADED_KEY = "run_budget_downgraded"
#: ``additional_kwargs`` key of the final answer a spent budget gave (the window's name).
SPENT_KEY = "run_budget_spent"

dispatcher = get_dispatcher(__name__)

ExitBehavior = Literal["end", "error"]
_EXIT_BEHAVIORS = ("end", "error")
_ResponseT = TypeVar("_ResponseT", ChatResponse, CompletionResponse)
_ASYNC = {"chat": "achat", "stream_chat": "astream_chat"}


@contextmanager
def agent_thread(thread_id: str, *, key: str = THREAD_ID_TAG) -> Iterator[None]:
    """Runs started inside the block belong to conversation thread ``thread_id``.

    ```python
    with agent_thread("user-7"):
        handler = agent.run("What is the weather in Paris?", ctx=ctx)
    answer = await handler
    ```

    It adds the instrumentation tag ``key`` (default ``"thread_id"``) to the ones active,
    as ``llama_index.core.instrumentation.dispatcher.instrument_tags`` does: the workflow
    copies the tags into every step of the run, where [`RunBudgetLLM`][] reads them.
    ``thread_id`` is checked as a budget scope (non-empty printable text, at most 512
    characters); keep it the key of the Context or chat memory the user resumes.
    """
    checked = checks.scope("thread_id", thread_id)
    with instrument_tags({**active_instrument_tags.get(), key: checked}):
        yield


class _Refused(Exception):
    """This layer's own gate refused an attempt (never a refusal from a layer below)."""

    def __init__(self, error: BudgetExceededError, spend: RunSpend) -> None:
        super().__init__(str(error))
        self.error = error
        self.spend = spend


class _Attempt:
    """One admitted attempt, shaped as the core's ``MeteredCall`` for `MeteredLLM`'s hooks:
    the run's [`RunAttempt`][llm_resilience.runs.RunAttempt], and the meter that names who
    served it."""

    __slots__ = ("_prompt", "attempt", "meter")

    def __init__(self, attempt: RunAttempt, meter: Meter, prompt: list[tuple[str, str]]) -> None:
        self.attempt = attempt
        self.meter = meter
        self._prompt = prompt

    @property
    def prompt(self) -> list[tuple[str, str]]:
        return self._prompt

    def _consumed_by(self, usage: Usage, named: object, mark: object) -> str | None:
        # Closed before the stream named who served: the dearest that may have.
        served = self.meter.served(named, mark)
        return served or dearest_model(self.meter.gate.budget, usage, self.meter.may_serve)

    def settle(self, usage: Usage, *, named: object = None, mark: object = None) -> None:
        self.attempt.finish(usage, model=self.meter.served(named, mark))

    async def asettle(self, usage: Usage, *, named: object = None, mark: object = None) -> None:
        await self.attempt.afinish(usage, model=self.meter.served(named, mark))

    def abandon(self) -> None:
        self.attempt.abandon()

    async def aabandon(self) -> None:
        await self.attempt.aabandon()

    def end_early(self, usage: Usage | None, *, named: object = None, mark: object = None) -> None:
        if usage is None:
            self.attempt.abandon()
        else:
            self.attempt.finish(usage, model=self._consumed_by(usage, named, mark))

    async def aend_early(
        self, usage: Usage | None, *, named: object = None, mark: object = None
    ) -> None:
        if usage is None:
            await self.attempt.aabandon()
        else:
            await self.attempt.afinish(usage, model=self._consumed_by(usage, named, mark))


class _RunCall(_Call):
    """One admitted call of a run: its attempt, and where it goes."""

    __slots__ = ("close", "is_async", "kind", "kwargs", "request", "runs", "target", "tools")

    def __init__(
        self,
        attempt: _Attempt,
        *,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        is_async: bool,
        target: LLM | None,
        tools: ToolRequest | None,
        close: Callable[[], None] | None,
    ) -> None:
        super().__init__(attempt)  # type: ignore[arg-type]
        self.kind = kind
        self.request = request
        self.kwargs = kwargs
        self.is_async = is_async
        #: The cheaper LLM when downgraded, else None (the inner LLM).
        self.target = target
        #: A tool request each LLM prepares its own way (only with a downgrade).
        self.tools = tools
        #: Forgets a one-call run (a call outside any workflow run) once it is recorded.
        self.close = close


class RunBudgetLLM(MeteredLLM):
    """The LLM of an agent whose runs have a budget: per run or per thread, strict or not.

    Example:

    ```python
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.llms.openai import OpenAI
    from llama_index.resilience import FallbackLLM, RunBudgetLLM
    from llm_resilience import CostBudget
    from llm_resilience.ledger import SqlCostLedger

    llm = RunBudgetLLM(
        inner=FallbackLLM(llms=[OpenAI(model="gpt-4o", max_retries=0),
                                OpenAI(model="gpt-4o-mini", max_retries=0)]),
        budget=CostBudget(monthly_limit=100, strict=True,
                          prices={"gpt-4o": ("2.50", 10), "gpt-4o-mini": ("0.15", "0.60")}),
        ledger=SqlCostLedger("sqlite:///spend.db"),
        limit="0.05",                                  # what one agent run may spend
        downgrade_to=OpenAI(model="gpt-4o-mini", max_retries=0),
        downgrade_below="0.01",
    )
    agent = FunctionAgent(tools=[get_weather], llm=llm)
    answer = await agent.run("What is the weather in Paris?")
    ```

    ``budget`` is a [`CostBudget`][] (with ``ledger``, ``per``, ``limit`` and
    ``downgrade_below`` as [`RunBudget`][llm_resilience.runs.RunBudget] takes them), or a
    ``RunBudget`` shared by several layers (the agents of an ``AgentWorkflow``, a tool's
    own LLM): then those four options stay unset, they are the ``RunBudget``'s. Every call
    in a workflow run counts toward that run (its ``run_id``); a call outside any run is a
    run of its own. ``per="thread"`` counts a conversation thread across its runs: the
    thread is the instrumentation tag ``thread_key`` (default ``"thread_id"``, set with
    `agent_thread`), and its total starts from the ledger's, so it survives a restart.
    ``scope`` is the tenant whose day/month windows apply: text, or a function given the
    run's instrumentation tags that returns it (None: unscoped).

    When the budget refuses an attempt (the run's or thread's limit, or a day/month
    window), ``exit_behavior="end"`` (default) answers it with a final assistant message
    saying which budget is spent ([`spent_message`][llm_resilience.runs.ending.spent_message];
    no tool call, so every agent class ends its run there, the message in its memory) and
    ``"error"`` raises [`BudgetExceededError`][llm_resilience.BudgetExceededError] out of
    the run's handler. Either way a
    [`RunBudgetSpentEvent`][llama_index.resilience.RunBudgetSpentEvent] is dispatched.

    ``downgrade_to`` is a cheaper LLM (its ``metadata.model_name`` priced by the budget):
    a chat attempt goes to it when what is left of the run (or of the tightest window) is
    under ``downgrade_below``, or, strict, when the asked model's worst case does not fit
    what is left, with a [`RunBudgetDowngradeEvent`][llama_index.resilience.RunBudgetDowngradeEvent]
    carrying both estimates. Tool requests are prepared by whichever LLM gets the attempt,
    and its tool calls parsed by it. Compose failover and limits under this layer
    (``inner=RateLimitedLLM(inner=FallbackLLM(...))``): the strict hold covers every
    member that may serve. Do not put a ``CostTrackedLLM`` below it (each call would be
    recorded twice).

    Raises ``TypeError``/``ValueError`` naming the option: a ``budget`` that is neither,
    options given twice (here and on a ``RunBudget``), a bad ``per``, ``limit``,
    ``exit_behavior``, ``scope`` or ``thread_key``, a ``downgrade_to`` that is not an
    ``LLM`` or has no model name, or a keyword it does not take (naming the closest).
    """

    runs: Any = Field(exclude=True, description="The llm_resilience.runs.RunBudget applied.")
    downgrade_to: Any = Field(default=None, exclude=True, description="The cheaper LLM, or None.")
    exit_behavior: str = Field(default="end", description='"end" or "error" when spent.')
    scope: Any = Field(default=None, exclude=True, description="Tenant scope, or a function.")
    thread_key: str = Field(default=THREAD_ID_TAG, description="The tag naming the thread.")

    _downgrade_meter: Meter | None = PrivateAttr(default=None)

    def __init__(
        self,
        *,
        inner: LLM,
        budget: CostBudget | RunBudget,
        ledger: CostLedger | None = None,
        per: Per = "run",
        limit: object = None,
        scope: str | Callable[[Mapping[str, Any]], str | None] | None = None,
        exit_behavior: ExitBehavior = "end",
        downgrade_to: LLM | None = None,
        downgrade_below: object = None,
        thread_key: str = THREAD_ID_TAG,
        **kwargs: Any,
    ) -> None:
        if exit_behavior not in _EXIT_BEHAVIORS:
            raise ValueError(f"exit_behavior must be 'end' or 'error', got {exit_behavior!r}")
        if not callable(scope):
            checks.scope("scope", scope)
        checks.scope("thread_key", thread_key)
        if thread_key is None:
            raise ValueError("thread_key must name an instrumentation tag, got None")
        cheaper = _downgrade_name(downgrade_to)
        runs = _run_budget(budget, ledger, per, limit, cheaper, downgrade_below)
        meter = Meter(
            runs.budget, runs.ledger, stack=inner, name_of=llm_name, documented_cap=num_output
        )
        super().__init__(
            inner=inner,
            runs=runs,
            downgrade_to=downgrade_to,
            exit_behavior=exit_behavior,
            scope=scope,
            thread_key=thread_key,
            **kwargs,
        )
        self._meter = meter
        if downgrade_to is not None:
            self._downgrade_meter = Meter(
                runs.budget,
                runs.ledger,
                stack=downgrade_to,
                name_of=llm_name,
                documented_cap=num_output,
            )

    @classmethod
    def class_name(cls) -> str:
        return "RunBudgetLLM"

    def spend(self, run_id: str) -> RunSpend | None:
        """The open run ``run_id``'s spend (``spent``, ``held``, ``remaining()``), or None."""
        budget: RunBudget = self.runs
        return budget.get(run_id)

    # -- which run --------------------------------------------------------------------

    def _run_of(self) -> tuple[str, str | None, str | None, bool]:
        """The current call's run id, thread id and scope, and whether it is a one-call run."""
        tags = active_instrument_tags.get()
        run = tags.get(RUN_ID_TAG)
        one_off = not isinstance(run, str) or not run
        if one_off:
            run = f"call-{uuid.uuid4().hex}"
        thread = tags.get(self.thread_key)
        budget: RunBudget = self.runs
        if budget.per == "thread" and thread is None:
            raise ValueError(
                f"per='thread' counts a conversation thread, but this run has no "
                f"{self.thread_key!r} instrumentation tag: start the run inside "
                "llama_index.resilience.agent_thread(thread_id)"
            )
        scope = self.scope(tags) if callable(self.scope) else self.scope
        return str(run), _text(thread), _text(scope), one_off

    def _closer(self, run: str, one_off: bool) -> Callable[[], None] | None:
        if not one_off:
            return None
        budget: RunBudget = self.runs
        return lambda: budget.close(run)

    # -- admitting an attempt -----------------------------------------------------------

    def _begin(self, kind: CallKind, request: Request, kwargs: dict[str, Any]) -> _RunCall:
        run, thread, scope, one_off = self._run_of()
        try:
            return self._admit(run, thread, scope, one_off, kind, request, kwargs)
        except _Refused:
            self._forget(run, one_off)
            raise

    def _admit(
        self,
        run: str,
        thread: str | None,
        scope: str | None,
        one_off: bool,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
    ) -> _RunCall:
        budget: RunBudget = self.runs
        spend = budget.open(run, thread_id=thread, scope=scope)
        prompt, cap, tools = _request_of(request, kwargs, self._downgrade_meter is not None)
        left = self._window_left(spend, kind)
        choice = self._choice(spend, kind, prompt, cap, left)
        meter = self._meter_of(choice)
        try:
            attempt = spend.begin(
                model=_asked(meter), prompt=prompt, max_output_tokens=cap, may_serve=meter.may_serve
            )
        except BudgetExceededError as error:
            choice = self._after_refusal(spend, kind, prompt, cap, choice, error)
            meter = self._meter_of(choice)
            try:
                attempt = spend.begin(
                    model=_asked(meter),
                    prompt=prompt,
                    max_output_tokens=cap,
                    may_serve=meter.may_serve,
                )
            except BudgetExceededError as again:
                raise _Refused(again, spend) from None
        return self._call_of(
            attempt, meter, prompt, choice, kind, request, kwargs, tools, run, one_off, False
        )

    async def _abegin(self, kind: CallKind, request: Request, kwargs: dict[str, Any]) -> _RunCall:
        run, thread, scope, one_off = self._run_of()
        try:
            return await self._aadmit(run, thread, scope, one_off, kind, request, kwargs)
        except _Refused:
            self._forget(run, one_off)
            raise

    async def _aadmit(
        self,
        run: str,
        thread: str | None,
        scope: str | None,
        one_off: bool,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
    ) -> _RunCall:
        budget: RunBudget = self.runs
        spend = await budget.aopen(run, thread_id=thread, scope=scope)
        prompt, cap, tools = _request_of(request, kwargs, self._downgrade_meter is not None)
        left = await self._awindow_left(spend, kind)
        choice = self._choice(spend, kind, prompt, cap, left)
        meter = self._meter_of(choice)
        try:
            attempt = await spend.abegin(
                model=_asked(meter), prompt=prompt, max_output_tokens=cap, may_serve=meter.may_serve
            )
        except BudgetExceededError as error:
            choice = self._after_refusal(spend, kind, prompt, cap, choice, error)
            meter = self._meter_of(choice)
            try:
                attempt = await spend.abegin(
                    model=_asked(meter),
                    prompt=prompt,
                    max_output_tokens=cap,
                    may_serve=meter.may_serve,
                )
            except BudgetExceededError as again:
                raise _Refused(again, spend) from None
        return self._call_of(
            attempt, meter, prompt, choice, kind, request, kwargs, tools, run, one_off, True
        )

    def _forget(self, run: str, one_off: bool) -> None:
        close = self._closer(run, one_off)
        if close is not None:
            close()

    def _can_downgrade(self, kind: CallKind) -> bool:
        # Completions keep their model: agents chat, and a completion's prompt formatting
        # is the inner LLM's own.
        return self._downgrade_meter is not None and kind in _ASYNC

    def _window_left(self, spend: RunSpend, kind: CallKind) -> Decimal | None:
        return spend.window_remaining() if self._can_downgrade(kind) else None

    async def _awindow_left(self, spend: RunSpend, kind: CallKind) -> Decimal | None:
        return await spend.awindow_remaining() if self._can_downgrade(kind) else None

    def _choice(
        self,
        spend: RunSpend,
        kind: CallKind,
        prompt: list[tuple[str, str]],
        cap: int | None,
        left: Decimal | None,
    ) -> Choice | None:
        """The core's downgrade choice (None when this layer has no cheaper LLM)."""
        if not self._can_downgrade(kind):
            return None
        # The call's own cap, else the largest the stack states (as the strict hold reads it).
        caps = [served.max_output_tokens for served in self._meter.may_serve]
        largest = cap if cap is not None else output_cap({}, caps)
        assert self._downgrade_meter is not None
        choice = spend.choose(
            _asked(self._meter),
            prompt=prompt,
            max_output_tokens=largest,
            window_remaining=left,
            may_serve=self._meter.may_serve,
            cheaper_may_serve=self._downgrade_meter.may_serve,
        )
        if choice.downgraded:
            self._announce(spend, choice)
        return choice

    def _after_refusal(
        self,
        spend: RunSpend,
        kind: CallKind,
        prompt: list[tuple[str, str]],
        cap: int | None,
        choice: Choice | None,
        error: BudgetExceededError,
    ) -> Choice | None:
        """The core's choice once the asked model's strict hold was refused: the cheaper
        LLM if it was not tried (a chain's dearest member may not fit when its primary
        did), else the refusal stands."""
        downgraded = choice is not None and choice.downgraded
        forced = None
        if not downgraded and self._can_downgrade(kind):
            assert self._downgrade_meter is not None
            forced = spend.after_refusal(
                _asked(self._meter),
                prompt=prompt,
                max_output_tokens=cap,
                may_serve=self._meter.may_serve,
                cheaper_may_serve=self._downgrade_meter.may_serve,
            )
        if forced is None:
            raise _Refused(error, spend) from None
        self._announce(spend, forced)
        return forced

    def _meter_of(self, choice: Choice | None) -> Meter:
        if choice is not None and choice.downgraded and self._downgrade_meter is not None:
            return self._downgrade_meter
        return self._meter

    def _call_of(
        self,
        attempt: RunAttempt,
        meter: Meter,
        prompt: list[tuple[str, str]],
        choice: Choice | None,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        tools: ToolRequest | None,
        run: str,
        one_off: bool,
        is_async: bool,
    ) -> _RunCall:
        downgraded = choice is not None and choice.downgraded
        # A hedged chain below reports its losing attempts to this run.
        charge_hedges(attempt)
        return _RunCall(
            _Attempt(attempt, meter, prompt),
            kind=kind,
            request=request,
            kwargs=kwargs,
            is_async=is_async,
            target=self.downgrade_to if downgraded else None,
            tools=tools,
            close=self._closer(run, one_off),
        )

    def _announce(self, spend: RunSpend, choice: Choice) -> None:
        dispatcher.event(
            RunBudgetDowngradeEvent(
                run_id=spend.run_id,
                thread_id=spend.thread_id,
                asked_model=choice.asked,
                model=choice.model,
                reason=choice.reason or "",
                estimate=choice.estimate,
                chosen_estimate=choice.chosen_estimate,
                remaining=choice.remaining,
            )
        )

    # -- where the call goes --------------------------------------------------------------

    def _route(self, context: Any, invoke: Callable[[], Any]) -> Callable[[], Any]:
        call: _RunCall = context
        if call.target is None and call.tools is None:
            return invoke
        llm = call.target if call.target is not None else self.inner
        index = 1 if call.target is not None else 0
        method = _ASYNC[call.kind] if call.is_async else call.kind
        send = undecorated_call(llm, method, is_async=call.is_async)
        if call.tools is not None:
            prepared = {**call.tools.prepare(llm, index), **call.kwargs}
        else:
            prepared = {"messages": call.request, **call.kwargs}
        if call.target is None:
            return lambda: send(**prepared)
        if call.kind == "chat":
            if call.is_async:
                return lambda: _amarked(send(**prepared))
            return lambda: _marked(send(**prepared))
        if call.is_async:
            return lambda: _amarked_stream(send(**prepared))
        return lambda: _marked_stream(send(**prepared))

    # -- the end of each call -----------------------------------------------------------

    def _end(self, context: Any, response: AnyResponse | None) -> None:
        try:
            super()._end(context, response)
        finally:
            _closed(context)

    async def _aend(self, context: Any, response: AnyResponse | None) -> None:
        try:
            await super()._aend(context, response)
        finally:
            _closed(context)

    def _end_early(self, context: Any, last: AnyResponse | None) -> None:
        try:
            super()._end_early(context, last)
        finally:
            _closed(context)

    async def _aend_early(self, context: Any, last: AnyResponse | None) -> None:
        try:
            await super()._aend_early(context, last)
        finally:
            _closed(context)

    # -- a spent budget: the final answer, or the error --------------------------------------

    def _spent(self, kind: CallKind, refused: _Refused) -> AnyResponse:
        error, spend = refused.error, refused.spend
        dispatcher.event(
            RunBudgetSpentEvent(
                run_id=spend.run_id,
                thread_id=spend.thread_id,
                window=error.window,
                limit=error.limit,
                spend=error.spend,
                exit_behavior=self.exit_behavior,
            )
        )
        if self.exit_behavior == "error":
            raise error
        text = spent_message(error)
        marks = {SPENT_KEY: error.window}
        if kind in ("complete", "stream_complete"):
            return CompletionResponse(text=text, delta=text, additional_kwargs=marks)
        message = ChatMessage(role=MessageRole.ASSISTANT, content=text)
        return ChatResponse(message=message, delta=text, additional_kwargs=marks)

    def _call(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], _ResponseT],
    ) -> _ResponseT:
        try:
            return super()._call(kind, request, kwargs, invoke)
        except _Refused as refused:
            return self._spent(kind, refused)  # type: ignore[return-value]

    async def _acall(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], Awaitable[_ResponseT]],
    ) -> _ResponseT:
        try:
            return await super()._acall(kind, request, kwargs, invoke)
        except _Refused as refused:
            return self._spent(kind, refused)  # type: ignore[return-value]

    def _stream(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], Iterator[_ResponseT]],
    ) -> Generator[_ResponseT, None, None]:
        return self._spent_stream(kind, super()._stream(kind, request, kwargs, invoke))

    def _astream(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], Awaitable[AsyncIterator[_ResponseT]] | AsyncIterator[_ResponseT]],
    ) -> AsyncGenerator[_ResponseT, None]:
        return self._aspent_stream(kind, super()._astream(kind, request, kwargs, invoke))

    def _spent_stream(
        self, kind: CallKind, stream: Iterator[_ResponseT]
    ) -> Generator[_ResponseT, None, None]:
        # The call is admitted on the first step: a refusal is the stream's one chunk.
        try:
            first = next(stream)
        except StopIteration:
            return
        except _Refused as refused:
            yield self._spent(kind, refused)  # type: ignore[misc]
            return
        try:
            yield first
            yield from stream
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    async def _aspent_stream(
        self, kind: CallKind, stream: AsyncIterator[_ResponseT]
    ) -> AsyncGenerator[_ResponseT, None]:
        try:
            first = await anext(stream)
        except StopAsyncIteration:
            return
        except _Refused as refused:
            yield self._spent(kind, refused)  # type: ignore[misc]
            return
        try:
            yield first
            async for chunk in stream:
                yield chunk
        finally:
            await aclose_stream(stream)

    # -- tools: prepared and parsed by the LLM that gets the attempt --------------------------

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The inner LLM's tool request; deferred to the attempt's LLM with a downgrade."""
        if self.downgrade_to is None:
            return super()._prepare_chat_with_tools(
                tools,
                user_msg=user_msg,
                chat_history=chat_history,
                verbose=verbose,
                allow_parallel_tool_calls=allow_parallel_tool_calls,
                tool_required=tool_required,
                **kwargs,
            )
        return ToolRequest.deferred(
            tools,
            user_msg=user_msg,
            chat_history=chat_history,
            verbose=verbose,
            allow_parallel_tool_calls=allow_parallel_tool_calls,
            tool_required=tool_required,
            **kwargs,
        )

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[BaseTool],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        """Validated by the LLM that answered (a spent budget's answer as it is)."""
        if SPENT_KEY in response.additional_kwargs:
            return response
        llm, own = self._answered_by(response)
        if not isinstance(llm, FunctionCallingLLM):
            return response
        kwargs = {key: value for key, value in kwargs.items() if key != TOOL_REQUEST_KEY}
        validated = llm._validate_chat_with_tools_response(
            own, tools, allow_parallel_tool_calls=allow_parallel_tool_calls, **kwargs
        )
        if llm is self.inner:
            return validated
        return _mark(validated)

    def get_tool_calls_from_response(
        self,
        response: ChatResponse,
        error_on_no_tool_call: bool = True,
        **kwargs: Any,
    ) -> list[ToolSelection]:
        """Tool calls parsed by the LLM that answered; none in a spent budget's answer."""
        if SPENT_KEY in response.additional_kwargs:
            if error_on_no_tool_call:
                raise ValueError("Expected at least one tool call, but got 0 tool calls.")
            return []
        llm, own = self._answered_by(response)
        return function_calling(
            llm, 1 if llm is not self.inner else 0
        ).get_tool_calls_from_response(own, error_on_no_tool_call=error_on_no_tool_call, **kwargs)

    def _answered_by(self, response: ChatResponse) -> tuple[LLM, ChatResponse]:
        if self.downgrade_to is None or not response.additional_kwargs.get(DOWNGRADED_KEY):
            return self.inner, response
        own = {k: v for k, v in response.additional_kwargs.items() if k != DOWNGRADED_KEY}
        llm: LLM = self.downgrade_to
        return llm, response.model_copy(update={"additional_kwargs": own})


# -- helpers ------------------------------------------------------------------------------


def _downgrade_name(downgrade_to: object) -> str | None:
    if downgrade_to is None:
        return None
    if not isinstance(downgrade_to, LLM):
        raise TypeError(
            f"downgrade_to must be a LlamaIndex LLM (the cheaper model) or None; got "
            f"{type(downgrade_to).__module__}.{type(downgrade_to).__qualname__}"
        )
    name = served_model(llm_name(downgrade_to))
    if name is None:
        raise ValueError(
            "downgrade_to must name its model (metadata.model_name), so the budget can price it"
        )
    return name


def _run_budget(
    budget: object,
    ledger: CostLedger | None,
    per: Per,
    limit: object,
    downgrade_to: str | None,
    downgrade_below: object,
) -> RunBudget:
    if isinstance(budget, RunBudget):
        given = [
            name
            for name, value, default in (
                ("ledger", ledger, None),
                ("per", per, "run"),
                ("limit", limit, None),
                ("downgrade_below", downgrade_below, None),
            )
            if value != default
        ]
        if given:
            raise TypeError(
                f"{', '.join(given)} given with a RunBudget: set them on the RunBudget, "
                "which every layer sharing it applies"
            )
        if downgrade_to != budget.downgrade_to:
            raise ValueError(
                f"downgrade_to's model {downgrade_to!r} is not the RunBudget's "
                f"downgrade_to {budget.downgrade_to!r}"
            )
        return budget
    if not isinstance(budget, CostBudget):
        raise TypeError(
            f"budget must be a CostBudget(...) or a RunBudget(...); got {type(budget).__name__}"
        )
    return RunBudget(
        budget,
        ledger,
        per=per,
        limit=limit,
        downgrade_to=downgrade_to,
        downgrade_below=downgrade_below,
    )


def _request_of(
    request: Request, kwargs: dict[str, Any], deferred: bool
) -> tuple[list[tuple[str, str]], int | None, ToolRequest | None]:
    """The prompt pairs, the call's output cap, and a deferred tool request (popped)."""
    tools = kwargs.pop(TOOL_REQUEST_KEY, None) if deferred else None
    if tools is not None and not isinstance(tools, ToolRequest):
        tools = None
    return prompt_pairs(request), output_cap(kwargs), tools


def _asked(meter: Meter) -> str | None:
    """The model a stack's attempt is priced as asked: its one model, else its primary."""
    if meter.model is not None:
        return meter.model
    return next((served.name for served in meter.may_serve if served.name), None)


def _text(value: object) -> str | None:
    """A tag's value, as the id the core checks (text, else its ``TypeError``)."""
    return value  # type: ignore[return-value]


def _closed(context: Any) -> None:
    call: _RunCall = context
    if call.close is not None:
        call.close()


def _mark(response: _ResponseT) -> _ResponseT:
    return response.model_copy(
        update={"additional_kwargs": {**response.additional_kwargs, DOWNGRADED_KEY: True}}
    )


def _marked(response: ChatResponse) -> ChatResponse:
    return _mark(response)


async def _amarked(response: Awaitable[ChatResponse]) -> ChatResponse:
    return _mark(await response)


def _marked_stream(stream: Iterator[ChatResponse]) -> Generator[ChatResponse, None, None]:
    try:
        for chunk in stream:
            yield _mark(chunk)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


async def _amarked_stream(
    opened: Awaitable[AsyncIterator[ChatResponse]],
) -> AsyncGenerator[ChatResponse, None]:
    stream = await opened
    try:
        async for chunk in stream:
            yield _mark(chunk)
    finally:
        await aclose_stream(stream)
