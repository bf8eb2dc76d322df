"""Prompts too long and capability-aware order, through LlamaIndex's real ``OpenAI``.

Each member talks to its own fault-injecting server on 127.0.0.1, so a test can see which
member was asked. What the chain knows of a member comes from its LlamaIndex metadata
(``gpt-4o-mini``/``gpt-4o``: 128k tokens, ``gpt-4.1-mini``: about 1M) or from
``member_profiles``. (LlamaIndex's ``Anthropic`` does not run against the installed
anthropic 2.x SDK, so every member here is an ``OpenAI``; the Anthropic error shape is
covered through LangChain.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai import OpenAI
from llama_index.resilience import SERVED_BY_KEY, FallbackLLM

from llm_resilience.errors import NoCapableMemberError
from llm_resilience.fallback import MemberProfile
from llm_resilience.testing import Fault, FaultInjectingServer

SHAPES = ("chat", "achat", "stream_chat", "astream_chat")
MESSAGES = [ChatMessage(role=MessageRole.USER, content="Summarise this very long document.")]


def get_weather(city: str) -> str:
    """The weather in ``city``."""
    return f"sunny in {city}"


WEATHER = FunctionTool.from_defaults(fn=get_weather)


@pytest.fixture
def servers() -> Iterator[list[FaultInjectingServer]]:
    started = [FaultInjectingServer(reply=f"member {n} answered", name=f"m{n}") for n in range(3)]
    for server in started:
        server.start()
    yield started
    for server in started:
        server.stop()


def openai_member(server: FaultInjectingServer, model: str) -> OpenAI:
    return OpenAI(model=model, api_base=server.openai_base_url, api_key="test", max_retries=0)


def large_member(server: FaultInjectingServer) -> OpenAI:
    return openai_member(server, "gpt-4.1-mini")


async def call(shape: str, llm: FallbackLLM, **kwargs: Any) -> ChatResponse:
    """One chat call of ``shape``; a stream's last chunk, which holds the whole reply."""
    if shape == "chat":
        return llm.chat(MESSAGES, **kwargs)
    if shape == "achat":
        return await llm.achat(MESSAGES, **kwargs)
    if shape == "stream_chat":
        return list(llm.stream_chat(MESSAGES, **kwargs))[-1]
    return [chunk async for chunk in await llm.astream_chat(MESSAGES, **kwargs)][-1]


async def call_with_tools(shape: str, llm: FallbackLLM) -> ChatResponse:
    prompt = "What is the weather in Paris?"
    if shape == "chat":
        return llm.chat_with_tools([WEATHER], user_msg=prompt)
    if shape == "achat":
        return await llm.achat_with_tools([WEATHER], user_msg=prompt)
    if shape == "stream_chat":
        return list(llm.stream_chat_with_tools([WEATHER], user_msg=prompt))[-1]
    stream = await llm.astream_chat_with_tools([WEATHER], user_msg=prompt)
    return [chunk async for chunk in stream][-1]


def asked(servers: list[FaultInjectingServer]) -> list[int]:
    return [len(server.requests) for server in servers]


@pytest.mark.parametrize("shape", SHAPES)
async def test_too_long_for_a_small_member_goes_to_the_larger_one_skipping_an_equal_one(
    shape: str, servers: list[FaultInjectingServer]
) -> None:
    small, equal, large = servers
    small.script(Fault.context_length_exceeded("openai", tokens=150_000, maximum=128_000))
    llm = FallbackLLM(
        llms=[
            openai_member(small, "gpt-4o-mini"),
            openai_member(equal, "gpt-4o"),
            large_member(large),
        ]
    )

    response = await call(shape, llm)

    assert response.message.content == "member 2 answered"
    assert response.additional_kwargs[SERVED_BY_KEY] == [2]
    assert asked(servers) == [1, 0, 1]


@pytest.mark.parametrize("shape", SHAPES)
async def test_too_long_for_the_largest_member_propagates_when_no_member_is_larger(
    shape: str, servers: list[FaultInjectingServer]
) -> None:
    large, smaller, _ = servers
    large.script(Fault.context_length_exceeded("openai", tokens=1_100_000, maximum=1_047_576))
    llm = FallbackLLM(llms=[large_member(large), openai_member(smaller, "gpt-4o-mini")])

    with pytest.raises(openai.BadRequestError, match="context length is 1047576 tokens"):
        await call(shape, llm)

    assert asked(servers) == [1, 0, 0]


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_declared_context_window_overrides_the_metadata(
    shape: str, servers: list[FaultInjectingServer]
) -> None:
    # A deployment capped below its model's published window (metadata: about 1M).
    capped, larger, _ = servers
    capped.script(Fault.context_length_exceeded("openai", tokens=150_000, maximum=100_000))
    llm = FallbackLLM(
        llms=[openai_member(capped, "gpt-4.1-mini"), openai_member(larger, "gpt-4o-mini")],
        member_profiles=[MemberProfile(context_window=100_000), None],
    )

    response = await call(shape, llm)

    assert response.additional_kwargs[SERVED_BY_KEY] == [1]
    assert asked(servers) == [1, 1, 0]


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_plain_bad_request_still_propagates_at_once(
    shape: str, servers: list[FaultInjectingServer]
) -> None:
    small, large, _ = servers
    small.script(Fault.status(400))
    llm = FallbackLLM(llms=[openai_member(small, "gpt-4o-mini"), large_member(large)])

    with pytest.raises(openai.BadRequestError, match="Invalid request"):
        await call(shape, llm)

    assert asked(servers) == [1, 0, 0]


@pytest.mark.parametrize("shape", SHAPES)
async def test_tools_skip_a_member_declared_without_tool_calling(
    shape: str, servers: list[FaultInjectingServer]
) -> None:
    no_tools, with_tools, _ = servers
    llm = FallbackLLM(
        llms=[openai_member(no_tools, "gpt-4o-mini"), large_member(with_tools)],
        member_profiles=[MemberProfile(tool_calling=False), None],
    )

    response = await call_with_tools(shape, llm)

    assert [call.tool_name for call in llm.get_tool_calls_from_response(response)] == [
        "get_weather"
    ]
    assert asked(servers) == [0, 1, 0]


@pytest.mark.parametrize("shape", SHAPES)
async def test_tools_with_no_capable_member_raise_before_any_call(
    shape: str, servers: list[FaultInjectingServer]
) -> None:
    first, second, _ = servers
    llm = FallbackLLM(
        llms=[openai_member(first, "gpt-4o-mini"), large_member(second)],
        member_profiles=[MemberProfile(tool_calling=False), MemberProfile(tool_calling=False)],
    )

    with pytest.raises(NoCapableMemberError, match="member 1 lacks tool_calling"):
        await call_with_tools(shape, llm)

    assert asked(servers) == [0, 0, 0]


def test_member_profiles_of_the_wrong_length_are_refused_naming_the_option(
    servers: list[FaultInjectingServer],
) -> None:
    members = [openai_member(servers[0], "gpt-4o-mini"), large_member(servers[1])]
    with pytest.raises(ValueError, match=r"member_profiles must hold one MemberProfile"):
        FallbackLLM(llms=members, member_profiles=[MemberProfile()])
