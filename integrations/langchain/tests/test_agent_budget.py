"""BudgetMiddleware: a spend limit per agent run or thread, every model call charged once.

``create_agent`` with tools over the shipped fakes and over the fault-injecting server
with real ``ChatOpenAI``/``ChatAnthropic``; each case through ``invoke`` and ``ainvoke``.
Prices are high (1000 per million tokens) so a handful of fake tokens is real money.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ModelRetryMiddleware, SummarizationMiddleware
from langchain_anthropic import ChatAnthropic
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import interrupt

from langchain_llm_resilience import DOWNGRADE_EVENT, BudgetMiddleware, FallbackChatModel
from langchain_llm_resilience.testing import (
    FailingChatModel,
    ScriptedChatModel,
    rate_limit_error,
)
from llm_resilience import BudgetExceededError, CostBudget, InMemoryCostLedger, ModelPrice
from llm_resilience.testing import Fault, FaultInjectingServer

QUESTION = "What is the weather in Paris?"


def _budget(*, strict: bool, **prices: ModelPrice) -> CostBudget:
    return CostBudget(1000, 1000, monthly_limit=1000, strict=strict, prices=prices or None)


class LoopingModel(ScriptedChatModel):
    """Calls the weather tool on every turn: a run that only its budget ends."""

    def _answer(self, messages: list[BaseMessage], stop: list[str] | None, **kwargs: Any) -> Any:
        asked = [m for m in messages if not isinstance(m, ToolMessage)]
        return super()._answer(asked, stop, **kwargs)


@tool
def weather(city: str) -> str:
    """Get the weather for a city."""
    return f"sunny in {city}"


class Invoke:
    """Runs an agent through ``invoke`` (``mode="sync"``) or ``ainvoke``."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    @property
    def sync(self) -> bool:
        return self.mode == "sync"

    def __call__(self, agent: Any, inputs: Any, config: Any = None, **kwargs: Any) -> Any:
        if self.sync:
            return agent.invoke(inputs, config, **kwargs)
        return asyncio.run(agent.ainvoke(inputs, config, **kwargs))


@pytest.fixture(params=["sync", "async"])
def invoke(request: pytest.FixtureRequest) -> Invoke:
    return Invoke(request.param)


@pytest.fixture(params=["sync", "async"])
def stream(request: pytest.FixtureRequest) -> Callable[..., list[Any]]:
    """Streams an agent (``stream`` or ``astream``) and returns every part."""

    def run(agent: Any, inputs: Any, config: Any = None, **kwargs: Any) -> list[Any]:
        if request.param == "sync":
            return list(agent.stream(inputs, config, **kwargs))

        async def collect() -> list[Any]:
            return [part async for part in agent.astream(inputs, config, **kwargs)]

        return asyncio.run(collect())

    return run


def _ask(text: str = QUESTION) -> dict[str, Any]:
    return {"messages": [("user", text)]}


def _total(ledger: Any) -> Decimal:
    return sum((entry.cost for entry in ledger.entries()), Decimal(0))


# -- the run's limit -------------------------------------------------------------------


def test_a_strict_run_stops_at_its_budget_and_never_spends_past_it(invoke: Invoke) -> None:
    ledger = InMemoryCostLedger()
    model = LoopingModel(model="looping", max_tokens=20)
    middleware = BudgetMiddleware(_budget(strict=True), ledger, limit="0.2")
    agent = create_agent(model, tools=[weather], middleware=[middleware])

    result = invoke(agent, _ask())

    final = result["messages"][-1]
    assert isinstance(final, AIMessage)
    assert not final.tool_calls
    assert "budget is spent" in final.text
    entries = ledger.entries()
    assert _total(ledger) <= Decimal("0.2")
    # Every call the provider answered is in the ledger, once; the refused one never ran.
    assert len(entries) == model.calls >= 3
    assert len({entry.run_id for entry in entries}) == 1
    assert entries[0].run_id is not None


def test_a_default_run_passes_its_budget_by_at_most_the_call_in_flight(invoke: Invoke) -> None:
    ledger = InMemoryCostLedger()
    model = LoopingModel(model="looping", max_tokens=20)
    agent = create_agent(
        model,
        tools=[weather],
        middleware=[BudgetMiddleware(_budget(strict=False), ledger, limit="0.2")],
    )

    result = invoke(agent, _ask())

    assert "budget is spent" in result["messages"][-1].text
    costs = [entry.cost for entry in ledger.entries()]
    assert sum(costs[:-1], Decimal(0)) < Decimal("0.2") <= sum(costs, Decimal(0))
    assert len(costs) == model.calls


