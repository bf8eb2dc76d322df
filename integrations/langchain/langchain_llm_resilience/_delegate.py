"""What every LangChain layer shares: calling an inner model's internals under one run.

A layer (fallback, rate limit, spend budget) is a ``BaseChatModel`` whose ``_generate``
and ``_stream`` call the inner model's ``_generate_with_cache``/``_stream`` with the
layer's own run manager, so a whole stack is one LLM run in callbacks and traces, while
the inner model's own cache and ``rate_limiter`` still apply (a plain call, with no cache
and no streaming asked, skips the method's probes: `_plain_call`). An inner model that is
itself one of these layers, with no cache or limiter of its own, is called at its
``_generate`` directly: LangChain's per-call machinery (cache lookup, signature check,
stream detection) already ran once for the whole stack at the outermost layer. Tools
and structured output are bound by asking the inner model to bind them and keeping the
call arguments of the binding it returns.

`DelegatingChatModel` is the base of the single-inner layers; subclasses say what
happens around a call through `_begin` and
`_end` (and their async twins), and what a stream its consumer
closed early leaves through `_end_early`.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.model_profile import ModelProfile
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata, add_usage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.outputs.chat_generation import merge_chat_generation_chunks
from langchain_core.runnables import Runnable, RunnableBinding, RunnableConfig, RunnableSequence
from langchain_core.utils._merge import merge_dicts
from pydantic import BaseModel, ConfigDict, Field

from langchain_llm_resilience._plain_call import aplain_generate, plain_generate
from langchain_llm_resilience._restart import SINK_KWARG, RestartSink
from llm_resilience.checks import KnownKeywords
from llm_resilience.layers import WrapsOne
from llm_resilience.metering import StreamOutcome
from llm_resilience.redact import redacted_fields

__all__ = ["ChatModelKeywords", "DelegatingChatModel"]

#: Binding keys that LangChain's public entry points pop for tracing before
#: ``_generate``; a model's private entry points must not receive them.
TRACING_ONLY_KWARGS = ("ls_structured_output_format", "structured_output_format")
#: LangChain's standard chat-model parameters, which code written for any chat model (and
#: langchain-tests' standard suites) passes to a model's constructor. A layer takes them
#: as LangChain's own models take an unused one: they configure the provider, not the layer.
STANDARD_PARAMS = (
    "model",
    "temperature",
    "max_tokens",
    "timeout",
    "stop",
    "streaming",
    "max_retries",
    "api_key",
    "base_url",
)

FunctionT = TypeVar("FunctionT", bound=Callable[..., Any])


class ChatModelKeywords(KnownKeywords):
    """What every chat layer's constructor takes: its own options and fields, and
    LangChain's `STANDARD_PARAMS`; anything else raises ``TypeError`` naming the
    closest (pydantic would drop it without a word)."""

    __slots__ = ()

    accepted_keywords = STANDARD_PARAMS


class _BoundCall:
    """A method bound to its instance, carrying the bound signature precomputed.

    ``inspect.signature`` of a plain bound method rebuilds the signature without
    ``self`` on every call (validating each parameter again); of this object it reads
    ``__signature__``.
    """

    __slots__ = ("__func__", "__self__", "__signature__")

    def __init__(self, function: Callable[..., Any], instance: Any, bound: inspect.Signature):
        self.__func__ = function
        self.__self__ = instance
        self.__signature__ = bound

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__(self.__self__, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<bound method {self.__func__.__qualname__} of {type(self.__self__).__name__}>"


def signature_precomputed(function: FunctionT) -> FunctionT:
    """Pin ``function``'s signature, which LangChain inspects on every call.

    ``_generate_with_cache`` asks ``inspect.signature(self._generate)`` whether it takes
    ``run_manager`` once per call: ~22 µs of parsing on a 2-core machine unpinned, ~4 µs
    with ``__signature__`` pinned on the function (the bound method's signature is still
    rebuilt each time), ~1 µs here: ``instance._generate`` is a `_BoundCall`
    holding the bound signature computed once (``docs/benchmarks.md``). The class
    attribute is a ``property`` (pydantic leaves those alone); calling through
    ``super()`` works as for a method.
    """
    signature = inspect.signature(function)
    function.__signature__ = signature  # type: ignore[attr-defined]
    bound = signature.replace(parameters=tuple(signature.parameters.values())[1:])

    def bind(instance: Any) -> _BoundCall:
        return _BoundCall(function, instance, bound)

    bind.__doc__ = function.__doc__
    bind.precomputed = function  # type: ignore[attr-defined]
    return property(bind, doc=function.__doc__)  # type: ignore[return-value]


def private_state(model: BaseModel) -> dict[str, Any]:
    r"""``model``'s private attributes, for reads on a call's hot path.

    Reading ``self._name`` on a pydantic model fails the normal lookup and then
    pydantic's ``__getattr__`` probes the attribute's descriptor (two caught
    ``AttributeError``\ s, about 2 µs); the dict read is about 0.05 µs.
    """
    state = model.__pydantic_private__
    assert state is not None  # every layer of ours has private attributes
    return state


def prompt_pairs(messages: list[BaseMessage]) -> list[tuple[str, str]]:
    """``(role, text)`` pairs of ``messages``, as the core's token rules read a prompt."""
    return [(message.type, message.text) for message in messages]


