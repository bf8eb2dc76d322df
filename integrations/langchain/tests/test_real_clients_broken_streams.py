"""Broken streams through real ``ChatOpenAI``/``ChatAnthropic`` against the fault server.

A stream with one undecodable SSE event restarts on the next member; a stream missing its
end marker (``[DONE]``, ``message_stop``) still completes at once with its usage; and a
stream restarted after the first member already named its model is recorded in the
ledger under the member that served, not under the two names glued together.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI

from langchain_llm_resilience import CostTrackedChatModel, FallbackChatModel
from langchain_llm_resilience.testing import RestartEvents
from llm_resilience import Cooldown, CostBudget
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.testing import Fault, FaultInjectingServer

PRIMARY_REPLY = "one two three four five six seven eight"
SECONDARY_REPLY = "the secondary answered this request"
MODEL = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}
OTHER = {"openai": "anthropic", "anthropic": "openai"}


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    # Fresh ports per test: the provider packages cache async HTTP clients per base URL.
    with (
        FaultInjectingServer(reply=PRIMARY_REPLY, name="primary") as primary,
        FaultInjectingServer(reply=SECONDARY_REPLY, name="secondary") as secondary,
    ):
        yield primary, secondary


def member(provider: str, server: FaultInjectingServer) -> BaseChatModel:
    if provider == "openai":
        return ChatOpenAI(
            model=MODEL["openai"],
            base_url=server.openai_base_url,
            api_key="test",  # type: ignore[arg-type]
            max_retries=0,
            timeout=10,
            stream_usage=True,
        )
    return ChatAnthropic(
        model_name=MODEL["anthropic"],
        base_url=server.anthropic_base_url,
        api_key="test",
        max_retries=0,
        timeout=10,
        stop=None,  # type: ignore[arg-type]
    )


def chain(
    primary_provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> FallbackChatModel:
    primary, secondary = servers
    return FallbackChatModel(
        models=[
            member(primary_provider, primary),
            member(OTHER[primary_provider], secondary),
        ],
        per_client_timeout=10,
    )


def merged(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return total


def after_restart(chunks: list[AIMessageChunk], first_text: str) -> str:
    """The text a consumer that drops the failed prefix keeps: the text after it."""
    text = "".join(chunk.text for chunk in chunks)
    assert text.startswith(first_text)
    return text[len(first_text) :]


PROVIDERS = ["openai", "anthropic"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_malformed_event_mid_stream_restarts_the_stream_on_the_next_member(
    provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, secondary = servers
    primary.script(Fault.malformed_chunk(after_chunks=2))
    restarts = RestartEvents()
    model = chain(provider, servers)
    chunks = list(model.stream("Capital of France?", {"callbacks": [restarts]}))
    assert after_restart(chunks, "one two") == SECONDARY_REPLY
    assert restarts.events == [
        {
            "failed_client": 0,
            "next_client": 1,
            "chunks": 2,
            "error_type": "JSONDecodeError",
            "continued": False,
        }
    ]
    answer = merged(chunks)
    assert answer.response_metadata["fallback_served_by"] == [1]
    assert answer.response_metadata["model_name"] == MODEL[OTHER[provider]]
    assert answer.response_metadata["model_provider"] == OTHER[provider]
    # The process is fine: the next call is served by the (now healthy) primary.
    again = "".join(chunk.text for chunk in model.stream("Capital of France?"))
    assert again == PRIMARY_REPLY
    assert len(secondary.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_malformed_event_mid_astream_restarts_the_stream_on_the_next_member(
    provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, _secondary = servers
    primary.script(Fault.malformed_chunk(after_chunks=2))
    restarts = RestartEvents()
    model = chain(provider, servers)
    chunks = [c async for c in model.astream("Capital of France?", {"callbacks": [restarts]})]
    assert after_restart(chunks, "one two") == SECONDARY_REPLY
    assert [event["error_type"] for event in restarts.events] == ["JSONDecodeError"]
    assert merged(chunks).response_metadata["fallback_served_by"] == [1]
    again = "".join([c.text async for c in model.astream("Capital of France?")])
    assert again == PRIMARY_REPLY


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_malformed_event_before_any_text_leaves_only_the_next_members_text(
    provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, _secondary = servers
    primary.script(Fault.malformed_chunk(after_chunks=0))
    restarts = RestartEvents()
    chunks = list(chain(provider, servers).stream("Hi", {"callbacks": [restarts]}))
    answer = merged(chunks)
    assert answer.text == SECONDARY_REPLY
    assert answer.response_metadata["model_name"] == MODEL[OTHER[provider]]
    # The primary's opening (non-text) events had been passed on: a restart, of no tokens.
    assert [event["chunks"] for event in restarts.events] == [0]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_stream_without_its_end_marker_completes_at_once_with_its_usage(
    provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, secondary = servers
    primary.script(Fault.missing_done())
    started = time.monotonic()
    chunks = list(chain(provider, servers).stream("Capital of France?"))
    assert time.monotonic() - started < 2.0
    answer = merged(chunks)
    assert answer.text == PRIMARY_REPLY
    assert answer.response_metadata["fallback_served_by"] == [0]
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] == len(PRIMARY_REPLY.split())
    assert answer.usage_metadata["input_tokens"] > 0
    assert secondary.requests == []


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_astream_without_its_end_marker_completes_at_once_with_its_usage(
    provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, secondary = servers
    primary.script(Fault.missing_done())
    started = time.monotonic()
    chunks = [c async for c in chain(provider, servers).astream("Capital of France?")]
    assert time.monotonic() - started < 2.0
    answer = merged(chunks)
    assert answer.text == PRIMARY_REPLY
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] == len(PRIMARY_REPLY.split())
    assert secondary.requests == []


async def test_invoke_over_members_that_stream_internally_answers_only_with_the_next_member(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    models: list[BaseChatModel] = [member("openai", primary), member("anthropic", secondary)]
    for model in models:
        model.streaming = True  # type: ignore[attr-defined]
    chain = FallbackChatModel(models=models)
    primary.script(Fault.malformed_chunk(after_chunks=2))
    answer = chain.invoke("Capital of France?")
    assert (answer.text, answer.response_metadata["model_name"]) == (
        SECONDARY_REPLY,
        MODEL["anthropic"],
    )
    primary.script(Fault.malformed_chunk(after_chunks=2))
    answer = await chain.ainvoke("Capital of France?")
    assert answer.text == SECONDARY_REPLY
    assert [request.stream for request in primary.requests] == [True, True]


# -- which model a restarted stream names ------------------------------------------------


def tracked(
    servers: tuple[FaultInjectingServer, FaultInjectingServer], primary: str, secondary: str
) -> tuple[CostTrackedChatModel, InMemoryCostLedger]:
    first, second = servers
    ledger = InMemoryCostLedger()
    inner = FallbackChatModel(models=[member(primary, first), member(secondary, second)])
    budget = CostBudget(input_price_per_mtok=3, output_price_per_mtok=15, daily_limit=10)
    return CostTrackedChatModel(inner=inner, budget=budget, ledger=ledger), ledger


# The Anthropic primary names its model in the stream's first event, so a drop after a
# few words leaves that name in the consumer's merge; the secondary names its own.
@pytest.mark.parametrize("secondary", ["anthropic", "openai"])
def test_a_stream_restarted_mid_way_is_recorded_under_the_member_that_served(
    secondary: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, _ = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    model, ledger = tracked(servers, "anthropic", secondary)
    chunks = list(model.stream("Capital of France?"))
    metadata = merged(chunks).response_metadata
    assert (metadata["model_name"], metadata["model_provider"]) == (MODEL[secondary], secondary)
    (entry,) = ledger.entries()
    assert entry.model == MODEL[secondary]


@pytest.mark.parametrize("secondary", ["anthropic", "openai"])
async def test_an_astream_restarted_mid_way_is_recorded_under_the_member_that_served(
    secondary: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, _ = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    model, ledger = tracked(servers, "anthropic", secondary)
    chunks = [c async for c in model.astream("Capital of France?")]
    name = merged(chunks).response_metadata["model_name"]
    assert name == MODEL[secondary]
    (entry,) = ledger.entries()
    assert entry.model == MODEL[secondary]


# -- circuit state -----------------------------------------------------------------------


def test_health_shows_a_member_whose_breaker_opened_after_real_503s(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    model = FallbackChatModel(
        models=[member("openai", primary), member("anthropic", secondary)],
        cooldown=Cooldown(failures=2, window=60, duration=30),
    )
    assert [m.state for m in model.health()] == ["closed", "closed"]
    primary.default_fault = Fault.status(503)
    model.invoke("Hi")
    assert (model.health()[0].state, model.health()[0].failures) == ("closed", 1)
    model.invoke("Hi")
    first, second = model.health()
    assert first.state == "open"
    assert 29 < first.retry_in <= 30
    assert second.state == "closed"
    model.invoke("Hi")
    assert len(primary.requests) == 2  # skipped while open
