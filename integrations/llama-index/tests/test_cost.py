"""CostTrackedLLM and CostTrackedEmbedding: gate before, record once after, offline."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import openai
import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.resilience import (
    CostTrackedEmbedding,
    CostTrackedLLM,
    FallbackLLM,
    RateLimitedLLM,
)
from llama_index.resilience.testing import FakeFunctionCallingLLM, rate_limit_error
from pydantic import BaseModel, Field, PrivateAttr

from llm_resilience import BudgetExceededError, CostBudget
from llm_resilience.budget import ModelPrice
from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry, SqlCostLedger
from llm_resilience.testing import FaultInjectingServer
from llm_resilience.tokens import count_message_tokens, count_tokens

CHAT = ["chat", "achat", "stream_chat", "astream_chat"]
COMPLETE = ["complete", "acomplete", "stream_complete", "astream_complete"]
EVERY_METHOD = CHAT + COMPLETE
QUESTION = "What is the capital of France?"
MESSAGES = [ChatMessage(role=MessageRole.USER, content=QUESTION)]
PROMPT = [("user", QUESTION)]
# One token in and out costs 1 and 2 millionths: costs stay readable.
BUDGET = CostBudget(input_price_per_mtok=1, output_price_per_mtok=2, daily_limit=10)
KILL_SWITCH = CostBudget(input_price_per_mtok=1, output_price_per_mtok=2, daily_limit=0)


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


def tracked(inner: Any, budget: CostBudget = BUDGET, **options: Any) -> CostTrackedLLM:
    return CostTrackedLLM(inner=inner, budget=budget, ledger=InMemoryCostLedger(), **options)


def entries(layer: Any) -> list[LedgerEntry]:
    return list(layer.ledger.entries())


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


class ScriptedLLM(FakeFunctionCallingLLM):
    """Answers every chat with ``reply``, or streams ``chunks``, and records its kwargs."""

    reply: ChatResponse | None = None
    chunks: list[ChatResponse] = Field(default_factory=list)
    _kwargs_seen: list[dict[str, Any]] = PrivateAttr(default_factory=list)

    @property
    def kwargs_seen(self) -> list[dict[str, Any]]:
        return self._kwargs_seen

    def _chat_response(self, messages: Any, kwargs: dict[str, Any]) -> ChatResponse:
        self._kwargs_seen.append(dict(kwargs))
        return self.reply or super()._chat_response(messages, kwargs)

    def _chat_chunks(self, messages: Any, kwargs: dict[str, Any]) -> Iterator[ChatResponse]:
        self._kwargs_seen.append(dict(kwargs))
        return iter(self.chunks) if self.chunks else super()._chat_chunks(messages, kwargs)


class NoModelFake(FakeFunctionCallingLLM):
    """Reports usage but not the model in ``raw``, as some integrations do."""

    def _raw(self, usage: dict[str, int] | None) -> dict[str, Any]:
        return {"usage": usage} if usage is not None else {}


def answer(content: str = "Paris.", **fields: Any) -> ChatResponse:
    message_kwargs = fields.pop("message_kwargs", {})
    message = ChatMessage(
        role=MessageRole.ASSISTANT, content=content, additional_kwargs=message_kwargs
    )
    return ChatResponse(message=message, **fields)


# -- gate before, record once after ------------------------------------------------------


# The chat shapes of these are in tests/behaviour/test_cost.py, for both adapters.


@pytest.mark.parametrize("method", COMPLETE)
async def test_every_completion_shape_is_recorded_once_with_the_reported_usage(method: str) -> None:
    inner = FakeFunctionCallingLLM(model_name="gpt-4o")
    llm = tracked(inner)

    await call(llm, method)

    [entry] = entries(llm)
    # FakeFunctionCallingLLM reports words: 6 in the question, 4 in its answer.
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == (6, 4, False)
    assert (entry.kind, entry.surface, entry.model, entry.scope) == ("chat", "chat", "gpt-4o", None)
    assert entry.cost == Decimal("0.000014")
    assert inner.calls == 1


@pytest.mark.parametrize("method", COMPLETE)
async def test_a_spent_budget_raises_before_the_inner_completion_call(method: str) -> None:
    inner = FakeFunctionCallingLLM()
    llm = tracked(inner, budget=CostBudget(daily_limit=1))
    llm.ledger.record(LedgerEntry(datetime.now(UTC), "chat", cost=Decimal(1)))

    with pytest.raises(BudgetExceededError) as refused:
        await call(llm, method)

    assert (refused.value.window, refused.value.limit, refused.value.spend) == (
        "day",
        Decimal(1),
        Decimal(1),
    )
    assert inner.calls == 0
    assert len(entries(llm)) == 1


@pytest.mark.parametrize("method", COMPLETE)
async def test_a_kill_switch_refuses_every_completion_shape(method: str) -> None:
    inner = FakeFunctionCallingLLM()

    with pytest.raises(BudgetExceededError):
        await call(tracked(inner, budget=KILL_SWITCH), method)

    assert inner.calls == 0


@pytest.mark.parametrize("method", EVERY_METHOD)
async def test_one_call_still_emits_exactly_one_llm_event_pair(
    method: str, recorder: EventRecorder
) -> None:
    debug = LlamaDebugHandler()
    llm = tracked(FakeFunctionCallingLLM(), callback_manager=CallbackManager([debug]))

    await call(llm, method)

    kind = "Chat" if "chat" in method else "Completion"
    assert recorder.count(f"LLM{kind}StartEvent") == recorder.count(f"LLM{kind}EndEvent") == 1
    assert len(debug.get_event_pairs(CBEventType.LLM)) == 1


@pytest.mark.parametrize("method", ["achat", "acomplete"])
async def test_a_failed_call_records_nothing(method: str) -> None:
    llm = tracked(FakeFunctionCallingLLM(error=rate_limit_error()))

    with pytest.raises(openai.RateLimitError, match="429"):
        await call(llm, method)

    assert entries(llm) == []


async def test_a_cancelled_call_records_nothing() -> None:
    inner = FakeFunctionCallingLLM(hang_seconds=5)
    llm = tracked(inner)
    task = asyncio.create_task(llm.achat(MESSAGES))
    for _ in range(1000):  # until the inner LLM has the request
        if inner.calls:
            break
        await asyncio.sleep(0.001)
    assert inner.calls == 1

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    inner.release()
    assert entries(llm) == []


# -- streams -------------------------------------------------------------------------------


STRICT = CostBudget(input_price_per_mtok=1, output_price_per_mtok=2, daily_limit=10, strict=True)


def sql_tracked(tmp_path: Path, inner: Any, budget: CostBudget = BUDGET) -> CostTrackedLLM:
    ledger = SqlCostLedger("sqlite:///" + str(tmp_path / "spend.db"))
    return CostTrackedLLM(inner=inner, budget=budget, ledger=ledger)


async def recorded(layer: Any, count: int) -> list[LedgerEntry]:
    """The layer's entries once there are ``count`` (within 5 s): asyncio closes an
    abandoned async stream in a task of its own, a moment after the consumer let go."""
    deadline = time.monotonic() + 5
    # Polled: a ledger has no event to wait on.
    while len(found := entries(layer)) < count and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    return found


def consumed(deltas: list[str]) -> tuple[int, int, bool]:
    """What a stream closed after ``deltas`` consumed, estimated (the fake reports its
    usage only with its last chunk)."""
    return count_message_tokens(PROMPT), count_tokens("".join(deltas)), True


def request(method: str) -> Any:
    return MESSAGES if "chat" in method else QUESTION


# The chat streams' early close, collection and cancellation, and a loop of real OpenAI
# streams, are in tests/behaviour/test_cost_streams.py, for both adapters.


@pytest.mark.parametrize("method", ["stream_complete"])
def test_an_early_closed_completion_stream_records_what_it_consumed_and_settles_its_hold(
    method: str, tmp_path: Path
) -> None:
    llm = sql_tracked(tmp_path, FakeFunctionCallingLLM(model_name="fake-1"), budget=STRICT)
    deltas = []
    for chunk in getattr(llm, method)(request(method)):
        deltas.append(chunk.delta)
        if len(deltas) == 2:
            break

    [entry] = entries(llm)
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == consumed(deltas)
    assert entry.model == "fake-1"
    assert llm.ledger.spend("day") == entry.cost  # the strict-mode hold became the entry


@pytest.mark.parametrize("method", ["astream_complete"])
async def test_an_async_completion_stream_closed_with_aclose_records_what_it_consumed(
    method: str, tmp_path: Path
) -> None:
    llm = sql_tracked(tmp_path, FakeFunctionCallingLLM(), budget=STRICT)
    stream = await getattr(llm, method)(request(method))

    first = (await stream.__anext__()).delta
    await stream.aclose()

    [entry] = await recorded(llm, 1)
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == consumed([first])
    assert llm.ledger.spend("day") == entry.cost


def test_a_stream_whose_usage_came_before_its_text_is_not_undercounted_when_closed_early(
    tmp_path: Path,
) -> None:
    # llama-index-llms-anthropic repeats message_start's usage (output: 1) on every chunk
    # until the last one brings the real output count.
    start = {"usage": {"input_tokens": 11, "output_tokens": 1}}
    words = ["Paris", " is", " the", " capital", " of", " France."]
    chunks = [
        answer("".join(words[: i + 1]), delta=word, message_kwargs=start)
        for i, word in enumerate(words)
    ]
    llm = sql_tracked(tmp_path, ScriptedLLM(chunks=chunks))
    stream = llm.stream_chat(MESSAGES)
    for _ in range(3):
        next(stream)
    stream.close()

    [entry] = entries(llm)
    # The input as reported; the output at least one token per delivered chunk.
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == (11, 3, True)


@pytest.mark.parametrize("method", ["stream_complete"])
async def test_a_completion_stream_failing_mid_way_records_nothing(method: str) -> None:
    llm = tracked(FakeFunctionCallingLLM(error=rate_limit_error(), fail_after_chunks=2))

    with pytest.raises(openai.RateLimitError, match="429"):
        await call(llm, method)

    assert entries(llm) == []


def test_a_stream_without_usage_is_estimated_from_the_accumulated_text() -> None:
    # Chunks carrying only their own delta (not the text so far), and no usage.
    chunks = [answer("Par", delta="Par"), answer("is.", delta="is.")]
    llm = tracked(ScriptedLLM(chunks=chunks))

    list(llm.stream_chat(MESSAGES))

    [entry] = entries(llm)
    assert entry.estimated is True
    assert (entry.input_tokens, entry.output_tokens) == (
        count_message_tokens(PROMPT),
        count_tokens("Paris."),
    )


def test_a_stream_reporting_usage_in_pieces_is_recorded_as_reported() -> None:
    # Anthropic-shaped: input in the first event, the final output count in the last.
    chunks = [
        answer(
            "Par",
            delta="Par",
            raw={"model": "claude-sonnet-4-5", "usage": {"input_tokens": 11, "output_tokens": 1}},
        ),
        answer("Paris.", delta="is.", raw={}),
        answer("Paris.", delta="", raw={"usage": {"output_tokens": 5}}),
    ]
    llm = tracked(ScriptedLLM(chunks=chunks))

    list(llm.stream_chat(MESSAGES))

    [entry] = entries(llm)
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == (11, 5, False)
    assert entry.model == "claude-sonnet-4-5"


# -- usage shapes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            answer(
                raw={
                    "model": "gpt-4o-2024-08-06",
                    "usage": {"prompt_tokens": 7, "completion_tokens": 3},
                }
            ),
            (7, 3, False),
        ),
        (
            answer(
                raw=SimpleNamespace(usage=SimpleNamespace(prompt_tokens=7, completion_tokens=3))
            ),
            (7, 3, False),
        ),
        (answer(additional_kwargs={"prompt_tokens": 7, "completion_tokens": 3}), (7, 3, False)),
        (
            answer(raw={"usage": SimpleNamespace(input_tokens=11, output_tokens=5)}),
            (11, 5, False),
        ),
        (
            answer(message_kwargs={"usage": {"input_tokens": 11, "output_tokens": 5}}),
            (11, 5, False),
        ),
        (answer(additional_kwargs={"prompt_tokens": 0, "completion_tokens": 3}), None),
        (answer(additional_kwargs={"completion_tokens": 3}), None),
        (answer(), None),
    ],
    ids=[
        "openai-raw-dict",
        "openai-raw-object",
        "openai-additional-kwargs",
        "anthropic-raw",
        "anthropic-message-kwargs",
        "zero-input-is-not-a-report",
        "one-count-is-not-a-report",
        "no-usage",
    ],
)
def test_usage_is_read_from_every_shape_or_else_estimated(
    reply: ChatResponse, expected: tuple[int, int, bool] | None
) -> None:
    llm = tracked(ScriptedLLM(reply=reply))

    llm.chat(MESSAGES)

    [entry] = entries(llm)
    if expected is None:
        expected = (count_message_tokens(PROMPT), count_tokens("Paris."), True)
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == expected


def test_a_tool_call_answer_without_usage_estimates_its_arguments_as_output() -> None:
    call_ = {"id": "c1", "name": "lookup", "arguments": {"city": "Paris"}}
    reply = answer("", message_kwargs={"tool_calls": [call_]})
    llm = tracked(ScriptedLLM(reply=reply))

    llm.chat(MESSAGES)

    [entry] = entries(llm)
    assert entry.estimated is True
    assert entry.output_tokens > 0


# -- the model that served -----------------------------------------------------------------


def test_the_providers_reported_model_is_recorded_and_priced() -> None:
    reply = answer(
        raw={
            "model": "gpt-4o-2024-08-06",
            "usage": {"prompt_tokens": 1000, "completion_tokens": 1000},
        }
    )
    budget = CostBudget(daily_limit=10, prices={"gpt-4o": ModelPrice(3, 15)})
    llm = tracked(ScriptedLLM(reply=reply, model_name="gpt-4o"), budget=budget)

    llm.chat(MESSAGES)

    [entry] = entries(llm)
    assert entry.model == "gpt-4o-2024-08-06"
    assert entry.cost == Decimal("0.018")


@pytest.mark.parametrize("method", COMPLETE)
async def test_the_fallback_member_that_served_a_completion_is_recorded_and_priced(
    method: str,
) -> None:
    primary = NoModelFake(model_name="primary", error=rate_limit_error())
    secondary = NoModelFake(model_name="secondary")
    budget = CostBudget(daily_limit=10, prices={"secondary": ModelPrice(1000, 1000)})
    llm = tracked(FallbackLLM(llms=[primary, secondary]), budget=budget)

    await call(llm, method)

    [entry] = entries(llm)
    assert entry.model == "secondary"
    assert entry.cost == Decimal("0.010")  # (6 + 4) tokens at 1000 per million


# -- scopes --------------------------------------------------------------------------------


@pytest.mark.parametrize("method", EVERY_METHOD)
async def test_a_per_call_budget_scope_never_reaches_the_inner_llm(method: str) -> None:
    # That it overrides the layer's scope is in tests/behaviour/test_cost.py.
    inner = ScriptedLLM()
    llm = tracked(inner, scope="tenant-1")

    await call(llm, method)
    await call(llm, method, budget_scope="tenant-2")

    assert all("budget_scope" not in seen for seen in inner.kwargs_seen)


def test_chat_with_tools_takes_a_budget_scope_without_passing_it_on() -> None:
    tool_call = ToolSelection(tool_id="c1", tool_name="lookup", tool_kwargs={"city": "Paris"})
    inner = ScriptedLLM(tool_call=tool_call)
    llm = tracked(inner)
    tool = FunctionTool.from_defaults(fn=lambda city: city, name="lookup")

    response = llm.chat_with_tools([tool], user_msg=QUESTION, budget_scope="tenant-3")

    assert llm.get_tool_calls_from_response(response)[0].tool_name == "lookup"
    assert [entry.scope for entry in entries(llm)] == ["tenant-3"]
    assert inner.kwargs_seen == [{"tools": ["lookup"]}]


# -- pass-through and stacks ---------------------------------------------------------------


class Capital(BaseModel):
    """A country's capital city."""

    city: str


