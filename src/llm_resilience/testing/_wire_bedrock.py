"""AWS Bedrock Runtime's wire, as the fake server speaks it: Converse's answer and errors,
and ConverseStream's answer as a binary AWS event stream.

An event stream (``application/vnd.amazon.eventstream``) is a sequence of messages, each

* a prelude: the message's total length and its headers' length (big-endian uint32
  each), then the CRC32 of those 8 bytes;
* the headers: for each, the name's length (one byte) and name, the value's type (7,
  a UTF-8 string, is the only one written here), its length (uint16) and value;
* the payload (JSON here);
* the message CRC32: of every byte before it, the prelude CRC included.

botocore's ``botocore.eventstream`` decodes it (and checks both CRCs); its parser turns
a message whose ``:message-type`` is ``event`` into ``{event-type: payload}`` and one
whose ``:message-type`` is ``exception`` into an ``EventStreamError`` (a ``ClientError``)
with the ``:exception-type`` as its code. The event and exception names are the members
of ``ConverseStreamOutput`` in botocore's ``bedrock-runtime`` service model.
"""

from __future__ import annotations

import json
import struct
import urllib.parse
import uuid
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

from llm_resilience.testing._wire_base import Answer, Phase, Provider, Route, Wire, texts

__all__ = [
    "BEDROCK",
    "BedrockWire",
    "BEDROCK_STREAM_CONTENT_TYPE",
    "bedrock_body",
    "bedrock_error",
    "bedrock_events",
    "bedrock_malformed_event",
    "bedrock_stream_exception",
    "encode_message",
    "stream_exception_type",
]


#: The ``Content-Type`` of a ConverseStream answer.
BEDROCK_STREAM_CONTENT_TYPE = "application/vnd.amazon.eventstream"

# -- errors answered with a status ----------------------------------------------------

# Bedrock Runtime's error codes (``x-amzn-ErrorType``) and messages by status, from
# botocore's ``bedrock-runtime`` service model. A 502 or 504 comes from a gateway in front
# of the service and carries no error type (the bodies are Amazon API Gateway's).
_BEDROCK_ERRORS: dict[int, tuple[str | None, str]] = {
    400: (
        "ValidationException",
        "Malformed input request, please reformat your input and try again.",
    ),
    403: (
        "AccessDeniedException",
        "You don't have access to the model with the specified model ID.",
    ),
    404: (
        "ResourceNotFoundException",
        "Could not resolve the foundation model from the provided model identifier.",
    ),
    408: (
        "ModelTimeoutException",
        "Model has timed out in processing the request. Try your request again.",
    ),
    424: (
        "ModelErrorException",
        "The model encountered an error while processing the request.",
    ),
    429: (
        "ThrottlingException",
        "Too many requests, please wait before trying your request again.",
    ),
    500: (
        "InternalServerException",
        "The server encountered an internal error while processing the request.",
    ),
    502: (None, "Internal server error"),
    503: ("ServiceUnavailableException", "Bedrock is unable to process your request."),
    504: (None, "Endpoint request timed out"),
}
_BEDROCK_ERROR_NAMESPACE = ":http://internal.amazon.com/coral/com.amazon.bedrock/"


def bedrock_error(code: int, body: Mapping[str, Any] | None) -> tuple[dict[str, Any], str | None]:
    """Bedrock's error body (``{"message": ...}``) and ``x-amzn-ErrorType`` header value.

    A given ``body``'s ``"__type"`` names the error code; without one, the status's own.
    """
    error_type, message = _BEDROCK_ERRORS.get(code, (None, f"Status {code}"))
    if body is None:
        sent: dict[str, Any] = {"message": message}
    else:
        sent = dict(body)
        error_type = str(sent.pop("__type", None) or error_type or "") or None
        sent.setdefault("message", message)
    header = None if error_type is None else error_type + _BEDROCK_ERROR_NAMESPACE
    return sent, header


# -- the event-stream framing ---------------------------------------------------------

_PRELUDE = struct.Struct("!II")
_CRC = struct.Struct("!I")
_STRING = 7  # the header value type of a UTF-8 string


def _crc32(data: bytes, start: int = 0) -> int:
    return zlib.crc32(data, start) & 0xFFFFFFFF


