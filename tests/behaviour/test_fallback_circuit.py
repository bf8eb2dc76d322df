"""A chain's circuit is one memory, whatever variant of the chain a request goes through.

LangChain's ``bind_tools`` and ``with_structured_output`` make a new chat model for each
binding (``create_agent`` binds its tools again at every step); LlamaIndex's tool calls,
structured LLM and agents call the chain itself. Either way, the failures one request
meets open the breaker for the next, and ``health()`` of the chain the user built shows it.
"""

from __future__ import annotations

from typing import Any

from driver import Mode
from fallback_driver import Capital

from llm_resilience import Cooldown

WEATHER = "What is the weather in Paris?"
#: Three transient failures within a minute skip a member for a minute.
THREE_STRIKES = Cooldown(failures=3, window=60, duration=60)


async def test_requests_with_tools_bound_each_time_share_the_chains_cooldown(
    driver: Any, mode: Mode
) -> None:
    primary, secondary = driver.failing(), driver.answering("Sunny.")
    chain = driver.fallback([primary, secondary], cooldown=THREE_STRIKES, per_client_timeout=30)

    for _ in range(6):
        reply, _ = await driver.run_with_tool(chain, mode, WEATHER)
        assert driver.served_by(reply) == 1

    assert (driver.calls(primary), driver.calls(secondary)) == (3, 6)
    first, second = chain.health()
    assert (first.state, second.state) == ("open", "closed")
    assert 59 < first.retry_in <= 60
    assert chain.per_client_timeout == 30.0
    # The chain itself, asked without tools, skips the primary the bound requests opened.
    reply = await driver.run(chain, mode)
    assert driver.served_by(reply) == 1
    assert driver.calls(primary) == 3


async def test_structured_output_requests_share_the_chains_cooldown(
    driver: Any, mode: Mode
) -> None:
    primary = driver.failing()
    chain = driver.fallback([primary, driver.structured_member()], cooldown=THREE_STRIKES)

    for _ in range(6):
        assert isinstance(await driver.run_structured(chain, mode, WEATHER), Capital)

    assert driver.calls(primary) == 3
    assert [member.state for member in chain.health()] == ["open", "closed"]


async def test_an_agent_skips_the_primary_at_its_second_step_once_the_first_opened_it(
    driver: Any, mode: Mode
) -> None:
    ran: list[int] = []

    def magic_function(input: int) -> int:
        """Apply a magic function to an input."""
        ran.append(input)
        return input + 2

    primary = driver.failing()
    secondary = driver.tool_calling("magic_function", {"input": 3}, "It is 5.")
    chain = driver.fallback([primary, secondary], cooldown=Cooldown(failures=1, duration=60))

    await driver.run_agent(chain, mode, "What is the value of magic_function(3)?", magic_function)

    # Step one: the primary fails, its breaker opens, the secondary calls the tool.
    # Step two (after the tool's result): the primary is skipped, the secondary answers.
    assert ran == [3]
    assert (driver.calls(primary), driver.calls(secondary)) == (1, 2)
    assert chain.health()[0].state == "open"
