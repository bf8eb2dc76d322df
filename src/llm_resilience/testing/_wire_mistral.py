"""Mistral's chat API wire, as the fake server speaks it: ``POST /v1/chat/completions``
answered as one JSON body or as SSE, and Mistral's error bodies.

Mistral's path is OpenAI's, so the server serves it under a prefix of its own
(``/mistral/v1/chat/completions``, ``FaultInjectingServer.mistral_base_url``) and the
clients are pointed there: ``Mistral(server_url=...)``, ``ChatMistralAI(endpoint=...)``,
LlamaIndex ``MistralAI(endpoint=...)``.

Where the shapes come from:

* the answer, a stream's chunks and usage: the ``mistralai`` SDK's models
  (``ChatCompletionResponse``, ``CompletionChunk``, ``UsageInfo``; finish reasons
  ``stop``, ``length``, ``model_length``, ``error``, ``tool_calls``). A stream is
  ``data:`` events ending in ``data: [DONE]`` (the SDK's sentinel); the last chunk before
  it carries the finish reason and the usage, with no ``stream_options`` to ask for it.
  ``UsageInfo`` has no cache or reasoning counts, so none are sent;
* errors: the API's error object ``{"object": "error", "message", "type", "param",
  "code"}``, as users report it (a 429 ``rate_limited`` with code ``"1300"``; a 429
  ``service_tier_capacity_exceeded``, "Service tier capacity exceeded for this model.",
  code ``"3505"``); a 422 is the SDK's ``HTTPValidationError`` body (``{"detail": [...]}``,
  FastAPI's validation errors); a bad key is the API gateway's ``{"message":
  "Unauthorized", "request_id"}``. A prompt over the context window is a 400 "Prompt
  contains N tokens and 0 draft tokens, too large for model with M maximum context
  length".
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from llm_resilience.testing._wire_base import Answer, Phase, Provider, Route, Wire, sse

__all__ = [
    "MISTRAL",
    "MistralWire",
    "MISTRAL_CAPACITY_EXCEEDED",
    "MISTRAL_PREFIX",
    "mistral_body",
    "mistral_context_overflow",
    "mistral_error",
    "mistral_events",
]


#: The path prefix the fake server serves Mistral's API under.
MISTRAL_PREFIX = "/mistral"

# Mistral's error objects by status: (message, type, code).
_MISTRAL_ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request.", "invalid_request_error", None),
    403: ("You are not allowed to access this model.", "forbidden", None),
    404: ("Invalid model: unknown-model", "invalid_model", "1500"),
    429: ("Rate limit exceeded", "rate_limited", "1300"),
    500: ("Internal server error", "internal_server_error", None),
    503: ("Service unavailable", "service_unavailable", None),
}

#: Mistral's own overload answer, sent with a 429: the service tier has no capacity left
#: for the model (not the caller's rate limit).
MISTRAL_CAPACITY_EXCEEDED: dict[str, Any] = {
    "object": "error",
    "message": "Service tier capacity exceeded for this model.",
    "type": "service_tier_capacity_exceeded",
    "param": None,
    "code": "3505",
}


def _error_object(message: Any, kind: str, code: str | None) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": kind, "param": None, "code": code}


def mistral_error(code: int) -> dict[str, Any]:
    """Mistral's error body for status ``code``."""
    if code == 401:
        return {"message": "Unauthorized", "request_id": uuid.uuid4().hex}
    if code == 422:
        return {
            "detail": [
                {
                    "type": "missing",
                    "loc": ["body", "messages"],
                    "msg": "Field required",
                    "input": {},
                }
            ]
        }
    message, kind, error_code = _MISTRAL_ERRORS.get(
        code,
        (
            f"Request failed with status {code}.",
            "internal_server_error" if code >= 500 else "invalid_request_error",
            None,
        ),
    )
    return _error_object(message, kind, error_code)


def mistral_context_overflow(tokens: int, maximum: int) -> dict[str, Any]:
    """The 400 body for a prompt longer than the model's context window."""
    message = (
        f"Prompt contains {tokens} tokens and 0 draft tokens, too large for model with "
        f"{maximum} maximum context length"
    )
    return _error_object(message, "invalid_request_error", None)


def _usage(answer: Answer) -> dict[str, int]:
    return {
        "prompt_tokens": answer.input_tokens,
        "completion_tokens": answer.output_tokens,
        "total_tokens": answer.input_tokens + answer.output_tokens,
    }


def _tool_calls(answer: Answer) -> list[dict[str, Any]] | None:
    if answer.tool is None:
        return None
    # Mistral's tool-call ids are nine characters of [a-zA-Z0-9].
    return [
        {
            "id": uuid.uuid4().hex[:9],
            "type": "function",
            "function": {"name": answer.tool.name, "arguments": json.dumps(answer.tool.arguments)},
            "index": 0,
        }
    ]


def mistral_body(answer: Answer) -> dict[str, Any]:
    """A ``ChatCompletionResponse``."""
    calls = _tool_calls(answer)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "" if calls else answer.text,
        "tool_calls": calls,
        "prefix": False,
    }
    return {
        "id": answer.id,
        "object": "chat.completion",
        "model": answer.model,
        "created": answer.created,
        "usage": _usage(answer),
        "choices": [{"index": 0, "message": message, "finish_reason": answer.finish}],
    }


MISTRAL_DONE = b"data: [DONE]\n\n"


def mistral_events(answer: Answer, *, end_marker: bool = True) -> Iterator[tuple[bytes, Phase]]:
    """``CompletionChunk`` events: the role, one per content piece, the finish with the
    usage, then ``[DONE]`` (left out with ``end_marker=False``)."""

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        return sse(
            {
                "id": answer.id,
                "object": "chat.completion.chunk",
                "created": answer.created,
                "model": answer.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                **extra,
            }
        )

    yield chunk({"role": "assistant", "content": ""}), "head"
    calls = _tool_calls(answer)
    if calls is not None:
        # Mistral sends a tool call whole, in one delta.
        yield chunk({"tool_calls": calls}), "content"
    else:
        for piece in answer.pieces:
            yield chunk({"content": piece}), "content"
    yield chunk({"content": ""}, answer.finish, usage=_usage(answer)), "tail"
    if end_marker:
        yield MISTRAL_DONE, "tail"


class MistralWire(Wire):
    """Mistral's Chat Completions API, served under ``MISTRAL_PREFIX``."""

    name: Provider = "mistral"
    openai_tools = True

    def route(self, path: str) -> Route | None:
        if path.startswith(MISTRAL_PREFIX + "/") and path.endswith("/chat/completions"):
            return Route()
        return None

    error_body = staticmethod(mistral_error)

    def error_event(self, code: int) -> bytes:
        # Mistral documents no in-stream error event; its error object as a data event.
        return sse(mistral_error(code))

    def malformed_event(self) -> bytes:
        return b'data: {"id": "broken", "object": "chat.completion.chunk", "cho\n\n'

    context_overflow = staticmethod(mistral_context_overflow)

    def finish(self, *, tool: bool, filtered: bool) -> str:
        # Mistral has no content-filter finish reason; a cut answer ends with "stop".
        return "tool_calls" if tool else "stop"

    body = staticmethod(mistral_body)
    events = staticmethod(mistral_events)

    def request_id_header(self) -> tuple[str, str] | None:
        return "mistral-correlation-id", str(uuid.uuid4())


MISTRAL = MistralWire()
