"""The transient rule (SPEC section 1) against the real exception classes.

Every error here is built the way its library builds it. openai and anthropic errors come
out of the SDK clients themselves, driven through a mock transport (``max_retries=0``), so
their class, message (``Error code: 429 - {...}``), response and ``__cause__`` are the
SDK's own. LangChain's come out of ``ChatOpenAI`` and langchain-anthropic's converter.
Transport errors are built with the arguments their libraries pass, and the key ones are
also produced for real by sockets on 127.0.0.1 (refused, hung, cut mid-body).

A verdict is the pair (default rule with 429/503, ``with_server_errors()`` preset).
"""

from __future__ import annotations

import asyncio
import email.utils
import errno
import importlib
import socket
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http import HTTPStatus
from typing import Any

import aiohttp
import anthropic
import httpcore
import httpcore2
import httpx
import httpx2
import openai
import pytest
import requests
import urllib3
from aiohttp.client_reqrep import ConnectionKey, RequestInfo
from langchain_anthropic.chat_models import (
    AnthropicAPIError,
    AnthropicConnectionError,
    AnthropicInvalidRequestError,
    AnthropicOverloadedError,
    AnthropicRateLimitError,
    AnthropicTimeoutError,
    _handle_anthropic_api_error,
    _handle_anthropic_bad_request,
)
from langchain_core.exceptions import (
    ModelAPIError,
    ModelConnectionError,
    ModelError,
    ModelInvalidRequestError,
    ModelRateLimitError,
    ModelTimeoutError,
)
from langchain_openai import ChatOpenAI
from langchain_openai.chat_models.base import (
    OpenAIAPIError,
    OpenAIConnectionError,
    OpenAIInvalidRequestError,
    OpenAIRateLimitError,
    OpenAITimeoutError,
)
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from llm_resilience.errors import (
    BudgetExceededError,
    PerClientTimeoutError,
    RateLimitQueueFullError,
)
from llm_resilience.transient import (
    SERVER_ERROR_STATUS_CODES,
    TransientClassifier,
    is_transient,
    retry_after_of,
    status_code_of,
)

PRESET = TransientClassifier.with_server_errors()
KEYWORDS = ("rate limit", "throttl", "timeout", "unavailable")
UNUSED_URL = "http://127.0.0.1:9"  # never dialled: mock transports answer first
# anthropic 2.x rides on httpx2, 0.x on httpx (the dev pin, for llama-index-llms-anthropic):
# its errors are built with whichever HTTP library the installed SDK uses.
anthropic_http: Any = importlib.import_module(
    anthropic.DefaultHttpxClient.__mro__[1].__module__.partition(".")[0]
)
# 2.x raises its own classes for 503 and 504; 0.x the generic 5xx class for both.
ANTHROPIC_2 = int(anthropic.__version__.split(".")[0]) >= 2
ANTHROPIC_503_CLASS: type = (
    anthropic.ServiceUnavailableError if ANTHROPIC_2 else anthropic.InternalServerError
)
ANTHROPIC_504_CLASS: type = getattr(anthropic, "GatewayTimeoutError", anthropic.InternalServerError)

Build = Callable[[], BaseException]
#: (transient under the default rule, transient under the server-error preset)
Verdict = tuple[bool, bool]
TRANSIENT: Verdict = (True, True)
PRESET_ONLY: Verdict = (False, True)
NEVER: Verdict = (False, False)


def _check(error: BaseException, built_as: type, verdict: Verdict) -> None:
    assert isinstance(error, built_as), f"the library built {type(error)}"
    assert (is_transient(error), PRESET(error)) == verdict, repr(error)


def _without_keywords(error: BaseException) -> bool:
    return not any(keyword in str(error).lower() for keyword in KEYWORDS)


def _raised_from(error: BaseException, cause: BaseException) -> BaseException:
    try:
        raise error from cause
    except BaseException as raised:
        return raised


# --- provider bodies, as the APIs send them --------------------------------------------------

