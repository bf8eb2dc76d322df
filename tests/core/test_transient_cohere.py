"""The transient rule for Cohere: the cohere SDK's errors, as it raises them.

Every ``ApiError`` here comes out of a real ``cohere.ClientV2`` (retries off through the
call's ``request_options``) calling ``chat`` or ``chat_stream`` on the local fault server,
which answers with Cohere's ``{"id", "message"}`` bodies; the SDK raises its typed error
per status (``TooManyRequestsError``, ``ServiceUnavailableError``, ...), each an
``ApiError`` carrying ``status_code``, ``headers`` and ``body``. Transport errors come
from real sockets. A verdict is the pair (default rule with 429/503,
``with_server_errors()`` preset).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

cohere = pytest.importorskip("cohere")

from llm_resilience import TransientClassifier, is_transient  # noqa: E402
from llm_resilience.fallback import (  # noqa: E402
    context_limit_of,
    is_context_overflow,
)
from llm_resilience.self_retry import self_retry_setting  # noqa: E402
from llm_resilience.testing import Fault, FaultInjectingServer  # noqa: E402
from llm_resilience.transient import retry_after_of, status_code_of  # noqa: E402

PRESET = TransientClassifier.with_server_errors()
MODEL = "command-a-03-2025"
MESSAGES = [{"role": "user", "content": "Hi"}]
NO_RETRIES: Any = {"max_retries": 0}


def _client(root: str, *, timeout: float = 10) -> Any:
    return cohere.ClientV2(api_key="sk-FAKE-cohere", base_url=root, timeout=timeout)


@pytest.fixture(scope="module")
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply="one two three four") as started:
        yield started


def _raised(server: FaultInjectingServer, fault: Fault, *, stream: bool = False) -> Exception:
    server.reset()
    server.script(fault)
    client = _client(f"http://127.0.0.1:{server.port}", timeout=0.3)

    def request() -> None:
        if stream:
            list(client.chat_stream(model=MODEL, messages=MESSAGES, request_options=NO_RETRIES))
        else:
            client.chat(model=MODEL, messages=MESSAGES, request_options=NO_RETRIES)

    with pytest.raises(Exception) as caught:
        request()
    return caught.value


@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
@pytest.mark.parametrize(
    ("code", "kind", "verdicts"),
    [
        (429, "TooManyRequestsError", (True, True)),
        (503, "ServiceUnavailableError", (True, True)),
        (500, "InternalServerError", (False, True)),
        (502, "ApiError", (False, True)),
        (504, "GatewayTimeoutError", (False, True)),
        (400, "BadRequestError", (False, False)),
        (401, "UnauthorizedError", (False, False)),
        (403, "ForbiddenError", (False, False)),
        (404, "NotFoundError", (False, False)),
        (422, "UnprocessableEntityError", (False, False)),
        (498, "InvalidTokenError", (False, False)),
    ],
)
def test_cohere_s_typed_errors_are_classified_by_their_status(
    server: FaultInjectingServer,
    code: int,
    kind: str,
    verdicts: tuple[bool, bool],
    stream: bool,
) -> None:
    error = _raised(server, Fault.status(code), stream=stream)
    assert type(error).__name__ == kind
    assert status_code_of(error) == code
    assert (is_transient(error), PRESET(error)) == verdicts


def test_a_429_s_retry_after_header_is_read_from_the_sdk_s_error(
    server: FaultInjectingServer,
) -> None:
    error = _raised(server, Fault.status(429, retry_after=7))
    assert retry_after_of(error) == 7.0
    assert retry_after_of(_raised(server, Fault.status(429))) is None


def test_cohere_s_too_many_tokens_400_is_a_context_overflow_with_its_limit(
    server: FaultInjectingServer,
) -> None:
    error = _raised(server, Fault.context_length_exceeded("cohere", maximum=128_000))
    assert type(error).__name__ == "BadRequestError"
    assert is_context_overflow(error)
    assert context_limit_of(error) == 128_000
    assert (is_transient(error), PRESET(error)) == (False, False)


def test_a_too_many_tokens_400_about_max_tokens_is_not_a_context_overflow(
    server: FaultInjectingServer,
) -> None:
    # Cohere's other "too many tokens" 400: the asked output is over the model's maximum.
    body = {
        "id": "0",
        "message": "too many tokens: max tokens must be less than or equal to 4096, the "
        "maximum output for this model - received 8192.",
    }
    error = _raised(server, Fault.status(400, body=body))
    assert not is_context_overflow(error)


@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
def test_transport_failures_through_the_sdk_are_transient(
    server: FaultInjectingServer, stream: bool
) -> None:
    for fault in (Fault.hang(), Fault.drop_mid_stream(after_chunks=0 if not stream else 2)):
        error = _raised(server, fault, stream=stream)
        assert is_transient(error), repr(error)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(Exception) as refused:
        _client(f"http://127.0.0.1:{port}").chat(
            model=MODEL, messages=MESSAGES, request_options=NO_RETRIES
        )
    assert is_transient(refused.value)


def test_every_cohere_client_is_seen_to_retry_each_call_twice() -> None:
    # The SDK's per-call default: no client setting turns it off.
    root = "http://127.0.0.1:1"
    for client in (
        cohere.ClientV2(api_key="sk-FAKE-cohere", base_url=root),
        cohere.AsyncClientV2(api_key="sk-FAKE-cohere", base_url=root),
        cohere.Client(api_key="sk-FAKE-cohere", base_url=root),
    ):
        assert self_retry_setting(client) == ("request_options.max_retries", 2)


def test_chat_cohere_is_seen_to_retry_through_its_client() -> None:
    chat_cohere = pytest.importorskip("langchain_cohere").ChatCohere
    model = chat_cohere(model=MODEL, cohere_api_key="sk-FAKE-cohere", base_url="http://127.0.0.1:1")
    assert self_retry_setting(model) == ("client.request_options.max_retries", 2)


def test_llama_index_cohere_counts_its_own_attempts_then_its_client_s_retries() -> None:
    llama_cohere = pytest.importorskip("llama_index.llms.cohere").Cohere

    def build(**options: Any) -> Any:
        return llama_cohere(
            model=MODEL, api_key="sk-FAKE-cohere", base_url="http://127.0.0.1:1", **options
        )

    assert self_retry_setting(build()) == ("max_retries", 10)
    # One attempt of its own loop still goes through a client that retries twice.
    assert self_retry_setting(build(max_retries=1)) == (
        "additional_kwargs.request_options.max_retries",
        2,
    )
    off = {"request_options": {"max_retries": 0}}
    assert self_retry_setting(build(max_retries=1, additional_kwargs=off)) is None
