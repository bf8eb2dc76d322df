"""The errors the fakes raise: real SDK exceptions, and a fresh copy for every raise.

Examples:
    >>> from llm_resilience.testing.errors import api_status_error, rate_limit_error
    >>> rate_limit_error(retry_after=20).response.headers["retry-after"]  # doctest: +SKIP
    '20'
    >>> api_status_error(400).status_code  # doctest: +SKIP
    400

The builders return the ``openai`` SDK's own exceptions (``RateLimitError``,
``InternalServerError``, ...) over a real ``httpx.Response`` carrying OpenAI's error body,
so the transient rule sees exactly what it sees in production. Without ``openai``
installed they return an ``httpx.HTTPStatusError`` over the same response; ``httpx`` is
imported only when an error is built, so importing this module costs nothing.
LangChain's and LlamaIndex's fake models (``FailingChatModel``,
``FakeFunctionCallingLLM``) raise these.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, TypeVar

from llm_resilience.testing._wire_base import number

__all__ = [
    "DEFAULT_RATE_LIMIT_MESSAGE",
    "DEFAULT_SERVICE_UNAVAILABLE_MESSAGE",
    "FAKE_URL",
    "api_status_error",
    "fresh_error",
    "rate_limit_error",
    "service_unavailable_error",
]

E = TypeVar("E", bound=BaseException)

#: The request every built error answers: OpenAI's Chat Completions.
FAKE_URL = "https://api.openai.com/v1/chat/completions"
#: ``rate_limit_error``'s message unless given one.
DEFAULT_RATE_LIMIT_MESSAGE = "Error code: 429 - Rate limit reached for requests (scripted)."
#: ``service_unavailable_error``'s message unless given one.
DEFAULT_SERVICE_UNAVAILABLE_MESSAGE = "Error code: 503 - The server is overloaded (scripted)."


def api_status_error(
    status: int, message: str | None = None, *, headers: Mapping[str, str] | None = None
) -> Exception:
    """An error for HTTP ``status`` as the ``openai`` SDK raises it.

    ``openai.RateLimitError`` for 429, ``openai.InternalServerError`` for 5xx,
    ``openai.BadRequestError`` for 400 (401, 403, 404, 409 and 422 likewise), else
    ``openai.APIStatusError``; each holds an ``httpx.Response`` with that status,
    ``headers`` (for example ``{"retry-after": "20"}``) and OpenAI's error body
    (``{"error": {"message", "type", "code"}}``), whose ``error`` object is the
    exception's ``body``. ``message`` defaults to ``"Error code: {status}"``. Without
    ``openai`` installed: an ``httpx.HTTPStatusError`` with the same response. Raises
    ``ValueError`` for a status outside 400-599.
    """
    if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
        raise ValueError(f"status must be an HTTP error status (400-599), got {status!r}")
    try:
        import httpx
    except ImportError as error:  # pragma: no cover - httpx comes with every adapter
        raise ImportError("The fake provider errors need httpx: pip install httpx") from error
    text = message if message is not None else f"Error code: {status}"
    if status == 429:
        kind = "requests"
    else:
        kind = "server_error" if status >= 500 else "invalid_request_error"
    error_object: dict[str, Any] = {"message": text, "type": kind, "code": None}
    request = httpx.Request("POST", FAKE_URL)
    response = httpx.Response(
        status, headers=dict(headers or {}), request=request, json={"error": error_object}
    )
    try:
        import openai
    except ImportError:
        return httpx.HTTPStatusError(text, request=request, response=response)
    by_status: dict[int, type[openai.APIStatusError]] = {
        400: openai.BadRequestError,
        401: openai.AuthenticationError,
        403: openai.PermissionDeniedError,
        404: openai.NotFoundError,
        409: openai.ConflictError,
        422: openai.UnprocessableEntityError,
        429: openai.RateLimitError,
    }
    error_type = by_status.get(status)
    if error_type is None:
        error_type = openai.InternalServerError if status >= 500 else openai.APIStatusError
    return error_type(text, response=response, body=error_object)


def rate_limit_error(
    message: str = DEFAULT_RATE_LIMIT_MESSAGE, *, retry_after: float | None = None
) -> Exception:
    """A 429 as the ``openai`` SDK raises it (``openai.RateLimitError``).

    ``retry_after`` (seconds, default None: no header) sets the ``retry-after`` header
    (``20`` for 20.0), which a fallback chain's ``Cooldown(honor_retry_after=True)`` reads.
    """
    headers = {} if retry_after is None else {"retry-after": number(retry_after)}
    return api_status_error(429, message, headers=headers)


def service_unavailable_error(message: str = DEFAULT_SERVICE_UNAVAILABLE_MESSAGE) -> Exception:
    """A 503 as the ``openai`` SDK raises it (``openai.InternalServerError``)."""
    return api_status_error(503, message)


def fresh_error(error: E) -> E:
    """A copy of ``error`` to raise in its place: same type, arguments and attributes.

    A fake that raises one configured exception object on every call leaks: each raise
    prepends the raising frames to that object's ``__traceback__``, so the traceback
    grows by a few frames per call and keeps all of them (and everything they refer to)
    alive. Raising a shallow copy leaves the configured object untouched; each copy's
    traceback is its own and is freed with it.

    Exceptions whose constructor cannot be replayed from ``args`` (the SDKs' status
    errors take keyword-only ``response`` and ``body``) are copied without calling it.

    Examples:
        >>> original = ValueError("scripted")
        >>> copied = fresh_error(original)
        >>> copied is not original, type(copied), copied.args
        (True, <class 'ValueError'>, ('scripted',))
    """
    try:
        clone = copy.copy(error)
    except Exception:
        clone = type(error).__new__(type(error), *error.args)
        clone.__dict__.update(error.__dict__)
    clone.__traceback__ = None
    clone.__cause__ = error.__cause__
    clone.__suppress_context__ = error.__suppress_context__
    return clone
