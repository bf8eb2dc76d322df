"""The fault-injecting server, driven by the real SDK clients over HTTP on 127.0.0.1."""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from llm_resilience.testing import Fault, FaultInjectingServer
from llm_resilience.transient import TransientClassifier, is_transient

pytest_plugins = ["llm_resilience.testing.fixtures"]

REPLY = "Paris is the capital of France."
WORDS = ["Paris", " is", " the", " capital", " of", " France."]
OPENAI_MESSAGES: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
ANTHROPIC_MESSAGES: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_OPENAI_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
WEATHER_ANTHROPIC_TOOL: Any = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "input_schema": WEATHER_OPENAI_TOOL["function"]["parameters"],
}


@pytest.fixture(scope="module")
def shared_server() -> Any:
    with FaultInjectingServer(reply=REPLY, name="primary") as running:
        yield running


@pytest.fixture
def server(shared_server: FaultInjectingServer) -> FaultInjectingServer:
    # One server per module keeps the sync clients (and their keep-alive pools) warm.
    shared_server.reset()
    return shared_server


@functools.cache
def openai_client(server: FaultInjectingServer, timeout: float = 5.0) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.openai_base_url, api_key="test", max_retries=0, timeout=timeout
    )


def async_openai_client(server: FaultInjectingServer, timeout: float = 5.0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=server.openai_base_url, api_key="test", max_retries=0, timeout=timeout
    )


@functools.cache
def anthropic_client(server: FaultInjectingServer, timeout: float = 5.0) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.anthropic_base_url, api_key="test", max_retries=0, timeout=timeout
    )


def async_anthropic_client(
    server: FaultInjectingServer, timeout: float = 5.0
) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=server.anthropic_base_url, api_key="test", max_retries=0, timeout=timeout
    )


def ask_openai(client: openai.OpenAI, **options: Any) -> Any:
    return client.chat.completions.create(model="gpt-4o", messages=OPENAI_MESSAGES, **options)


def ask_anthropic(client: anthropic.Anthropic, **options: Any) -> Any:
    return client.messages.create(
        model="claude-sonnet-4-6", max_tokens=64, messages=ANTHROPIC_MESSAGES, **options
    )


def collect_openai_stream(client: openai.OpenAI, into: list[str]) -> None:
    for chunk in ask_openai(client, stream=True):
        into.append(chunk.choices[0].delta.content)


async def collect_anthropic_stream(client: anthropic.AsyncAnthropic, into: list[str]) -> None:
    async with client.messages.stream(
        model="claude-sonnet-4-6", max_tokens=64, messages=ANTHROPIC_MESSAGES
    ) as stream:
        async for delta in stream.text_stream:
            into.append(delta)


# -- normal answers ----------------------------------------------------------------------


def test_openai_client_gets_the_reply_with_model_and_usage(server: FaultInjectingServer) -> None:
    completion = ask_openai(openai_client(server))

    assert completion.choices[0].message.content == REPLY
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model == "gpt-4o"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 6  # words of the prompt
    assert completion.usage.completion_tokens == len(WORDS)


def test_openai_stream_sends_word_chunks_then_usage_when_asked(
    server: FaultInjectingServer,
) -> None:
    stream = ask_openai(openai_client(server), stream=True, stream_options={"include_usage": True})
    chunks = list(stream)

    contents = [c.choices[0].delta.content for c in chunks if c.choices]
    assert contents[0] == ""  # the role chunk
    assert chunks[0].choices[0].delta.role == "assistant"
    assert contents[1:-1] == WORDS
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(WORDS)


async def test_async_openai_client_gets_the_reply_and_the_stream(
    server: FaultInjectingServer,
) -> None:
    async with async_openai_client(server) as client:
        completion = await client.chat.completions.create(model="gpt-4o", messages=OPENAI_MESSAGES)
        stream = await client.chat.completions.create(
            model="gpt-4o", messages=OPENAI_MESSAGES, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream])

    assert completion.choices[0].message.content == REPLY
    assert text == REPLY


