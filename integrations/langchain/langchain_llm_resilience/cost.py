"""Spend budgets for LangChain: chat and embedding wrappers over the core budget gate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.outputs.chat_generation import merge_chat_generation_chunks
from pydantic import Field, PrivateAttr

from langchain_llm_resilience._delegate import DelegatingChatModel, private_state
from llm_resilience import _checks
from llm_resilience.budget import (
    BudgetGate,
    BudgetTicket,
    CostBudget,
    ServingModel,
    dearest_model,
    served_model,
)
from llm_resilience.layers import find_layer, leaves
from llm_resilience.usage import Usage, chat_usage, embedding_usage, partial_stream_usage

__all__ = ["SCOPE_KWARG", "CostTrackedChatModel", "CostTrackedEmbeddings"]

#: Per-call keyword naming the budget scope (a tenant, a user, a hash of a key), e.g.
#: ``model.invoke(prompt, budget_scope="tenant-1")``. It never reaches the provider.
SCOPE_KWARG = "budget_scope"


def _build_gate(budget: object, ledger: object) -> BudgetGate:
    if not isinstance(budget, CostBudget):
        raise TypeError(f"budget must be a CostBudget(...); got {type(budget).__name__}")
    return BudgetGate(budget, ledger)  # type: ignore[arg-type]


def _model_name(model: object) -> str | None:
    """The name a LangChain model gives itself (``model_name``, ``model`` or ``model_id``)."""
    return served_model(
        *(getattr(model, name, None) for name in ("model_name", "model", "model_id"))
    )


def _named_model(message: BaseMessage | None) -> str | None:
    """The model an answer's metadata names (``model_name``, or ``model``), if any."""
    metadata = message.response_metadata if message is not None else {}
    return served_model(metadata.get("model_name"), metadata.get("model"))


def _first_count(*values: object) -> int | None:
    """The first value that is a token count (an int >= 0, not a bool), or None."""
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _output_cap(model: object) -> int | None:
    """The most output tokens ``model`` writes per call, as LangChain states it.

    Its own ``max_tokens`` (``ChatOpenAI``'s is ``max_completion_tokens`` too,
    ``ChatAnthropic`` fills it from its profile), ``max_completion_tokens`` or
    ``max_output_tokens`` (Google's), else its profile's documented
    ``max_output_tokens`` (langchain-core >= 1.1 profiles), else None.
    """
    profile = getattr(model, "profile", None)
    documented = profile.get("max_output_tokens") if isinstance(profile, dict) else None
    return _first_count(
        getattr(model, "max_tokens", None),
        getattr(model, "max_completion_tokens", None),
        getattr(model, "max_output_tokens", None),
        documented,
    )


def _asks_stream_usage(model: BaseChatModel) -> bool:
    """Whether every provider model below ``model`` accepts ``stream_usage=`` when streaming.

    ``ChatOpenAI`` pointed at a custom ``base_url`` (gateways, proxies, local servers)
    only asks for streamed usage with ``stream_usage=True``; without it such streams
    arrive with no usage and would be recorded as estimates.
    """
    providers = leaves(model)
    # The models that take it per call declare it as a field (langchain-openai's chat
    # models, langchain-anthropic's); any other model might pass it on to its provider.
    return bool(providers) and all(
        "stream_usage" in getattr(type(leaf), "model_fields", {}) for leaf in providers
    )


def _prompt(messages: list[BaseMessage]) -> list[tuple[str, str]]:
    return [(message.type, message.text) for message in messages]


