"""``FallbackChatModel``: LangChain's face of the core fallback chain.

Translation only: every rule (order, what is transient, timeouts, restarts, logging,
cooldown) is [`llm_resilience.fallback.FallbackChain`][]'s. This module turns a
LangChain call into attempts on the member models and the results back into LangChain
types.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any, ClassVar, TypeVar

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.model_profile import ModelProfile
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import add_usage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableLambda,
    RunnableMap,
    RunnablePassthrough,
)
from langchain_core.utils._merge import merge_dicts
from pydantic import BaseModel as PydanticModel
from pydantic import ConfigDict, Field, PrivateAttr

from langchain_llm_resilience._delegate import (
    TRACING_ONLY_KWARGS,
    ChatModelKeywords,
    agenerate_inner,
    as_chunk,
    generate_inner,
    invocation_params,
    private_state,
    signature_precomputed,
    split_structured,
    streams,
    structured_tracing,
    unbind,
    without_tracing,
)
from langchain_llm_resilience._restart import (
    SINK_KWARG,
    STREAM_RESTART_EVENT,
    RestartSink,
    arestart_hook,
    restart_hook,
)
from langchain_llm_resilience.cost import billed_counts
from llm_resilience.budget import served_model
from llm_resilience.fallback import (
    Cooldown,
    FallbackChain,
    LoserUsage,
    MemberHealth,
    MemberProfile,
    RequestNeeds,
    member_profile,
    merge_capabilities,
    read_from_primary,
)
from llm_resilience.layers import Probeable
from llm_resilience.redact import redacted_fields
from llm_resilience.retry import RetryPolicy
from llm_resilience.retry_budget import RetryBudget
from llm_resilience.served import SERVED_BY_KEY, served_mark, served_path
from llm_resilience.usage import Usage, reported_usage

__all__ = ["SERVED_BY_KEY", "STREAM_RESTART_EVENT", "FallbackChatModel"]

ModelT = TypeVar("ModelT", bound=PydanticModel)


class FallbackChatModel(BaseChatModel, Probeable, ChatModelKeywords):
    """A chat model that tries ``models`` in order, moving on when one fails transiently.

    Examples:
        >>> from langchain_openai import ChatOpenAI
        >>> from langchain_anthropic import ChatAnthropic
        >>> model = FallbackChatModel(
        ...     models=[ChatOpenAI(model="gpt-4o", max_retries=0),
        ...             ChatAnthropic(model="claude-sonnet-4-5", max_retries=0)],
        ...     per_client_timeout=30,
        ... )  # doctest: +SKIP

    A 429, a 503, a dropped connection or a timeout on one model sends the same request
    to the next one at once; any other error propagates. Three time limits (seconds or
    ``timedelta``, read back as seconds as float; each default None = off) count only
    time spent waiting on a member, never time your code holds a chunk:
    ``per_client_timeout`` bounds each attempt's
    waits together; ``first_token_timeout`` bounds the wait for a stream's first content
    (and an ``invoke``'s whole response); ``idle_timeout`` bounds each silence once a
    stream's content has started, so a stalled stream restarts on the next model.
    One call is one LLM run in callbacks and traces; its
    ``usage_metadata`` and ``response_metadata["model_name"]`` are those of the model
    that served, and ``response_metadata["fallback_served_by"]`` is its index path
    (`SERVED_BY_KEY`: ``[1]``, or ``[1, 0]`` through a
    chain of chains). A member's
    own ``rate_limiter`` and cache apply to its attempt. A stream that restarts on the
    next model sends the custom callback event `STREAM_RESTART_EVENT`; with
    ``mid_stream="raise"`` a stream that fails after it delivered content raises
    [`StreamInterruptedError`][llm_resilience.StreamInterruptedError] (its ``delivered_text`` is the
    text streamed so far) instead, so a plain ``"".join(...)`` consumer never reads a
    broken prefix followed by a second answer. With ``mid_stream="continue"`` the next
    member, when it takes an assistant prefill (a ``ChatAnthropic``, or one declared
    ``MemberProfile(assistant_prefill=True)``), is sent the text delivered as a last
    ``AIMessage`` and streams only the rest, so that consumer reads one answer; the
    event still fires, with ``"continued": True``.

    ``bind_tools`` and ``with_structured_output`` bind every member (each in its own
    provider's format), so a fallback keeps the tools, and share this chain's ``cooldown``
    circuit (``create_agent`` binds at every step). Attributes the chain does not have
    are read from the first member, as ``with_fallbacks`` reads them
    (``model.model_name``, ``model.temperature``); writes stay on the chain, whose
    options are fixed at construction (setting one raises pydantic's frozen-field
    ``ValidationError``, a ``ValueError``). Members should be built with
    ``max_retries=0``: a model that retries by itself delays failover by its whole retry
    schedule (a warning says so once).

    A prompt too long for a member (LangChain's ``ContextOverflowError``) goes to the
    next member whose context window is larger, and propagates when there is none; a
    request with tools, images or structured output skips the members known not to
    support them. What is known of a member comes from its model profile
    (``max_input_tokens``, ``tool_calling``, ``image_inputs``, ``structured_output``);
    ``member_profiles=[MemberProfile(context_window=128_000), None]`` declares or
    overrides it per member.

    Raises ``ValueError``/``TypeError`` naming the option for fewer than 2 models, a
    member that is not a ``BaseChatModel``, a bad time limit or ``cooldown``, or a
    keyword it does not take (naming the closest; LangChain's standard chat-model
    parameters are taken and left to the members).
    """

    resilience_layer: ClassVar[bool] = True
    """Marks our layers: an outer layer calls this one's ``_generate`` directly."""
    restarts_streams: ClassVar[bool] = True
    """Sends the restart event to a sink an outer layer's ``stream`` passes down."""

    models: list[BaseChatModel] = Field(frozen=True)
    """The members, in the order they are tried (at least 2)."""
    per_client_timeout: float | None = Field(default=None, frozen=True)
    """Upper bound on each attempt (given as seconds or a ``timedelta``, read back as
    seconds as float); None is unbounded."""
    first_token_timeout: float | None = Field(default=None, frozen=True)
    """Longest wait for a stream's first content (an ``invoke``'s whole reply), seconds as
    float; None: off."""
    idle_timeout: float | None = Field(default=None, frozen=True)
    """Longest silence between chunks once a stream's content started, seconds as float;
    None: off."""
    cooldown: Cooldown | None = Field(default=None, frozen=True)
    """Opt-in circuit breaker: skip a member for a while after repeated failures."""
    mid_stream: str = Field(default="restart", frozen=True)
    """A stream that fails after content: ``"restart"`` on the next member (with the
    event), ``"continue"`` from the delivered text on a member that takes an assistant
    prefill (``ChatAnthropic``; else restart with the event) or ``"raise"``
    ``StreamInterruptedError``."""
    classifier: Callable[[BaseException], bool] | None = Field(
        default=None, exclude=True, frozen=True
    )
    """Replaces the default transient rule, e.g. ``TransientClassifier.with_server_errors()``."""
    member_profiles: list[MemberProfile | None] | None = Field(
        default=None, exclude=True, frozen=True
    )
    """Per member, what the chain should know beyond (or instead of) its LangChain model
    profile: e.g. ``MemberProfile(context_window=128_000)``; declared fields win."""
    hedge_after: float | None = Field(default=None, frozen=True)
    """Hedged requests (default None: off): a member that has sent no content within
    this many seconds (given as a number or a ``timedelta``, read back as seconds as
    float) is joined by the next member on the same request; the first to produce content
    wins and the other is cancelled. Up to 2x requests; see ``docs/fallback.md``."""
    member_retry: RetryPolicy | None = Field(default=None, exclude=True, frozen=True)
    """Retry a member that answered 429 (``Retry-After`` within the policy's
    ``max_delay``) or a 5xx before moving on; None (the default): each member once."""
    retry_budget: RetryBudget | None = Field(default=None, exclude=True, frozen=True)
    """A ``RetryBudget`` the chain's same-member retries and hedges draw from (and its
    cap on a call's attempts); None (the default): the ``member_retry`` policy's budget."""
    member_kwargs: list[dict[str, Any]] | None = Field(default=None, exclude=True)
    """Per-member call arguments (tools, response formats) set by ``bind_tools`` and
    ``with_structured_output``; not meant to be set by hand."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    _chain: FallbackChain[BaseChatModel] = PrivateAttr()

    def __init__(self, **data: Any) -> None:
        models = data.get("models")
        _check_members(models)
        chain: FallbackChain[BaseChatModel] = FallbackChain(
            list(models),  # type: ignore[arg-type]
            per_client_timeout=data.get("per_client_timeout"),
            first_token_timeout=data.get("first_token_timeout"),
            idle_timeout=data.get("idle_timeout"),
            classifier=data.get("classifier"),
            cooldown=data.get("cooldown"),
            member_retry=data.get("member_retry"),
            hedge_after=data.get("hedge_after"),
            retry_budget=data.get("retry_budget"),
            mid_stream=data.get("mid_stream", "restart"),
            clients_option="models",
            member_profiles=data.get("member_profiles"),
            profile_of=_known_profile,
        )
        member_kwargs = data.get("member_kwargs")
        if member_kwargs is not None and len(member_kwargs) != len(chain.clients):
            raise ValueError(
                f"member_kwargs must hold one dict per model ({len(chain.clients)}); "
                f"got {len(member_kwargs)}"
            )
        # Every duration reads back as the chain's seconds as float, whatever its spelling.
        super().__init__(**{**data, **chain.durations})
        self._chain = chain

    # -- identity ------------------------------------------------------------------

    @property
    def _llm_type(self) -> str:
        return "fallback-chat-model"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "models": [
                {"type": model._llm_type, **model._identifying_params} for model in self.models
            ],
            "per_client_timeout": self.per_client_timeout,
        }

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        # repr(), str(), rich output and dumpd()'s "repr" are built from these: no
        # member's credentials.
        return redacted_fields(super().__repr_args__())

    @property
    def inner(self) -> tuple[BaseChatModel, ...]:
        """The members, as the rest of the stack calls what a layer wraps."""
        return tuple(self.models)

    def layers_below(self) -> tuple[BaseChatModel, ...]:
        """What this layer wraps directly: its members, in the order they are tried."""
        return tuple(self.models)

    def health(self) -> tuple[MemberHealth, ...]:
        """Each member's circuit (see
        [`FallbackChain.health`][llm_resilience.FallbackChain.health]), in ``models`` order."""
        chain: FallbackChain[BaseChatModel] = private_state(self)["_chain"]
        return chain.health()

    def __getattr__(self, name: str) -> Any:
        """Reads the chain cannot answer go to its first member, as ``with_fallbacks``'s
        do: ``chain.model_name``, ``chain.temperature``, a custom attribute. Private and
        dunder names never do, and writes stay on the chain."""
        try:
            return super().__getattr__(name)  # type: ignore[misc]  # pydantic's privates
        except AttributeError as missing:
            return read_from_primary(self, name, self.__dict__.get("models"), missing)

    def _resolve_model_profile(self) -> ModelProfile | None:
        profiles = [model.profile for model in self.models]
        merged = merge_capabilities(profiles, self.member_profiles, _PROFILE_KEYS)
        return ModelProfile(**merged) if merged else None  # type: ignore[typeddict-item]

    # -- calls ---------------------------------------------------------------------

    # LangChain's ``stream``/``astream`` do not hand ``_stream`` its run manager, so the
    # wrapper names the run itself and passes a sink for the restart event down through
    # the call's keyword arguments (filtered out of traced parameters below). Each returns
    # LangChain's own (lazy) stream rather than re-yielding it: a chunk then passes one
    # generator frame fewer.
    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        config, sink = RestartSink.attach(self, config)
        return super().stream(input, config, stop=stop, **{SINK_KWARG: sink}, **kwargs)

    def astream(  # type: ignore[override]  # returns LangChain's async generator as is
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        config, sink = RestartSink.attach(self, config)
        return super().astream(input, config, stop=stop, **{SINK_KWARG: sink}, **kwargs)

    def _get_invocation_params(
        self, stop: list[str] | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        kwargs.pop(SINK_KWARG, None)
        return invocation_params(self, stop, kwargs)

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        kwargs.pop(SINK_KWARG, None)
        # Traces name the primary, the model every call tries first (a per-call
        # ``model=`` override included); the member that served is in the response's
        # ``model_name`` and ``fallback_served_by``.
        return self.models[0]._get_ls_params(stop=stop, **kwargs)

    def _kwargs_for(self, index: int, kwargs: dict[str, Any]) -> dict[str, Any]:
        if not self.member_kwargs:
            if SINK_KWARG in kwargs:
                return {key: value for key, value in kwargs.items() if key != SINK_KWARG}
            return kwargs
        merged = {**self.member_kwargs[index], **kwargs}
        merged.pop(SINK_KWARG, None)
        for key in TRACING_ONLY_KWARGS:
            merged.pop(key, None)
        return merged

    def _needs(
        self, messages: list[BaseMessage], kwargs: dict[str, Any]
    ) -> list[RequestNeeds] | None:
        # Each member's own arguments say what its request carries: the same
        # with_structured_output is a response format for one provider, a tool for another.
        images = _carries_images(messages)
        if not images and not self.member_kwargs and _NEEDS_KWARGS.isdisjoint(kwargs):
            return None  # a plain request: nothing any member could lack
        return [
            _request_needs(self._kwargs_for(index, kwargs), images=images)
            for index in range(len(self.models))
        ]

    @signature_precomputed
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        def attempt(index: int, model: BaseChatModel) -> tuple[int, ChatResult]:
            member_kwargs = self._kwargs_for(index, kwargs)
            return index, generate_inner(model, messages, stop, run_manager, member_kwargs)

        needs = self._needs(messages, kwargs)
        chain: FallbackChain[BaseChatModel] = private_state(self)["_chain"]
        index, result = chain.invoke(
            attempt, needs=needs, hedge_usage=self._loser_usage(chain, messages)
        )
        return _tagged(result, index)

    @signature_precomputed
    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        async def attempt(index: int, model: BaseChatModel) -> tuple[int, ChatResult]:
            member_kwargs = self._kwargs_for(index, kwargs)
            return index, await agenerate_inner(model, messages, stop, run_manager, member_kwargs)

        needs = self._needs(messages, kwargs)
        chain: FallbackChain[BaseChatModel] = private_state(self)["_chain"]
        index, result = await chain.ainvoke(
            attempt, needs=needs, hedge_usage=self._loser_usage(chain, messages)
        )
        return _tagged(result, index)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        def attempt(
            index: int, model: BaseChatModel, prefill: str | None = None
        ) -> Iterator[ChatGenerationChunk]:
            member_kwargs = self._kwargs_for(index, kwargs)
            sent = _prefilled(messages, prefill)
            held = _HeldMetadata()
            if streams(model, member_kwargs):
                if model.rate_limiter is not None:
                    model.rate_limiter.acquire(blocking=True)
                for chunk in model._stream(
                    sent, stop=stop, run_manager=run_manager, **member_kwargs
                ):
                    # Most chunks carry no metadata: they pass without a call.
                    if chunk.message.response_metadata or chunk.generation_info:
                        chunk = held.take(chunk)
                    yield chunk
            else:
                result = generate_inner(model, sent, stop, run_manager, member_kwargs)
                yield held.take(as_chunk(result))
            yield _served_by_chunk(index, held.metadata)

        on_restart = restart_hook(kwargs, run_manager)
        kwargs.pop(SINK_KWARG, None)  # this call's own dict: no attempt copies it to drop it
        chain: FallbackChain[BaseChatModel] = private_state(self)["_chain"]
        # The chain's stream is lazy: returned, not re-yielded, so a chunk passes one
        # generator frame fewer.
        return chain.stream(
            attempt,
            is_content=_has_content,
            on_restart=on_restart,
            needs=self._needs(messages, kwargs),
            text_of=_text_of,
            continue_attempt=attempt,
            drop_text=_drop_text,
            hedge_usage=self._loser_usage(chain, messages),
        )

    def _astream(  # type: ignore[override]  # returns the chain's async generator as is
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        async def attempt(
            index: int, model: BaseChatModel, prefill: str | None = None
        ) -> AsyncIterator[ChatGenerationChunk]:
            member_kwargs = self._kwargs_for(index, kwargs)
            sent = _prefilled(messages, prefill)
            held = _HeldMetadata()
            if streams(model, member_kwargs):
                if model.rate_limiter is not None:
                    await model.rate_limiter.aacquire(blocking=True)
                async for chunk in model._astream(
                    sent, stop=stop, run_manager=run_manager, **member_kwargs
                ):
                    if chunk.message.response_metadata or chunk.generation_info:
                        chunk = held.take(chunk)
                    yield chunk
            else:
                result = await agenerate_inner(model, sent, stop, run_manager, member_kwargs)
                yield held.take(as_chunk(result))
            yield _served_by_chunk(index, held.metadata)

        on_restart = arestart_hook(kwargs, run_manager)
        kwargs.pop(SINK_KWARG, None)
        chain: FallbackChain[BaseChatModel] = private_state(self)["_chain"]
        return chain.astream(
            attempt,
            is_content=_has_content,
            on_restart=on_restart,
            needs=self._needs(messages, kwargs),
            text_of=_text_of,
            continue_attempt=attempt,
            drop_text=_drop_text,
            hedge_usage=self._loser_usage(chain, messages),
        )

    def _loser_usage(
        self, chain: FallbackChain[BaseChatModel], messages: list[BaseMessage]
    ) -> LoserUsage | None:
        """Reads a hedged attempt that lost: the usage its provider reported, if any
        (None when the chain does not hedge: there is no loser to read)."""
        if chain.hedge_after is None:
            return None
        prompt = [(message.type, message.text) for message in messages]

        def read(index: int, outcome: Any) -> tuple[Usage, str | None] | None:
            metadata: dict[str, Any] = {}
            if isinstance(outcome, list):  # a stream's chunks; LangChain's usage adds up
                usage = None
                for chunk in outcome:
                    usage = add_usage(usage, getattr(chunk.message, "usage_metadata", None))
                named = None
            else:  # a call's (index, ChatResult)
                message: BaseMessage = outcome[1].generations[0].message
                usage = getattr(message, "usage_metadata", None)
                metadata = message.response_metadata
                named = served_model(metadata.get("model_name"))
            # With what the raw usage bills apart (Anthropic's compaction steps).
            reported_in, reported_out, details = billed_counts(usage, metadata)
            reported = reported_usage(reported_in, reported_out, prompt=prompt, details=details)
            if reported is None:
                return None
            member = self.models[index]
            fallback_name = (getattr(member, name, None) for name in ("model_name", "model"))
            return reported, served_model(named, *fallback_name)

        return read

    # -- tools and structured output -------------------------------------------------

    def _rebound(
        self, models: list[BaseChatModel], member_kwargs: list[dict[str, Any]]
    ) -> FallbackChatModel:
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        fields["models"] = models
        fields["member_kwargs"] = member_kwargs
        rebound = type(self)(**fields)
        # One circuit for the chain and every binding of it: create_agent binds its tools
        # at every step, and each step must see the failures the last one met.
        chain: FallbackChain[BaseChatModel] = private_state(self)["_chain"]
        private_state(rebound)["_chain"] = chain.variant(models)
        return rebound

    def bind_tools(
        self,
        tools: Sequence[builtins.dict[str, Any] | type | Callable[..., Any] | Any],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind ``tools`` to every member, each in its own provider's format.

        Returns a binding of a new ``FallbackChatModel`` whose calls pass each member
        its own tool arguments; it shares this chain's circuit
        ([`FallbackChain.variant`][llm_resilience.FallbackChain.variant]): the chain's [`health`][]
        counts its calls too.
        """
        # Tracing-only arguments belong to the wrapper's own run, where LangChain's entry
        # points pop them into the run's options; members never see them.
        tracing = {key: kwargs.pop(key) for key in TRACING_ONLY_KWARGS if key in kwargs}
        models: list[BaseChatModel] = []
        bound: list[dict[str, Any]] = []
        for position, model in enumerate(self.models):
            binding = model.bind_tools(tools, tool_choice=tool_choice, **kwargs)
            member, member_kwargs = unbind(binding, option=f"models[{position}].bind_tools")
            models.append(member)
            bound.append(self._merged_member_kwargs(position, without_tracing(member_kwargs)))
        # A RunnableBinding, as every chat model's bind_tools returns (LangChain's standard
        # test_bind_tool_pydantic checks it); attribute access still reaches the chain.
        return self._rebound(models, bound).bind(**tracing)

    def _merged_member_kwargs(self, position: int, new: dict[str, Any]) -> dict[str, Any]:
        existing = self.member_kwargs[position] if self.member_kwargs else {}
        return {**existing, **new}

    def with_structured_output(
        self,
        schema: builtins.dict[str, Any] | type,
        *,
        include_raw: bool = False,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, builtins.dict[str, Any] | Any]:
        """Structured output through every member, parsed by the member that answered.

        ``kwargs`` (``method``, ``strict``, ...) go to each member's own
        ``with_structured_output``; the parser of the member that served parses the
        reply. Streaming yields the parsed result once the reply is complete.
        """
        models: list[BaseChatModel] = []
        bound: list[dict[str, Any]] = []
        parsers: list[Runnable[Any, Any]] = []
        for position, model in enumerate(self.models):
            structured = model.with_structured_output(schema, include_raw=False, **kwargs)
            member, member_kwargs, parser = split_structured(
                structured, option=f"models[{position}]"
            )
            models.append(member)
            bound.append(self._merged_member_kwargs(position, without_tracing(member_kwargs)))
            parsers.append(parser)
        # Tracing metadata (LangSmith's structured-output fields) describes what the caller
        # asked of the wrapper, and belongs to the wrapper's run.
        llm = self._rebound(models, bound).bind(**structured_tracing(schema, kwargs))

        def parse(message: AIMessage, config: RunnableConfig) -> Any:
            return parsers[_served_by(message)].invoke(message, config)

        async def aparse(message: AIMessage, config: RunnableConfig) -> Any:
            return await parsers[_served_by(message)].ainvoke(message, config)

        router: Runnable[Any, Any] = RunnableLambda(parse, afunc=aparse, name="fallback_parser")
        if not include_raw:
            return llm | router
        parser_assign = RunnablePassthrough.assign(
            parsed=itemgetter("raw") | router, parsing_error=lambda _: None
        )
        parser_none = RunnablePassthrough.assign(parsed=lambda _: None)
        with_fallback = parser_assign.with_fallbacks([parser_none], exception_key="parsing_error")
        return RunnableMap(raw=llm) | with_fallback


# -- helpers -------------------------------------------------------------------------


#: The LangChain classes known to take an assistant prefill: Anthropic's Messages API does
#: (LangChain profiles say nothing of it).
_PREFILL_CLASSES = (("langchain_anthropic", "ChatAnthropic"),)


#: Each ``MemberProfile`` field's key in a LangChain model profile.
_PROFILE_KEYS = {
    "context_window": "max_input_tokens",
    "tool_calling": "tool_calling",
    "image_inputs": "image_inputs",
    "structured_output": "structured_output",
}


def _known_profile(model: BaseChatModel) -> MemberProfile | None:
    """What a member's LangChain model profile says, in the core's terms."""
    profile = getattr(model, "profile", None) or {}
    facts = {field: profile.get(key) for field, key in _PROFILE_KEYS.items()}
    return member_profile(model, **facts, prefill_classes=_PREFILL_CLASSES)


#: The call arguments `_request_needs` reads: a request without any of them (and
#: without images) needs nothing a member could lack.
_NEEDS_KWARGS = frozenset(
    {"response_format", "output_config", "tools", "functions", "output_format"}
)


def _request_needs(member_kwargs: dict[str, Any], *, images: bool) -> RequestNeeds:
    """What one member's request carries, read from the arguments it would be sent."""
    response_format = member_kwargs.get("response_format")
    json_mode = isinstance(response_format, dict) and response_format.get("type") in (
        "json_object",
        "text",
    )
    output_config = member_kwargs.get("output_config")
    native = (response_format is not None and not json_mode) or (
        isinstance(output_config, dict) and output_config.get("format") is not None
    )
    return RequestNeeds(
        tool_calling=bool(member_kwargs.get("tools") or member_kwargs.get("functions")),
        image_inputs=images,
        structured_output=native or member_kwargs.get("output_format") is not None,
    )


def _carries_images(messages: list[BaseMessage]) -> bool:
    for message in messages:
        if isinstance(message.content, str):
            continue
        for block in message.content:
            if isinstance(block, dict) and block.get("type") in ("image", "image_url"):
                return True
    return False


def _check_members(models: object) -> None:
    if isinstance(models, (str, bytes)) or not isinstance(models, Sequence):
        raise TypeError(
            f"models must be a list of at least 2 LangChain chat models (BaseChatModel); "
            f"got {type(models).__name__}"
        )
    for position, model in enumerate(models):
        if not isinstance(model, BaseChatModel):
            raise TypeError(
                f"models[{position}] must be a LangChain chat model (BaseChatModel); got "
                f"{type(model).__name__}. Bind tools or structured output on the "
                f"FallbackChatModel, not on its members."
            )


def _served_by_chunk(index: int, metadata: dict[str, Any]) -> ChatGenerationChunk:
    # Rides at the end of the attempt that completed, so the merged message names the
    # member that served even when an earlier member failed mid-stream.
    message = _copied(
        _LAST_MESSAGE,
        {
            "response_metadata": {
                **metadata,
                SERVED_BY_KEY: served_mark(index, metadata.get(SERVED_BY_KEY)),
            },
            # Its own containers, never the template's.
            "additional_kwargs": {},
            "tool_calls": [],
            "invalid_tool_calls": [],
            "tool_call_chunks": [],
        },
    )
    return _copied(_LAST_CHUNK, {"message": message})


# The empty last chunk `_served_by_chunk` copies, validated once: each stream's is a copy
# with its own metadata (validating the same empty chunk again cost about 10 µs a stream,
# as much as the member's own five chunks' merge; ``docs/benchmarks.md``). A copy takes
# the values it is given as they are: its text stays the template's "".
_LAST_MESSAGE = AIMessageChunk(content="", chunk_position="last")
_LAST_CHUNK = ChatGenerationChunk(message=_LAST_MESSAGE)

# What a pydantic model instance holds: `_copied` sets each of them.
_MODEL_SLOTS = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")
assert set(PydanticModel.__slots__) == set(_MODEL_SLOTS), "pydantic's instance layout changed"
_set_slot = object.__setattr__


def _copied(template: ModelT, fields: dict[str, Any]) -> ModelT:
    """``template.model_copy(update=fields)`` for ``fields`` that are all declared fields:
    what pydantic's shallow copy does, without its generic steps (a third of the time;
    the served-by chunk is built on every stream)."""
    copied = object.__new__(type(template))
    _set_slot(copied, "__dict__", {**template.__dict__, **fields})
    _set_slot(copied, "__pydantic_fields_set__", template.__pydantic_fields_set__ | fields.keys())
    extra = template.__pydantic_extra__
    _set_slot(copied, "__pydantic_extra__", None if extra is None else dict(extra))
    private = template.__pydantic_private__
    _set_slot(copied, "__pydantic_private__", None if private is None else dict(private))
    return copied


# Metadata a chunk keeps as it passes: LangChain reads it per chunk and merges equal
# values without repeating them. ``model_provider`` is held like the rest: two members'
# providers would merge into "openaianthropic...", and a chunk without it still gets
# LangChain's generic content blocks; the merged message gets the serving member's.
_PER_CHUNK_KEYS = frozenset({"output_version"})


class _HeldMetadata:
    """One attempt's response metadata, held back until the attempt completes.

    LangChain merges a stream's chunks by concatenating their string metadata, so a
    member that named its model before failing mid-stream would leave its name glued to
    the next member's (``"claude-haiku-4-5gpt-4o-mini"``), and the ledger would price a
    model that does not exist. Held here, only the attempt that completes passes its
    metadata on, merged, on its last chunk (`_served_by_chunk`).
    """

    __slots__ = ("metadata",)

    def __init__(self) -> None:
        #: What the attempt's chunks said so far, merged as LangChain merges a stream.
        self.metadata: dict[str, Any] = {}

    def take(self, chunk: ChatGenerationChunk) -> ChatGenerationChunk:
        message = chunk.message
        if not message.response_metadata and not chunk.generation_info:
            return chunk  # nothing to hold (the attempt skips the call for most chunks)
        kept = {k: v for k, v in message.response_metadata.items() if k in _PER_CHUNK_KEYS}
        held = {
            **(chunk.generation_info or {}),
            **{k: v for k, v in message.response_metadata.items() if k not in _PER_CHUNK_KEYS},
        }
        if not held:
            return chunk
        self.metadata = merge_dicts(self.metadata, held)
        stripped = message.model_copy(update={"response_metadata": kept})
        return ChatGenerationChunk(message=stripped)


def _tagged(result: ChatResult, index: int) -> ChatResult:
    for generation in result.generations:
        metadata = generation.message.response_metadata
        mark = served_mark(index, metadata.get(SERVED_BY_KEY))
        generation.message.response_metadata = {**metadata, SERVED_BY_KEY: mark}
    return result


def _served_by(message: BaseMessage) -> int:
    path = served_path(message.response_metadata.get(SERVED_BY_KEY))
    return path[0] if path else 0


def _has_content(chunk: ChatGenerationChunk) -> bool:
    message = chunk.message
    if message.content:
        return True
    return bool(getattr(message, "tool_call_chunks", None))


def _text_of(chunk: ChatGenerationChunk) -> str:
    return chunk.message.text


def _prefilled(messages: list[BaseMessage], prefill: str | None) -> list[BaseMessage]:
    """The messages a continuing member is sent: the prefill as a last ``AIMessage``."""
    if prefill is None:
        return messages
    return [*messages, AIMessage(content=prefill)]


def _drop_text(chunk: ChatGenerationChunk, count: int) -> ChatGenerationChunk:
    """``chunk`` without the first ``count`` characters of its text (string or blocks)."""
    message = chunk.message
    content: Any = message.content
    if isinstance(content, str):
        content = content[count:]
    else:
        blocks: list[Any] = []
        for block in content:
            if count and isinstance(block, dict) and isinstance(block.get("text"), str):
                cut = min(count, len(block["text"]))
                block = {**block, "text": block["text"][cut:]}
                count -= cut
            elif count and isinstance(block, str):
                cut = min(count, len(block))
                block, count = block[cut:], count - cut
            blocks.append(block)
        content = blocks
    trimmed = message.model_copy(update={"content": content})
    return ChatGenerationChunk(message=trimmed, generation_info=chunk.generation_info)