def test_anthropic_client_gets_the_reply_with_model_and_usage(
    server: FaultInjectingServer,
) -> None:
    message = ask_anthropic(anthropic_client(server))

    assert message.content[0].text == REPLY
    assert message.stop_reason == "end_turn"
    assert message.model == "claude-sonnet-4-6"
    assert message.usage.input_tokens == 6
    assert message.usage.output_tokens == len(WORDS)


def test_anthropic_stream_sends_text_deltas_and_final_usage(server: FaultInjectingServer) -> None:
    client = anthropic_client(server)
    with client.messages.stream(
        model="claude-sonnet-4-6", max_tokens=64, messages=ANTHROPIC_MESSAGES
    ) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()

    assert deltas == WORDS
    assert final.content[0].text == REPLY
    assert final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (6, len(WORDS))


async def test_async_anthropic_client_gets_the_reply_and_the_stream(
    server: FaultInjectingServer,
) -> None:
    async with async_anthropic_client(server) as client:
        message = await client.messages.create(
            model="claude-sonnet-4-6", max_tokens=64, messages=ANTHROPIC_MESSAGES
        )
        async with client.messages.stream(
            model="claude-sonnet-4-6", max_tokens=64, messages=ANTHROPIC_MESSAGES
        ) as stream:
            text = "".join([delta async for delta in stream.text_stream])
            final = await stream.get_final_message()

    assert message.content[0].text == REPLY
    assert text == REPLY
    assert final.usage.output_tokens == len(WORDS)


# -- tool calls --------------------------------------------------------------------------


def compacted_steps(usage: Any) -> list[tuple[str, int, int, int, int]]:
    """Each ``usage.iterations`` entry: type, input, output, cache writes, cache reads."""
    return [
        (
            step.type,
            step.input_tokens,
            step.output_tokens,
            step.cache_creation_input_tokens,
            step.cache_read_input_tokens,
        )
        for step in usage.iterations
    ]


def test_a_compacted_answer_reports_its_summarising_step_apart_as_the_beta_sdk_reads_it(
    server: FaultInjectingServer,
) -> None:
    server.script(
        Fault.compacted(input_tokens=100, output_tokens=131, cache_write_5m=55_096, summary="S.")
    )
    message = anthropic_client(server).beta.messages.create(
        model="claude-sonnet-4-6", max_tokens=64, messages=ANTHROPIC_MESSAGES
    )

    assert [block.type for block in message.content] == ["compaction", "text"]
    assert (message.content[0].content, message.content[1].text) == ("S.", REPLY)
    # The top-level counts are the answer's step alone: the compaction is billed apart.
    assert (message.usage.input_tokens, message.usage.output_tokens) == (6, 6)
    assert compacted_steps(message.usage) == [
        ("compaction", 100, 131, 55_096, 0),
        ("message", 6, 6, 0, 0),
    ]
    assert message.context_management.applied_edits == []


def test_a_compacted_stream_opens_with_the_summary_step_and_ends_with_every_step(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.compacted(input_tokens=100, output_tokens=131, cache_read=40))
    with anthropic_client(server).beta.messages.stream(
        model="claude-sonnet-4-6", max_tokens=64, messages=ANTHROPIC_MESSAGES
    ) as stream:
        events = list(stream)
        message = stream.get_final_message()

    start = events[0]
    assert start.type == "message_start"
    # The API's stream opens with the first sampling step's input: the summary's.
    assert (start.message.usage.input_tokens, start.message.usage.cache_read_input_tokens) == (
        100,
        40,
    )
    assert [block.type for block in message.content] == ["compaction", "text"]
    assert message.content[0].content == "Summary of the earlier conversation."
    assert message.content[1].text == REPLY
    assert compacted_steps(message.usage) == [
        ("compaction", 100, 131, 0, 40),
        ("message", 6, 6, 0, 0),
    ]


