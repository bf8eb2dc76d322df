"""The fault server's Cohere Chat API routes, on the wire and through the real cohere SDK:
v2 (``POST /v2/chat``: a JSON answer, an SSE stream) and v1 (``POST /v1/chat``: a JSON
answer, a stream of JSON lines), usage in both, and Cohere's errors."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from llm_resilience.testing import Fault, FaultInjectingServer

cohere = pytest.importorskip("cohere")
ApiError = pytest.importorskip("cohere.core").ApiError  # lazy in the package: load it

MODEL = "command-a-03-2025"
QUESTION = "What is the capital of France?"
V2 = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}]}


@pytest.fixture(scope="module")
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply="Paris is the capital.") as started:
        yield started


@pytest.fixture(autouse=True)
def _fresh(server: FaultInjectingServer) -> None:
    server.reset()
    server.usage_details = {}


def _post(server: FaultInjectingServer, path: str, body: dict[str, Any]) -> tuple[int, Any, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def _client(server: FaultInjectingServer) -> Any:
    return cohere.ClientV2(
        api_key="sk-FAKE-cohere", base_url=f"http://127.0.0.1:{server.port}", timeout=10
    )


def test_a_v2_chat_answers_an_assistant_message_with_billed_usage(
    server: FaultInjectingServer,
) -> None:
    reply = _client(server).chat(model=MODEL, messages=V2["messages"])
    assert reply.finish_reason == "COMPLETE"
    assert [block.text for block in reply.message.content] == ["Paris is the capital."]
    billed = reply.usage.billed_units
    assert (billed.input_tokens, billed.output_tokens) == (6, 4)
    assert reply.usage.cached_tokens is None
    [served] = server.requests
    assert (served.path, served.provider, served.model, served.stream) == (
        "/v2/chat",
        "cohere",
        MODEL,
        False,
    )


def test_a_v2_stream_is_sse_from_message_start_to_message_end_with_usage(
    server: FaultInjectingServer,
) -> None:
    status, headers, raw = _post(server, "/v2/chat", {**V2, "stream": True})
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    names = [line[7:] for line in raw.decode().splitlines() if line.startswith("event: ")]
    assert names == ["message-start", "content-start"] + ["content-delta"] * 4 + [
        "content-end",
        "message-end",
    ]
    events = list(_client(server).chat_stream(model=MODEL, messages=V2["messages"]))
    texts = [event.delta.message.content.text for event in events if event.type == "content-delta"]
    assert "".join(texts) == "Paris is the capital."
    end = events[-1]
    assert (end.type, end.delta.finish_reason) == ("message-end", "COMPLETE")
    assert (
        end.delta.usage.billed_units.input_tokens,
        end.delta.usage.billed_units.output_tokens,
    ) == (
        6,
        4,
    )


def test_cache_reads_are_reported_as_cached_tokens(server: FaultInjectingServer) -> None:
    server.usage_details = {"cache_read": 3}
    reply = _client(server).chat(model=MODEL, messages=V2["messages"])
    assert reply.usage.cached_tokens == 3


def test_v1_chat_answers_text_and_meta_and_streams_json_lines(
    server: FaultInjectingServer,
) -> None:
    v1 = cohere.Client(api_key="sk-FAKE-cohere", base_url=f"http://127.0.0.1:{server.port}")
    reply = v1.chat(model=MODEL, message=QUESTION)
    assert (reply.text, reply.finish_reason) == ("Paris is the capital.", "COMPLETE")
    assert (reply.meta.billed_units.input_tokens, reply.meta.billed_units.output_tokens) == (6, 4)
    status, headers, raw = _post(
        server, "/v1/chat", {"model": MODEL, "message": QUESTION, "stream": True}
    )
    assert (status, headers["Content-Type"]) == (200, "application/stream+json")
    lines = [json.loads(line) for line in raw.decode().splitlines() if line]
    assert [line["event_type"] for line in lines] == ["stream-start"] + ["text-generation"] * 4 + [
        "stream-end"
    ]
    events = list(v1.chat_stream(model=MODEL, message=QUESTION))
    assert "".join(e.text for e in events if e.event_type == "text-generation") == (
        "Paris is the capital."
    )
    assert events[-1].response.meta.billed_units.output_tokens == 4
    assert [served.path for served in server.requests] == ["/v1/chat"] * 3


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (400, "BadRequestError"),
        (401, "UnauthorizedError"),
        (403, "ForbiddenError"),
        (404, "NotFoundError"),
        (429, "TooManyRequestsError"),
        (500, "InternalServerError"),
        (503, "ServiceUnavailableError"),
        (504, "GatewayTimeoutError"),
    ],
)
def test_errors_are_cohere_s_message_bodies_raised_as_the_sdk_s_typed_errors(
    server: FaultInjectingServer, code: int, kind: str
) -> None:
    server.script(Fault.status(code))
    with pytest.raises(ApiError) as caught:
        _client(server).chat(
            model=MODEL, messages=V2["messages"], request_options={"max_retries": 0}
        )
    error = caught.value
    assert (type(error).__name__, error.status_code) == (kind, code)
    assert set(error.body) == {"id", "message"}


def test_a_429_with_retry_after_carries_the_header_to_the_sdk_s_error(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.status(429, retry_after=1))
    with pytest.raises(cohere.TooManyRequestsError) as caught:
        _client(server).chat(
            model=MODEL, messages=V2["messages"], request_options={"max_retries": 0}
        )
    assert caught.value.headers["retry-after"] == "1"


def test_a_prompt_too_long_is_cohere_s_too_many_tokens_400(server: FaultInjectingServer) -> None:
    server.script(Fault.context_length_exceeded("cohere", tokens=130_000, maximum=128_000))
    status, _, raw = _post(server, "/v2/chat", V2)
    assert status == 400
    assert json.loads(raw)["message"].startswith(
        "too many tokens: total number of tokens in the prompt cannot exceed 128000 - "
        "received 130000."
    )


def test_a_failure_after_the_stream_started_ends_it_with_finish_reason_error(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.error_event(500, after_chunks=2))
    events = list(_client(server).chat_stream(model=MODEL, messages=V2["messages"]))
    texts = [event.delta.message.content.text for event in events if event.type == "content-delta"]
    assert texts == ["Paris", " is"]
    end = events[-1]
    # Nothing raises: the SDK yields the end like any other.
    assert (end.type, end.delta.finish_reason) == ("message-end", "ERROR")
    assert end.delta.error


def test_a_malformed_chunk_is_skipped_by_the_sdk_and_the_stream_goes_on(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.malformed_chunk(after_chunks=1))
    events = list(_client(server).chat_stream(model=MODEL, messages=V2["messages"]))
    texts = [event.delta.message.content.text for event in events if event.type == "content-delta"]
    assert "".join(texts) == "Paris is the capital."
    assert events[-1].type == "message-end"