def test_exit_behavior_error_raises_budget_exceeded_naming_the_run(invoke: Invoke) -> None:
    ledger = InMemoryCostLedger()
    agent = create_agent(
        LoopingModel(model="looping", max_tokens=20),
        tools=[weather],
        middleware=[
            BudgetMiddleware(_budget(strict=True), ledger, limit="0.2", exit_behavior="error")
        ],
    )

    with pytest.raises(BudgetExceededError) as raised:
        invoke(agent, _ask())

    assert raised.value.window == "run"
    assert raised.value.limit == Decimal("0.2")
    assert raised.value.scope == ledger.entries()[0].run_id
    assert _total(ledger) <= Decimal("0.2")


def test_the_run_id_a_config_gives_names_every_entry(invoke: Invoke) -> None:
    ledger = InMemoryCostLedger()
    agent = create_agent(
        ScriptedChatModel(model="scripted"),
        tools=[weather],
        middleware=[BudgetMiddleware(_budget(strict=False), ledger, limit=5)],
    )
    run_id = "0b5d1f8e-4a9c-4f0e-9f55-2d1c3b4a5e6f"

    invoke(agent, _ask(), {"run_id": run_id})

    assert [entry.run_id for entry in ledger.entries()] == [run_id, run_id]


# -- a thread's limit, across invocations and processes ---------------------------------


def test_a_thread_budget_counts_every_invocation_of_the_thread(invoke: Invoke) -> None:
    ledger = InMemoryCostLedger()
    model = ScriptedChatModel(model="scripted")
    middleware = BudgetMiddleware(_budget(strict=False), ledger, per="thread", limit="0.05")
    agent = create_agent(
        model, tools=[weather], middleware=[middleware], checkpointer=InMemorySaver()
    )
    config = {"configurable": {"thread_id": "thread-1"}}

    first = invoke(agent, _ask(), config)
    assert "budget is spent" not in first["messages"][-1].text
    spent_first = _total(ledger)
    assert Decimal(0) < spent_first < Decimal("0.05")

    second = invoke(agent, _ask("And the weather in Rome?"), config)

    # The second run started from the first's total and stopped at the thread's limit.
    assert "budget is spent" in second["messages"][-1].text
    assert {entry.thread_id for entry in ledger.entries()} == {"thread-1"}
    assert len({entry.run_id for entry in ledger.entries()}) == 2
    other = invoke(agent, _ask(), {"configurable": {"thread_id": "thread-2"}})
    assert "budget is spent" not in other["messages"][-1].text


def test_a_thread_total_survives_a_new_process_through_a_sqlite_ledger(
    invoke: Invoke, tmp_path: Path
) -> None:
    from llm_resilience import SqlCostLedger

    url = f"sqlite:///{tmp_path / 'spend.db'}"
    config = {"configurable": {"thread_id": "thread-1"}}

    def agent() -> Any:  # what a fresh process builds: nothing in memory but the file
        middleware = BudgetMiddleware(
            _budget(strict=True), SqlCostLedger(url), per="thread", limit="0.06"
        )
        return create_agent(
            ScriptedChatModel(model="scripted", max_tokens=10),
            tools=[weather],
            middleware=[middleware],
            checkpointer=InMemorySaver(),
        )

    first = invoke(agent(), _ask(), config)
    assert "budget is spent" not in first["messages"][-1].text
    second = invoke(agent(), _ask(), config)

    assert "budget is spent" in second["messages"][-1].text
    stored = SqlCostLedger(url).entries()
    assert {entry.thread_id for entry in stored} == {"thread-1"}
    assert sum((entry.cost for entry in stored), Decimal(0)) <= Decimal("0.06")


# -- calls made outside the model node --------------------------------------------------


def test_a_subagents_calls_inside_a_tool_are_charged_to_the_parents_run(invoke: Invoke) -> None:
    ledger = InMemoryCostLedger()
    sub_model = ScriptedChatModel(model="sub-model")
    subagent = create_agent(sub_model, tools=[])

    @tool
    def research(topic: str) -> str:
        """Research the weather for a topic with a subagent."""
        return str(subagent.invoke({"messages": [("user", topic)]})["messages"][-1].text)

    @tool
    async def aresearch(topic: str) -> str:
        """Research the weather for a topic with a subagent."""
        answer = await subagent.ainvoke({"messages": [("user", topic)]})
        return str(answer["messages"][-1].text)

    model = ScriptedChatModel(model="main-model")
    agent = create_agent(
        model,
        tools=[research if invoke.sync else aresearch],
        middleware=[BudgetMiddleware(_budget(strict=True), ledger, limit=5)],
    )

    invoke(agent, _ask("Research the weather"))

    entries = ledger.entries()
    assert sorted(entry.model for entry in entries) == ["main-model", "main-model", "sub-model"]
    assert len({entry.run_id for entry in entries}) == 1
    assert (model.calls, sub_model.calls) == (2, 1)


