"""Spend budgets for LangChain: chat and embedding wrappers over the core budget gate."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.outputs.chat_generation import merge_chat_generation_chunks
from pydantic import Field, PrivateAttr, field_serializer

from langchain_llm_resilience._delegate import (
    DelegatingChatModel,
    documented_output_cap,
    merged_usage_and_metadata,
    private_state,
    prompt_pairs,
    signature_precomputed,
)
from llm_resilience.budget import BudgetGate, CostBudget, served_model
from llm_resilience.checks import KnownKeywords
from llm_resilience.layers import WrapsOne, leaves
from llm_resilience.metering import BUDGET_SCOPE_KWARG, Meter, MeteredCall
from llm_resilience.served import SERVED_BY_KEY
from llm_resilience.usage import (
    NO_DETAILS,
    TokenDetails,
    Usage,
    chat_usage,
    embedding_usage,
    partial_stream_usage,
    reported_usage,
    token_count,
    with_billed_apart,
    with_unreported_compaction,
)

__all__ = [
    "BUDGET_SCOPE_KWARG",
    "CostTrackedChatModel",
    "CostTrackedEmbeddings",
    "answer_usage",
    "consumed_usage",
]

Prompt = Sequence[tuple[str, str]]


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


def _named_model(metadata: dict[str, Any]) -> str | None:
    """The model an answer's metadata names (``model_name``, or ``model``), if any."""
    return served_model(metadata.get("model_name"), metadata.get("model"))