def _header(name: str, value: str) -> bytes:
    encoded_name, encoded_value = name.encode(), value.encode()
    if len(encoded_name) > 255 or len(encoded_value) > 0xFFFF:
        raise ValueError(f"event-stream header {name!r} is too long")
    return (
        bytes([len(encoded_name)])
        + encoded_name
        + bytes([_STRING])
        + struct.pack("!H", len(encoded_value))
        + encoded_value
    )


def encode_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One event-stream message: prelude and its CRC, string headers, payload, message CRC.

    Examples:
        >>> encode_message({}, b"").hex()
        '000000100000000005c248eb7d98c8ff'
    """
    encoded = b"".join(_header(name, value) for name, value in headers.items())
    total = _PRELUDE.size + _CRC.size + len(encoded) + len(payload) + _CRC.size
    prelude = _PRELUDE.pack(total, len(encoded))
    head = prelude + _CRC.pack(_crc32(prelude))
    message = head + encoded + payload
    return message + _CRC.pack(_crc32(message))


def _event(event_type: str, data: Mapping[str, Any]) -> bytes:
    headers = {
        ":event-type": event_type,
        ":content-type": "application/json",
        ":message-type": "event",
    }
    return encode_message(headers, json.dumps(data).encode())


# -- the answer -------------------------------------------------------------------------


def _usage(answer: Answer) -> dict[str, Any]:
    # ``inputTokens`` leaves the cache reads and writes out (as Anthropic's does); the
    # total counts them. The model's thinking is inside ``outputTokens``, not split out.
    details = answer.details
    read = details.get("cache_read", 0)
    five_minutes = details.get("cache_write_5m", 0)
    one_hour = details.get("cache_write_1h", 0)
    written = five_minutes + one_hour
    usage: dict[str, Any] = {
        "inputTokens": answer.input_tokens,
        "outputTokens": answer.output_tokens,
        "totalTokens": answer.input_tokens + answer.output_tokens + read + written,
    }
    if "cache_read" in details or written:
        usage["cacheReadInputTokens"] = read
    if "cache_write_5m" in details or "cache_write_1h" in details:
        usage["cacheWriteInputTokens"] = written
        # By lifetime, 1h before 5m, as the service model documents it.
        usage["cacheDetails"] = [
            {"ttl": ttl, "inputTokens": count}
            for ttl, count in (("1h", one_hour), ("5m", five_minutes))
            if count
        ]
    return usage


def bedrock_body(answer: Answer) -> dict[str, Any]:
    """Bedrock Runtime's Converse answer."""
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": answer.text}]}},
        "stopReason": answer.finish,
        "usage": _usage(answer),
        "metrics": {"latencyMs": 1},
    }


def bedrock_events(answer: Answer, *, end_marker: bool = True) -> Iterator[tuple[bytes, Phase]]:
    """ConverseStream's messages, each with its phase: ``messageStart``; a
    ``contentBlockDelta`` per chunk of text; ``contentBlockStop``, ``messageStop`` (the
    stop reason) and ``metadata`` (usage and metrics).

    ``end_marker=False`` leaves out ``messageStop``, and nothing else.
    """
    yield _event("messageStart", {"role": "assistant"}), "head"
    for piece in answer.pieces:
        delta = {"contentBlockIndex": 0, "delta": {"text": piece}}
        yield _event("contentBlockDelta", delta), "content"
    yield _event("contentBlockStop", {"contentBlockIndex": 0}), "tail"
    if end_marker:
        yield _event("messageStop", {"stopReason": answer.finish}), "tail"
    metadata = {"usage": _usage(answer), "metrics": {"latencyMs": 1}}
    yield _event("metadata", metadata), "tail"


# -- failures inside a stream -----------------------------------------------------------

