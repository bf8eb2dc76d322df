"""``mid_stream=`` through real ``ChatOpenAI``/``ChatAnthropic`` against the fault server.

What a plain consumer, one that concatenates ``chunk.content`` and listens for nothing,
reads when the primary's stream is cut after three words: under ``"restart"`` (the
default) the failed prefix and then the next member's whole answer, with the restart
event for consumers that listen; under ``"continue"`` exactly one answer, the
``ChatAnthropic`` fallback carrying on from the prefix sent as an assistant prefill
(or, where the fallback rejects prefill, a restart with the event, never the
rejection); under ``"raise"`` the prefix and then a clean ``StreamInterruptedError``
carrying it, never a second answer glued on. A content filter is not an outage: it
propagates (a refused prompt) or ends the answer (a filtered completion), untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessageChunk
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI

from langchain_llm_resilience import FallbackChatModel
from langchain_llm_resilience.testing import RestartEvents
from llm_resilience import MemberProfile, StreamInterruptedError, is_transient
from llm_resilience.testing import Fault, FaultInjectingServer

PRIMARY_REPLY = "one two three four five six seven eight"
SECONDARY_REPLY = "the secondary answered this request"
DELIVERED = "one two three"
MODEL = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}
OTHER = {"openai": "anthropic", "anthropic": "openai"}
PROVIDERS = ["openai", "anthropic"]


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
        )
    return ChatAnthropic(
        model_name=MODEL["anthropic"],
        base_url=server.anthropic_base_url,
        api_key="test",  # type: ignore[arg-type]
        max_retries=0,
        timeout=10,
        stop=None,  # type: ignore[arg-type]
    )


def chain(
    provider: str,
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    **options: Any,
) -> FallbackChatModel:
    primary, secondary = servers
    return FallbackChatModel(
        models=[member(provider, primary), member(OTHER[provider], secondary)], **options
    )


def text(chunk: BaseMessageChunk) -> str:
    assert isinstance(chunk.content, str)
    return chunk.content


def consume(
    model: FallbackChatModel, received: list[str], config: RunnableConfig | None = None
) -> str:
    """A plain consumer: it concatenates ``chunk.content`` and listens for nothing."""
    for chunk in model.stream("Capital of France?", config):
        received.append(text(chunk))
    return "".join(received)


async def aconsume(
    model: FallbackChatModel, received: list[str], config: RunnableConfig | None = None
) -> str:
    async for chunk in model.astream("Capital of France?", config):
        received.append(text(chunk))
    return "".join(received)


def test_mid_stream_is_validated_naming_the_option_and_the_values() -> None:
    with FaultInjectingServer() as server:
        models = [member("openai", server), member("anthropic", server)]
        with pytest.raises(
            ValueError, match=r"mid_stream must be one of 'restart', 'continue', 'raise'"
        ):
            FallbackChatModel(models=models, mid_stream="retry")
        assert FallbackChatModel(models=models).mid_stream == "restart"


# -- restart (the default) ---------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_restart_gives_a_plain_consumer_the_prefix_then_the_next_answer_with_the_event(
    provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, _ = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    events = RestartEvents()
    answer = consume(chain(provider, servers), [], {"callbacks": [events]})
    # What "restart" promises: the restart is announced, and the text after it is whole.
    assert answer == DELIVERED + SECONDARY_REPLY
    assert [(e["failed_client"], e["next_client"], e["chunks"]) for e in events.events] == [
        (0, 1, 3)
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_restart_gives_an_async_plain_consumer_the_prefix_then_the_next_answer(
    provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, _ = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    events = RestartEvents()
    answer = await aconsume(chain(provider, servers), [], {"callbacks": [events]})
    assert answer == DELIVERED + SECONDARY_REPLY
    assert [e["chunks"] for e in events.events] == [3]


# -- raise -------------------------------------------------------------------------------


def check_interrupted(error: StreamInterruptedError) -> None:
    assert (error.client_index, error.chunks, error.delivered_text) == (0, 3, DELIVERED)
    assert DELIVERED not in str(error)
    assert error.__cause__ is not None
    assert is_transient(error.__cause__)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_raise_gives_a_plain_consumer_the_prefix_then_a_clean_error_and_no_second_answer(
    provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    events = RestartEvents()
    received: list[str] = []
    model = chain(provider, servers, mid_stream="raise")
    with pytest.raises(StreamInterruptedError) as caught:
        consume(model, received, {"callbacks": [events]})
    assert "".join(received) == DELIVERED
    check_interrupted(caught.value)
    assert secondary.requests == []
    assert events.events == []
    # The chain is fine afterwards: the next stream is served whole by the primary.
    assert consume(model, []) == PRIMARY_REPLY


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_raise_gives_an_async_plain_consumer_the_prefix_then_a_clean_error(
    provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    received: list[str] = []
    model = chain(provider, servers, mid_stream="raise")
    with pytest.raises(StreamInterruptedError) as caught:
        await aconsume(model, received)
    assert "".join(received) == DELIVERED
    check_interrupted(caught.value)
    assert secondary.requests == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_raise_still_falls_back_quietly_when_the_stream_fails_before_any_text(
    provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, _ = servers
    primary.script(Fault.drop_mid_stream(after_chunks=0))
    model = chain(provider, servers, mid_stream="raise")
    assert consume(model, []) == SECONDARY_REPLY


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_raise_still_falls_back_quietly_on_a_503_before_an_async_stream(
    provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, _ = servers
    primary.script(Fault.status(503))
    model = chain(provider, servers, mid_stream="raise")
    assert await aconsume(model, []) == SECONDARY_REPLY


def test_raise_survives_bind_tools(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    model = chain("openai", servers, mid_stream="raise")

    def capital(city: str) -> str:
        """The country whose capital is ``city``."""
        return city

    bound = model.bind_tools([capital])
    assert bound.bound.mid_stream == "raise"  # type: ignore[attr-defined]


# -- continue ----------------------------------------------------------------------------


def continuing(
    provider: str,
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    **options: Any,
) -> FallbackChatModel:
    """The primary (``provider``) and a ``ChatAnthropic`` fallback that would give the
    same answer, as two models asked the same question about a fact do."""
    primary, secondary = servers
    secondary.reply = PRIMARY_REPLY
    return FallbackChatModel(
        models=[member(provider, primary), member("anthropic", secondary)],
        mid_stream="continue",
        **options,
    )


def events_of(events: RestartEvents) -> list[tuple[int, int, int, bool]]:
    return [
        (e["failed_client"], e["next_client"], e["chunks"], e["continued"]) for e in events.events
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_continue_gives_a_plain_consumer_exactly_one_answer_through_chat_anthropic(
    provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    events = RestartEvents()
    received: list[str] = []
    assert consume(continuing(provider, servers), received, {"callbacks": [events]}) == (
        PRIMARY_REPLY
    )
    assert [piece for piece in received if piece][:4] == ["one", " two", " three", " four"]
    assert events_of(events) == [(0, 1, 3, True)]
    # The fallback was asked to continue, not to start over.
    assert [r.prefilled for r in secondary.requests] == [True]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_continue_gives_an_async_plain_consumer_exactly_one_answer(
    provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    events = RestartEvents()
    answer = await aconsume(continuing(provider, servers), [], {"callbacks": [events]})
    assert answer == PRIMARY_REPLY
    assert events_of(events) == [(0, 1, 3, True)]
    assert [r.prefilled for r in secondary.requests] == [True]


def test_continue_feeds_a_str_output_parser_one_coherent_answer(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, _ = servers
    primary.script(Fault.malformed_chunk(after_chunks=2))
    model = continuing("openai", servers)
    assert "".join((model | StrOutputParser()).stream("Capital of France?")) == PRIMARY_REPLY


def test_continue_restarts_with_the_event_on_a_fallback_that_takes_no_prefill(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    # ChatOpenAI is not known to take a prefill: the request starts over, announced.
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    events = RestartEvents()
    model = chain("anthropic", servers, mid_stream="continue")
    assert consume(model, [], {"callbacks": [events]}) == DELIVERED + SECONDARY_REPLY
    assert events_of(events) == [(0, 1, 3, False)]
    assert [r.prefilled for r in secondary.requests] == [False]


def test_a_declared_profile_switches_prefill_off_for_chat_anthropic(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    model = continuing(
        "openai", servers, member_profiles=[None, MemberProfile(assistant_prefill=False)]
    )
    assert consume(model, []) == DELIVERED + PRIMARY_REPLY
    assert [r.prefilled for r in secondary.requests] == [False]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_prefill_rejection_ends_in_a_complete_answer_via_restart_never_the_rejection(
    provider: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    secondary.default_fault = Fault.prefill_rejected()
    events = RestartEvents()
    model = continuing(provider, servers)
    answer = consume(model, [], {"callbacks": [events]})
    assert answer == DELIVERED + PRIMARY_REPLY
    assert events_of(events) == [(0, 1, 3, True), (1, 1, 3, False)]
    assert [r.prefilled for r in secondary.requests] == [True, False]
    # The chain remembers: the next cut goes straight to a restart on that member.
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    assert consume(model, []) == DELIVERED + PRIMARY_REPLY
    assert [r.prefilled for r in secondary.requests] == [True, False, False]


async def test_an_async_prefill_rejection_ends_in_a_complete_answer_via_restart(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    secondary.default_fault = Fault.prefill_rejected()
    events = RestartEvents()
    answer = await aconsume(continuing("openai", servers), [], {"callbacks": [events]})
    assert answer == DELIVERED + PRIMARY_REPLY
    assert events_of(events) == [(0, 1, 3, True), (1, 1, 3, False)]


# -- content filter ----------------------------------------------------------------------


@pytest.mark.parametrize("mid_stream", ["restart", "continue"])
def test_a_filtered_prompt_propagates_and_is_never_sent_to_the_fallback(
    mid_stream: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, secondary = servers
    model = chain("openai", servers, mid_stream=mid_stream)
    primary.script(Fault.content_filtered(prompt=True))
    with pytest.raises(openai.BadRequestError) as caught:
        model.invoke("Capital of France?")
    assert caught.value.code == "content_filter"
    primary.script(Fault.content_filtered(prompt=True))
    with pytest.raises(openai.BadRequestError):
        consume(model, [])
    assert secondary.requests == []


async def test_a_filtered_completion_ends_the_stream_as_the_provider_ended_it(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    primary.script(Fault.content_filtered(after_chunks=2))
    model = chain("openai", servers, mid_stream="continue")
    merged = None
    async for chunk in model.astream("Capital of France?"):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None
    assert merged.text == "one two"
    assert merged.response_metadata["finish_reason"] == "content_filter"
    assert merged.response_metadata["fallback_served_by"] == [0]
    assert secondary.requests == []
