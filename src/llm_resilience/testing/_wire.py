"""The OpenAI, Anthropic, Bedrock, Gemini, Mistral, Groq, Ollama and Cohere wire formats the
fake server speaks: errors, answers, events. Bedrock's own (its errors, its answer, its
binary event stream) are in ``_wire_bedrock``, Mistral's in ``_wire_mistral``, Groq's in
``_wire_groq``, Ollama's (``/api/chat``, newline-delimited JSON) in ``_wire_ollama``,
Cohere's (v2 ``/v2/chat`` SSE, v1 ``/v1/chat`` JSON lines) in ``_wire_cohere``; what
``_server`` needs of them is re-exported here."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from llm_resilience.testing._faults import Provider
from llm_resilience.testing._wire_bedrock import (
    BEDROCK_STREAM_CONTENT_TYPE as BEDROCK_STREAM_CONTENT_TYPE,
)
from llm_resilience.testing._wire_bedrock import (
    bedrock_body,
    bedrock_events,
    bedrock_malformed_event,
    bedrock_stream_exception,
)
from llm_resilience.testing._wire_bedrock import bedrock_error as bedrock_error
from llm_resilience.testing._wire_cohere import (
    COHERE_V1_STREAM_CONTENT_TYPE as COHERE_V1_STREAM_CONTENT_TYPE,
)
from llm_resilience.testing._wire_cohere import (
    cohere_body,
    cohere_error,
    cohere_error_event,
    cohere_events,
    cohere_malformed_event,
    cohere_prompt_texts,
)
from llm_resilience.testing._wire_cohere import is_cohere_v1 as is_cohere_v1
from llm_resilience.testing._wire_groq import groq_error, groq_malformed_event, groq_stream_error
from llm_resilience.testing._wire_mistral import MISTRAL_PREFIX as MISTRAL_PREFIX
from llm_resilience.testing._wire_mistral import mistral_body, mistral_error, mistral_events
from llm_resilience.testing._wire_ollama import (
    OLLAMA_STREAM_CONTENT_TYPE as OLLAMA_STREAM_CONTENT_TYPE,
)
from llm_resilience.testing._wire_ollama import (
    ollama_body,
    ollama_error,
    ollama_events,
    ollama_malformed_line,
    ollama_stream_error,
)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


_OPENAI_ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request.", "invalid_request_error", None),
    401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    403: ("You are not allowed to use this model.", "invalid_request_error", None),
    404: ("The model does not exist.", "invalid_request_error", "model_not_found"),
    429: (
        "Rate limit reached for requests on the fault-injecting server. Please try again later.",
        "requests",
        "rate_limit_exceeded",
    ),
    500: ("The server had an error while processing your request.", "server_error", None),
    503: ("The server is overloaded or not ready yet.", "server_error", None),
}

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


# The Gemini API's errors by status: ``google.rpc.Status`` as JSON, ``{"error": {"code",
# "message", "status", "details"}}``. A 429 carries a ``RetryInfo`` detail.
_GEMINI_ERRORS: dict[int, tuple[str, str]] = {
    400: ("INVALID_ARGUMENT", "Request contains an invalid argument."),
    401: (
        "UNAUTHENTICATED",
        "Request had invalid authentication credentials. Expected OAuth 2 access token, "
        "login cookie or other valid authentication credential.",
    ),
    403: ("PERMISSION_DENIED", "Method doesn't allow unregistered callers."),
    404: (
        "NOT_FOUND",
        "models/unknown is not found for API version v1beta, or is not supported for "
        "generateContent.",
    ),
    429: (
        "RESOURCE_EXHAUSTED",
        "You exceeded your current quota, please check your plan and billing details.",
    ),
    500: ("INTERNAL", "An internal error has occurred. Please retry or report."),
    503: ("UNAVAILABLE", "The model is overloaded. Please try again later."),
    504: ("DEADLINE_EXCEEDED", "Deadline expired before operation could complete."),
}
#: The ``retryDelay`` a Gemini 429 states in its ``RetryInfo`` detail.
GEMINI_RETRY_DELAY = "7s"


def gemini_error(code: int) -> dict[str, Any]:
    """The Gemini API's error body for ``code``; a 429 with ``RetryInfo`` (``retryDelay``)."""
    status, message = _GEMINI_ERRORS.get(code, ("UNKNOWN", f"Status {code}"))
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if code == 429:
        error["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [
                    {
                        "quotaMetric": "generativelanguage.googleapis.com/"
                        "generate_content_free_tier_requests",
                        "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                    }
                ],
            },
            {
                "@type": "type.googleapis.com/google.rpc.RetryInfo",
                "retryDelay": GEMINI_RETRY_DELAY,
            },
        ]
    return {"error": error}


