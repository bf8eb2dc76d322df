"""LlamaIndex agents under a run budget: ``RunBudgetLLM`` in FunctionAgent, ReActAgent and
AgentWorkflow runs.

Two kinds of model: the shipped fake (``llama_index.resilience.testing``), and LlamaIndex's
real ``OpenAI`` over HTTP to the fault-injecting server, which answers a request offering
tools whose user turn mentions the weather with a call of the first tool, then the text
reply once the tool's result is in. The agents are async (a workflow has no sync run);
the layer's sync ``chat``/``stream_chat`` are tested inside a run (a sync tool's side
call) and on their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent, ReActAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.llms.llm import ToolSelection
from llama_index.resilience import (
    FallbackLLM,
    RateLimitedLLM,
    RunBudgetDowngradeEvent,
    RunBudgetLLM,
    RunBudgetSpentEvent,
    agent_thread,
)
from llama_index.resilience.agents import RUN_ID_TAG
from llama_index.resilience.testing import FakeFunctionCallingLLM, rate_limit_error

from llm_resilience import (
    BudgetExceededError,
    CostBudget,
    ModelPrice,
    RequestExceedsCapacityError,
)
from llm_resilience.budget import ServingModel
from llm_resilience.ledger import CostLedger, InMemoryCostLedger, SqlCostLedger
from llm_resilience.runs import RunBudget
from llm_resilience.runs.ending import spent_message
from llm_resilience.testing import Fault, FaultInjectingServer

openai_llms = pytest.importorskip("llama_index.llms.openai")

QUESTION = "What is the weather in Paris?"
TOOL_ANSWER = "It is sunny in Paris today."
SERVER_REPLY = "Sunny and warm in Paris."
# One unit per token for the big models, a tenth for the small ones: costs read as counts.
PRICES = {
    "big": ModelPrice(1_000_000, 1_000_000),
    "mid": ModelPrice(500_000, 500_000),
    "small": ModelPrice(100_000, 100_000),
    "gpt-4o": ModelPrice(1_000_000, 1_000_000),
    "gpt-4o-mini": ModelPrice(100_000, 100_000),
}
CAP = 10  # every model's output cap (the fakes' num_output, OpenAI's max_tokens)


def budget(strict: bool = True) -> CostBudget:
    # A window far above any run: the run's own limit is what stops it.
    return CostBudget(prices=PRICES, global_monthly_limit=10**9, strict=strict)


def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def fake(name: str = "big", **options: Any) -> FakeFunctionCallingLLM:
    """A fake that calls ``weather`` once, then answers."""
    return FakeFunctionCallingLLM(
        model_name=name,
        text=TOOL_ANSWER,
        num_output=CAP,
        tool_call=ToolSelection(tool_id="call-1", tool_name="weather", tool_kwargs={"city": "x"}),
        **options,
    )


def first_worst_case(model: str = "big") -> Decimal:
    """The strict hold of a run's first attempt: the question, at the model's cap."""
    return (
        RunBudget(budget(), InMemoryCostLedger())
        .open("probe")
        .estimate(
            model=model,
            prompt=[("user", QUESTION)],
            max_output_tokens=None,
            may_serve=[ServingModel(model, CAP)],
        )
    )


class Collected(BaseEventHandler):
    events: list[BaseEvent] = []

    @classmethod
    def class_name(cls) -> str:
        return "Collected"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, RunBudgetDowngradeEvent | RunBudgetSpentEvent):
            self.events.append(event)


@pytest.fixture
def events() -> Iterator[list[BaseEvent]]:
    handler = Collected(events=[])
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(handler)
    try:
        yield handler.events
    finally:
        dispatcher.event_handlers.remove(handler)


def entries_of(ledger: CostLedger) -> list[tuple[str | None, str | None, str | None]]:
    return [(entry.run_id, entry.thread_id, entry.model) for entry in ledger.entries()]


# -- over the shipped fakes ---------------------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False])
async def test_a_strict_function_agent_run_stops_at_its_budget_with_a_final_answer_saying_so(
    streaming: bool, events: list[BaseEvent]
) -> None:
    ledger = InMemoryCostLedger()
    # Exactly the first attempt's worst case: it fits to the unit; nothing fits after it.
    runs = RunBudget(budget(), ledger, limit=first_worst_case())
    model = fake()
    llm = RunBudgetLLM(inner=model, budget=runs)
    agent = FunctionAgent(tools=[weather], llm=llm, streaming=streaming)

    handler = agent.run(QUESTION)
    answer = await handler

    spend = llm.spend(handler.run_id)
    assert spend is not None
    spent_events = [e for e in events if isinstance(e, RunBudgetSpentEvent)]
    assert [(e.run_id, e.window, e.limit) for e in spent_events] == [
        (handler.run_id, "run", runs.limit)
    ]
    error = BudgetExceededError("run", runs.limit, spent_events[0].spend, handler.run_id)
    assert str(answer) == spent_message(error)
    assert model.calls == 1  # the tool call was made; the answer after it was never sent
    assert entries_of(ledger) == [(handler.run_id, None, "big")]
    assert spend.spent == sum(e.cost for e in ledger.entries()) <= runs.limit
    assert spend.held == 0


async def test_an_exit_behavior_error_run_raises_budget_exceeded_out_of_its_handler() -> None:
    ledger = InMemoryCostLedger()
    runs = RunBudget(budget(), ledger, limit=first_worst_case())

    model = fake()
    llm = RunBudgetLLM(inner=model, budget=runs, exit_behavior="error")
    agent = FunctionAgent(tools=[weather], llm=llm)

    handler = agent.run(QUESTION)
    with pytest.raises(BudgetExceededError) as raised:
        await handler

    assert (raised.value.window, raised.value.limit, raised.value.scope) == (
        "run",
        runs.limit,
        handler.run_id,
    )
    assert model.calls == 1
    assert len(ledger.entries()) == 1


async def test_a_run_with_room_answers_and_every_attempt_names_its_run() -> None:
    ledger = InMemoryCostLedger()
    model = fake()
    llm = RunBudgetLLM(inner=model, budget=budget(), ledger=ledger, limit=1000)
    agent = FunctionAgent(tools=[weather], llm=llm)

    handler = agent.run(QUESTION)
    assert str(await handler) == TOOL_ANSWER
    assert entries_of(ledger) == [(handler.run_id, None, "big")] * 2
    assert llm.spend(handler.run_id).spent == sum(e.cost for e in ledger.entries())  # type: ignore[union-attr]


async def test_a_thread_budget_counts_two_runs_and_survives_a_new_layer_on_the_same_ledger(
    tmp_path: Path,
) -> None:
    ledger = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
    probe = InMemoryCostLedger()
    # What one run costs (default mode: refused once the thread has spent its limit).
    await FunctionAgent(
        tools=[weather], llm=RunBudgetLLM(inner=fake(), budget=budget(False), ledger=probe)
    ).run(QUESTION)
    one_run = sum(entry.cost for entry in probe.entries())

    def agent() -> FunctionAgent:
        llm = RunBudgetLLM(
            inner=fake(), budget=budget(False), ledger=ledger, per="thread", limit=one_run
        )
        return FunctionAgent(tools=[weather], llm=llm)

    with agent_thread("user-7"):
        first = agent().run(QUESTION)
    assert str(await first) == TOOL_ANSWER
    with agent_thread("user-7"):
        second = agent().run(QUESTION)  # a new layer: the thread's total is read back
    assert "this conversation's budget is spent" in str(await second)
    with agent_thread("user-8"):
        other = agent().run(QUESTION)
    assert str(await other) == TOOL_ANSWER

    assert [(run, thread) for run, thread, _ in entries_of(ledger)] == [
        (first.run_id, "user-7"),
        (first.run_id, "user-7"),
        (other.run_id, "user-8"),
        (other.run_id, "user-8"),
    ]
    assert ledger.run_spend(thread="user-7") == one_run
    ledger.close()


async def test_a_per_thread_budget_refuses_a_run_that_names_no_thread() -> None:
    llm = RunBudgetLLM(inner=fake(), budget=budget(), per="thread", limit=100)
    with pytest.raises(ValueError, match="agent_thread"):
        await FunctionAgent(tools=[weather], llm=llm).run(QUESTION)


async def test_a_react_agent_run_stops_at_its_budget_with_a_final_answer() -> None:
    ledger = InMemoryCostLedger()
    model = FakeFunctionCallingLLM(
        model_name="big",
        num_output=CAP,
        text='Thought: I need the weather.\nAction: weather\nAction Input: {"city": "x"}',
    )
    # Room for the first step (ReAct's long system prompt) and not the second.
    llm = RunBudgetLLM(inner=model, budget=budget(), ledger=ledger, limit=600)
    handler = ReActAgent(tools=[weather], llm=llm).run(QUESTION)

    answer = str(await handler)

    assert answer.startswith("I have to stop here: this run's budget is spent")
    assert model.calls == 1
    assert entries_of(ledger) == [(handler.run_id, None, "big")]
    assert sum(e.cost for e in ledger.entries()) <= 600


async def test_an_agent_workflow_shares_one_run_budget_across_its_agents() -> None:
    ledger = InMemoryCostLedger()
    runs = RunBudget(budget(), ledger, limit=first_worst_case())

    researcher = FunctionAgent(
        name="researcher",
        description="Looks the weather up.",
        tools=[weather],
        llm=RunBudgetLLM(inner=fake(), budget=runs),
    )
    workflow = AgentWorkflow(agents=[researcher], root_agent="researcher")

    handler = workflow.run(user_msg=QUESTION)
    answer = await handler

    assert str(answer).startswith("I have to stop here: this run's budget is spent")
    assert entries_of(ledger) == [(handler.run_id, None, "big")]


async def test_a_failover_mid_run_is_charged_to_the_run_at_the_model_that_served() -> None:
    ledger = InMemoryCostLedger()
    primary, secondary = fake("big"), fake("small")

    def outage(city: str) -> str:
        """The weather in a city (the primary goes down while it runs)."""
        primary.error = rate_limit_error()
        return f"sunny in {city}"

    primary.tool_call = secondary.tool_call = ToolSelection(
        tool_id="call-1", tool_name="outage", tool_kwargs={"city": "x"}
    )
    llm = RunBudgetLLM(
        inner=FallbackLLM(llms=[primary, secondary]), budget=budget(), ledger=ledger, limit=1000
    )
    handler = FunctionAgent(tools=[outage], llm=llm).run(QUESTION)

    assert str(await handler) == TOOL_ANSWER
    assert entries_of(ledger) == [(handler.run_id, None, "big"), (handler.run_id, None, "small")]
    assert (primary.calls, secondary.calls) == (2, 1)


async def test_a_limiter_refusal_under_the_run_budget_raises_and_releases_the_hold() -> None:
    ledger = InMemoryCostLedger()
    runs = RunBudget(budget(), ledger, limit=1000)
    model = fake()
    # A tokens-per-minute budget smaller than one request's weight refuses it at once.
    limited = RateLimitedLLM(inner=model, tokens_per_minute=5)
    handler = FunctionAgent(tools=[weather], llm=RunBudgetLLM(inner=limited, budget=runs)).run(
        QUESTION
    )

    with pytest.raises(RequestExceedsCapacityError):
        await handler

    assert model.calls == 0
    assert ledger.entries() == []
    spend = runs.get(handler.run_id)
    assert spend is not None
    assert (spend.spent, spend.held) == (0, 0)


async def test_a_downgrade_below_the_threshold_goes_to_the_cheaper_llm_with_its_estimate(
    events: list[BaseEvent],
) -> None:
    ledger = InMemoryCostLedger()
    big, small = fake("big"), fake("small")
    llm = RunBudgetLLM(
        inner=big,
        budget=budget(),
        ledger=ledger,
        limit=1000,
        downgrade_to=small,
        downgrade_below=1000,  # anything spent brings the run under it
    )
    handler = FunctionAgent(tools=[weather], llm=llm).run(QUESTION)

    assert str(await handler) == TOOL_ANSWER

    assert entries_of(ledger) == [(handler.run_id, None, "big"), (handler.run_id, None, "small")]
    (event,) = [e for e in events if isinstance(e, RunBudgetDowngradeEvent)]
    spend = llm.spend(handler.run_id)
    assert spend is not None
    first_cost = ledger.entries()[0].cost
    assert (event.run_id, event.asked_model, event.model, event.reason) == (
        handler.run_id,
        "big",
        "small",
        "below_threshold",
    )
    assert event.remaining == Decimal(1000) - first_cost
    assert event.estimate > event.chosen_estimate > 0
    assert event.estimate == 10 * event.chosen_estimate  # the same tokens at a tenth the price
    assert (big.calls, small.calls) == (1, 1)


async def test_a_strict_estimate_that_does_not_fit_downgrades_instead_of_stopping(
    events: list[BaseEvent],
) -> None:
    ledger = InMemoryCostLedger()
    # The big model's second step cannot fit.
    runs = RunBudget(budget(), ledger, limit=first_worst_case(), downgrade_to="small")
    big, small = fake("big"), fake("small")
    llm = RunBudgetLLM(inner=big, budget=runs, downgrade_to=small)
    handler = FunctionAgent(tools=[weather], llm=llm).run(QUESTION)

    assert str(await handler) == TOOL_ANSWER

    (event,) = [e for e in events if isinstance(e, RunBudgetDowngradeEvent)]
    assert event.reason == "estimate_does_not_fit"
    assert event.chosen_estimate <= event.remaining < event.estimate  # type: ignore[operator]
    assert [model for _, _, model in entries_of(ledger)] == ["big", "small"]
    assert sum(e.cost for e in ledger.entries()) <= runs.limit


async def test_a_chain_whose_dearest_member_cannot_fit_downgrades_when_its_hold_is_refused(
    events: list[BaseEvent],
) -> None:
    ledger = InMemoryCostLedger()
    # The primary's worst case fits exactly; the chain's hold, at its dearest member, does not.
    runs = RunBudget(budget(), ledger, limit=first_worst_case("mid"), downgrade_to="small")
    primary, backup, small = fake("mid"), fake("big"), fake("small")
    llm = RunBudgetLLM(inner=FallbackLLM(llms=[primary, backup]), budget=runs, downgrade_to=small)
    handler = FunctionAgent(tools=[weather], llm=llm).run(QUESTION)

    await handler

    first = next(e for e in events if isinstance(e, RunBudgetDowngradeEvent))
    assert (first.asked_model, first.model, first.reason) == (
        "mid",
        "small",
        "estimate_does_not_fit",
    )
    assert first.estimate == 2 * runs.limit  # type: ignore[operator]  # the big member's
    assert first.chosen_estimate == runs.limit / 5  # type: ignore[operator]
    assert primary.calls == backup.calls == 0
    assert entries_of(ledger)[0] == (handler.run_id, None, "small")
    assert sum(e.cost for e in ledger.entries()) <= runs.limit  # type: ignore[operator]


async def test_a_sync_tool_calling_a_model_is_charged_to_the_agents_run() -> None:
    ledger = InMemoryCostLedger()
    runs = RunBudget(budget(), ledger, limit=1000)
    side = RunBudgetLLM(inner=FakeFunctionCallingLLM(model_name="small"), budget=runs)

    def summarize(city: str) -> str:
        """A summary of the weather in a city."""
        return str(side.chat([ChatMessage(role=MessageRole.USER, content=city)]).message.content)

    model = FakeFunctionCallingLLM(
        model_name="big",
        num_output=CAP,
        text=TOOL_ANSWER,
        tool_call=ToolSelection(tool_id="c", tool_name="summarize", tool_kwargs={"city": "x"}),
    )
    agent = FunctionAgent(tools=[summarize], llm=RunBudgetLLM(inner=model, budget=runs))

    handler = agent.run(QUESTION)
    assert str(await handler) == TOOL_ANSWER

    assert entries_of(ledger) == [
        (handler.run_id, None, "big"),
        (handler.run_id, None, "small"),
        (handler.run_id, None, "big"),
    ]
    assert runs.get(handler.run_id).spent == sum(e.cost for e in ledger.entries())  # type: ignore[union-attr]


@pytest.mark.parametrize("method", ["chat", "achat", "stream_chat", "astream_chat"])
async def test_each_call_shape_of_one_run_stops_at_the_limit_with_the_spent_answer(
    method: str,
) -> None:
    ledger = InMemoryCostLedger()
    runs = RunBudget(budget(), ledger, limit=first_worst_case())

    llm = RunBudgetLLM(inner=FakeFunctionCallingLLM(model_name="big", num_output=CAP), budget=runs)
    messages = [ChatMessage(role=MessageRole.USER, content=QUESTION)]

    async def text() -> str:
        if method == "chat":
            return str(llm.chat(messages).message.content)
        if method == "achat":
            return str((await llm.achat(messages)).message.content)
        if method == "stream_chat":
            return "".join(chunk.delta or "" for chunk in llm.stream_chat(messages))
        stream = await llm.astream_chat(messages)
        return "".join([chunk.delta or "" async for chunk in stream])

    with instrument_tags({RUN_ID_TAG: "run-1"}):
        first, second = await text(), await text()

    assert first == "The fake model answers."
    assert second.startswith("I have to stop here: this run's budget is spent")
    assert entries_of(ledger) == [("run-1", None, "big")]


async def test_calls_outside_any_run_are_each_a_run_of_their_own_and_forgotten() -> None:
    ledger = InMemoryCostLedger()
    runs = RunBudget(budget(), ledger, limit=1000)
    llm = RunBudgetLLM(inner=FakeFunctionCallingLLM(model_name="big"), budget=runs)
    messages = [ChatMessage(role=MessageRole.USER, content=QUESTION)]

    llm.chat(messages)
    await llm.achat(messages)

    ids = [run for run, _, _ in entries_of(ledger)]
    assert len(set(ids)) == 2
    assert all(run is not None and runs.get(run) is None for run in ids)


def test_the_layer_refuses_bad_options_at_construction() -> None:
    inner = fake()
    with pytest.raises(TypeError, match=r"'exit_behaviour'.*'exit_behavior'"):
        RunBudgetLLM(inner=inner, budget=budget(), exit_behaviour="end")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="exit_behavior"):
        RunBudgetLLM(inner=inner, budget=budget(), exit_behavior="stop")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limit given with a RunBudget"):
        RunBudgetLLM(inner=inner, budget=RunBudget(budget()), limit=5)
    with pytest.raises(TypeError, match="CostBudget"):
        RunBudgetLLM(inner=inner, budget="5 dollars")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="downgrade_to"):
        RunBudgetLLM(inner=inner, budget=budget(), downgrade_to="small")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="downgrade_to"):
        RunBudgetLLM(inner=inner, budget=RunBudget(budget()), downgrade_to=fake("small"))
    with pytest.raises(ValueError, match="per"):
        RunBudgetLLM(inner=inner, budget=budget(), per="day")  # type: ignore[arg-type]


# -- real LlamaIndex OpenAI against the fault-injecting server -------------------------------


@pytest.fixture
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply=SERVER_REPLY, name="primary") as running:
        yield running


@pytest.fixture
def backup() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply=SERVER_REPLY, name="backup") as running:
        yield running


def openai(server: FaultInjectingServer, model: str = "gpt-4o") -> Any:
    return openai_llms.OpenAI(
        model=model,
        api_base=server.openai_base_url,
        api_key="sk-FAKE-openai",
        max_retries=0,
        max_tokens=CAP,
        timeout=10,
    )


@pytest.mark.parametrize("streaming", [True, False])
async def test_a_real_openai_agent_run_stops_at_its_strict_budget_and_never_passes_it(
    streaming: bool, server: FaultInjectingServer
) -> None:
    ledger = InMemoryCostLedger()
    runs = RunBudget(budget(), ledger, limit=first_worst_case("gpt-4o"))
    llm = RunBudgetLLM(inner=openai(server), budget=runs)
    handler = FunctionAgent(tools=[weather], llm=llm, streaming=streaming).run(QUESTION)

    answer = str(await handler)

    assert answer.startswith("I have to stop here: this run's budget is spent")
    assert [request.tool_call for request in server.requests] == [True]
    assert entries_of(ledger) == [(handler.run_id, None, "gpt-4o")]
    assert sum(e.cost for e in ledger.entries()) <= runs.limit
    if not streaming:  # LlamaIndex's OpenAI asks no usage of a stream: it is estimated
        assert [e.estimated for e in ledger.entries()] == [False]


async def test_a_real_openai_thread_budget_stops_the_second_run_of_the_thread(
    server: FaultInjectingServer,
) -> None:
    ledger = InMemoryCostLedger()
    probe = InMemoryCostLedger()
    await FunctionAgent(
        tools=[weather], llm=RunBudgetLLM(inner=openai(server), budget=budget(False), ledger=probe)
    ).run(QUESTION)
    one_run = sum(entry.cost for entry in probe.entries())
    llm = RunBudgetLLM(
        inner=openai(server), budget=budget(False), ledger=ledger, per="thread", limit=one_run
    )
    agent = FunctionAgent(tools=[weather], llm=llm)

    with agent_thread("user-7"):
        first = agent.run(QUESTION)
    assert str(await first) == SERVER_REPLY
    with agent_thread("user-7"):
        second = agent.run(QUESTION)
    assert "this conversation's budget is spent" in str(await second)

    assert len(server.requests) == 4  # the probe's two and the first run's two
    assert {(run, thread) for run, thread, _ in entries_of(ledger)} == {(first.run_id, "user-7")}


@pytest.mark.parametrize("streaming", [True, False])
async def test_a_real_openai_failover_mid_run_is_charged_once_per_attempt_to_the_run(
    streaming: bool, server: FaultInjectingServer, backup: FaultInjectingServer
) -> None:
    server.script(Fault.ok(), Fault.status(503))  # the tool step, then an outage
    ledger = InMemoryCostLedger()
    llm = RunBudgetLLM(
        inner=FallbackLLM(llms=[openai(server), openai(backup, "gpt-4o-mini")]),
        budget=budget(),
        ledger=ledger,
        limit=1000,
    )
    handler = FunctionAgent(tools=[weather], llm=llm, streaming=streaming).run(QUESTION)

    assert str(await handler) == SERVER_REPLY

    assert [r.fault for r in server.requests] == [Fault.ok(), Fault.status(503)]
    assert [r.model for r in backup.requests] == ["gpt-4o-mini"]
    assert entries_of(ledger) == [
        (handler.run_id, None, "gpt-4o"),
        (handler.run_id, None, "gpt-4o-mini"),
    ]


async def test_a_real_openai_run_downgrades_to_the_cheaper_model_under_the_threshold(
    server: FaultInjectingServer, events: list[BaseEvent]
) -> None:
    ledger = InMemoryCostLedger()
    llm = RunBudgetLLM(
        inner=openai(server),
        budget=budget(),
        ledger=ledger,
        limit=1000,
        downgrade_to=openai(server, "gpt-4o-mini"),
        downgrade_below=1000,
    )
    handler = FunctionAgent(tools=[weather], llm=llm).run(QUESTION)

    assert str(await handler) == SERVER_REPLY

    assert [r.model for r in server.requests] == ["gpt-4o", "gpt-4o-mini"]
    assert [r.tool_call for r in server.requests] == [True, False]
    assert [model for _, _, model in entries_of(ledger)] == ["gpt-4o", "gpt-4o-mini"]
    (event,) = [e for e in events if isinstance(e, RunBudgetDowngradeEvent)]
    assert (event.asked_model, event.model) == ("gpt-4o", "gpt-4o-mini")
    assert event.estimate == 10 * event.chosen_estimate


async def test_the_budget_stop_leaves_no_run_in_flight_when_runs_overlap() -> None:
    ledger = InMemoryCostLedger()
    runs = RunBudget(budget(), ledger, limit=first_worst_case())

    agent = FunctionAgent(tools=[weather], llm=RunBudgetLLM(inner=fake(), budget=runs))

    handlers = [agent.run(QUESTION) for _ in range(3)]
    answers = await asyncio.gather(*handlers)

    assert all(str(a).startswith("I have to stop here") for a in answers)
    assert sorted(run for run, _, _ in entries_of(ledger)) == sorted(h.run_id for h in handlers)
    assert all(runs.get(h.run_id).held == 0 for h in handlers)  # type: ignore[union-attr]


@pytest.mark.parametrize("method", ["stream_chat", "astream_chat"])
async def test_a_stream_of_a_run_closed_after_its_first_chunk_records_what_it_consumed(
    method: str,
) -> None:
    ledger = InMemoryCostLedger()
    runs = RunBudget(budget(), ledger, limit=1000)
    llm = RunBudgetLLM(inner=FakeFunctionCallingLLM(model_name="big", num_output=CAP), budget=runs)
    messages = [ChatMessage(role=MessageRole.USER, content=QUESTION)]

    with instrument_tags({RUN_ID_TAG: "run-1"}):
        if method == "stream_chat":
            stream = llm.stream_chat(messages)
            first = next(stream).delta
            stream.close()
        else:
            astream = await llm.astream_chat(messages)
            first = (await anext(astream)).delta
            await astream.aclose()
            # LlamaIndex's callback wrapper leaves the layer's own stream to asyncio, which
            # closes it in a task of its own a moment later.
            for _ in range(200):
                if ledger.entries():
                    break
                await asyncio.sleep(0.01)

    assert first == "The"
    (entry,) = ledger.entries()
    assert (entry.run_id, entry.model, entry.estimated) == ("run-1", "big", True)
    spend = runs.get("run-1")
    assert spend is not None
    assert (spend.spent, spend.held) == (entry.cost, 0)