OPENAI_429 = {
    "error": {
        "message": "Rate limit reached for gpt-4o-mini in organization org-test on requests "
        "per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 120ms. Visit "
        "https://platform.openai.com/account/rate-limits to learn more.",
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
}
# OpenAI's overload answer says no transient keyword, so only the status can decide.
OPENAI_BUSY = {
    "error": {
        "message": "The server is overloaded or not ready yet.",
        "type": "server_error",
        "param": None,
        "code": None,
    }
}
OPENAI_500 = {
    "error": {
        "message": "The server had an error while processing your request. Sorry about that!",
        "type": "server_error",
        "param": None,
        "code": None,
    }
}
OPENAI_400 = {
    "error": {
        "message": "Invalid value for 'messages[0].role': 'robot'.",
        "type": "invalid_request_error",
        "param": "messages[0].role",
        "code": "invalid_value",
    }
}
OPENAI_401 = {
    "error": {
        "message": "Incorrect API key provided: sk-test. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}
OPENAI_502_HTML = "<html><body><h1>502 Bad Gateway</h1></body></html>"


def anthropic_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


ANTHROPIC_429 = anthropic_body(
    "rate_limit_error",
    "This request would exceed your organization's rate limit of 50,000 input tokens per "
    "minute. For details, refer to: https://docs.claude.com/en/api/rate-limits.",
)
ANTHROPIC_529 = anthropic_body("overloaded_error", "Overloaded")
ANTHROPIC_500 = anthropic_body("api_error", "Internal server error")
ANTHROPIC_504 = anthropic_body("timeout_error", "Request timed out")
ANTHROPIC_400 = anthropic_body(
    "invalid_request_error", "messages: roles must alternate between user and assistant"
)


# --- openai, through the SDK client --------------------------------------------------------


def _openai_error_from(handler: Callable[[httpx.Request], httpx.Response]) -> openai.APIError:
    client = openai.OpenAI(
        api_key="sk-test",
        base_url=f"{UNUSED_URL}/v1",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.APIError) as caught:
        client.chat.completions.create(model="gpt-4o-mini", messages=messages)
    return caught.value


def _httpx_answer(
    status: int, body: object, headers: dict[str, str] | None
) -> Callable[[httpx.Request], httpx.Response]:
    def answer(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, text=body, headers=headers)
        return httpx.Response(status, json=body, headers=headers)

    return answer


def openai_status_error(
    status: int, body: object, headers: dict[str, str] | None = None
) -> openai.APIError:
    """What ``OpenAI._make_status_error_from_response`` raises for this HTTP answer."""
    return _openai_error_from(_httpx_answer(status, body, headers))


def openai_transport_error(raised: type[httpx.TransportError]) -> openai.APIError:
    """What the SDK raises when httpx fails to send: its own error, ``from`` httpx's."""

    def fail(request: httpx.Request) -> httpx.Response:
        raise raised("[Errno 111] Connection refused", request=request)

    return _openai_error_from(fail)


@pytest.mark.parametrize(
    ("status", "body", "built_as", "verdict"),
    [
        pytest.param(429, OPENAI_429, openai.RateLimitError, TRANSIENT, id="RateLimitError-429"),
        pytest.param(503, OPENAI_BUSY, openai.InternalServerError, TRANSIENT, id="Internal-503"),
        pytest.param(500, OPENAI_500, openai.InternalServerError, PRESET_ONLY, id="Internal-500"),
        pytest.param(
            502, OPENAI_502_HTML, openai.InternalServerError, PRESET_ONLY, id="Internal-502-html"
        ),
        pytest.param(529, OPENAI_BUSY, openai.APIStatusError, PRESET_ONLY, id="APIStatusError-529"),
        pytest.param(400, OPENAI_400, openai.BadRequestError, NEVER, id="BadRequestError-400"),
        pytest.param(401, OPENAI_401, openai.AuthenticationError, NEVER, id="Authentication-401"),
    ],
)
def test_openai_status_errors_follow_the_status_rule(
    status: int, body: object, built_as: type, verdict: Verdict
) -> None:
    _check(openai_status_error(status, body), built_as, verdict)


def test_openai_errors_carry_the_sdk_message_format_and_a_text_code() -> None:
    error = openai_status_error(429, OPENAI_429)
    assert str(error).startswith("Error code: 429 - {'error': {'message': 'Rate limit reached")
    assert error.code == "rate_limit_exceeded"  # a text `code` must not hide the status
    assert status_code_of(error) == 429


def test_a_503_without_any_keyword_is_transient_by_its_status_alone() -> None:
    unavailable = openai_status_error(503, OPENAI_BUSY)
    assert _without_keywords(unavailable)
    assert is_transient(unavailable)
    assert not is_transient(openai_status_error(500, OPENAI_BUSY))


# --- anthropic, through the SDK client (on its own HTTP library) -----------------------------


def _anthropic_error_from(
    handler: Callable[[Any], Any], *, stream: bool = False
) -> anthropic.APIError:
    client = anthropic.Anthropic(
        api_key="sk-FAKE-anthropic",
        base_url=UNUSED_URL,
        max_retries=0,
        http_client=anthropic_http.Client(transport=anthropic_http.MockTransport(handler)),
    )
    with pytest.raises(anthropic.APIError) as caught:
        _anthropic_send(client, stream=stream)
    return caught.value


def _anthropic_send(client: anthropic.Anthropic, *, stream: bool) -> None:
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    if not stream:
        client.messages.create(model="claude-sonnet-4-6", max_tokens=16, messages=messages)
        return
    events = client.messages.create(
        model="claude-sonnet-4-6", max_tokens=16, messages=messages, stream=True
    )
    for _ in events:
        pass


def anthropic_status_error(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> anthropic.APIError:
    """What anthropic's ``make_status_error`` raises for this HTTP answer."""
    return _anthropic_error_from(
        lambda request: anthropic_http.Response(status, json=body, headers=headers)
    )


def anthropic_transport_error(raised: type[BaseException]) -> anthropic.APIError:
    def fail(request: Any) -> Any:
        raise raised("[Errno 111] Connection refused", request=request)

    return _anthropic_error_from(fail)


def anthropic_mid_stream_error(error_type: str) -> anthropic.APIError:
    """An SSE ``error`` event after ``message_start``: the SDK raises it with status 200."""
    start = (
        '{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",'
        '"model":"claude-sonnet-4-6","content":[],"stop_reason":null,"stop_sequence":null,'
        '"usage":{"input_tokens":3,"output_tokens":1}}}'
    )
    error = f'{{"type":"error","error":{{"type":"{error_type}","message":"Failed"}}}}'
    sse = f"event: message_start\ndata: {start}\n\nevent: error\ndata: {error}\n\n".encode()
    headers = {"content-type": "text/event-stream"}
    return _anthropic_error_from(
        lambda request: anthropic_http.Response(200, content=sse, headers=headers), stream=True
    )


@pytest.mark.parametrize(
    ("status", "body", "built_as", "verdict"),
    [
        pytest.param(
            429, ANTHROPIC_429, anthropic.RateLimitError, TRANSIENT, id="RateLimitError-429"
        ),
        pytest.param(
            529, ANTHROPIC_529, anthropic.OverloadedError, PRESET_ONLY, id="OverloadedError-529"
        ),
        pytest.param(
            500, ANTHROPIC_500, anthropic.InternalServerError, PRESET_ONLY, id="Internal-500"
        ),
        pytest.param(503, ANTHROPIC_500, ANTHROPIC_503_CLASS, TRANSIENT, id="Unavailable-503"),
        # Anthropic's 504 body names `timeout_error`: the keyword rule holds before the preset.
        pytest.param(504, ANTHROPIC_504, ANTHROPIC_504_CLASS, TRANSIENT, id="GatewayTimeout-504"),
        pytest.param(400, ANTHROPIC_400, anthropic.BadRequestError, NEVER, id="BadRequest-400"),
    ],
)
def test_anthropic_status_errors_follow_the_status_rule(
    status: int, body: dict[str, Any], built_as: type, verdict: Verdict
) -> None:
    _check(anthropic_status_error(status, body), built_as, verdict)


@pytest.mark.parametrize(
    ("error_type", "status", "verdict"),
    [
        pytest.param("overloaded_error", 529, PRESET_ONLY, id="overloaded_error"),
        pytest.param("rate_limit_error", 429, TRANSIENT, id="rate_limit_error"),
        pytest.param("api_error", 500, PRESET_ONLY, id="api_error"),
        pytest.param("invalid_request_error", None, NEVER, id="invalid_request_error"),
    ],
)
def test_anthropic_errors_sent_mid_stream_count_with_the_status_of_their_type(
    error_type: str, status: int | None, verdict: Verdict
) -> None:
    # The SDK raises them carrying the stream's own 200; the body's type is the real status.
    error = anthropic_mid_stream_error(error_type)
    assert isinstance(error, anthropic.APIStatusError)
    assert error.status_code == 200
    assert status_code_of(error) == status
    _check(error, anthropic.APIStatusError, verdict)


# --- LangChain's re-raised errors ------------------------------------------------------------


def chat_openai_error(handler: Callable[[httpx.Request], httpx.Response]) -> BaseException:
    """What ``ChatOpenAI.invoke`` raises when its SDK call fails (converted, ``from`` it)."""
    model = ChatOpenAI(
        model="gpt-4o-mini",
        api_key="sk-test",  # type: ignore[arg-type]
        base_url=f"{UNUSED_URL}/v1",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    with pytest.raises(ModelError) as caught:
        model.invoke("hi")
    return caught.value


def chat_openai_status_error(
    status: int, body: object, headers: dict[str, str] | None = None
) -> BaseException:
    return chat_openai_error(_httpx_answer(status, body, headers))


def chat_openai_transport_error(raised: type[httpx.TransportError]) -> BaseException:
    def fail(request: httpx.Request) -> httpx.Response:
        raise raised("[Errno 111] Connection refused", request=request)

    return chat_openai_error(fail)


def chat_anthropic_error(sdk_error: anthropic.APIError) -> BaseException:
    """What ``ChatAnthropic`` raises for that SDK error (its own conversion functions)."""
    try:
        try:
            raise sdk_error
        except anthropic.BadRequestError as caught:
            _handle_anthropic_bad_request(caught)
        except anthropic.APIError as caught:
            _handle_anthropic_api_error(caught)
    except ModelError as converted:
        return converted
    raise AssertionError(f"langchain-anthropic did not convert {sdk_error!r}")


def chat_anthropic_status_error(status: int, body: dict[str, Any]) -> BaseException:
    return chat_anthropic_error(anthropic_status_error(status, body))


def chat_anthropic_transport_error(raised: type[BaseException]) -> BaseException:
    return chat_anthropic_error(anthropic_transport_error(raised))


@pytest.mark.parametrize(
    ("status", "body", "built_as", "verdict"),
    [
        pytest.param(429, OPENAI_429, OpenAIRateLimitError, TRANSIENT, id="RateLimit-429"),
        pytest.param(500, OPENAI_500, OpenAIAPIError, PRESET_ONLY, id="APIError-500"),
        pytest.param(503, OPENAI_BUSY, OpenAIAPIError, TRANSIENT, id="APIError-503"),
        pytest.param(400, OPENAI_400, OpenAIInvalidRequestError, NEVER, id="InvalidRequest-400"),
    ],
)
def test_langchain_openai_errors_are_classified_like_the_sdk_errors_they_wrap(
    status: int, body: object, built_as: type, verdict: Verdict
) -> None:
    error = chat_openai_status_error(status, body)
    assert isinstance(error.__cause__, openai.APIStatusError)
    assert status_code_of(error) == status_code_of(error.__cause__) == status
    _check(error, built_as, verdict)


@pytest.mark.parametrize(
    ("status", "body", "built_as", "verdict"),
    [
        pytest.param(429, ANTHROPIC_429, AnthropicRateLimitError, TRANSIENT, id="RateLimit-429"),
        pytest.param(529, ANTHROPIC_529, AnthropicOverloadedError, PRESET_ONLY, id="Overload-529"),
        pytest.param(500, ANTHROPIC_500, AnthropicAPIError, PRESET_ONLY, id="APIError-500"),
        pytest.param(
            400, ANTHROPIC_400, AnthropicInvalidRequestError, NEVER, id="InvalidRequest-400"
        ),
    ],
)
def test_langchain_anthropic_errors_are_classified_like_the_sdk_errors_they_wrap(
    status: int, body: dict[str, Any], built_as: type, verdict: Verdict
) -> None:
    error = chat_anthropic_status_error(status, body)
    assert isinstance(error.__cause__, anthropic.APIStatusError)
    assert status_code_of(error) == status_code_of(error.__cause__) == status
    _check(error, built_as, verdict)


@pytest.mark.parametrize(
    ("build", "raised", "built_as"),
    [
        pytest.param(
            openai_transport_error, httpx.ConnectError, openai.APIConnectionError, id="openai"
        ),
        pytest.param(
            openai_transport_error, httpx.ReadTimeout, openai.APITimeoutError, id="openai-timeout"
        ),
        pytest.param(
            anthropic_transport_error,
            anthropic_http.ConnectError,
            anthropic.APIConnectionError,
            id="anthropic",
        ),
        pytest.param(
            anthropic_transport_error,
            anthropic_http.ReadTimeout,
            anthropic.APITimeoutError,
            id="anthropic-timeout",
        ),
        pytest.param(
            chat_openai_transport_error, httpx.ConnectError, OpenAIConnectionError, id="lc-openai"
        ),
        pytest.param(
            chat_openai_transport_error,
            httpx.ReadTimeout,
            OpenAITimeoutError,
            id="lc-openai-timeout",
        ),
        pytest.param(
            chat_anthropic_transport_error,
            anthropic_http.ConnectError,
            AnthropicConnectionError,
            id="lc-anthropic",
        ),
        pytest.param(
            chat_anthropic_transport_error,
            anthropic_http.ReadTimeout,
            AnthropicTimeoutError,
            id="lc-anthropic-timeout",
        ),
    ],
)
def test_sdk_and_langchain_connection_failures_and_timeouts_are_transient(
    build: Callable[[type], BaseException], raised: type, built_as: type
) -> None:
    error = build(raised)
    causes = [error.__cause__, getattr(error.__cause__, "__cause__", None)]
    assert any(isinstance(cause, raised) for cause in causes)  # the transport error is kept
    assert status_code_of(error) is None
    _check(error, built_as, TRANSIENT)


@pytest.mark.parametrize("module", [httpx, httpx2], ids=lambda m: m.__name__)
def test_transport_errors_of_both_httpx_lines_are_transient_though_unrelated(module: Any) -> None:
    # anthropic 2.x (and langsmith) raise httpx2's, anthropic 0.x and openai httpx's: the
    # classifier must know both families whichever one the installed SDK happens to use.
    request = module.Request("POST", f"{UNUSED_URL}/v1/messages")
    error = module.ConnectError("[Errno 111] Connection refused", request=request)
    other = httpx2 if module is httpx else httpx
    assert not isinstance(error, other.HTTPError)
    assert is_transient(error)


def test_langchain_is_retryable_does_not_make_a_500_transient() -> None:
    error = chat_openai_status_error(500, OPENAI_500)
    assert isinstance(error, ModelAPIError)
    assert error.is_retryable
    assert not is_transient(error)


@pytest.mark.parametrize(
    ("build", "verdict"),
    [
        pytest.param(lambda: ModelRateLimitError("Too many requests"), TRANSIENT, id="RateLimit"),
        pytest.param(lambda: ModelConnectionError("Host unreachable"), TRANSIENT, id="Connection"),
        pytest.param(lambda: ModelTimeoutError("No answer in 30 s"), TRANSIENT, id="Timeout"),
        # Any 5xx with its status unknown: not even the preset can tell a 500 from a 501.
        pytest.param(lambda: ModelAPIError("Internal server error"), NEVER, id="APIError"),
        pytest.param(lambda: ModelInvalidRequestError("Unknown 'temprature'"), NEVER, id="Invalid"),
    ],
)
def test_langchain_model_errors_raised_plain_are_classified_by_type(
    build: Build, verdict: Verdict
) -> None:
    _check(build(), ModelError, verdict)


@pytest.mark.parametrize(
    ("build", "verdict"),
    [
        pytest.param(lambda: openai_status_error(500, OPENAI_500), PRESET_ONLY, id="openai-500"),
        pytest.param(lambda: openai_status_error(503, OPENAI_BUSY), TRANSIENT, id="openai-503"),
        pytest.param(lambda: openai_status_error(429, OPENAI_429), TRANSIENT, id="openai-429"),
        pytest.param(lambda: openai_status_error(400, OPENAI_400), NEVER, id="openai-400"),
        pytest.param(
            lambda: anthropic_status_error(529, ANTHROPIC_529), PRESET_ONLY, id="anthropic-529"
        ),
    ],
)
@pytest.mark.parametrize(
    "wrapper", [ModelAPIError, ModelError, ModelInvalidRequestError], ids=lambda cls: cls.__name__
)
def test_langchain_model_errors_raised_from_sdk_errors_follow_the_sdk_status(
    wrapper: type[ModelError], build: Build, verdict: Verdict
) -> None:
    _check(_raised_from(wrapper("Provider call failed"), build()), wrapper, verdict)


# --- transports: HTTP status errors ----------------------------------------------------------


def _httpx_status_error(status: int, headers: dict[str, str] | None = None) -> BaseException:
    """What ``httpx.Response.raise_for_status()`` raises."""
    request = httpx.Request("POST", f"{UNUSED_URL}/v1")
    with pytest.raises(httpx.HTTPStatusError) as caught:
        httpx.Response(status, request=request, headers=headers).raise_for_status()
    return caught.value


def _httpx2_status_error(status: int, headers: dict[str, str] | None = None) -> BaseException:
    """What ``httpx2.Response.raise_for_status()`` raises."""
    request = httpx2.Request("POST", f"{UNUSED_URL}/v1")
    with pytest.raises(httpx2.HTTPStatusError) as caught:
        httpx2.Response(status, request=request, headers=headers).raise_for_status()
    return caught.value


def _requests_status_error(status: int, headers: dict[str, str] | None = None) -> BaseException:
    """What ``requests.Response.raise_for_status()`` raises."""
    response = requests.Response()
    response.status_code = status
    response.reason = HTTPStatus(status).phrase
    response.url = f"{UNUSED_URL}/v1"
    response.headers.update(headers or {})
    with pytest.raises(requests.HTTPError) as caught:
        response.raise_for_status()
    return caught.value


def _aiohttp_status_error(status: int, headers: dict[str, str] | None = None) -> BaseException:
    """What ``aiohttp.ClientResponse.raise_for_status()`` raises (status in ``.status``)."""
    url = URL(f"{UNUSED_URL}/v1")
    return aiohttp.ClientResponseError(
        RequestInfo(url, "POST", CIMultiDictProxy(CIMultiDict()), url),
        (),
        status=status,
        message=HTTPStatus(status).phrase,
        headers=CIMultiDictProxy(CIMultiDict(headers or {})),
    )


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        pytest.param(429, TRANSIENT, id="429"),
        pytest.param(503, TRANSIENT, id="503"),
        pytest.param(500, PRESET_ONLY, id="500"),
        pytest.param(502, PRESET_ONLY, id="502"),
        # The messages quote the reason phrase "Gateway Timeout": the keyword rule holds.
        pytest.param(504, TRANSIENT, id="504"),
        pytest.param(400, NEVER, id="400"),
        pytest.param(404, NEVER, id="404"),
    ],
)
@pytest.mark.parametrize(
    ("build", "built_as"),
    [
        pytest.param(_httpx_status_error, httpx.HTTPStatusError, id="httpx"),
        pytest.param(_httpx2_status_error, httpx2.HTTPStatusError, id="httpx2"),
        pytest.param(_requests_status_error, requests.HTTPError, id="requests"),
        pytest.param(_aiohttp_status_error, aiohttp.ClientResponseError, id="aiohttp"),
    ],
)
def test_transport_status_errors_follow_the_status_rule(
    build: Callable[[int], BaseException], built_as: type, status: int, verdict: Verdict
) -> None:
    error = build(status)
    assert status_code_of(error) == status
    _check(error, built_as, verdict)


def test_a_429_is_transient_by_status_not_by_its_reason_phrase() -> None:
    error = _requests_status_error(429)
    assert str(error).startswith("429 Client Error: Too Many Requests for url")
    assert _without_keywords(error)
    assert is_transient(error)


def test_aiohttp_status_is_read_without_touching_its_deprecated_code_property() -> None:
    error = _aiohttp_status_error(429)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # `ClientResponseError.code` warns DeprecationWarning
        assert status_code_of(error) == 429
        assert is_transient(error)


# --- transports: failures without a status ----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"),
    [
        pytest.param("ConnectError", "[Errno 111] Connection refused", id="ConnectError"),
        pytest.param("ConnectTimeout", "timed out", id="ConnectTimeout"),
        pytest.param("ReadTimeout", "timed out", id="ReadTimeout"),
        pytest.param("PoolTimeout", "timed out", id="PoolTimeout"),
        pytest.param("ReadError", "[Errno 104] Connection reset by peer", id="ReadError"),
        # What a stream cut mid-body raises (see the real-socket test below).
        pytest.param(
            "RemoteProtocolError",
            "peer closed connection without sending complete message body "
            "(incomplete chunked read)",
            id="RemoteProtocolError",
        ),
    ],
)
@pytest.mark.parametrize("module", [httpx, httpx2, httpcore, httpcore2], ids=lambda m: m.__name__)
def test_transport_failures_of_httpx_httpcore_and_their_twins_are_transient(
    module: Any, name: str, message: str
) -> None:
    error_type = getattr(module, name)
    _check(error_type(message), error_type, TRANSIENT)


def test_httpx_errors_that_are_not_transport_failures_are_not_transient() -> None:
    assert not is_transient(httpx.InvalidURL("No scheme included in URL."))
    assert not is_transient(httpx2.InvalidURL("No scheme included in URL."))


def _requests_connection_error() -> BaseException:
    """As ``requests.adapters.HTTPAdapter.send`` raises it: the urllib3 error as argument."""
    reason = urllib3.exceptions.NewConnectionError(
        None, "Failed to establish a new connection: [Errno 111] Connection refused"
    )
    return requests.ConnectionError(
        urllib3.exceptions.MaxRetryError(None, "/v1", reason=reason),
        request=requests.Request("POST", f"{UNUSED_URL}/v1").prepare(),
    )


def _requests_read_timeout() -> BaseException:
    return requests.ReadTimeout(
        urllib3.exceptions.ReadTimeoutError(None, "/v1", "Read timed out. (read timeout=30)"),
        request=requests.Request("POST", f"{UNUSED_URL}/v1").prepare(),
    )


def _aiohttp_connector_error() -> BaseException:
    key = ConnectionKey(
        host="127.0.0.1",
        port=9,
        is_ssl=False,
        ssl=True,
        proxy=None,
        proxy_auth=None,
        proxy_headers_hash=None,
    )
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed ('127.0.0.1', 9)")
    return aiohttp.ClientConnectorError(key, refused)


def _aiohttp_payload_error() -> BaseException:
    return aiohttp.ClientPayloadError(
        "Response payload is not completed: <TransferEncodingError: 400, "
        "message='Not enough data to satisfy transfer length header.'>"
    )


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(_requests_connection_error, id="requests.ConnectionError"),
        pytest.param(_requests_read_timeout, id="requests.ReadTimeout"),
        pytest.param(requests.Timeout, id="requests.Timeout"),
        pytest.param(
            lambda: requests.exceptions.ChunkedEncodingError(
                urllib3.exceptions.ProtocolError("Response ended prematurely")
            ),
            id="requests.ChunkedEncodingError",
        ),
        pytest.param(
            lambda: urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead"),
            id="urllib3.ProtocolError",
        ),
        pytest.param(_aiohttp_connector_error, id="aiohttp.ClientConnectorError"),
        pytest.param(aiohttp.ServerDisconnectedError, id="aiohttp.ServerDisconnectedError"),
        pytest.param(
            lambda: aiohttp.ServerTimeoutError("Timeout on reading data from socket"),
            id="aiohttp.ServerTimeoutError",
        ),
        pytest.param(_aiohttp_payload_error, id="aiohttp.ClientPayloadError"),
    ],
)
def test_requests_urllib3_and_aiohttp_transport_failures_are_transient(build: Build) -> None:
    error = build()
    assert status_code_of(error) is None
    _check(error, Exception, TRANSIENT)


