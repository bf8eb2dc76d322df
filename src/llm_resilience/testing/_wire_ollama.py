"""Ollama's native chat API, as the fake server speaks it: ``POST /api/chat``'s answer, its
stream of newline-delimited JSON, and its errors.

The shapes are the ones the ``ollama`` Python SDK (0.6) decodes and Ollama's server
(``server/routes.go``, ``server/sched.go``, ``api/types.go`` of ollama/ollama) writes:

* a call answers one JSON object: ``model``, ``created_at``, ``message`` (``role``,
  ``content``, and ``tool_calls`` whose ``arguments`` are an object, not a string),
  ``done: true``, ``done_reason`` and the counters ``prompt_eval_count`` (prompt tokens
  evaluated) and ``eval_count`` (tokens generated), with durations in nanoseconds;
* a stream (``"stream": true``, Ollama's default) is ``application/x-ndjson``: one such
  object per line, ``done: false`` with a piece of ``message.content``, and a last line
  with ``done: true``, the ``done_reason`` and the counters; no SSE, no end marker
  besides that line;
* an error is ``{"error": "<text>"}`` with the status: 503 "server busy, please try
  again.  maximum pending requests exceeded" when the scheduler's queue
  (``OLLAMA_MAX_QUEUE``) is full, 404 "model \\"M\\" not found, try pulling it first",
  400 for a request it cannot read, 500 for anything else (a model runner that crashed:
  "llama runner process has terminated: ..."). Ollama sends no ``Retry-After``. The SDK
  raises ``ResponseError(error, status_code)``;
* a failure after a stream started is one more line ``{"error": "<text>"}``; the SDK
  raises ``ResponseError`` for it with no status (``status_code`` -1).

Ollama reports no cache or reasoning split: a thinking model's thinking is inside
``eval_count``, and a prompt prefix reused from its KV cache is simply not counted again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

from llm_resilience.testing._wire_base import Answer, Phase, Provider, Route, Wire

__all__ = [
    "OLLAMA",
    "OllamaWire",
    "OLLAMA_BUSY",
    "OLLAMA_STREAM_CONTENT_TYPE",
    "ollama_body",
    "ollama_error",
    "ollama_events",
    "ollama_malformed_line",
    "ollama_stream_error",
]


#: The ``Content-Type`` of a streamed ``/api/chat`` answer.
OLLAMA_STREAM_CONTENT_TYPE = "application/x-ndjson"
#: Ollama's ``ErrMaxQueue`` text (two spaces before "maximum", as the server has it),
#: sent with a 503 when more requests wait than ``OLLAMA_MAX_QUEUE`` allows.
OLLAMA_BUSY = "server busy, please try again.  maximum pending requests exceeded"

# Ollama's errors by status. A 401 or 403 comes from a cloud model proxied to
# ollama.com (``server/cloud_proxy.go``: "unauthorized" with a ``signin_url``; cloud
# disabled) or from a reverse proxy in front of Ollama; a 502 from that proxy (the
# cloud proxy also answers 502 when ollama.com cannot be reached); a 429 and a 504 only
# from something in front of Ollama.
_OLLAMA_ERRORS: dict[int, str] = {
    # gin's JSON binding error, as ChatHandler passes it on.
    400: "json: cannot unmarshal string into Go struct field ChatRequest.messages of type "
    "[]api.Message",
    401: "unauthorized",
    403: "ollama cloud is disabled",
    404: 'model "llama3.2" not found, try pulling it first',
    429: "too many requests, please try again later",
    500: "llama runner process has terminated: exit status 2",
    502: "dial tcp: lookup ollama.com: no such host",
    503: OLLAMA_BUSY,
    # nginx's words for it (its page's title), the usual proxy in front of Ollama.
    504: "504 Gateway Time-out",
}
# What Ollama's server writes when its runner fails after the stream started
# (``llm/server.go``'s ``Completion``), as the stream's last line.
_STREAM_FAILURE = "an error was encountered while running the model: unexpected EOF"


def ollama_error(code: int) -> dict[str, Any]:
    """Ollama's error body for ``code``: ``{"error": "<text>"}``."""
    return {"error": _OLLAMA_ERRORS.get(code, f"status {code}")}


