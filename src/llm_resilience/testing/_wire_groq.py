"""Groq's wire format, as the fake server speaks it on ``POST /openai/v1/chat/completions``.

Groq serves an OpenAI-compatible Chat Completions API, so an answer is OpenAI's (the
``Answer`` built for the ``openai`` wire) with Groq's additions, as the ``groq`` SDK's
types declare them (``groq/types/chat/chat_completion.py``, ``chat_completion_chunk.py``,
``completion_usage.py``, groq 0.37):

* ``usage`` also reports ``queue_time``, ``prompt_time``, ``completion_time`` and
  ``total_time`` (seconds); cached prompt tokens are inside ``prompt_tokens``
  (``prompt_tokens_details.cached_tokens``), reasoning tokens inside
  ``completion_tokens`` (``completion_tokens_details.reasoning_tokens``); Groq reports no
  cache writes;
* ``x_groq`` carries Groq's request id (``req_...``): in a body, and in a stream's first and
  last chunk; the last chunk's ``x_groq.usage`` is the stream's usage, sent whether or not
  the request asked for ``stream_options.include_usage`` (which adds OpenAI's own usage
  chunk as well);
* ``service_tier`` is ``on_demand``.

Errors follow Groq's error object (console.groq.com/docs/errors): ``{"error": {"message",
"type"}}``, with a ``code`` where Groq sends one (``rate_limit_exceeded``,
``invalid_api_key``, ``model_not_found``, ``context_length_exceeded``). Groq's own
statuses: 498 when the flex service tier is at capacity ("the request won't be processed.
You can try again later"; the flex-processing page names the error ``capacity_exceeded``)
and 503 when a model is over capacity. A failure after a stream started is a ``data:``
event holding ``error`` (what the groq SDK's stream decoder raises ``APIError`` for).
The messages are Groq's where they are public, and plausible where not.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from llm_resilience.testing._wire_base import Answer, Phase, Provider, Route, sse
from llm_resilience.testing._wire_openai import OpenAIWire, openai_body, openai_events, openai_usage

#: The path Groq's clients post to (``groq.Groq`` and OpenAI clients on Groq's base URL).
GROQ_PATH = "/openai/v1/chat/completions"
#: Groq's custom status for a flex-tier request refused at capacity.
GROQ_CAPACITY_EXCEEDED = 498

_INVALID = "invalid_request_error"
_SERVER = "internal_server_error"

# Status -> (message, type, code or None).
_GROQ_ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("'messages' : must be provided and non-empty", _INVALID, None),
    401: ("Invalid API Key", _INVALID, "invalid_api_key"),
    403: ("Permission denied: this API key may not use this model.", "permission_error", None),
    404: (
        "The model `fault-server-model` does not exist or you do not have access to it.",
        _INVALID,
        "model_not_found",
    ),
    429: (
        "Rate limit reached for model `fault-server-model` in organization `org_fault_server` "
        "service tier `on_demand` on requests per minute (RPM): Limit 30, Used 30, "
        "Requested 1. Please try again in 2s.",
        "requests",
        "rate_limit_exceeded",
    ),
    GROQ_CAPACITY_EXCEEDED: (
        "Flex tier capacity exceeded. Please try again later.",
        "capacity_exceeded",
        "capacity_exceeded",
    ),
    500: ("Internal Server Error", _SERVER, None),
    503: (
        "fault-server-model is currently over capacity. Please try again and back off "
        "exponentially.",
        _SERVER,
        "service_unavailable",
    ),
}
# A 502 or 504 comes from the CDN in front of Groq's API (Cloudflare), as an HTML page, not
# as Groq's error object; the matrix sends those pages (``provider_cases``).


def groq_error(code: int) -> dict[str, Any]:
    """Groq's error body for status ``code``."""
    message, kind, error_code = _GROQ_ERRORS.get(
        code, (f"Status {code}", _SERVER if code >= 500 else _INVALID, None)
    )
    error: dict[str, Any] = {"message": message, "type": kind}
    if error_code is not None:
        error["code"] = error_code
    return {"error": error}