# --- builtins, google-style codes, messages --------------------------------------------------


class GoogleStyleError(Exception):
    """Shaped like google.api_core / google-genai errors: an int ``code``, maybe a ``status``."""

    def __init__(self, message: str, code: object, status: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


@pytest.mark.parametrize(
    ("build", "verdict"),
    [
        pytest.param(
            lambda: ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
            TRANSIENT,
            id="ConnectionRefusedError",
        ),
        pytest.param(
            lambda: ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
            TRANSIENT,
            id="ConnectionResetError",
        ),
        pytest.param(lambda: BrokenPipeError(errno.EPIPE, "Broken pipe"), TRANSIENT, id="pipe"),
        pytest.param(TimeoutError, TRANSIENT, id="TimeoutError"),
        pytest.param(asyncio.TimeoutError, TRANSIENT, id="asyncio.TimeoutError"),
        pytest.param(
            lambda: socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
            TRANSIENT,
            id="socket.gaierror",
        ),
        pytest.param(lambda: OSError(errno.ENOSPC, "No space left"), NEVER, id="other-OSError"),
        pytest.param(
            lambda: GoogleStyleError("Quota exceeded", HTTPStatus.TOO_MANY_REQUESTS),
            TRANSIENT,
            id="google-code-429",
        ),
        pytest.param(
            lambda: GoogleStyleError("Quota exceeded", 429, "RESOURCE_EXHAUSTED"),
            TRANSIENT,
            id="google-genai-code-429-with-text-status",
        ),
        pytest.param(
            lambda: GoogleStyleError("Backend error", 500, "INTERNAL"),
            PRESET_ONLY,
            id="google-genai-code-500",
        ),
        pytest.param(lambda: GoogleStyleError("Nope", "abc"), NEVER, id="code-not-a-number"),
        pytest.param(lambda: GoogleStyleError("Nope", True), NEVER, id="code-is-a-bool"),
        pytest.param(lambda: ValueError("bad request"), NEVER, id="ValueError"),
    ],
)
def test_builtin_and_code_carrying_errors_follow_the_rule(build: Build, verdict: Verdict) -> None:
    _check(build(), BaseException, verdict)


@pytest.mark.parametrize(
    ("message", "transient"),
    [
        pytest.param("Upstream rate limit exceeded", True, id="rate-limit"),
        pytest.param("Throttled: slow down", True, id="Throttled"),
        pytest.param("Request TIMEOUT after 30 s", True, id="TIMEOUT"),
        pytest.param("503 Service Unavailable", True, id="Service-Unavailable"),
        pytest.param("Invalid API key", False, id="unrelated"),
        pytest.param("maximum context length is 128000 tokens", False, id="context-length"),
    ],
)
def test_message_keywords_count_whatever_their_case(message: str, transient: bool) -> None:
    assert is_transient(Exception(message)) is transient


# --- never transient -----------------------------------------------------------------------


class _TalkativeBudgetError(BudgetExceededError):
    """A subclass whose message happens to contain every transient keyword."""

    def __str__(self) -> str:
        return "rate limit, throttled, timeout, service unavailable"


def _budget_error() -> BudgetExceededError:
    error = BudgetExceededError("day", Decimal("25"), Decimal("25.10"))
    error.add_note("raised while a provider timeout was being retried")
    return error


PINNED = [
    pytest.param(_budget_error, id="BudgetExceededError"),
    pytest.param(
        lambda: _TalkativeBudgetError("month", Decimal("100"), Decimal("100")),
        id="BudgetExceededError-subclass-saying-timeout",
    ),
    pytest.param(lambda: RateLimitQueueFullError(8), id="RateLimitQueueFullError"),
    pytest.param(lambda: asyncio.CancelledError("timeout"), id="CancelledError-saying-timeout"),
    pytest.param(lambda: KeyboardInterrupt("timeout"), id="KeyboardInterrupt"),
    pytest.param(lambda: SystemExit(503), id="SystemExit-with-code-503"),
    pytest.param(lambda: GeneratorExit("unavailable"), id="GeneratorExit"),
    pytest.param(
        lambda: _raised_from(_budget_error(), openai_status_error(429, OPENAI_429)),
        id="BudgetExceededError-from-openai-429",
    ),
    pytest.param(
        lambda: _raised_from(asyncio.CancelledError(), TimeoutError()),
        id="CancelledError-from-TimeoutError",
    ),
]


@pytest.mark.parametrize("build", PINNED)
def test_pinned_errors_are_never_transient_under_any_rule(build: Build) -> None:
    error = build()
    widest = TransientClassifier(status_codes=range(400, 600), also=lambda _: True)
    assert not is_transient(error)
    assert not PRESET(error)
    assert not widest(error)


def test_the_library_own_refusals_say_none_of_the_keywords() -> None:
    assert _without_keywords(BudgetExceededError("day", Decimal("25"), Decimal("25")))
    assert _without_keywords(RateLimitQueueFullError(8))


# --- cause chains --------------------------------------------------------------------------


def test_an_error_caused_by_a_transient_error_is_transient() -> None:
    root = ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    middle = _raised_from(RuntimeError("tool call failed"), root)
    outer = _raised_from(ValueError("agent step failed"), middle)
    assert is_transient(outer)


def test_an_error_caused_by_an_sdk_rate_limit_is_transient() -> None:
    error = _raised_from(RuntimeError("chain failed"), anthropic_status_error(429, ANTHROPIC_429))
    assert is_transient(error)


def test_a_cyclic_cause_chain_ends() -> None:
    first, second = RuntimeError("first"), RuntimeError("second")
    first.__cause__, second.__cause__ = second, first
    assert not is_transient(first)


async def test_a_real_asyncio_wait_for_timeout_is_transient_although_caused_by_cancellation() -> (
    None
):
    with pytest.raises(TimeoutError) as caught:
        await asyncio.wait_for(asyncio.sleep(1), timeout=0.001)
    assert isinstance(caught.value.__cause__, asyncio.CancelledError)
    assert is_transient(caught.value)


def test_the_fallback_chain_own_timeout_is_transient() -> None:
    error = _raised_from(PerClientTimeoutError(1, timedelta(seconds=30)), asyncio.CancelledError())
    assert is_transient(error)


# --- TransientClassifier options -----------------------------------------------------------


def test_custom_status_codes_replace_the_default_set() -> None:
    only_500 = TransientClassifier(status_codes={500})
    assert only_500(openai_status_error(500, OPENAI_500))
    assert not only_500(openai_status_error(503, OPENAI_BUSY))
    assert only_500(ConnectionResetError())  # transport and timeouts still count


def test_status_codes_accept_any_collection_and_compare_as_a_set() -> None:
    assert TransientClassifier(status_codes=[503, 429, 429]) == TransientClassifier()


def test_the_server_error_preset_adds_500_502_504_and_529() -> None:
    assert PRESET.status_codes == frozenset({429, 500, 502, 503, 504, 529})
    assert PRESET.status_codes == SERVER_ERROR_STATUS_CODES


class FlakyToolError(Exception):
    """A caller's own error type it wants rerouted."""


def test_the_also_predicate_widens_the_rule() -> None:
    classify = TransientClassifier(also=lambda error: isinstance(error, FlakyToolError))
    assert classify(FlakyToolError("index not ready"))
    assert not classify(ValueError("index not ready"))
    assert classify(openai_status_error(429, OPENAI_429))


def test_the_preset_keeps_its_also_predicate() -> None:
    classify = TransientClassifier.with_server_errors(
        also=lambda error: isinstance(error, FlakyToolError)
    )
    assert classify(FlakyToolError("index not ready"))
    assert classify(anthropic_status_error(529, ANTHROPIC_529))


def test_the_also_predicate_is_never_consulted_for_pinned_errors() -> None:
    consulted: list[BaseException] = []

    def also(error: BaseException) -> bool:
        consulted.append(error)
        return True

    classify = TransientClassifier(also=also)
    for build in (_budget_error, lambda: RateLimitQueueFullError(1), asyncio.CancelledError):
        assert not classify(build())
    assert consulted == []


@pytest.mark.parametrize(
    ("options", "error_type", "named"),
    [
        pytest.param({"status_codes": "429"}, TypeError, "status_codes", id="codes-as-string"),
        pytest.param({"status_codes": 429}, TypeError, "status_codes", id="codes-as-int"),
        pytest.param({"status_codes": {600}}, ValueError, "status_codes", id="code-too-big"),
        pytest.param({"status_codes": {"429"}}, ValueError, "status_codes", id="code-as-text"),
        pytest.param({"status_codes": {True}}, ValueError, "status_codes", id="code-as-bool"),
        pytest.param({"also": "yes"}, TypeError, "also", id="also-not-callable"),
    ],
)
def test_invalid_options_are_refused_naming_the_option(
    options: dict[str, Any], error_type: type[Exception], named: str
) -> None:
    with pytest.raises(error_type, match=named):
        TransientClassifier(**options)


# --- status_code_of ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "status"),
    [
        pytest.param(lambda: openai_status_error(429, OPENAI_429), 429, id="openai"),
        pytest.param(lambda: anthropic_status_error(529, ANTHROPIC_529), 529, id="anthropic"),
        pytest.param(lambda: _httpx_status_error(503), 503, id="httpx-response"),
        pytest.param(lambda: _requests_status_error(404), 404, id="requests-response"),
        pytest.param(lambda: _aiohttp_status_error(400), 400, id="aiohttp-status"),
        pytest.param(lambda: GoogleStyleError("x", 429, "RESOURCE_EXHAUSTED"), 429, id="google"),
        pytest.param(lambda: openai_transport_error(httpx.ConnectError), None, id="no-status"),
        pytest.param(lambda: GoogleStyleError("x", "abc"), None, id="code-not-a-number"),
        pytest.param(lambda: GoogleStyleError("x", 200), None, id="not-an-error-status"),
        pytest.param(lambda: ConnectionRefusedError(errno.ECONNREFUSED, "x"), None, id="errno"),
        pytest.param(lambda: anthropic_mid_stream_error("overloaded_error"), 529, id="sse-error"),
    ],
)
def test_status_code_of_reads_each_library_s_status(build: Build, status: int | None) -> None:
    assert status_code_of(build()) == status


