"""Spend budgets for LangChain: chat and embedding wrappers over the core budget gate."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.outputs.chat_generation import merge_chat_generation_chunks
from pydantic import Field, PrivateAttr, field_serializer

from langchain_llm_resilience._delegate import (
    DelegatingChatModel,
    merged_usage_and_metadata,
    private_state,
    signature_precomputed,
)
from llm_resilience import checks
from llm_resilience.budget import (
    BudgetGate,
    BudgetTicket,
    CostBudget,
    ServingModel,
    dearest_model,
    served_model,
)
from llm_resilience.fallback import (
    ahedge_inbox_stream,
    bind_hedge_ticket,
    hedge_inbox,
    hedge_inbox_stream,
    hedges_below,
)
from llm_resilience.layers import find_layer, leaves
from llm_resilience.usage import (
    TokenDetails,
    Usage,
    chat_usage,
    embedding_usage,
    partial_stream_usage,
    reported_usage,
)

__all__ = ["SCOPE_KWARG", "CostTrackedChatModel", "CostTrackedEmbeddings"]

#: Per-call keyword naming the budget scope (a tenant, a user, a hash of a key), e.g.
#: ``model.invoke(prompt, budget_scope="tenant-1")``. It never reaches the provider.
SCOPE_KWARG = "budget_scope"


def _build_gate(budget: object, ledger: object) -> BudgetGate:
    if not isinstance(budget, CostBudget):
        raise TypeError(f"budget must be a CostBudget(...); got {type(budget).__name__}")
    return BudgetGate(budget, ledger)  # type: ignore[arg-type]


def _plain(value: object) -> object:
    """``value`` as JSON-ready data for pydantic's dump: money as its exact text, a
    read-only mapping as a dict, a budget or price dataclass as a dict of its public
    fields."""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, Mapping):
        return {key: _plain(each) for key, each in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            each.name: _plain(getattr(value, each.name))
            for each in dataclasses.fields(value)
            if not each.name.startswith("_")
        }
    return value


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


#: A stand-in prompt of one message: whether a provider's counts are a report depends
#: only on whether the prompt is empty (:func:`~llm_resilience.usage.reported_usage`).
_SOME_PROMPT = (("", ""),)


def _token_count(metadata: Any) -> dict[str, int] | None:
    """langchain-cohere's report of a stream: its last chunk has no ``usage_metadata``,
    only Cohere's billed counts as ``token_count`` (whole floats) in its generation info,
    which the stream's merged ``response_metadata`` keeps. None when absent."""
    found = metadata.get("token_count") if isinstance(metadata, dict) else None
    if not isinstance(found, dict):
        return None
    counts: dict[str, int] = {}
    for key in ("input_tokens", "output_tokens"):
        value = found.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if not float(value).is_integer() or value < 0:
            return None
        counts[key] = int(value)
    return counts


def _reported(messages: list[BaseMessage], usage: Any) -> Usage | None:
    """The provider's usage (an ``usage_metadata`` or None) if it is a report, else None."""
    counts = usage or {}
    return reported_usage(
        counts.get("input_tokens"),
        counts.get("output_tokens"),
        prompt=_SOME_PROMPT if messages else (),
        details=token_details(counts),
    )


#: Where a ``usage_metadata`` puts a count, plain first: langchain-openai prefixes the
#: keys with the service tier (``flex_cache_read``) on flex and priority requests.
_TIERS = ("", "flex_", "priority_")


