"""Cohere's Chat API wire, as the fake server speaks it: v2 (``POST /v2/chat``, what
``cohere.ClientV2`` and LangChain's ``ChatCohere`` call) and v1 (``POST /v1/chat``, what
``cohere.Client`` and LlamaIndex's ``Cohere`` call), answers, streams and errors.

Shapes are the cohere SDK's (5.21, Fern-generated from Cohere's API definition):

* a v2 answer is ``V2ChatResponse``: ``id``, ``finish_reason`` (``COMPLETE``), ``message``
  (``role`` ``assistant``, ``content`` of ``{"type": "text", "text"}`` blocks) and
  ``usage``;
* a v2 stream is server-sent events (``event: <type>`` and a ``data:`` JSON whose
  ``type`` repeats it, the SDK's ``V2ChatStreamResponse`` union): ``message-start``,
  ``content-start``, one ``content-delta`` per chunk (``delta.message.content.text``),
  ``content-end`` and ``message-end`` (``delta.finish_reason`` and ``delta.usage``);
* a v1 answer is ``NonStreamedChatResponse``: ``text``, ``generation_id``,
  ``finish_reason`` and ``meta`` (``billed_units``, ``tokens``); a v1 stream is one
  JSON object a line (``application/stream+json``, read by ``iter_lines``):
  ``stream-start``, a ``text-generation`` per chunk and ``stream-end`` carrying the whole
  ``response``;
* usage is ``billed_units`` (what Cohere bills) and ``tokens`` (the same counts here),
  and ``cached_tokens`` for prompt tokens that hit Cohere's cache;
* an error is ``{"id": ..., "message": ...}`` with the HTTP status (docs.cohere.com,
  "Errors"); the SDK raises its typed error per status (``TooManyRequestsError``,
  ``ServiceUnavailableError``, ...; all ``ApiError`` with ``status_code``, ``headers``
  and ``body``). A prompt too long is a 400 "too many tokens: total number of tokens in
  the prompt cannot exceed M - received N. ..." (the documented example message).

Cohere has no error event inside a stream: a generation that fails after the stream
started ends with ``message-end`` whose ``finish_reason`` is ``ERROR`` and whose
``delta.error`` says why (the v2 API definition), which the SDK hands on as a normal
event. The SDK skips a stream event it cannot decode, with a log warning, and goes on.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from llm_resilience.testing._wire_base import SSE_HEADERS, Answer, Phase, Provider, Route, Wire

__all__ = [
    "COHERE",
    "CohereWire",
    "COHERE_V1_STREAM_CONTENT_TYPE",
    "cohere_body",
    "cohere_context_overflow",
    "cohere_error",
    "cohere_error_event",
    "cohere_events",
    "cohere_malformed_event",
    "cohere_prompt_texts",
    "is_cohere_v1",
]


#: The ``Content-Type`` of a v1 chat stream: one JSON object a line.
COHERE_V1_STREAM_CONTENT_TYPE = "application/stream+json"

# Cohere's error messages by status. 429 is a trial key's message as Cohere sends it; 400
# and 401 are examples from Cohere's errors reference. The others are ours (Cohere
# documents no body for them), kept free of the words our classifier reads as transient
# ("timeout", "unavailable"), so the status decides.
_COHERE_ERRORS: dict[int, str] = {
    400: (
        "invalid request: message must be at least 1 token long or tool results must be specified."
    ),
    401: "invalid api token",
    402: "Please add or update your payment method at https://dashboard.cohere.com/billing",
    403: "You do not have access to this model.",
    404: (
        "model 'unknown' not found, make sure the correct model ID was used and that you "
        "have access to the model."
    ),
    422: "invalid request: unprocessable input.",
    429: (
        "You are using a Trial key, which is limited to 10 API calls / minute. You can "
        "continue to use the Trial key for free or upgrade to a Production key with "
        "higher rate limits at 'https://dashboard.cohere.com/api-keys'. Contact us on "
        "'https://discord.gg/XW44jPfYJu' or email us at support@cohere.com with any "
        "questions"
    ),
    498: "invalid api token",
    499: "request cancelled",
    500: "internal server error, this has been reported to our developers. id abc123",
    502: "bad gateway",
    503: "the service is overloaded, please try again shortly",
    504: "the upstream server did not answer in time",
}


def cohere_error(code: int) -> dict[str, Any]:
    """Cohere's error body for ``code``: ``{"id": ..., "message": ...}``."""
    return {"id": str(uuid.uuid4()), "message": _COHERE_ERRORS.get(code, f"status {code}")}


def cohere_context_overflow(tokens: int, maximum: int) -> dict[str, Any]:
    """The 400 body Cohere sends for a prompt longer than the model's window."""
    message = (
        f"too many tokens: total number of tokens in the prompt cannot exceed {maximum} - "
        f"received {tokens}. Try using a shorter prompt, or enabling prompt truncating."
    )
    return {"id": str(uuid.uuid4()), "message": message}


def is_cohere_v1(payload: Mapping[str, Any]) -> bool:
    """A v1 chat request (``message`` and ``chat_history``), not a v2 one (``messages``)."""
    return "messages" not in payload and "message" in payload


