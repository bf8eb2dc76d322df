"""ResilienceBuilder for LlamaIndex: an agent on the built stack.

The documented stack and its call order, for both adapters: tests/behaviour/test_builder.py.
"""

from __future__ import annotations

from pathlib import Path

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.tools import FunctionTool
from llama_index.resilience import ResilienceBuilder
from llama_index.resilience.testing import FakeFunctionCallingLLM, rate_limit_error

from llm_resilience import CostBudget

BUDGET = CostBudget(input_price_per_mtok=3, output_price_per_mtok=15, daily_limit=25)


async def test_the_built_llm_drives_a_function_agent_with_tools(tmp_path: Path) -> None:
    multiplied: list[tuple[int, int]] = []

    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        multiplied.append((a, b))
        return a * b

    call = ToolSelection(tool_id="call_1", tool_name="multiply", tool_kwargs={"a": 6, "b": 7})
    primary = FakeFunctionCallingLLM(tool_call=call, error=rate_limit_error())
    secondary = FakeFunctionCallingLLM(
        model_name="secondary", tool_call=call, text="6 times 7 is 42."
    )
    stack = (
        ResilienceBuilder()
        .use_fallback_chain([primary, secondary])
        .use_rate_limiting(chat_requests_per_minute=300)
        .use_sql_cost_ledger(f"sqlite:///{tmp_path / 'spend.db'}")
        .use_cost_budgeting(BUDGET)
        .build()
    )
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn=multiply)], llm=stack.chat)

    result = await agent.run("What is 6 times 7?")

    assert multiplied == [(6, 7)]
    assert result.response.content == "6 times 7 is 42."
    ledger = stack.chat.ledger
    # The agent asked the LLM twice (the tool call, then the answer): two entries.
    assert [entry.model for entry in ledger.entries()] == ["secondary", "secondary"]
    ledger.close()
