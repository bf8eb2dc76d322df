"""What every LlamaIndex layer shares: calling what it wraps below that object's events.

A layer (fallback, rate limit, spend budget) is an ``LLM`` whose public methods carry
LlamaIndex's ``llm_chat_callback``/``llm_completion_callback`` and the dispatcher's span,
so one user call emits one ``CBEventType.LLM`` start/end pair and one
``LLMChatStartEvent``/``LLMChatEndEvent`` (or completion) pair, however deep the stack.
The LLM below is called *underneath* its own decorators (`undecorated_call`): the
plain method is recovered from the dispatcher's ``wrapt`` proxy (``__wrapped__``) and
from the callback decorator's closure (which keeps no ``__wrapped__``). The wrapped
LLM's own ``rate_limiter``, which that decorator would have applied, is acquired here
instead. Swapping its ``callback_manager`` would not do: instrumentation events go to
global dispatchers, and mutating a shared LLM is not thread-safe.

`DelegatingLLM` and `DelegatingEmbedding` are the bases of the layers that
wrap one object (``inner``); subclasses say what happens around each call through
``_begin``/``_end`` (and their async twins).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Sequence,
)
from types import CodeType, FunctionType, MethodType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias, TypeVar

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import LLM, ToolSelection

from llm_resilience.checks import KnownKeywords
from llm_resilience.layers import WrapsOne
from llm_resilience.metering import StreamOutcome
from llm_resilience.redact import redacted_fields

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

__all__ = [
    "PASS_THROUGH",
    "CallKind",
    "DelegatingEmbedding",
    "DelegatingLLM",
    "EmbeddingKind",
    "Request",
    "undecorated_call",
]

#: What a chat/completion call is; async methods share their sync twin's kind.
CallKind: TypeAlias = Literal["chat", "stream_chat", "complete", "stream_complete"]
#: What an embedding call is: one query, one text, or one batch of texts.
EmbeddingKind: TypeAlias = Literal["query", "text", "texts"]
#: A call's input as the hooks see it: chat messages, or a completion prompt.
Request: TypeAlias = Sequence[ChatMessage] | str
AnyResponse: TypeAlias = ChatResponse | CompletionResponse

_ResponseT = TypeVar("_ResponseT", ChatResponse, CompletionResponse)
_RouteT = TypeVar("_RouteT")


async def aclose_stream(stream: object) -> None:
    """Close an async stream this layer stopped relaying (``aclose``, when it has one)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


class _PassThrough:
    __slots__ = ()

    def __repr__(self) -> str:
        return "PASS_THROUGH"


#: What a `DelegatingLLM._begin` returns when nothing is left to do after the call it
#: admitted: no ``_end``, ``_end_early`` or ``_on_chunk`` is called for it, and a stream
#: is the inner LLM's, relayed chunk by chunk as it comes.
PASS_THROUGH: Any = _PassThrough()

# Fields of ``LLM`` that shape prompts in ``predict``/``stream``/``structured_predict``: a
# layer takes the inner LLM's unless told otherwise, so those behave as on the inner LLM.
_INHERITED_LLM_FIELDS = (
    "callback_manager",
    "system_prompt",
    "messages_to_prompt",
    "completion_to_prompt",
    "output_parser",
    "pydantic_program_mode",
    "query_wrapper_prompt",
)
# Likewise for embeddings: batching, caching and the name events report.
_INHERITED_EMBEDDING_FIELDS = (
    "callback_manager",
    "model_name",
    "embed_batch_size",
    "num_workers",
    "embeddings_cache",
)


