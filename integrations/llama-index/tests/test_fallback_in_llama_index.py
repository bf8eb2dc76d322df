"""FallbackLLM inside LlamaIndex: agents, query engines, structured output, real OpenAI LLMs.

The OpenAI members talk to an in-process ``httpx.MockTransport``: no network.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.callbacks import CallbackManager, CBEventType
from llama_index.core.callbacks.base_handler import BaseCallbackHandler
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.resilience import SERVED_BY_KEY, FallbackLLM
from llama_index.resilience.testing import FakeFunctionCallingLLM, rate_limit_error
from pydantic import BaseModel

openai_llms = pytest.importorskip("llama_index.llms.openai")

QUESTION = [ChatMessage(role=MessageRole.USER, content="What is 6 times 7?")]


# -- agents -------------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False])
async def test_a_function_agent_calls_its_tool_and_answers_while_the_primary_fails(
    streaming: bool,
) -> None:
    multiplied: list[tuple[int, int]] = []

    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        multiplied.append((a, b))
        return a * b

    call = ToolSelection(tool_id="call_1", tool_name="multiply", tool_kwargs={"a": 6, "b": 7})
    primary = FakeFunctionCallingLLM(tool_call=call, error=rate_limit_error())
    secondary = FakeFunctionCallingLLM(tool_call=call, text="6 times 7 is 42.")
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(fn=multiply)],
        llm=FallbackLLM(llms=[primary, secondary]),
        streaming=streaming,
    )

    result = await agent.run("What is 6 times 7?")

    assert multiplied == [(6, 7)]
    assert result.response.content == "6 times 7 is 42."
    assert (primary.calls, secondary.calls) == (2, 2)


# -- query engines ------------------------------------------------------------------------


@pytest.fixture
def index_with_fallback() -> Iterator[tuple[VectorStoreIndex, FakeFunctionCallingLLM]]:
    previous_llm, previous_embed = Settings._llm, Settings._embed_model
    primary = FakeFunctionCallingLLM(model_name="primary", error=rate_limit_error())
    secondary = FakeFunctionCallingLLM(model_name="secondary", text="Paris is the capital.")
    Settings.llm = FallbackLLM(llms=[primary, secondary])
    Settings.embed_model = MockEmbedding(embed_dim=8)
    try:
        index = VectorStoreIndex.from_documents([Document(text="Paris is in France.")])
        yield index, secondary
    finally:
        Settings._llm, Settings._embed_model = previous_llm, previous_embed


def test_a_query_engine_answers_through_the_fallback(
    index_with_fallback: tuple[VectorStoreIndex, FakeFunctionCallingLLM],
) -> None:
    index, secondary = index_with_fallback

    response = index.as_query_engine().query("What is the capital of France?")

    assert str(response) == "Paris is the capital."
    assert secondary.calls == 1


async def test_an_async_query_engine_answers_through_the_fallback(
    index_with_fallback: tuple[VectorStoreIndex, FakeFunctionCallingLLM],
) -> None:
    index, _ = index_with_fallback

    response = await index.as_query_engine().aquery("What is the capital of France?")

    assert str(response) == "Paris is the capital."


def test_a_streaming_query_engine_answers_through_the_fallback(
    index_with_fallback: tuple[VectorStoreIndex, FakeFunctionCallingLLM],
) -> None:
    index, _ = index_with_fallback

    response = index.as_query_engine(streaming=True).query("What is the capital of France?")

    assert "".join(response.response_gen) == "Paris is the capital."


# -- structured output ------------------------------------------------------------------


class Capital(BaseModel):
    """A country's capital city."""

    city: str


def capital_fakes() -> tuple[FakeFunctionCallingLLM, FakeFunctionCallingLLM]:
    call = ToolSelection(tool_id="call_1", tool_name="Capital", tool_kwargs={"city": "Paris"})
    return (
        FakeFunctionCallingLLM(tool_call=call, error=rate_limit_error()),
        FakeFunctionCallingLLM(tool_call=call),
    )


def test_structured_predict_returns_the_model_while_the_primary_fails() -> None:
    primary, secondary = capital_fakes()
    llm = FallbackLLM(llms=[primary, secondary])

    capital = llm.structured_predict(
        Capital, PromptTemplate("Capital of {country}?"), country="France"
    )

    assert capital == Capital(city="Paris")
    assert secondary.tool_call_parses == 1


async def test_async_structured_predict_returns_the_model_while_the_primary_fails() -> None:
    primary, secondary = capital_fakes()
    llm = FallbackLLM(llms=[primary, secondary])

    capital = await llm.astructured_predict(
        Capital, PromptTemplate("Capital of {country}?"), country="France"
    )

    assert capital == Capital(city="Paris")


# -- real OpenAI members over a mock transport ------------------------------------------