def test_a_compacted_answer_without_its_summary_keeps_the_steps_and_other_routes_ignore_it(
    server: FaultInjectingServer,
) -> None:
    server.script(
        Fault.compacted(input_tokens=1, output_tokens=2, summary=None),
        Fault.compacted(input_tokens=1, output_tokens=2),
    )
    message = anthropic_client(server).beta.messages.create(
        model="claude-sonnet-4-6", max_tokens=64, messages=ANTHROPIC_MESSAGES
    )
    assert [block.type for block in message.content] == ["text"]
    assert compacted_steps(message.usage)[0] == ("compaction", 1, 2, 0, 0)

    answer = ask_openai(openai_client(server))
    assert answer.choices[0].message.content == REPLY


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"input_tokens": -1, "output_tokens": 2}, "input_tokens"),
        ({"input_tokens": 1, "output_tokens": True}, "output_tokens"),
        ({"input_tokens": 1, "output_tokens": 2, "cache_write_1h": 1.5}, "cache_write_1h"),
    ],
)
def test_a_compaction_with_a_count_that_is_no_count_is_refused_naming_it(
    options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        Fault.compacted(**options)
    with pytest.raises(TypeError, match="summary"):
        Fault.compacted(input_tokens=1, output_tokens=2, summary=True)  # type: ignore[arg-type]


def test_openai_weather_question_with_tools_gets_a_call_to_the_first_tool(
    server: FaultInjectingServer,
) -> None:
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    client = openai_client(server)
    completion = client.chat.completions.create(
        model="gpt-4o", messages=messages, tools=[WEATHER_OPENAI_TOOL]
    )
    stream = client.chat.completions.create(
        model="gpt-4o", messages=messages, tools=[WEATHER_OPENAI_TOOL], stream=True
    )
    streamed_arguments = "".join(
        call.function.arguments or ""
        for chunk in stream
        for call in chunk.choices[0].delta.tool_calls or []
        if call.function is not None
    )

    call = completion.choices[0].message.tool_calls[0]
    assert completion.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert call.function.arguments == '{"city": "test", "days": 0}'
    assert streamed_arguments == call.function.arguments
    assert [r.tool_call for r in server.requests] == [True, True]


def test_anthropic_weather_question_with_tools_gets_a_tool_use_block(
    server: FaultInjectingServer,
) -> None:
    client = anthropic_client(server)
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    message = client.messages.create(
        model="claude-sonnet-4-6", max_tokens=64, messages=messages, tools=[WEATHER_ANTHROPIC_TOOL]
    )
    with client.messages.stream(
        model="claude-sonnet-4-6", max_tokens=64, messages=messages, tools=[WEATHER_ANTHROPIC_TOOL]
    ) as stream:
        streamed = stream.get_final_message()

    assert message.stop_reason == "tool_use"
    assert message.content[0].type == "tool_use"
    assert message.content[0].name == "get_weather"
    assert message.content[0].input == {"city": "test", "days": 0}
    assert streamed.content[0].input == {"city": "test", "days": 0}


def test_tool_result_as_last_message_gets_the_text_reply(server: FaultInjectingServer) -> None:
    messages = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    completion = openai_client(server).chat.completions.create(
        model="gpt-4o", messages=messages, tools=[WEATHER_OPENAI_TOOL]
    )

    assert completion.choices[0].message.content == REPLY


# -- status faults -----------------------------------------------------------------------


def test_openai_429_is_a_transient_rate_limit_error_with_retry_after_headers(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.status(429, retry_after=2, retry_after_ms=1500))

    with pytest.raises(openai.RateLimitError) as caught:
        ask_openai(openai_client(server))

    assert caught.value.status_code == 429
    assert "Rate limit reached for" in str(caught.value)
    assert caught.value.code == "rate_limit_exceeded"
    assert caught.value.response.headers["retry-after"] == "2"
    assert caught.value.response.headers["retry-after-ms"] == "1500"
    assert is_transient(caught.value)


def test_anthropic_429_is_a_transient_rate_limit_error_with_retry_after_header(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.status(429, retry_after=7))

    with pytest.raises(anthropic.RateLimitError) as caught:
        ask_anthropic(anthropic_client(server))

    assert caught.value.type == "rate_limit_error"
    assert "rate limit" in str(caught.value)
    assert caught.value.response.headers["retry-after"] == "7"
    assert is_transient(caught.value)


def test_503_is_a_transient_server_error_for_both_sdks(server: FaultInjectingServer) -> None:
    server.script(Fault.status(503), Fault.status(503))

    with pytest.raises(openai.InternalServerError) as from_openai:
        ask_openai(openai_client(server))
    with pytest.raises(anthropic.InternalServerError) as from_anthropic:
        ask_anthropic(anthropic_client(server))

    assert "The server is overloaded or not ready yet." in str(from_openai.value)
    assert from_openai.value.status_code == from_anthropic.value.status_code == 503
    assert is_transient(from_openai.value)
    assert is_transient(from_anthropic.value)


def test_anthropic_529_is_overloaded_and_transient_only_with_server_errors_preset(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.status(529))

    with pytest.raises(anthropic.OverloadedError) as caught:
        ask_anthropic(anthropic_client(server))

    assert caught.value.type == "overloaded_error"
    assert "Overloaded" in str(caught.value)
    assert not is_transient(caught.value)
    assert TransientClassifier.with_server_errors()(caught.value)


def test_custom_error_body_is_sent_verbatim(server: FaultInjectingServer) -> None:
    server.script(Fault.status(502, body="<html>Bad gateway</html>"))

    with pytest.raises(openai.InternalServerError) as caught:
        ask_openai(openai_client(server))

    assert caught.value.status_code == 502
    assert caught.value.response.text == "<html>Bad gateway</html>"


# -- connection faults -------------------------------------------------------------------


def test_hang_surfaces_as_each_sdks_timeout_error(server: FaultInjectingServer) -> None:
    server.script(Fault.hang(), Fault.hang())

    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError) as from_openai:
        ask_openai(openai_client(server, timeout=0.3))
    with pytest.raises(anthropic.APITimeoutError) as from_anthropic:
        ask_anthropic(anthropic_client(server, timeout=0.3))

    assert time.monotonic() - started < 3  # two 0.3 s timeouts, with room for a busy CI
    assert is_transient(from_openai.value)
    assert is_transient(from_anthropic.value)