# The exceptions ``ConverseStreamOutput`` carries, by the status their shapes declare
# (``modelStreamErrorException`` is a 424, like the call's ``ModelErrorException``).
_STREAM_EXCEPTIONS: dict[int, tuple[str, str]] = {
    400: (
        "validationException",
        "Malformed input request, please reformat your input and try again.",
    ),
    424: (
        "modelStreamErrorException",
        "The model failed while streaming its response. Try your request again.",
    ),
    429: (
        "throttlingException",
        "Too many requests, please wait before trying your request again.",
    ),
    500: (
        "internalServerException",
        "The server encountered an internal error while processing the request.",
    ),
    503: ("serviceUnavailableException", "Bedrock is unable to process your request."),
}


def stream_exception_type(code: int) -> str:
    """The ``ConverseStreamOutput`` exception that stands for status ``code``.

    429 ``throttlingException``, 503 ``serviceUnavailableException``, 424
    ``modelStreamErrorException``, 400 ``validationException``; any other 5xx
    ``internalServerException`` and any other 4xx ``validationException``.
    """
    if code in _STREAM_EXCEPTIONS:
        return _STREAM_EXCEPTIONS[code][0]
    return "internalServerException" if code >= 500 else "validationException"


def bedrock_stream_exception(code: int) -> bytes:
    """The event-stream exception message Bedrock sends when a stream fails after it
    started (``:message-type`` ``exception``, the ``:exception-type`` of
    `stream_exception_type`, a ``{"message": ...}`` payload)."""
    exception_type = stream_exception_type(code)
    message = next(
        (text for name, text in _STREAM_EXCEPTIONS.values() if name == exception_type),
        f"Status {code}",
    )
    body: dict[str, Any] = {"message": message}
    if exception_type == "modelStreamErrorException":
        # The model's own failure, which the service passes on.
        body["originalStatusCode"] = 500
        body["originalMessage"] = "Internal server error"
    headers = {
        ":exception-type": exception_type,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return encode_message(headers, json.dumps(body).encode())


def bedrock_malformed_event() -> bytes:
    """A ``contentBlockDelta`` message whose message CRC is wrong: botocore's decoder
    raises ``ChecksumMismatch`` at it, as for bytes corrupted on the way."""
    good = _event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": " broken"}})
    crc = _CRC.unpack(good[-_CRC.size :])[0]
    return good[: -_CRC.size] + _CRC.pack(crc ^ 0xFFFFFFFF)


class BedrockWire(Wire):
    """Bedrock Runtime's Converse and ConverseStream."""

    name: Provider = "bedrock"
    refusal_finish = "content_filtered"

    def route(self, path: str) -> Route | None:
        if not path.startswith("/model/") or not path.endswith(("/converse", "/converse-stream")):
            return None
        operation = path.rsplit("/", 1)[1]
        model = urllib.parse.unquote(path[len("/model/") : -len("/" + operation)])
        return Route(model, operation == "converse-stream")

    def error_body(self, code: int) -> dict[str, Any]:
        return bedrock_error(code, None)[0]

    def status_error(
        self, code: int, body: Mapping[str, Any] | None
    ) -> tuple[Mapping[str, Any], dict[str, str]]:
        sent, error_type = bedrock_error(code, body)
        return sent, ({} if error_type is None else {"x-amzn-ErrorType": error_type})

    error_event = staticmethod(bedrock_stream_exception)
    malformed_event = staticmethod(bedrock_malformed_event)

    def budget_exhausted(self) -> tuple[int, dict[str, Any]]:
        # Bedrock has no spend limit of its own: the account's service quota is its budget.
        message = "Your request exceeds the service quota for your account."
        return 400, {"__type": "ServiceQuotaExceededException", "message": message}

    def context_overflow(self, tokens: int, maximum: int) -> dict[str, Any]:
        # Bedrock states no token counts: a ValidationException and its message.
        return {
            "__type": "ValidationException",
            "message": "Input is too long for requested model.",
        }

    def prompt_texts(self, payload: Mapping[str, Any]) -> Iterator[str]:
        return texts(payload.get("system"))

    body = staticmethod(bedrock_body)
    events = staticmethod(bedrock_events)

    def stream_headers(self, payload: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        # Binary AWS event-stream messages, not SSE.
        return (("Content-Type", BEDROCK_STREAM_CONTENT_TYPE),)

    def request_id_header(self) -> tuple[str, str] | None:
        return "x-amzn-RequestId", str(uuid.uuid4())


BEDROCK = BedrockWire()