# --- retry_after_of ------------------------------------------------------------------------

HTTP_DATE = "Wed, 21 Oct 2015 07:28:00 GMT"
HTTP_DATE_TIMESTAMP = email.utils.parsedate_to_datetime(HTTP_DATE).timestamp()


@pytest.mark.parametrize(
    ("build", "seconds"),
    [
        pytest.param(
            lambda: openai_status_error(429, OPENAI_429, {"retry-after-ms": "250"}),
            0.25,
            id="openai-retry-after-ms",
        ),
        pytest.param(
            lambda: openai_status_error(
                429, OPENAI_429, {"retry-after-ms": "soon", "retry-after": "2"}
            ),
            2.0,
            id="openai-bad-ms-falls-back-to-seconds",
        ),
        pytest.param(
            lambda: anthropic_status_error(429, ANTHROPIC_429, {"retry-after": "17"}),
            17.0,
            id="anthropic-retry-after-seconds",
        ),
        pytest.param(
            lambda: chat_openai_status_error(429, OPENAI_429, {"Retry-After": "3"}),
            3.0,
            id="langchain-openai",
        ),
        pytest.param(
            lambda: _raised_from(
                RuntimeError("chain failed"),
                anthropic_status_error(429, ANTHROPIC_429, {"retry-after": "17"}),
            ),
            17.0,
            id="through-the-cause-chain",
        ),
        pytest.param(lambda: _httpx_status_error(429, {"Retry-After": "6"}), 6.0, id="httpx"),
        pytest.param(lambda: _requests_status_error(429, {"Retry-After": "5"}), 5.0, id="requests"),
        pytest.param(lambda: _aiohttp_status_error(429, {"Retry-After": "4"}), 4.0, id="aiohttp"),
        pytest.param(
            lambda: anthropic_status_error(429, ANTHROPIC_429, {"retry-after": "soon"}),
            None,
            id="garbage",
        ),
        pytest.param(
            lambda: openai_status_error(429, OPENAI_429, {"retry-after": "nan"}), None, id="nan"
        ),
        pytest.param(lambda: openai_status_error(429, OPENAI_429), None, id="no-header"),
        pytest.param(lambda: TimeoutError("timed out"), None, id="no-response"),
    ],
)
def test_retry_after_of_reads_the_provider_s_hint(build: Build, seconds: float | None) -> None:
    assert retry_after_of(build()) == seconds


