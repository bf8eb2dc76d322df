"""The transient rule for Groq: its errors, as the groq SDK and the openai SDK raise them.

Every error here comes out of a real client (retries off) calling the local fault server's
Groq route, ``/openai/v1/chat/completions``, which answers with Groq's error objects:
``groq.Groq`` (and LangChain's ``ChatGroq`` on it) and ``openai.OpenAI`` on Groq's base
URL, which LlamaIndex's ``Groq`` (an ``OpenAILike``) uses. Transport errors come from
real sockets.

A verdict is the pair (default rule with 429/503, ``with_server_errors()`` preset).
Before these rules, on the same requests: Groq's 498 carried status 498 and propagated
under both; a mid-stream ``internal_server_error`` carried no status and propagated under
the preset too; a mid-stream over-capacity error propagated under both; a broken stream
chunk through the groq SDK (``json.JSONDecodeError``) propagated under both.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

groq = pytest.importorskip("groq")
import httpx  # noqa: E402
import openai  # noqa: E402

from llm_resilience import TransientClassifier, is_transient  # noqa: E402
from llm_resilience.fallback import is_context_overflow  # noqa: E402
from llm_resilience.self_retry import self_retry_setting  # noqa: E402
from llm_resilience.testing import Fault, FaultInjectingServer  # noqa: E402
from llm_resilience.transient import retry_after_of, status_code_of  # noqa: E402

PRESET = TransientClassifier.with_server_errors()
MODEL = "llama-3.3-70b-versatile"
CLIENTS = ("groq", "openai")


@pytest.fixture(scope="module")
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply="one two three four") as started:
        yield started


def _client(kind: str, root: str, *, timeout: float = 10.0, **options: Any) -> Any:
    options.setdefault("max_retries", 0)
    if kind == "groq":
        return groq.Groq(base_url=root, api_key="sk-FAKE-groq", timeout=timeout, **options)
    return openai.OpenAI(
        base_url=f"{root}/openai/v1", api_key="sk-FAKE-groq", timeout=timeout, **options
    )


def _raised(
    server: FaultInjectingServer, kind: str, fault: Fault, *, stream: bool = False
) -> Exception:
    server.reset()
    server.script(fault)
    client = _client(kind, f"http://127.0.0.1:{server.port}")

    def request() -> None:
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=stream
        )
        if stream:
            list(answer)

    with pytest.raises(Exception) as caught:
        request()
    assert server.requests[0].provider == "groq"
    return caught.value


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize(
    ("code", "status", "verdicts"),
    [
        (429, 429, (True, True)),
        (498, 503, (True, True)),
        (503, 503, (True, True)),
        (500, 500, (False, True)),
        (502, 502, (False, True)),
        (400, 400, (False, False)),
        (401, 401, (False, False)),
        (403, 403, (False, False)),
        (404, 404, (False, False)),
    ],
)
def test_a_groq_error_is_classified_by_its_status(
    server: FaultInjectingServer, kind: str, code: int, status: int, verdicts: tuple[bool, bool]
) -> None:
    error = _raised(server, kind, Fault.status(code))
    assert status_code_of(error) == status
    assert (is_transient(error), PRESET(error)) == verdicts


@pytest.mark.parametrize("kind", CLIENTS)
def test_groq_s_498_flex_capacity_exceeded_falls_over_like_its_503_over_capacity(
    server: FaultInjectingServer, kind: str
) -> None:
    error = _raised(server, kind, Fault.status(498))
    # The SDKs keep Groq's custom status; only its meaning is read as a 503.
    assert error.status_code == 498  # type: ignore[attr-defined]
    assert is_transient(error)


def test_a_498_that_is_not_groq_s_capacity_error_keeps_its_status() -> None:
    # Other services send 498 for an invalid token: the caller's problem.
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx.Response(498, request=request, json={"error": {"message": "Invalid token"}})
    error = openai.APIStatusError(
        "Invalid token", response=response, body={"message": "Invalid token"}
    )
    assert status_code_of(error) == 498
    assert (is_transient(error), PRESET(error)) == (False, False)


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize(
    ("code", "status", "verdicts"),
    [(500, 500, (False, True)), (503, 503, (True, True)), (429, 429, (True, True))],
)
def test_a_mid_stream_groq_error_object_counts_with_the_status_it_names(
    server: FaultInjectingServer, kind: str, code: int, status: int, verdicts: tuple[bool, bool]
) -> None:
    error = _raised(server, kind, Fault.error_event(code, after_chunks=1), stream=True)
    assert status_code_of(error) == status
    assert (is_transient(error), PRESET(error)) == verdicts


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_broken_chunk_in_a_groq_stream_is_transient(
    server: FaultInjectingServer, kind: str
) -> None:
    error = _raised(server, kind, Fault.malformed_chunk(after_chunks=1), stream=True)
    assert isinstance(error, json.JSONDecodeError)
    assert is_transient(error)


def test_a_json_error_outside_any_stream_decoder_stays_permanent() -> None:
    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads('{"cut')
    assert not PRESET(caught.value)


@pytest.mark.parametrize("kind", CLIENTS)
def test_groq_s_retry_after_is_read_from_its_rate_limit_error(
    server: FaultInjectingServer, kind: str
) -> None:
    error = _raised(server, kind, Fault.status(429, retry_after=2))
    assert retry_after_of(error) == 2.0


@pytest.mark.parametrize("kind", CLIENTS)
def test_groq_s_context_length_exceeded_is_a_context_overflow_and_permanent(
    server: FaultInjectingServer, kind: str
) -> None:
    error = _raised(server, kind, Fault.context_length_exceeded("groq"))
    assert is_context_overflow(error)
    assert not PRESET(error)
    assert not is_context_overflow(_raised(server, kind, Fault.status(400)))


@pytest.mark.parametrize("kind", CLIENTS)
def test_transport_failures_under_groq_clients_are_transient(
    server: FaultInjectingServer, kind: str
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = _client(kind, f"http://127.0.0.1:{port}")
    with pytest.raises(Exception) as caught:
        refused.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    dropped = _raised(server, kind, Fault.drop_mid_stream(after_chunks=1), stream=True)
    server.reset()
    server.script(Fault.hang())
    hung = _client(kind, f"http://127.0.0.1:{server.port}", timeout=0.2)
    with pytest.raises(Exception) as timed_out:
        hung.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    for error in (caught.value, dropped, timed_out.value):
        assert is_transient(error), repr(error)
        assert status_code_of(error) is None


def test_chat_groq_re_raises_groq_s_errors_with_their_verdicts(
    server: FaultInjectingServer,
) -> None:
    langchain_groq = pytest.importorskip("langchain_groq")
    model = langchain_groq.ChatGroq(
        model=MODEL,
        api_key="sk-FAKE-groq",
        base_url=f"http://127.0.0.1:{server.port}",
        max_retries=0,
    )
    verdicts = {}
    for code in (429, 498, 500, 401):
        server.reset()
        server.script(Fault.status(code, retry_after=3) if code == 429 else Fault.status(code))
        with pytest.raises(Exception) as caught:
            model.invoke("Hi")
        verdicts[code] = (is_transient(caught.value), PRESET(caught.value))
        if code == 429:
            assert retry_after_of(caught.value) == 3.0
    assert verdicts == {
        429: (True, True),
        498: (True, True),
        500: (False, True),
        401: (False, False),
    }


@pytest.mark.parametrize(
    ("options", "setting"),
    [
        ({}, ("max_retries", 2)),
        ({"max_retries": 0}, None),
        ({"max_retries": 5}, ("max_retries", 5)),
    ],
)
def test_a_groq_client_s_own_retries_are_seen(
    options: dict[str, Any], setting: tuple[str, int] | None
) -> None:
    client = groq.Groq(base_url="http://127.0.0.1:9", api_key="sk-FAKE-groq", **options)
    assert self_retry_setting(client) == setting
    assert self_retry_setting(groq.AsyncGroq(api_key="sk-FAKE-groq", **options)) == setting


def test_chat_groq_s_max_retries_is_seen() -> None:
    langchain_groq = pytest.importorskip("langchain_groq")

    def model(**options: Any) -> Any:
        return langchain_groq.ChatGroq(model=MODEL, api_key="sk-FAKE-groq", **options)

    assert self_retry_setting(model()) == ("max_retries", 2)
    assert self_retry_setting(model(max_retries=0)) is None