class DelegatingLLM(FunctionCallingLLM, WrapsOne, KnownKeywords):
    """Base of the layers that wrap one LLM (``inner``).

    Each of the eight chat/completion methods (sync, async, streaming) runs
    ``_begin(kind, messages_or_prompt, kwargs)`` (which may refuse by raising: the inner
    LLM is then never called), then the inner LLM below its events, then
    ``_end(context, response)``, where ``response`` is None when the call or the stream
    failed or the call was cancelled. A stream begins on its first iteration, calls
    ``_on_chunk`` for each chunk, and ends with its last chunk; one its consumer closed
    early (``break``, ``close()``/``aclose()``, garbage collection) or cancelled ends in
    ``_end_early(context, last)`` instead, with the last chunk it delivered. ``kwargs`` is the
    call's own dict: a hook may pop the per-call options it names in ``_call_options``.
    A ``_begin`` that returns `PASS_THROUGH` has nothing to do after the call: none of
    the hooks after it runs.

    ``metadata`` is the inner LLM's; tools are prepared, validated and parsed by the inner
    LLM, so agents, ``predict_and_call`` and ``structured_predict`` work through a stack.
    ``system_prompt``, ``messages_to_prompt``, ``completion_to_prompt``,
    ``output_parser``, ``pydantic_program_mode``, ``query_wrapper_prompt`` and
    ``callback_manager`` default to the inner LLM's.
    """

    inner: LLM = Field(description="The wrapped LLM.")

    #: Per-call keyword arguments this layer consumes (popped before the inner call).
    _call_options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, inner: LLM, **kwargs: Any) -> None:
        if not isinstance(inner, LLM):
            raise TypeError(
                f"inner must be a LlamaIndex LLM (llama_index.core.llms.LLM); got "
                f"{type(inner).__module__}.{type(inner).__qualname__}"
            )
        for name in _INHERITED_LLM_FIELDS:
            if name not in kwargs:
                kwargs[name] = getattr(inner, name, None)
        super().__init__(inner=inner, **kwargs)

    # -- what subclasses define ---------------------------------------------------------

    def _begin(self, kind: CallKind, request: Request, kwargs: dict[str, Any]) -> Any:
        """Before the inner call; returns a context handed to `_end`. May raise."""
        return None

    async def _abegin(self, kind: CallKind, request: Request, kwargs: dict[str, Any]) -> Any:
        """Async `_begin` (by default, the sync one)."""
        return self._begin(kind, request, kwargs)

    def _on_chunk(self, context: Any, chunk: AnyResponse) -> None:
        """Each streamed chunk, before the caller sees it."""

    def _end(self, context: Any, response: AnyResponse | None) -> None:
        """After the call: the response (a stream's last chunk), or None if there is none."""

    async def _aend(self, context: Any, response: AnyResponse | None) -> None:
        """Async `_end` (by default, the sync one)."""
        self._end(context, response)

    def _end_early(self, context: Any, last: AnyResponse | None) -> None:
        """After a stream its consumer closed or cancelled: the last chunk it received
        (None if none); the chunks went through ``_on_chunk``. By default, as a failure."""
        self._end(context, None)

    async def _aend_early(self, context: Any, last: AnyResponse | None) -> None:
        """Async `_end_early` (by default, `_aend` with None)."""
        await self._aend(context, None)

    def _route(self, context: Any, invoke: Callable[[], _RouteT]) -> Callable[[], _RouteT]:
        """The call to make once `_begin` admitted it (by default ``invoke``: the inner
        LLM's); a layer may send it elsewhere by ``context``."""
        return invoke

    # -- identity -------------------------------------------------------------------------

    @classmethod
    def class_name(cls) -> str:
        return "DelegatingLLM"

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        # repr(), str() and rich output are built from these: no member's credentials.
        return redacted_fields(super().__repr_args__())

    @property
    def metadata(self) -> LLMMetadata:
        """The inner LLM's metadata."""
        return self.inner.metadata

    # -- chat -----------------------------------------------------------------------------

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        call = undecorated_call(self.inner, "chat", is_async=False)
        response: ChatResponse = self._call(
            "chat", messages, kwargs, lambda: call(messages, **kwargs)
        )
        return response

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        call = undecorated_call(self.inner, "achat", is_async=True)
        response: ChatResponse = await self._acall(
            "chat", messages, kwargs, lambda: call(messages, **kwargs)
        )
        return response

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        call = undecorated_call(self.inner, "stream_chat", is_async=False)
        return self._stream("stream_chat", messages, kwargs, lambda: call(messages, **kwargs))

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        call = undecorated_call(self.inner, "astream_chat", is_async=True)
        return self._astream("stream_chat", messages, kwargs, lambda: call(messages, **kwargs))

    # -- completion -------------------------------------------------------------------------

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        call = undecorated_call(self.inner, "complete", is_async=False)
        response: CompletionResponse = self._call(
            "complete", prompt, kwargs, lambda: call(prompt, formatted=formatted, **kwargs)
        )
        return response

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        call = undecorated_call(self.inner, "acomplete", is_async=True)
        response: CompletionResponse = await self._acall(
            "complete", prompt, kwargs, lambda: call(prompt, formatted=formatted, **kwargs)
        )
        return response

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        call = undecorated_call(self.inner, "stream_complete", is_async=False)
        return self._stream(
            "stream_complete", prompt, kwargs, lambda: call(prompt, formatted=formatted, **kwargs)
        )

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        call = undecorated_call(self.inner, "astream_complete", is_async=True)
        return self._astream(
            "stream_complete", prompt, kwargs, lambda: call(prompt, formatted=formatted, **kwargs)
        )

    # -- the call shapes ----------------------------------------------------------------------
    # ``invoke`` closes over ``kwargs``, so it sees what ``_begin`` popped from it.

    def _call(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], _ResponseT],
    ) -> _ResponseT:
        context = self._begin(kind, request, kwargs)
        if context is PASS_THROUGH:
            return self._route(context, invoke)()
        try:
            response = self._route(context, invoke)()
        except BaseException:
            self._end(context, None)
            raise
        self._end(context, response)
        return response

    async def _acall(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], Awaitable[_ResponseT]],
    ) -> _ResponseT:
        context = await self._abegin(kind, request, kwargs)
        if context is PASS_THROUGH:
            return await self._route(context, invoke)()
        try:
            response = await self._route(context, invoke)()
        except BaseException:
            await self._aend(context, None)
            raise
        await self._aend(context, response)
        return response

    def _stream(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], Iterator[_ResponseT]],
    ) -> Generator[_ResponseT, None, None]:
        # A generator: nothing happens until the caller asks for the first chunk.
        context = self._begin(kind, request, kwargs)
        if context is PASS_THROUGH:
            passed = self._route(context, invoke)()
            try:
                for chunk in passed:
                    yield chunk
            finally:
                close = getattr(passed, "close", None)
                if close is not None:
                    close()
            return
        last: AnyResponse | None = None
        try:
            stream = self._route(context, invoke)()
            try:
                for chunk in stream:
                    self._on_chunk(context, chunk)
                    last = chunk
                    yield chunk
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
        except BaseException as error:  # what its outcome records (`StreamOutcome`)
            if StreamOutcome.of(error).records == "consumed":
                self._end_early(context, last)
            else:
                self._end(context, None)
            raise
        self._end(context, last or _empty(kind))

    async def _astream(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], Awaitable[AsyncIterator[_ResponseT]] | AsyncIterator[_ResponseT]],
    ) -> AsyncGenerator[_ResponseT, None]:
        context = await self._abegin(kind, request, kwargs)
        if context is PASS_THROUGH:
            opened = self._route(context, invoke)()
            stream = await opened if inspect.isawaitable(opened) else opened
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                await aclose_stream(stream)
            return
        last: AnyResponse | None = None
        try:
            opened = self._route(context, invoke)()
            stream = await opened if inspect.isawaitable(opened) else opened
            try:
                async for chunk in stream:
                    self._on_chunk(context, chunk)
                    last = chunk
                    yield chunk
            finally:
                await aclose_stream(stream)
        except BaseException as error:  # what its outcome records (`StreamOutcome`)
            if StreamOutcome.of(error).records == "consumed":
                await self._aend_early(context, last)
            else:
                await self._aend(context, None)
            raise
        await self._aend(context, last or _empty(kind))

    # -- function calling -----------------------------------------------------------------------

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
        """The inner LLM's tool request (its provider's schema), plus this layer's options."""
        own = {key: kwargs.pop(key) for key in self._call_options if key in kwargs}
        prepared = self._function_calling()._prepare_chat_with_tools_compat(
            tools,
            user_msg=user_msg,
            chat_history=chat_history,
            verbose=verbose,
            allow_parallel_tool_calls=allow_parallel_tool_calls,
            tool_required=tool_required,
            **kwargs,
        )
        return {**prepared, **own}

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[BaseTool],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        """Validated by the inner LLM (as it would validate its own response)."""
        if not isinstance(self.inner, FunctionCallingLLM):
            return response
        kwargs = {key: value for key, value in kwargs.items() if key not in self._call_options}
        return self.inner._validate_chat_with_tools_response(
            response, tools, allow_parallel_tool_calls=allow_parallel_tool_calls, **kwargs
        )

    def get_tool_calls_from_response(
        self,
        response: ChatResponse,
        error_on_no_tool_call: bool = True,
        **kwargs: Any,
    ) -> list[ToolSelection]:
        """Tool calls parsed by the inner LLM, which produced ``response``."""
        return self._function_calling().get_tool_calls_from_response(
            response, error_on_no_tool_call=error_on_no_tool_call, **kwargs
        )

    def _function_calling(self) -> FunctionCallingLLM:
        if not isinstance(self.inner, FunctionCallingLLM):
            raise TypeError(
                f"{type(self).__name__}.inner ({type(self.inner).__name__}) is not a "
                "FunctionCallingLLM and cannot take tools"
            )
        return self.inner


