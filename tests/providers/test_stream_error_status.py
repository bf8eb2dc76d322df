"""A provider error that arrives inside a stream that already said 200 is classified by
the status its error type stands for (``status_code_of``), like the same error before
the stream. Built from the SDKs' own exception classes, as their stream decoders raise
them (the matrix's mid-stream cells run them over HTTP)."""

from __future__ import annotations

import httpx
import openai
import pytest

from llm_resilience import TransientClassifier, is_transient
from llm_resilience.transient import status_code_of

REQUEST = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")


def _openai_stream_error(error_type: str) -> openai.APIError:
    body = {"message": "The server had an error.", "type": error_type, "param": None, "code": None}
    return openai.APIError(str(body["message"]), REQUEST, body=body)


def test_an_openai_in_stream_server_error_counts_as_a_500() -> None:
    error = _openai_stream_error("server_error")
    assert status_code_of(error) == 500
    assert is_transient(error) is False
    assert TransientClassifier.with_server_errors()(error) is True


@pytest.mark.parametrize("error_type", ["invalid_request_error", "unknown_kind"])
def test_an_openai_in_stream_error_of_another_type_carries_no_status(error_type: str) -> None:
    error = _openai_stream_error(error_type)
    assert status_code_of(error) is None
    assert TransientClassifier.with_server_errors()(error) is False


def test_an_error_whose_body_has_no_message_is_not_read_as_an_openai_error_object() -> None:
    error = openai.APIError("failed", REQUEST, body={"type": "server_error"})
    assert status_code_of(error) is None