def _created_at() -> str:
    # Go's RFC 3339 with nanoseconds, in UTC, as Ollama writes ``created_at``.
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())


def _message(answer: Answer, content: str, *, with_tool: bool) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if with_tool and answer.tool is not None:
        message["content"] = ""
        message["tool_calls"] = [
            {"function": {"name": answer.tool.name, "arguments": answer.tool.arguments}}
        ]
    return message


def _done(answer: Answer) -> dict[str, Any]:
    """The fields of the last object: why it stopped, the counters, the durations (ns)."""
    return {
        "done": True,
        "done_reason": answer.finish,
        "total_duration": 1_000_000,
        "load_duration": 100_000,
        "prompt_eval_count": answer.input_tokens,
        "prompt_eval_duration": 200_000,
        "eval_count": answer.output_tokens,
        "eval_duration": 700_000,
    }


def ollama_body(answer: Answer) -> dict[str, Any]:
    """``/api/chat``'s answer to a call (``"stream": false``)."""
    text = "" if answer.tool is not None else answer.text
    return {
        "model": answer.model,
        "created_at": _created_at(),
        "message": _message(answer, text, with_tool=True),
        **_done(answer),
    }


def _line(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data).encode() + b"\n"


def ollama_events(answer: Answer, *, end_marker: bool = True) -> Iterator[tuple[bytes, Phase]]:
    """A stream's lines, each with its phase: one per piece of text (``done: false``),
    then the ``done: true`` line with the counters (a tool call rides on that line).

    ``end_marker=False`` leaves out the ``done: true`` line, the only end a stream has.
    """
    if answer.tool is None:
        for piece in answer.pieces:
            line = {
                "model": answer.model,
                "created_at": _created_at(),
                "message": _message(answer, piece, with_tool=False),
                "done": False,
            }
            yield _line(line), "content"
    if end_marker:
        last = {
            "model": answer.model,
            "created_at": _created_at(),
            "message": _message(answer, "", with_tool=True),
            **_done(answer),
        }
        yield _line(last), "tail"


def ollama_stream_error(code: int) -> bytes:
    """The line Ollama ends a failed stream with: ``{"error": ...}`` (the status is lost:
    the response already said 200). A 5xx is the runner's failure text."""
    text = _STREAM_FAILURE if code >= 500 else _OLLAMA_ERRORS.get(code, f"status {code}")
    return _line({"error": text})


def ollama_malformed_line() -> bytes:
    """A line that is not JSON: the SDK's ``json.loads`` of it fails."""
    return b'{"model": "llama3.2", "created_at": "2026-01-01T00:00:00Z", "mess\n'


class OllamaWire(Wire):
    """Ollama's ``/api/chat``: newline-delimited JSON, streamed unless asked not to."""

    name: Provider = "ollama"
    streams_by_default = True
    openai_tools = True  # Ollama takes OpenAI's tool shape

    def route(self, path: str) -> Route | None:
        return Route() if path == "/api/chat" else None

    error_body = staticmethod(ollama_error)
    error_event = staticmethod(ollama_stream_error)
    malformed_event = staticmethod(ollama_malformed_line)

    def context_overflow(self, tokens: int, maximum: int) -> dict[str, Any]:
        # Ollama answers a prompt longer than its context window (``num_ctx``) with a
        # 200: it truncates the prompt (logging "truncating input prompt") and goes on.
        raise ValueError("Ollama has no context-overflow error: it truncates the prompt")

    def finish(self, *, tool: bool, filtered: bool) -> str:
        # Ollama has no content filter: a cut answer still says why it stopped.
        return "stop"

    body = staticmethod(ollama_body)
    events = staticmethod(ollama_events)

    def stream_headers(self, payload: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        # Newline-delimited JSON objects, not SSE.
        return (("Content-Type", OLLAMA_STREAM_CONTENT_TYPE),)


OLLAMA = OllamaWire()