class DelegatingEmbedding(BaseEmbedding, WrapsOne, KnownKeywords):
    """Base of the layers that wrap one embedding model (``inner``).

    ``_get_query_embedding``, ``_get_text_embedding`` and ``_get_text_embeddings`` (one
    call per batch of ``embed_batch_size`` texts) and their async twins run
    ``_begin(kind, texts)`` (which may refuse by raising: the inner model is then never
    called), then the inner model's own private method (so one user call emits one
    embedding event pair, from this layer), then ``_end(context, embeddings)`` with None
    when the call failed or was cancelled. The inner model's own ``rate_limiter`` still
    applies. ``model_name``, ``embed_batch_size``, ``num_workers``, ``embeddings_cache``
    and ``callback_manager`` default to the inner model's, so batching and caching are
    unchanged (a cache hit never reaches the hooks).
    """

    inner: BaseEmbedding = Field(description="The wrapped embedding model.")

    def __init__(self, *, inner: BaseEmbedding, **kwargs: Any) -> None:
        if not isinstance(inner, BaseEmbedding):
            raise TypeError(
                f"inner must be a LlamaIndex embedding model "
                f"(llama_index.core.embeddings.BaseEmbedding); got "
                f"{type(inner).__module__}.{type(inner).__qualname__}"
            )
        for name in _INHERITED_EMBEDDING_FIELDS:
            if name not in kwargs:
                kwargs[name] = getattr(inner, name, None)
        kwargs["inner"] = inner
        super().__init__(**kwargs)

    # -- what subclasses define ---------------------------------------------------------

    def _begin(self, kind: EmbeddingKind, texts: list[str]) -> Any:
        """Before the inner call; returns a context handed to `_end`. May raise."""
        return None

    async def _abegin(self, kind: EmbeddingKind, texts: list[str]) -> Any:
        """Async `_begin` (by default, the sync one)."""
        return self._begin(kind, texts)

    def _end(self, context: Any, embeddings: list[Embedding] | None) -> None:
        """After the call: one embedding per text, or None if the call failed."""

    async def _aend(self, context: Any, embeddings: list[Embedding] | None) -> None:
        """Async `_end` (by default, the sync one)."""
        self._end(context, embeddings)

    # -- identity -------------------------------------------------------------------------

    @classmethod
    def class_name(cls) -> str:
        return "DelegatingEmbedding"

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        # repr(), str() and rich output are built from these: no member's credentials.
        return redacted_fields(super().__repr_args__())

    # -- calls ----------------------------------------------------------------------------

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._embed("query", [query], lambda: [self.inner._get_query_embedding(query)])[0]

    async def _aget_query_embedding(self, query: str) -> Embedding:
        async def invoke() -> list[Embedding]:
            return [await self.inner._aget_query_embedding(query)]

        return (await self._aembed("query", [query], invoke))[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._embed("text", [text], lambda: [self.inner._get_text_embedding(text)])[0]

    async def _aget_text_embedding(self, text: str) -> Embedding:
        async def invoke() -> list[Embedding]:
            return [await self.inner._aget_text_embedding(text)]

        return (await self._aembed("text", [text], invoke))[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._embed("texts", texts, lambda: self.inner._get_text_embeddings(texts))

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return await self._aembed("texts", texts, lambda: self.inner._aget_text_embeddings(texts))

    def _embed(
        self, kind: EmbeddingKind, texts: list[str], invoke: Callable[[], list[Embedding]]
    ) -> list[Embedding]:
        context = self._begin(kind, texts)
        try:
            limiter = self.inner.rate_limiter
            if limiter is not None:
                limiter.acquire()
            embeddings = invoke()
        except BaseException:
            self._end(context, None)
            raise
        self._end(context, embeddings)
        return embeddings

    async def _aembed(
        self,
        kind: EmbeddingKind,
        texts: list[str],
        invoke: Callable[[], Awaitable[list[Embedding]]],
    ) -> list[Embedding]:
        context = await self._abegin(kind, texts)
        try:
            limiter = self.inner.rate_limiter
            if limiter is not None:
                await limiter.async_acquire()
            embeddings = await invoke()
        except BaseException:
            await self._aend(context, None)
            raise
        await self._aend(context, embeddings)
        return embeddings


def _empty(kind: CallKind) -> AnyResponse:
    """What a stream that completed without a single chunk answered."""
    if kind == "stream_chat":
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=""), delta="")
    return CompletionResponse(text="", delta="")


