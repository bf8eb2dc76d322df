"""The fault server's Gemini API route, on the wire: what generateContent answers and fails with."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from llm_resilience.testing import Fault, FaultInjectingServer

CALL = "/v1beta/models/gemini-2.5-flash:generateContent"
STREAM = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
REQUEST = {"contents": [{"role": "user", "parts": [{"text": "What is the capital of France?"}]}]}


def _post(server: FaultInjectingServer, path: str = CALL) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{path}",
        data=json.dumps(REQUEST).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]


def test_generate_content_answers_with_a_candidate_finish_reason_and_usage_metadata() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        status, raw = _post(server)
        [served] = server.requests
    body = json.loads(raw)
    assert status == 200
    [candidate] = body["candidates"]
    assert candidate["content"]["parts"][0]["text"] == "Paris is the capital."
    assert candidate["finishReason"] == "STOP"
    usage = body["usageMetadata"]
    assert (usage["promptTokenCount"], usage["candidatesTokenCount"]) == (6, 4)
    assert usage["totalTokenCount"] == 10
    assert "cachedContentTokenCount" not in usage
    assert "thoughtsTokenCount" not in usage
    assert (served.provider, served.model, served.stream) == ("gemini", "gemini-2.5-flash", False)


def test_usage_details_become_cached_content_and_thoughts_token_counts() -> None:
    details = {"cache_read": 3, "reasoning": 2}
    with FaultInjectingServer(reply="Paris is the capital.", usage_details=details) as server:
        _, raw = _post(server)
    usage = json.loads(raw)["usageMetadata"]
    assert usage["cachedContentTokenCount"] == 3
    assert usage["thoughtsTokenCount"] == 2
    assert usage["promptTokenCount"] == 6 + 3
    assert usage["candidatesTokenCount"] == 4
    assert usage["totalTokenCount"] == 9 + 4 + 2


def test_stream_generate_content_sends_sse_text_chunks_then_the_finish_reason() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        status, raw = _post(server, STREAM)
        [served] = server.requests
    events = _events(raw)
    texts = [event["candidates"][0]["content"]["parts"][0]["text"] for event in events]
    assert status == 200
    assert served.stream
    assert "".join(texts) == "Paris is the capital."
    assert [event["candidates"][0].get("finishReason") for event in events][-1] == "STOP"
    assert all("finishReason" not in event["candidates"][0] for event in events[:-1])
    assert events[-1]["usageMetadata"]["candidatesTokenCount"] == 4


@pytest.mark.parametrize(
    ("code", "status", "words"),
    [
        (400, "INVALID_ARGUMENT", "invalid argument"),
        (401, "UNAUTHENTICATED", "authentication"),
        (403, "PERMISSION_DENIED", "unregistered"),
        (404, "NOT_FOUND", "not found"),
        (429, "RESOURCE_EXHAUSTED", "quota"),
        (500, "INTERNAL", "internal error"),
        (503, "UNAVAILABLE", "overloaded"),
        (504, "DEADLINE_EXCEEDED", "Deadline"),
    ],
)
def test_a_status_fault_sends_google_s_rpc_status_error(code: int, status: str, words: str) -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.status(code))
        sent, raw = _post(server)
    error = json.loads(raw)["error"]
    assert sent == code
    assert (error["code"], error["status"]) == (code, status)
    assert words in error["message"]


def test_a_429_carries_a_retry_info_detail_with_its_retry_delay() -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.status(429))
        _, raw = _post(server)
    details = json.loads(raw)["error"]["details"]
    [retry] = [d for d in details if d["@type"].endswith("google.rpc.RetryInfo")]
    assert retry["retryDelay"] == "7s"


def test_context_too_long_is_gemini_s_input_token_count_message() -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.context_length_exceeded("gemini", tokens=1_100_000, maximum=1_048_576))
        sent, raw = _post(server)
    error = json.loads(raw)["error"]
    assert (sent, error["status"]) == (400, "INVALID_ARGUMENT")
    assert error["message"] == (
        "The input token count (1100000) exceeds the maximum number of tokens allowed (1048576)."
    )


def test_a_blocked_prompt_is_a_200_with_prompt_feedback_and_no_candidates() -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.content_filtered(prompt=True))
        sent, raw = _post(server)
        server.script(Fault.content_filtered(prompt=True))
        _, streamed = _post(server, STREAM)
    body = json.loads(raw)
    assert sent == 200
    assert body["promptFeedback"]["blockReason"] == "SAFETY"
    assert "candidates" not in body
    assert [event["promptFeedback"]["blockReason"] for event in _events(streamed)] == ["SAFETY"]


def test_a_filtered_answer_stops_with_finish_reason_safety() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        server.script(Fault.content_filtered(after_chunks=1))
        _, raw = _post(server, STREAM)
    events = _events(raw)
    assert events[-1]["candidates"][0]["finishReason"] == "SAFETY"
    assert "".join(e["candidates"][0]["content"]["parts"][0]["text"] for e in events) == "Paris"


def test_a_mid_stream_error_event_is_an_error_object_in_the_sse_body() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        server.script(Fault.error_event(500, after_chunks=2))
        status, raw = _post(server, STREAM)
    events = _events(raw)
    assert status == 200
    assert len(events) == 3
    assert events[-1] == {
        "error": {
            "code": 500,
            "message": "An internal error has occurred. Please retry or report.",
            "status": "INTERNAL",
        }
    }
