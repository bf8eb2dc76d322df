"""ResilienceBuilder for LangChain: an agent on the built stack.

The documented stack and its call order, for both adapters: tests/behaviour/test_builder.py.
"""

from __future__ import annotations

from pathlib import Path

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

from langchain_llm_resilience import ResilienceBuilder
from langchain_llm_resilience.testing import FailingChatModel, ScriptedChatModel
from llm_resilience import CostBudget

BUDGET = CostBudget(input_price_per_mtok=3, output_price_per_mtok=15, daily_limit=25)


def test_the_built_chat_model_drives_create_agent_with_tools(tmp_path: Path) -> None:
    from langchain.agents import create_agent

    @tool
    def magic_function(input: int) -> int:
        """Apply a magic function to an input."""
        return input + 2

    stack = (
        ResilienceBuilder()
        .use_fallback_chain([FailingChatModel(), ScriptedChatModel(model="secondary")])
        .use_rate_limiting(chat_requests_per_minute=300)
        .use_sql_cost_ledger(f"sqlite:///{tmp_path / 'spend.db'}")
        .use_cost_budgeting(BUDGET)
        .build()
    )
    agent = create_agent(model=stack.chat, tools=[magic_function])

    result = agent.invoke({"messages": [HumanMessage("What is the value of magic_function(3)?")]})

    assert [m.content for m in result["messages"] if m.type == "tool"] == ["5"]
    assert result["messages"][-1].type == "ai"
    ledger = stack.chat.gate.ledger
    # The agent asked the model twice (the tool call, then the answer): two entries.
    assert [entry.model for entry in ledger.entries()] == ["secondary", "secondary"]
    ledger.close()
