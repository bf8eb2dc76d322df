"""The SDK errors the shipped fakes raise (``llm_resilience.testing.errors``)."""

from __future__ import annotations

import subprocess
import sys

import httpx
import openai
import pytest

from llm_resilience.testing import fresh_error
from llm_resilience.testing.errors import (
    api_status_error,
    rate_limit_error,
    service_unavailable_error,
)


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, openai.BadRequestError),
        (401, openai.AuthenticationError),
        (404, openai.NotFoundError),
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
        (529, openai.InternalServerError),
        (418, openai.APIStatusError),
    ],
)
def test_each_status_gets_the_openai_sdk_class_over_a_response_with_openais_error_body(
    status: int, error_type: type[openai.APIStatusError]
) -> None:
    error = api_status_error(status, headers={"x-request-id": "req_1"})
    assert type(error) is error_type
    assert isinstance(error, openai.APIStatusError)
    assert error.status_code == status
    assert error.response.headers["x-request-id"] == "req_1"
    assert error.response.json() == {"error": error.body}
    assert error.message == f"Error code: {status}"


def test_a_rate_limit_error_states_retry_after_as_a_header_without_a_trailing_zero() -> None:
    error = rate_limit_error(retry_after=20)
    assert isinstance(error, openai.RateLimitError)
    assert error.response.headers["retry-after"] == "20"
    assert rate_limit_error(retry_after=0.5).response.headers["retry-after"] == "0.5"
    assert "retry-after" not in rate_limit_error().response.headers


def test_a_service_unavailable_error_is_a_503_internal_server_error() -> None:
    error = service_unavailable_error("down for maintenance")
    assert isinstance(error, openai.InternalServerError)
    assert (error.status_code, error.message) == (503, "down for maintenance")


def test_without_openai_installed_the_error_is_an_httpx_status_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)
    error = rate_limit_error("slow down")
    assert isinstance(error, httpx.HTTPStatusError)
    assert error.response.status_code == 429
    assert str(error) == "slow down"


def test_a_status_that_is_not_an_http_error_is_refused() -> None:
    for status in (200, 399, 600, True):
        with pytest.raises(ValueError, match="status must be an HTTP error status"):
            api_status_error(status)


def test_importing_the_errors_module_imports_neither_openai_nor_httpx() -> None:
    code = (
        "import sys, llm_resilience.testing.errors; "
        "print(sorted({'openai', 'httpx'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr


def test_a_fresh_error_is_a_copy_whose_raise_leaves_the_configured_error_untouched() -> None:
    configured = rate_limit_error()
    copied = fresh_error(configured)
    with pytest.raises(openai.RateLimitError) as raised:
        raise copied
    assert raised.value is copied
    assert type(copied) is type(configured)
    assert copied.response is configured.response
    assert configured.__traceback__ is None
