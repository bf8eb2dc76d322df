"""Offline fake chat models for testing resilience stacks, no network and no API keys.

* [`ScriptedChatModel`][] answers deterministically: text, usage, streaming, tool
  calls and structured output, well enough to pass LangChain's standard integration
  suite on its own.
* [`FailingChatModel`][] fails the way providers fail: a real ``openai``
  ``RateLimitError`` (HTTP 429) by default, or any error you give it, optionally after
  hanging or after streaming a few chunks.

Examples:
    >>> from langchain_llm_resilience import FallbackChatModel
    >>> chain = FallbackChatModel(models=[FailingChatModel(), ScriptedChatModel()])
    >>> chain.invoke("Hello").text
    'Hello! This is a scripted answer.'

[`RestartEvents`][] is a callback handler that collects the stream restarts a chain
reports (pass it in ``config={"callbacks": [...]}``).

The error helpers (``rate_limit_error``, ``service_unavailable_error``) are the
core's ``llm_resilience.testing.errors``: real ``openai`` SDK exceptions over real
``httpx`` responses, so the transient rule sees exactly what it sees in production
(``httpx.HTTPStatusError`` without ``openai``). Tool arguments and structured answers
come from ``llm_resilience.testing.schema.sample_instance``.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    BaseCallbackHandler,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.output_parsers import (
    JsonOutputKeyToolsParser,
    JsonOutputParser,
    PydanticOutputParser,
    PydanticToolsParser,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import ConfigDict, Field, PrivateAttr

from langchain_llm_resilience._restart import STREAM_RESTART_EVENT
from llm_resilience.testing import FakeFaults, HasFakeFaults
from llm_resilience.testing.errors import rate_limit_error, service_unavailable_error
from llm_resilience.testing.schema import sample_instance

__all__ = [
    "FailingChatModel",
    "RestartEvents",
    "ScriptedChatModel",
    "rate_limit_error",
    "service_unavailable_error",
]

ToolLike = dict[str, Any] | type | Callable[..., Any] | BaseTool


# -- shared helpers -----------------------------------------------------------------


def _rough_tokens(text: str) -> int:
    """A deliberately rough token count: words and punctuation marks."""
    return len(re.findall(r"\w+|[^\w\s]", text))


def _normalize_tool_choice(tool_choice: Any) -> str | None:
    """``"any"`` (must call some tool), ``"auto"``, ``"none"``, a tool name, or None."""
    if tool_choice is None or tool_choice == "auto":
        return None
    if tool_choice is True or tool_choice in ("any", "required"):
        return "any"
    if tool_choice is False or tool_choice == "none":
        return "none"
    if isinstance(tool_choice, str):
        return tool_choice
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else tool_choice.get("name")
        if isinstance(name, str):
            return name
    raise ValueError(f"Unsupported tool_choice {tool_choice!r}")


# Words too common to tell which tool a prompt is about.
_STOPWORD_TEXT = """
a an and are as at be by can do for from get give how i in is it me my of on or
please the this to use using value what when where which who why with you your
"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def _words(text: str) -> set[str]:
    return {word for word in re.findall(r"[a-z0-9]+", text.lower()) if word not in _STOPWORDS}


# -- the scripted model ---------------------------------------------------------------


