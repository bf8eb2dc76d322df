"""Mistral's errors and retry settings, read through the real ``mistralai`` SDK,
``langchain-mistralai`` and ``llama-index-llms-mistralai`` against the fault server.

The SDK's errors (``SDKError`` for any 4xx/5xx, ``HTTPValidationError`` for a 422) carry
``status_code`` and the response ``headers``; ``ChatMistralAI`` raises httpx's
``HTTPStatusError``. Before this file, a prompt too long for Mistral was seen as a
context overflow but with no limit, a ``Mistral`` client retrying through its
``RetryConfig`` went unwarned, and ``ChatMistralAI(max_retries=1)`` (one attempt) and
LlamaIndex's ``MistralAI`` (whose ``max_retries`` retries nothing) were warned about.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from llm_resilience import TransientClassifier, is_transient
from llm_resilience.fallback._routing import context_limit_of, is_context_overflow
from llm_resilience.self_retry import self_retry_setting
from llm_resilience.testing import Fault, FaultInjectingServer
from llm_resilience.testing._wire_mistral import MISTRAL_CAPACITY_EXCEEDED
from llm_resilience.transient import retry_after_of, status_code_of

pytest.importorskip("mistralai")

MODEL = "mistral-small-latest"
KEY = "sk-FAKE-mistral"
MESSAGES: Any = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer() as running:
        yield running


def _sdk_error(server: FaultInjectingServer, fault: Fault) -> BaseException:
    from mistralai.client import Mistral

    server.script(fault)
    client = Mistral(api_key=KEY, server_url=server.mistral_base_url)
    with pytest.raises(Exception) as caught:
        client.chat.complete(model=MODEL, messages=MESSAGES)
    return caught.value


def _langchain_error(server: FaultInjectingServer, fault: Fault) -> BaseException:
    from langchain_mistralai import ChatMistralAI

    server.script(fault)
    model = ChatMistralAI(  # type: ignore[call-arg]
        model=MODEL, api_key=KEY, endpoint=f"{server.mistral_base_url}/v1", max_retries=1
    )
    with pytest.raises(Exception) as caught:
        model.invoke("What is the capital of France?")
    return caught.value


@pytest.mark.parametrize("read", [_sdk_error, _langchain_error])
@pytest.mark.parametrize(
    ("fault", "status", "default", "preset"),
    [
        (Fault.status(429), 429, True, True),
        (Fault.status(429, body=MISTRAL_CAPACITY_EXCEEDED), 429, True, True),
        (Fault.status(503), 503, True, True),
        (Fault.status(500), 500, False, True),
        (Fault.status(502), 502, False, True),
        (Fault.status(504), 504, False, True),
        (Fault.status(400), 400, False, False),
        (Fault.status(401), 401, False, False),
        (Fault.status(404), 404, False, False),
        (Fault.status(422), 422, False, False),
    ],
    ids=["429", "capacity", "503", "500", "502", "504", "400", "401", "404", "422"],
)
def test_mistral_errors_are_classified_by_their_status(
    server: FaultInjectingServer,
    read: Any,
    fault: Fault,
    status: int,
    default: bool,
    preset: bool,
) -> None:
    error = read(server, fault)
    assert status_code_of(error) == status
    assert is_transient(error) is default
    assert TransientClassifier.with_server_errors()(error) is preset


def test_a_422_is_the_sdk_s_http_validation_error_with_its_status(
    server: FaultInjectingServer,
) -> None:
    from mistralai.client.errors import HTTPValidationError

    error = _sdk_error(server, Fault.status(422))
    assert isinstance(error, HTTPValidationError)
    assert status_code_of(error) == 422


@pytest.mark.parametrize("read", [_sdk_error, _langchain_error])
def test_retry_after_is_read_from_a_mistral_rate_limit(
    server: FaultInjectingServer, read: Any
) -> None:
    assert retry_after_of(read(server, Fault.status(429, retry_after=3))) == 3.0
    assert retry_after_of(read(server, Fault.status(429))) is None


@pytest.mark.parametrize("read", [_sdk_error, _langchain_error])
def test_a_prompt_too_long_for_mistral_is_a_context_overflow_with_its_limit(
    server: FaultInjectingServer, read: Any
) -> None:
    error = read(server, Fault.context_length_exceeded("mistral", tokens=40_000, maximum=32_768))
    assert is_context_overflow(error)
    assert context_limit_of(error) == 32_768
    assert not is_transient(error)


def test_a_mistral_client_retries_only_with_a_backoff_retry_config() -> None:
    from mistralai.client import Mistral
    from mistralai.client.utils import BackoffStrategy, RetryConfig

    backoff = BackoffStrategy(500, 60_000, 1.5, 3_600_000)
    assert self_retry_setting(Mistral(api_key=KEY)) is None
    off = RetryConfig("none", backoff, False)
    assert self_retry_setting(Mistral(api_key=KEY, retry_config=off)) is None
    on = RetryConfig("backoff", backoff, True)
    assert self_retry_setting(Mistral(api_key=KEY, retry_config=on)) == (
        "retry_config.backoff.max_elapsed_time",
        3_600_000,
    )


def test_chat_mistral_ai_s_max_retries_counts_attempts_in_all() -> None:
    from langchain_mistralai import ChatMistralAI

    def model(retries: int) -> Any:
        return ChatMistralAI(model=MODEL, api_key=KEY, max_retries=retries)  # type: ignore[call-arg]

    assert self_retry_setting(model(1)) is None
    assert self_retry_setting(model(5)) == ("max_retries", 5)


def test_llama_index_mistral_ai_s_max_retries_alone_retries_nothing() -> None:
    pytest.importorskip("llama_index.llms.mistralai")
    from llama_index.llms.mistralai import MistralAI
    from mistralai.client.utils import BackoffStrategy, RetryConfig

    assert self_retry_setting(MistralAI(model=MODEL, api_key=KEY, max_retries=5)) is None
    config = RetryConfig("backoff", BackoffStrategy(500, 60_000, 1.5, 30_000), True)
    given = MistralAI(model=MODEL, api_key=KEY, additional_kwargs={"retries": config})
    assert self_retry_setting(given) == (
        "additional_kwargs.retries.backoff.max_elapsed_time",
        30_000,
    )
