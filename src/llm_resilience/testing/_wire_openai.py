"""OpenAI's Chat Completions wire format, as the fake server speaks it on
``POST .../chat/completions``: errors, answers, SSE chunks ending with ``[DONE]``.

Groq's format (``_wire_groq``) is this one with Groq's additions; its answers are built
from the functions here. A request with ``response_format={"type": "json_schema", ...}``
gets JSON content that validates against the schema, so ``with_structured_output``
parses it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from llm_resilience.testing._wire_base import (
    CONTENT_FILTER,
    Answer,
    Phase,
    Provider,
    Route,
    Wire,
    ending,
    sse,
)
from llm_resilience.testing.schema import sample_instance

__all__ = ["OPENAI", "OpenAIWire", "openai_body", "openai_events", "openai_usage"]

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

_DONE = b"data: [DONE]\n\n"


def openai_usage(answer: Answer) -> dict[str, Any]:
    read = answer.details.get("cache_read", 0)
    written = answer.details.get("cache_write_5m", 0) + answer.details.get("cache_write_1h", 0)
    prompt = answer.input_tokens + read + written
    prompt_details: dict[str, Any] = {"cached_tokens": read, "audio_tokens": 0}
    if written:
        prompt_details["cache_write_tokens"] = written
    return {
        "prompt_tokens": prompt,
        "completion_tokens": answer.output_tokens,
        "total_tokens": prompt + answer.output_tokens,
        "prompt_tokens_details": prompt_details,
        "completion_tokens_details": {
            "reasoning_tokens": answer.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _envelope(answer: Answer, kind: str) -> dict[str, Any]:
    return {
        "id": answer.id,
        "object": kind,
        "created": answer.created,
        "model": answer.model,
        "service_tier": "default",
        "system_fingerprint": "fp_fault_server",
    }


def openai_body(answer: Answer) -> dict[str, Any]:
    """A ``chat.completion``: the message (text or one tool call), finish, usage."""
    message: dict[str, Any] = {"role": "assistant", "refusal": None, "annotations": []}
    if answer.tool is not None:
        message["content"] = None
        message["tool_calls"] = [
            {
                "id": answer.tool_id,
                "type": "function",
                "function": {
                    "name": answer.tool.name,
                    "arguments": json.dumps(answer.tool.arguments),
                },
            }
        ]
    else:
        message["content"] = answer.text
    return {
        **_envelope(answer, "chat.completion"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": answer.finish,
            }
        ],
        "usage": openai_usage(answer),
    }


def openai_events(answer: Answer) -> Iterator[tuple[bytes, Phase]]:
    """``chat.completion.chunk`` events (a usage chunk when the request asks), ``[DONE]``."""
    options = answer.payload.get("stream_options")
    with_usage = isinstance(options, dict) and bool(options.get("include_usage"))

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        data = {
            **_envelope(answer, "chat.completion.chunk"),
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if with_usage:
            data["usage"] = None
        return sse(data)

    if answer.tool is not None:
        call = {
            "index": 0,
            "id": answer.tool_id,
            "type": "function",
            "function": {"name": answer.tool.name, "arguments": ""},
        }
        yield chunk({"role": "assistant", "content": None, "tool_calls": [call]}), "head"
        for piece in answer.pieces:
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
            yield chunk(delta), "content"
        yield chunk({}, answer.finish), "tail"
    else:
        yield chunk({"role": "assistant", "content": "", "refusal": None}), "head"
        for piece in answer.pieces:
            yield chunk({"content": piece}), "content"
        yield chunk({}, answer.finish), "tail"
    if with_usage:
        final = {
            **_envelope(answer, "chat.completion.chunk"),
            "choices": [],
            "usage": openai_usage(answer),
        }
        yield sse(final), "tail"
    yield _DONE, "tail"


class OpenAIWire(Wire):
    """OpenAI's Chat Completions API (and Azure OpenAI's content filter)."""

    name: Provider = "openai"
    openai_tools = True
    id_prefix = "chatcmpl-"
    tool_id_prefix = "call_"

    def route(self, path: str) -> Route | None:
        return Route() if path.endswith("/chat/completions") else None

    def error_body(self, code: int) -> dict[str, Any]:
        message, kind, error_code = _OPENAI_ERRORS.get(
            code,
            (
                f"Request failed with status {code}.",
                "server_error" if code >= 500 else "invalid_request_error",
                None,
            ),
        )
        return {"error": {"message": message, "type": kind, "param": None, "code": error_code}}

    def malformed_event(self) -> bytes:
        return b'data: {"id": "chatcmpl-broken", "object": "chat.completion.chunk", "cho\n\n'

    def context_overflow(self, tokens: int, maximum: int) -> dict[str, Any]:
        message = (
            f"This model's maximum context length is {maximum} tokens. However, your "
            f"messages resulted in {tokens} tokens. Please reduce the length of the "
            f"messages."
        )
        return {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }

    def budget_exhausted(self) -> tuple[int, dict[str, Any]]:
        # A 429 like a rate limit; only the error object tells the spent account apart.
        message = (
            "You exceeded your current quota, please check your plan and billing details. "
            "For more information on this error, read the docs: "
            "https://platform.openai.com/docs/guides/error-codes/api-errors."
        )
        error = {"message": message, "type": "insufficient_quota", "param": None}
        return 429, {"error": {**error, "code": "insufficient_quota"}}

    def invalid_request(self, message: str, code: str | None = None) -> dict[str, Any]:
        error = {"message": message, "type": "invalid_request_error", "param": "messages"}
        return {"error": {**error, "code": code}}

    def content_filter_body(self) -> dict[str, Any]:
        body = self.invalid_request(CONTENT_FILTER, "content_filter")
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

    def structured_content(self, payload: Mapping[str, Any]) -> str | None:
        response_format = payload.get("response_format")
        if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
            return None
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            return "{}"
        return json.dumps(sample_instance(schema))

    def finish(self, *, tool: bool, filtered: bool) -> str:
        if filtered:
            return "content_filter"
        return "tool_calls" if tool else "stop"

    body = staticmethod(openai_body)

    def events(self, answer: Answer, *, end_marker: bool) -> Iterator[tuple[bytes, Phase]]:
        return ending(openai_events(answer), _DONE, end_marker=end_marker)

    def request_id_header(self) -> tuple[str, str] | None:
        return "x-request-id", f"req_{uuid.uuid4().hex}"


OPENAI = OpenAIWire()