async def test_hang_times_out_async_clients_too(server: FaultInjectingServer) -> None:
    server.script(Fault.hang())

    async with async_openai_client(server, timeout=0.3) as client:
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(model="gpt-4o", messages=OPENAI_MESSAGES)


def test_hang_with_seconds_answers_normally_afterwards(server: FaultInjectingServer) -> None:
    server.script(Fault.hang(seconds=0.1))

    started = time.monotonic()
    completion = ask_openai(openai_client(server))

    assert time.monotonic() - started >= 0.1
    assert completion.choices[0].message.content == REPLY


def test_openai_stream_dropped_after_two_chunks_raises_a_transient_transport_error(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.drop_mid_stream(after_chunks=2))
    received: list[str] = []

    with pytest.raises(httpx.RemoteProtocolError) as caught:
        collect_openai_stream(openai_client(server), received)

    assert received == ["", *WORDS[:2]]  # the role chunk, then exactly two content chunks
    assert is_transient(caught.value)


async def test_async_anthropic_stream_dropped_after_two_chunks_raises_transiently(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.drop_mid_stream(after_chunks=2))
    received: list[str] = []

    async with async_anthropic_client(server) as client:
        # anthropic 0.x rides on httpx, 2.x on httpx2: either cut is the same transport error.
        with pytest.raises((httpx.RemoteProtocolError, httpx2.RemoteProtocolError)) as caught:
            await collect_anthropic_stream(client, received)

    assert received == WORDS[:2]
    assert is_transient(caught.value)


def test_drop_mid_stream_cuts_even_a_reply_shorter_than_the_chunk_count(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.drop_mid_stream(after_chunks=50))
    received: list[str] = []

    with pytest.raises(httpx.RemoteProtocolError):
        collect_openai_stream(openai_client(server), received)

    assert "".join(received) == REPLY


def test_drop_on_a_non_streaming_request_closes_before_any_response(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.drop_mid_stream(after_chunks=1))

    with pytest.raises(openai.APIConnectionError) as caught:
        ask_openai(openai_client(server))

    assert is_transient(caught.value)


