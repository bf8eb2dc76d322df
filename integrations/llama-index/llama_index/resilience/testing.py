"""Fake LlamaIndex LLMs that fail on cue, for testing resilience stacks offline.

Examples:
    >>> from llama_index.resilience import FallbackLLM
    >>> from llama_index.resilience.testing import FakeFunctionCallingLLM, rate_limit_error
    >>> primary = FakeFunctionCallingLLM(model_name="primary", error=rate_limit_error())
    >>> secondary = FakeFunctionCallingLLM(model_name="secondary", text="Paris.")
    >>> FallbackLLM(llms=[primary, secondary]).complete("Capital of France?").text
    'Paris.'

[`FakeFunctionCallingLLM`][] answers every chat and completion call (sync, async,
streaming) with a fixed text streamed word by word, reports OpenAI-shaped usage, calls a
configured tool when it is offered, and can fail with any exception, after any number of
chunks, or hang. Its public methods carry LlamaIndex's usual callback decorators, so it
emits the same events a provider integration does. [`rate_limit_error`][] and
[`api_status_error`][] (the core's ``llm_resilience.testing.errors``) build errors the
way the ``openai`` SDK raises them (``httpx.HTTPStatusError`` when ``openai`` is not
installed).
[`restart_events`][] collects the stream restarts a chain dispatches while it is open.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, Generator, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

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
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.resilience.events import FallbackStreamRestartEvent

from llm_resilience.testing import FakeFaults, HasFakeFaults
from llm_resilience.testing.errors import api_status_error, rate_limit_error

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

__all__ = [
    "FakeFunctionCallingLLM",
    "RestartEvents",
    "api_status_error",
    "rate_limit_error",
    "restart_events",
]

_ChunkT = TypeVar("_ChunkT", ChatResponse, CompletionResponse)


class FakeFunctionCallingLLM(HasFakeFaults, FunctionCallingLLM):
    """A scripted function-calling LLM: fixed answer, optional tool call, faults on cue.

    Examples:
        >>> fake = FakeFunctionCallingLLM(text="Hello there.", fail_after_chunks=1,
        ...                               error=rate_limit_error())
        >>> stream = fake.stream_complete("hi")
        >>> next(stream).delta
        'Hello'

    Every request first counts in [`calls`][llm_resilience.testing.HasFakeFaults.calls]. Then, for a
    plain call, it hangs ``hang_seconds`` (if set) and raises a fresh copy of ``error`` (if set)
    before answering (its own traceback each time, so failing calls keep nothing alive;
    [`last_error`][llm_resilience.testing.HasFakeFaults.last_error] is the latest copy). A stream
    yields ``fail_after_chunks`` word chunks (default 0: hang and fail before the first chunk), then
    hangs and/or fails. Streams end with an empty-delta chunk carrying the usage, as OpenAI's do
    with ``include_usage``. `release()` ends every hang at once (call it when a test is done with a
    hung fake so abandoned worker threads finish); cancelling an async call ends its hang too.
    Counting, hangs and copies are the core's `llm_resilience.testing.FakeFaults`.

    Usage counts words: ``prompt_tokens`` over the request's message texts,
    ``completion_tokens`` over the answer. It is in ``raw["usage"]`` and, as
    ``prompt_tokens``/``completion_tokens``/``total_tokens``, in ``additional_kwargs``.

    When ``tool_call`` is set and a tool of that name is offered
    (``chat_with_tools``, agents, ``structured_predict``), the fake answers with that
    tool call, in ``message.additional_kwargs["tool_calls"]`` as
    ``{"id", "name", "arguments"}`` dicts, unless the last message is a tool result, in
    which case it answers ``text``: an agent loop calls the tool once and then finishes.
    """

    text: str = Field(default="The fake model answers.", description="The answer.")
    model_name: str = Field(default="fake-model", description="Reported model name.")
    tool_call: ToolSelection | None = Field(
        default=None, description="The tool call to make when that tool is offered."
    )
    error: BaseException | None = Field(
        default=None, exclude=True, description="Copied and raised by every request, if set."
    )
    fail_after_chunks: int = Field(
        default=0, ge=0, description="Chunks a stream yields before it hangs or fails."
    )
    hang_seconds: float | None = Field(
        default=None, gt=0, description="Seconds every request blocks, if set."
    )
    context_window: int = Field(default=8192, description="Reported context window.")
    num_output: int = Field(default=256, description="Reported output tokens.")
    is_chat_model: bool = Field(default=True, description="Reported chat-model flag.")
    is_function_calling_model: bool = Field(
        default=True, description="Reported function-calling flag."
    )
    max_retries: int = Field(
        default=0, ge=0, description="Reported own retries (for self-retry warnings)."
    )

    _faults: FakeFaults = PrivateAttr(default_factory=FakeFaults)
    _tool_call_parses: int = PrivateAttr(default=0)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @classmethod
    def class_name(cls) -> str:
        return "FakeFunctionCallingLLM"

    @property
    def tool_call_parses(self) -> int:
        """How many times `get_tool_calls_from_response` was called on this fake."""
        return self._tool_call_parses

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self.context_window,
            num_output=self.num_output,
            is_chat_model=self.is_chat_model,
            is_function_calling_model=self.is_function_calling_model,
            model_name=self.model_name,
        )

    # -- chat ---------------------------------------------------------------------

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        self._count()
        self._disrupt()
        return self._chat_response(messages, kwargs)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        self._count()
        await self._adisrupt()
        return self._chat_response(messages, kwargs)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        self._count()

        return self._faulty(list(self._chat_chunks(messages, kwargs)))

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        self._count()

        return self._afaulty(list(self._chat_chunks(messages, kwargs)))

    # -- completion ---------------------------------------------------------------

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self._count()
        self._disrupt()
        return self._completion_response(prompt)

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        self._count()
        await self._adisrupt()
        return self._completion_response(prompt)

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        self._count()

        return self._faulty(list(self._completion_chunks(prompt)))

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        self._count()

        return self._afaulty(list(self._completion_chunks(prompt)))

    # -- function calling -----------------------------------------------------------

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
        messages = list(chat_history or [])
        if isinstance(user_msg, str):
            user_msg = ChatMessage(role=MessageRole.USER, content=user_msg)
        if user_msg is not None:
            messages.append(user_msg)
        # Real integrations turn tools into provider schemas here; the fake needs names.
        return {"messages": messages, "tools": [tool.metadata.name for tool in tools]}

    def get_tool_calls_from_response(
        self,
        response: ChatResponse,
        error_on_no_tool_call: bool = True,
        **kwargs: Any,
    ) -> list[ToolSelection]:
        with self._lock:
            self._tool_call_parses += 1
        calls = response.message.additional_kwargs.get("tool_calls") or []
        if not calls and error_on_no_tool_call:
            raise ValueError("Expected at least one tool call, but got 0 tool calls.")
        return [
            ToolSelection(tool_id=call["id"], tool_name=call["name"], tool_kwargs=call["arguments"])
            for call in calls
        ]

    # -- internals ------------------------------------------------------------------

    def _count(self) -> None:
        # Every request passes here first (a subclass may note it).
        self._faults.count()

    def _disrupt(self) -> None:
        self._faults.hang(self.hang_seconds)
        if self.error is not None:
            raise self._faults.failure(self.error)

    async def _adisrupt(self) -> None:
        await self._faults.ahang(self.hang_seconds)
        if self.error is not None:
            raise self._faults.failure(self.error)

    def _faulty(self, chunks: list[_ChunkT]) -> Generator[_ChunkT, None, None]:
        # Past the last chunk, the fault comes at the end of the stream.
        point = min(self.fail_after_chunks, len(chunks))
        yield from chunks[:point]
        self._disrupt()
        yield from chunks[point:]

    async def _afaulty(self, chunks: list[_ChunkT]) -> AsyncGenerator[_ChunkT, None]:
        point = min(self.fail_after_chunks, len(chunks))
        for chunk in chunks[:point]:
            yield chunk
        await self._adisrupt()
        for chunk in chunks[point:]:
            yield chunk

    def _wants_tool(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> bool:
        offered = kwargs.get("tools") or []
        if self.tool_call is None or self.tool_call.tool_name not in offered:
            return False
        return not messages or messages[-1].role != MessageRole.TOOL

    def _tool_message(self) -> ChatMessage:
        assert self.tool_call is not None
        call = {
            "id": self.tool_call.tool_id,
            "name": self.tool_call.tool_name,
            "arguments": dict(self.tool_call.tool_kwargs),
        }
        return ChatMessage(
            role=MessageRole.ASSISTANT, content="", additional_kwargs={"tool_calls": [call]}
        )

    def _usage(self, prompt: str, answer: str) -> dict[str, int]:
        prompt_tokens = len(prompt.split())
        completion_tokens = len(answer.split())
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def _raw(self, usage: dict[str, int] | None) -> dict[str, Any]:
        raw: dict[str, Any] = {"model": self.model_name}
        if usage is not None:
            raw["usage"] = usage
        return raw

    def _chat_response(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> ChatResponse:
        prompt = " ".join(message.content or "" for message in messages)
        if self._wants_tool(messages, kwargs):
            usage = self._usage(prompt, "")
            message = self._tool_message()
        else:
            usage = self._usage(prompt, self.text)
            message = ChatMessage(role=MessageRole.ASSISTANT, content=self.text)
        return ChatResponse(message=message, raw=self._raw(usage), additional_kwargs=usage)

    def _chat_chunks(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> Iterator[ChatResponse]:
        prompt = " ".join(message.content or "" for message in messages)
        if self._wants_tool(messages, kwargs):
            usage = self._usage(prompt, "")
            yield ChatResponse(
                message=self._tool_message(),
                delta="",
                raw=self._raw(usage),
                additional_kwargs=usage,
            )
            return
        so_far = ""
        for word in _words(self.text):
            so_far += word
            yield ChatResponse(
                message=ChatMessage(role=MessageRole.ASSISTANT, content=so_far),
                delta=word,
                raw=self._raw(None),
            )
        usage = self._usage(prompt, self.text)
        yield ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=so_far),
            delta="",
            raw=self._raw(usage),
            additional_kwargs=usage,
        )

    def _completion_response(self, prompt: str) -> CompletionResponse:
        usage = self._usage(prompt, self.text)
        return CompletionResponse(text=self.text, raw=self._raw(usage), additional_kwargs=usage)

    def _completion_chunks(self, prompt: str) -> Iterator[CompletionResponse]:
        so_far = ""
        for word in _words(self.text):
            so_far += word
            yield CompletionResponse(text=so_far, delta=word, raw=self._raw(None))
        usage = self._usage(prompt, self.text)
        yield CompletionResponse(
            text=so_far, delta="", raw=self._raw(usage), additional_kwargs=usage
        )


def _words(text: str) -> list[str]:
    """``"a b c"`` -> ``["a", " b", " c"]``: chunks that join back to the text."""
    parts = text.split(" ")
    return [parts[0], *(" " + part for part in parts[1:])] if text else []


class RestartEvents(BaseEventHandler):
    """The [`FallbackStreamRestartEvent`][] s dispatched while
    this handler is registered, in order (see [`restart_events`][])."""

    events: list[FallbackStreamRestartEvent] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "RestartEvents"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, FallbackStreamRestartEvent):
            self.events.append(event)


@contextmanager
def restart_events() -> Iterator[RestartEvents]:
    """Collect the stream restarts dispatched while the block runs (root dispatcher).

    Examples:
        >>> from llama_index.core.llms import ChatMessage
        >>> from llama_index.resilience import FallbackLLM
        >>> primary = FakeFunctionCallingLLM(text="Paris is", error=rate_limit_error(),
        ...                                  fail_after_chunks=1)
        >>> chain = FallbackLLM(llms=[primary, FakeFunctionCallingLLM(text="Paris.")])
        >>> with restart_events() as restarts:
        ...     text = "".join(r.delta for r in chain.stream_chat([ChatMessage(content="?")]))
        >>> [(e.failed_client, e.next_client) for e in restarts.events]
        [(0, 1)]
    """
    handler = RestartEvents()
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(handler)
    try:
        yield handler
    finally:
        dispatcher.event_handlers.remove(handler)
