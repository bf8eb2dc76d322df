"""The fault server's Groq route, on the wire: OpenAI's API with Groq's errors and additions."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from llm_resilience.testing import Fault, FaultInjectingServer

PATH = "/openai/v1/chat/completions"
MODEL = "llama-3.3-70b-versatile"


def _post(
    server: FaultInjectingServer, *, stream: bool = False, **extra: Any
) -> tuple[int, bytes, dict[str, str]]:
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "stream": stream,
        **extra,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{PATH}",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def _chunks(raw: bytes) -> list[dict[str, Any]]:
    lines = raw.decode().splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def test_a_call_answers_with_groq_s_usage_timings_and_x_groq_request_id() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        status, raw, headers = _post(server)
        [served] = server.requests
    body = json.loads(raw)
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "Paris is the capital."
    assert body["x_groq"]["id"].startswith("req_")
    assert body["service_tier"] == "on_demand"
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (6, 4, 10)
    assert {"queue_time", "prompt_time", "completion_time", "total_time"} <= usage.keys()
    assert headers["x-request-id"].startswith("req_")
    assert (served.provider, served.model, served.path) == ("groq", MODEL, PATH)


def test_cached_and_reasoning_tokens_are_inside_the_prompt_and_completion_counts() -> None:
    details = {"cache_read": 3, "cache_write_5m": 5, "reasoning": 2}
    with FaultInjectingServer(reply="Paris is the capital.", usage_details=details) as server:
        _, raw, _ = _post(server)
    usage = json.loads(raw)["usage"]
    # Groq reports no cache writes: they are neither counted nor detailed.
    assert usage["prompt_tokens"] == 6 + 3
    assert usage["prompt_tokens_details"] == {"cached_tokens": 3}
    assert usage["completion_tokens"] == 4 + 2
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 2}
    assert usage["total_tokens"] == 9 + 6


def test_a_stream_carries_x_groq_first_and_last_with_the_usage_in_the_last() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        status, raw, _ = _post(server, stream=True)
    chunks = _chunks(raw)
    texts = [c["choices"][0]["delta"].get("content") or "" for c in chunks]
    assert status == 200
    assert "".join(texts) == "Paris is the capital."
    assert raw.decode().rstrip().endswith("data: [DONE]")
    assert "usage" not in chunks[0]["x_groq"]
    assert [("x_groq" in c) for c in chunks] == [True] + [False] * 4 + [True]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["x_groq"]["usage"]["completion_tokens"] == 4
    assert chunks[0]["x_groq"]["id"] == chunks[-1]["x_groq"]["id"]
    assert all("usage" not in c for c in chunks)


def test_a_stream_asked_for_usage_also_ends_with_openai_s_usage_chunk() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        _, raw, _ = _post(server, stream=True, stream_options={"include_usage": True})
    chunks = _chunks(raw)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["prompt_tokens"] == 6
    assert chunks[-2]["x_groq"]["usage"]["prompt_tokens"] == 6


@pytest.mark.parametrize(
    ("code", "kind", "error_code", "words"),
    [
        (400, "invalid_request_error", None, "messages"),
        (401, "invalid_request_error", "invalid_api_key", "Invalid API Key"),
        (404, "invalid_request_error", "model_not_found", "does not exist"),
        (429, "requests", "rate_limit_exceeded", "Rate limit reached"),
        (498, "capacity_exceeded", "capacity_exceeded", "Flex tier capacity exceeded"),
        (500, "internal_server_error", None, "Internal Server Error"),
        (503, "internal_server_error", "service_unavailable", "over capacity"),
    ],
)
def test_a_status_fault_sends_groq_s_error_object(
    code: int, kind: str, error_code: str | None, words: str
) -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.status(code))
        sent, raw, _ = _post(server)
    error = json.loads(raw)["error"]
    assert sent == code
    assert (error["type"], error.get("code")) == (kind, error_code)
    assert words in error["message"]


def test_a_429_carries_retry_after_in_seconds() -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.status(429, retry_after=2))
        _, _, headers = _post(server)
    assert headers["retry-after"] == "2"


def test_context_too_long_is_groq_s_context_length_exceeded_without_counts() -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.context_length_exceeded("groq"))
        sent, raw, _ = _post(server)
    error = json.loads(raw)["error"]
    assert (sent, error["code"], error["param"]) == (400, "context_length_exceeded", "messages")
    assert error["message"] == "Please reduce the length of the messages or completion."


def test_a_mid_stream_failure_is_a_data_event_holding_groq_s_error_object() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        server.script(Fault.error_event(500, after_chunks=2))
        status, raw, _ = _post(server, stream=True)
    chunks = _chunks(raw)
    assert status == 200
    assert chunks[-1] == {
        "error": {"message": "Internal Server Error", "type": "internal_server_error"}
    }
    assert "[DONE]" not in raw.decode()
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1]) == "Paris is"


def test_a_malformed_chunk_is_cut_short_json_and_the_stream_goes_on() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        server.script(Fault.malformed_chunk(after_chunks=1))
        _, raw, _ = _post(server, stream=True)
    broken = [
        line
        for line in raw.decode().splitlines()
        if line.startswith('data: {"id": "chatcmpl-broken"')
    ]
    assert len(broken) == 1
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken[0][6:])
    assert raw.decode().rstrip().endswith("data: [DONE]")


def test_the_openai_route_is_left_as_openai_s() -> None:
    with FaultInjectingServer() as server:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/v1/chat/completions",
            data=json.dumps({"model": "gpt-4o-mini", "messages": []}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = json.loads(answer.read())
        [served] = server.requests
    assert served.provider == "openai"
    assert "x_groq" not in body