class ScriptedChatModel(BaseChatModel):
    """An offline chat model with deterministic answers, usage and tool calls.

    * Text: cycles through ``responses``; after a ``ToolMessage`` it reports the tool's
      result instead. ``stop`` sequences (call or constructor) cut the text.
    * Usage: ``usage_metadata`` with a rough count (words and punctuation) of the
      prompt and the answer, and ``response_metadata["model_name"]``, both in
      ``invoke`` and on the last streamed chunk; ``report_usage=False`` omits usage.
    * Streaming: one chunk per word, then a last chunk (``chunk_position="last"``)
      carrying usage and metadata.
    * Tools: ``bind_tools`` with ``tool_choice`` ``"any"``/``"required"``, a tool name,
      ``"auto"`` or ``"none"``. With a forced choice, or when a bound tool's name or
      description shares a word with the last human message, it answers with one tool
      call whose arguments satisfy the tool's JSON schema: numbers from the prompt in
      order (``magic_function(3)`` gives ``{"input": 3}``, clamped to the schema's
      bounds), then quoted text and proper names for strings.
    * ``with_structured_output`` with ``method`` ``"function_calling"`` (default),
      ``"json_schema"`` or ``"json_mode"``.
    * A per-call ``model="..."`` keyword overrides the reported model name.

    Examples:
        >>> model = ScriptedChatModel(responses=["Hi there."])
        >>> model.invoke("Hello").usage_metadata["output_tokens"]
        3
    """

    model_config = ConfigDict(populate_by_name=True)

    model_name: str = Field(default="scripted-chat", alias="model")
    """Reported as ``response_metadata["model_name"]``."""
    responses: Sequence[str] = ("Hello! This is a scripted answer.",)
    """Text answers, cycled in order."""
    stop: list[str] | None = None
    """Stop sequences applied to every call, besides the call's own."""
    max_tokens: int | None = None
    """Cut text answers after this many rough tokens."""
    report_usage: bool = True
    """Whether answers carry ``usage_metadata``."""

    _faults: FakeFaults = PrivateAttr(default_factory=FakeFaults)

    @property
    def calls(self) -> int:
        """How many requests (invoke or stream) this model has served."""
        return self._faults.calls

    @property
    def _llm_type(self) -> str:
        return "scripted-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "scripted"
        model = kwargs.get("model")
        params["ls_model_name"] = model if isinstance(model, str) else self.model_name
        return params

    # -- binding --------------------------------------------------------------

    def bind_tools(
        self,
        tools: Sequence[ToolLike],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools (any form ``convert_to_openai_tool`` accepts) and a ``tool_choice``."""
        formatted = [convert_to_openai_tool(tool) for tool in tools]
        choice = _normalize_tool_choice(tool_choice)
        names = {tool["function"]["name"] for tool in formatted}
        if choice not in (None, "any", "none") and choice not in names:
            raise ValueError(f"tool_choice names {choice!r}, which is not among {sorted(names)}")
        if choice is not None:
            kwargs["tool_choice"] = choice
        return self.bind(tools=formatted, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        include_raw: bool = False,
        method: Literal["function_calling", "json_schema", "json_mode"] = "function_calling",
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
        """Structured output by tool call (default), JSON schema or JSON mode."""
        if kwargs:
            raise ValueError(f"Received unsupported arguments {kwargs}")
        is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        traced = {"kwargs": {"method": method, "strict": strict}, "schema": schema}
        parser: Runnable[Any, Any]
        if method == "function_calling":
            name = convert_to_openai_tool(schema)["function"]["name"]
            llm = self.bind_tools([schema], tool_choice=name, ls_structured_output_format=traced)
            if is_pydantic:
                parser = PydanticToolsParser(tools=[schema], first_tool_only=True)  # type: ignore[list-item]
            else:
                parser = JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
        elif method in ("json_schema", "json_mode"):
            response_format: dict[str, Any] = {"type": "json_object"}
            if method == "json_schema":
                json_schema = convert_to_json_schema(schema)
                response_format = {"type": "json_schema", "json_schema": {"schema": json_schema}}
            llm = self.bind(response_format=response_format, ls_structured_output_format=traced)
            if is_pydantic:
                parser = PydanticOutputParser(pydantic_object=schema)  # type: ignore[arg-type]
            else:
                parser = JsonOutputParser()
        else:
            raise ValueError(
                f"method must be 'function_calling', 'json_schema' or 'json_mode'; got {method!r}"
            )
        if not include_raw:
            return llm | parser
        parse = RunnablePassthrough.assign(
            parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
        )
        no_parse = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parse.with_fallbacks(
            [no_parse], exception_key="parsing_error"
        )

    # -- answering ------------------------------------------------------------

    def _answer(
        self, messages: list[BaseMessage], stop: list[str] | None, **kwargs: Any
    ) -> AIMessage:
        turn = self._faults.count()
        prompt = next((m.text for m in reversed(messages) if isinstance(m, HumanMessage)), "")
        last = messages[-1] if messages else None
        model = kwargs.get("model")
        metadata: dict[str, Any] = {
            "model_name": model if isinstance(model, str) else self.model_name
        }
        tool_calls: list[dict[str, Any]] = []
        text = ""
        call = None if isinstance(last, ToolMessage) else self._tool_call(prompt, **kwargs)
        response_format = kwargs.get("response_format")
        if call is not None:
            tool_calls = [call]
            metadata["finish_reason"] = "tool_calls"
        elif isinstance(response_format, dict) and not isinstance(last, ToolMessage):
            text = json.dumps(self._json_answer(prompt, response_format), ensure_ascii=False)
            metadata["finish_reason"] = "stop"
        else:
            if isinstance(last, ToolMessage):
                text = f"The {last.name or 'tool'} tool returned: {last.text}"
            else:
                text = self.responses[turn % len(self.responses)] if self.responses else ""
            text = self._cut(text, [*(self.stop or []), *(stop or [])])
            metadata["finish_reason"] = "stop"
        usage = None
        if self.report_usage:
            prompt_tokens = sum(3 + _rough_tokens(m.text) for m in messages)
            answer = text + "".join(json.dumps(c["args"]) for c in tool_calls)
            output_tokens = _rough_tokens(answer)
            usage = UsageMetadata(
                input_tokens=prompt_tokens,
                output_tokens=output_tokens,
                total_tokens=prompt_tokens + output_tokens,
            )
        return AIMessage(
            content=text,
            tool_calls=tool_calls,
            usage_metadata=usage,
            response_metadata=metadata,
        )

    def _cut(self, text: str, stops: list[str]) -> str:
        for stop in stops:
            if stop and stop in text:
                text = text[: text.index(stop)]
        if self.max_tokens is not None:
            pieces = re.findall(r"\S+\s*", text)
            kept: list[str] = []
            for piece in pieces:
                if _rough_tokens("".join([*kept, piece])) > self.max_tokens:
                    break
                kept.append(piece)
            text = "".join(kept)
        return text

    def _tool_call(self, prompt: str, **kwargs: Any) -> dict[str, Any] | None:
        tools: list[dict[str, Any]] = [t for t in kwargs.get("tools") or [] if isinstance(t, dict)]
        choice = _normalize_tool_choice(kwargs.get("tool_choice"))
        if not tools or choice == "none":
            return None
        functions = [t.get("function", t) for t in tools]
        if choice not in (None, "any"):
            chosen = next((f for f in functions if f.get("name") == choice), None)
            if chosen is None:
                raise ValueError(f"tool_choice names {choice!r}, which is not a bound tool")
        else:
            asked = _words(prompt)
            scores = [
                len(
                    asked
                    & _words(f"{f.get('name', '')} {f.get('description', '')}".replace("_", " "))
                )
                for f in functions
            ]
            best = max(range(len(functions)), key=lambda i: scores[i])
            if choice is None and scores[best] == 0:
                return None
            chosen = functions[best]
        parameters = chosen.get("parameters") or {"type": "object", "properties": {}}
        args = sample_instance(parameters, prompt=prompt)
        return {
            "name": chosen["name"],
            "args": args if isinstance(args, dict) else {},
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "tool_call",
        }

    def _json_answer(self, prompt: str, response_format: dict[str, Any]) -> Any:
        json_schema = response_format.get("json_schema")
        schema = json_schema.get("schema") if isinstance(json_schema, dict) else None
        if isinstance(schema, dict):
            return sample_instance(schema, prompt=prompt)
        # JSON mode carries no schema: use the keys the prompt names in quotes, as a
        # model following "a JSON with 'setup' and 'punchline' keys" would.
        keys = re.findall(r"(?<!\w)['\"]([A-Za-z_][\w-]*)['\"](?!\w)", prompt)
        return {key: f"scripted {key}" for key in dict.fromkeys(keys)} or {"answer": "scripted"}

    def _chunks(self, message: AIMessage) -> Iterator[ChatGenerationChunk]:
        text = message.content if isinstance(message.content, str) else ""
        for piece in re.findall(r"\s*\S+\s*", text) if text.strip() else ([text] if text else []):
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
        for index, call in enumerate(message.tool_calls):
            arguments = json.dumps(call["args"], ensure_ascii=False)
            middle = len(arguments) // 2
            # Split the arguments so consumers exercise tool-call chunk merging.
            yield ChatGenerationChunk(
                message=AIMessageChunk(
                    content="",
                    tool_call_chunks=[
                        tool_call_chunk(
                            name=call["name"], args=arguments[:middle], id=call["id"], index=index
                        )
                    ],
                )
            )
            yield ChatGenerationChunk(
                message=AIMessageChunk(
                    content="",
                    tool_call_chunks=[tool_call_chunk(args=arguments[middle:], index=index)],
                )
            )
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                usage_metadata=message.usage_metadata,
                response_metadata=message.response_metadata,
                chunk_position="last",
            )
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(
            generations=[ChatGeneration(message=self._answer(messages, stop, **kwargs))]
        )

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._generate(messages, stop, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        yield from self._chunks(self._answer(messages, stop, **kwargs))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in self._chunks(self._answer(messages, stop, **kwargs)):
            await asyncio.sleep(0)
            yield chunk


# -- the failing model ----------------------------------------------------------------


class FailingChatModel(HasFakeFaults, BaseChatModel):
    """A chat model that always fails, the way providers fail.

    Every call raises a fresh copy of ``error`` (default [`rate_limit_error`][], an
    HTTP 429): same type, message and attributes, with a traceback of its own, so
    thousands of failing calls keep nothing alive;
    [`last_error`][llm_resilience.testing.HasFakeFaults.last_error] is the copy the latest call
    raised. Before raising it can hang for ``hang_seconds``, which `release()` ends early (a
    cancellation too, for async calls), and a stream first yields ``chunks_before_error`` chunks of
    text. ``bind_tools`` and ``with_structured_output`` bind nothing useful but succeed, so the
    model can be the primary of a chain with tools bound. `calls` counts the requests that reached
    it (invoke or stream); counting, hangs and copies are the core's
    `llm_resilience.testing.FakeFaults`.

    Examples:
        >>> FailingChatModel(chunks_before_error=2).calls
        0
    """

    model_config = ConfigDict(populate_by_name=True)

    model_name: str = Field(default="failing-chat", alias="model")
    error: BaseException = Field(default_factory=rate_limit_error)
    """Copied and raised by every call."""
    hang_seconds: float | None = None
    """Seconds to stall before raising (after any streamed chunks)."""
    chunks_before_error: int = 0
    """Chunks a stream yields before it stalls or raises."""

    _faults: FakeFaults = PrivateAttr(default_factory=FakeFaults)

    @property
    def _llm_type(self) -> str:
        return "failing-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name}

    def bind_tools(
        self,
        tools: Sequence[ToolLike],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Accept tools like a real model (so bad tool definitions still fail here)."""
        formatted = [convert_to_openai_tool(tool) for tool in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=formatted, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self._faults.count()
        self._faults.hang(self.hang_seconds)
        raise self._faults.failure(self.error)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self._faults.count()
        await self._faults.ahang(self.hang_seconds)
        raise self._faults.failure(self.error)

    def _partial(self, index: int) -> ChatGenerationChunk:
        return ChatGenerationChunk(message=AIMessageChunk(content=f"partial-{index} "))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        self._faults.count()
        for index in range(self.chunks_before_error):
            yield self._partial(index)
        self._faults.hang(self.hang_seconds)
        raise self._faults.failure(self.error)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        self._faults.count()
        for index in range(self.chunks_before_error):
            await asyncio.sleep(0)
            yield self._partial(index)
        await self._faults.ahang(self.hang_seconds)
        raise self._faults.failure(self.error)


class RestartEvents(BaseCallbackHandler):
    """Collects each stream restart a fallback chain reports, as its event dict.

    Examples:
        >>> from langchain_llm_resilience import FallbackChatModel
        >>> primary = FailingChatModel(chunks_before_error=1)
        >>> chain = FallbackChatModel(models=[primary, ScriptedChatModel()])
        >>> restarts = RestartEvents()
        >>> text = "".join(c.text for c in chain.stream("Hi", config={"callbacks": [restarts]}))
        >>> [(e["failed_client"], e["next_client"]) for e in restarts.events]
        [(0, 1)]
    """

    def __init__(self) -> None:
        #: The ``llm_resilience.stream_restart`` event dicts received, in order.
        self.events: list[dict[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        if name == STREAM_RESTART_EVENT:
            self.events.append(data)
