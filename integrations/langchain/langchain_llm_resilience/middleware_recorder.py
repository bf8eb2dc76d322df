"""Charging every chat model call of an agent run to that run: a callback recorder.

One [`RunRecorder`][] per process is registered with langchain-core's
``register_configure_hook``, so it is in every callback manager LangChain builds. It
sees every run start with its parent, so it knows (through the core's [`RunTree`][])
which agent run any model call belongs to: the agent's own model node, a summarization
middleware's call, a subagent invoked inside a tool, a tool that calls a model. Each
chat model run of a run whose budget is open ([`BudgetMiddleware`][] opens it) is
charged to that run's [`RunSpend`][], in this one place:

* ``on_chat_model_start``: the attempt begins (strict: its worst case is held; a call
  that does not fit is refused with [`BudgetExceededError`][], raised out of the call
  before the provider is asked);
* ``on_llm_end``: its ``usage_metadata`` is recorded, priced at the model that served;
* ``on_llm_error``: the hold is released, or, for a stream cut after tokens, what it
  delivered is recorded (`partial_stream_usage`).

Retries and fallbacks (by other middleware, or a [`FallbackChatModel`][]'s members,
which run inside one LangChain run) are each one chat run or inside one, so every
billed attempt is in the ledger once. A refusal is the only error the recorder lets
out; any other failure of its own is logged and the user's call goes on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk, LLMResult
from langchain_core.tracers.context import register_configure_hook

from langchain_llm_resilience._delegate import documented_output_cap, prompt_pairs
from langchain_llm_resilience.cost import _model_name, _named_model, answer_usage, consumed_usage
from llm_resilience.budget import ServingModel, served_model
from llm_resilience.errors import BudgetExceededError
from llm_resilience.layers import leaves
from llm_resilience.runs import RunAttempt, RunSpend, RunTree
from llm_resilience.served import SERVED_BY_KEY, served_member
from llm_resilience.usage import model_output_cap, output_cap

__all__ = ["RunRecorder", "model_node", "recorder"]

logger = logging.getLogger("llm_resilience.agents")

Prompt = Sequence[tuple[str, str]]


class _ModelNode:
    """What the agent's model node is calling (set by [`BudgetMiddleware`][] around its
    handler): the model object, so a strict hold covers every member that may serve."""

    __slots__ = ("model", "names")

    def __init__(self, model: BaseChatModel) -> None:
        self.model = model
        self.names = {_model_name(leaf) for leaf in leaves(model)} | {_model_name(model)}


_NODE: ContextVar[_ModelNode | None] = ContextVar("llm_resilience_model_node", default=None)


@contextmanager
def model_node(model: BaseChatModel) -> Iterator[None]:
    """Within: the agent's model node is calling ``model`` (for the recorder's holds)."""
    token = _NODE.set(_ModelNode(model))
    try:
        yield
    finally:
        _NODE.reset(token)


class _Open:
    """One chat run being charged: its attempt, prompt, start's model and chunks so far."""

    __slots__ = ("attempt", "chunks", "messages", "model", "node", "root")

    def __init__(
        self,
        attempt: RunAttempt,
        messages: list[BaseMessage],
        model: str | None,
        node: _ModelNode | None,
        root: object,
    ) -> None:
        self.attempt = attempt
        self.messages = messages
        self.model = model
        self.node = node
        self.root = root
        self.chunks: list[ChatGenerationChunk] = []

    def prompt(self) -> Prompt:
        return prompt_pairs(self.messages)

    def served(self, metadata: dict[str, Any]) -> str | None:
        """The model that served, by the answer's name, a chain's mark, or the start's."""
        named = _named_model(metadata)
        if named is not None:
            return named
        mark = metadata.get(SERVED_BY_KEY)
        if mark is not None and self.node is not None:
            member = served_member(self.node.model, mark)
            if member is not None:
                return _model_name(member)
        return self.model


