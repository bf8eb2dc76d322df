"""RateLimitedLLM and RateLimitedEmbedding: one permit per call, before the call, offline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    MessageRole,
)
from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.llms.mock import MockLLM
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.resilience import FallbackLLM, RateLimitedEmbedding, RateLimitedLLM
from llama_index.resilience.testing import FakeFunctionCallingLLM, rate_limit_error
from pydantic import BaseModel, PrivateAttr

from llm_resilience.errors import RateLimitQueueFullError, RequestExceedsCapacityError
from llm_resilience.ratelimit import TokenBucketRateLimiter
from llm_resilience.testing import FaultInjectingServer
from llm_resilience.usage import estimate_request_tokens

CHAT = ["chat", "achat", "stream_chat", "astream_chat"]
COMPLETE = ["complete", "acomplete", "stream_complete", "astream_complete"]
EVERY_METHOD = CHAT + COMPLETE
QUESTION = "What is the capital of France?"
MESSAGES = [ChatMessage(role=MessageRole.USER, content=QUESTION)]
# FakeFunctionCallingLLM counts words: 6 prompt words, 4 answer words.
REPORTED_TOTAL = 6 + 4


async def call(llm: Any, method: str, **kwargs: Any) -> list[Any]:
    """Run one call shape to the end; return its responses (every chunk for streams)."""
    request: Any = MESSAGES if "chat" in method else QUESTION
    if method in ("chat", "complete"):
        return [getattr(llm, method)(request, **kwargs)]
    if method in ("achat", "acomplete"):
        return [await getattr(llm, method)(request, **kwargs)]
    if method in ("stream_chat", "stream_complete"):
        return list(getattr(llm, method)(request, **kwargs))
    stream = await getattr(llm, method)(request, **kwargs)
    return [chunk async for chunk in stream]


class SpyLimiter:
    """A limiter that grants at once and remembers every permit and reconciliation."""

    def __init__(
        self,
        *,
        tokens_per_minute: int | None = None,
        error: BaseException | None = None,
        watched: FakeFunctionCallingLLM | None = None,
    ) -> None:
        self.tokens_per_minute = tokens_per_minute
        self.error = error
        self.watched = watched
        self.acquired: list[tuple[int, str]] = []
        self.inner_calls_when_acquired: list[int] = []
        self.reconciled: list[tuple[int, int]] = []

    def acquire(self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat") -> bool:
        if self.error is not None:
            raise self.error
        self.acquired.append((num_tokens, surface))
        if self.watched is not None:
            self.inner_calls_when_acquired.append(self.watched.calls)
        return True

    async def aacquire(
        self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat"
    ) -> bool:
        return self.acquire(num_tokens, blocking=blocking, surface=surface)

    def reconcile(self, estimated_tokens: int, actual_tokens: int) -> None:
        self.reconciled.append((estimated_tokens, actual_tokens))


class EventRecorder(BaseEventHandler):
    """Collects every instrumentation event dispatched while it is attached."""

    events: list[BaseEvent] = []

    @classmethod
    def class_name(cls) -> str:
        return "EventRecorder"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        self.events.append(event)

    def count(self, suffix: str) -> int:
        return sum(event.class_name().endswith(suffix) for event in self.events)


@pytest.fixture
def recorder() -> Iterator[EventRecorder]:
    root = get_dispatcher()
    handler = EventRecorder(events=[])
    root.add_event_handler(handler)
    yield handler
    root.event_handlers.remove(handler)


class CountingEmbedding(MockEmbedding):
    """MockEmbedding that counts provider calls (one per query, text or batch)."""

    _requests: int = PrivateAttr(default=0)

    @property
    def requests(self) -> int:
        return self._requests

    def _get_query_embedding(self, query: str) -> list[float]:
        self._requests += 1
        return self._get_vector()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        self._requests += 1
        return self._get_vector()

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embedding(text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        self._requests += 1
        return [self._get_vector() for _ in texts]

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._get_text_embeddings(texts)


def frozen_bucket(**options: Any) -> TokenBucketRateLimiter:
    """A real bucket whose clock never moves: no permit is ever refilled."""
    return TokenBucketRateLimiter(clock=lambda: 0.0, **options)


async def until_queued(limiter: TokenBucketRateLimiter, waiting: int) -> None:
    for _ in range(1000):
        if limiter.queued >= waiting:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("no caller started waiting")


# -- one permit per call ---------------------------------------------------------------


# The chat shapes, and what both adapters share, are in tests/behaviour/test_ratelimit.py.


@pytest.mark.parametrize("method", COMPLETE)
async def test_every_completion_shape_takes_one_permit_before_the_inner_call(method: str) -> None:
    inner = FakeFunctionCallingLLM()
    limiter = SpyLimiter(watched=inner)
    llm = RateLimitedLLM(inner=inner, limiter=limiter)

    responses = await call(llm, method)

    assert limiter.acquired == [(0, "chat")]
    assert limiter.inner_calls_when_acquired == [0]
    assert inner.calls == 1
    last = responses[-1]
    assert (last.message.content if "chat" in method else last.text) == inner.text


@pytest.mark.parametrize("method", EVERY_METHOD)
async def test_one_call_still_emits_exactly_one_llm_event_pair(
    method: str, recorder: EventRecorder
) -> None:
    debug = LlamaDebugHandler()
    llm = RateLimitedLLM(
        inner=FakeFunctionCallingLLM(),
        limiter=SpyLimiter(),
        callback_manager=CallbackManager([debug]),
    )

    await call(llm, method)

    kind = "Chat" if "chat" in method else "Completion"
    assert recorder.count(f"LLM{kind}StartEvent") == 1
    assert recorder.count(f"LLM{kind}EndEvent") == 1
    assert len(debug.get_event_pairs(CBEventType.LLM)) == 1


@pytest.mark.parametrize("method", ["stream_complete"])
def test_a_completion_stream_takes_its_permit_on_first_iteration(method: str) -> None:
    inner = FakeFunctionCallingLLM()
    limiter = SpyLimiter()
    llm = RateLimitedLLM(inner=inner, limiter=limiter)

    stream = getattr(llm, method)(MESSAGES if method == "stream_chat" else QUESTION)
    assert limiter.acquired == []
    next(stream)

    assert limiter.acquired == [(0, "chat")]
    assert inner.calls == 1


@pytest.mark.parametrize("method", ["astream_complete"])
async def test_an_async_completion_stream_takes_its_permit_on_first_iteration(method: str) -> None:
    limiter = SpyLimiter()
    llm = RateLimitedLLM(inner=FakeFunctionCallingLLM(), limiter=limiter)

    stream = await getattr(llm, method)(MESSAGES if method == "astream_chat" else QUESTION)
    assert limiter.acquired == []
    await stream.__anext__()

    assert limiter.acquired == [(0, "chat")]


# -- refusals and cancellation never reach the inner LLM ---------------------------------


@pytest.mark.parametrize("method", COMPLETE)
async def test_a_refused_permit_never_reaches_the_inner_llm_for_a_completion(method: str) -> None:
    inner = FakeFunctionCallingLLM()
    llm = RateLimitedLLM(inner=inner, limiter=SpyLimiter(error=RateLimitQueueFullError(4)))

    with pytest.raises(RateLimitQueueFullError):
        await call(llm, method)

    assert inner.calls == 0


@pytest.mark.parametrize("method", ["acomplete", "astream_complete"])
async def test_cancelling_a_completion_waiting_for_its_permit_never_reaches_the_inner_llm(
    method: str,
) -> None:
    inner = FakeFunctionCallingLLM()
    limiter = frozen_bucket(requests_per_minute=1)
    llm = RateLimitedLLM(inner=inner, limiter=limiter)
    await llm.acomplete(QUESTION)  # the only permit

    waiting = asyncio.create_task(call(llm, method))
    await until_queued(limiter, 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting

    assert inner.calls == 1
    assert limiter.queued == 0


def test_a_call_whose_num_output_outweighs_the_token_budget_fails_at_once() -> None:
    inner = FakeFunctionCallingLLM()
    llm = RateLimitedLLM(inner=inner, requests_per_minute=60, tokens_per_minute=100)

    with pytest.raises(RequestExceedsCapacityError):
        llm.chat(MESSAGES)  # 256 output tokens reserved by the LLM's num_output

    assert inner.calls == 0


# -- token weight and reconciliation -------------------------------------------------------


@pytest.mark.parametrize("method", EVERY_METHOD)
async def test_with_a_token_budget_a_call_weighs_its_prompt_and_num_output_and_is_reconciled(
    method: str,
) -> None:
    limiter = SpyLimiter(tokens_per_minute=100_000)
    llm = RateLimitedLLM(inner=FakeFunctionCallingLLM(num_output=200), limiter=limiter)

    await call(llm, method)

    expected = estimate_request_tokens([("user", QUESTION)], 200)
    assert limiter.acquired == [(expected, "chat")]
    assert limiter.reconciled == [(expected, REPORTED_TOTAL)]


def test_a_calls_max_tokens_caps_its_weight() -> None:
    limiter = SpyLimiter(tokens_per_minute=100_000)
    llm = RateLimitedLLM(inner=FakeFunctionCallingLLM(num_output=200), limiter=limiter)

    llm.chat(MESSAGES, max_tokens=10)

    assert limiter.acquired == [(estimate_request_tokens([("user", QUESTION)], 10), "chat")]


class ZeroInputFake(FakeFunctionCallingLLM):
    """Reports 0 prompt tokens, as some integrations fill a missing count."""

    def _usage(self, prompt: str, answer: str) -> dict[str, int]:
        return {"prompt_tokens": 0, "completion_tokens": 4, "total_tokens": 4}


@pytest.mark.parametrize("method", ["chat", "stream_chat"])
async def test_an_input_count_of_zero_for_a_real_prompt_is_not_reconciled(method: str) -> None:
    limiter = SpyLimiter(tokens_per_minute=100_000)
    llm = RateLimitedLLM(inner=ZeroInputFake(), limiter=limiter)

    await call(llm, method)

    assert len(limiter.acquired) == 1
    assert limiter.reconciled == []


# -- pass-through --------------------------------------------------------------------------


class Capital(BaseModel):
    """A country's capital city."""

    city: str