def documented_output_cap(model: object) -> object:
    """The output cap a LangChain model's profile documents (langchain-core >= 1.1)."""
    profile = getattr(model, "profile", None)
    return profile.get("max_output_tokens") if isinstance(profile, dict) else None


def without_tracing(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` minus the tracing-only keys (a copy only when there is one to drop)."""
    if any(key in kwargs for key in TRACING_ONLY_KWARGS):
        return {key: value for key, value in kwargs.items() if key not in TRACING_ONLY_KWARGS}
    return kwargs


def streams(model: BaseChatModel, kwargs: dict[str, Any]) -> bool:
    """Whether ``model`` streams natively for a call with ``kwargs``."""
    implemented = type(model)._stream is not BaseChatModel._stream
    return implemented and not model._streaming_disabled(**kwargs)


def as_chunk(result: ChatResult) -> ChatGenerationChunk:
    """A whole ``ChatResult`` as one stream chunk (for models that cannot stream)."""
    generation = result.generations[0]
    message = generation.message
    chunk = AIMessageChunk(
        content=message.content,
        additional_kwargs=message.additional_kwargs,
        response_metadata=message.response_metadata,
        id=message.id,
        tool_call_chunks=[
            {"name": call["name"], "args": json.dumps(call["args"]), "id": call["id"], "index": i}
            for i, call in enumerate(getattr(message, "tool_calls", []) or [])
        ],
        usage_metadata=getattr(message, "usage_metadata", None),
    )
    return ChatGenerationChunk(message=chunk, generation_info=generation.generation_info)


@functools.cache
def _plain_dict(cls: type[BaseChatModel]) -> bool:
    """Whether ``cls`` describes itself as ``BaseChatModel`` does (``dict``, ``asdict``
    and ``_dict_for_compat`` not overridden), so its invocation params can be built
    directly."""
    return all(
        getattr(cls, name) is getattr(BaseChatModel, name)
        for name in ("dict", "asdict", "_dict_for_compat")
    )


@functools.cache
def _marked(cls: type[Any], marker: str) -> bool:
    """Whether class ``cls`` carries the class marker ``marker`` (``resilience_layer``,
    ``restarts_streams``), asked once per class: a miss on a pydantic model class goes
    through its metaclass's ``__getattr__`` and a caught ``AttributeError`` (~1 µs)."""
    return bool(getattr(cls, marker, False))


def invocation_params(
    layer: BaseChatModel, stop: list[str] | None, kwargs: dict[str, Any]
) -> dict[str, Any]:
    """What ``BaseChatModel._get_invocation_params`` returns for ``layer``, without the
    deprecated ``dict()`` hop it makes (a warnings filter set and restored, ~3 µs a call)
    when ``layer``'s class overrides none of ``dict``, ``asdict``, ``_dict_for_compat``."""
    if not _plain_dict(type(layer)):
        return BaseChatModel._get_invocation_params(layer, stop=stop, **kwargs)
    params = dict(layer._identifying_params)
    params["_type"] = layer._llm_type
    params["stop"] = stop
    return {**params, **kwargs}


def _restarts_below(layer: DelegatingChatModel) -> bool:
    """Whether a stream through ``layer`` reaches a fallback chain (which may restart it)
    through layers of ours only: the chain then sends its restart event to the sink."""
    current: BaseChatModel = layer.inner
    while not _marked(type(current), "restarts_streams"):
        if not isinstance(current, DelegatingChatModel):
            return False
        current = current.inner
    return True


def _is_bare_layer(model: BaseChatModel) -> bool:
    """Whether ``model`` is one of our layers with no cache or ``rate_limiter`` of its own."""
    return (
        _marked(type(model), "resilience_layer")
        and (model.cache is None or model.cache is False)
        and model.rate_limiter is None
    )


@functools.cache
def _unbound(cls: type[Any], name: str) -> Callable[..., Any] | None:
    """The function behind ``cls``'s `signature_precomputed` method ``name``, or
    None when ``name`` is something else there."""
    attribute = inspect.getattr_static(cls, name)
    function: Callable[..., Any] | None = getattr(
        getattr(attribute, "fget", None), "precomputed", None
    )
    return function


def generate_inner(
    model: BaseChatModel,
    messages: list[BaseMessage],
    stop: list[str] | None,
    run_manager: CallbackManagerForLLMRun | None,
    kwargs: dict[str, Any],
) -> ChatResult:
    """Call ``model``'s internals as its own ``invoke()`` would (its cache and limiter
    included), skipping that machinery for a bare layer of ours (it ran once, outermost)."""
    if _is_bare_layer(model):
        method = _unbound(type(model), "_generate")
        if method is not None:  # skips building the bound call with its signature
            return method(model, messages, stop=stop, run_manager=run_manager, **kwargs)  # type: ignore[no-any-return]
        return model._generate(messages, stop=stop, run_manager=run_manager, **kwargs)
    return plain_generate(model, messages, stop, run_manager, kwargs)


async def agenerate_inner(
    model: BaseChatModel,
    messages: list[BaseMessage],
    stop: list[str] | None,
    run_manager: AsyncCallbackManagerForLLMRun | None,
    kwargs: dict[str, Any],
) -> ChatResult:
    """Async `generate_inner`."""
    if _is_bare_layer(model):
        method = _unbound(type(model), "_agenerate")
        if method is not None:
            return await method(model, messages, stop=stop, run_manager=run_manager, **kwargs)  # type: ignore[no-any-return]
        return await model._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)
    return await aplain_generate(model, messages, stop, run_manager, kwargs)


def stream_inner(
    model: BaseChatModel,
    messages: list[BaseMessage],
    stop: list[str] | None,
    run_manager: CallbackManagerForLLMRun | None,
    kwargs: dict[str, Any],
) -> Iterator[ChatGenerationChunk]:
    """Stream ``model``'s internals as its own ``stream()`` would (its limiter included).

    Starts at once (the limiter's permit, a model that cannot stream answering whole):
    call it where the stream is read. It returns the model's own iterator rather than
    a generator around it, so a chunk does not pass through one more frame per layer.
    """
    if streams(model, kwargs):
        if model.rate_limiter is not None:
            model.rate_limiter.acquire(blocking=True)
        return model._stream(messages, stop=stop, run_manager=run_manager, **kwargs)
    return iter((as_chunk(generate_inner(model, messages, stop, run_manager, kwargs)),))


async def astream_started(
    model: BaseChatModel,
    messages: list[BaseMessage],
    stop: list[str] | None,
    run_manager: AsyncCallbackManagerForLLMRun | None,
    kwargs: dict[str, Any],
) -> AsyncIterator[ChatGenerationChunk]:
    """Async `stream_inner`: awaited where the stream is read, it takes the limiter's
    permit (or answers whole, for a model that cannot stream) and returns the model's
    own async iterator, so a chunk does not pass through one more async generator."""
    if streams(model, kwargs):
        if model.rate_limiter is not None:
            await model.rate_limiter.aacquire(blocking=True)
        return model._astream(messages, stop=stop, run_manager=run_manager, **kwargs)
    return _one(as_chunk(await agenerate_inner(model, messages, stop, run_manager, kwargs)))


async def _one(chunk: ChatGenerationChunk) -> AsyncIterator[ChatGenerationChunk]:
    yield chunk


def unbind(runnable: Runnable[Any, Any], *, option: str) -> tuple[BaseChatModel, dict[str, Any]]:
    """The chat model under ``runnable`` (a ``bind``/``bind_tools`` result) and its kwargs."""
    layers: list[dict[str, Any]] = []
    current: Any = runnable
    while isinstance(current, RunnableBinding):
        layers.append(dict(current.kwargs))
        current = current.bound
    if not isinstance(current, BaseChatModel):
        raise TypeError(
            f"{option} returned {type(runnable).__name__}, not a binding of a chat model; "
            f"this layer cannot route its arguments"
        )
    merged: dict[str, Any] = {}
    for layer in reversed(layers):
        merged.update(layer)
    return current, merged


def split_structured(
    structured: Runnable[Any, Any], *, option: str
) -> tuple[BaseChatModel, dict[str, Any], Runnable[Any, Any]]:
    """Split ``model.with_structured_output(...)`` into model, call kwargs and parser."""
    if isinstance(structured, RunnableSequence):
        first, rest = structured.steps[0], structured.steps[1:]
        if isinstance(first, RunnableBinding | BaseChatModel) and rest:
            parser: Runnable[Any, Any] = rest[0] if len(rest) == 1 else RunnableSequence(*rest)
            model, kwargs = unbind(first, option=option)
            return model, kwargs, parser
    raise TypeError(
        f"{option}.with_structured_output returned a {type(structured).__name__} that is "
        f"not 'model binding | parser'; this layer cannot route it"
    )


def structured_tracing(schema: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The LangSmith structured-output metadata for a ``with_structured_output`` call."""
    traced = {key: kwargs[key] for key in ("method", "strict") if key in kwargs}
    return {
        TRACING_ONLY_KWARGS[0]: {
            "kwargs": traced or {"method": "function_calling"},
            "schema": schema,
        }
    }


def _merged(chunks: list[ChatGenerationChunk]) -> BaseMessage | None:
    """The whole streamed message, merged once at the end (linear, not chunk by chunk)."""
    messages = [chunk.message for chunk in chunks]
    if len(messages) > 1 and all(type(message) is AIMessageChunk for message in messages):
        # The message ``merge_chat_generation_chunks`` would hold, without building the
        # merged generation around it (a fifth less work on five chunks).
        return messages[0] + messages[1:]
    merged = merge_chat_generation_chunks(chunks)
    return merged.message if merged is not None else None


def merged_usage_and_metadata(
    chunks: list[ChatGenerationChunk],
) -> tuple[UsageMetadata | None, dict[str, Any], bool] | None:
    """The ``usage_metadata`` and ``response_metadata`` of the message `_merged`
    builds from ``chunks``, computed as LangChain's merge computes them without merging
    the rest (content, tool calls, ids), and whether any chunk's content is a list of
    blocks rather than text; None unless the chunks are two or more ``AIMessageChunk``
    objects (then merge them).

    One pass, each message's fields read from its ``__dict__``: every attribute read on a
    pydantic model goes through its ``__getattr__`` hook, and a stream's end reads three
    fields of every chunk.
    """
    if len(chunks) < 2:
        return None
    filled: list[dict[str, Any]] = []
    report: UsageMetadata | None = None
    reports = 0
    blocks = False
    for chunk in chunks:
        message = chunk.message
        if type(message) is not AIMessageChunk:
            return None
        fields = message.__dict__  # an exact AIMessageChunk: pydantic keeps every field here
        if fields["response_metadata"]:  # an empty dict adds nothing to a merge
            filled.append(fields["response_metadata"])
        if fields["usage_metadata"]:
            report = fields["usage_metadata"]
            reports += 1
        if type(fields["content"]) is not str:
            blocks = True
    metadata = merge_dicts(*filled) if filled else {}
    if reports == 1:
        # One chunk reports (the usual stream): the sum LangChain makes is its counts
        # (zeros added for the chunks without one).
        return report, metadata, blocks
    usages = [chunk.message.usage_metadata for chunk in chunks]  # type: ignore[attr-defined]
    usage: UsageMetadata | None = None
    # As ``add_ai_message_chunks`` adds them up (a None beside a report counts as zeros).
    if usages[0] or any(each is not None for each in usages[1:]):
        usage = usages[0]
        for other in usages[1:]:
            usage = add_usage(usage, other)
    return usage, metadata, blocks


class DelegatingChatModel(BaseChatModel, WrapsOne, ChatModelKeywords):
    """Base of the layers that wrap one chat model (``inner``).

    A call runs ``_begin`` (may refuse by raising), then the inner model's internals
    under this layer's run, then ``_end`` with the message (or with None when the call or
    the stream failed or the call was cancelled). A stream the consumer closed early
    (``break``, ``close()``/``aclose()``, garbage collection) or cancelled ends in
    ``_end_early`` with the chunks it delivered instead. Streams begin on their first
    iteration. Tools and structured output go to ``inner``.
    """

    resilience_layer: ClassVar[bool] = True
    """Marks our layers: an outer layer calls this one's ``_generate`` directly."""

    inner: BaseChatModel
    """The wrapped chat model."""
    inner_kwargs: dict[str, Any] | None = Field(default=None, exclude=True)
    """Call arguments bound by ``bind_tools``/``with_structured_output``; not set by hand."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    def __init__(self, **data: Any) -> None:
        inner = data.get("inner")
        if not isinstance(inner, BaseChatModel):
            # pydantic's ValidationError would not say what a layer wraps.
            raise TypeError(
                "inner must be a LangChain chat model (BaseChatModel); got "
                f"{type(inner).__module__}.{type(inner).__qualname__}"
            )
        super().__init__(**data)

    # -- what subclasses define ---------------------------------------------------------

    def _begin(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> Any:
        """Before the inner call; returns a context handed to `_end`.

        ``kwargs`` are the call arguments about to reach ``inner``: a layer may pop its
        own per-call options from them.
        """
        return None

    async def _abegin(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> Any:
        return self._begin(messages, kwargs)

    def _end(self, context: Any, messages: list[BaseMessage], message: BaseMessage | None) -> None:
        """After the call: ``message`` is the answer, or None if there is none to account."""

    def _reads_answer(self, context: Any) -> bool:
        """Whether `_end` reads a completed stream's answer; if not, the stream's
        chunks are not merged for it (a merge of five chunks costs about 25 µs)."""
        return True

    async def _aend(
        self, context: Any, messages: list[BaseMessage], message: BaseMessage | None
    ) -> None:
        self._end(context, messages, message)

    def _end_stream(
        self, context: Any, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> None:
        """After a stream read to its end: ``chunks`` it delivered.

        By default `_end` with the chunks merged into one message (when
        `_reads_answer`); a layer that reads only parts of the answer may read them
        from the chunks instead (a merge of five chunks costs about 20 µs).
        """
        if self._reads_answer(context):
            self._end(context, messages, _merged(chunks))

    async def _aend_stream(
        self, context: Any, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> None:
        if self._reads_answer(context):
            await self._aend(context, messages, _merged(chunks))

    def _end_early(
        self, context: Any, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> None:
        """After a stream the consumer closed or cancelled: ``chunks`` it had received.

        By default, as a failed call: ``_end`` with None.
        """
        self._end(context, messages, None)

    async def _aend_early(
        self, context: Any, messages: list[BaseMessage], chunks: list[ChatGenerationChunk]
    ) -> None:
        await self._aend(context, messages, None)

    # -- identity -------------------------------------------------------------------------

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"inner": {"type": self.inner._llm_type, **self.inner._identifying_params}}

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        # repr(), str(), rich output and dumpd()'s "repr" are built from these: no
        # member's credentials.
        return redacted_fields(super().__repr_args__())

    def _resolve_model_profile(self) -> ModelProfile | None:
        return self.inner.profile

    def _get_invocation_params(
        self, stop: list[str] | None = None, **kwargs: Any
    ) -> builtins.dict[str, Any]:
        kwargs.pop(SINK_KWARG, None)
        return invocation_params(self, stop, kwargs)

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        kwargs.pop(SINK_KWARG, None)
        return self.inner._get_ls_params(stop=stop, **kwargs)

    def _kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        inner_kwargs = self.inner_kwargs
        if inner_kwargs:
            kwargs = {**inner_kwargs, **kwargs}
        elif not kwargs:
            return {}
        return dict(without_tracing(kwargs))

    def _stream_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Call arguments for a streaming call (a layer may ask for more, e.g. usage)."""
        return self._kwargs(kwargs)

    # -- calls ----------------------------------------------------------------------------

    # A fallback chain below restarts streams: LangChain does not hand ``_stream`` the run
    # manager, so the outermost layer names the run and passes the event's sink down.
    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        if _restarts_below(self) and SINK_KWARG not in kwargs:
            config, sink = RestartSink.attach(self, config)
            kwargs[SINK_KWARG] = sink
        # LangChain's own (lazy) stream, returned rather than re-yielded: one generator
        # frame fewer per chunk.
        return super().stream(input, config, stop=stop, **kwargs)

    def astream(  # type: ignore[override]  # returns LangChain's async generator as is
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        if _restarts_below(self) and SINK_KWARG not in kwargs:
            config, sink = RestartSink.attach(self, config)
            kwargs[SINK_KWARG] = sink
        return super().astream(input, config, stop=stop, **kwargs)

    @signature_precomputed
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call_kwargs = self._kwargs(kwargs)
        context = self._begin(messages, call_kwargs)
        try:
            result = generate_inner(self.inner, messages, stop, run_manager, call_kwargs)
        except BaseException:
            self._end(context, messages, None)
            raise
        self._end(context, messages, result.generations[0].message)
        return result

    @signature_precomputed
    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call_kwargs = self._kwargs(kwargs)
        context = await self._abegin(messages, call_kwargs)
        try:
            result = await agenerate_inner(self.inner, messages, stop, run_manager, call_kwargs)
        except BaseException:
            await self._aend(context, messages, None)
            raise
        await self._aend(context, messages, result.generations[0].message)
        return result

    def _settles_streams(self) -> bool:
        """Whether a stream's end reaches `_end`/`_end_stream`/`_end_early` (the
        default). A layer whose endings do nothing for every stream it begins (a rate
        limit with no token budget) says False: its streams are then the inner model's
        own iterator, with no frame of this layer's per chunk."""
        return True

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        if self._settles_streams():
            return self._settled_stream(messages, stop, run_manager, kwargs)
        # LangChain (and an outer layer, through `stream_inner`) calls ``_stream`` where
        # it reads the stream, so the stream still begins on its first iteration.
        call_kwargs = self._stream_kwargs(kwargs)
        self._begin(messages, call_kwargs)
        return stream_inner(self.inner, messages, stop, run_manager, call_kwargs)

    def _settled_stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        run_manager: CallbackManagerForLLMRun | None,
        kwargs: dict[str, Any],
    ) -> Iterator[ChatGenerationChunk]:
        call_kwargs = self._stream_kwargs(kwargs)
        context = self._begin(messages, call_kwargs)
        chunks: list[ChatGenerationChunk] = []
        try:
            for chunk in stream_inner(self.inner, messages, stop, run_manager, call_kwargs):
                chunks.append(chunk)
                yield chunk
        except BaseException as error:  # what its outcome records (`StreamOutcome`)
            if StreamOutcome.of(error).records == "consumed":
                self._end_early(context, messages, chunks)
            else:
                self._end(context, messages, None)
            raise
        self._end_stream(context, messages, chunks)

    def _astream(  # type: ignore[override]  # returns an async generator as is
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        if self._settles_streams():
            return self._settled_astream(messages, stop, run_manager, kwargs)
        return self._plain_astream(messages, stop, run_manager, kwargs)

    async def _plain_astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        run_manager: AsyncCallbackManagerForLLMRun | None,
        kwargs: dict[str, Any],
    ) -> AsyncIterator[ChatGenerationChunk]:
        call_kwargs = self._stream_kwargs(kwargs)
        await self._abegin(messages, call_kwargs)
        stream = await astream_started(self.inner, messages, stop, run_manager, call_kwargs)
        async for chunk in stream:
            yield chunk

    async def _settled_astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        run_manager: AsyncCallbackManagerForLLMRun | None,
        kwargs: dict[str, Any],
    ) -> AsyncIterator[ChatGenerationChunk]:
        call_kwargs = self._stream_kwargs(kwargs)
        context = await self._abegin(messages, call_kwargs)
        chunks: list[ChatGenerationChunk] = []
        try:
            stream = await astream_started(self.inner, messages, stop, run_manager, call_kwargs)
            async for chunk in stream:
                chunks.append(chunk)
                yield chunk
        except BaseException as error:  # what its outcome records (`StreamOutcome`)
            if StreamOutcome.of(error).records == "consumed":
                await self._aend_early(context, messages, chunks)
            else:
                await self._aend(context, messages, None)
            raise
        await self._aend_stream(context, messages, chunks)

    # -- tools and structured output --------------------------------------------------------

    def _rewrapped(self, inner: BaseChatModel, inner_kwargs: dict[str, Any]) -> BaseChatModel:
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        fields["inner"] = inner
        fields["inner_kwargs"] = {**(self.inner_kwargs or {}), **inner_kwargs}
        layer: BaseChatModel = type(self)(**fields)
        return layer

    def bind_tools(
        self,
        tools: Sequence[builtins.dict[str, Any] | type | Callable[..., Any] | Any],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind ``tools`` through ``inner`` (in its provider's format); returns a binding."""
        tracing = {key: kwargs.pop(key) for key in TRACING_ONLY_KWARGS if key in kwargs}
        bound = self.inner.bind_tools(tools, tool_choice=tool_choice, **kwargs)
        model, bound_kwargs = unbind(bound, option=f"{type(self.inner).__name__}.bind_tools")
        return self._rewrapped(model, without_tracing(bound_kwargs)).bind(**tracing)

    def with_structured_output(
        self,
        schema: builtins.dict[str, Any] | type,
        *,
        include_raw: bool = False,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, builtins.dict[str, Any] | Any]:
        """Structured output through ``inner``, parsed by ``inner``'s own parser."""
        from langchain_core.runnables import RunnableMap, RunnablePassthrough

        structured = self.inner.with_structured_output(schema, include_raw=False, **kwargs)
        model, bound_kwargs, parser = split_structured(structured, option=type(self.inner).__name__)
        layer = self._rewrapped(model, without_tracing(bound_kwargs))
        llm: Runnable[LanguageModelInput, AIMessage] = layer.bind(
            **structured_tracing(schema, kwargs)
        )
        if not include_raw:
            return llm | parser
        from operator import itemgetter

        parser_assign = RunnablePassthrough.assign(
            parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
        )
        parser_none = RunnablePassthrough.assign(parsed=lambda _: None)
        with_fallback = parser_assign.with_fallbacks([parser_none], exception_key="parsing_error")
        return RunnableMap(raw=llm) | with_fallback