class CostTrackedChatModel(DelegatingChatModel):
    """A chat model that refuses calls once a spend limit is reached, and records spend.

    >>> model = CostTrackedChatModel(
    ...     inner=ChatOpenAI(model="gpt-4o"),
    ...     budget=CostBudget(input_price_per_mtok="2.5", output_price_per_mtok=10,
    ...                       daily_limit=25),
    ...     ledger=SqlCostLedger("sqlite:///spend.db"),
    ... )  # doctest: +SKIP

    Before each call the budget's windows are checked (``BudgetExceededError`` and the
    inner model is not called); after it one ledger entry records the tokens and the
    cost, priced for the model that actually served (a fallback leg, not the chain;
    :func:`~llm_resilience.budget.served_model`). A stream's usage is its chunks'
    ``usage_metadata`` merged as LangChain defines it (chunks carry increments).
    Usage is the provider's when it reports both counts, else estimated with
    ``cl100k_base`` and flagged ``estimated``. A stream is gated on its first iteration
    and recorded once it completes. One its consumer closes early (``break``,
    ``close()``/``aclose()``, garbage collection) or cancels after chunks arrived records
    what it consumed (:func:`~llm_resilience.usage.partial_stream_usage`: the usage
    reported so far, else the prompt and the delivered text estimated); one that failed
    with an error records nothing (a failover inside a ``FallbackChatModel`` below is not
    seen here). Streams ask OpenAI-compatible providers for their usage (``stream_usage``).
    In strict mode the hold covers every model below that may serve, each up to its own
    output cap (the call's ``max_tokens``, else the model's ``max_tokens`` or
    ``max_completion_tokens``, else its profile's ``max_output_tokens``).
    ``scope=`` (or ``budget_scope=`` per call) gives a tenant its own windows.
    Without ``ledger`` spend is kept in memory (a warning names ``SqlCostLedger``).
    """

    budget: CostBudget
    """Prices (per million tokens), limits and mode."""
    ledger: Any = Field(default=None, exclude=True)
    """Where spend is recorded: a ``SqlCostLedger``, ``InMemoryCostLedger`` or your own."""
    scope: str | None = None
    """Budget scope of every call (overridable per call with ``budget_scope=``)."""

    _gate: BudgetGate = PrivateAttr()
    _stream_usage: bool = PrivateAttr(default=False)
    _may_serve: tuple[ServingModel, ...] = PrivateAttr(default=())
    _inner_model: str | None = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        _checks.scope("scope", data.get("scope"))
        gate = _build_gate(data.get("budget"), data.get("ledger"))
        if data.get("ledger") is None:
            data["ledger"] = gate.ledger
        super().__init__(**data)
        self._gate = gate
        self._stream_usage = _asks_stream_usage(self.inner)
        # Read once: pydantic's attribute probing costs ~10 µs a call on a hot path.
        self._inner_model = _model_name(self.inner)
        # Strict holds cover every model that may answer (any fallback leg) up to its cap.
        self._may_serve = tuple(
            ServingModel(_model_name(leaf), _output_cap(leaf)) for leaf in leaves(self.inner)
        )

    @property
    def _llm_type(self) -> str:
        return "cost-tracked-chat-model"

    @property
    def gate(self) -> BudgetGate:
        """The budget gate this wrapper consults and records through."""
        gate: BudgetGate = private_state(self)["_gate"]
        return gate

    def _stream_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        call_kwargs = super()._stream_kwargs(kwargs)
        if self._stream_usage:
            call_kwargs.setdefault("stream_usage", True)
        return call_kwargs

    def _ticket_args(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> dict[str, Any]:
        scope = _checks.scope(SCOPE_KWARG, kwargs.pop(SCOPE_KWARG, self.scope))
        # The call's own cap reaches every model below; each model's own is in _may_serve.
        max_tokens = _first_count(kwargs.get("max_tokens"), kwargs.get("max_completion_tokens"))
        state = private_state(self)
        return {
            "scope": scope,
            "prompt": _prompt(messages),
            "max_output_tokens": max_tokens,
            "model": state["_inner_model"],
            "may_serve": state["_may_serve"],
        }

    def _begin(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> BudgetTicket:
        return self.gate.begin("chat", **self._ticket_args(messages, kwargs))

    async def _abegin(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> BudgetTicket:
        return await self.gate.abegin("chat", **self._ticket_args(messages, kwargs))

    def _usage(self, messages: list[BaseMessage], message: BaseMessage) -> tuple[Any, str | None]:
        reported = getattr(message, "usage_metadata", None) or {}
        usage = chat_usage(
            reported.get("input_tokens"),
            reported.get("output_tokens"),
            prompt=_prompt(messages),
            response_text=message.text,
        )
        return usage, self._served(message)

    def _served(self, message: BaseMessage | None) -> str | None:
        """The model the answer names, else the inner model's name."""
        return served_model(_named_model(message), private_state(self)["_inner_model"])

    def _consumed(
        self, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> tuple[Usage | None, str | None]:
        """What a stream closed early consumed (None: nothing to record), and who served."""
        merged = merge_chat_generation_chunks(chunks)
        message = merged.message if merged is not None else None
        reported = getattr(message, "usage_metadata", None) or {}
        usage = partial_stream_usage(
            reported.get("input_tokens"),
            reported.get("output_tokens"),
            prompt=_prompt(messages),
            deltas=[chunk.message.text for chunk in chunks],
        )
        # Providers name the model in a stream's last chunks: a chain closed before them
        # has not said which member answered, so the dearest that may have is recorded.
        served = _named_model(message)
        if served is None and usage is not None:
            served = dearest_model(self.budget, usage, self._may_serve)
        return usage, served

    def _end(self, context: Any, messages: list[BaseMessage], message: BaseMessage | None) -> None:
        ticket: BudgetTicket = context
        if message is None:
            ticket.abandon()
            return
        usage, served = self._usage(messages, message)
        ticket.finish(usage, model=served)

    async def _aend(
        self, context: Any, messages: list[BaseMessage], message: BaseMessage | None
    ) -> None:
        ticket: BudgetTicket = context
        if message is None:
            await ticket.aabandon()
            return
        usage, served = self._usage(messages, message)
        await ticket.afinish(usage, model=served)

    def _end_early(
        self, context: Any, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> None:
        ticket: BudgetTicket = context
        usage, served = self._consumed(messages, chunks)
        if usage is None:
            ticket.abandon()
        else:
            ticket.finish(usage, model=served)

    async def _aend_early(
        self, context: Any, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> None:
        # Runs in the stream's ``finally``, often while its task is being cancelled: the
        # ticket's async writes are shielded, so the entry is kept even if cancelled again.
        ticket: BudgetTicket = context
        usage, served = self._consumed(messages, chunks)
        if usage is None:
            await ticket.aabandon()
        else:
            await ticket.afinish(usage, model=served)


class CostTrackedEmbeddings(Embeddings):
    """Embeddings gated by a spend budget; each call records its estimated tokens and cost.

    >>> embeddings = CostTrackedEmbeddings(
    ...     inner=OpenAIEmbeddings(model="text-embedding-3-small"),
    ...     budget=CostBudget(embedding_price_per_mtok="0.02", daily_limit=5),
    ... )  # doctest: +SKIP

    Embedding usage is always estimated over the input texts (providers rarely report
    it), priced at ``embedding_price_per_mtok`` (or the model's ``ModelPrice``).
    """

    def __init__(
        self,
        *,
        inner: Embeddings,
        budget: CostBudget,
        ledger: Any = None,
        scope: str | None = None,
    ) -> None:
        if not isinstance(inner, Embeddings):
            raise TypeError(f"inner must be a LangChain Embeddings; got {type(inner).__name__}")
        #: The wrapped embeddings model.
        self.inner = inner
        #: Budget scope of every call.
        self.scope = _checks.scope("scope", scope)
        #: The budget gate this wrapper consults and records through.
        self.gate = _build_gate(budget, ledger)
        self._model = _model_name(inner)

    def layers_below(self) -> tuple[Any, ...]:
        """What this layer wraps directly: ``(inner,)`` (the core's layer contract)."""
        return (self.inner,)

    def find_layer(self, cls: type[Any]) -> Any:
        """The first layer of type ``cls`` in the stack below (itself included), or None."""
        return find_layer(self, cls)

    def _ticket_args(self, texts: Sequence[str]) -> dict[str, Any]:
        return {"scope": self.scope, "texts": texts, "model": self._model}

    def _embed(self, texts: list[str], call: Any) -> Any:
        ticket = self.gate.begin("embedding", **self._ticket_args(texts))
        try:
            vectors = call()
        except BaseException:
            ticket.abandon()
            raise
        ticket.finish(embedding_usage(texts), model=self._model)
        return vectors

    async def _aembed(self, texts: list[str], call: Any) -> Any:
        ticket = await self.gate.abegin("embedding", **self._ticket_args(texts))
        try:
            vectors = await call()
        except BaseException:
            await ticket.aabandon()
            raise
        await ticket.afinish(embedding_usage(texts), model=self._model)
        return vectors

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        result: list[list[float]] = self._embed(texts, lambda: self.inner.embed_documents(texts))
        return result

    def embed_query(self, text: str) -> list[float]:
        result: list[float] = self._embed([text], lambda: self.inner.embed_query(text))
        return result

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        result: list[list[float]] = await self._aembed(
            texts, lambda: self.inner.aembed_documents(texts)
        )
        return result

    async def aembed_query(self, text: str) -> list[float]:
        result: list[float] = await self._aembed([text], lambda: self.inner.aembed_query(text))
        return result