def test_structured_predict_goes_through_one_permit_and_the_inner_llms_parser() -> None:
    call_ = ToolSelection(tool_id="call_1", tool_name="Capital", tool_kwargs={"city": "Paris"})
    inner = FakeFunctionCallingLLM(tool_call=call_)
    limiter = SpyLimiter()
    llm = RateLimitedLLM(inner=inner, limiter=limiter)

    capital = llm.structured_predict(
        Capital, PromptTemplate("Capital of {country}?"), country="France"
    )

    assert capital == Capital(city="Paris")
    assert inner.tool_call_parses == 1
    assert len(limiter.acquired) == 1


@pytest.mark.parametrize("streaming", [True, False])
async def test_a_function_agent_calls_its_tool_with_one_permit_per_llm_call(
    streaming: bool,
) -> None:
    multiplied: list[tuple[int, int]] = []

    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        multiplied.append((a, b))
        return a * b

    tool_call = ToolSelection(tool_id="c1", tool_name="multiply", tool_kwargs={"a": 6, "b": 7})
    inner = FakeFunctionCallingLLM(tool_call=tool_call, text="6 times 7 is 42.")
    limiter = SpyLimiter()
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(fn=multiply)],
        llm=RateLimitedLLM(inner=inner, limiter=limiter),
        streaming=streaming,
    )

    result = await agent.run("What is 6 times 7?")

    assert multiplied == [(6, 7)]
    assert result.response.content == "6 times 7 is 42."
    assert len(limiter.acquired) == inner.calls == 2