def _error_body(provider: Provider, code: int) -> dict[str, Any]:
    if provider == "groq":
        return groq_error(code)
    if provider == "bedrock":
        return bedrock_error(code, None)[0]
    if provider == "gemini":
        return gemini_error(code)
    if provider == "mistral":
        return mistral_error(code)
    if provider == "ollama":
        return ollama_error(code)
    if provider == "cohere":
        return cohere_error(code)
    if provider == "openai":
        message, kind, error_code = _OPENAI_ERRORS.get(
            code,
            (
                f"Request failed with status {code}.",
                "server_error" if code >= 500 else "invalid_request_error",
                None,
            ),
        )
        return {"error": {"message": message, "type": kind, "param": None, "code": error_code}}
    fallback = ("api_error" if code >= 500 else "invalid_request_error", f"Status {code}")
    kind, message = _ANTHROPIC_ERRORS.get(code, fallback)
    return {
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": f"req_{uuid.uuid4().hex}",
    }


PREFILL_REJECTION = (
    "This model does not support assistant message prefill. "
    "The conversation must end with a user message."
)
_TRAILING_WHITESPACE = "messages: final assistant content cannot end with trailing whitespace"
_CONTENT_FILTER = (
    "The response was filtered due to the prompt triggering Azure OpenAI's content "
    "management policy. Please modify your prompt and retry."
)


def _invalid_request(provider: Provider, message: str, code: str | None = None) -> dict[str, Any]:
    """A 400 body in ``provider``'s shape carrying ``message`` (and OpenAI's ``code``)."""
    if provider == "openai":
        error = {"message": message, "type": "invalid_request_error", "param": "messages"}
        return {"error": {**error, "code": code}}
    return {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
        "request_id": f"req_{uuid.uuid4().hex}",
    }


def prefill_rejection_body(provider: Provider) -> dict[str, Any]:
    return _invalid_request(provider, PREFILL_REJECTION)


