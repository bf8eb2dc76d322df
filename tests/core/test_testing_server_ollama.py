"""The fault server's Ollama route, on the wire: what ``POST /api/chat`` answers and fails with."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from llm_resilience.testing import Fault, FaultInjectingServer

CHAT = "/api/chat"
QUESTION = {"role": "user", "content": "What is the capital of France?"}


def _post(server: FaultInjectingServer, **fields: Any) -> tuple[int, str, bytes]:
    payload = {"model": "llama3.2", "messages": [QUESTION], **fields}
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{CHAT}",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers.get("Content-Type", ""), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read()


def _lines(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in raw.decode().splitlines() if line]


def test_a_call_answers_one_object_with_the_message_done_reason_and_eval_counts() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        status, _, raw = _post(server, stream=False)
        [served] = server.requests
    body = json.loads(raw)
    assert status == 200
    assert body["message"] == {"role": "assistant", "content": "Paris is the capital."}
    assert (body["model"], body["done"], body["done_reason"]) == ("llama3.2", True, "stop")
    assert (body["prompt_eval_count"], body["eval_count"]) == (6, 4)
    assert all(isinstance(body[k], int) for k in ("total_duration", "eval_duration"))
    assert (served.provider, served.model, served.stream) == ("ollama", "llama3.2", False)


def test_a_request_that_does_not_say_stream_false_is_streamed_as_ndjson() -> None:
    # Ollama streams by default: "stream" absent means a stream.
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        status, content_type, raw = _post(server)
        [served] = server.requests
    lines = _lines(raw)
    assert status == 200
    assert content_type == "application/x-ndjson"
    assert served.stream
    assert "".join(line["message"]["content"] for line in lines) == "Paris is the capital."
    assert [line["done"] for line in lines] == [False] * 4 + [True]
    last = lines[-1]
    assert (last["done_reason"], last["prompt_eval_count"], last["eval_count"]) == ("stop", 6, 4)
    assert "prompt_eval_count" not in lines[0]


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (503, "server busy, please try again.  maximum pending requests exceeded"),
        (404, 'model "llama3.2" not found, try pulling it first'),
        (500, "llama runner process has terminated: exit status 2"),
        (401, "unauthorized"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
def test_an_error_is_ollama_s_error_object_with_no_retry_after(
    code: int, text: str, stream: bool
) -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.status(code))
        status, content_type, raw = _post(server, stream=stream)
        [served] = server.requests
    assert (status, content_type) == (code, "application/json")
    assert json.loads(raw) == {"error": text}
    assert served.provider == "ollama"


def test_a_failure_after_the_stream_started_is_an_error_line_that_ends_the_body() -> None:
    with FaultInjectingServer(reply="one two three four") as server:
        server.script(Fault.error_event(500, after_chunks=2))
        status, _, raw = _post(server, stream=True)
    lines = _lines(raw)
    assert status == 200
    assert [line["message"]["content"] for line in lines[:2]] == ["one", " two"]
    assert lines[2:] == [
        {"error": "an error was encountered while running the model: unexpected EOF"}
    ]


def test_a_malformed_chunk_is_one_line_that_is_not_json_and_the_stream_goes_on() -> None:
    with FaultInjectingServer(reply="one two three") as server:
        server.script(Fault.malformed_chunk(after_chunks=1))
        _, _, raw = _post(server, stream=True)
    lines = raw.decode().splitlines()
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[1])
    assert json.loads(lines[-1])["done"] is True


def test_missing_done_leaves_out_the_done_line() -> None:
    with FaultInjectingServer(reply="one two") as server:
        server.script(Fault.missing_done())
        _, _, raw = _post(server, stream=True)
    assert [line["done"] for line in _lines(raw)] == [False, False]


def test_a_tool_call_carries_its_arguments_as_an_object_on_the_done_line() -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    weather = {"role": "user", "content": "What is the weather in Paris?"}
    with FaultInjectingServer() as server:
        _, _, raw = _post(server, stream=False, tools=[tool], messages=[weather])
        [served] = server.requests
    message = json.loads(raw)["message"]
    assert served.tool_call
    assert message["tool_calls"] == [
        {"function": {"name": "get_weather", "arguments": {"city": "test"}}}
    ]


def test_ollama_has_no_context_overflow_error_to_script() -> None:
    with pytest.raises(ValueError, match="truncates"):
        Fault.context_length_exceeded("ollama")