def test_metadata_and_prompt_settings_are_the_inner_llms() -> None:
    inner = FakeFunctionCallingLLM(model_name="gpt-4o", context_window=1234, num_output=99)
    inner.system_prompt = "Be brief."
    llm = RateLimitedLLM(inner=inner, requests_per_minute=60)

    assert llm.metadata == inner.metadata
    assert llm.system_prompt == "Be brief."
    assert llm.inner is inner


def test_the_event_payload_names_the_layer_and_model_and_carries_no_secrets() -> None:
    openai_llms = pytest.importorskip("llama_index.llms.openai")
    inner = openai_llms.OpenAI(model="gpt-4o-mini", api_key="sk-secret-key", max_retries=0)

    payload = RateLimitedLLM(inner=inner, requests_per_minute=60).to_payload()

    assert (payload["class_name"], payload["model_name"]) == ("RateLimitedLLM", "gpt-4o-mini")
    assert "sk-secret-key" not in repr(payload)


@pytest.mark.parametrize("method", COMPLETE)
async def test_over_a_fallback_chain_a_completion_takes_one_permit_however_many_llms_it_tries(
    method: str,
) -> None:
    primary = FakeFunctionCallingLLM(error=rate_limit_error())
    secondary = FakeFunctionCallingLLM(text="Paris.")
    limiter = SpyLimiter()
    llm = RateLimitedLLM(inner=FallbackLLM(llms=[primary, secondary]), limiter=limiter)

    responses = await call(llm, method)

    assert len(limiter.acquired) == 1
    assert (primary.calls, secondary.calls) == (1, 1)
    assert "Paris." in (responses[-1].message.content if "chat" in method else responses[-1].text)