# -- calling an LLM below its event decorators ----------------------------------------------


def _callback_wrapper_codes() -> frozenset[CodeType]:
    """Code objects of the wrappers ``llm_chat_callback``/``llm_completion_callback`` make.

    Obtained by applying the real decorators, so a renamed wrapper in a future
    llama-index-core is still recognised. Decorating a function twice yields the
    pass-through wrapper, which is collected as well.
    """
    codes: set[CodeType] = set()
    for decorator in (llm_chat_callback(), llm_completion_callback()):

        def probe(_self: Any, messages: Any, **kwargs: Any) -> None:
            return None

        async def aprobe(_self: Any, messages: Any, **kwargs: Any) -> None:
            return None

        for function in (probe, aprobe):
            codes.add(decorator(function).__code__)
            codes.add(decorator(function).__code__)
    return frozenset(codes)


_CALLBACK_WRAPPER_CODES = _callback_wrapper_codes()


def _is_span_proxy(obj: object) -> bool:
    """Whether ``obj`` is the ``wrapt`` proxy ``Dispatcher.span`` puts around a method."""
    wrapper = getattr(obj, "_self_wrapper", None)
    qualname = getattr(wrapper, "__qualname__", "")
    return isinstance(qualname, str) and qualname.startswith("Dispatcher.span.")


