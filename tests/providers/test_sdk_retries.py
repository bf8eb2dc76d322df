"""An SDK's own retries inside a fallback chain: they delay failover, and we say so.

The failing member's server answers every request with a 503 carrying
``retry-after-ms: 10`` (the SDKs honour it, so their backoff costs milliseconds here).
Left with its default ``max_retries``, a member is asked once plus once per retry before
the chain moves on; built with ``max_retries=0`` it is asked once. Counts are the
requests the server saw.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Iterator

import pytest
from provider_surfaces import ROWS, Endpoint, Row

from llm_resilience.testing import Fault, FaultInjectingServer

HEALTHY_REPLY = "the healthy member answered this request"

# Requests the failing member makes with its package's defaults. openai and anthropic
# retry twice; boto3 makes 3 attempts. LlamaIndex's OpenAI passes its max_retries=3 to the SDK (4 requests) and
# also wraps each call in its own retry loop of 3 attempts: 12 requests, and waits of
# a second or more between its attempts whatever the server asked for.
REQUESTS_WITH_DEFAULTS = {
    "openai-sdk": 3,
    "openai-langchain": 3,
    "openai-llamaindex": 12,
    "azure-sdk": 3,
    "azure-langchain": 3,
    # LlamaIndex's AzureOpenAI is its OpenAI: max_retries=3 in the SDK, 3 attempts of its own.
    "azure-llamaindex": 12,
    "anthropic-sdk": 3,
    "anthropic-langchain": 3,
    "anthropic-llamaindex": 11,
    # botocore's default ``standard`` retry mode: 3 attempts in all. It does not read
    # ``retry-after-ms``: its own backoff (up to 1 s, then 2 s) is waited out.
    "bedrock-sdk": 3,
    # ChatBedrockConverse calls through the boto3 client it is given, botocore's default
    # mode here: 3 attempts.
    "bedrock-langchain": 3,
    # LlamaIndex's BedrockConverse: its own loop of max_retries=10 attempts (on a
    # ServiceUnavailableException, 4 to 10 s apart), each through a client it built with
    # botocore's max_attempts=10 (11 attempts): up to 110 requests.
    "bedrock-llamaindex": 110,
    # google-genai retries only when given ``HttpRetryOptions``: its client asks once.
    "gemini-sdk": 1,
    # ChatGoogleGenerativeAI passes max_retries=6 on as HttpRetryOptions(attempts=6).
    "gemini-langchain": 6,
    # LlamaIndex's GoogleGenAI: its own loop of max_retries=3 attempts (on a ServerError;
    # a 429 is never retried: it compares ``status``, a string, with 429), waits of a
    # second or more between them.
    "gemini-llamaindex": 3,
    # mistralai retries only with a RetryConfig; none by default.
    "mistral-sdk": 1,
    # ChatMistralAI's max_retries=5 (attempts in all) retries httpx transport errors
    # only: a 503 is asked once (test_mistral_retries.py counts a connection closed unanswered).
    "mistral-langchain": 1,
    # LlamaIndex's MistralAI passes max_retries=5 to the SDK as retries=5, an int, which
    # retries nothing.
    "mistral-llamaindex": 1,
    # groq is a Stainless SDK like openai: max_retries=2, and ChatGroq passes its 2 on.
    # LlamaIndex's Groq is an OpenAILike: the openai SDK's max_retries=3 inside
    # llama-index-llms-openai's own loop of 3 attempts.
    "groq-sdk": 3,
    "groq-langchain": 3,
    "groq-llamaindex": 12,
    # The ollama SDK has no retries (one httpx request), and ChatOllama and LlamaIndex's
    # Ollama add none.
    "ollama-sdk": 1,
    "ollama-langchain": 1,
    "ollama-llamaindex": 1,
    # The cohere SDK retries each call twice (on 429, 408, 409 and 5xx) unless the call's
    # request_options say otherwise. It does not honour ``retry-after-ms`` (it compares the
    # header's text with 0, fails, and falls back to its backoff of about 1 then 2 s).
    "cohere-sdk": 3,
    # ChatCohere sends no request options: its client's two retries.
    "cohere-langchain": 3,
    # LlamaIndex's Cohere: its own loop of max_retries=10 attempts (503, 500, 504; 4 to
    # 10 s apart), each a call its client retries twice: up to 30 requests.
    "cohere-llamaindex": 30,
}
# Rows whose default schedule is too slow to wait out in a test: google-genai does not
# read Retry-After and waits 1, 2, 4, 8 and 16 s between its attempts (31 s);
# BedrockConverse waits minutes (botocore's backoff, then its own 4 to 10 s).
TOO_SLOW_TO_COUNT = {"gemini-langchain", "bedrock-llamaindex", "cohere-llamaindex"}
# Rows whose client does not retry unless told to: no warning is due.
NO_RETRIES_BY_DEFAULT = {
    "gemini-sdk",
    "mistral-sdk",
    "mistral-llamaindex",
    "ollama-sdk",
    "ollama-langchain",
    "ollama-llamaindex",
}
# Rows whose retries are turned off per call (cohere's ``request_options``), where the
# member itself cannot show it: each member of the chain is warned about, retries off
# or not.
RETRIES_OFF_PER_CALL = {"cohere-sdk", "cohere-langchain"}


def _rows(*, counting: bool = False) -> list[object]:
    params: list[object] = []
    for row in ROWS:
        if counting and row.key in TOO_SLOW_TO_COUNT:
            continue  # not counted here (docs/providers.md says so); its warning is tested below
        marks = []
        if importlib.util.find_spec(row.package.split(".")[0]) is None:
            marks.append(pytest.mark.skip(reason=f"{row.package} not installed"))
        params.append(pytest.param(row, id=row.key, marks=marks))
    return params


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    with (
        FaultInjectingServer(
            name="failing", default_fault=Fault.status(503, retry_after_ms=10)
        ) as failing,
        FaultInjectingServer(reply=HEALTHY_REPLY, name="healthy") as healthy,
    ):
        yield failing, healthy


def _run(
    row: Row, servers: tuple[FaultInjectingServer, FaultInjectingServer], max_retries: int | None
) -> str:
    failing, healthy = servers
    members = [
        row.member(Endpoint("127.0.0.1", failing.port), timeout=10, max_retries=max_retries),
        row.member(Endpoint("127.0.0.1", healthy.port), timeout=10, max_retries=0),
    ]
    return row.call(row.chain(members, None))


def _self_retry_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "llm_resilience.fallback" and "retries by itself" in record.getMessage()
    ]


@pytest.mark.parametrize("row", _rows(counting=True))
def test_failover_waits_for_every_retry_of_a_member_left_with_its_sdk_default(
    row: Row, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    failing, healthy = servers
    assert _run(row, servers, max_retries=None) == HEALTHY_REPLY
    assert len(failing.requests) == REQUESTS_WITH_DEFAULTS[row.key]
    assert len(healthy.requests) == 1


@pytest.mark.parametrize("row", _rows())
def test_a_member_built_with_max_retries_0_is_asked_once_and_fails_over_at_once(
    row: Row,
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing, healthy = servers
    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        assert _run(row, servers, max_retries=0) == HEALTHY_REPLY
    assert len(failing.requests) == 1
    assert len(healthy.requests) == 1
    assert len(_self_retry_warnings(caplog)) == (2 if row.key in RETRIES_OFF_PER_CALL else 0)


@pytest.mark.parametrize("row", _rows())
def test_the_chain_warns_that_a_member_left_with_its_sdk_default_retries_by_itself(
    row: Row,
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing, _ = servers
    # The warning comes from the member's settings, not from a failure: a healthy first
    # member spares the retry waits.
    failing.default_fault = Fault.ok()
    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        _run(row, servers, max_retries=None)
    warnings = _self_retry_warnings(caplog)
    if row.key in NO_RETRIES_BY_DEFAULT:
        assert warnings == []
        return
    assert len(warnings) == (2 if row.key in RETRIES_OFF_PER_CALL else 1), warnings
    assert re.search(
        r"Client 0 of the fallback chain, .*"
        r"(max_retries|retries\.total_max_attempts|retry_options\.attempts"
        r"|backoff\.max_elapsed_time)=\d+\)",
        warnings[0],
    )


def test_an_ollama_client_on_a_retrying_httpx_transport_is_warned_about(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The one way an ollama client retries: the httpx transport it is handed, which
    # retries a connection that failed to open.
    httpx = pytest.importorskip("httpx")
    ollama = pytest.importorskip("ollama")
    from llm_resilience.fallback import FallbackChain

    failing, healthy = servers
    failing.default_fault = Fault.ok()
    members = [
        ollama.Client(
            host=f"http://127.0.0.1:{server.port}",
            timeout=10,
            transport=httpx.HTTPTransport(retries=retries),
        )
        for server, retries in ((failing, 2), (healthy, 0))
    ]
    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        FallbackChain(members).invoke(
            lambda _index, client: client.chat(model="llama3.2", messages=[], stream=False)
        )
    [warning] = _self_retry_warnings(caplog)
    assert "Client 0 of the fallback chain" in warning
    assert "(_client.transport.retries=2)" in warning
    assert "httpx.HTTPTransport(retries=0)" in warning