def test_refuse_is_a_transient_connection_error_for_both_sdks(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.refuse(), Fault.refuse())

    with pytest.raises(openai.APIConnectionError) as from_openai:
        ask_openai(openai_client(server))
    with pytest.raises(anthropic.APIConnectionError) as from_anthropic:
        ask_anthropic(anthropic_client(server))

    assert not isinstance(from_openai.value, openai.APITimeoutError)
    assert is_transient(from_openai.value)
    assert is_transient(from_anthropic.value)


def test_slow_stream_waits_between_chunks_and_completes(server: FaultInjectingServer) -> None:
    server.script(Fault.slow(delay_per_chunk=0.02))

    started = time.monotonic()
    text = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in ask_openai(openai_client(server), stream=True)
    )

    assert text == REPLY
    assert time.monotonic() - started >= 0.02 * len(WORDS)


# -- the script and the records ----------------------------------------------------------


def test_script_is_consumed_in_order_on_one_keep_alive_client_then_answers_normally(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.status(429), Fault.refuse(), Fault.status(503))
    client = openai_client(server)
    outcomes: list[str] = []

    for _ in range(5):
        try:
            outcomes.append(ask_openai(client).choices[0].message.content)
        except openai.APIError as exc:
            outcomes.append(type(exc).__name__)

    assert outcomes == [
        "RateLimitError",
        "APIConnectionError",
        "InternalServerError",
        REPLY,
        REPLY,
    ]
    assert server.pending == ()


def test_requests_record_path_model_stream_and_fault_but_never_the_prompt(
    server: FaultInjectingServer,
) -> None:
    secret = "the-secret-prompt-word"
    server.script(Fault.status(429))
    client = openai_client(server)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": secret}]
        )
    list(
        client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": secret}], stream=True
        )
    )

    first, second = server.requests
    assert (first.path, first.provider, first.model, first.stream) == (
        "/v1/chat/completions",
        "openai",
        "gpt-4o-mini",
        False,
    )
    assert first.fault == Fault.status(429)
    assert second.stream is True
    assert second.fault == Fault.ok()
    assert first.at <= second.at
    assert secret not in repr(server.requests)
    assert REPLY not in repr(server.requests)


def test_reset_forgets_script_and_records(server: FaultInjectingServer) -> None:
    server.script(Fault.status(429), Fault.status(429))
    with pytest.raises(openai.RateLimitError):
        ask_openai(openai_client(server))

    server.reset()

    assert server.requests == []
    assert server.pending == ()
    assert ask_openai(openai_client(server)).choices[0].message.content == REPLY


def test_default_fault_answers_every_request_once_the_script_is_used_up() -> None:
    with FaultInjectingServer(default_fault=Fault.status(503)) as dead:
        dead.script(Fault.ok())
        client = openai_client(dead)
        ask_openai(client)
        for _ in range(2):
            with pytest.raises(openai.InternalServerError):
                ask_openai(client)

    assert [r.fault.kind for r in dead.requests] == ["ok", "status", "status"]


def test_two_servers_keep_independent_scripts(
    fault_server: FaultInjectingServer, fault_server_factory: Any
) -> None:
    secondary = fault_server_factory(reply="From the secondary.", name="secondary")
    fault_server.script(Fault.status(503))

    with pytest.raises(openai.InternalServerError):
        ask_openai(openai_client(fault_server))
    answer = ask_openai(openai_client(secondary)).choices[0].message.content

    assert answer == "From the secondary."
    assert fault_server.port != secondary.port
    assert len(fault_server.requests) == len(secondary.requests) == 1


def test_stop_is_fast_with_a_hanging_request_outstanding() -> None:
    server = FaultInjectingServer().start()
    server.script(Fault.hang())
    errors: list[BaseException] = []

    def call() -> None:
        try:
            ask_openai(openai_client(server, timeout=10))
        except BaseException as exc:
            errors.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    deadline = time.monotonic() + 5
    while not server.requests and time.monotonic() < deadline:
        time.sleep(0.01)

    started = time.monotonic()
    server.stop()
    stopped_in = time.monotonic() - started
    caller.join(timeout=2)

    assert server.requests[0].fault == Fault.hang()
    assert stopped_in < 0.5
    assert not caller.is_alive()
    assert isinstance(errors[0], openai.APIConnectionError)