def test_a_tool_that_calls_a_chat_model_is_charged_to_the_run(invoke: Invoke) -> None:
    ledger = InMemoryCostLedger()
    helper = ScriptedChatModel(model="helper-model")

    @tool
    def forecast(city: str) -> str:
        """Get the weather forecast for a city."""
        return helper.invoke(f"Forecast for {city}").text

    @tool
    async def aforecast(city: str) -> str:
        """Get the weather forecast for a city."""
        return (await helper.ainvoke(f"Forecast for {city}")).text

    agent = create_agent(
        ScriptedChatModel(model="main-model"),
        tools=[forecast if invoke.sync else aforecast],
        middleware=[BudgetMiddleware(_budget(strict=False), ledger, limit=5)],
    )

    invoke(agent, _ask("What is the weather forecast in Paris?"))

    entries = ledger.entries()
    assert [entry.model for entry in entries].count("helper-model") == 1
    assert len(entries) == 3
    assert len({entry.run_id for entry in entries}) == 1


def test_a_summarization_middlewares_call_is_charged_to_the_run(invoke: Invoke) -> None:
    ledger = InMemoryCostLedger()
    summarizer = ScriptedChatModel(model="summarizer", responses=["A short summary."])
    agent = create_agent(
        ScriptedChatModel(model="main-model"),
        tools=[weather],
        middleware=[
            SummarizationMiddleware(summarizer, trigger=("messages", 3), keep=("messages", 1)),
            BudgetMiddleware(_budget(strict=True), ledger, limit=5),
        ],
    )

    invoke(agent, _ask())

    entries = ledger.entries()
    assert summarizer.calls == 1
    assert [entry.model for entry in entries].count("summarizer") == 1
    assert len({entry.run_id for entry in entries}) == 1


def test_a_refused_side_call_raises_where_it_is_made(invoke: Invoke) -> None:
    ledger = InMemoryCostLedger()
    # No output cap: its worst case is the default cap's, far past what is left.
    helper = ScriptedChatModel(model="helper-model")

    @tool
    def forecast(city: str) -> str:
        """Get the weather forecast for a city."""
        return helper.invoke(f"Forecast for {city}").text

    @tool
    async def aforecast(city: str) -> str:
        """Get the weather forecast for a city."""
        return (await helper.ainvoke(f"Forecast for {city}")).text

    agent = create_agent(
        ScriptedChatModel(model="main-model", max_tokens=20),
        tools=[forecast if invoke.sync else aforecast],
        middleware=[BudgetMiddleware(_budget(strict=True), ledger, limit="0.5")],
    )

    with pytest.raises(BudgetExceededError):
        invoke(agent, _ask("What is the weather forecast in Paris?"))
    assert helper.calls == 0
    assert _total(ledger) <= Decimal("0.5")


# -- retries and fallbacks: each billed attempt once ------------------------------------


class FlakyModel(ScriptedChatModel):
    """Fails its first call with a 429, then answers."""

    def _answer(self, messages: list[BaseMessage], stop: list[str] | None, **kwargs: Any) -> Any:
        if self.calls == 0:
            self._faults.count()
            raise rate_limit_error()
        return super()._answer(messages, stop, **kwargs)


def test_a_retry_middlewares_attempts_are_each_charged_once(invoke: Invoke) -> None:
    ledger = InMemoryCostLedger()
    model = FlakyModel(model="flaky")
    agent = create_agent(
        model,
        tools=[weather],
        middleware=[
            ModelRetryMiddleware(max_retries=2, initial_delay=0, jitter=False),
            BudgetMiddleware(_budget(strict=True), ledger, limit=5),
        ],
    )

    invoke(agent, _ask())

    # Three requests: the 429 (billed nothing, its hold released) and two answers.
    assert model.calls == 3
    assert [entry.model for entry in ledger.entries()] == ["flaky", "flaky"]


def test_a_fallback_chains_served_member_is_charged_once_per_turn(invoke: Invoke) -> None:
    ledger = InMemoryCostLedger()
    failing = FailingChatModel()
    served = ScriptedChatModel(model="secondary")
    agent = create_agent(
        FallbackChatModel(models=[failing, served]),
        tools=[weather],
        middleware=[BudgetMiddleware(_budget(strict=True), ledger, limit=5)],
    )

    invoke(agent, _ask())

    assert (failing.calls, served.calls) == (2, 2)
    assert [entry.model for entry in ledger.entries()] == ["secondary", "secondary"]