class OpenAIServer:
    """An in-process Chat Completions endpoint: one scripted reply for every request."""

    def __init__(self, status: int = 200, **reply: Any) -> None:
        self.status = status
        self.reply = reply
        self.requests: list[dict[str, Any]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        if self.status != 200:
            error = {"message": "Rate limit reached", "type": "requests", "code": "rate_limit"}
            return httpx.Response(self.status, json={"error": error})
        if body.get("stream"):
            return httpx.Response(200, content=self._events(), headers=_SSE)
        return httpx.Response(200, json=self._completion())

    def _completion(self) -> dict[str, Any]:
        message = {"role": "assistant", "content": self.reply.get("content")}
        if "tool_calls" in self.reply:
            message["tool_calls"] = self.reply["tool_calls"]
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
        }

    def _events(self) -> bytes:
        words = self.reply["content"].split(" ")
        deltas = [{"role": "assistant", "content": words[0]}]
        deltas += [{"content": " " + word} for word in words[1:]]
        lines = [
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "gpt-4o-mini",
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
            for delta in deltas
        ]
        data = "".join(f"data: {json.dumps(line)}\n\n" for line in lines)
        return (data + "data: [DONE]\n\n").encode()

    def llm(self, **options: Any) -> Any:
        return openai_llms.OpenAI(
            model="gpt-4o-mini",
            api_key="sk-test",
            max_retries=options.pop("max_retries", 0),
            http_client=httpx.Client(transport=httpx.MockTransport(self.handle)),
            async_http_client=httpx.AsyncClient(transport=httpx.MockTransport(self.handle)),
            **options,
        )


_SSE = {"content-type": "text/event-stream"}


class Recorder(BaseEventHandler):
    events: list[BaseEvent] = []

    @classmethod
    def class_name(cls) -> str:
        return "Recorder"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        self.events.append(event)


class LLMEvents(BaseCallbackHandler):
    def __init__(self) -> None:
        super().__init__(event_starts_to_ignore=[], event_ends_to_ignore=[])
        self.pairs: list[str] = []

    def on_event_start(self, event_type: CBEventType, *args: Any, **kwargs: Any) -> str:
        if event_type == CBEventType.LLM:
            self.pairs.append("start")
        return kwargs.get("event_id", "")

    def on_event_end(self, event_type: CBEventType, *args: Any, **kwargs: Any) -> None:
        if event_type == CBEventType.LLM:
            self.pairs.append("end")

    def start_trace(self, trace_id: str | None = None) -> None:
        return None

    def end_trace(self, trace_id: str | None = None, trace_map: Any = None) -> None:
        return None


@pytest.fixture
def recorded() -> Iterator[Recorder]:
    handler = Recorder(events=[])
    get_dispatcher().add_event_handler(handler)
    yield handler
    get_dispatcher().event_handlers.remove(handler)


Run = Callable[[Any], Any]


async def _achat(llm: Any) -> str:
    return str((await llm.achat(QUESTION)).message.content)


async def _astream(llm: Any) -> str:
    return "".join([chunk.delta or "" async for chunk in await llm.astream_chat(QUESTION)])


async def _stream(llm: Any) -> str:
    return "".join(chunk.delta or "" for chunk in llm.stream_chat(QUESTION))


async def _chat(llm: Any) -> str:
    return str(llm.chat(QUESTION).message.content)


@pytest.mark.parametrize("run", [_chat, _achat, _stream, _astream])
async def test_real_openai_members_fail_over_with_one_event_pair_per_call(
    run: Callable[[Any], Any], recorded: Recorder
) -> None:
    limited, healthy = OpenAIServer(status=429), OpenAIServer(content="It is 42")
    events = LLMEvents()
    manager = CallbackManager([events])
    llm = FallbackLLM(
        llms=[limited.llm(callback_manager=manager), healthy.llm(callback_manager=manager)],
        callback_manager=manager,
    )

    assert await run(llm) == "It is 42"

    assert (len(limited.requests), len(healthy.requests)) == (1, 1)
    assert events.pairs == ["start", "end"]
    names = [event.class_name() for event in recorded.events]
    assert names.count("LLMChatStartEvent") == names.count("LLMChatEndEvent") == 1


def test_a_real_openai_member_gets_its_own_tool_schema_and_parses_its_own_tool_calls() -> None:
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    tool_call = {
        "id": "call_9",
        "type": "function",
        "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'},
    }
    server = OpenAIServer(content=None, tool_calls=[tool_call])
    primary = FakeFunctionCallingLLM(error=rate_limit_error())
    llm = FallbackLLM(llms=[primary, server.llm()])

    response = llm.chat_with_tools([FunctionTool.from_defaults(fn=multiply)], user_msg="6x7?")
    calls = llm.get_tool_calls_from_response(response)

    sent = server.requests[0]
    assert sent["tools"][0]["function"]["name"] == "multiply"
    assert sent["messages"] == [{"role": "user", "content": "6x7?"}]
    assert response.additional_kwargs[SERVED_BY_KEY] == [1]
    assert [(c.tool_id, c.tool_name, c.tool_kwargs) for c in calls] == [
        ("call_9", "multiply", {"a": 6, "b": 7})
    ]


def test_an_openai_member_left_at_its_default_retries_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = OpenAIServer(content="hi")

    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        FallbackLLM(llms=[server.llm(max_retries=3), FakeFunctionCallingLLM()])

    assert "OpenAI(gpt-4o-mini), retries by itself (max_retries=3)" in caplog.text