def test_retry_after_as_an_http_date_counts_from_the_injected_now() -> None:
    error = openai_status_error(429, OPENAI_429, {"retry-after": HTTP_DATE})
    assert retry_after_of(error, now=lambda: HTTP_DATE_TIMESTAMP - 30) == 30.0


def test_retry_after_as_a_past_http_date_means_no_wait() -> None:
    error = anthropic_status_error(429, ANTHROPIC_429, {"retry-after": HTTP_DATE})
    assert retry_after_of(error, now=lambda: HTTP_DATE_TIMESTAMP + 60) == 0.0


def test_retry_after_http_date_defaults_to_the_wall_clock() -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    error = openai_status_error(
        429, OPENAI_429, {"retry-after": email.utils.format_datetime(later)}
    )
    seconds = retry_after_of(error)
    assert seconds is not None
    assert 3590 < seconds <= 3600


# --- real sockets on 127.0.0.1 -------------------------------------------------------------


@contextmanager
def _raw_server(reply: bytes | None) -> Iterator[str]:
    """A 127.0.0.1 HTTP server: answers every request with ``reply`` bytes and hangs up.

    With ``reply=None`` it accepts connections and never answers (a hung provider).
    Yields the base URL.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.02)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            if reply is None:
                held.append(conn)
                continue
            with conn:
                conn.settimeout(1)
                _read_request(conn)
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        listener.close()
        for conn in held:
            conn.close()


def _read_request(conn: socket.socket) -> None:
    # Read the whole request so that hanging up sends FIN, not RST (which would turn the
    # client's "cut mid-body" into a reset).
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)


def _stream_cut_after(first_event: bytes) -> bytes:
    """A 200 event stream that sends one chunk and hangs up without the final chunk."""
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
        + f"{len(first_event):x}\r\n".encode()
        + first_event
        + b"\r\n"
    )


@pytest.fixture
def closed_port_url() -> str:
    """A 127.0.0.1 URL nobody listens on: connecting is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _capture(call: Callable[[], object]) -> BaseException:
    with pytest.raises(Exception) as caught:
        call()
    return caught.value