# -- downgrade and the remaining budget -------------------------------------------------


def test_below_the_threshold_the_run_downgrades_and_says_so_in_the_stream(
    stream: Callable[..., list[Any]],
) -> None:
    ledger = InMemoryCostLedger()
    cheap = ScriptedChatModel(model="cheap")
    budget = _budget(strict=False, cheap=ModelPrice(1, 1))
    agent = create_agent(
        ScriptedChatModel(model="dear"),
        tools=[weather],
        middleware=[
            BudgetMiddleware(budget, ledger, limit=1, downgrade_to=cheap, downgrade_below="0.99")
        ],
    )

    parts = stream(agent, _ask(), stream_mode=["custom", "updates"])

    events = [data for mode, data in parts if mode == "custom"]
    assert [event["type"] for event in events] == [DOWNGRADE_EVENT]
    event = events[0]
    assert (event["asked_model"], event["model"], event["reason"]) == (
        "dear",
        "cheap",
        "below_threshold",
    )
    assert Decimal(event["estimate"]) > 0
    assert Decimal(event["remaining"]) < Decimal("0.99")
    # The first call at the dear model spent enough to pass the threshold; then cheap.
    assert [entry.model for entry in ledger.entries()] == ["dear", "cheap"]


def test_strict_downgrades_when_the_next_calls_worst_case_does_not_fit(invoke: Invoke) -> None:
    ledger = InMemoryCostLedger()
    cheap = ScriptedChatModel(model="cheap", max_tokens=20)
    budget = _budget(strict=True, cheap=ModelPrice(1, 1))
    agent = create_agent(
        ScriptedChatModel(model="dear", max_tokens=2000),
        tools=[weather],
        middleware=[BudgetMiddleware(budget, ledger, limit="0.5", downgrade_to=cheap)],
    )

    result = invoke(agent, _ask())

    assert "budget is spent" not in result["messages"][-1].text
    assert {entry.model for entry in ledger.entries()} == {"cheap"}


class _Prompts(BaseCallbackHandler):
    def __init__(self) -> None:
        self.systems: list[str] = []

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self.systems += [m.text for m in messages[0] if m.type == "system"]


@pytest.mark.parametrize("show", [True, False])
def test_the_remaining_budget_is_shown_to_the_model_only_on_request(
    invoke: Invoke, show: bool
) -> None:
    prompts = _Prompts()
    agent = create_agent(
        ScriptedChatModel(model="scripted"),
        tools=[weather],
        system_prompt="You are terse.",
        middleware=[
            BudgetMiddleware(
                _budget(strict=False), InMemoryCostLedger(), limit=2, show_remaining=show
            )
        ],
    )

    invoke(agent, _ask(), {"callbacks": [prompts]})

    if show:
        assert prompts.systems[0] == "You are terse.\n\nBudget left for this run: 2."
        assert prompts.systems[1].startswith("You are terse.\n\nBudget left for this run: 1.9")
    else:
        assert prompts.systems == ["You are terse.", "You are terse."]


# -- the face ----------------------------------------------------------------------------


def test_the_constructor_refuses_a_misspelled_keyword_and_bad_values() -> None:
    budget = _budget(strict=False)
    with pytest.raises(TypeError, match="did you mean 'exit_behavior'"):
        BudgetMiddleware(budget, exit_behaviour="end")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="exit_behavior must be 'end' or 'error'"):
        BudgetMiddleware(budget, exit_behavior="stop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="per must be 'run' or 'thread'"):
        BudgetMiddleware(budget, per="day")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="downgrade_to must be a LangChain chat model"):
        BudgetMiddleware(budget, downgrade_to="gpt-4o-mini")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="downgrade_below needs downgrade_to"):
        BudgetMiddleware(budget, downgrade_below=1)
    with pytest.raises(TypeError, match="budget must be a CostBudget"):
        BudgetMiddleware({"daily_limit": 1})  # type: ignore[arg-type]


def test_a_middlewares_name_is_its_own_and_settable() -> None:
    budget = _budget(strict=False)
    assert BudgetMiddleware(budget).name == "BudgetMiddleware"
    assert BudgetMiddleware(budget, name="tenant-budget").name == "tenant-budget"


def test_a_tenant_scope_is_read_from_the_runtime_context(invoke: Invoke) -> None:
    ledger = InMemoryCostLedger()
    agent = create_agent(
        ScriptedChatModel(model="scripted"),
        tools=[weather],
        context_schema=dict,
        middleware=[
            BudgetMiddleware(
                _budget(strict=False),
                ledger,
                limit=5,
                scope=lambda runtime: runtime.context["tenant"],
            )
        ],
    )

    invoke(agent, _ask(), context={"tenant": "acme"})

    assert {entry.scope for entry in ledger.entries()} == {"acme"}


