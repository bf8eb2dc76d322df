"""The fault server's Mistral route, on the wire, and through the real ``mistralai`` SDK:
what ``/v1/chat/completions`` under ``/mistral`` answers and fails with."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from llm_resilience.testing import Fault, FaultInjectingServer

CALL = "/mistral/v1/chat/completions"
MODEL = "mistral-small-latest"
QUESTION = "What is the capital of France?"


def _post(
    server: FaultInjectingServer, *, stream: bool = False
) -> tuple[int, dict[str, str], bytes]:
    payload = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}]}
    if stream:
        payload["stream"] = True
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{CALL}",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def _events(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]


def test_a_call_answers_a_chat_completion_with_mistral_s_usage() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        status, headers, raw = _post(server)
        [served] = server.requests
    body = json.loads(raw)
    assert status == 200
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL
    [choice] = body["choices"]
    assert choice["message"]["content"] == "Paris is the capital."
    assert choice["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10}
    assert "mistral-correlation-id" in headers
    assert (served.provider, served.path, served.stream) == ("mistral", CALL, False)


def test_the_openai_path_without_the_prefix_stays_openai_s() -> None:
    with FaultInjectingServer() as server:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/v1/chat/completions",
            data=json.dumps({"model": "gpt-4o-mini", "messages": []}).encode(),
        )
        with urllib.request.urlopen(request, timeout=10):
            pass
        [served] = server.requests
    assert served.provider == "openai"


def test_a_stream_ends_with_the_finish_and_usage_chunk_then_done() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        status, headers, raw = _post(server, stream=True)
    events = _events(raw)
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    texts = [chunk["choices"][0]["delta"].get("content") for chunk in chunks]
    assert "".join(text or "" for text in texts) == "Paris is the capital."
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    # Usage only on the last chunk, with the finish reason; none before it.
    assert [chunk.get("usage") is not None for chunk in chunks] == [False] * (len(chunks) - 1) + [
        True
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_missing_done_leaves_out_only_the_done_marker() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        server.script(Fault.missing_done())
        _, _, raw = _post(server, stream=True)
    events = _events(raw)
    assert "[DONE]" not in events
    assert json.loads(events[-1])["usage"]["total_tokens"] == 10


@pytest.mark.parametrize(
    ("code", "kind", "error_code"),
    [
        (400, "invalid_request_error", None),
        (404, "invalid_model", "1500"),
        (429, "rate_limited", "1300"),
        (500, "internal_server_error", None),
        (503, "service_unavailable", None),
    ],
)
def test_errors_are_mistral_s_error_object(code: int, kind: str, error_code: str | None) -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.status(code))
        status, _, raw = _post(server)
    body = json.loads(raw)
    assert status == code
    assert (body["object"], body["type"], body["code"], body["param"]) == (
        "error",
        kind,
        error_code,
        None,
    )


def test_a_bad_key_is_the_gateway_s_unauthorized_and_a_422_is_a_validation_detail() -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.status(401), Fault.status(422))
        unauthorised = _post(server)
        invalid = _post(server)
    assert unauthorised[0] == 401
    assert json.loads(unauthorised[2])["message"] == "Unauthorized"
    assert invalid[0] == 422
    [detail] = json.loads(invalid[2])["detail"]
    assert detail["msg"] == "Field required"


def test_a_rate_limit_carries_retry_after_when_scripted() -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.status(429, retry_after=3))
        status, headers, _ = _post(server)
    assert (status, headers["retry-after"]) == (429, "3")


def test_context_length_exceeded_is_mistral_s_prompt_too_large_message() -> None:
    fault = Fault.context_length_exceeded("mistral", tokens=40_000, maximum=32_768)
    with FaultInjectingServer() as server:
        server.script(fault)
        status, _, raw = _post(server)
    assert status == 400
    assert json.loads(raw)["message"] == (
        "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 "
        "maximum context length"
    )


def test_the_mistralai_sdk_reads_the_answer_the_stream_and_the_errors() -> None:
    pytest.importorskip("mistralai")
    from mistralai.client import Mistral
    from mistralai.client.errors import HTTPValidationError, SDKError

    with FaultInjectingServer(reply="Paris is the capital.") as server:
        client = Mistral(api_key="sk-FAKE-mistral", server_url=server.mistral_base_url)
        messages: Any = [{"role": "user", "content": QUESTION}]
        reply = client.chat.complete(model=MODEL, messages=messages)
        events = list(client.chat.stream(model=MODEL, messages=messages))
        server.script(Fault.status(429), Fault.status(422))
        with pytest.raises(SDKError) as limited:
            client.chat.complete(model=MODEL, messages=messages)
        with pytest.raises(HTTPValidationError) as invalid:
            client.chat.complete(model=MODEL, messages=messages)
    assert reply.choices[0].message.content == "Paris is the capital."
    assert reply.usage.prompt_tokens == 6
    streamed = "".join(str(event.data.choices[0].delta.content or "") for event in events)
    assert streamed == "Paris is the capital."
    assert events[-1].data.usage is not None
    assert events[-1].data.usage.completion_tokens == 4
    assert limited.value.status_code == 429
    assert invalid.value.status_code == 422