def gemini_blocked_prompt(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Gemini's answer to a prompt its safety filter blocks: a 200 with no candidates."""
    words = _prompt_words("gemini", payload)
    return {
        "promptFeedback": {
            "blockReason": "SAFETY",
            "safetyRatings": [
                {
                    "category": "HARM_CATEGORY_DANGEROUS_CONTENT",
                    "probability": "HIGH",
                    "blocked": True,
                }
            ],
        },
        "usageMetadata": {"promptTokenCount": words, "totalTokenCount": words},
    }


def content_filter_body(provider: Provider) -> dict[str, Any]:
    if provider == "openai":
        body = _invalid_request(provider, _CONTENT_FILTER, "content_filter")
        body["error"]["param"] = "prompt"
        body["error"]["status"] = 400
        # Azure names the policy and which of its filters fired.
        body["error"]["innererror"] = {
            "code": "ResponsibleAIPolicyViolation",
            "content_filter_result": {
                "hate": {"filtered": False, "severity": "safe"},
                "jailbreak": {"filtered": True, "detected": True},
                "self_harm": {"filtered": False, "severity": "safe"},
                "sexual": {"filtered": False, "severity": "safe"},
                "violence": {"filtered": False, "severity": "safe"},
            },
        }
        return body
    return _invalid_request(provider, _CONTENT_FILTER)


def prefill_of(payload: Mapping[str, Any]) -> str | None:
    """The text of a final assistant message (a prefill to continue), or None."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return None
    return "".join(_texts(last.get("content")))


def prefill_problem(provider: Provider, prefill: str | None) -> dict[str, Any] | None:
    """The 400 body Anthropic sends for a prefill it will not take as sent, or None."""
    if provider == "anthropic" and prefill and prefill != prefill.rstrip():
        return _invalid_request(provider, _TRAILING_WHITESPACE)
    return None


def _texts(content: object) -> Iterator[str]:
    """The text parts of a message's content (a string or a list of typed blocks)."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for block in content:
            # Bedrock's Converse blocks are ``{"text": ...}``, with no ``type``.
            if isinstance(block, dict) and block.get("type", "text") == "text":
                yield str(block.get("text") or "")


def _prompt_words(provider: Provider, payload: Mapping[str, Any]) -> int:
    texts: list[str] = []
    if provider in ("anthropic", "bedrock"):
        texts.extend(_texts(payload.get("system")))
    if provider == "cohere":
        texts.extend(cohere_prompt_texts(payload))
    for message in payload.get("messages") or []:
        if isinstance(message, dict):
            texts.extend(_texts(message.get("content")))
    # Gemini: ``contents`` of ``{"role", "parts": [{"text"}]}``, and ``systemInstruction``.
    system = payload.get("systemInstruction")
    for message in [system, *(payload.get("contents") or [])]:
        if isinstance(message, dict):
            texts.extend(_texts(message.get("parts")))
    return max(1, sum(len(text.split()) for text in texts))


@dataclass(frozen=True, slots=True)
class _ToolCall:
    name: str
    arguments: dict[str, Any]


_WEATHER = re.compile(r"\bweather\b", re.IGNORECASE)


def _tool_to_call(provider: Provider, payload: Mapping[str, Any]) -> _ToolCall | None:
    tools = payload.get("tools")
    messages = payload.get("messages")
    if not tools or not isinstance(tools, list) or not messages or not isinstance(messages, list):
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    if not any(_WEATHER.search(text) for text in _texts(last.get("content"))):
        return None
    first: dict[str, Any] = tools[0] if isinstance(tools[0], dict) else {}
    if provider in ("openai", "mistral", "ollama"):
        # Mistral and Ollama take OpenAI's tool shape: ``{"type": "function", "function": {...}}``.
        nested = first.get("function")
        function: dict[str, Any] = nested if isinstance(nested, dict) else first
        name, schema = function.get("name"), function.get("parameters")
    else:
        name, schema = first.get("name"), first.get("input_schema")
    return _ToolCall(str(name or "tool"), _minimal_arguments(schema))


_PLACEHOLDERS: dict[str, Any] = {
    "string": "test",
    "integer": 0,
    "number": 0,
    "boolean": False,
    "array": [],
    "object": {},
}


def _minimal_arguments(schema: object) -> dict[str, Any]:
    """A value for each required property of a JSON schema, by its type."""
    if not isinstance(schema, dict):
        return {}
    properties = schema.get("properties") or {}
    arguments: dict[str, Any] = {}
    for name in schema.get("required") or []:
        spec = properties.get(name) if isinstance(properties, dict) else None
        spec = spec if isinstance(spec, dict) else {}
        if spec.get("enum"):
            arguments[name] = spec["enum"][0]
            continue
        kind = spec.get("type", "string")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        arguments[name] = _PLACEHOLDERS.get(str(kind), "test")
    return arguments


# Structured output: ``response_format={"type": "json_schema", ...}`` (OpenAI) gets JSON
# content that validates against the schema, so ``with_structured_output`` parses it.

_SAMPLE_TEXT = "test"
_STRING_FORMATS: dict[str, str] = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "00:00:00",
    "email": "test@example.com",
    "uri": "https://example.com",
    "url": "https://example.com",
    "uuid": "00000000-0000-4000-8000-000000000000",
}
# Deep enough for any real schema; stops a recursive one that requires itself.
_MAX_DEPTH = 16