def test_calls_outside_any_budgeted_run_are_not_charged() -> None:
    ledger = InMemoryCostLedger()
    BudgetMiddleware(_budget(strict=True), ledger, limit="0.000001")
    plain = create_agent(ScriptedChatModel(model="scripted"), tools=[weather])

    plain.invoke(_ask())
    ScriptedChatModel().invoke("Hello")

    assert ledger.entries() == []


# -- real SDK clients over the fault-injecting server ------------------------------------


@pytest.fixture
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply="It is sunny in Paris today.") as running:
        yield running


@pytest.fixture(params=["openai", "anthropic"])
def real_model(request: pytest.FixtureRequest, server: FaultInjectingServer) -> Any:
    if request.param == "openai":
        return ChatOpenAI(
            model="gpt-4o-mini",
            base_url=server.openai_base_url,
            api_key="test",  # type: ignore[arg-type]
            max_retries=0,
            timeout=10,
            max_tokens=50,  # type: ignore[call-arg]
        )
    return ChatAnthropic(
        model_name="claude-haiku-4-5",
        base_url=server.anthropic_base_url,
        api_key="test",  # type: ignore[arg-type]
        max_retries=0,
        timeout=10,
        max_tokens=50,  # type: ignore[call-arg]
        stop=None,
    )


def test_a_real_clients_run_stops_at_its_strict_budget_with_reported_usage(
    real_model: Any, invoke: Invoke, server: FaultInjectingServer
) -> None:
    ledger = InMemoryCostLedger()
    first = ledger_cost_of_one_turn(real_model)
    before = len(server.requests)
    # Room for the tool-calling turn, not for the second turn's worst case.
    agent = create_agent(
        real_model,
        tools=[weather],
        middleware=[BudgetMiddleware(_budget(strict=True), ledger, limit=first + Decimal("0.06"))],
        checkpointer=InMemorySaver(),
    )

    result = invoke(agent, _ask(), {"configurable": {"thread_id": "t-real"}})

    assert "budget is spent" in result["messages"][-1].text
    entries = ledger.entries()
    assert len(entries) == 1
    assert not entries[0].estimated
    assert entries[0].thread_id == "t-real"
    assert entries[0].run_id is not None
    assert len(server.requests) == before + 1  # the refused turn was never sent


def ledger_cost_of_one_turn(model: Any) -> Decimal:
    """What the tool-calling turn costs at the test's prices (one unbudgeted call)."""
    answer = model.bind_tools([weather]).invoke(QUESTION)
    usage = answer.usage_metadata
    return Decimal(usage["input_tokens"] + usage["output_tokens"]) * 1000 / 1_000_000


def test_a_real_clients_stream_cut_after_tokens_charges_what_it_delivered(
    real_model: Any, stream: Callable[..., list[Any]], server: FaultInjectingServer
) -> None:
    ledger = InMemoryCostLedger()
    agent = create_agent(
        real_model,
        tools=[],
        middleware=[BudgetMiddleware(_budget(strict=True), ledger, limit=5)],
    )
    server.script(Fault.drop_mid_stream(after_chunks=3))

    with pytest.raises(Exception):  # noqa: B017 (the SDK's own error)
        stream(agent, _ask("Tell me something."), stream_mode="messages")

    entries = ledger.entries()
    assert len(entries) == 1
    assert entries[0].estimated
    assert entries[0].cost > 0


class InterruptingModel(ScriptedChatModel):
    """Asks a human (LangGraph's ``interrupt``) before answering."""

    def _answer(self, messages: list[BaseMessage], stop: list[str] | None, **kwargs: Any) -> Any:
        interrupt("approve the spend?")
        return super()._answer(messages, stop, **kwargs)


def test_an_interrupt_in_the_model_call_passes_through_and_records_nothing(invoke: Invoke) -> None:
    ledger = InMemoryCostLedger()
    middleware = BudgetMiddleware(_budget(strict=True), ledger, limit=5)
    agent = create_agent(
        InterruptingModel(model="asking", max_tokens=20),
        tools=[weather],
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )

    result = invoke(agent, _ask(), {"configurable": {"thread_id": "t-interrupt"}})

    assert [each.value for each in result["__interrupt__"]] == ["approve the spend?"]
    assert not any("budget is spent" in m.text for m in result["messages"])
    assert ledger.entries() == []
