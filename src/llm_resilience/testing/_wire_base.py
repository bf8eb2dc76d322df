"""What every wire format of the fake server shares: the ``Wire`` a provider's module
fills in, and the ``Answer`` each one renders.

A provider's module (``_wire_openai``, ``_wire_anthropic``, ``_wire_gemini``,
``_wire_bedrock``, ``_wire_mistral``, ``_wire_groq``, ``_wire_ollama``, ``_wire_cohere``)
defines one ``Wire`` subclass: its paths, its error bodies and events, its answer
as one JSON body and as a stream. ``_wire`` maps each provider's name to its instance;
the server asks that table, never a provider's name. This module imports no provider's.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from llm_resilience.testing.schema import sample_instance

__all__ = [
    "CONTENT_FILTER",
    "PREFILL_REJECTION",
    "SSE_HEADERS",
    "USAGE_DETAIL_KEYS",
    "Answer",
    "Phase",
    "Provider",
    "Route",
    "ToolCall",
    "Wire",
    "anthropic_invalid_request",
    "ending",
    "number",
    "prefill_of",
    "prompt_words",
    "sse",
    "texts",
    "tool_to_call",
    "usage_details_option",
]

Provider = Literal[
    "openai", "anthropic", "bedrock", "gemini", "mistral", "groq", "ollama", "cohere"
]
#: Where an event of a stream sits: before, within or after the content chunks.
Phase = Literal["head", "content", "tail"]
#: The headers of a server-sent-events stream.
SSE_HEADERS = (("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache"))

PREFILL_REJECTION = (
    "This model does not support assistant message prefill. "
    "The conversation must end with a user message."
)
CONTENT_FILTER = (
    "The response was filtered due to the prompt triggering Azure OpenAI's content "
    "management policy. Please modify your prompt and retry."
)

#: The keys ``usage_details`` takes: cache reads, 5-minute and 1-hour cache writes, reasoning.
USAGE_DETAIL_KEYS = ("cache_read", "cache_write_5m", "cache_write_1h", "reasoning")


def sse(data: Mapping[str, Any]) -> bytes:
    """One server-sent event carrying ``data`` as JSON."""
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def number(value: float) -> str:
    """``value`` as a header states it: ``20``, not ``20.0``."""
    return str(int(value)) if float(value).is_integer() else str(value)


def usage_details_option(value: object) -> dict[str, int]:
    """A server's ``usage_details`` checked: keys of ``USAGE_DETAIL_KEYS``, ints >= 0."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"usage_details must be a mapping of {USAGE_DETAIL_KEYS}, got {value!r}")
    checked: dict[str, int] = {}
    for key, count in value.items():
        if key not in USAGE_DETAIL_KEYS:
            raise ValueError(f"usage_details keys must be among {USAGE_DETAIL_KEYS}, got {key!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"usage_details[{key!r}] must be an int >= 0, got {count!r}")
        checked[key] = count
    return checked


def texts(content: object) -> Iterator[str]:
    """The text parts of a message's content (a string or a list of typed blocks)."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for block in content:
            # Bedrock's Converse blocks are ``{"text": ...}``, with no ``type``.
            if isinstance(block, dict) and block.get("type", "text") == "text":
                yield str(block.get("text") or "")


def prefill_of(payload: Mapping[str, Any]) -> str | None:
    """The text of a final assistant message (a prefill to continue), or None."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return None
    return "".join(texts(last.get("content")))


def anthropic_invalid_request(message: str) -> dict[str, Any]:
    """A 400 body in Anthropic's shape carrying ``message``."""
    return {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
        "request_id": f"req_{uuid.uuid4().hex}",
    }


@dataclass(frozen=True, slots=True)
class Route:
    """What a request's path says: the model it names and whether it asks for a stream."""

    model: str | None = None
    stream: bool = False


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


class Wire:
    """One provider's wire format; the defaults are the ones most providers share.

    A subclass sets ``name`` and gives its errors (``error_body``, ``error_event``,
    ``malformed_event``, ``context_overflow``) and its answer (``body``, ``events``,
    ``finish``).
    """

    #: The provider's name, as a ``Fault`` and a ``ServedRequest`` spell it.
    name: Provider
    #: Requests without ``"stream"`` stream (Ollama's ``/api/chat``).
    streams_by_default = False
    #: The model named in the path goes into the payload (Gemini: ``modelVersion``).
    model_from_path = False
    #: Tools come as ``{"type": "function", "function": {...}}`` (OpenAI's shape), else as
    #: ``{"name", "input_schema"}``.
    openai_tools = False
    #: The prefix of an answer's id and of a tool call's id.
    id_prefix = "msg_"
    tool_id_prefix = "toolu_"
    #: The finish reason of an answer the content filter cut.
    refusal_finish = "refusal"

    def route(self, path: str) -> Route | None:
        """The ``Route`` of ``path`` if this provider serves it, else None."""
        raise NotImplementedError

    def error_body(self, code: int) -> dict[str, Any]:
        """The provider's error body for HTTP status ``code``."""
        raise NotImplementedError

    def status_error(
        self, code: int, body: Mapping[str, Any] | None
    ) -> tuple[Mapping[str, Any], dict[str, str]]:
        """The body and extra headers of a status fault (``body``: the fault's own)."""
        return (body if body is not None else self.error_body(code)), {}

    def error_event(self, code: int) -> bytes:
        """The event the provider ends a stream with when it fails after the head (by
        default a ``data:`` event holding the error object, as OpenAI and Gemini send)."""
        return sse({"error": self.error_body(code)["error"]})

    def malformed_event(self) -> bytes:
        """One event the provider's SDK tries to decode and cannot."""
        raise NotImplementedError

    def context_overflow(self, tokens: int, maximum: int) -> dict[str, Any]:
        """The provider's 400 body for a prompt longer than the context window."""
        raise NotImplementedError

    def budget_exhausted(self) -> tuple[int, dict[str, Any]]:
        """The status and body the provider sends when the account's credit or quota is
        spent (by default 402 Payment Required with the provider's error body for it)."""
        return 402, self.error_body(402)

    def invalid_request(self, message: str, code: str | None = None) -> dict[str, Any]:
        """A 400 body carrying ``message`` (Anthropic's shape unless the provider's own)."""
        return anthropic_invalid_request(message)

    def prefill_rejection_body(self) -> dict[str, Any]:
        return self.invalid_request(PREFILL_REJECTION)

    def content_filter_body(self) -> dict[str, Any]:
        return self.invalid_request(CONTENT_FILTER)

    def prefill_problem(self, prefill: str | None) -> dict[str, Any] | None:
        """The 400 body for a prefill the provider will not take as sent, or None."""
        return None

    def blocked_prompt(self, payload: Mapping[str, Any]) -> dict[str, Any] | None:
        """A 200 body saying the prompt was blocked, for a provider that answers so."""
        return None

    def prompt_texts(self, payload: Mapping[str, Any]) -> Iterator[str]:
        """Texts of the prompt outside ``messages`` and ``contents`` (a system prompt)."""
        return iter(())

    def structured_content(self, payload: Mapping[str, Any]) -> str | None:
        """JSON text valid for the request's structured-output format, or None."""
        return None

    def finish(self, *, tool: bool, filtered: bool) -> str:
        """The finish reason of an answer (a tool call, cut by the content filter)."""
        if filtered:
            return self.refusal_finish
        return "tool_use" if tool else "end_turn"

    def body(self, answer: Answer) -> dict[str, Any]:
        """The answer as one JSON body."""
        raise NotImplementedError

    def events(self, answer: Answer, *, end_marker: bool) -> Iterator[tuple[bytes, Phase]]:
        """The answer as a stream, each event with its ``Phase``; ``end_marker=False``
        leaves out the stream's last event (``[DONE]``, ``message_stop``) and nothing else."""
        raise NotImplementedError

    def stream_headers(self, payload: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        """The headers naming a stream's content type."""
        return SSE_HEADERS

    def request_id_header(self) -> tuple[str, str] | None:
        """The header carrying a fresh request id, or None if the provider sends none."""
        return None


def ending(
    events: Iterator[tuple[bytes, Phase]], marker: bytes, *, end_marker: bool
) -> Iterator[tuple[bytes, Phase]]:
    """``events``, without the stream's last event ``marker`` unless ``end_marker``."""
    return events if end_marker else (item for item in events if item[0] != marker)


def prompt_words(wire: Wire, payload: Mapping[str, Any]) -> int:
    """The prompt's word count (at least 1): the fake's input token count."""
    found: list[str] = list(wire.prompt_texts(payload))
    for message in payload.get("messages") or []:
        if isinstance(message, dict):
            found.extend(texts(message.get("content")))
    # Gemini: ``contents`` of ``{"role", "parts": [{"text"}]}``, and ``systemInstruction``.
    system = payload.get("systemInstruction")
    for message in [system, *(payload.get("contents") or [])]:
        if isinstance(message, dict):
            found.extend(texts(message.get("parts")))
    return max(1, sum(len(text.split()) for text in found))


def _word_chunks(text: str) -> list[str]:
    """Split ``text`` into words with their leading spaces; joined they give ``text`` back."""
    chunks: list[str] = re.findall(r"\s*\S+", text)
    rest = text[len("".join(chunks)) :]
    if rest:
        if chunks:
            chunks[-1] += rest
        else:
            chunks.append(rest)
    return chunks


class Answer:
    """The normal answer to one request; ``wire`` renders it as a body or a stream."""

    def __init__(
        self,
        wire: Wire,
        payload: Mapping[str, Any],
        reply: str,
        tool: ToolCall | None,
        *,
        filtered_after: int | None = None,
        details: Mapping[str, int] | None = None,
        compaction: Mapping[str, int] | None = None,
        summary: str | None = None,
    ) -> None:
        self.wire = wire
        self.provider = wire.name
        self.details = dict(details or {})
        #: The counts of a compaction step billed apart (``Fault.compacted``), or None.
        self.compaction = dict(compaction) if compaction is not None else None
        #: The text of the compaction block the answer opens with, or None (no block).
        self.summary = summary if compaction is not None else None
        self.payload = payload
        self.tool = tool
        self.model = str(payload.get("model") or "fault-server-model")
        structured = wire.structured_content(payload) if tool is None else None
        text = reply if structured is None else structured
        prefill = prefill_of(payload) if tool is None else None
        if prefill and text.startswith(prefill):
            # A prefilled answer continues from the prefill: only the rest is sent.
            text = text[len(prefill) :]
        self.pieces = _word_chunks(json.dumps(tool.arguments) if tool is not None else text)
        if filtered_after is not None:
            self.pieces = self.pieces[:filtered_after]
            text = "".join(self.pieces)
        self.text = text
        self.filtered = filtered_after is not None
        self.finish = wire.finish(tool=tool is not None, filtered=self.filtered)
        self.input_tokens = prompt_words(wire, payload)
        self.reasoning_tokens = self.details.get("reasoning", 0)
        self.output_tokens = max(1, len(self.pieces)) + self.reasoning_tokens
        self.created = int(time.time())
        self.id = wire.id_prefix + uuid.uuid4().hex[:24]
        self.tool_id = wire.tool_id_prefix + uuid.uuid4().hex[:24]

    def body(self) -> dict[str, Any]:
        return self.wire.body(self)

    def events(self, *, end_marker: bool = True) -> Iterator[tuple[bytes, Phase]]:
        """SSE events, each with its phase: before, within or after the content chunks."""
        return self.wire.events(self, end_marker=end_marker)


_WEATHER = re.compile(r"\bweather\b", re.IGNORECASE)


def tool_to_call(wire: Wire, payload: Mapping[str, Any]) -> ToolCall | None:
    """The call of the first offered tool, when the last user message asks about the
    weather; its arguments satisfy the tool's schema (``sample_instance``)."""
    tools = payload.get("tools")
    messages = payload.get("messages")
    if not tools or not isinstance(tools, list) or not messages or not isinstance(messages, list):
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    if not any(_WEATHER.search(text) for text in texts(last.get("content"))):
        return None
    first: dict[str, Any] = tools[0] if isinstance(tools[0], dict) else {}
    if wire.openai_tools:
        nested = first.get("function")
        function: dict[str, Any] = nested if isinstance(nested, dict) else first
        name, schema = function.get("name"), function.get("parameters")
    else:
        name, schema = first.get("name"), first.get("input_schema")
    arguments = sample_instance(schema)
    return ToolCall(str(name or "tool"), arguments if isinstance(arguments, dict) else {})