@pytest.mark.parametrize(
    ("call", "expected_type"),
    [
        pytest.param(lambda url: httpx.get(url), httpx.ConnectError, id="httpx"),
        pytest.param(lambda url: httpx2.get(url), httpx2.ConnectError, id="httpx2"),
        pytest.param(lambda url: requests.get(url), requests.ConnectionError, id="requests"),
        pytest.param(
            lambda url: openai.OpenAI(api_key="sk-test", base_url=url, max_retries=0).models.list(),
            openai.APIConnectionError,
            id="openai",
        ),
        pytest.param(
            lambda url: anthropic.Anthropic(
                api_key="sk-FAKE-anthropic", base_url=url, max_retries=0
            ).models.list(),
            anthropic.APIConnectionError,
            id="anthropic",
        ),
    ],
)
def test_a_real_refused_connection_is_transient(
    closed_port_url: str, call: Callable[[str], object], expected_type: type[BaseException]
) -> None:
    error = _capture(lambda: call(closed_port_url))
    assert isinstance(error, expected_type)
    assert is_transient(error)


async def test_a_real_refused_aiohttp_connection_is_transient(closed_port_url: str) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorError) as caught:
            await session.get(closed_port_url)
    assert is_transient(caught.value)


@pytest.mark.parametrize(
    ("call", "expected_type"),
    [
        pytest.param(lambda url: httpx.get(url, timeout=0.05), httpx.ReadTimeout, id="httpx"),
        pytest.param(
            lambda url: requests.get(url, timeout=0.05), requests.ReadTimeout, id="requests"
        ),
        pytest.param(
            lambda url: openai.OpenAI(
                api_key="sk-test", base_url=url, max_retries=0, timeout=0.05
            ).models.list(),
            openai.APITimeoutError,
            id="openai",
        ),
        pytest.param(
            lambda url: anthropic.Anthropic(
                api_key="sk-FAKE-anthropic", base_url=url, max_retries=0, timeout=0.05
            ).models.list(),
            anthropic.APITimeoutError,
            id="anthropic",
        ),
    ],
)
def test_a_real_hung_provider_times_out_transiently(
    call: Callable[[str], object], expected_type: type[BaseException]
) -> None:
    with _raw_server(None) as url:
        error = _capture(lambda: call(url))
    assert isinstance(error, expected_type)
    assert is_transient(error)