def groq_context_length_exceeded() -> dict[str, Any]:
    """Groq's 400 for a prompt longer than the model's context window (it states no counts)."""
    return {
        "error": {
            "message": "Please reduce the length of the messages or completion.",
            "type": _INVALID,
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def groq_request_id() -> str:
    return f"req_{uuid.uuid4().hex[:26]}"


def _usage(answer: Answer) -> dict[str, Any]:
    usage = openai_usage(answer)
    # Groq reports no cache writes, and no audio or prediction counts.
    usage["prompt_tokens"] -= usage["prompt_tokens_details"].pop("cache_write_tokens", 0)
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    usage["prompt_tokens_details"] = {"cached_tokens": answer.details.get("cache_read", 0)}
    usage["completion_tokens_details"] = {"reasoning_tokens": answer.reasoning_tokens}
    usage.update(queue_time=0.01, prompt_time=0.002, completion_time=0.02, total_time=0.032)
    return usage


def _envelope(body: dict[str, Any]) -> dict[str, Any]:
    body["service_tier"] = "on_demand"
    body["system_fingerprint"] = "fp_groq_fault_server"
    return body


def groq_body(answer: Answer, request_id: str) -> dict[str, Any]:
    """A Chat Completions answer as Groq sends it: ``usage`` with timings, ``x_groq``."""
    body = _envelope(openai_body(answer))
    body["usage"] = _usage(answer)
    body["x_groq"] = {"id": request_id}
    return body


def groq_events(
    answer: Answer, request_id: str, *, end_marker: bool = True
) -> Iterator[tuple[bytes, Phase]]:
    """A stream as Groq sends it: OpenAI's chunks, ``x_groq`` on the first and the last
    (``x_groq.usage`` there), OpenAI's usage chunk only when asked, then ``[DONE]``."""
    finish_seen = False
    first = True
    for event, phase in openai_events(answer):
        if event.startswith(b"data: {"):
            chunk = json.loads(event[len(b"data: ") :])
            finishing = any(c.get("finish_reason") for c in chunk.get("choices") or [])
            if first or (finishing and not finish_seen):
                extra: dict[str, Any] = {"id": request_id}
                if finishing:
                    extra["usage"] = _usage(answer)
                chunk["x_groq"] = extra
            if chunk.get("usage"):
                chunk["usage"] = _usage(answer)
            finish_seen = finish_seen or finishing
            first = False
            event = sse(_envelope(chunk))
        elif not end_marker:
            continue
        yield event, phase


def groq_stream_error(code: int) -> bytes:
    """The ``data:`` event Groq ends a failing stream with: its error object."""
    return sse(groq_error(code))


def groq_malformed_event() -> bytes:
    """A chunk cut short: JSON the groq SDK's stream decoder fails on."""
    return b'data: {"id": "chatcmpl-broken", "object": "chat.completion.chunk", "x_gr\n\n'


class GroqWire(OpenAIWire):
    """Groq's OpenAI-compatible API: OpenAI's answers with Groq's errors and additions."""

    name: Provider = "groq"

    def route(self, path: str) -> Route | None:
        return Route() if path == GROQ_PATH else None

    error_body = staticmethod(groq_error)
    error_event = staticmethod(groq_stream_error)
    malformed_event = staticmethod(groq_malformed_event)

    def context_overflow(self, tokens: int, maximum: int) -> dict[str, Any]:
        return groq_context_length_exceeded()

    def budget_exhausted(self) -> tuple[int, dict[str, Any]]:
        # Groq documents no quota body of OpenAI's kind: a spent account is a 402.
        return 402, self.error_body(402)

    def body(self, answer: Answer) -> dict[str, Any]:
        return groq_body(answer, groq_request_id())

    def events(self, answer: Answer, *, end_marker: bool) -> Iterator[tuple[bytes, Phase]]:
        return groq_events(answer, groq_request_id(), end_marker=end_marker)


GROQ = GroqWire()
