"""Spend budgets for LangChain: chat and embedding wrappers over the core budget gate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from pydantic import Field, PrivateAttr

from langchain_llm_resilience._delegate import DelegatingChatModel
from llm_resilience import _checks
from llm_resilience.budget import BudgetGate, BudgetTicket, CostBudget
from llm_resilience.layers import find_layer, leaves
from llm_resilience.usage import chat_usage, embedding_usage

__all__ = ["SCOPE_KWARG", "CostTrackedChatModel", "CostTrackedEmbeddings"]

#: Per-call keyword naming the budget scope (a tenant, user or key), e.g.
#: ``model.invoke(prompt, budget_scope="tenant-1")``. It never reaches the provider.
SCOPE_KWARG = "budget_scope"


def _build_gate(budget: object, ledger: object) -> BudgetGate:
    if not isinstance(budget, CostBudget):
        raise TypeError(f"budget must be a CostBudget(...); got {type(budget).__name__}")
    return BudgetGate(budget, ledger)  # type: ignore[arg-type]


def _check_scope(scope: object, option: str) -> str | None:
    return _checks.scope(option, scope)


def _model_name(model: object) -> str | None:
    for attribute in ("model_name", "model", "model_id"):
        value = getattr(model, attribute, None)
        if isinstance(value, str) and value:
            return value
    return None


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
    cost, priced for the model that actually served (a fallback leg, not the chain).
    Usage is the provider's when it reports both counts, else estimated with
    ``cl100k_base`` and flagged ``estimated``. A stream is gated on its first iteration
    and recorded once it completes; one that fails, is cancelled or closed early records
    nothing. Streams ask OpenAI-compatible providers for their usage (``stream_usage``).
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
    _may_serve: tuple[str, ...] = PrivateAttr(default=())

    def __init__(self, **data: Any) -> None:
        _check_scope(data.get("scope"), "scope")
        gate = _build_gate(data.get("budget"), data.get("ledger"))
        if data.get("ledger") is None:
            data["ledger"] = gate.ledger
        super().__init__(**data)
        self._gate = gate
        self._stream_usage = _asks_stream_usage(self.inner)
        # Strict holds are priced at the dearest model that may answer (any fallback leg).
        names = (_model_name(leaf) for leaf in leaves(self.inner))
        self._may_serve = tuple(name for name in names if name)

    @property
    def _llm_type(self) -> str:
        return "cost-tracked-chat-model"

    @property
    def gate(self) -> BudgetGate:
        """The budget gate this wrapper consults and records through."""
        return self._gate

    def _stream_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        call_kwargs = super()._stream_kwargs(kwargs)
        if self._stream_usage:
            call_kwargs.setdefault("stream_usage", True)
        return call_kwargs

    def _ticket_args(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> dict[str, Any]:
        scope = _check_scope(kwargs.pop(SCOPE_KWARG, self.scope), SCOPE_KWARG)
        max_tokens = kwargs.get("max_tokens", getattr(self.inner, "max_tokens", None))
        estimated = 0
        if self.budget.strict:
            from llm_resilience.tokens import count_message_tokens

            estimated = count_message_tokens(_prompt(messages))
        return {
            "scope": scope,
            "estimated_input_tokens": estimated,
            "max_output_tokens": max_tokens if isinstance(max_tokens, int) else None,
            "model": _model_name(self.inner),
            "may_serve": self._may_serve,
        }

    def _begin(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> BudgetTicket:
        return self._gate.begin("chat", **self._ticket_args(messages, kwargs))

    async def _abegin(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> BudgetTicket:
        return await self._gate.abegin("chat", **self._ticket_args(messages, kwargs))

    def _usage(self, messages: list[BaseMessage], message: BaseMessage) -> tuple[Any, str | None]:
        reported = getattr(message, "usage_metadata", None) or {}
        usage = chat_usage(
            reported.get("input_tokens"),
            reported.get("output_tokens"),
            prompt=_prompt(messages),
            response_text=message.text,
        )
        served = message.response_metadata.get("model_name") or message.response_metadata.get(
            "model"
        )
        return usage, served if isinstance(served, str) and served else _model_name(self.inner)

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
        self.scope = _check_scope(scope, "scope")
        #: The budget gate this wrapper consults and records through.
        self.gate = _build_gate(budget, ledger)
        self._model = _model_name(inner)

    def find_layer(self, cls: type[Any]) -> Any:
        """The first layer of type ``cls`` in the stack below (itself included), or None."""
        return find_layer(self, cls)

    def _ticket_args(self, texts: Sequence[str]) -> dict[str, Any]:
        estimated = embedding_usage(texts).input_tokens if self.gate.budget.strict else 0
        return {"scope": self.scope, "estimated_input_tokens": estimated, "model": self._model}

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