class RunRecorder(BaseCallbackHandler):
    """The callback handler that charges each chat model run to its agent run.

    Registered once per process ([`recorder`][]); [`BudgetMiddleware`][] opens a run's
    spend in it (`open`) and closes it (`close`). Runs of no open agent run are only
    remembered in the tree (bounded) and charged nothing.
    """

    #: Called in the caller's thread and context (an async manager would otherwise run
    #: a sync handler in a thread pool, out of the model node's context).
    run_inline = True
    #: Only a refusal is raised: every other failure is caught inside each method.
    raise_error = True

    def __init__(self) -> None:
        #: Which run each LangChain run descends from.
        self.tree = RunTree()
        self._spends: dict[object, RunSpend] = {}
        self._open: dict[UUID, _Open] = {}
        self._lock = threading.Lock()

    # -- the agent runs ----------------------------------------------------------------

    def root(self, run_id: UUID | str | None) -> object:
        """The root LangChain run ``run_id`` descends from (itself when unknown)."""
        if run_id is None:
            return None
        found = self.tree.root(str(run_id))
        return found if found is not None else str(run_id)

    def open(self, key: object, spend: RunSpend) -> RunSpend:
        """Charge the model calls under root run ``key`` to ``spend`` (the first opened wins:
        a subagent's own budget does not take its parent's run over)."""
        with self._lock:
            return self._spends.setdefault(key, spend)

    def close(self, key: object) -> None:
        """Stop charging root run ``key``; attempts still open are released."""
        with self._lock:
            self._spends.pop(key, None)
            left = [run for run, each in self._open.items() if each.root == key]
            opened = [self._open.pop(run) for run in left]
        for each in opened:
            _guarded(each.attempt.abandon)

    def spend_of(self, run_id: UUID | str | None) -> RunSpend | None:
        """The spend open for the agent run ``run_id`` belongs to, if any."""
        return self._spends.get(self.root(run_id))

    # -- the tree ----------------------------------------------------------------------

    def _add(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        try:
            self.tree.add(str(run_id), str(parent_run_id) if parent_run_id is not None else None)
        except Exception:  # never break the user's call
            logger.warning("Could not record a run's parent", exc_info=True)

    def on_chain_start(
        self,
        serialized: Any,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._add(run_id, parent_run_id)

    def on_tool_start(
        self,
        serialized: Any,
        input_str: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._add(run_id, parent_run_id)

    def on_retriever_start(
        self,
        serialized: Any,
        query: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._add(run_id, parent_run_id)

    def on_llm_start(
        self,
        serialized: Any,
        prompts: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._add(run_id, parent_run_id)

    def _ended(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        if parent_run_id is None:  # a root ended: forget it and its descendants
            try:
                if str(run_id) in self._spends:  # the agent failed before after_agent
                    self.close(str(run_id))
                self.tree.forget(str(run_id))
            except Exception:
                logger.warning("Could not forget a finished run", exc_info=True)

    def on_chain_end(
        self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self._ended(run_id, parent_run_id)

    def on_chain_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._ended(run_id, parent_run_id)

    # -- the chat model runs -----------------------------------------------------------

    def on_chat_model_start(
        self,
        serialized: Any,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        invocation_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._add(run_id, parent_run_id)
        try:
            root = self.root(run_id)
            spend = self._spends.get(root)
            if spend is None:
                return
            started = _started(messages, metadata, invocation_params)
            node = _NODE.get()
            if node is not None and started[1] not in node.names:
                node = None  # a call inside the model node, not the node's own model
            attempt = spend.begin(
                model=started[1],
                prompt=lambda: prompt_pairs(started[0]),
                max_output_tokens=started[2],
                may_serve=_may_serve(node, started[2]),
            )
        except BudgetExceededError:
            raise  # the one error let out: the call does not run
        except Exception:
            logger.warning("Could not begin charging a model call", exc_info=True)
            return
        with self._lock:
            self._open[run_id] = _Open(attempt, started[0], started[1], node, root)

    def on_llm_new_token(
        self, token: Any, *, chunk: Any = None, run_id: UUID, **kwargs: Any
    ) -> None:
        opened = self._open.get(run_id)
        if opened is not None and isinstance(chunk, ChatGenerationChunk):
            opened.chunks.append(chunk)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            opened = self._open.pop(run_id, None)
        if opened is None:
            return
        try:
            generation: Any = response.generations[0][0]
            message = generation.message
            usage = answer_usage(message, opened.prompt, prompted=bool(opened.messages))
            opened.attempt.finish(usage, model=opened.served(message.response_metadata))
        except Exception:
            logger.warning("Could not record a model call's spend", exc_info=True)
            _guarded(opened.attempt.abandon)

    def on_llm_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        response: LLMResult | None = None,
        **kwargs: Any,
    ) -> None:
        with self._lock:
            opened = self._open.pop(run_id, None)
        if opened is None:
            return
        try:
            chunks = opened.chunks or _partial(response)
            if not chunks:
                opened.attempt.abandon()
                return
            usage, metadata = consumed_usage(chunks, opened.prompt)
            opened.attempt.end_early(usage, model=opened.served(metadata))
        except Exception:
            logger.warning("Could not record a failed model call", exc_info=True)
            _guarded(opened.attempt.abandon)


def _guarded(call: Callable[[], object]) -> None:
    try:
        call()
    except Exception:
        logger.warning("Could not release a model call's hold", exc_info=True)


def _started(
    messages: list[list[BaseMessage]],
    metadata: dict[str, Any] | None,
    params: dict[str, Any] | None,
) -> tuple[list[BaseMessage], str | None, int | None]:
    """A chat run's prompt, model name and output cap, from what its start reports."""
    metadata = metadata or {}
    params = params or {}
    prompt = messages[0] if messages else []
    name = served_model(
        metadata.get("ls_model_name"), params.get("model"), params.get("model_name")
    )
    cap = output_cap(params)
    if cap is None:
        cap = output_cap({"max_tokens": metadata.get("ls_max_tokens")})
    return prompt, name, cap


def _may_serve(node: _ModelNode | None, cap: int | None) -> tuple[ServingModel, ...]:
    """Every model of the node's stack that may serve, each with its own output cap."""
    if node is None:
        return ()
    return tuple(
        ServingModel(_model_name(leaf), model_output_cap(leaf, documented_output_cap(leaf)))
        for leaf in leaves(node.model)
    )


def _partial(response: LLMResult | None) -> list[ChatGenerationChunk]:
    """The chunks a failed stream's error response carries (langchain-core's ``stream``)."""
    if response is None or not response.generations:
        return []
    return [g for g in response.generations[0] if isinstance(g, ChatGenerationChunk)]


_RECORDER: RunRecorder | None = None
_RECORDER_LOCK = threading.Lock()


def recorder() -> RunRecorder:
    """The process's one recorder, registered with LangChain on first use."""
    global _RECORDER
    if _RECORDER is None:
        with _RECORDER_LOCK:
            if _RECORDER is None:
                made = RunRecorder()
                # The hook adds the variable's value to every callback manager; its
                # default is the recorder, so nobody has to set it.
                variable: ContextVar[RunRecorder | None] = ContextVar(
                    "llm_resilience_run_recorder", default=made
                )
                register_configure_hook(variable, inheritable=True)
                _RECORDER = made
    return _RECORDER
