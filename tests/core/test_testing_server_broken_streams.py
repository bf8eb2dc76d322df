"""The server's malformed-event and missing-end-marker faults, through the real SDKs, and
how the transient rule classifies what the SDKs raise for a malformed event."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from llm_resilience.testing import Fault, FaultInjectingServer
from llm_resilience.transient import TransientClassifier, is_transient

REPLY = "Paris is the capital of France."
MESSAGES: Any = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def shared_server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply=REPLY, name="primary") as running:
        yield running


@pytest.fixture
def server(shared_server: FaultInjectingServer) -> FaultInjectingServer:
    shared_server.reset()
    return shared_server


def openai_stream(server: FaultInjectingServer) -> list[Any]:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0)
    return list(
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
    )


def anthropic_stream(server: FaultInjectingServer) -> list[Any]:
    client = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="t", max_retries=0)
    return list(
        client.messages.create(
            model="claude-haiku-4-5", max_tokens=50, messages=MESSAGES, stream=True
        )
    )


async def async_openai_stream(server: FaultInjectingServer) -> list[Any]:
    client = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0)
    stream = await client.chat.completions.create(
        model="gpt-4o-mini", messages=MESSAGES, stream=True
    )
    return [event async for event in stream]


async def async_anthropic_stream(server: FaultInjectingServer) -> list[Any]:
    client = anthropic.AsyncAnthropic(
        base_url=server.anthropic_base_url, api_key="t", max_retries=0
    )
    stream = await client.messages.create(
        model="claude-haiku-4-5", max_tokens=50, messages=MESSAGES, stream=True
    )
    return [event async for event in stream]


STREAMS = {"openai": openai_stream, "anthropic": anthropic_stream}
ASYNC_STREAMS = {"openai": async_openai_stream, "anthropic": async_anthropic_stream}


# -- malformed event -------------------------------------------------------------------


@pytest.mark.parametrize("provider", list(STREAMS))
def test_a_malformed_event_makes_the_sdk_raise_a_json_error_that_is_transient(
    provider: str, server: FaultInjectingServer
) -> None:
    server.script(Fault.malformed_chunk(after_chunks=2))
    with pytest.raises(json.JSONDecodeError) as caught:
        STREAMS[provider](server)
    assert is_transient(caught.value)
    assert TransientClassifier.with_server_errors()(caught.value)
    assert [r.fault for r in server.requests] == [Fault.malformed_chunk(after_chunks=2)]


@pytest.mark.parametrize("provider", list(ASYNC_STREAMS))
async def test_a_malformed_event_makes_the_async_sdk_raise_a_json_error_that_is_transient(
    provider: str, server: FaultInjectingServer
) -> None:
    server.script(Fault.malformed_chunk(after_chunks=0))
    with pytest.raises(json.JSONDecodeError) as caught:
        await ASYNC_STREAMS[provider](server)
    assert is_transient(caught.value)


@pytest.mark.parametrize("provider", list(STREAMS))
def test_a_malformed_event_after_the_last_word_still_comes_before_the_stream_ends(
    provider: str, server: FaultInjectingServer
) -> None:
    server.script(Fault.malformed_chunk(after_chunks=99))
    with pytest.raises(json.JSONDecodeError):
        STREAMS[provider](server)


def test_the_malformed_event_sits_between_whole_events_and_the_answer_goes_on(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.malformed_chunk(after_chunks=1))
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    raw = httpx.post(f"{server.openai_base_url}/chat/completions", json=body).text
    events = [event for event in raw.split("\n\n") if event]
    undecodable = [e for e in events if e != "data: [DONE]" and not _decodes(e)]
    assert len(undecodable) == 1
    assert events.index(undecodable[0]) == 2  # after the opening chunk and one word
    assert events[-1] == "data: [DONE]"


def _decodes(event: str) -> bool:
    try:
        json.loads(event.removeprefix("data: "))
    except ValueError:
        return False
    return True


def test_a_non_streaming_request_under_a_malformed_chunk_fault_is_answered_normally(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.malformed_chunk())
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="t", max_retries=0)
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert reply.choices[0].message.content == REPLY


@pytest.mark.parametrize("after_chunks", [-1, 1.5, True, "2"])
def test_malformed_chunk_rejects_a_count_that_is_not_a_whole_number(after_chunks: Any) -> None:
    with pytest.raises(ValueError, match="after_chunks"):
        Fault.malformed_chunk(after_chunks=after_chunks)


def test_a_json_error_raised_outside_an_sdks_stream_decoder_is_not_transient() -> None:
    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads('{"arguments": ')  # a tool's arguments, a user's own parsing
    assert not is_transient(caught.value)
    assert not is_transient(ValueError("Expecting value: line 1 column 1 (char 0)"))
    assert not is_transient(json.JSONDecodeError("Expecting value", "{", 1))


# -- missing end marker ----------------------------------------------------------------


def test_an_openai_stream_without_done_ends_at_once_with_its_usage(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.missing_done())
    started = time.monotonic()
    chunks = openai_stream(server)
    assert time.monotonic() - started < 2.0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == REPLY
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    server.script(Fault.missing_done())
    raw = httpx.post(f"{server.openai_base_url}/chat/completions", json=body).text
    assert "[DONE]" not in raw
    assert raw.endswith("\n\n")


def test_an_anthropic_stream_without_message_stop_ends_at_once_with_its_usage(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.missing_done())
    started = time.monotonic()
    events = anthropic_stream(server)
    assert time.monotonic() - started < 2.0
    types = [event.type for event in events]
    assert "message_stop" not in types
    assert types[-1] == "message_delta"
    assert events[-1].usage.output_tokens > 0


async def test_an_async_stream_without_its_end_marker_ends_at_once(
    server: FaultInjectingServer,
) -> None:
    for stream in ASYNC_STREAMS.values():
        server.script(Fault.missing_done())
        started = time.monotonic()
        assert await stream(server)
        assert time.monotonic() - started < 2.0
