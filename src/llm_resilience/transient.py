"""What counts as a transient failure: the one rule every layer of the project shares.

An error is transient when trying the same request elsewhere (or later) may succeed:

* it carries HTTP status 429 or 503 (``status_code``, ``response.status_code``,
  ``status`` or ``code``, which between them cover openai, anthropic, httpx, requests,
  aiohttp and google's clients; an error that arrives mid-stream, on a response that
  already said 200, counts with the status its error type stands for: Anthropic's
  ``error`` event by its type, OpenAI's in-stream ``error`` object of type
  ``server_error`` as a 500; a botocore ``ClientError`` with the status its AWS error
  code stands for: ``ThrottlingException`` and the other throttling codes 429,
  ``ServiceUnavailableException`` 503, ``InternalServerException`` 500,
  ``ModelTimeoutException`` 504, and so does an exception inside a Bedrock event
  stream (``throttlingException``, ...; ``modelStreamErrorException`` 503); a
  google-genai ``APIError`` by its ``code``, so Gemini's ``RESOURCE_EXHAUSTED`` is a 429
  and ``UNAVAILABLE`` a 503, ``INTERNAL`` 500 and ``DEADLINE_EXCEEDED`` 504 transient
  under the server-errors preset; Groq's 498, its flex tier at capacity, as a 503;
  the ``ollama`` SDK's ``ResponseError`` by its
  ``status_code``, and one raised for an ``{"error": ...}`` line of a stream, with no
  status, as a 500);
* it is a transport failure with no status: refused, reset or dropped connections, DNS
  failures, a stream cut mid-body (httpx and its ``httpx2`` twin that anthropic 2.x
  uses, httpcore, requests, urllib3, aiohttp, botocore's connection, read-timeout and
  closed-connection errors, the SDKs' ``APIConnectionError``, builtin
  ``ConnectionError``);
* it is a timeout (builtin and asyncio ``TimeoutError``, the transports' and SDKs'
  timeouts, a fallback chain's own per-client timeout);
* it is a stream event the SDK could not decode: the ``json.JSONDecodeError`` that
  openai, anthropic and groq raise from their SSE decoder for one broken event, and the
  ollama SDK from its reader of a newline-delimited JSON stream (the same error raised
  anywhere else is not transient), botocore's ``ChecksumMismatch`` for an
  event-stream message that fails its CRC;
* its message contains ``rate limit``, ``throttl``, ``timeout`` or ``unavailable``,
  whatever the case;
* it says the account's money or quota upstream is used up ([`is_budget_exhausted`][]:
  HTTP 402, OpenAI's ``insufficient_quota`` 429, Anthropic's ``billing_error``, a
  gateway's ``budget_exceeded``): asking the same member again cannot succeed, so
  ``is_retryable`` never retries it, but another
  member, paid from another account, may well answer, so a chain moves on, whatever
  ``status_codes`` says.

Never transient, whatever they say: [`AttemptCapExceededError`][], [`BudgetExceededError`][],
[`NoCapableMemberError`][],
[`RateLimitQueueFullError`][],
[`StreamInterruptedError`][], ``asyncio.CancelledError``,
``KeyboardInterrupt`` and ``SystemExit``.

Third-party exception types are recognised by the name and top-level package of the
classes in their MRO, so classifying an error never imports an SDK.

Examples:
    >>> is_transient(TimeoutError())
    True
    >>> is_transient(ValueError("bad request"))
    False
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from llm_resilience.errors import (
    AttemptCapExceededError,
    BudgetExceededError,
    NoCapableMemberError,
    RateLimitBackendError,
    RateLimitQueueFullError,
    RequestExceedsCapacityError,
    StreamInterruptedError,
)

__all__ = [
    "DEFAULT_STATUS_CODES",
    "SERVER_ERROR_STATUS_CODES",
    "TransientClassifier",
    "is_budget_exhausted",
    "is_transient",
    "retry_after_of",
    "status_code_of",
]

#: The statuses that mean "try elsewhere": too many requests, service unavailable.
DEFAULT_STATUS_CODES: frozenset[int] = frozenset({429, 503})
#: The default set plus internal error, bad gateway, gateway timeout and provider
#: overload (Anthropic's 529), for [`TransientClassifier.with_server_errors`][].
SERVER_ERROR_STATUS_CODES: frozenset[int] = DEFAULT_STATUS_CODES | {500, 502, 504, 529}

_KEYWORDS = ("rate limit", "throttl", "timeout", "unavailable")

_PINNED_NON_TRANSIENT: tuple[type[BaseException], ...] = (
    AttemptCapExceededError,
    BudgetExceededError,
    NoCapableMemberError,
    RateLimitQueueFullError,
    RateLimitBackendError,
    RequestExceedsCapacityError,
    StreamInterruptedError,
    asyncio.CancelledError,
    KeyboardInterrupt,
    SystemExit,
    GeneratorExit,
)

_BUILTIN_TRANSIENT: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    socket.gaierror,
    socket.timeout,
)

# (top-level package, class name) of third-party transport and timeout errors. A class
# matches when any class in its MRO has one of these identities. ``httpx2`` mirrors
# ``httpx`` without inheriting from it, hence both families.
_TRANSPORT_TYPES: frozenset[tuple[str, str]] = frozenset(
    {
        ("httpx", "TransportError"),
        ("httpx", "TimeoutException"),
        ("httpx2", "TransportError"),
        ("httpx2", "TimeoutException"),
        ("httpcore", "NetworkError"),
        ("httpcore", "TimeoutException"),
        ("httpcore", "RemoteProtocolError"),
        ("httpcore2", "NetworkError"),
        ("httpcore2", "TimeoutException"),
        ("httpcore2", "RemoteProtocolError"),
        ("requests", "ConnectionError"),
        ("requests", "Timeout"),
        ("requests", "ChunkedEncodingError"),
        ("urllib3", "ProtocolError"),
        ("urllib3", "NewConnectionError"),
        ("urllib3", "TimeoutError"),
        ("aiohttp", "ClientConnectionError"),
        ("aiohttp", "ServerTimeoutError"),
        ("aiohttp", "ClientPayloadError"),
        ("openai", "APIConnectionError"),
        ("openai", "APITimeoutError"),
        ("anthropic", "APIConnectionError"),
        ("anthropic", "APITimeoutError"),
        # botocore (boto3): ``ConnectionError`` covers EndpointConnectionError (refused,
        # DNS), ConnectTimeoutError and ProxyConnectionError; the other two are a read
        # timeout and a connection closed before or during the response.
        ("botocore", "ConnectionError"),
        ("botocore", "ReadTimeoutError"),
        ("botocore", "ConnectionClosedError"),
        ("botocore", "ResponseStreamingError"),
        # A Bedrock event stream whose message fails its CRC (bytes corrupted on the way):
        # botocore's decoder stops at it, as the SSE decoders stop at a broken event.
        ("botocore", "ChecksumMismatch"),
        # LangChain's typed errors, by type: a rate-limit error is a 429 by definition,
        # connection and timeout errors are transport failures. ``ModelAPIError`` (any
        # 5xx) is left to its status, so 500 stays non-transient by default although
        # LangChain marks it ``is_retryable``.
        ("langchain_core", "ModelRateLimitError"),
        ("langchain_core", "ModelConnectionError"),
        ("langchain_core", "ModelTimeoutError"),
    }
)

_MAX_CAUSE_DEPTH = 8

# Anthropic's documented error types and the statuses they are sent with. A failure after
# a stream started arrives as an SSE ``error`` event on a response that already said 200,
# and the SDK raises it carrying that 200: the body's type is then its only real status
# (``overloaded_error`` is a stream's 529, so the server-error preset must see it).
_ANTHROPIC_ERROR_TYPE_STATUS: dict[str, int] = {
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
# The error types of an OpenAI stream's in-body ``error`` object and the statuses they
# stand for: a stream that fails after its 200 says ``server_error``, a 500's type
# (Groq's streams, OpenAI-shaped, say ``internal_server_error``, its 5xx type).
_OPENAI_STREAM_ERROR_TYPE_STATUS: dict[str, int] = {
    "server_error": 500,
    "internal_server_error": 500,
}
# The ``code`` of an OpenAI-shaped error object that names its status, for an error that
# arrives with no status of its own (inside a stream): a rate limit is a 429, Groq's
# ``service_unavailable`` (a model over capacity) and ``capacity_exceeded`` 503s.
_ERROR_OBJECT_CODE_STATUS: dict[str, int] = {
    "rate_limit_exceeded": 429,
    "service_unavailable": 503,
    "capacity_exceeded": 503,
}
# Groq's custom status for a flex-tier request refused at capacity ("the request won't be
# processed. You can try again later"; error code ``capacity_exceeded``). It counts as a
# 503: the same condition as Groq's own 503 "over capacity" on the on-demand tier, a
# refusal before any work, sent fast so that the caller goes elsewhere; left as a 4xx it
# would read as the caller's fault and propagate. Only Groq's: other services use 498 for
# other things (an invalid token), so it must come from the groq SDK or say
# ``capacity_exceeded``.
_GROQ_CAPACITY_EXCEEDED = 498
# AWS error codes (botocore's ``ClientError.response["Error"]["Code"]``) and the statuses
# they stand for. AWS names a throttle by its code, whatever status carries it (older
# services send ``ThrottlingException`` with a 400), so the code decides: the throttling
# codes count as 429, ``ServiceUnavailableException`` as 503 (both transient by
# default), ``InternalServerException`` as 500 and Bedrock's ``ModelTimeoutException``
# (sent with 408) as 504, like Anthropic's ``timeout_error``: server errors, transient
# under the server-errors preset. Any other code counts with its HTTP status.
# Bedrock's ``ModelStreamErrorException`` (a model's stream that failed after it
# started; "Retry your request", says the service model) counts as 503: the stream broke,
# as a cut connection does, and another member may well answer.
_AWS_ERROR_CODE_STATUS: dict[str, int] = {
    "ThrottlingException": 429,
    "Throttling": 429,
    "ThrottledException": 429,
    "TooManyRequestsException": 429,
    "RequestLimitExceeded": 429,
    "ModelNotReadyException": 429,
    "ServiceUnavailableException": 503,
    "ServiceUnavailable": 503,
    "ModelStreamErrorException": 503,
    "InternalServerException": 500,
    "InternalFailure": 500,
    "ModelTimeoutException": 504,
}
# The statuses AWS declares for the exceptions an event stream can carry, for an
# exception that arrives mid-stream: botocore's ``EventStreamError`` holds the code and
# message only, no HTTP status (the stream's own response said 200).
_AWS_STREAM_EXCEPTION_STATUS: dict[str, int] = {
    "ValidationException": 400,
    "AccessDeniedException": 403,
    "ResourceNotFoundException": 404,
    "ModelErrorException": 424,
}
# The ollama SDK's ``ResponseError`` takes ``status_code=-1`` when no status came with
# the error: it raises it so for an ``{"error": ...}`` line of a stream that already said
# 200, which Ollama writes when its model runner failed mid-answer. A server error.
_OLLAMA_NO_STATUS = -1
_OLLAMA_STREAM_FAILURE_STATUS = 500


def _is_ollama_response_error(exc: BaseException) -> bool:
    return any(
        klass.__name__ == "ResponseError" and klass.__module__.partition(".")[0] == "ollama"
        for klass in type(exc).__mro__
    )


def status_code_of(exc: BaseException) -> int | None:
    """The HTTP error status an exception carries, or None.

    Looks at ``status_code``, ``status`` and ``code`` on the error and on its
    ``response``; only integers that are HTTP error statuses (400-599) count. Failing
    those, an Anthropic error body (``{"type": "error", "error": {"type": ...}}``)
    gives the status of its error type, e.g. 529 for ``overloaded_error``, and the
    error object of an OpenAI stream (the ``body`` of the SDK's ``APIError``,
    ``{"type": "server_error", ...}``) gives 500.
    A botocore ``ClientError`` (boto3) counts with the status its AWS error code stands
    for (``ThrottlingException`` 429, ``ServiceUnavailableException`` 503,
    ``InternalServerException`` 500, ``ModelTimeoutException`` 504), else with its
    ``ResponseMetadata.HTTPStatusCode``. An exception inside a Bedrock event stream
    (botocore's ``EventStreamError``, its code the stream member's name:
    ``throttlingException``, ``serviceUnavailableException``, ``internalServerException``,
    ``modelStreamErrorException`` 503, ``validationException`` 400) counts the same
    way, by its code. An error langchain-google-genai re-raised
    (``GoogleRateLimitError`` and its kin carry no status) has its cause's. Groq's 498
    (flex tier at capacity, ``capacity_exceeded``) counts as 503; an OpenAI-shaped error
    object inside a stream counts by its ``code`` (``rate_limit_exceeded`` 429, Groq's
    ``service_unavailable`` and ``capacity_exceeded`` 503), else by its type
    (``server_error``, Groq's ``internal_server_error``: 500).
    An ollama
    ``ResponseError`` with no status (``status_code`` -1: an error line inside a stream)
    counts as a 500.
    """
    aws = _aws_error(exc)
    if aws is not None:
        code, status, _message = aws
        # An event stream names its exceptions in lower camel case (``throttlingException``).
        code = code[:1].upper() + code[1:]
        known = _AWS_ERROR_CODE_STATUS.get(code)
        if known is not None:
            return known
        return status if status is not None else _AWS_STREAM_EXCEPTION_STATUS.get(code)
    for holder in (exc, _safe_getattr(exc, "response")):
        if holder is None:
            continue
        for name in ("status_code", "status", "code"):
            value = _safe_getattr(holder, name)
            if isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 599:
                if value == _GROQ_CAPACITY_EXCEEDED and _is_groq_capacity_error(exc):
                    return 503
                return value
    if _is_ollama_response_error(exc) and _safe_getattr(exc, "status_code") == _OLLAMA_NO_STATUS:
        return _OLLAMA_STREAM_FAILURE_STATUS
    body = _safe_getattr(exc, "body")
    if isinstance(body, Mapping) and body.get("type") == "error":
        error = body.get("error")
        if isinstance(error, Mapping):
            error_type = error.get("type")
            if isinstance(error_type, str):
                return _ANTHROPIC_ERROR_TYPE_STATUS.get(error_type)
    if isinstance(body, Mapping) and "message" in body:
        # OpenAI's SDK raises a bare ``APIError`` (no status) for an ``error`` object
        # in a stream that already said 200; its ``body`` is that object (groq's too).
        error_code = body.get("code")
        if isinstance(error_code, str) and error_code in _ERROR_OBJECT_CODE_STATUS:
            return _ERROR_OBJECT_CODE_STATUS[error_code]
        error_type = body.get("type")
        if isinstance(error_type, str):
            return _OPENAI_STREAM_ERROR_TYPE_STATUS.get(error_type)
    cause = exc.__cause__
    if cause is not None and any(
        klass.__module__.partition(".")[0] == "langchain_google_genai"
        for klass in type(exc).__mro__
    ):
        # langchain-google-genai re-raises google-genai's ClientError as its own
        # GoogleRateLimitError, GoogleInvalidRequestError, ... with no status, ``from`` it.
        return status_code_of(cause)
    return None


# The error codes and types that say an account's money or quota upstream is used up.
# OpenAI: a 429 whose error object says ``insufficient_quota`` (code and type) when the
# account's credit or monthly limit is spent, unlike the 429 ``rate_limit_exceeded`` that
# passes. Anthropic: ``billing_error`` (sent with 402). LiteLLM's proxy: an error object of
# type ``budget_exceeded`` (a key's, user's or team's budget; sent with 400 or 429 by
# version). AWS: Bedrock's ``ServiceQuotaExceededException`` (400), the account's quota.
_BUDGET_EXHAUSTED_CODES: frozenset[str] = frozenset(
    {
        "insufficient_quota",
        "billing_error",
        "budget_exceeded",
        "ServiceQuotaExceededException",
    }
)
#: HTTP 402 Payment Required: OpenRouter's "insufficient credits", Anthropic's billing
#: error, and any gateway that refuses for want of credit.
PAYMENT_REQUIRED = 402
# Anthropic's older answer for an account out of credit: a 400 ``invalid_request_error``
# whose message says so (the only way to tell it from a bad request).
_ANTHROPIC_NO_CREDIT = "credit balance is too low"


def is_budget_exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` says the provider account's money or quota is used up.

    True for HTTP 402 (Payment Required), for an error object whose ``code`` or ``type``
    is ``insufficient_quota`` (OpenAI's 429 when credit or the monthly limit is spent),
    ``billing_error`` (Anthropic) or ``budget_exceeded`` (LiteLLM's proxy), for Bedrock's
    ``ServiceQuotaExceededException``, and for Anthropic's 400 "Your credit balance is too
    low"; the error's explicit causes are looked at too. Such an error is never retried on
    the same member (``is_retryable``, ``member_retry``),
    and a fallback chain moves on to the next member ([`TransientClassifier`][]).

    Examples:
        >>> class QuotaError(Exception):
        ...     status_code = 429
        ...     body = {"message": "You exceeded your current quota", "code": "insufficient_quota"}
        >>> is_budget_exhausted(QuotaError())
        True
        >>> is_budget_exhausted(TimeoutError())
        False
    """
    return any(_says_budget_exhausted(error) for error in _chain(exc))


def _says_budget_exhausted(exc: BaseException) -> bool:
    if isinstance(exc, _PINNED_NON_TRANSIENT):
        return False
    aws = _aws_error(exc)
    if aws is not None:
        return aws[0] in _BUDGET_EXHAUSTED_CODES or aws[1] == PAYMENT_REQUIRED
    if status_code_of(exc) == PAYMENT_REQUIRED:
        return True
    # The SDKs keep the error object as ``body`` (openai, groq: the object itself; anthropic:
    # ``{"type": "error", "error": {...}}``), and openai's also as ``code``/``type``.
    found: list[object] = [_safe_getattr(exc, "code"), _safe_getattr(exc, "type")]
    body = _safe_getattr(exc, "body")
    for holder in (body, body.get("error") if isinstance(body, Mapping) else None):
        if isinstance(holder, Mapping):
            found.extend((holder.get("code"), holder.get("type")))
    if any(isinstance(value, str) and value in _BUDGET_EXHAUSTED_CODES for value in found):
        return True
    if status_code_of(exc) == 400:
        try:
            return _ANTHROPIC_NO_CREDIT in str(exc).lower()
        except Exception:
            return False
    return False


def _is_groq_capacity_error(exc: BaseException) -> bool:
    """A 498 from Groq: raised by the groq SDK, or an error object saying ``capacity_exceeded``
    (the openai SDK keeps the object as ``body``; groq's keeps ``{"error": ...}``)."""
    if any(klass.__module__.partition(".")[0] == "groq" for klass in type(exc).__mro__):
        return True
    body = _safe_getattr(exc, "body")
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        body = body["error"]
    return isinstance(body, Mapping) and "capacity_exceeded" in (body.get("code"), body.get("type"))


def _aws_error(exc: BaseException) -> tuple[str, int | None, str] | None:
    """``(code, HTTP status, message)`` of a botocore ``ClientError``, else None."""
    if not any(
        klass.__name__ == "ClientError" and klass.__module__.partition(".")[0] == "botocore"
        for klass in type(exc).__mro__
    ):
        return None
    response = _safe_getattr(exc, "response")
    if not isinstance(response, Mapping):
        return ("", None, "")
    error = response.get("Error")
    error = error if isinstance(error, Mapping) else {}
    metadata = response.get("ResponseMetadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    raw = metadata.get("HTTPStatusCode")
    status = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    if status is not None and not 400 <= status <= 599:
        status = None
    return (str(error.get("Code") or ""), status, str(error.get("Message") or ""))


def _safe_getattr(obj: object, name: str) -> object:
    # Some SDK properties raise when the attribute was never set (httpx's ``request``).
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _is_transport_type(cls: type) -> bool:
    for klass in cls.__mro__:
        package = klass.__module__.partition(".")[0]
        if (package, klass.__name__) in _TRANSPORT_TYPES:
            return True
    return False


# The SDK modules that decode a stream's events. openai, anthropic and groq (a Stainless
# SDK too) call ``json.loads`` on each SSE event's data there, ollama on each line of its
# newline-delimited JSON, and let its ``JSONDecodeError`` out as is.
_SSE_DECODERS = frozenset(
    {"openai._streaming", "anthropic._streaming", "groq._streaming", "ollama._client"}
)


def _is_broken_stream_event(exc: BaseException) -> bool:
    """A ``JSONDecodeError`` raised while an SDK decoded one SSE event of a stream.

    Only that: a ``JSONDecodeError`` from anywhere else (a tool's arguments, a user's
    own parsing) and every other ``ValueError`` stay non-transient.
    """
    if not isinstance(exc, json.JSONDecodeError):
        return False
    frame = exc.__traceback__
    while frame is not None:
        if frame.tb_frame.f_globals.get("__name__") in _SSE_DECODERS:
            return True
        frame = frame.tb_next
    return False


def _message_has_keyword(exc: BaseException) -> bool:
    # A botocore ClientError's text names its error code ("... (ModelTimeoutException)
    # when calling ..."); the code is classified by ``status_code_of``, only the
    # provider's message counts here.
    aws = _aws_error(exc)
    try:
        text = (aws[2] if aws is not None else str(exc)).lower()
    except Exception:
        return False
    return any(keyword in text for keyword in _KEYWORDS)


def _chain(exc: BaseException) -> Iterable[BaseException]:
    """The error and its explicit causes (``raise ... from ...``), nearest first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < _MAX_CAUSE_DEPTH:
        seen.add(id(current))
        yield current
        current = current.__cause__


@dataclass(frozen=True, slots=True)
class TransientClassifier:
    """A configurable transient-error rule; calling it classifies one exception.

    ``status_codes`` replaces the default ``{429, 503}``; ``also`` is an extra
    predicate that can only widen the rule (it is never consulted for the pinned
    non-transient types). [`with_server_errors`][] is the preset that adds 500, 502,
    504 and 529.

    Examples:
        >>> classify = TransientClassifier(status_codes={429, 503, 529})
        >>> classify(KeyboardInterrupt())
        False
    """

    status_codes: frozenset[int] = DEFAULT_STATUS_CODES
    also: Callable[[BaseException], bool] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        codes = self.status_codes
        if isinstance(codes, (str, bytes)) or not isinstance(codes, Iterable):
            raise TypeError(
                f"status_codes must be a collection of HTTP status integers, got {codes!r}"
            )
        normalised = frozenset(codes)
        for code in normalised:
            if isinstance(code, bool) or not isinstance(code, int) or not 400 <= code <= 599:
                raise ValueError(
                    "status_codes must hold HTTP error status integers between 400 and 599; "
                    f"got {code!r}"
                )
        object.__setattr__(self, "status_codes", normalised)
        if self.also is not None and not callable(self.also):
            raise TypeError(f"also must be a callable taking an exception, got {self.also!r}")

    @classmethod
    def with_server_errors(
        cls, also: Callable[[BaseException], bool] | None = None
    ) -> TransientClassifier:
        """The preset for providers that shed load with 5xx: 429, 500, 502, 503, 504, 529."""
        return cls(status_codes=SERVER_ERROR_STATUS_CODES, also=also)

    def __call__(self, exc: BaseException) -> bool:
        if isinstance(exc, _PINNED_NON_TRANSIENT):
            return False
        for error in _chain(exc):
            if isinstance(error, _PINNED_NON_TRANSIENT):
                return False
            if _says_budget_exhausted(error):
                return True  # this member's account is spent; another member's may not be
            status = status_code_of(error)
            if status is not None:
                if status in self.status_codes:
                    return True
            elif (
                isinstance(error, _BUILTIN_TRANSIENT)
                or _is_transport_type(type(error))
                or _is_broken_stream_event(error)
            ):
                return True
            if _message_has_keyword(error):
                return True
        return self.also is not None and bool(self.also(exc))


_DEFAULT = TransientClassifier()


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is transient under the default rule (statuses 429 and 503)."""
    return _DEFAULT(exc)


def retry_after_of(exc: BaseException, *, now: Callable[[], float] | None = None) -> float | None:
    """Seconds the provider asked us to wait, from ``retry-after-ms`` or ``Retry-After``.

    ``Retry-After`` may be seconds or an HTTP date. Looks at the error's ``response``
    headers (openai, anthropic, httpx, requests) or its own ``headers`` (aiohttp), along
    the cause chain, or a botocore ``ClientError``'s ``ResponseMetadata.HTTPHeaders``, or
    for an ollama ``ResponseError`` (raised ``from None``, holding no headers) the
    response of the httpx error it was raised while handling (its ``__context__``).
    With no such header, a google-genai ``APIError`` whose body holds a
    ``google.rpc.RetryInfo`` detail gives its ``retryDelay`` (``"7s"``), as Gemini's 429
    ``RESOURCE_EXHAUSTED`` states it. Returns None when no usable delay is present.
    """
    for error in _chain(exc):
        found = _header_delay(error, now)
        if found is None:
            found = _retry_info_delay(error)
        if found is not None:
            return found
    return None


def _header_delay(error: BaseException, now: Callable[[], float] | None) -> float | None:
    import email.utils
    import time

    headers = _safe_getattr(_safe_getattr(error, "response"), "headers")
    if headers is None:
        headers = _safe_getattr(error, "headers")
    if headers is None and _is_ollama_response_error(error):
        # ``raise ResponseError(...) from None`` hides the httpx error, but keeps it.
        context = error.__context__
        headers = _safe_getattr(_safe_getattr(context, "response"), "headers")
    if headers is None and _aws_error(error) is not None:
        # botocore keeps the response headers, lower-cased, in its metadata.
        response = _safe_getattr(error, "response")
        metadata = response.get("ResponseMetadata") if isinstance(response, Mapping) else None
        headers = metadata.get("HTTPHeaders") if isinstance(metadata, Mapping) else None
    if headers is None or not hasattr(headers, "get"):
        return None
    raw_ms = _header(headers, "retry-after-ms")
    if raw_ms is not None:
        try:
            millis = float(raw_ms)
        except ValueError:
            millis = -1.0
        if millis >= 0 and millis == millis:
            return millis / 1000.0
    raw = _header(headers, "retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        current = now() if now is not None else time.time()
        seconds = when.timestamp() - current
    if seconds == seconds and seconds != float("inf"):
        return max(0.0, seconds)
    return None


_RETRY_INFO_TYPE = "type.googleapis.com/google.rpc.RetryInfo"


def _is_google_api_error(exc: BaseException) -> bool:
    return any(
        klass.__name__ == "APIError" and klass.__module__ == "google.genai.errors"
        for klass in type(exc).__mro__
    )


def _retry_info_delay(error: BaseException) -> float | None:
    """The ``retryDelay`` of a google-genai ``APIError``'s ``RetryInfo`` detail, in seconds.

    ``details`` holds the response body, ``{"error": {..., "details": [...]}}``; the
    delay is a protobuf ``Duration`` in JSON, ``"7s"`` or ``"0.5s"``.
    """
    if not _is_google_api_error(error):
        return None
    body = _safe_getattr(error, "details")
    if not isinstance(body, Mapping):
        return None
    inner = body.get("error", body)
    details = inner.get("details") if isinstance(inner, Mapping) else None
    if not isinstance(details, list):
        return None
    for detail in details:
        if not isinstance(detail, Mapping) or detail.get("@type") != _RETRY_INFO_TYPE:
            continue
        delay = detail.get("retryDelay")
        if not isinstance(delay, str) or not delay.endswith("s"):
            continue
        try:
            seconds = float(delay[:-1])
        except ValueError:
            continue
        if seconds == seconds and 0 <= seconds != float("inf"):
            return seconds
    return None


def _header(headers: object, name: str) -> str | None:
    getter = getattr(headers, "get", None)
    if getter is None:
        return None
    try:
        value = getter(name)
        if value is None:
            value = getter(name.title())
    except Exception:
        return None
    return None if value is None else str(value).strip()