def token_details(usage: Any) -> TokenDetails:
    """The cache and reasoning counts of a ``usage_metadata`` (None where not reported).

    LangChain's ``input_tokens`` already counts cache reads and writes for every provider
    (langchain-anthropic adds Anthropic's back in), as the core's ``Usage`` does, so they
    are read as they are: ``input_token_details.cache_read`` and ``cache_creation``, or,
    when Anthropic splits its writes by lifetime, ``ephemeral_5m_input_tokens`` plus
    ``ephemeral_1h_input_tokens`` (langchain-anthropic then reports ``cache_creation`` as
    0 so the writes are not counted twice); ``output_token_details.reasoning``.

    >>> token_details({"input_tokens": 120, "output_tokens": 9, "input_token_details":
    ...     {"cache_read": 100, "cache_creation": 0, "ephemeral_5m_input_tokens": 12,
    ...      "ephemeral_1h_input_tokens": 8}})
    TokenDetails(cache_read_tokens=100, cache_write_tokens=20, cache_write_1h_tokens=8, \
reasoning_tokens=None)
    """
    if not isinstance(usage, dict):
        return TokenDetails()
    into = usage.get("input_token_details")
    out = usage.get("output_token_details")
    into = into if isinstance(into, dict) else {}
    out = out if isinstance(out, dict) else {}
    five_minutes = _count(into.get("ephemeral_5m_input_tokens"))
    one_hour = _count(into.get("ephemeral_1h_input_tokens"))
    written = _first(into, "cache_creation")
    by_lifetime = (five_minutes or 0) + (one_hour or 0)
    if by_lifetime > 0:
        written = by_lifetime
    return TokenDetails(
        cache_read_tokens=_first(into, "cache_read"),
        cache_write_tokens=written,
        cache_write_1h_tokens=one_hour if by_lifetime > 0 else None,
        reasoning_tokens=_first(out, "reasoning"),
    )