def test_structured_predict_is_recorded_once() -> None:
    tool_call = ToolSelection(tool_id="c1", tool_name="Capital", tool_kwargs={"city": "Paris"})
    inner = FakeFunctionCallingLLM(tool_call=tool_call)
    llm = tracked(inner)

    capital = llm.structured_predict(
        Capital, PromptTemplate("Capital of {country}?"), country="France"
    )

    assert capital == Capital(city="Paris")
    assert inner.tool_call_parses == 1
    assert len(entries(llm)) == 1


class SpyLimiter:
    def __init__(self) -> None:
        self.acquired: list[str] = []

    def acquire(self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat") -> bool:
        self.acquired.append(surface)
        return True

    async def aacquire(
        self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat"
    ) -> bool:
        return self.acquire(num_tokens, blocking=blocking, surface=surface)


@pytest.mark.parametrize("method", EVERY_METHOD)
async def test_a_full_stack_takes_one_permit_records_one_entry_and_emits_one_event_pair(
    method: str, recorder: EventRecorder
) -> None:
    primary = NoModelFake(model_name="primary", error=rate_limit_error())
    secondary = NoModelFake(model_name="secondary")
    chain = FallbackLLM(llms=[primary, secondary])
    limiter = SpyLimiter()
    limited = RateLimitedLLM(inner=chain, limiter=limiter)
    llm = tracked(limited)

    await call(llm, method)

    assert llm.find_layer(CostTrackedLLM) is llm
    assert llm.find_layer(RateLimitedLLM) is limited
    assert llm.find_layer(FallbackLLM) is chain
    assert llm.find_layer(NoModelFake) is primary
    assert limiter.acquired == ["chat"]
    assert [entry.model for entry in entries(llm)] == ["secondary"]
    kind = "Chat" if "chat" in method else "Completion"
    assert recorder.count(f"LLM{kind}StartEvent") == recorder.count(f"LLM{kind}EndEvent") == 1


def test_tool_calls_through_a_full_stack_are_parsed_by_the_member_that_served() -> None:
    tool_call = ToolSelection(tool_id="c1", tool_name="lookup", tool_kwargs={"city": "Paris"})
    primary = FakeFunctionCallingLLM(tool_call=tool_call, error=rate_limit_error())
    secondary = FakeFunctionCallingLLM(tool_call=tool_call, model_name="secondary")
    stack = RateLimitedLLM(inner=FallbackLLM(llms=[primary, secondary]), requests_per_minute=60)
    llm = tracked(stack)
    looked_up: list[str] = []

    def lookup(city: str) -> str:
        """Look a city up."""
        looked_up.append(city)
        return city

    tool = FunctionTool.from_defaults(fn=lookup)

    llm.predict_and_call([tool], user_msg=QUESTION)

    assert looked_up == ["Paris"]
    assert (primary.tool_call_parses, secondary.tool_call_parses) == (0, 1)
    assert [entry.model for entry in entries(llm)] == ["secondary"]


@pytest.fixture
def settings_restored() -> Iterator[None]:
    previous_llm, previous_embed = Settings._llm, Settings._embed_model
    try:
        yield
    finally:
        Settings._llm, Settings._embed_model = previous_llm, previous_embed


@pytest.mark.parametrize("streaming", [False, True])
def test_a_query_engine_on_settings_is_gated_and_recorded(
    settings_restored: None, streaming: bool
) -> None:
    ledger = InMemoryCostLedger()
    budget = CostBudget(1, 2, embedding_price_per_mtok=1, daily_limit=10)
    inner = FakeFunctionCallingLLM(model_name="gpt-4o", text="Paris is the capital.")
    Settings.llm = CostTrackedLLM(inner=inner, budget=budget, ledger=ledger)
    Settings.embed_model = CostTrackedEmbedding(
        inner=MockEmbedding(embed_dim=8), budget=budget, ledger=ledger
    )
    index = VectorStoreIndex.from_documents([Document(text="Paris is in France.")])

    response = index.as_query_engine(streaming=streaming).query(QUESTION)

    text = "".join(response.response_gen) if streaming else str(response)
    assert text == "Paris is the capital."
    kinds = [entry.kind for entry in ledger.entries()]
    assert kinds.count("chat") == inner.calls == 1
    assert kinds.count("embedding") == 2  # the document, then the query


async def test_an_async_query_engine_on_settings_is_gated_and_recorded(
    settings_restored: None,
) -> None:
    ledger = InMemoryCostLedger()
    Settings.llm = CostTrackedLLM(inner=FakeFunctionCallingLLM(), budget=BUDGET, ledger=ledger)
    Settings.embed_model = MockEmbedding(embed_dim=8)
    index = VectorStoreIndex.from_documents([Document(text="Paris is in France.")])

    await index.as_query_engine().aquery(QUESTION)

    assert [entry.kind for entry in ledger.entries()] == ["chat"]


# -- embeddings ----------------------------------------------------------------------------

TEXTS = ["Paris is in France.", "Rome is in Italy.", "Bern", "Oslo", "Kyiv"]


async def embed(model: Any, shape: str) -> None:
    if shape == "query":
        model.get_query_embedding(QUESTION)
    elif shape == "aquery":
        await model.aget_query_embedding(QUESTION)
    elif shape == "text":
        model.get_text_embedding(TEXTS[0])
    elif shape == "atext":
        await model.aget_text_embedding(TEXTS[0])
    elif shape == "batch":
        model.get_text_embedding_batch(TEXTS)
    else:
        await model.aget_text_embedding_batch(TEXTS)


@pytest.mark.parametrize(
    ("shape", "batches"),
    [
        ("query", [[QUESTION]]),
        ("aquery", [[QUESTION]]),
        ("text", [TEXTS[:1]]),
        ("atext", [TEXTS[:1]]),
        ("batch", [TEXTS[:2], TEXTS[2:4], TEXTS[4:]]),
        ("abatch", [TEXTS[:2], TEXTS[2:4], TEXTS[4:]]),
    ],
)
async def test_every_embedding_request_is_recorded_once_as_an_estimate(
    shape: str, batches: list[list[str]]
) -> None:
    inner = MockEmbedding(embed_dim=3, embed_batch_size=2, model_name="text-embedding-3-small")
    model = CostTrackedEmbedding(
        inner=inner,
        budget=CostBudget(embedding_price_per_mtok=1000, daily_limit=10),
        ledger=InMemoryCostLedger(),
        scope="tenant-1",
    )

    await embed(model, shape)

    recorded = entries(model)
    expected = [sum(count_tokens(text) for text in batch) for batch in batches]
    assert [entry.input_tokens for entry in recorded] == expected
    assert all(entry.estimated and entry.output_tokens == 0 for entry in recorded)
    assert {(e.surface, e.model, e.scope) for e in recorded} == {
        ("embedding", "text-embedding-3-small", "tenant-1")
    }
    assert [entry.cost for entry in recorded] == [Decimal(n) / 1000 for n in expected]


# -- options -------------------------------------------------------------------------------

# Bad options of both layers, a nameless embedding model and a spent embeddings budget,
# for both adapters: tests/behaviour/test_cost.py.


def test_a_bad_per_call_budget_scope_is_refused_before_the_inner_call() -> None:
    inner = FakeFunctionCallingLLM()

    with pytest.raises(TypeError, match="budget_scope must be text or None"):
        tracked(inner).chat(MESSAGES, budget_scope=42)

    assert inner.calls == 0


def test_without_a_ledger_the_in_memory_default_is_named_in_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        llm = CostTrackedLLM(inner=FakeFunctionCallingLLM(), budget=BUDGET)

    assert isinstance(llm.ledger, InMemoryCostLedger)
    assert llm.gate.ledger is llm.ledger
    assert any("SqlCostLedger" in record.getMessage() for record in caplog.records)


def test_two_layers_sharing_a_ledger_count_toward_one_budget() -> None:
    ledger = InMemoryCostLedger()
    budget = CostBudget(1_000_000, 1_000_000, daily_limit=10)  # 1 per token
    first = CostTrackedLLM(inner=FakeFunctionCallingLLM(), budget=budget, ledger=ledger)
    second = CostTrackedLLM(inner=FakeFunctionCallingLLM(), budget=budget, ledger=ledger)

    first.chat(MESSAGES)  # 6 + 4 tokens: 10, the whole limit

    with pytest.raises(BudgetExceededError):
        second.chat(MESSAGES)


# -- a real OpenAI client ------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply="Paris is the capital of France.") as running:
        yield running


@pytest.mark.parametrize(
    ("method", "include_usage"),
    [
        ("chat", False),
        ("achat", False),
        ("stream_chat", True),
        ("astream_complete", True),
        ("stream_chat", False),
    ],
)
async def test_a_real_openai_llm_records_its_reported_usage_or_an_estimate(
    server: FaultInjectingServer, method: str, include_usage: bool
) -> None:
    openai_llms = pytest.importorskip("llama_index.llms.openai")
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    inner = openai_llms.OpenAI(
        model="gpt-4o-mini",
        api_base=server.openai_base_url,
        api_key="t",
        max_retries=0,
        additional_kwargs=options,
    )
    llm = tracked(inner)

    # The SDK rejects unknown arguments: budget_scope must not reach it.
    responses = await call(llm, method, budget_scope="tenant-9")

    [entry] = entries(llm)
    assert (entry.model, entry.scope) == ("gpt-4o-mini", "tenant-9")
    reported = [r.raw.usage for r in responses if getattr(r.raw, "usage", None) is not None]
    if reported:
        assert (entry.input_tokens, entry.output_tokens, entry.estimated) == (
            reported[-1].prompt_tokens,
            reported[-1].completion_tokens,
            False,
        )
    else:
        assert "stream" in method
        assert not include_usage
        assert entry.estimated is True
        assert entry.output_tokens == count_tokens("Paris is the capital of France.")


# The strict hold of a fallback whose real members have caps of their own, for both
# adapters: tests/behaviour/test_cost.py.