def cohere_prompt_texts(payload: Mapping[str, Any]) -> Iterator[str]:
    """A v1 request's text: its ``preamble``, ``chat_history`` and ``message`` (v2 requests
    are ``messages``, which the shared counting reads)."""
    for key in ("preamble", "message"):
        value = payload.get(key)
        if isinstance(value, str):
            yield value
    for turn in payload.get("chat_history") or []:
        if isinstance(turn, dict) and isinstance(turn.get("message"), str):
            yield turn["message"]


def _usage(answer: Answer) -> dict[str, Any]:
    counts = {"input_tokens": answer.input_tokens, "output_tokens": answer.output_tokens}
    usage: dict[str, Any] = {"billed_units": dict(counts), "tokens": dict(counts)}
    read = answer.details.get("cache_read", 0)
    if read:
        usage["cached_tokens"] = read
    return usage


def _v1_response(answer: Answer) -> dict[str, Any]:
    return {
        "response_id": answer.id,
        "text": answer.text,
        "generation_id": str(uuid.uuid4()),
        "chat_history": [
            {"role": "USER", "message": str(answer.payload.get("message") or "")},
            {"role": "CHATBOT", "message": answer.text},
        ],
        "finish_reason": answer.finish,
        "meta": {"api_version": {"version": "1"}, **_usage(answer)},
    }


def cohere_body(answer: Answer) -> dict[str, Any]:
    """The chat answer: v1's ``NonStreamedChatResponse`` or v2's ``V2ChatResponse``."""
    if is_cohere_v1(answer.payload):
        return _v1_response(answer)
    return {
        "id": answer.id,
        "finish_reason": answer.finish,
        "message": {"role": "assistant", "content": [{"type": "text", "text": answer.text}]},
        "usage": _usage(answer),
    }


def _sse(data: Mapping[str, Any]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (str(data["type"]).encode(), json.dumps(data).encode())


def _line(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data).encode() + b"\n"


def cohere_events(answer: Answer, *, end_marker: bool = True) -> Iterator[tuple[bytes, Phase]]:
    """The stream's events, each with its phase. ``end_marker=False`` leaves out the last
    event (v2's ``message-end``, v1's ``stream-end``), which carries the usage."""
    if is_cohere_v1(answer.payload):
        start = {"is_finished": False, "event_type": "stream-start", "generation_id": answer.id}
        yield _line(start), "head"
        for piece in answer.pieces:
            yield (
                _line({"is_finished": False, "event_type": "text-generation", "text": piece}),
                ("content"),
            )
        if end_marker:
            end = {
                "is_finished": True,
                "event_type": "stream-end",
                "finish_reason": answer.finish,
                "response": _v1_response(answer),
            }
            yield _line(end), "tail"
        return
    message = {"role": "assistant", "content": [], "tool_plan": "", "tool_calls": []}
    yield _sse({"id": answer.id, "type": "message-start", "delta": {"message": message}}), "head"
    start = {"content": {"type": "text", "text": ""}}
    yield _sse({"type": "content-start", "index": 0, "delta": {"message": start}}), "head"
    for piece in answer.pieces:
        delta = {"message": {"content": {"text": piece}}}
        yield _sse({"type": "content-delta", "index": 0, "delta": delta}), "content"
    yield _sse({"type": "content-end", "index": 0}), "tail"
    if end_marker:
        end = {"finish_reason": answer.finish, "usage": _usage(answer)}
        yield _sse({"type": "message-end", "delta": end}), "tail"


def cohere_error_event(code: int) -> bytes:
    """How a v2 stream ends when the generation fails after it started: ``message-end``
    with ``finish_reason`` ``ERROR`` and the error's message in ``delta.error``. Nothing
    in the SDK raises at it."""
    delta = {"finish_reason": "ERROR", "error": cohere_error(code)["message"]}
    return _sse({"type": "message-end", "delta": delta})


def cohere_malformed_event() -> bytes:
    """A ``content-delta`` event whose JSON is cut short (the SDK skips it)."""
    return b'event: content-delta\ndata: {"type": "content-delta", "index": 0, "del\n\n'


class CohereWire(Wire):
    """Cohere's Chat API: v2 ``/v2/chat`` (SSE) and v1 ``/v1/chat`` (JSON lines)."""

    name: Provider = "cohere"

    def route(self, path: str) -> Route | None:
        return Route() if path in ("/v1/chat", "/v2/chat") else None

    error_body = staticmethod(cohere_error)
    error_event = staticmethod(cohere_error_event)
    malformed_event = staticmethod(cohere_malformed_event)
    context_overflow = staticmethod(cohere_context_overflow)

    prompt_texts = staticmethod(cohere_prompt_texts)

    def finish(self, *, tool: bool, filtered: bool) -> str:
        return "COMPLETE"

    body = staticmethod(cohere_body)
    events = staticmethod(cohere_events)

    def stream_headers(self, payload: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        if is_cohere_v1(payload):
            # Cohere's v1 stream: one JSON object a line, not SSE.
            return (("Content-Type", COHERE_V1_STREAM_CONTENT_TYPE),)
        return SSE_HEADERS


COHERE = CohereWire()
