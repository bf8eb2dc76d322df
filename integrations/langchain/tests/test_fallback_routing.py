"""Prompts too long and capability-aware order, through ``ChatAnthropic`` and LangChain's
model profiles (what both adapters share, over OpenAI members, is proven in
``tests/behaviour/test_fallback_routing.py``).

Each member talks to its own fault-injecting server on 127.0.0.1, so a test can see which
member was asked. What the chain knows of a member comes from the model's own LangChain
profile (``gpt-4o-mini``/``gpt-4o``: 128k tokens, ``claude-haiku-4-5``: 200k,
``gpt-4.1-mini``: about 1M; ``gpt-3.5-turbo``: no tool calling) or from ``member_profiles``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.exceptions import ContextOverflowError
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from langchain_llm_resilience import FallbackChatModel
from llm_resilience.errors import NoCapableMemberError
from llm_resilience.fallback import MemberProfile
from llm_resilience.testing import Fault, FaultInjectingServer

SHAPES = ("invoke", "ainvoke", "stream", "astream")
PROMPT = "Summarise this very long document."


@tool
def get_weather(city: str) -> str:
    """The weather in ``city``."""
    return f"sunny in {city}"


@pytest.fixture
def servers() -> Iterator[list[FaultInjectingServer]]:
    started = [FaultInjectingServer(reply=f"member {n} answered", name=f"m{n}") for n in range(3)]
    for server in started:
        server.start()
    yield started
    for server in started:
        server.stop()


def openai_member(server: FaultInjectingServer, model: str) -> ChatOpenAI:
    return ChatOpenAI(
        model=model,
        base_url=server.openai_base_url,
        api_key="test",  # type: ignore[arg-type]
        max_retries=0,
        timeout=10,
    )


def anthropic_member(
    server: FaultInjectingServer, model: str = "claude-haiku-4-5"
) -> ChatAnthropic:
    return ChatAnthropic(
        model_name=model,
        base_url=server.anthropic_base_url,
        api_key="test",  # type: ignore[arg-type]
        max_retries=0,
        timeout=10,
        stop=None,
    )


async def call(shape: str, model: Any, prompt: str = PROMPT) -> AIMessage | AIMessageChunk:
    """One call of ``shape``; a stream's chunks merged into one message."""
    if shape == "invoke":
        return model.invoke(prompt)  # type: ignore[no-any-return]
    if shape == "ainvoke":
        return await model.ainvoke(prompt)  # type: ignore[no-any-return]
    if shape == "stream":
        chunks = list(model.stream(prompt))
    else:
        chunks = [chunk async for chunk in model.astream(prompt)]
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    return merged  # type: ignore[no-any-return]


def asked(servers: list[FaultInjectingServer]) -> list[int]:
    return [len(server.requests) for server in servers]


@pytest.mark.parametrize("shape", SHAPES)
async def test_too_long_for_openai_goes_to_the_larger_anthropic_skipping_an_equal_one(
    shape: str, servers: list[FaultInjectingServer]
) -> None:
    small, equal, large = servers
    small.script(Fault.context_length_exceeded("openai", tokens=150_000, maximum=128_000))
    model = FallbackChatModel(
        models=[
            openai_member(small, "gpt-4o-mini"),
            openai_member(equal, "gpt-4o"),
            anthropic_member(large),
        ]
    )

    answer = await call(shape, model)

    assert answer.content == "member 2 answered"
    assert answer.response_metadata["fallback_served_by"] == [2]
    assert asked(servers) == [1, 0, 1]


@pytest.mark.parametrize("shape", SHAPES)
async def test_too_long_for_anthropic_propagates_when_no_member_is_larger(
    shape: str, servers: list[FaultInjectingServer]
) -> None:
    large, smaller, _ = servers
    large.script(Fault.context_length_exceeded("anthropic", tokens=210_000, maximum=200_000))
    model = FallbackChatModel(
        models=[anthropic_member(large), openai_member(smaller, "gpt-4o-mini")]
    )

    with pytest.raises(ContextOverflowError, match="prompt is too long: 210000 tokens"):
        await call(shape, model)

    assert asked(servers) == [1, 0, 0]


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_declared_context_window_routes_a_member_without_a_profile(
    shape: str, servers: list[FaultInjectingServer]
) -> None:
    deployment, larger, _ = servers
    deployment.script(Fault.context_length_exceeded("openai", tokens=40_000, maximum=32_000))
    unprofiled = openai_member(deployment, "my-azure-deployment")
    assert not unprofiled.profile
    model = FallbackChatModel(
        models=[unprofiled, openai_member(larger, "gpt-4o-mini")],
        member_profiles=[MemberProfile(context_window=32_000), None],
    )

    answer = await call(shape, model)

    assert answer.content == "member 1 answered"
    assert asked(servers) == [1, 1, 0]


async def test_a_plain_bad_request_is_not_taken_for_a_context_overflow(
    servers: list[FaultInjectingServer],
) -> None:
    shape = "invoke"  # every shape: tests/behaviour/test_fallback_routing.py
    small, large, _ = servers
    small.script(Fault.status(400))
    model = FallbackChatModel(models=[openai_member(small, "gpt-4o-mini"), anthropic_member(large)])

    with pytest.raises(openai.BadRequestError, match="Invalid request") as raised:
        await call(shape, model)

    assert not isinstance(raised.value, ContextOverflowError)
    assert asked(servers) == [1, 0, 0]


@pytest.mark.parametrize("shape", SHAPES)
async def test_bound_tools_skip_a_member_whose_profile_has_no_tool_calling(
    shape: str, servers: list[FaultInjectingServer]
) -> None:
    no_tools, with_tools, _ = servers
    model = FallbackChatModel(
        models=[openai_member(no_tools, "gpt-3.5-turbo"), anthropic_member(with_tools)]
    ).bind_tools([get_weather])

    answer = await call(shape, model, "What is the weather in Paris?")

    assert answer.tool_calls[0]["name"] == "get_weather"  # type: ignore[union-attr]
    assert answer.response_metadata["fallback_served_by"] == [1]
    assert asked(servers) == [0, 1, 0]


@pytest.mark.parametrize("shape", SHAPES)
async def test_bound_tools_with_no_capable_member_raise_before_any_call(
    shape: str, servers: list[FaultInjectingServer]
) -> None:
    first, second, _ = servers
    model = FallbackChatModel(
        models=[openai_member(first, "gpt-3.5-turbo"), anthropic_member(second)],
        member_profiles=[None, MemberProfile(tool_calling=False)],
    ).bind_tools([get_weather])

    with pytest.raises(NoCapableMemberError, match="member 0 lacks tool_calling"):
        await call(shape, model, "What is the weather in Paris?")

    assert asked(servers) == [0, 0, 0]


@pytest.mark.parametrize("shape", ["invoke", "ainvoke"])
async def test_structured_output_skips_a_member_whose_binding_it_cannot_take(
    shape: str, servers: list[FaultInjectingServer]
) -> None:
    # ChatOpenAI binds gpt-3.5-turbo's structured output as a tool (it has no JSON-schema
    # mode), and its profile rules tool calling out; ChatAnthropic's tool call is fine.
    class Weather(BaseModel):
        city: str

    plain, claude, _ = servers
    model = FallbackChatModel(
        models=[openai_member(plain, "gpt-3.5-turbo"), anthropic_member(claude)]
    ).with_structured_output(Weather)

    prompt = "What is the weather in Paris?"  # the server answers it with a tool call
    result = model.invoke(prompt) if shape == "invoke" else await model.ainvoke(prompt)

    assert isinstance(result, Weather)
    assert asked(servers) == [0, 1, 0]