@functools.lru_cache(maxsize=512)
def _undecorated(cls: type, name: str) -> tuple[FunctionType, bool] | None:
    """``cls.<name>`` without the dispatcher span and the LLM callback decorator.

    Returns the plain function and whether the callback decorator was removed, or None
    when the method is not a plain function underneath (then it is called as it is).
    """
    try:
        function: Any = inspect.getattr_static(cls, name)
    except AttributeError:
        return None
    while _is_span_proxy(function):
        function = function.__wrapped__
    stripped = False
    code = getattr(function, "__code__", None)
    if code in _CALLBACK_WRAPPER_CODES:
        cells = dict(zip(code.co_freevars, function.__closure__ or (), strict=False))
        inner = cells.get("f")
        if inner is not None and isinstance(inner.cell_contents, FunctionType):
            function = inner.cell_contents
            stripped = True
    if not isinstance(function, FunctionType):
        return None
    return function, stripped


def undecorated_call(llm: LLM, name: str, *, is_async: bool) -> Callable[..., Any]:
    """``llm.<name>`` to call below its event decorators, its own ``rate_limiter`` included.

    ``name`` is one of the eight chat/completion methods; ``is_async`` says whether it is
    a coroutine method. A method without LlamaIndex's decorators is returned as it is.
    """
    found = _undecorated(type(llm), name)
    if found is None:
        return getattr(llm, name)  # type: ignore[no-any-return]
    function, stripped = found
    method = MethodType(function, llm)
    limiter = llm.rate_limiter
    if not stripped or limiter is None:
        return method
    # The callback decorator is where LlamaIndex applies an LLM's own rate_limiter.
    if is_async:

        async def limited_async(*args: Any, **kwargs: Any) -> Any:
            await limiter.async_acquire()
            return await method(*args, **kwargs)

        return limited_async

    def limited(*args: Any, **kwargs: Any) -> Any:
        limiter.acquire()
        return method(*args, **kwargs)

    return limited