OPENAI_CHUNK = (
    b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"gpt-4o-mini",'
    b'"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}\n\n'
)
ANTHROPIC_START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1",'
    b'"type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[],'
    b'"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":1}}}\n\n'
)


def _openai_stream(url: str) -> list[object]:
    client = openai.OpenAI(api_key="sk-test", base_url=url, max_retries=0)
    received: list[object] = []
    stream = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    for chunk in stream:
        received.append(chunk)
    return received


def _anthropic_stream(url: str) -> list[object]:
    client = anthropic.Anthropic(api_key="sk-FAKE-anthropic", base_url=url, max_retries=0)
    received: list[object] = []
    stream = client.messages.create(
        model="claude-sonnet-4-6",
        max_tokens=16,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
    )
    for event in stream:
        received.append(event)
    return received


def _httpx_stream(url: str) -> None:
    with httpx.stream("GET", url) as response:
        for _ in response.iter_bytes():
            pass


def _requests_stream(url: str) -> None:
    for _ in requests.get(url, stream=True).iter_content():
        pass


@pytest.mark.parametrize(
    ("first_event", "call", "expected_type"),
    [
        # The SDKs do not wrap a cut stream: the raw transport error reaches the caller.
        pytest.param(OPENAI_CHUNK, _openai_stream, httpx.RemoteProtocolError, id="openai"),
        pytest.param(
            ANTHROPIC_START, _anthropic_stream, anthropic_http.RemoteProtocolError, id="anthropic"
        ),
        pytest.param(OPENAI_CHUNK, _httpx_stream, httpx.RemoteProtocolError, id="httpx"),
        pytest.param(
            OPENAI_CHUNK, _requests_stream, requests.exceptions.ChunkedEncodingError, id="requests"
        ),
    ],
)
def test_a_real_stream_cut_mid_body_is_transient(
    first_event: bytes, call: Callable[[str], object], expected_type: type[BaseException]
) -> None:
    with _raw_server(_stream_cut_after(first_event)) as url:
        error = _capture(lambda: call(url))
    assert isinstance(error, expected_type)
    assert is_transient(error)


async def test_a_real_aiohttp_stream_cut_mid_body_is_transient() -> None:
    with _raw_server(_stream_cut_after(OPENAI_CHUNK)) as url:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            with pytest.raises(aiohttp.ClientPayloadError) as caught:
                await response.read()
    assert is_transient(caught.value)


async def test_a_real_aiohttp_read_timeout_is_transient() -> None:
    timeout = aiohttp.ClientTimeout(sock_read=0.05)
    with _raw_server(None) as url:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            with pytest.raises(aiohttp.ServerTimeoutError) as caught:
                await session.get(url)
    assert is_transient(caught.value)


# --- no SDK imports ------------------------------------------------------------------------


def test_classifying_imports_no_sdk() -> None:
    script = """
import sys
import llm_resilience.transient as transient
transient.is_transient(TimeoutError())
transient.is_transient(Exception("rate limit"))
transient.TransientClassifier.with_server_errors()(ConnectionResetError())
transient.retry_after_of(ValueError())
heavy = ("openai", "anthropic", "httpx", "httpx2", "requests", "aiohttp", "langchain_core")
print(",".join(name for name in heavy if name in sys.modules))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=30
    )
    assert result.stdout.strip() == ""
