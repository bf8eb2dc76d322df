"""Mistral's own retries, beyond the counts of ``test_sdk_retries.py``: the ``mistralai``
client retries only with a ``RetryConfig``, for a time budget rather than a count;
``ChatMistralAI``'s ``max_retries`` counts attempts in all and retries transport errors
only; LlamaIndex's ``MistralAI`` retries only through a ``RetryConfig`` it is given in
``additional_kwargs["retries"]``. Counts are the requests the server saw.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from provider_surfaces import QUESTION, Endpoint

from llm_resilience.fallback import FallbackChain
from llm_resilience.testing import Fault, FaultInjectingServer

pytest.importorskip("mistralai")

HEALTHY_REPLY = "the healthy member answered this request"


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    with (
        FaultInjectingServer(
            name="failing", default_fault=Fault.status(503, retry_after_ms=10)
        ) as failing,
        FaultInjectingServer(reply=HEALTHY_REPLY, name="healthy") as healthy,
    ):
        yield failing, healthy


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "llm_resilience.fallback" and "retries by itself" in record.getMessage()
    ]


def test_a_mistral_client_with_a_backoff_retry_config_is_asked_again_and_warned_about(
    servers: tuple[FaultInjectingServer, FaultInjectingServer], caplog: pytest.LogCaptureFixture
) -> None:
    from surfaces_mistral import MISTRAL_MODEL, mistral_sdk

    failing, healthy = servers
    members = [
        mistral_sdk(Endpoint("127.0.0.1", failing.port), timeout=10, max_retries=3),
        mistral_sdk(Endpoint("127.0.0.1", healthy.port), timeout=10, max_retries=0),
    ]
    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        reply = FallbackChain(members).invoke(
            lambda _index, client: client.chat.complete(
                model=MISTRAL_MODEL, messages=[{"role": "user", "content": QUESTION}]
            )
        )
    assert reply.choices[0].message.content == HEALTHY_REPLY
    # The SDK retries until its 70 ms budget is spent, waiting the 10 ms the server
    # asks: more than one request, how many depends on the machine's speed.
    assert len(failing.requests) > 1
    assert len(healthy.requests) == 1
    [warning] = _warnings(caplog)
    assert "retry_config.backoff.max_elapsed_time=70)" in warning


def test_chat_mistral_ai_s_max_retries_counts_attempts_in_all_on_a_connection_closed_unanswered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from surfaces_mistral import chat_mistral

    from langchain_llm_resilience import FallbackChatModel

    # Two attempts in all: tenacity's wait between them is at least 4 s.
    with (
        FaultInjectingServer(name="failing", default_fault=Fault.refuse()) as failing,
        FaultInjectingServer(reply=HEALTHY_REPLY, name="healthy") as healthy,
    ):
        members = [
            chat_mistral(Endpoint("127.0.0.1", failing.port), timeout=10, max_retries=1),
            chat_mistral(Endpoint("127.0.0.1", healthy.port), timeout=10, max_retries=0),
        ]
        with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
            answer = FallbackChatModel(models=members).invoke(QUESTION)
        assert answer.content == HEALTHY_REPLY
        assert len(failing.requests) == 2
    [warning] = _warnings(caplog)
    assert "max_retries=2)" in warning


def test_llama_index_mistral_ai_retries_only_through_a_retry_config_it_is_given(
    servers: tuple[FaultInjectingServer, FaultInjectingServer], caplog: pytest.LogCaptureFixture
) -> None:
    from llama_index.resilience import FallbackLLM
    from provider_surfaces import _llama_call
    from surfaces_mistral import llama_mistral, mistral_retry_config

    failing, healthy = servers
    retrying = llama_mistral(Endpoint("127.0.0.1", failing.port), timeout=10, max_retries=5)
    retrying.additional_kwargs = {"retries": mistral_retry_config(3)}
    members = [
        retrying,
        llama_mistral(Endpoint("127.0.0.1", healthy.port), timeout=10, max_retries=0),
    ]
    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        assert _llama_call(FallbackLLM(llms=members)) == HEALTHY_REPLY
    assert len(failing.requests) > 1
    [warning] = _warnings(caplog)
    assert "additional_kwargs.retries.backoff.max_elapsed_time=70)" in warning
