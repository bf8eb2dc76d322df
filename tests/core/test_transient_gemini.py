"""The transient rule for Google Gemini: google-genai's errors, as the SDK raises them.

Every ``APIError`` here comes out of a real ``google.genai.Client`` (retries off) calling
``generate_content`` or ``generate_content_stream`` on the local fault server, which
answers with Gemini's ``google.rpc.Status`` bodies; google-genai raises ``ClientError``
(4xx) or ``ServerError`` (5xx) carrying ``.code``, ``.status`` and ``.details``.
LangChain's ``ChatGoogleGenerativeAI`` re-raises them as its own types ``from`` the
original, so its verdicts are checked too. Transport errors come from real sockets.

A verdict is the pair (default rule with 429/503, ``with_server_errors()`` preset).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

genai = pytest.importorskip("google.genai")
from google.genai import errors, types  # noqa: E402

from llm_resilience import TransientClassifier, is_transient  # noqa: E402
from llm_resilience.fallback import (  # noqa: E402
    context_limit_of,
    is_context_overflow,
)
from llm_resilience.self_retry import self_retry_setting  # noqa: E402
from llm_resilience.testing import Fault, FaultInjectingServer  # noqa: E402
from llm_resilience.transient import retry_after_of, status_code_of  # noqa: E402

PRESET = TransientClassifier.with_server_errors()
MODEL = "gemini-2.5-flash"


def _client(root: str, *, timeout_ms: int = 10_000, **options: Any) -> Any:
    retry = options.pop("retry_options", types.HttpRetryOptions(attempts=1))
    return genai.Client(
        api_key="sk-FAKE-gemini",
        http_options=types.HttpOptions(base_url=root, timeout=timeout_ms, retry_options=retry),
    )


@pytest.fixture(scope="module")
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply="one two three four") as started:
        yield started


def _raised(server: FaultInjectingServer, fault: Fault, *, stream: bool = False) -> Exception:
    server.reset()
    server.script(fault)
    client = _client(f"http://127.0.0.1:{server.port}")

    def request() -> None:
        if stream:
            list(client.models.generate_content_stream(model=MODEL, contents="Hi"))
        else:
            client.models.generate_content(model=MODEL, contents="Hi")

    with pytest.raises(Exception) as caught:
        request()
    return caught.value


@pytest.mark.parametrize(
    ("code", "status", "kind", "verdicts"),
    [
        (429, "RESOURCE_EXHAUSTED", errors.ClientError, (True, True)),
        (503, "UNAVAILABLE", errors.ServerError, (True, True)),
        (500, "INTERNAL", errors.ServerError, (False, True)),
        (504, "DEADLINE_EXCEEDED", errors.ServerError, (False, True)),
        (400, "INVALID_ARGUMENT", errors.ClientError, (False, False)),
        (401, "UNAUTHENTICATED", errors.ClientError, (False, False)),
        (403, "PERMISSION_DENIED", errors.ClientError, (False, False)),
        (404, "NOT_FOUND", errors.ClientError, (False, False)),
    ],
)
def test_a_gemini_error_is_classified_by_its_code_and_status(
    server: FaultInjectingServer,
    code: int,
    status: str,
    kind: type[Exception],
    verdicts: tuple[bool, bool],
) -> None:
    error = _raised(server, Fault.status(code))
    assert isinstance(error, kind)
    assert (error.code, error.status) == (code, status)  # type: ignore[attr-defined]
    assert status_code_of(error) == code
    assert (is_transient(error), PRESET(error)) == verdicts


def test_resource_exhausted_s_retry_info_delay_is_read_as_retry_after(
    server: FaultInjectingServer,
) -> None:
    error = _raised(server, Fault.status(429))
    assert retry_after_of(error) == 7.0


def test_a_retry_after_header_wins_over_the_retry_info_detail(
    server: FaultInjectingServer,
) -> None:
    error = _raised(server, Fault.status(429, retry_after=2))
    assert retry_after_of(error) == 2.0


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [("0.5s", 0.5), ("30s", 30.0), ("soon", None), ("-1s", None), (7, None)],
)
def test_only_a_well_formed_retry_delay_counts(delay: object, seconds: float | None) -> None:
    body = {
        "error": {
            "code": 429,
            "status": "RESOURCE_EXHAUSTED",
            "message": "Quota exceeded.",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}],
        }
    }
    assert retry_after_of(errors.ClientError(429, body)) == seconds


def test_a_retry_info_detail_on_a_foreign_error_is_not_read() -> None:
    class APIError(Exception):
        details = {"error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo"}]}}

    assert retry_after_of(APIError("not google's")) is None


def test_a_mid_stream_error_is_a_server_error_with_its_status(
    server: FaultInjectingServer,
) -> None:
    error = _raised(server, Fault.error_event(500, after_chunks=1), stream=True)
    assert isinstance(error, errors.ServerError)
    assert status_code_of(error) == 500
    assert (is_transient(error), PRESET(error)) == (False, True)


def test_the_input_token_count_message_is_a_context_overflow(
    server: FaultInjectingServer,
) -> None:
    fault = Fault.context_length_exceeded("gemini", tokens=1_100_000, maximum=1_048_576)
    error = _raised(server, fault)
    assert is_context_overflow(error)
    assert context_limit_of(error) == 1_048_576
    assert not PRESET(error)
    assert not is_context_overflow(_raised(server, Fault.status(400)))


def test_transport_failures_under_google_genai_are_transient(
    server: FaultInjectingServer,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = _client(f"http://127.0.0.1:{port}")
    with pytest.raises(Exception) as caught:
        refused.models.generate_content(model=MODEL, contents="Hi")
    dropped = _raised(server, Fault.drop_mid_stream(after_chunks=1), stream=True)
    server.reset()
    server.script(Fault.hang())
    hung_client = _client(f"http://127.0.0.1:{server.port}", timeout_ms=200)
    with pytest.raises(Exception) as hung:
        hung_client.models.generate_content(model=MODEL, contents="Hi")
    for error in (caught.value, dropped, hung.value):
        assert is_transient(error), repr(error)
        assert status_code_of(error) is None


@pytest.mark.parametrize(
    ("retry", "setting"),
    [
        pytest.param(None, None, id="no-retry-options"),
        pytest.param(types.HttpRetryOptions(attempts=1), None, id="one-attempt"),
        pytest.param(types.HttpRetryOptions(attempts=0), None, id="zero-is-one"),
        pytest.param(
            types.HttpRetryOptions(attempts=3),
            ("http_options.retry_options.attempts", 3),
            id="three-attempts",
        ),
        pytest.param(
            types.HttpRetryOptions(),
            ("http_options.retry_options.attempts", 5),
            id="retry-options-default",
        ),
    ],
)
def test_a_google_genai_client_s_own_retries_are_seen(
    retry: Any, setting: tuple[str, int] | None
) -> None:
    client = _client("http://127.0.0.1:9", retry_options=retry)
    assert self_retry_setting(client) == setting
    assert self_retry_setting(client.aio) == setting


def test_chat_google_generative_ai_max_retries_counts_attempts_in_all() -> None:
    langchain_google_genai = pytest.importorskip("langchain_google_genai")

    def model(**options: Any) -> Any:
        return langchain_google_genai.ChatGoogleGenerativeAI(
            model=MODEL, api_key="sk-FAKE-gemini", base_url="http://127.0.0.1:9", **options
        )

    assert self_retry_setting(model()) == ("max_retries", 6)
    assert self_retry_setting(model(max_retries=2)) == ("max_retries", 2)
    assert self_retry_setting(model(max_retries=1)) is None


def test_langchain_s_wrapped_gemini_errors_keep_their_verdicts_and_retry_delay(
    server: FaultInjectingServer,
) -> None:
    langchain_google_genai = pytest.importorskip("langchain_google_genai")
    model = langchain_google_genai.ChatGoogleGenerativeAI(
        model=MODEL,
        api_key="sk-FAKE-gemini",
        base_url=f"http://127.0.0.1:{server.port}",
        max_retries=1,
    )
    verdicts = {}
    for code in (429, 500, 401):
        server.reset()
        server.script(Fault.status(code))
        with pytest.raises(Exception) as caught:
            model.invoke("Hi")
        verdicts[code] = (is_transient(caught.value), PRESET(caught.value))
        assert status_code_of(caught.value) == code
        if code == 429:
            assert retry_after_of(caught.value) == 7.0
    assert verdicts == {429: (True, True), 500: (False, True), 401: (False, False)}


def test_classifying_never_imports_google_genai() -> None:
    code = (
        "import sys\n"
        "from llm_resilience.transient import is_transient, retry_after_of\n"
        "from llm_resilience.fallback import is_context_overflow\n"
        "from llm_resilience.self_retry import self_retry_setting\n"
        "e = ValueError('x')\n"
        "is_transient(e); retry_after_of(e); is_context_overflow(e); self_retry_setting(e)\n"
        "assert 'google.genai' not in sys.modules, 'google.genai imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
