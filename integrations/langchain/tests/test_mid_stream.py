"""``mid_stream=`` with ``ChatAnthropic``, the fallback LangChain knows to take a prefill.

What both adapters share (restart, raise, continue through a fallback declared to take a
prefill, prefill rejection, content filters) is proven over OpenAI members in
``tests/behaviour/test_mid_stream.py``. Here: ``"continue"`` through a ``ChatAnthropic``
fallback with no declaration, a declaration switching that off, Anthropic's rejection of
a prefill, a ``StrOutputParser`` downstream and ``bind_tools``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessageChunk
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI

from langchain_llm_resilience import FallbackChatModel
from langchain_llm_resilience.testing import RestartEvents
from llm_resilience import MemberProfile
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


# -- restart (the default) ---------------------------------------------------------------


# -- raise -------------------------------------------------------------------------------


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


# -- content filter ----------------------------------------------------------------------