def _structured_content(provider: Provider, payload: Mapping[str, Any]) -> str | None:
    """JSON text valid for the request's ``json_schema`` response format, or None."""
    if provider != "openai":
        return None
    response_format = payload.get("response_format")
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        return "{}"
    return json.dumps(_instance(schema, schema, 0))


def _resolve(reference: str, root: Mapping[str, Any]) -> dict[str, Any]:
    """The schema a local ``$ref`` (``#/$defs/Name``, ``#/definitions/Name``) points to."""
    if not reference.startswith("#"):
        return {}
    node: object = root
    for part in reference[1:].split("/"):
        if not part:
            continue
        key = part.replace("~1", "/").replace("~0", "~")
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _instance(schema: object, root: Mapping[str, Any], depth: int) -> Any:
    """A small value that satisfies ``schema``: the first choice of every alternative."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None if isinstance(schema, bool) and not schema else {}
    if "$ref" in schema:
        target = _resolve(str(schema["$ref"]), root)
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        return _instance({**target, **siblings} if siblings else target, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for keyword in ("anyOf", "oneOf"):
        options = schema.get(keyword)
        if isinstance(options, list) and options:
            usable = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            return _instance((usable or options)[0], root, depth + 1)
    if isinstance(schema.get("allOf"), list):
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            if isinstance(part, dict) and "$ref" in part:
                part = _resolve(str(part["$ref"]), root)
            if isinstance(part, dict):
                merged.setdefault("properties", {}).update(part.get("properties") or {})
                merged["required"] = [*merged.get("required", []), *part.get("required", [])]
                rest = {k: v for k, v in part.items() if k not in ("properties", "required")}
                merged.update(rest)
        return _instance(merged, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        if "properties" in schema:
            kind = "object"
        elif "items" in schema or "prefixItems" in schema:
            kind = "array"
        else:
            kind = "string"
    if kind == "object":
        properties = schema.get("properties") or {}
        return {
            name: _instance(properties.get(name, {}), root, depth + 1)
            for name in schema.get("required") or []
            if isinstance(name, str)
        }
    if kind == "array":
        prefix = schema.get("prefixItems")
        items: list[Any] = []
        if isinstance(prefix, list):
            items = [_instance(item, root, depth + 1) for item in prefix]
        wanted = max(1, int(schema.get("minItems", 1)))
        if isinstance(schema.get("maxItems"), int):
            wanted = min(wanted, schema["maxItems"])
        while len(items) < wanted:
            items.append(_instance(schema.get("items", {}), root, depth + 1))
        return items
    if kind in ("integer", "number"):
        return _number_within(schema, integer=kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    text = _STRING_FORMATS.get(str(schema.get("format")), _SAMPLE_TEXT)
    minimum, maximum = schema.get("minLength"), schema.get("maxLength")
    if isinstance(minimum, int) and len(text) < minimum:
        text += "x" * (minimum - len(text))
    if isinstance(maximum, int) and len(text) > maximum:
        text = text[:maximum]
    return text


def _number_within(schema: Mapping[str, Any], *, integer: bool) -> int | float:
    """0, or 1 where 0 is excluded, moved into the bounds the schema sets."""
    value: float = 0
    if isinstance(schema.get("minimum"), int | float):
        value = max(value, schema["minimum"])
    if isinstance(schema.get("exclusiveMinimum"), int | float):
        value = max(value, schema["exclusiveMinimum"] + 1)
    if isinstance(schema.get("maximum"), int | float):
        value = min(value, schema["maximum"])
    if isinstance(schema.get("exclusiveMaximum"), int | float):
        value = min(value, schema["exclusiveMaximum"] - 1)
    if integer or float(value).is_integer():
        return int(value)
    return value


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


_Phase = Literal["head", "content", "tail"]

#: The keys ``usage_details`` takes: cache reads, 5-minute and 1-hour cache writes, reasoning.
USAGE_DETAIL_KEYS = ("cache_read", "cache_write_5m", "cache_write_1h", "reasoning")


def usage_details_option(value: object) -> dict[str, int]:
    """A server's ``usage_details`` checked: keys of :data:`USAGE_DETAIL_KEYS`, ints >= 0."""
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


