"""The Gemini API's wire format, as the fake server speaks it on
``POST .../models/{model}:generateContent`` and ``:streamGenerateContent``.

Errors are ``google.rpc.Status`` as JSON (``{"error": {"code", "message", "status",
"details"}}``; a 429 carries a ``RetryInfo`` detail). A stream is SSE with no head and no
end marker: each event carries text and the running usage, the last one the finish
reason. A prompt the safety filter blocks gets a 200 with no candidates.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from llm_resilience.testing._wire_base import (
    Answer,
    Phase,
    Provider,
    Route,
    Wire,
    prompt_words,
    sse,
)

__all__ = ["GEMINI", "GEMINI_RETRY_DELAY", "GeminiWire", "gemini_error"]

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


def _usage(answer: Answer, output_tokens: int) -> dict[str, Any]:
    read = answer.details.get("cache_read", 0)
    # ``promptTokenCount`` includes the cached part; thoughts are not in
    # ``candidatesTokenCount`` but are in the total.
    prompt = answer.input_tokens + read
    candidates = output_tokens - answer.reasoning_tokens
    usage: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + output_tokens,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    }
    if read:
        usage["cachedContentTokenCount"] = read
    if answer.reasoning_tokens:
        usage["thoughtsTokenCount"] = answer.reasoning_tokens
    return usage


def _chunk(answer: Answer, text: str, finish: str | None) -> dict[str, Any]:
    # A generateContent answer; each streamGenerateContent event is one too.
    candidate: dict[str, Any] = {
        "content": {"parts": [{"text": text}], "role": "model"},
        "index": 0,
    }
    if finish is not None:
        candidate["finishReason"] = finish
    return {
        "candidates": [candidate],
        "usageMetadata": _usage(answer, answer.output_tokens),
        "modelVersion": answer.model,
        "responseId": answer.id,
    }


class GeminiWire(Wire):
    """The Gemini API (``generativelanguage.googleapis.com``)."""

    name: Provider = "gemini"
    model_from_path = True

    def route(self, path: str) -> Route | None:
        if "/models/" not in path or not path.endswith(
            (":generateContent", ":streamGenerateContent")
        ):
            return None
        model, _, method = path.rsplit("/", 1)[1].partition(":")
        return Route(urllib.parse.unquote(model), method == "streamGenerateContent")

    error_body = staticmethod(gemini_error)

    def malformed_event(self) -> bytes:
        return b'data: {"candidates": [{"content": {"parts": [{"te\n\n'

    def context_overflow(self, tokens: int, maximum: int) -> dict[str, Any]:
        message = (
            f"The input token count ({tokens}) exceeds the maximum number of tokens "
            f"allowed ({maximum})."
        )
        return {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}

    def blocked_prompt(self, payload: Mapping[str, Any]) -> dict[str, Any] | None:
        """A 200 with no candidates and ``promptFeedback.blockReason``."""
        words = prompt_words(self, payload)
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

    def finish(self, *, tool: bool, filtered: bool) -> str:
        return "SAFETY" if filtered else "STOP"

    def body(self, answer: Answer) -> dict[str, Any]:
        return _chunk(answer, answer.text, answer.finish)

    def events(self, answer: Answer, *, end_marker: bool) -> Iterator[tuple[bytes, Phase]]:
        # No end marker to leave out.
        for piece in answer.pieces:
            yield sse(_chunk(answer, piece, None)), "content"
        yield sse(_chunk(answer, "", answer.finish)), "tail"


GEMINI = GeminiWire()
