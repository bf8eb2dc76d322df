"""The fault server's time faults: a slow first token and a stream that stalls mid-way.

Driven by the real OpenAI and Anthropic SDKs, so the timings are what a client library
sees: when the response (headers) arrives, when each content event arrives, and how a
stall ends.
"""

from __future__ import annotations

import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from llm_resilience.testing import Fault, FaultInjectingServer
from llm_resilience.transient import is_transient

REPLY = "Paris is the capital of France."
MESSAGES: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
DELAY = 0.6


@pytest.fixture
def server() -> Any:
    with FaultInjectingServer(reply=REPLY) as running:
        yield running


def _openai(server: FaultInjectingServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0, timeout=10)


def _anthropic(server: FaultInjectingServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.anthropic_base_url, api_key="test", max_retries=0, timeout=10
    )


def _openai_stream(server: FaultInjectingServer) -> Any:
    return _openai(server).chat.completions.create(
        model="gpt-4o-mini", messages=MESSAGES, stream=True
    )


def _anthropic_stream(server: FaultInjectingServer) -> Any:
    return _anthropic(server).messages.create(
        model="claude-haiku-4-5", max_tokens=50, messages=MESSAGES, stream=True
    )


def _openai_text(event: Any) -> str:
    return (event.choices[0].delta.content or "") if event.choices else ""


def _anthropic_text(event: Any) -> str:
    return event.delta.text if event.type == "content_block_delta" else ""


PROVIDERS = {
    "openai": (_openai_stream, _openai_text),
    "anthropic": (_anthropic_stream, _anthropic_text),
}


@pytest.mark.parametrize(
    ("provider", "path"), [("openai", "/v1/chat/completions"), ("anthropic", "/v1/messages")]
)
def test_a_slow_first_token_sends_headers_and_opening_event_at_once(
    provider: str, path: str, server: FaultInjectingServer
) -> None:
    server.script(Fault.slow_first_token(DELAY))
    body = {"model": "m", "max_tokens": 50, "messages": MESSAGES, "stream": True}
    url = f"http://127.0.0.1:{server.port}{path}"
    with httpx.Client(timeout=10) as client:
        client.post(url, json={**body, "stream": False})  # a warm connection
        began = time.monotonic()
        with client.stream("POST", url, json=body) as response:
            headers_after = time.monotonic() - began
            lines = response.iter_lines()
            first_line = next(lines)
            opening_after = time.monotonic() - began
            rest = list(lines)
    assert response.status_code == 200
    assert headers_after < DELAY / 2
    assert opening_after < DELAY / 2
    assert first_line.startswith("data: {" if provider == "openai" else "event: message_start")
    assert any("[DONE]" in line or "message_stop" in line for line in rest)


@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_a_slow_first_token_reaches_the_sdk_after_the_delay_then_the_rest_at_full_speed(
    provider: str, server: FaultInjectingServer
) -> None:
    open_stream, text_of = PROVIDERS[provider]
    server.script(Fault.slow_first_token(DELAY))
    began = time.monotonic()
    arrivals: list[tuple[float, str]] = []
    for event in open_stream(server):
        arrivals.append((time.monotonic() - began, text_of(event)))
    content = [(at, text) for at, text in arrivals if text]
    assert content[0][0] >= DELAY
    assert content[-1][0] - content[0][0] < DELAY / 2
    assert "".join(text for _, text in content) == REPLY


def test_a_slow_first_token_delays_a_whole_non_streamed_answer(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.slow_first_token(DELAY), Fault.slow_first_token(DELAY))
    began = time.monotonic()
    answer = _openai(server).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert answer.choices[0].message.content == REPLY
    message = _anthropic(server).messages.create(
        model="claude-haiku-4-5", max_tokens=50, messages=MESSAGES
    )
    assert message.content[0].text == REPLY  # type: ignore[union-attr]
    assert time.monotonic() - began >= 2 * DELAY


@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_a_stall_sends_some_chunks_then_silence_then_cuts_the_stream(
    provider: str, server: FaultInjectingServer
) -> None:
    open_stream, text_of = PROVIDERS[provider]
    server.script(Fault.stall_mid_stream(after_chunks=2, seconds=DELAY))
    began = time.monotonic()
    texts: list[str] = []
    last_at = 0.0

    def read() -> None:
        nonlocal last_at
        for event in open_stream(server):
            last_at = time.monotonic() - began
            if text_of(event):
                texts.append(text_of(event))

    with pytest.raises(Exception) as raised:  # each SDK raises its own type
        read()
    ended_at = time.monotonic() - began
    assert texts == ["Paris", " is"]
    assert last_at < DELAY / 2
    assert ended_at - last_at >= DELAY * 0.9  # silence, with the connection open
    assert is_transient(raised.value), repr(raised.value)


def test_a_stall_without_seconds_lasts_until_the_server_stops() -> None:
    with FaultInjectingServer(reply=REPLY) as server:
        server.script(Fault.stall_mid_stream(after_chunks=1))
        client = openai.OpenAI(
            base_url=server.openai_base_url, api_key="test", max_retries=0, timeout=0.5
        )
        stream = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
        texts = []

        def read() -> None:
            for event in stream:
                texts.append(_openai_text(event))

        # The SDK surfaces a timeout while reading a stream as httpx's own error.
        with pytest.raises(httpx.ReadTimeout):
            read()
        assert "Paris" in texts


def test_a_stall_on_a_non_streamed_request_waits_then_closes_without_an_answer(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.stall_mid_stream(seconds=DELAY))
    began = time.monotonic()
    with pytest.raises(openai.APIConnectionError) as raised:
        _openai(server).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert time.monotonic() - began >= DELAY * 0.9
    assert isinstance(raised.value.__cause__, httpx.RemoteProtocolError)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Fault.slow_first_token(-1), "seconds must be a number >= 0; got -1"),
        (
            lambda: Fault.slow_first_token(None),  # type: ignore[arg-type]
            "seconds must be a number >= 0; got None",
        ),
        (lambda: Fault.stall_mid_stream(after_chunks=-1), "after_chunks must be an integer >= 0"),
        (lambda: Fault.stall_mid_stream(seconds=-0.5), "seconds must be >= 0 or None"),
    ],
)
def test_time_fault_options_out_of_range_raise_value_error_naming_them(
    build: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_time_faults_read_like_the_calls_that_built_them() -> None:
    assert repr(Fault.slow_first_token(2)) == "Fault(kind='slow_first_token', seconds=2)"
    assert repr(Fault.stall_mid_stream(3, seconds=5)) == (
        "Fault(kind='stall_mid_stream', seconds=5, after_chunks=3)"
    )
