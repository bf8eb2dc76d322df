"""The metered call (gate, scope, cap, served model, settle) and how a stream ended."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from decimal import Decimal

import pytest

from llm_resilience import CostBudget, InMemoryCostLedger
from llm_resilience.budget import HEDGE_KIND, ModelPrice
from llm_resilience.errors import BudgetExceededError
from llm_resilience.fallback._hedge_inbox import HedgeLoser, current_hedge_inbox
from llm_resilience.metering import (
    BUDGET_SCOPE_KWARG,
    Meter,
    StreamOutcome,
)
from llm_resilience.usage import Usage

PROMPT = [("user", "Hi")]


class _Model:
    def __init__(self, name: str, *, cap: int | None = None) -> None:
        self.model_name = name
        self.max_output_tokens = cap


class _Chain:
    def __init__(self, *members: object, hedge_after: float | None = None) -> None:
        self.members = members
        self.hedge_after = hedge_after

    def layers_below(self) -> tuple[object, ...]:
        return self.members


def _name(model: object) -> object:
    return getattr(model, "model_name", None)


def _meter(stack: object, *, limit: int = 1_000_000, strict: bool = False) -> Meter:
    # One output token costs 1: a strict hold of N output tokens is N.
    budget = CostBudget(0, 1_000_000, daily_limit=limit, strict=strict)
    return Meter(budget, InMemoryCostLedger(), stack=stack, name_of=_name)


def test_a_metered_call_holds_the_calls_cap_scopes_by_keyword_and_names_who_served() -> None:
    meter = _meter(_Model("gemini", cap=2048), limit=1000, strict=True)

    with pytest.raises(BudgetExceededError):  # the model's own 2,048 output tokens
        meter.begin({}, prompt=PROMPT)
    call_kwargs = {BUDGET_SCOPE_KWARG: "tenant-1", "max_completion_tokens": 500}
    call = meter.begin(call_kwargs, prompt=lambda: PROMPT)  # the call's own 500 fit
    assert call_kwargs == {"max_completion_tokens": 500}  # the scope never reaches the model
    call.settle(Usage(3, 4, estimated=False))
    with pytest.raises(ValueError, match=BUDGET_SCOPE_KWARG):
        meter.begin({BUDGET_SCOPE_KWARG: ""})

    chain = _Chain(_Chain(_Model("dead-primary"), _Model("live-secondary")), _Model("third"))
    chained = _meter(chain)
    chained.begin({}, prompt=PROMPT).settle(Usage(3, 4, estimated=False), mark=[0, 1])
    chained.begin({}).settle(Usage(3, 4, estimated=False), named="gpt-4o", mark=[1])
    chained.begin({}).settle(Usage(3, 4, estimated=False), mark=[0])  # stops above a chain

    assert [(e.scope, e.model, e.cost) for e in meter.gate.ledger.entries()] == [
        ("tenant-1", "gemini", Decimal(4))
    ]
    assert [e.model for e in chained.gate.ledger.entries()] == [
        "live-secondary",
        "gpt-4o",
        None,
    ]


def test_a_stream_ended_early_records_what_it_consumed_under_the_dearest_that_may_have_served() -> (
    None
):
    budget = CostBudget(0, 1, daily_limit=100, prices={"dear": ModelPrice(0, 2)}, strict=True)
    stack = _Chain(_Model("cheap", cap=10), _Model("dear", cap=10))
    meter = Meter(budget, InMemoryCostLedger(), stack=stack, name_of=_name)

    meter.begin({}, prompt=PROMPT).end_early(None)  # nothing delivered: the hold released
    meter.begin({}, prompt=PROMPT).end_early(Usage(3, 4, estimated=True))
    meter.begin({}, prompt=PROMPT).end_early(Usage(3, 4, estimated=True), named="cheap")

    assert [e.model for e in meter.gate.ledger.entries()] == ["dear", "cheap"]
    assert meter.gate.ledger.spend("day") == Decimal("0.000012")  # no hold left behind


def test_a_metered_call_opens_the_hedge_inbox_only_when_a_chain_below_hedges() -> None:
    hedged = _meter(_Chain(_Model("a"), _Model("b"), hedge_after=0.5))
    plain = _meter(_Chain(_Model("a"), _Model("b")))

    with plain.inbox():
        assert current_hedge_inbox() is None
    with hedged.inbox():
        inbox = current_hedge_inbox()
        assert inbox is not None
        call = hedged.begin({}, prompt=PROMPT)
        inbox.report(HedgeLoser(0, Usage(5, 2, estimated=False), "a"))
    call.settle(Usage(5, 3, estimated=False), mark=[1])

    def chunks() -> Iterator[str]:
        assert current_hedge_inbox() is not None  # the stream's first step begins the call
        yield "x"

    assert list(hedged.stream(chunks())) == ["x"]
    assert current_hedge_inbox() is None
    assert [(e.kind, e.model) for e in hedged.gate.ledger.entries()] == [
        (HEDGE_KIND, "a"),
        ("chat", "b"),
    ]


def test_how_a_stream_ended_decides_what_it_records() -> None:
    assert [
        (outcome, outcome.records)
        for outcome in map(
            StreamOutcome.of,
            [None, GeneratorExit(), asyncio.CancelledError(), RuntimeError(), KeyboardInterrupt()],
        )
    ] == [
        (StreamOutcome.COMPLETED, "answer"),
        (StreamOutcome.CLOSED, "consumed"),
        (StreamOutcome.CANCELLED, "consumed"),
        (StreamOutcome.FAILED, "nothing"),
        (StreamOutcome.FAILED, "nothing"),
    ]