def _first(details: dict[str, Any], key: str) -> int | None:
    for tier in _TIERS:
        count = _count(details.get(f"{tier}{key}"))
        if count is not None:
            return count
    return None


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


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
    Under a hedged ``FallbackChatModel`` (``hedge_after``) the attempt that lost is
    recorded too, as its own entry of kind ``"hedge"``, when its provider reported usage.
    In strict mode the hold covers every model below that may serve, each up to its own
    output cap (the call's ``max_tokens``, else the model's ``max_tokens`` or
    ``max_completion_tokens``, else its profile's ``max_output_tokens``).
    ``scope=`` (or ``budget_scope=`` per call) gives a tenant its own windows.
    Without ``ledger`` spend is kept in memory (a warning names ``SqlCostLedger``).
    ``model_dump()`` and ``model_dump_json()`` give the budget's prices and limits as exact
    decimal text and leave the ledger out.
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
    _hedged: bool = PrivateAttr(default=False)

    @field_serializer("budget")
    def _dump_budget(self, budget: CostBudget) -> object:
        # pydantic cannot dump the budget's read-only price map (model_dump warned,
        # model_dump_json raised): its prices and limits as exact text instead.
        return _plain(budget)

    def __init__(self, **data: Any) -> None:
        checks.scope("scope", data.get("scope"))
        gate = _build_gate(data.get("budget"), data.get("ledger"))
        if data.get("ledger") is None:
            data["ledger"] = gate.ledger
        super().__init__(**data)
        self._gate = gate
        self._stream_usage = _asks_stream_usage(self.inner)
        # Read once: pydantic's attribute probing costs ~10 µs a call on a hot path. Only a
        # lone provider names the call in advance: a chain forwards attribute reads to its
        # primary, which may not be the member that answers.
        providers = leaves(self.inner)
        self._inner_model = _model_name(providers[0]) if len(providers) == 1 else None
        self._hedged = hedges_below(self.inner)
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
        if private_state(self)["_stream_usage"]:
            call_kwargs.setdefault("stream_usage", True)
        return call_kwargs

    def _ticket_args(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> dict[str, Any]:
        scope = checks.scope(SCOPE_KWARG, kwargs.pop(SCOPE_KWARG, self.scope))
        # The call's own cap reaches every model below; each model's own is in _may_serve.
        max_tokens = _first_count(kwargs.get("max_tokens"), kwargs.get("max_completion_tokens"))
        state = private_state(self)
        return {
            "scope": scope,
            # Only a strict hold counts the prompt's tokens: the gate reads nothing else.
            "prompt": _prompt(messages) if state["_gate"].budget.strict else None,
            "max_output_tokens": max_tokens,
            "model": state["_inner_model"],
            "may_serve": state["_may_serve"],
        }

    def _begin(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> BudgetTicket:
        ticket = self.gate.begin("chat", **self._ticket_args(messages, kwargs))
        bind_hedge_ticket(ticket)
        return ticket

    async def _abegin(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> BudgetTicket:
        ticket = await self.gate.abegin("chat", **self._ticket_args(messages, kwargs))
        bind_hedge_ticket(ticket)
        return ticket

    # A hedged fallback chain below reports the attempt that lost to the inbox each call
    # opens here; its ticket records it as a "hedge" entry (see llm_resilience.fallback).
    @signature_precomputed
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if not private_state(self)["_hedged"]:
            return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)
        with hedge_inbox():
            return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

    @signature_precomputed
    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if not private_state(self)["_hedged"]:
            return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)
        with hedge_inbox():
            return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        stream = super()._stream(messages, stop=stop, run_manager=run_manager, **kwargs)
        return hedge_inbox_stream(stream) if private_state(self)["_hedged"] else stream

    def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        stream = super()._astream(messages, stop=stop, run_manager=run_manager, **kwargs)
        return ahedge_inbox_stream(stream) if private_state(self)["_hedged"] else stream

    def _usage(self, messages: list[BaseMessage], message: BaseMessage) -> tuple[Any, str | None]:
        reported = getattr(message, "usage_metadata", None)
        usage = _reported(messages, reported)
        if usage is None:  # estimated: only now are the prompt and the answer's text read
            counts = reported or {}
            usage = chat_usage(
                counts.get("input_tokens"),
                counts.get("output_tokens"),
                prompt=_prompt(messages),
                response_text=message.text,
                details=token_details(counts),
            )
        return usage, self._served(message)

    def _streamed(
        self, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> tuple[Usage, str | None] | None:
        """What a completed stream used and who served, read from its chunks as
        :meth:`_usage` reads their merged message; None when the merge is needed (no
        reported usage, so the answer's text is estimated; chunks of another kind)."""
        parts = merged_usage_and_metadata(chunks)
        if parts is None:
            return None
        reported, metadata = parts
        usage = _reported(messages, reported or _token_count(metadata))
        if usage is None:
            return None
        named = served_model(metadata.get("model_name"), metadata.get("model"))
        if named is not None:
            return usage, named
        return usage, served_model(
            self._member_named(metadata), private_state(self)["_inner_model"]
        )

    def _end_stream(
        self, context: Any, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> None:
        read = self._streamed(messages, chunks)
        if read is None:
            super()._end_stream(context, messages, chunks)
            return
        ticket: BudgetTicket = context
        ticket.finish(read[0], model=read[1])

    async def _aend_stream(
        self, context: Any, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> None:
        read = self._streamed(messages, chunks)
        if read is None:
            await super()._aend_stream(context, messages, chunks)
            return
        ticket: BudgetTicket = context
        await ticket.afinish(read[0], model=read[1])

    def _served(self, message: BaseMessage | None) -> str | None:
        """The model the answer names, else the fallback member's that answered, else
        the inner model's name."""
        named = _named_model(message)
        if named is not None:  # the usual case: no chain to look the member up in
            return named
        member = self._member_named(message.response_metadata if message is not None else {})
        return served_model(member, private_state(self)["_inner_model"])

    def _member_named(self, metadata: Any) -> str | None:
        """The name of the fallback member that answered (by the index a
        ``FallbackChatModel`` marks its answer with), if marked: for providers whose
        answers name no model (Cohere's)."""
        from langchain_llm_resilience.fallback import SERVED_BY_KEY, FallbackChatModel

        index = metadata.get(SERVED_BY_KEY) if isinstance(metadata, dict) else None
        chain = find_layer(self.inner, FallbackChatModel)
        if chain is None or isinstance(index, bool) or not isinstance(index, int):
            return None
        return _model_name(chain.models[index]) if 0 <= index < len(chain.models) else None

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
            details=token_details(reported),
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
        self.scope = checks.scope("scope", scope)
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
