"""The three agent middlewares together, as a user stacks them: real ``ChatOpenAI`` failing
over to real ``ChatAnthropic`` on the fault-injecting server, under a strict run budget
kept in a SQLite file and a token limiter. What the issue's "done when" asks of them as
one: every billed attempt in the ledger once (the cut stream's partial included), the run
never past its strict limit, and a stream consumer able to drop the superseded attempt's
tokens. Sync and async."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import interrupt

from langchain_llm_resilience import BudgetMiddleware, FallbackMiddleware, RateLimitMiddleware
from langchain_llm_resilience.testing import ScriptedChatModel
from llm_resilience import (
    BudgetExceededError,
    CostBudget,
    InMemoryCostLedger,
    ModelPrice,
    SqlCostLedger,
)
from llm_resilience.testing import Fault, FaultInjectingServer


@tool
def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"It is sunny in {city}."


def _budget() -> CostBudget:
    # 1 per thousand tokens everywhere: a cut stream's estimate and an answer both cost > 0.
    price = ModelPrice(1000, 1000)
    return CostBudget(
        1000,
        1000,
        monthly_limit=1000,
        strict=True,
        prices={"gpt-4o-mini": price, "claude-haiku-4-5": price},
    )


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    with (
        FaultInjectingServer(reply="the primary answered", name="primary") as primary,
        FaultInjectingServer(reply="the secondary answered", name="secondary") as secondary,
    ):
        yield primary, secondary


def _agent(
    primary: FaultInjectingServer, secondary: FaultInjectingServer, ledger: Any, limit: str = "2"
) -> Any:
    openai = ChatOpenAI(
        model="gpt-4o-mini",
        base_url=primary.openai_base_url,
        api_key="test",  # type: ignore[arg-type]
        max_retries=0,
        timeout=10,
        max_tokens=60,  # type: ignore[call-arg]
        stream_usage=True,
    )
    anthropic = ChatAnthropic(
        model_name="claude-haiku-4-5",
        base_url=secondary.anthropic_base_url,
        api_key="test",  # type: ignore[arg-type]
        max_retries=0,
        timeout=10,
        max_tokens=60,  # type: ignore[call-arg]
        stop=None,
    )
    return create_agent(
        openai,
        tools=[weather],
        middleware=[
            FallbackMiddleware(anthropic, max_attempts_per_run=4),
            RateLimitMiddleware(tokens_per_minute=1_000_000, requests_per_minute=600),
            BudgetMiddleware(_budget(), ledger, limit=limit, exit_behavior="error"),
        ],
        checkpointer=InMemorySaver(),
    )


def _stream(agent: Any, mode: str, config: dict[str, Any]) -> list[Any]:
    payload = {"messages": [("user", "Tell me about Paris.")]}
    if mode == "stream":
        return list(agent.stream(payload, config, stream_mode=["messages", "custom"]))

    async def collect() -> list[Any]:
        return [p async for p in agent.astream(payload, config, stream_mode=["messages", "custom"])]

    return asyncio.run(collect())


def _kept(parts: list[Any]) -> tuple[str, set[str], list[dict[str, Any]]]:
    """The documented consumer: tokens by message id, a superseded attempt's dropped."""
    texts: dict[str, str] = {}
    superseded: set[str] = set()
    events: list[dict[str, Any]] = []
    for kind, part in parts:
        if kind == "custom" and part.get("type") == "llm_resilience.attempt":
            events.append(part)
            if part["kind"] == "superseded" and part["message_id"]:
                superseded.add(part["message_id"])
                texts.pop(part["message_id"], None)
        elif kind == "messages":
            message, _ = part
            if isinstance(message, AIMessageChunk) and message.id not in superseded:
                texts[message.id] = texts.get(message.id, "") + message.text
    return "".join(texts.values()), superseded, events


@pytest.mark.parametrize("mode", ["stream", "astream"])
def test_a_failover_mid_stream_is_charged_once_per_billed_attempt_and_marked_for_the_ui(
    servers: tuple[FaultInjectingServer, FaultInjectingServer], mode: str, tmp_path: Path
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=2))
    ledger = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
    agent = _agent(primary, secondary, ledger)
    config = {
        "configurable": {"thread_id": "t-1"},
        "run_id": "11111111-2222-3333-4444-555555555555",
    }

    kept, superseded, events = _kept(_stream(agent, mode, config))

    assert kept == "the secondary answered"
    assert len(superseded) == 1
    assert [e["kind"] for e in events] == ["started", "superseded", "started", "succeeded"]
    entries = ledger.entries()
    # The cut stream billed what it delivered (an estimate), the backup its reported usage.
    assert [(e.model, e.estimated) for e in entries] == [
        ("gpt-4o-mini", True),
        ("claude-haiku-4-5", False),
    ]
    assert {(e.run_id, e.thread_id) for e in entries} == {
        ("11111111-2222-3333-4444-555555555555", "t-1")
    }
    assert sum(e.cost for e in entries) <= Decimal(2)
    ledger.close()


@pytest.mark.parametrize("mode", ["stream", "astream"])
def test_a_strict_run_budget_refusal_is_never_failed_over_nor_sent(
    servers: tuple[FaultInjectingServer, FaultInjectingServer], mode: str, tmp_path: Path
) -> None:
    primary, secondary = servers
    ledger = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
    # A worst case of (prompt + 60 output tokens) thousandths cannot fit a limit of 0.01.
    agent = _agent(primary, secondary, ledger, limit="0.01")
    sent = len(primary.requests) + len(secondary.requests)

    with pytest.raises(BudgetExceededError) as refused:
        _stream(agent, mode, {"configurable": {"thread_id": "t-2"}})

    assert refused.value.window == "run"
    assert len(primary.requests) + len(secondary.requests) == sent
    assert ledger.entries() == []
    ledger.close()


class _Interrupting(ScriptedChatModel):
    """Asks a human (LangGraph's ``interrupt``) before answering."""

    def _answer(self, messages: list[BaseMessage], stop: list[str] | None, **kwargs: Any) -> Any:
        interrupt("approve?")
        return super()._answer(messages, stop, **kwargs)


@pytest.mark.parametrize(
    "stack",
    ["fallback", "ratelimit", "all three"],
)
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_an_interrupt_passes_through_every_middleware_untouched_and_is_never_failed_over(
    stack: str, mode: str
) -> None:
    backup = ScriptedChatModel(model="backup")
    middleware: list[Any] = []
    if stack in ("fallback", "all three"):
        middleware.append(FallbackMiddleware(backup))
    if stack in ("ratelimit", "all three"):
        middleware.append(RateLimitMiddleware(requests_per_minute=600))
    if stack == "all three":
        middleware.append(BudgetMiddleware(_budget(), InMemoryCostLedger(), limit="5"))
    agent = create_agent(
        _Interrupting(model="asking", max_tokens=20),
        tools=[weather],
        middleware=middleware,
        checkpointer=InMemorySaver(),
    )
    payload = {"messages": [("user", "Tell me about Paris.")]}
    config = {"configurable": {"thread_id": f"t-{stack}-{mode}"}}

    if mode == "invoke":
        result = agent.invoke(payload, config)
    else:
        result = asyncio.run(agent.ainvoke(payload, config))

    assert [each.value for each in result["__interrupt__"]] == ["approve?"]
    assert backup.calls == 0
