"""FallbackLLM as a LlamaIndex citizen: the ``complete`` shapes, instrumentation events and
callbacks, function calling, metadata and serialisation, offline and fast.

What both adapters share (failover, errors, who served, restarts, per-member time limits,
options) is proven in ``tests/behaviour/test_fallback.py``, for the chat shapes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ImageBlock,
    MessageRole,
    TextBlock,
)
from llama_index.core.callbacks import CallbackManager, CBEventType
from llama_index.core.callbacks.base_handler import BaseCallbackHandler
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.llms import MockLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.tools import FunctionTool
from llama_index.resilience import SERVED_BY_KEY, FallbackLLM, FallbackStreamRestartEvent
from llama_index.resilience.testing import (
    FakeFunctionCallingLLM,
    api_status_error,
    rate_limit_error,
)

from llm_resilience import MemberProfile
from llm_resilience.errors import NoCapableMemberError

CHAT = ["chat", "achat", "stream_chat", "astream_chat"]
COMPLETE = ["complete", "acomplete", "stream_complete", "astream_complete"]
EVERY_METHOD = CHAT + COMPLETE
MESSAGES = [ChatMessage(role=MessageRole.USER, content="What is the capital of France?")]


async def call(llm: Any, method: str) -> tuple[str, list[Any]]:
    """Run one call shape; return the text and the responses (all chunks for streams)."""
    if method in ("chat", "complete"):
        responses = [getattr(llm, method)(MESSAGES if method == "chat" else "Capital?")]
    elif method in ("achat", "acomplete"):
        responses = [await getattr(llm, method)(MESSAGES if method == "achat" else "Capital?")]
    elif method in ("stream_chat", "stream_complete"):
        responses = list(getattr(llm, method)(MESSAGES if method == "stream_chat" else "Capital?"))
    else:
        stream = await getattr(llm, method)(MESSAGES if method == "astream_chat" else "Capital?")
        responses = [chunk async for chunk in stream]
    if method.endswith(("stream_chat", "stream_complete")):
        text = "".join(chunk.delta or "" for chunk in responses)
    elif method.endswith("chat"):
        text = responses[0].message.content
    else:
        text = responses[0].text
    return text, responses


def fakes(**primary: Any) -> tuple[FakeFunctionCallingLLM, FakeFunctionCallingLLM]:
    first = FakeFunctionCallingLLM(model_name="primary", text="from the primary", **primary)
    second = FakeFunctionCallingLLM(model_name="secondary", text="Paris is the capital")
    return first, second


class EventRecorder(BaseEventHandler):
    """Collects every instrumentation event dispatched while it is attached."""

    events: list[BaseEvent] = []

    @classmethod
    def class_name(cls) -> str:
        return "EventRecorder"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        self.events.append(event)

    def named(self, name: str) -> list[BaseEvent]:
        return [event for event in self.events if event.class_name() == name]


@pytest.fixture
def recorder() -> Iterator[EventRecorder]:
    root = get_dispatcher()
    handler = EventRecorder(events=[])
    root.add_event_handler(handler)
    yield handler
    root.event_handlers.remove(handler)


class LLMEventCounter(BaseCallbackHandler):
    """Counts CBEventType.LLM starts and ends on a callback manager."""

    def __init__(self) -> None:
        super().__init__(event_starts_to_ignore=[], event_ends_to_ignore=[])
        self.starts = 0
        self.ends = 0

    def on_event_start(
        self,
        event_type: CBEventType,
        payload: dict[str, Any] | None = None,
        event_id: str = "",
        parent_id: str = "",
        **kwargs: Any,
    ) -> str:
        self.starts += event_type == CBEventType.LLM
        return event_id

    def on_event_end(
        self,
        event_type: CBEventType,
        payload: dict[str, Any] | None = None,
        event_id: str = "",
        **kwargs: Any,
    ) -> None:
        self.ends += event_type == CBEventType.LLM

    def start_trace(self, trace_id: str | None = None) -> None:
        return None

    def end_trace(
        self, trace_id: str | None = None, trace_map: dict[str, list[str]] | None = None
    ) -> None:
        return None


# -- failover on every call shape ------------------------------------------------------


# The chat shapes of these are in tests/behaviour/test_fallback.py, for both adapters.


@pytest.mark.parametrize("method", COMPLETE)
async def test_every_call_shape_fails_over_from_a_rate_limited_primary(method: str) -> None:
    primary, secondary = fakes(error=rate_limit_error())
    llm = FallbackLLM(llms=[primary, secondary])

    text, responses = await call(llm, method)

    assert text == "Paris is the capital"
    assert (primary.calls, secondary.calls) == (1, 1)
    assert all(response.additional_kwargs[SERVED_BY_KEY] == [1] for response in responses)


@pytest.mark.parametrize("method", COMPLETE)
async def test_a_non_transient_error_propagates_without_trying_the_next_llm(method: str) -> None:
    bad_request = api_status_error(400, "Error code: 400 - invalid model")
    primary, secondary = fakes(error=bad_request)
    llm = FallbackLLM(llms=[primary, secondary])

    with pytest.raises(type(bad_request)) as raised:
        await call(llm, method)

    assert raised.value is primary.last_error
    assert str(raised.value) == str(bad_request)
    assert secondary.calls == 0


async def test_usage_reported_by_the_serving_llm_is_kept() -> None:
    primary, secondary = fakes(error=rate_limit_error())

    response = FallbackLLM(llms=[primary, secondary]).chat(MESSAGES)

    assert response.raw["model"] == "secondary"
    assert response.additional_kwargs["completion_tokens"] == 4
    assert response.raw["usage"]["total_tokens"] == response.additional_kwargs["total_tokens"]


# -- timeouts ---------------------------------------------------------------------------


# -- streaming --------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["stream_complete"])
def test_a_stream_starts_no_request_until_it_is_iterated(method: str) -> None:
    primary, secondary = fakes()
    llm = FallbackLLM(llms=[primary, secondary])

    stream = getattr(llm, method)(MESSAGES if method == "stream_chat" else "Capital?")
    assert primary.calls == 0

    next(stream)
    assert primary.calls == 1


@pytest.mark.parametrize("method", ["stream_complete", "astream_complete"])
async def test_a_stream_cut_mid_way_restarts_on_the_next_llm_and_emits_a_restart_event(
    method: str, recorder: EventRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    primary, secondary = fakes(error=rate_limit_error(), fail_after_chunks=2)
    llm = FallbackLLM(llms=[primary, secondary])

    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        text, _ = await call(llm, method)

    # The primary's two chunks stay yielded; the secondary restarts from the beginning.
    assert text == "from the" + "Paris is the capital"
    restarts = recorder.named("FallbackStreamRestartEvent")
    assert len(restarts) == 1
    restart = restarts[0]
    assert isinstance(restart, FallbackStreamRestartEvent)
    assert (restart.failed_client, restart.next_client, restart.chunks) == (0, 1, 2)
    assert restart.error_type == "RateLimitError"
    assert "Streaming client 0 failed mid-stream after 2 token(s)" in caplog.text


async def test_a_usage_only_chunk_is_not_counted_as_a_token_in_the_restart(
    recorder: EventRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    # "from the primary" streams 3 word chunks and then an empty chunk with the usage.
    primary, secondary = fakes(error=rate_limit_error(), fail_after_chunks=4)

    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        await call(FallbackLLM(llms=[primary, secondary]), "stream_chat")

    restart = recorder.named("FallbackStreamRestartEvent")[0]
    assert isinstance(restart, FallbackStreamRestartEvent)
    assert restart.chunks == 3
    assert "after 3 token(s)" in caplog.text


# -- one event pair per call ------------------------------------------------------------


@pytest.mark.parametrize("method", EVERY_METHOD)
async def test_one_call_emits_exactly_one_llm_event_pair_although_the_primary_failed(
    method: str, recorder: EventRecorder
) -> None:
    counter = LLMEventCounter()
    manager = CallbackManager([counter])
    # The members report to the same handler: any event of theirs would be counted.
    primary = FakeFunctionCallingLLM(error=rate_limit_error(), callback_manager=manager)
    secondary = FakeFunctionCallingLLM(callback_manager=manager)
    llm = FallbackLLM(llms=[primary, secondary], callback_manager=manager)

    await call(llm, method)

    kind = "Chat" if method in CHAT else "Completion"
    assert (counter.starts, counter.ends) == (1, 1)
    assert len(recorder.named(f"LLM{kind}StartEvent")) == 1
    assert len(recorder.named(f"LLM{kind}EndEvent")) == 1
    start = recorder.named(f"LLM{kind}StartEvent")[0]
    assert start.model_dict["class_name"] == "FallbackLLM"


def test_a_nested_fallback_adds_no_events_of_its_own(recorder: EventRecorder) -> None:
    counter = LLMEventCounter()
    manager = CallbackManager([counter])
    failing = FakeFunctionCallingLLM(error=rate_limit_error(), callback_manager=manager)
    inner = FallbackLLM(llms=[failing, FakeFunctionCallingLLM()], callback_manager=manager)
    outer = FallbackLLM(llms=[inner, FakeFunctionCallingLLM()], callback_manager=manager)

    response = outer.chat(MESSAGES)

    assert response.additional_kwargs[SERVED_BY_KEY] == [0, 1]
    assert (counter.starts, counter.ends) == (1, 1)
    assert len(recorder.named("LLMChatStartEvent")) == 1


def test_the_start_event_of_a_tool_call_serialises_to_json(recorder: EventRecorder) -> None:
    primary, secondary = fakes(error=rate_limit_error())

    FallbackLLM(llms=[primary, secondary]).chat_with_tools([MULTIPLY], user_msg="6 times 7?")

    start = recorder.named("LLMChatStartEvent")[0]
    assert '"tools":["multiply"]' in start.model_dump_json()


async def test_a_member_used_on_its_own_still_emits_its_events(recorder: EventRecorder) -> None:
    counter = LLMEventCounter()
    fake = FakeFunctionCallingLLM(callback_manager=CallbackManager([counter]))

    fake.chat(MESSAGES)

    assert (counter.starts, counter.ends) == (1, 1)
    assert len(recorder.named("LLMChatStartEvent")) == 1


def test_a_members_instrumentation_events_do_not_go_through_its_callback_manager(
    recorder: EventRecorder,
) -> None:
    # Why the wrapper calls members below their decorators instead of silencing their
    # callback managers: instrumentation events reach the global dispatcher regardless.
    silent = FakeFunctionCallingLLM(callback_manager=CallbackManager([]))

    silent.chat(MESSAGES)

    assert len(recorder.named("LLMChatStartEvent")) == 1


class CountingLimiter:
    """Stands in for a LlamaIndex rate limiter; counts permits taken."""

    def __init__(self) -> None:
        self.taken = 0

    def acquire(self) -> None:
        self.taken += 1

    async def async_acquire(self) -> None:
        self.taken += 1


@pytest.mark.parametrize("method", COMPLETE)
async def test_a_members_own_rate_limiter_still_applies(method: str) -> None:
    limiter = CountingLimiter()
    primary = FakeFunctionCallingLLM(error=rate_limit_error(), rate_limiter=limiter)
    secondary = FakeFunctionCallingLLM(rate_limiter=limiter)

    await call(FallbackLLM(llms=[primary, secondary]), method)

    assert limiter.taken == 2


# -- function calling -------------------------------------------------------------------


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


MULTIPLY = FunctionTool.from_defaults(fn=multiply)
CALL_MULTIPLY = ToolSelection(tool_id="call_1", tool_name="multiply", tool_kwargs={"a": 6, "b": 7})


def tool_fakes(**primary: Any) -> tuple[FakeFunctionCallingLLM, FakeFunctionCallingLLM]:
    first = FakeFunctionCallingLLM(model_name="primary", tool_call=CALL_MULTIPLY, **primary)
    second = FakeFunctionCallingLLM(model_name="secondary", tool_call=CALL_MULTIPLY)
    return first, second


async def last_tool_response(llm: FallbackLLM, method: str) -> ChatResponse:
    if method == "chat_with_tools":
        return llm.chat_with_tools([MULTIPLY], user_msg="What is 6 times 7?")
    if method == "achat_with_tools":
        return await llm.achat_with_tools([MULTIPLY], user_msg="What is 6 times 7?")
    if method == "stream_chat_with_tools":
        return list(llm.stream_chat_with_tools([MULTIPLY], user_msg="What is 6 times 7?"))[-1]
    stream = await llm.astream_chat_with_tools([MULTIPLY], user_msg="What is 6 times 7?")
    return [chunk async for chunk in stream][-1]


@pytest.mark.parametrize(
    "method",
    ["chat_with_tools", "achat_with_tools", "stream_chat_with_tools", "astream_chat_with_tools"],
)
async def test_tool_calls_are_parsed_by_the_llm_that_served_them(method: str) -> None:
    primary, secondary = tool_fakes(error=rate_limit_error())
    llm = FallbackLLM(llms=[primary, secondary])

    response = await last_tool_response(llm, method)
    calls = llm.get_tool_calls_from_response(response)

    assert [(c.tool_name, c.tool_kwargs) for c in calls] == [("multiply", {"a": 6, "b": 7})]
    assert (primary.tool_call_parses, secondary.tool_call_parses) == (0, 1)


def test_the_chat_history_given_to_chat_with_tools_is_not_modified() -> None:
    primary, secondary = tool_fakes(error=rate_limit_error())
    history = [ChatMessage(role=MessageRole.SYSTEM, content="Be brief.")]

    FallbackLLM(llms=[primary, secondary]).chat_with_tools(
        [MULTIPLY], user_msg="6 times 7?", chat_history=history
    )

    assert len(history) == 1


def test_predict_and_call_runs_the_tool_chosen_by_the_serving_llm() -> None:
    primary, secondary = tool_fakes(error=rate_limit_error())

    answer = FallbackLLM(llms=[primary, secondary]).predict_and_call(
        [MULTIPLY], user_msg="What is 6 times 7?"
    )

    assert answer.response == "42"
    assert secondary.tool_call_parses == 1


def test_tool_calls_from_a_nested_fallback_are_routed_to_the_innermost_llm() -> None:
    failing, inner_secondary = tool_fakes(error=rate_limit_error())
    inner = FallbackLLM(llms=[failing, inner_secondary])
    outer = FallbackLLM(llms=[inner, FakeFunctionCallingLLM(tool_call=CALL_MULTIPLY)])

    response = outer.chat_with_tools([MULTIPLY], user_msg="What is 6 times 7?")
    calls = outer.get_tool_calls_from_response(response)

    assert response.additional_kwargs[SERVED_BY_KEY] == [0, 1]
    assert calls[0].tool_name == "multiply"
    assert inner_secondary.tool_call_parses == 1


def test_an_unmarked_response_is_parsed_by_the_first_llm_that_finds_tool_calls() -> None:
    primary, secondary = tool_fakes()
    llm = FallbackLLM(llms=[primary, secondary])
    call_message = ChatMessage(
        role=MessageRole.ASSISTANT,
        content="",
        additional_kwargs={"tool_calls": [{"id": "c", "name": "multiply", "arguments": {}}]},
    )

    found = llm.get_tool_calls_from_response(ChatResponse(message=call_message))
    empty = ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content="hi"))

    assert [c.tool_name for c in found] == ["multiply"]
    assert llm.get_tool_calls_from_response(empty, error_on_no_tool_call=False) == []
    with pytest.raises(ValueError, match="tool call"):
        llm.get_tool_calls_from_response(empty)


def test_a_tool_request_skips_a_member_without_function_calling() -> None:
    llm = FallbackLLM(llms=[MockLLM(), FakeFunctionCallingLLM()])

    response = llm.chat_with_tools([MULTIPLY], user_msg="6 times 7?")

    assert response.additional_kwargs[SERVED_BY_KEY] == [1]


def test_a_tool_request_no_member_can_call_tools_for_is_refused_naming_the_need() -> None:
    llm = FallbackLLM(llms=[MockLLM(), MockLLM()])

    with pytest.raises(NoCapableMemberError, match="member 0 lacks tool_calling"):
        llm.chat_with_tools([MULTIPLY], user_msg="6 times 7?")


IMAGE_MESSAGES = [
    ChatMessage(
        role=MessageRole.USER,
        blocks=[TextBlock(text="What is this?"), ImageBlock(url="https://example.test/a.png")],
    )
]


@pytest.mark.parametrize("method", CHAT)
async def test_an_image_request_skips_a_member_declared_without_image_inputs(method: str) -> None:
    first, second = fakes()
    llm = FallbackLLM(
        llms=[first, second], member_profiles=[MemberProfile(image_inputs=False), None]
    )

    images = await call_with(llm, method, IMAGE_MESSAGES)
    text = await call_with(llm, method, MESSAGES)

    assert images[-1].additional_kwargs[SERVED_BY_KEY] == [1]
    assert text[-1].additional_kwargs[SERVED_BY_KEY] == [0]


@pytest.mark.parametrize("method", CHAT)
async def test_an_image_request_goes_to_the_first_member_when_none_is_known_to_lack_images(
    method: str,
) -> None:
    # Only tools are known to be lacking (MockLLM is no FunctionCallingLLM): images are
    # not looked for, and the request goes where a request without needs goes.
    llm = FallbackLLM(llms=[MockLLM(), FakeFunctionCallingLLM()])

    responses = await call_with(llm, method, IMAGE_MESSAGES)

    assert responses[-1].additional_kwargs[SERVED_BY_KEY] == [0]


async def call_with(llm: Any, method: str, messages: list[ChatMessage]) -> list[Any]:
    """The responses of one chat shape (every chunk for streams)."""
    if method == "chat":
        return [llm.chat(messages)]
    if method == "achat":
        return [await llm.achat(messages)]
    if method == "stream_chat":
        return list(llm.stream_chat(messages))
    return [chunk async for chunk in await llm.astream_chat(messages)]


# -- metadata, layers, options ------------------------------------------------------------


def test_metadata_is_the_conservative_merge_of_the_members() -> None:
    big = FakeFunctionCallingLLM(model_name="big", context_window=200_000, num_output=-1)
    small = FakeFunctionCallingLLM(
        model_name="small", context_window=8_000, num_output=512, is_function_calling_model=False
    )

    metadata = FallbackLLM(llms=[big, small]).metadata

    assert metadata.context_window == 8_000
    assert metadata.num_output == 512  # -1 means "unknown" and is not a minimum
    assert metadata.is_chat_model is True
    assert metadata.is_function_calling_model is False
    assert metadata.model_name == "fallback(big,small)"


def test_metadata_takes_the_declared_member_profiles_over_the_members_own() -> None:
    big = FakeFunctionCallingLLM(model_name="big", context_window=200_000)
    small = FakeFunctionCallingLLM(
        model_name="small", context_window=8_000, is_function_calling_model=False
    )
    profiles = [MemberProfile(context_window=4_000), MemberProfile(tool_calling=True)]

    metadata = FallbackLLM(llms=[big, small], member_profiles=profiles).metadata

    assert metadata.context_window == 4_000
    assert metadata.is_function_calling_model is True


def test_metadata_and_event_payload_follow_a_member_whose_facts_change() -> None:
    member = FakeFunctionCallingLLM(model_name="a", context_window=8_000, num_output=512)
    llm = FallbackLLM(llms=[member, FakeFunctionCallingLLM(model_name="b")])
    before = (llm.metadata.context_window, llm.to_payload()["context_window"])

    member.context_window = 4_000
    member.model_name = "a2"

    assert before == (8_000, 8_000)
    assert llm.metadata.context_window == 4_000
    assert llm.to_payload()["context_window"] == 4_000
    assert llm.to_payload()["model_name"] == "fallback(a2,b)"
    assert llm.to_payload() == {"class_name": "FallbackLLM", **llm.metadata.model_dump()}


def test_serialising_the_wrapper_for_events_carries_no_member_secrets() -> None:
    payload = FallbackLLM(llms=[MockLLM(), MockLLM()]).to_payload()

    assert payload["class_name"] == "FallbackLLM"
    assert payload["model_name"] == "fallback(unknown,unknown)"