def test_the_inner_llms_own_rate_limiter_still_applies() -> None:
    own = SpyLimiter()
    inner = FakeFunctionCallingLLM(rate_limiter=own)
    RateLimitedLLM(inner=inner, limiter=SpyLimiter()).chat(MESSAGES)

    assert own.acquired == [(0, "chat")]


class ClosingLLM(MockLLM):
    """MockLLM whose four stream shapes yield three words and note when they are closed."""

    _closed: list[str] = PrivateAttr(default_factory=list)

    @property
    def closed(self) -> list[str]:
        return self._closed

    def _words(self, method: str, chat: bool) -> Iterator[Any]:
        try:
            yield from map(_chunk if chat else _completion_chunk, ("a", "b", "c"))
        finally:
            self._closed.append(method)

    async def _awords(self, method: str, chat: bool) -> AsyncIterator[Any]:
        try:
            for word in ("a", "b", "c"):
                yield _chunk(word) if chat else _completion_chunk(word)
        finally:
            self._closed.append(method)

    @llm_chat_callback()
    def stream_chat(self, messages: Any, **kwargs: Any) -> Any:
        return self._words("stream_chat", chat=True)

    @llm_chat_callback()
    async def astream_chat(self, messages: Any, **kwargs: Any) -> Any:
        return self._awords("astream_chat", chat=True)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        return self._words("stream_complete", chat=False)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        return self._awords("astream_complete", chat=False)


def _chunk(word: str) -> ChatResponse:
    return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=word), delta=word)


def _completion_chunk(word: str) -> CompletionResponse:
    return CompletionResponse(text=word, delta=word)


