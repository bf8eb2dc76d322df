"""A spend budget per agent run, thread or tenant: LangChain v1 agent middleware.

[`BudgetMiddleware`][] translates the core's [`RunBudget`][llm_resilience.runs.RunBudget]
into ``create_agent``'s hooks: ``before_agent`` opens the run's
[`RunSpend`][llm_resilience.runs.RunSpend], ``before_model`` ends the run (or raises) once
its money is spent, ``wrap_model_call`` downgrades to the cheaper model and shows what
is left, and the process's [`RunRecorder`][] charges every chat model call of the run,
the model node's and the side calls alike, in one place.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any, Literal

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ModelRequest,
    ModelResponse,
    hook_config,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, SystemMessage
from langgraph.config import get_config
from langgraph.errors import GraphBubbleUp
from langgraph.runtime import Runtime

from langchain_llm_resilience._delegate import documented_output_cap, prompt_pairs
from langchain_llm_resilience.cost import _model_name
from langchain_llm_resilience.middleware_recorder import model_node, recorder
from llm_resilience import checks
from llm_resilience.budget import CostBudget
from llm_resilience.errors import BudgetExceededError
from llm_resilience.runs import Per, RunBudget, RunSpend
from llm_resilience.runs.ending import spent_message
from llm_resilience.usage import model_output_cap, output_cap

__all__ = ["DOWNGRADE_EVENT", "BudgetMiddleware"]

#: The ``"type"`` of the event a downgrade writes to ``runtime.stream_writer``
#: (``stream_mode="custom"``).
DOWNGRADE_EVENT = "llm_resilience.downgrade"

ExitBehavior = Literal["end", "error"]
_EXITS = ("end", "error")

Scope = str | Callable[[Runtime[Any]], object] | None


class BudgetMiddleware(checks.KnownKeywords, AgentMiddleware[AgentState[Any], Any, Any]):
    """Stop an agent run, or a conversation thread, at its spend limit.

    ```python
    agent = create_agent(
        ChatOpenAI(model="gpt-4o"),
        tools=[...],
        middleware=[
            SummarizationMiddleware(...),
            BudgetMiddleware(CostBudget(2.5, 10, monthly_limit=500, strict=True),
                             SqlCostLedger("sqlite:///spend.db"), limit="0.50",
                             downgrade_to=ChatOpenAI(model="gpt-4o-mini"),
                             downgrade_below="0.10"),
        ],
    )
    ```

    ``limit`` (a ``Decimal``-able amount, None: the budget's windows only) is what one run
    (``per="run"``) or one thread over all its runs (``per="thread"``, the thread id from
    ``config={"configurable": {"thread_id": ...}}``; its total is read back from the
    ledger, so it survives a checkpointer and a restart) may spend; the budget's day and
    month limits apply as well, for ``scope``: None, a tenant name, or a function given the
    ``Runtime`` (read the tenant from ``runtime.context``).

    Every chat model call of the run is charged to it once: the model node's attempts
    (retries and fallbacks by other middleware, a [`FallbackChatModel`][]'s members), and
    the calls made outside it (a summarization middleware's, a subagent's inside a tool, a
    tool's own), by the process's callback recorder keyed by the run. In strict mode
    (``CostBudget(strict=True)``) each attempt's worst case is held before it is sent, so
    the run never spends past ``limit``; otherwise it is refused once ``limit`` is reached
    (the calls already in flight may pass it).

    When the run's money is spent, ``exit_behavior="end"`` (default) ends the agent with
    a final ``AIMessage`` saying so; ``"error"`` raises [`BudgetExceededError`][]. A side
    call the budget refuses raises where it is made (the summarization step, the tool).
    ``downgrade_to`` (a cheaper chat model) is used instead of the agent's model when what
    is left is under ``downgrade_below``, or, strict, when the next call's worst case does
    not fit; the switch writes a ``{"type": "llm_resilience.downgrade", ...}`` event (exact
    money as text) to ``runtime.stream_writer``. ``show_remaining=True`` tells the model
    what is left in one system line. Put it last in ``middleware=[...]`` (innermost), so
    the model it downgrades is the one each attempt sends.

    Raises:
        TypeError: an unknown keyword, a budget that is not a ``CostBudget``, a
            ``downgrade_to`` that is not a chat model.
        ValueError: a bad ``per``, ``exit_behavior``, ``limit`` or ``scope``.
    """

    def __init__(
        self,
        budget: CostBudget,
        ledger: Any = None,
        *,
        per: Per = "run",
        limit: object = None,
        scope: Scope = None,
        exit_behavior: ExitBehavior = "end",
        downgrade_to: BaseChatModel | None = None,
        downgrade_below: object = None,
        show_remaining: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__()
        cheaper = None
        if downgrade_to is not None:
            if not isinstance(downgrade_to, BaseChatModel):
                kind = type(downgrade_to).__name__
                raise TypeError(f"downgrade_to must be a LangChain chat model, got {kind}")
            cheaper = _model_name(downgrade_to)
            if cheaper is None:
                raise TypeError("downgrade_to names no model (model_name, model or model_id)")
        if downgrade_below is not None and downgrade_to is None:
            raise ValueError("downgrade_below needs downgrade_to (the cheaper chat model)")
        if exit_behavior not in _EXITS:
            raise ValueError(f"exit_behavior must be 'end' or 'error', got {exit_behavior!r}")
        if not isinstance(show_remaining, bool):
            raise TypeError(f"show_remaining must be True or False, got {show_remaining!r}")
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"name must be non-empty text or None, got {name!r}")
        #: The core's run budget: limits, ledger, each run's spend.
        self.runs = RunBudget(
            budget,
            ledger,
            per=per,
            limit=limit,
            downgrade_to=cheaper,
            downgrade_below=downgrade_below,
        )
        self._scope: Scope = scope if callable(scope) else checks.scope("scope", scope)
        #: ``"end"`` or ``"error"``.
        self.exit_behavior: ExitBehavior = exit_behavior
        #: The cheaper chat model, or None.
        self.downgrade_to = downgrade_to
        #: Whether the model is told what is left.
        self.show_remaining = show_remaining
        self._name = name
        self._recorder = recorder()

    @property
    def name(self) -> str:
        """The middleware's name in the agent's graph (``"BudgetMiddleware"`` by default)."""
        return self._name or type(self).__name__

    def __repr__(self) -> str:
        return f"BudgetMiddleware(runs={self.runs!r}, exit_behavior={self.exit_behavior!r})"

    # -- which run ---------------------------------------------------------------------

    def _run(self, runtime: Runtime[Any]) -> tuple[object, str, str | None, str | None]:
        """The run's recorder key (its root LangChain run), run id, thread id and scope."""
        info = runtime.execution_info
        key = self._recorder.root(_node_run())
        run_id = info.run_id if info is not None and info.run_id else None
        if key is None:
            key = run_id
        if key is None:
            raise RuntimeError("BudgetMiddleware runs only inside a LangGraph agent's nodes")
        thread = info.thread_id if info is not None else None
        scope = self._scope(runtime) if callable(self._scope) else self._scope
        return key, run_id or str(key), thread, checks.scope("scope", scope)

    def before_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        key, run_id, thread, scope = self._run(runtime)
        self._recorder.open(key, self.runs.open(run_id, thread_id=thread, scope=scope))
        return None

    async def abefore_agent(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        key, run_id, thread, scope = self._run(runtime)
        self._recorder.open(key, await self.runs.aopen(run_id, thread_id=thread, scope=scope))
        return None

    def after_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        key, run_id, _, _ = self._run(runtime)
        self._recorder.close(key)
        self.runs.close(run_id)
        return None

    async def aafter_agent(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return self.after_agent(state, runtime)

    def _spend(self, runtime: Runtime[Any]) -> RunSpend | None:
        _, run_id, _, _ = self._run(runtime)
        return self.runs.get(run_id)

    # -- the run's end -----------------------------------------------------------------

    def _exit(self, spend: RunSpend) -> dict[str, Any] | None:
        if not spend.exhausted():
            return None
        error = spend.account.refusal()
        if self.exit_behavior == "error":
            raise error
        return {"jump_to": "end", "messages": [_spent_message(error)]}

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        spend = self._spend(runtime)
        return None if spend is None else self._exit(spend)

    @hook_config(can_jump_to=["end"])
    async def abefore_model(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return self.before_model(state, runtime)

    # -- the model call ----------------------------------------------------------------

    def _prepared(
        self, spend: RunSpend, request: ModelRequest[Any], window: Decimal | None
    ) -> ModelRequest[Any]:
        """``request`` downgraded when the budget says so, told what is left on request."""
        model = request.model
        if self.downgrade_to is not None:
            choice = spend.choose(
                _model_name(model),
                prompt=lambda: _prompt(request),
                max_output_tokens=_cap(request),
                window_remaining=window,
            )
            if choice.downgraded:
                request = request.override(model=self.downgrade_to)
                request.runtime.stream_writer(choice.payload())
        if self.show_remaining:
            left = _least(spend.remaining(), window)
            if left is not None:
                request = request.override(system_message=_with_line(request, left))
        return request

    def _window(self) -> bool:
        """Whether a call needs the budget's window read (a downgrade or the system line)."""
        return self.downgrade_to is not None or self.show_remaining

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage:
        spend = self._spend(request.runtime)
        if spend is None:
            return handler(request)
        try:
            window = spend.window_remaining() if self._window() else None
            request = self._prepared(spend, request, window)
            with model_node(request.model):
                return handler(request)
        except GraphBubbleUp:
            raise
        except BudgetExceededError as error:
            if self.exit_behavior == "error":
                raise
            return _spent_message(error)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage:
        spend = self._spend(request.runtime)
        if spend is None:
            return await handler(request)
        try:
            window = await spend.awindow_remaining() if self._window() else None
            request = self._prepared(spend, request, window)
            with model_node(request.model):
                return await handler(request)
        except GraphBubbleUp:
            raise
        except BudgetExceededError as error:
            if self.exit_behavior == "error":
                raise
            return _spent_message(error)


def _node_run() -> str | None:
    """The LangChain run of the graph node running now (its callbacks' parent)."""
    try:
        config = get_config()
    except RuntimeError:
        return None
    parent = getattr(config.get("callbacks"), "parent_run_id", None)
    return None if parent is None else str(parent)


def _spent_message(error: BudgetExceededError) -> AIMessage:
    """The run's final message: no tool calls, so the agent's loop ends here."""
    return AIMessage(
        content=spent_message(error),
        response_metadata={"llm_resilience": "budget_spent", "window": error.window},
    )


def _prompt(request: ModelRequest[Any]) -> list[tuple[str, str]]:
    system = [request.system_message] if request.system_message is not None else []
    return prompt_pairs([*system, *request.messages])


def _cap(request: ModelRequest[Any]) -> int | None:
    """The call's output cap: its settings', else the model's own (or documented)."""
    cap = output_cap(request.model_settings)
    if cap is None:
        cap = model_output_cap(request.model, documented_output_cap(request.model))
    return cap


def _least(*amounts: Decimal | None) -> Decimal | None:
    present = [amount for amount in amounts if amount is not None]
    return min(present) if present else None


def _with_line(request: ModelRequest[Any], left: Decimal) -> SystemMessage:
    """The request's system message with one line saying what the run may still spend."""
    line = f"Budget left for this run: {left}."
    system = request.system_message
    if system is None:
        return SystemMessage(content=line)
    if isinstance(system.content, str):
        content: Any = f"{system.content}\n\n{line}" if system.content else line
    else:
        content = [*system.content, {"type": "text", "text": line}]
    return SystemMessage(content=content)
