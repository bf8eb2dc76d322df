"""``Fault.error_event``: the provider's own error event inside a 200 stream, as the
matrix's mid-stream overload and server-error cells need it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from llm_resilience.testing import Fault, FaultInjectingServer

REPLY = "one two three four five"
ROUTES = {
    "openai": (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    ),
    "anthropic": (
        "/v1/messages",
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    ),
}


def _text(provider: str, event: dict[str, Any]) -> str:
    """The content text one event carries ("" for any other event)."""
    if provider == "anthropic":
        return str(event["delta"]["text"]) if event.get("type") == "content_block_delta" else ""
    choices = event.get("choices") or []
    return str(choices[0]["delta"].get("content") or "") if choices else ""


def _data_lines(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]


@pytest.mark.parametrize(
    ("provider", "code", "expected_error"),
    [
        ("anthropic", 529, {"type": "overloaded_error", "message": "Overloaded"}),
        ("anthropic", 500, {"type": "api_error", "message": "Internal server error"}),
        ("openai", 500, {"type": "server_error"}),
    ],
)
def test_a_stream_ends_with_the_providers_error_event_after_the_scripted_chunks(
    provider: str, code: int, expected_error: dict[str, str]
) -> None:
    path, payload = ROUTES[provider]
    with FaultInjectingServer(reply=REPLY) as server:
        server.script(Fault.error_event(code, after_chunks=2))
        # A complete, well-terminated body: httpx raises nothing while reading it.
        response = httpx.post(server.anthropic_base_url + path, json={**payload, "stream": True})
    assert response.status_code == 200
    events = _data_lines(response.text)
    texts = [_text(provider, event) for event in events]
    assert "".join(texts) == " ".join(REPLY.split()[:2])
    last = events[-1]
    error = last["error"]
    assert isinstance(error, dict)
    assert expected_error.items() <= error.items()
    if provider == "anthropic":
        assert last["type"] == "error"
        assert "event: error\n" in response.text
    assert "[DONE]" not in response.text


def test_a_call_scripted_with_an_error_event_gets_the_plain_status_answer() -> None:
    path, payload = ROUTES["anthropic"]
    with FaultInjectingServer(reply=REPLY) as server:
        server.script(Fault.error_event(529))
        response = httpx.post(server.anthropic_base_url + path, json=payload)
    assert response.status_code == 529
    assert response.json()["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize(("option", "value"), [("code", 200), ("code", True), ("after_chunks", -1)])
def test_error_event_refuses_a_bad_option_naming_it(option: str, value: object) -> None:
    with pytest.raises(ValueError, match=option):
        Fault.error_event(**{option: value})  # type: ignore[arg-type]