class _Answer:
    """The normal answer to one request, as one JSON body or as SSE events."""

    def __init__(
        self,
        provider: Provider,
        payload: Mapping[str, Any],
        reply: str,
        tool: _ToolCall | None,
        *,
        filtered_after: int | None = None,
        details: Mapping[str, int] | None = None,
    ) -> None:
        self.provider = provider
        self.details = dict(details or {})
        self.payload = payload
        self.tool = tool
        self.model = str(payload.get("model") or "fault-server-model")
        structured = _structured_content(provider, payload) if tool is None else None
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
        if provider == "openai":
            finish = "tool_calls" if tool is not None else "stop"
            self.finish = "content_filter" if self.filtered else finish
        elif provider == "gemini":
            self.finish = "SAFETY" if self.filtered else "STOP"
        elif provider == "mistral":
            # Mistral has no content-filter finish reason; a cut answer ends with "stop".
            self.finish = "tool_calls" if tool is not None else "stop"
        elif provider == "ollama":
            # Ollama has no content filter: a cut answer still says why it stopped.
            self.finish = "stop"
        elif provider == "cohere":
            self.finish = "COMPLETE"
        else:
            finish = "tool_use" if tool is not None else "end_turn"
            refusal = "content_filtered" if provider == "bedrock" else "refusal"
            self.finish = refusal if self.filtered else finish
        self.input_tokens = _prompt_words(provider, payload)
        self.reasoning_tokens = self.details.get("reasoning", 0)
        self.output_tokens = max(1, len(self.pieces)) + self.reasoning_tokens
        self.created = int(time.time())
        prefix = "chatcmpl-" if provider == "openai" else "msg_"
        self.id = prefix + uuid.uuid4().hex[:24]
        self.tool_id = ("call_" if provider == "openai" else "toolu_") + uuid.uuid4().hex[:24]

    def body(self) -> dict[str, Any]:
        if self.provider == "bedrock":
            return bedrock_body(self)
        if self.provider == "gemini":
            return self._gemini_chunk(self.text, self.finish, self.output_tokens)
        if self.provider == "mistral":
            return mistral_body(self)
        if self.provider == "ollama":
            return ollama_body(self)
        if self.provider == "cohere":
            return cohere_body(self)
        return self._openai_body() if self.provider == "openai" else self._anthropic_body()

    def events(self, *, end_marker: bool = True) -> Iterator[tuple[bytes, _Phase]]:
        """SSE events, each with its phase: before, within or after the content chunks.

        ``end_marker=False`` leaves out the stream's last event (OpenAI's ``[DONE]``,
        Anthropic's ``message_stop``) and nothing else.
        """
        if self.provider == "gemini":
            return self._gemini_events()
        if self.provider == "bedrock":
            return bedrock_events(self, end_marker=end_marker)
        if self.provider == "mistral":
            return mistral_events(self, end_marker=end_marker)
        if self.provider == "ollama":
            return ollama_events(self, end_marker=end_marker)
        if self.provider == "cohere":
            return cohere_events(self, end_marker=end_marker)
        events = self._openai_events() if self.provider == "openai" else self._anthropic_events()
        if end_marker:
            return events
        return (item for item in events if item[0] not in _END_MARKERS)

    # -- Gemini ------------------------------------------------------------------------

    def _gemini_usage(self, output_tokens: int) -> dict[str, Any]:
        read = self.details.get("cache_read", 0)
        # ``promptTokenCount`` includes the cached part; thoughts are not in
        # ``candidatesTokenCount`` but are in the total.
        prompt = self.input_tokens + read
        candidates = output_tokens - self.reasoning_tokens
        usage: dict[str, Any] = {
            "promptTokenCount": prompt,
            "candidatesTokenCount": candidates,
            "totalTokenCount": prompt + output_tokens,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
        }
        if read:
            usage["cachedContentTokenCount"] = read
        if self.reasoning_tokens:
            usage["thoughtsTokenCount"] = self.reasoning_tokens
        return usage

    def _gemini_chunk(self, text: str, finish: str | None, output_tokens: int) -> dict[str, Any]:
        # A generateContent answer; each streamGenerateContent event is one too.
        candidate: dict[str, Any] = {
            "content": {"parts": [{"text": text}], "role": "model"},
            "index": 0,
        }
        if finish is not None:
            candidate["finishReason"] = finish
        return {
            "candidates": [candidate],
            "usageMetadata": self._gemini_usage(output_tokens),
            "modelVersion": self.model,
            "responseId": self.id,
        }

    def _gemini_events(self) -> Iterator[tuple[bytes, _Phase]]:
        # Gemini sends no head and no end marker: each event carries text and the running
        # usage; the last one the finish reason and the final counts.
        for piece in self.pieces:
            yield _sse(self._gemini_chunk(piece, None, self.output_tokens)), "content"
        yield _sse(self._gemini_chunk("", self.finish, self.output_tokens)), "tail"

    # -- OpenAI ------------------------------------------------------------------------

    def _openai_usage(self) -> dict[str, Any]:
        read = self.details.get("cache_read", 0)
        written = self.details.get("cache_write_5m", 0) + self.details.get("cache_write_1h", 0)
        prompt = self.input_tokens + read + written
        prompt_details: dict[str, Any] = {"cached_tokens": read, "audio_tokens": 0}
        if written:
            prompt_details["cache_write_tokens"] = written
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.output_tokens,
            "total_tokens": prompt + self.output_tokens,
            "prompt_tokens_details": prompt_details,
            "completion_tokens_details": {
                "reasoning_tokens": self.reasoning_tokens,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def _openai_envelope(self, kind: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "service_tier": "default",
            "system_fingerprint": "fp_fault_server",
        }

    def _openai_body(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "refusal": None, "annotations": []}
        if self.tool is not None:
            message["content"] = None
            message["tool_calls"] = [
                {
                    "id": self.tool_id,
                    "type": "function",
                    "function": {
                        "name": self.tool.name,
                        "arguments": json.dumps(self.tool.arguments),
                    },
                }
            ]
        else:
            message["content"] = self.text
        return {
            **self._openai_envelope("chat.completion"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.finish,
                }
            ],
            "usage": self._openai_usage(),
        }

    def _openai_events(self) -> Iterator[tuple[bytes, _Phase]]:
        options = self.payload.get("stream_options")
        with_usage = isinstance(options, dict) and bool(options.get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {
                **self._openai_envelope("chat.completion.chunk"),
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if with_usage:
                data["usage"] = None
            return _sse(data)

        if self.tool is not None:
            call = {
                "index": 0,
                "id": self.tool_id,
                "type": "function",
                "function": {"name": self.tool.name, "arguments": ""},
            }
            yield chunk({"role": "assistant", "content": None, "tool_calls": [call]}), "head"
            for piece in self.pieces:
                delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                yield chunk(delta), "content"
            yield chunk({}, self.finish), "tail"
        else:
            yield chunk({"role": "assistant", "content": "", "refusal": None}), "head"
            for piece in self.pieces:
                yield chunk({"content": piece}), "content"
            yield chunk({}, self.finish), "tail"
        if with_usage:
            final = {
                **self._openai_envelope("chat.completion.chunk"),
                "choices": [],
                "usage": self._openai_usage(),
            }
            yield _sse(final), "tail"
        yield _OPENAI_DONE, "tail"

    # -- Anthropic ---------------------------------------------------------------------

    def _anthropic_usage(self, output_tokens: int) -> dict[str, Any]:
        five_minutes = self.details.get("cache_write_5m", 0)
        one_hour = self.details.get("cache_write_1h", 0)
        usage: dict[str, Any] = {
            "input_tokens": self.input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": five_minutes + one_hour,
            "cache_read_input_tokens": self.details.get("cache_read", 0),
        }
        if self.details:
            usage["cache_creation"] = {
                "ephemeral_5m_input_tokens": five_minutes,
                "ephemeral_1h_input_tokens": one_hour,
            }
        if self.reasoning_tokens and output_tokens == self.output_tokens:
            # Only with the final output count: the thinking is part of it.
            usage["output_tokens_details"] = {"thinking_tokens": self.reasoning_tokens}
        return usage

    def _anthropic_block(self, *, streaming: bool) -> dict[str, Any]:
        if self.tool is not None:
            return {
                "type": "tool_use",
                "id": self.tool_id,
                "name": self.tool.name,
                "input": {} if streaming else self.tool.arguments,
            }
        return {"type": "text", "text": "" if streaming else self.text}

    def _anthropic_message(self, *, streaming: bool) -> dict[str, Any]:
        done = not streaming
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [self._anthropic_block(streaming=False)] if done else [],
            "stop_reason": self.finish if done else None,
            "stop_sequence": None,
            "usage": self._anthropic_usage(self.output_tokens if done else 1),
        }

    def _anthropic_body(self) -> dict[str, Any]:
        return self._anthropic_message(streaming=False)

    def _anthropic_events(self) -> Iterator[tuple[bytes, _Phase]]:
        def event(data: dict[str, Any]) -> bytes:
            return b"event: %s\n" % str(data["type"]).encode() + _sse(data)

        message = self._anthropic_message(streaming=True)
        yield event({"type": "message_start", "message": message}), "head"
        block = self._anthropic_block(streaming=True)
        yield event({"type": "content_block_start", "index": 0, "content_block": block}), "head"
        yield event({"type": "ping"}), "head"
        for piece in self.pieces:
            if self.tool is not None:
                delta = {"type": "input_json_delta", "partial_json": piece}
            else:
                delta = {"type": "text_delta", "text": piece}
            yield event({"type": "content_block_delta", "index": 0, "delta": delta}), "content"
        yield event({"type": "content_block_stop", "index": 0}), "tail"
        stop_reason = self.finish
        yield (
            event(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                    # Cumulative, as the API sends it now; LangChain reads input here.
                    "usage": self._anthropic_usage(self.output_tokens),
                }
            ),
            "tail",
        )
        yield _ANTHROPIC_STOP, "tail"