@pytest.mark.parametrize(
    "method", ["stream_chat", "astream_chat", "stream_complete", "astream_complete"]
)
async def test_without_a_token_budget_a_stream_relays_the_inner_chunks_and_closes_the_inner_stream_when_left_early(
    method: str,
) -> None:
    inner = ClosingLLM()
    limiter = SpyLimiter()
    llm = RateLimitedLLM(inner=inner, limiter=limiter)

    direct = await call(inner, method)
    relayed = await call(llm, method)
    assert (
        [chunk.delta for chunk in relayed] == [chunk.delta for chunk in direct] == ["a", "b", "c"]
    )
    assert limiter.acquired == [(0, "chat")]

    request: Any = MESSAGES if "chat" in method else QUESTION
    if method.startswith("a"):
        stream = await getattr(llm, method)(request)
        assert (await anext(stream)).delta == "a"
        await stream.aclose()
        # LlamaIndex's callback does not close the stream it wraps: the loop finalizes it.
        del stream
        for _ in range(5):
            await asyncio.sleep(0)
    else:
        stream = getattr(llm, method)(request)
        assert next(stream).delta == "a"
        stream.close()
    assert inner.closed == [method] * 3
    assert limiter.acquired == [(0, "chat"), (0, "chat")]


# -- embeddings ----------------------------------------------------------------------------

# A refused permit and an inner of the wrong kind, for both adapters and both layers:
# tests/behaviour/test_ratelimit.py.


async def embed(model: Any, shape: str) -> list[list[float]]:
    texts = ["Paris is in France.", "Rome is in Italy.", "Bern", "Oslo", "Kyiv"]
    if shape == "query":
        return [model.get_query_embedding("capital?")]
    if shape == "aquery":
        return [await model.aget_query_embedding("capital?")]
    if shape == "text":
        return [model.get_text_embedding(texts[0])]
    if shape == "atext":
        return [await model.aget_text_embedding(texts[0])]
    if shape == "batch":
        return list(model.get_text_embedding_batch(texts))
    return list(await model.aget_text_embedding_batch(texts))


@pytest.mark.parametrize(
    ("shape", "requests"),
    [("query", 1), ("aquery", 1), ("text", 1), ("atext", 1), ("batch", 3), ("abatch", 3)],
)
async def test_an_embedding_call_takes_one_permit_per_provider_request(
    shape: str, requests: int, recorder: EventRecorder
) -> None:
    inner = CountingEmbedding(embed_dim=3, embed_batch_size=2)
    limiter = SpyLimiter()
    model = RateLimitedEmbedding(inner=inner, limiter=limiter)

    vectors = await embed(model, shape)

    assert all(vector == [0.5, 0.5, 0.5] for vector in vectors)
    assert limiter.acquired == [(0, "embedding")] * requests
    assert inner.requests == requests
    assert recorder.count("EmbeddingStartEvent") == recorder.count("EmbeddingEndEvent") == requests


def test_the_embedding_layer_keeps_the_inner_models_name_and_batch_size() -> None:
    inner = CountingEmbedding(embed_dim=2, model_name="text-embedding-3-small", embed_batch_size=7)
    model = RateLimitedEmbedding(inner=inner, requests_per_minute=60)

    assert (model.model_name, model.embed_batch_size) == ("text-embedding-3-small", 7)
    assert model.find_layer(CountingEmbedding) is inner


# -- a real OpenAI client ------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply="Paris is the capital of France.") as running:
        yield running


@pytest.mark.parametrize("method", ["chat", "astream_chat", "complete", "stream_complete"])
async def test_a_real_openai_llm_is_limited_and_reconciled_with_its_reported_usage(
    server: FaultInjectingServer, method: str
) -> None:
    openai_llms = pytest.importorskip("llama_index.llms.openai")
    inner = openai_llms.OpenAI(
        model="gpt-4o-mini",
        api_base=server.openai_base_url,
        api_key="t",
        max_retries=0,
        additional_kwargs=(
            {"stream_options": {"include_usage": True}} if "stream" in method else {}
        ),
    )
    limiter = SpyLimiter(tokens_per_minute=100_000)
    llm = RateLimitedLLM(inner=inner, limiter=limiter)

    responses = await call(llm, method)

    usage = next(r.raw.usage for r in reversed(responses) if r.raw.usage is not None)
    assert len(server.requests) == 1
    assert len(limiter.acquired) == 1
    assert limiter.reconciled == [(limiter.acquired[0][0], usage.total_tokens)]
