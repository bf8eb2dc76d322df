"""The transient rule for Ollama: the ``ollama`` SDK's errors, as it raises them.

Every error here comes out of a real ``ollama.Client`` calling ``chat`` (or streaming it)
on the local fault server, which answers with Ollama's ``{"error": "..."}`` bodies. The
SDK raises ``ResponseError(error, status_code)`` for a status (``from None``, so the
httpx error it caught is kept only as ``__context__``), ``ResponseError`` with
``status_code`` -1 for an ``{"error": ...}`` line inside a stream that already said 200,
the builtin ``ConnectionError`` for a refused connection or an unresolvable host, and lets
httpx's read timeouts, cut connections and ``json.loads`` errors of a broken stream line
out as they are.

A verdict is the pair (default rule with 429/503, ``with_server_errors()`` preset).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

ollama = pytest.importorskip("ollama")

from llm_resilience import TransientClassifier, is_transient  # noqa: E402
from llm_resilience.fallback import is_context_overflow  # noqa: E402
from llm_resilience.self_retry import self_retry_setting  # noqa: E402
from llm_resilience.testing import Fault, FaultInjectingServer  # noqa: E402
from llm_resilience.transient import retry_after_of, status_code_of  # noqa: E402

PRESET = TransientClassifier.with_server_errors()
MODEL = "llama3.2"
MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply="one two three four") as started:
        yield started


def _raised(
    server: FaultInjectingServer, fault: Fault, *, stream: bool = False, timeout: float = 10
) -> Exception:
    server.reset()
    server.script(fault)
    client = ollama.Client(host=f"http://127.0.0.1:{server.port}", timeout=timeout)

    def request() -> None:
        if stream:
            list(client.chat(model=MODEL, messages=MESSAGES, stream=True))
        else:
            client.chat(model=MODEL, messages=MESSAGES)

    with pytest.raises(Exception) as caught:
        request()
    return caught.value


def _verdicts(error: BaseException) -> tuple[bool, bool]:
    return is_transient(error), PRESET(error)


@pytest.mark.parametrize(
    ("code", "verdicts"),
    [
        (429, (True, True)),
        (503, (True, True)),
        (500, (False, True)),
        (502, (False, True)),
        (504, (False, True)),  # nginx's "504 Gateway Time-out", not a keyword
        (400, (False, False)),
        (401, (False, False)),
        (403, (False, False)),
        (404, (False, False)),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
def test_an_ollama_status_error_is_classified_by_its_status(
    server: FaultInjectingServer, code: int, verdicts: tuple[bool, bool], stream: bool
) -> None:
    error = _raised(server, Fault.status(code), stream=stream)
    assert isinstance(error, ollama.ResponseError)
    assert (error.status_code, status_code_of(error)) == (code, code)
    assert _verdicts(error) == verdicts


def test_ollama_s_server_busy_503_is_transient_under_both_rules(
    server: FaultInjectingServer,
) -> None:
    error = _raised(server, Fault.status(503))
    assert "server busy" in str(error)
    assert _verdicts(error) == (True, True)


def test_an_error_line_after_a_stream_started_counts_as_a_500(
    server: FaultInjectingServer,
) -> None:
    # Ollama's runner failed mid-stream: the SDK raises ResponseError with status -1.
    error = _raised(server, Fault.error_event(500, after_chunks=2), stream=True)
    assert isinstance(error, ollama.ResponseError)
    assert error.status_code == -1
    assert status_code_of(error) == 500
    assert _verdicts(error) == (False, True)


def test_a_response_error_with_a_status_keeps_it() -> None:
    assert status_code_of(ollama.ResponseError("nope", 404)) == 404
    assert status_code_of(ollama.ResponseError('{"error": "gone"}', 410)) == 410


def test_a_stream_line_that_is_not_json_is_transient(server: FaultInjectingServer) -> None:
    error = _raised(server, Fault.malformed_chunk(after_chunks=1), stream=True)
    assert type(error).__name__ == "JSONDecodeError"
    assert _verdicts(error) == (True, True)


def test_a_json_error_raised_outside_the_sdk_stays_non_transient() -> None:
    import json

    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads("{not json")
    assert _verdicts(caught.value) == (False, False)


def test_a_refused_connection_and_an_unresolvable_host_are_transient() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for host in (f"http://127.0.0.1:{port}", "http://nonexistent.invalid:11434"):
        client = ollama.Client(host=host, timeout=5)
        with pytest.raises(ConnectionError) as caught:
            client.chat(model=MODEL, messages=MESSAGES)
        assert _verdicts(caught.value) == (True, True)


@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
def test_a_read_timeout_and_a_dropped_connection_are_transient(
    server: FaultInjectingServer, stream: bool
) -> None:
    timeout = _raised(server, Fault.hang(), stream=stream, timeout=0.2)
    dropped = _raised(server, Fault.drop_mid_stream(after_chunks=1 if stream else 0), stream=stream)
    assert _verdicts(timeout) == (True, True)
    assert _verdicts(dropped) == (True, True)


def test_retry_after_is_read_from_the_http_error_the_sdk_raised_its_error_over(
    server: FaultInjectingServer,
) -> None:
    # Ollama itself sends no Retry-After; a proxy in front of it (or ollama.com behind a
    # cloud model) may. ResponseError keeps no headers: they are on its __context__.
    for stream in (False, True):
        error = _raised(server, Fault.status(429, retry_after=3), stream=stream)
        assert error.__cause__ is None
        assert retry_after_of(error) == 3.0


def test_ollama_s_own_503_carries_no_wait(server: FaultInjectingServer) -> None:
    assert retry_after_of(_raised(server, Fault.status(503))) is None


def test_an_ollama_error_is_never_read_as_a_context_overflow(
    server: FaultInjectingServer,
) -> None:
    # Ollama truncates a prompt longer than num_ctx and answers 200; its 400s are other
    # problems.
    assert is_context_overflow(_raised(server, Fault.status(400))) is False


def _httpx_retries(transport_retries: int) -> dict[str, Any]:
    import httpx

    return {"transport": httpx.HTTPTransport(retries=transport_retries)}


def test_an_ollama_client_does_not_retry_by_itself() -> None:
    assert self_retry_setting(ollama.Client(host="http://127.0.0.1:11434")) is None
    assert self_retry_setting(ollama.AsyncClient(host="http://127.0.0.1:11434")) is None


def test_an_ollama_client_on_an_httpx_transport_with_retries_is_seen_retrying() -> None:
    # httpx's transport retries a failed connect; ollama.Client passes it to httpx.
    client = ollama.Client(host="http://127.0.0.1:11434", **_httpx_retries(2))
    assert self_retry_setting(client) == ("_client.transport.retries", 2)


def test_chat_ollama_over_a_retrying_httpx_transport_is_seen_retrying() -> None:
    httpx = pytest.importorskip("httpx")
    langchain_ollama = pytest.importorskip("langchain_ollama")
    quiet = langchain_ollama.ChatOllama(model=MODEL, base_url="http://127.0.0.1:11434")
    retrying = langchain_ollama.ChatOllama(
        model=MODEL,
        base_url="http://127.0.0.1:11434",
        sync_client_kwargs={"transport": httpx.HTTPTransport(retries=3)},
    )
    async_only = langchain_ollama.ChatOllama(
        model=MODEL,
        base_url="http://127.0.0.1:11434",
        async_client_kwargs={"transport": httpx.AsyncHTTPTransport(retries=1)},
    )
    assert self_retry_setting(quiet) is None
    assert self_retry_setting(retrying) == ("_client._client.transport.retries", 3)
    assert self_retry_setting(async_only) == ("_async_client._client.transport.retries", 1)