def _sse(data: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


_OPENAI_DONE = b"data: [DONE]\n\n"
_ANTHROPIC_STOP = b"event: message_stop\n" + _sse({"type": "message_stop"})
_END_MARKERS = frozenset({_OPENAI_DONE, _ANTHROPIC_STOP})


def malformed_event(provider: Provider) -> bytes:
    """One SSE event the SDKs will try to decode and cannot: a JSON object cut short.

    For Anthropic the event is named ``content_block_delta``, a type the SDK decodes.
    """
    if provider == "openai":
        return b'data: {"id": "chatcmpl-broken", "object": "chat.completion.chunk", "cho\n\n'
    if provider == "gemini":
        return b'data: {"candidates": [{"content": {"parts": [{"te\n\n'
    if provider == "mistral":
        return b'data: {"id": "broken", "object": "chat.completion.chunk", "cho\n\n'
    if provider == "bedrock":
        return bedrock_malformed_event()
    if provider == "groq":
        return groq_malformed_event()
    if provider == "ollama":
        return ollama_malformed_line()
    if provider == "cohere":
        return cohere_malformed_event()
    return b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0\n\n'


def error_event(provider: Provider, code: int) -> bytes:
    """The SSE event a provider sends when it fails after its stream started.

    Anthropic: ``event: error`` carrying its error body (``overloaded_error`` for 529).
    OpenAI: a ``data:`` event whose object holds ``error`` in the API's error shape.
    """
    if provider == "bedrock":
        return bedrock_stream_exception(code)
    if provider == "groq":
        return groq_stream_error(code)
    if provider == "ollama":
        return ollama_stream_error(code)
    if provider == "cohere":
        return cohere_error_event(code)
    body = _error_body(provider, code)
    if provider == "mistral":
        # Mistral documents no in-stream error event; its error object as a data event.
        return _sse(body)
    if provider in ("openai", "gemini"):
        return _sse({"error": body["error"]})
    body.pop("request_id", None)
    return b"event: error\n" + _sse(body)