def test_stopped_server_cannot_restart_and_has_no_address() -> None:
    server = FaultInjectingServer()
    server.start()
    server.stop()
    server.stop()  # idempotent

    with pytest.raises(RuntimeError, match="not running"):
        _ = server.openai_base_url
    with pytest.raises(RuntimeError, match="stopped"):
        server.start()


@pytest.mark.parametrize(
    ("build", "option"),
    [
        (lambda: Fault.status(200), "code"),
        (lambda: Fault.status(429, retry_after=-1), "retry_after"),
        (lambda: Fault.hang(seconds=-0.5), "seconds"),
        (lambda: Fault.drop_mid_stream(after_chunks=-1), "after_chunks"),
        (lambda: Fault.slow(delay_per_chunk=-0.1), "delay_per_chunk"),
    ],
)
def test_fault_options_out_of_range_raise_value_error_naming_them(build: Any, option: str) -> None:
    with pytest.raises(ValueError, match=option):
        build()


def test_script_rejects_anything_but_faults(server: FaultInjectingServer) -> None:
    with pytest.raises(TypeError, match="Fault"):
        server.script(429)


def test_unknown_path_is_404_and_consumes_no_fault(server: FaultInjectingServer) -> None:
    server.script(Fault.status(429))

    response = httpx.post(f"{server.openai_base_url}/embeddings", json={"input": "x"})

    assert response.status_code == 404
    assert server.pending == (Fault.status(429),)


# -- framework clients -------------------------------------------------------------------


def test_langchain_chat_openai_invokes_and_streams_against_the_server(
    server: FaultInjectingServer,
) -> None:
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(
        model="gpt-4o-mini",
        base_url=server.openai_base_url,
        api_key="test",
        max_retries=0,
        timeout=5,
        stream_usage=True,
    )
    message = model.invoke("What is the capital of France?")
    chunks = list(model.stream("What is the capital of France?"))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk

    assert message.content == REPLY
    assert message.response_metadata["model_name"] == "gpt-4o-mini"
    assert message.usage_metadata is not None
    assert message.usage_metadata["output_tokens"] == len(WORDS)
    assert merged.content == REPLY
    assert merged.usage_metadata is not None
    assert merged.usage_metadata["output_tokens"] == len(WORDS)


def test_langchain_chat_anthropic_invokes_and_binds_tools_against_the_server(
    server: FaultInjectingServer,
) -> None:
    from langchain_anthropic import ChatAnthropic

    model = ChatAnthropic(
        model="claude-sonnet-4-6",
        base_url=server.anthropic_base_url,
        api_key="test",
        max_retries=0,
        timeout=5,
    )
    message = model.invoke("What is the capital of France?")
    tool_message = model.bind_tools([WEATHER_ANTHROPIC_TOOL]).invoke("Weather in Paris?")

    assert message.content == REPLY
    assert message.response_metadata["model_name"] == "claude-sonnet-4-6"
    assert message.usage_metadata is not None
    assert message.usage_metadata["input_tokens"] == 6
    assert tool_message.tool_calls[0]["name"] == "get_weather"
    assert tool_message.tool_calls[0]["args"] == {"city": "test", "days": 0}


def test_a_burst_of_two_hundred_simultaneous_connections_is_accepted_without_stalling() -> None:
    """The listen backlog holds a burst: no handshake waits out the kernel's retransmits
    (a backlog of 5 made some of these connections take 1-30 s, read as a hung provider)."""
    import socket

    with FaultInjectingServer() as server:
        port = int(server.openai_base_url.split(":")[2].split("/")[0])
        barrier = threading.Barrier(200)
        took: list[float] = []
        lock = threading.Lock()

        def connect() -> None:
            barrier.wait()
            began = time.monotonic()
            with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
                connection.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert connection.recv(12).startswith(b"HTTP/1.")
            with lock:
                took.append(time.monotonic() - began)

        threads = [threading.Thread(target=connect) for _ in range(200)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)

    assert len(took) == 200
    assert max(took) < 0.9  # under the first SYN-ACK retransmit (1 s)