def _meter(data: dict[str, Any], surface: Literal["chat", "embedding"]) -> Meter:
    return Meter(
        data.get("budget"),
        data.get("ledger"),
        stack=data.get("inner"),
        name_of=_model_name,
        documented_cap=documented_output_cap,
        scope=data.get("scope"),
        surface=surface,
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


#: A stand-in prompt of one message: whether a provider's counts are a report depends
#: only on whether the prompt is empty (`reported_usage`).
_SOME_PROMPT = (("", ""),)


def _token_count(metadata: Any) -> dict[str, int] | None:
    """langchain-cohere's report of a stream: its last chunk has no ``usage_metadata``,
    only Cohere's billed counts as ``token_count`` (whole floats) in its generation info,
    which the stream's merged ``response_metadata`` keeps. None when absent."""
    found = metadata.get("token_count") if isinstance(metadata, dict) else None
    if not isinstance(found, dict):
        return None
    counts = {key: token_count(found.get(key), whole_float=True) for key in _COUNT_KEYS}
    return None if None in counts.values() else counts  # type: ignore[return-value]


_COUNT_KEYS = ("input_tokens", "output_tokens")


def billed_counts(usage: Any, metadata: Any) -> tuple[int | None, int | None, TokenDetails | None]:
    """The counts of a ``usage_metadata`` (or None), with what the provider's raw usage
    bills apart added (`with_billed_apart`): langchain-anthropic
    keeps that raw usage, Anthropic's compaction steps in its ``iterations`` included, in
    a call's ``response_metadata["usage"]``."""
    counts = usage or {}
    # The usual report, `token_details` gives no details for: neither details key.
    plain = type(counts) is dict and not (
        counts.get("input_token_details") or counts.get("output_token_details")
    )
    details = NO_DETAILS if plain else token_details(counts)
    raw = metadata.get("usage") if isinstance(metadata, dict) else None
    if raw is None:  # nothing billed apart: `with_billed_apart` gives the counts back
        return counts.get("input_tokens"), counts.get("output_tokens"), details
    return with_billed_apart(counts.get("input_tokens"), counts.get("output_tokens"), details, raw)


def _summaries(*contents: Any) -> list[str]:
    """The texts of the compaction blocks (Anthropic's summaries) in message contents, one
    per block: a stream's chunks carry a block's text in pieces under its ``index``."""
    found: dict[object, str] = {}
    for content in contents:
        if not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "compaction":
                text = block.get("content")
                key = block.get("index", len(found))
                found[key] = found.get(key, "") + (text if isinstance(text, str) else "")
    return list(found.values())


def _with_summaries(
    usage: Usage, prompt: Callable[[], Prompt], contents: list[Any], metadata: Any
) -> Usage:
    """``usage`` with the compaction steps it leaves out estimated (langchain-anthropic's
    stream chunks keep only the top-level counts): the core's rule. ``prompt`` gives the
    call's ``(role, text)`` pairs, read only when there is a step to estimate."""
    summaries = _summaries(*contents)
    if not summaries:
        return usage
    raw = metadata.get("usage") if isinstance(metadata, dict) else None
    return with_unreported_compaction(
        usage, prompt=prompt(), summaries=summaries, provider_usage=raw
    )


def _reported(prompted: object, usage: Any, metadata: Any = None) -> Usage | None:
    """The provider's usage (an ``usage_metadata`` or None, and the answer's
    ``response_metadata``) if it is a report, else None; ``prompted``: whether the call
    had a prompt (its messages)."""
    reported_in, reported_out, details = billed_counts(usage, metadata)
    return reported_usage(
        reported_in,
        reported_out,
        prompt=_SOME_PROMPT if prompted else (),
        details=details,
    )


def answer_usage(message: BaseMessage, prompt: Callable[[], Prompt], *, prompted: bool) -> Usage:
    """What a call whose answer is ``message`` used: its provider's report, else an
    estimate over the prompt and the answer's text (flagged ``estimated``), with the
    compaction steps a stream left out estimated. ``prompt`` gives the call's
    ``(role, text)`` pairs, read only for an estimate; ``prompted``: whether it had any."""
    reported = getattr(message, "usage_metadata", None)
    metadata = message.response_metadata
    usage = _reported(prompted, reported, metadata)
    if usage is None:  # estimated: only now are the prompt and the answer's text read
        reported_in, reported_out, details = billed_counts(reported, metadata)
        usage = chat_usage(
            reported_in, reported_out, prompt=prompt(), response_text=message.text, details=details
        )
    content = message.content
    if type(content) is str:  # text only: no compaction block (`_summaries`)
        return usage
    return _with_summaries(usage, prompt, [content], metadata)


def consumed_usage(
    chunks: Sequence[ChatGenerationChunk], prompt: Callable[[], Prompt]
) -> tuple[Usage | None, dict[str, Any]]:
    """What a stream cut after ``chunks`` consumed (`partial_stream_usage`: the usage
    reported so far, else the prompt and the delivered text estimated; None: nothing to
    record), and the merged chunks' metadata."""
    merged = merge_chat_generation_chunks(list(chunks))
    message = merged.message if merged is not None else None
    metadata = message.response_metadata if message is not None else {}
    reported_in, reported_out, details = billed_counts(
        getattr(message, "usage_metadata", None), metadata
    )
    usage = partial_stream_usage(
        reported_in,
        reported_out,
        prompt=prompt(),
        deltas=[chunk.message.text for chunk in chunks],
        details=details,
    )
    if usage is not None:
        usage = _with_summaries(usage, prompt, [c.message.content for c in chunks], metadata)
    return usage, metadata


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

    Examples:
        >>> token_details({"input_tokens": 120, "output_tokens": 9, "input_token_details":
        ...     {"cache_read": 100, "cache_creation": 0, "ephemeral_5m_input_tokens": 12,
        ...      "ephemeral_1h_input_tokens": 8}})
        TokenDetails(cache_read_tokens=100, cache_write_tokens=20, cache_write_1h_tokens=8, \
reasoning_tokens=None)
    """
    into = usage.get("input_token_details") if isinstance(usage, dict) else None
    out = usage.get("output_token_details") if isinstance(usage, dict) else None
    if not into and not out:  # the usual report: the two counts and their total
        return NO_DETAILS
    into = into if isinstance(into, dict) else {}
    out = out if isinstance(out, dict) else {}
    five_minutes = token_count(into.get("ephemeral_5m_input_tokens"))
    one_hour = token_count(into.get("ephemeral_1h_input_tokens"))
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
        count = token_count(details.get(f"{tier}{key}"))
        if count is not None:
            return count
    return None


class CostTrackedChatModel(DelegatingChatModel):
    """A chat model that refuses calls once a spend limit is reached, and records spend.

    Examples:
        >>> model = CostTrackedChatModel(
        ...     inner=ChatOpenAI(model="gpt-4o"),
        ...     budget=CostBudget(input_price_per_mtok="2.5", output_price_per_mtok=10,
        ...                       daily_limit=25),
        ...     ledger=SqlCostLedger("sqlite:///spend.db"),
        ... )  # doctest: +SKIP

    Before each call the budget's windows are checked (``BudgetExceededError`` and the
    inner model is not called); after it one ledger entry records the tokens and the
    cost, priced for the model that actually served (a fallback leg, not the chain;
    `served_model`). A stream's usage is its chunks'
    ``usage_metadata`` merged as LangChain defines it (chunks carry increments).
    Usage is the provider's when it reports both counts, else estimated with
    ``cl100k_base`` and flagged ``estimated``. A stream is gated on its first iteration
    and recorded once it completes. One its consumer closes early (``break``,
    ``close()``/``aclose()``, garbage collection) or cancels after chunks arrived records
    what it consumed (`partial_stream_usage`: the usage
    reported so far, else the prompt and the delivered text estimated); one that failed
    with an error records nothing (a failover inside a ``FallbackChatModel`` below is not
    seen here). Streams ask OpenAI-compatible providers for their usage (``stream_usage``).
    Under a hedged ``FallbackChatModel`` (``hedge_after``) the attempt that lost is
    recorded too, as its own entry of kind ``"hedge"``, when its provider reported usage.
    In strict mode the hold covers every model below that may serve, each up to its own
    output cap (`output_cap`: the call's ``max_tokens``,
    ``max_completion_tokens`` or ``max_output_tokens``, else the model's own field of
    those names, else its profile's ``max_output_tokens``).
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

    _meter: Meter = PrivateAttr()
    _stream_usage: bool = PrivateAttr(default=False)

    @field_serializer("budget")
    def _dump_budget(self, budget: CostBudget) -> object:
        # pydantic cannot dump the budget's read-only price map (model_dump warned,
        # model_dump_json raised): its prices and limits as exact text instead.
        return _plain(budget)

    def __init__(self, **data: Any) -> None:
        meter = _meter(data, "chat")
        if data.get("ledger") is None:
            data["ledger"] = meter.gate.ledger
        super().__init__(**data)
        # Read once: pydantic's attribute probing costs ~10 µs a call on a hot path.
        self._meter = meter
        self._stream_usage = _asks_stream_usage(self.inner)

    @property
    def _llm_type(self) -> str:
        return "cost-tracked-chat-model"

    @property
    def gate(self) -> BudgetGate:
        """The budget gate this wrapper consults and records through."""
        meter: Meter = private_state(self)["_meter"]
        return meter.gate

    def _stream_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        call_kwargs = super()._stream_kwargs(kwargs)
        if private_state(self)["_stream_usage"]:
            call_kwargs.setdefault("stream_usage", True)
        return call_kwargs

    def _begin(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> MeteredCall:
        meter: Meter = private_state(self)["_meter"]
        return meter.begin(kwargs, prompt=lambda: prompt_pairs(messages))

    async def _abegin(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> MeteredCall:
        meter: Meter = private_state(self)["_meter"]
        return await meter.abegin(kwargs, prompt=lambda: prompt_pairs(messages))

    # A hedged fallback chain below reports the attempt that lost to the inbox each call
    # opens here; its ticket records it as a "hedge" entry (see llm_resilience.metering).
    @signature_precomputed
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        meter: Meter = private_state(self)["_meter"]
        if not meter.hedged:  # no inbox to open (`Meter.inbox`): no context entered
            return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)
        with meter.inbox():
            return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

    @signature_precomputed
    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        meter: Meter = private_state(self)["_meter"]
        if not meter.hedged:  # no inbox to open (`Meter.inbox`): no context entered
            return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)
        with meter.inbox():
            return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        stream = super()._stream(messages, stop=stop, run_manager=run_manager, **kwargs)
        meter: Meter = private_state(self)["_meter"]
        return meter.stream(stream) if meter.hedged else stream  # `Meter.stream`'s rule

    def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        stream = super()._astream(messages, stop=stop, run_manager=run_manager, **kwargs)
        meter: Meter = private_state(self)["_meter"]
        return meter.astream(stream) if meter.hedged else stream  # `Meter.astream`'s rule

    # -- what a call used ---------------------------------------------------------------

    def _usage(self, call: MeteredCall, messages: list[BaseMessage], message: BaseMessage) -> Usage:
        return answer_usage(message, lambda: call.prompt, prompted=bool(messages))

    def _streamed(
        self, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> tuple[Usage, dict[str, Any], bool] | None:
        """What a completed stream used, its merged metadata and whether any chunk holds
        content blocks, read from its chunks as `_usage` reads their merged message; None
        when the merge is needed (no reported usage, so the answer's text is estimated;
        chunks of another kind)."""
        parts = merged_usage_and_metadata(chunks)
        if parts is None:
            return None
        reported, metadata, blocks = parts
        usage = _reported(messages, reported or _token_count(metadata), metadata)
        return None if usage is None else (usage, metadata, blocks)

    def _end_stream(
        self, context: Any, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> None:
        read = self._streamed(messages, chunks)
        if read is None:
            super()._end_stream(context, messages, chunks)
            return
        call: MeteredCall = context
        usage, metadata, blocks = read
        if blocks:  # only a list of blocks may hold a compaction block (`_summaries`)
            contents = [chunk.message.content for chunk in chunks]
            usage = _with_summaries(usage, lambda: call.prompt, contents, metadata)
        call.settle(usage, named=_named_model(metadata), mark=metadata.get(SERVED_BY_KEY))

    async def _aend_stream(
        self, context: Any, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> None:
        read = self._streamed(messages, chunks)
        if read is None:
            await super()._aend_stream(context, messages, chunks)
            return
        call: MeteredCall = context
        usage, metadata, blocks = read
        if blocks:
            contents = [chunk.message.content for chunk in chunks]
            usage = _with_summaries(usage, lambda: call.prompt, contents, metadata)
        await call.asettle(usage, named=_named_model(metadata), mark=metadata.get(SERVED_BY_KEY))

    def _consumed(self, call: MeteredCall, chunks: list[ChatGenerationChunk]) -> tuple[Any, Any]:
        """What a stream closed early consumed (None: nothing to record), and its metadata."""
        return consumed_usage(chunks, lambda: call.prompt)

    def _end(self, context: Any, messages: list[BaseMessage], message: BaseMessage | None) -> None:
        call: MeteredCall = context
        if message is None:
            call.abandon()
            return
        metadata = message.response_metadata
        usage = self._usage(call, messages, message)
        call.settle(usage, named=_named_model(metadata), mark=metadata.get(SERVED_BY_KEY))

    async def _aend(
        self, context: Any, messages: list[BaseMessage], message: BaseMessage | None
    ) -> None:
        call: MeteredCall = context
        if message is None:
            await call.aabandon()
            return
        metadata = message.response_metadata
        usage = self._usage(call, messages, message)
        await call.asettle(usage, named=_named_model(metadata), mark=metadata.get(SERVED_BY_KEY))

    def _end_early(
        self, context: Any, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> None:
        call: MeteredCall = context
        usage, metadata = self._consumed(call, chunks)
        call.end_early(usage, named=_named_model(metadata), mark=metadata.get(SERVED_BY_KEY))

    async def _aend_early(
        self, context: Any, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> None:
        call: MeteredCall = context
        usage, metadata = self._consumed(call, chunks)
        await call.aend_early(usage, named=_named_model(metadata), mark=metadata.get(SERVED_BY_KEY))


class CostTrackedEmbeddings(Embeddings, WrapsOne, KnownKeywords):
    """Embeddings gated by a spend budget; each call records its estimated tokens and cost.

    Examples:
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
        self._meter = _meter(
            {"budget": budget, "ledger": ledger, "scope": scope, "inner": inner}, "embedding"
        )
        #: Prices (per million tokens), limits and mode.
        self.budget: CostBudget = self._meter.gate.budget
        #: Where spend is recorded (the given ledger, else a new in-memory one).
        self.ledger: Any = self._meter.gate.ledger
        #: Budget scope of every call.
        self.scope = self._meter.scope
        #: The budget gate this wrapper consults and records through.
        self.gate = self._meter.gate

    def _embed(self, texts: list[str], call: Any) -> Any:
        metered = self._meter.begin(texts=texts)
        try:
            vectors = call()
        except BaseException:
            metered.abandon()
            raise
        metered.settle(embedding_usage(texts))
        return vectors

    async def _aembed(self, texts: list[str], call: Any) -> Any:
        metered = await self._meter.abegin(texts=texts)
        try:
            vectors = await call()
        except BaseException:
            await metered.aabandon()
            raise
        await metered.asettle(embedding_usage(texts))
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
