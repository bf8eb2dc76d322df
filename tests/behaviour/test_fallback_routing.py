"""Prompts too long and capability-aware order, through each framework's real ``OpenAI``
client.

Each member talks to its own fault-injecting server on 127.0.0.1, so a test can see which
member was asked. What the chain knows of a member comes from the framework's own
knowledge of the model (``gpt-4o-mini``/``gpt-4o``: 128k tokens, ``gpt-4.1-mini``: about
1M) or from ``member_profiles``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from driver import Mode

from llm_resilience import Cooldown
from llm_resilience.errors import NoCapableMemberError
from llm_resilience.fallback import MemberProfile
from llm_resilience.testing import Fault, FaultInjectingServer

PROMPT = "Summarise this very long document."
WEATHER = "What is the weather in Paris?"
NO_TOOLS = MemberProfile(tool_calling=False)


@pytest.fixture
def servers() -> Iterator[list[FaultInjectingServer]]:
    started = [FaultInjectingServer(reply=f"member {n} answered", name=f"m{n}") for n in range(3)]
    for server in started:
        server.start()
    yield started
    for server in started:
        server.stop()


def chain(driver: Any, servers: list[FaultInjectingServer], *models: str, **options: Any) -> Any:
    """A chain of real OpenAI clients, the n-th of model ``models[n]`` on ``servers[n]``."""
    return driver.fallback(
        [
            driver.openai_member(server, model)
            for server, model in zip(servers, models, strict=False)
        ],
        **options,
    )


def asked(servers: list[FaultInjectingServer]) -> list[int]:
    return [len(server.requests) for server in servers]


async def test_too_long_for_a_small_member_goes_to_a_larger_one_skipping_an_equal_one(
    driver: Any, mode: Mode, servers: list[FaultInjectingServer]
) -> None:
    servers[0].script(Fault.context_length_exceeded("openai", tokens=150_000, maximum=128_000))
    model = chain(driver, servers, "gpt-4o-mini", "gpt-4o", "gpt-4.1-mini")

    reply = await driver.run(model, mode, PROMPT)

    assert reply.text == "member 2 answered"
    assert driver.served_by(reply) == 2
    assert asked(servers) == [1, 0, 1]


async def test_too_long_for_the_largest_member_propagates_when_no_member_is_larger(
    driver: Any, mode: Mode, servers: list[FaultInjectingServer]
) -> None:
    servers[0].script(Fault.context_length_exceeded("openai", tokens=1_100_000, maximum=1_047_576))
    model = chain(driver, servers, "gpt-4.1-mini", "gpt-4o-mini")

    with pytest.raises(openai.BadRequestError, match="context length is 1047576 tokens"):
        await driver.run(model, mode, PROMPT)

    assert asked(servers) == [1, 0, 0]


async def test_a_declared_context_window_overrides_what_the_framework_knows(
    driver: Any, mode: Mode, servers: list[FaultInjectingServer]
) -> None:
    # A deployment capped below its model's published window (about 1M).
    servers[0].script(Fault.context_length_exceeded("openai", tokens=150_000, maximum=100_000))
    model = chain(
        driver,
        servers,
        "gpt-4.1-mini",
        "gpt-4o-mini",
        member_profiles=[MemberProfile(context_window=100_000), None],
    )

    reply = await driver.run(model, mode, PROMPT)

    assert reply.text == "member 1 answered"
    assert driver.served_by(reply) == 1
    assert asked(servers) == [1, 1, 0]


async def test_a_plain_bad_request_still_propagates_at_once(
    driver: Any, mode: Mode, servers: list[FaultInjectingServer]
) -> None:
    servers[0].script(Fault.status(400))
    model = chain(driver, servers, "gpt-4o-mini", "gpt-4.1-mini")

    with pytest.raises(openai.BadRequestError, match="Invalid request"):
        await driver.run(model, mode, PROMPT)

    assert asked(servers) == [1, 0, 0]


async def test_tools_skip_a_member_declared_without_tool_calling(
    driver: Any, mode: Mode, servers: list[FaultInjectingServer]
) -> None:
    model = chain(driver, servers, "gpt-4o-mini", "gpt-4.1-mini", member_profiles=[NO_TOOLS, None])

    reply, tools_called = await driver.run_with_tool(model, mode, WEATHER)

    assert tools_called == ["get_weather"]
    assert driver.served_by(reply) == 1
    assert asked(servers) == [0, 1, 0]


async def test_a_request_without_tools_still_uses_a_member_without_tool_calling(
    driver: Any, mode: Mode, servers: list[FaultInjectingServer]
) -> None:
    model = chain(driver, servers, "gpt-4o-mini", "gpt-4.1-mini", member_profiles=[NO_TOOLS, None])

    reply = await driver.run(model, mode, PROMPT)

    assert driver.served_by(reply) == 0
    assert asked(servers) == [1, 0, 0]


async def test_tools_with_no_capable_member_raise_before_any_call(
    driver: Any, mode: Mode, servers: list[FaultInjectingServer]
) -> None:
    model = chain(
        driver, servers, "gpt-4o-mini", "gpt-4.1-mini", member_profiles=[NO_TOOLS, NO_TOOLS]
    )

    with pytest.raises(NoCapableMemberError, match="member 1 lacks tool_calling"):
        await driver.run_with_tool(model, mode, WEATHER)

    assert asked(servers) == [0, 0, 0]


async def test_a_tool_request_is_sent_to_the_only_capable_member_while_it_cools_down(
    driver: Any, mode: Mode, servers: list[FaultInjectingServer]
) -> None:
    servers[1].script(Fault.status(503), Fault.status(503))
    model = chain(
        driver,
        servers,
        "gpt-4o-mini",
        "gpt-4.1-mini",
        member_profiles=[NO_TOOLS, None],
        cooldown=Cooldown(failures=2, window=60, duration=60),
    )
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            await driver.run_with_tool(model, mode, WEATHER)
    assert [member.state for member in model.health()] == ["closed", "open"]

    reply, tools_called = await driver.run_with_tool(model, mode, WEATHER)

    assert tools_called == ["get_weather"]
    assert driver.served_by(reply) == 1
    assert asked(servers) == [0, 3, 0]
    assert [member.state for member in model.health()] == ["closed", "closed"]


def test_member_profiles_of_the_wrong_length_are_refused_naming_the_option(
    driver: Any, servers: list[FaultInjectingServer]
) -> None:
    members = [driver.openai_member(servers[0]), driver.openai_member(servers[1], "gpt-4.1-mini")]

    with pytest.raises(ValueError, match=r"member_profiles must hold one MemberProfile"):
        driver.fallback(members, member_profiles=[MemberProfile()])
