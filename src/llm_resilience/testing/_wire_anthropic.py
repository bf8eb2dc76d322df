"""Anthropic's Messages wire format, as the fake server speaks it on ``POST .../messages``:
errors, answers, named SSE events from ``message_start`` to ``message_stop``.

A final assistant message is a prefill: one ending in whitespace is refused with
Anthropic's 400, as the API does. An answer after a compaction (``Fault.compacted``)
reports the summarising step in ``usage.iterations`` and may open with its
``compaction`` block.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from llm_resilience.testing._wire_base import (
    Answer,
    Phase,
    Provider,
    Route,
    Wire,
    anthropic_invalid_request,
    ending,
    sse,
    texts,
)

__all__ = ["ANTHROPIC", "AnthropicWire"]

_ANTHROPIC_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Your API key does not have permission to use this resource."),
    404: ("not_found_error", "The requested resource could not be found."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of requests has exceeded your rate limit."),
    500: ("api_error", "Internal server error"),
    503: ("api_error", "Service unavailable"),
    529: ("overloaded_error", "Overloaded"),
}
_TRAILING_WHITESPACE = "messages: final assistant content cannot end with trailing whitespace"
_STOP = b"event: message_stop\n" + sse({"type": "message_stop"})
# What a compacted answer's ``context_management`` says: compaction is no listed edit.
_NO_EDITS: dict[str, Any] = {"applied_edits": []}


def _event(data: dict[str, Any]) -> bytes:
    return b"event: %s\n" % str(data["type"]).encode() + sse(data)


def _usage(answer: Answer, output_tokens: int) -> dict[str, Any]:
    five_minutes = answer.details.get("cache_write_5m", 0)
    one_hour = answer.details.get("cache_write_1h", 0)
    usage: dict[str, Any] = {
        "input_tokens": answer.input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": five_minutes + one_hour,
        "cache_read_input_tokens": answer.details.get("cache_read", 0),
    }
    if answer.details:
        usage["cache_creation"] = {
            "ephemeral_5m_input_tokens": five_minutes,
            "ephemeral_1h_input_tokens": one_hour,
        }
    if answer.reasoning_tokens and output_tokens == answer.output_tokens:
        # Only with the final output count: the thinking is part of it.
        usage["output_tokens_details"] = {"thinking_tokens": answer.reasoning_tokens}
    if answer.compaction is not None and output_tokens == answer.output_tokens:
        # With the final counts only: the top-level counts are the message's alone.
        message = {key: value for key, value in usage.items() if key != "output_tokens_details"}
        usage["iterations"] = [
            _compaction_iteration(answer.compaction),
            {**message, "type": "message"},
        ]
    return usage


def _compaction_iteration(counts: Mapping[str, int]) -> dict[str, Any]:
    five_minutes, one_hour = counts["cache_write_5m"], counts["cache_write_1h"]
    return {
        "type": "compaction",
        "input_tokens": counts["input_tokens"],
        "output_tokens": counts["output_tokens"],
        "cache_creation_input_tokens": five_minutes + one_hour,
        "cache_read_input_tokens": counts["cache_read"],
        "cache_creation": {
            "ephemeral_5m_input_tokens": five_minutes,
            "ephemeral_1h_input_tokens": one_hour,
        },
    }


def _block(answer: Answer, *, streaming: bool) -> dict[str, Any]:
    if answer.tool is not None:
        return {
            "type": "tool_use",
            "id": answer.tool_id,
            "name": answer.tool.name,
            "input": {} if streaming else answer.tool.arguments,
        }
    return {"type": "text", "text": "" if streaming else answer.text}


def _message(answer: Answer, *, streaming: bool) -> dict[str, Any]:
    done = not streaming
    content = [_block(answer, streaming=False)]
    if answer.summary is not None:
        content.insert(0, {"type": "compaction", "content": answer.summary})
    message = {
        "id": answer.id,
        "type": "message",
        "role": "assistant",
        "model": answer.model,
        "content": content if done else [],
        "stop_reason": answer.finish if done else None,
        "stop_sequence": None,
        "usage": _usage(answer, answer.output_tokens if done else 1),
    }
    if answer.compaction is not None and done:
        message["context_management"] = _NO_EDITS
    elif answer.compaction is not None:
        # A stream opens with the first sampling step's input, the summary's (as the API
        # sends it); the final counts come in ``message_delta``.
        opening = _compaction_iteration(answer.compaction)
        opening["output_tokens"] = 1
        del opening["type"]
        message["usage"] = opening
    return message


def _events(answer: Answer) -> Iterator[tuple[bytes, Phase]]:
    message = _message(answer, streaming=True)
    yield _event({"type": "message_start", "message": message}), "head"
    index = 0
    if answer.summary is not None:
        # The summary comes whole in one delta, before the answer's own block.
        summary = {"type": "compaction", "content": None}
        yield _event({"type": "content_block_start", "index": 0, "content_block": summary}), "head"
        delta = {"type": "compaction_delta", "content": answer.summary}
        yield _event({"type": "content_block_delta", "index": 0, "delta": delta}), "head"
        yield _event({"type": "content_block_stop", "index": 0}), "head"
        index = 1
    block = _block(answer, streaming=True)
    yield _event({"type": "content_block_start", "index": index, "content_block": block}), "head"
    yield _event({"type": "ping"}), "head"
    for piece in answer.pieces:
        if answer.tool is not None:
            delta = {"type": "input_json_delta", "partial_json": piece}
        else:
            delta = {"type": "text_delta", "text": piece}
        yield _event({"type": "content_block_delta", "index": index, "delta": delta}), "content"
    yield _event({"type": "content_block_stop", "index": index}), "tail"
    yield (
        _event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": answer.finish, "stop_sequence": None},
                # Cumulative, as the API sends it now; LangChain reads input here.
                "usage": _usage(answer, answer.output_tokens),
                **({"context_management": _NO_EDITS} if answer.compaction is not None else {}),
            }
        ),
        "tail",
    )
    yield _STOP, "tail"


class AnthropicWire(Wire):
    """Anthropic's Messages API."""

    name: Provider = "anthropic"

    def route(self, path: str) -> Route | None:
        return Route() if path.endswith("/messages") else None

    def error_body(self, code: int) -> dict[str, Any]:
        fallback = ("api_error" if code >= 500 else "invalid_request_error", f"Status {code}")
        kind, message = _ANTHROPIC_ERRORS.get(code, fallback)
        return {
            "type": "error",
            "error": {"type": kind, "message": message},
            "request_id": f"req_{uuid.uuid4().hex}",
        }

    def budget_exhausted(self) -> tuple[int, dict[str, Any]]:
        body = self.error_body(402)
        body["error"] = {
            "type": "billing_error",
            "message": "Your credit balance is too low to access the Anthropic API.",
        }
        return 402, body

    def error_event(self, code: int) -> bytes:
        """``event: error`` carrying the error body (``overloaded_error`` for 529)."""
        body = self.error_body(code)
        body.pop("request_id", None)
        return b"event: error\n" + sse(body)

    def malformed_event(self) -> bytes:
        # Named ``content_block_delta``, a type the SDK decodes.
        return b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0\n\n'

    def context_overflow(self, tokens: int, maximum: int) -> dict[str, Any]:
        return {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": f"prompt is too long: {tokens} tokens > {maximum} maximum",
            },
        }

    def prefill_problem(self, prefill: str | None) -> dict[str, Any] | None:
        if prefill and prefill != prefill.rstrip():
            return anthropic_invalid_request(_TRAILING_WHITESPACE)
        return None

    def prompt_texts(self, payload: Mapping[str, Any]) -> Iterator[str]:
        return texts(payload.get("system"))

    def body(self, answer: Answer) -> dict[str, Any]:
        return _message(answer, streaming=False)

    def events(self, answer: Answer, *, end_marker: bool) -> Iterator[tuple[bytes, Phase]]:
        return ending(_events(answer), _STOP, end_marker=end_marker)

    def request_id_header(self) -> tuple[str, str] | None:
        return "request-id", f"req_{uuid.uuid4().hex}"


ANTHROPIC = AnthropicWire()
