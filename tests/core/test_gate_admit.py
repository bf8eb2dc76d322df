"""The gate's one-read admission (`BudgetGate._admit`, a `Meter`'s default-mode chat
calls over an in-memory ledger) decides and records exactly as ``begin`` does."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from llm_resilience import CostBudget, InMemoryCostLedger
from llm_resilience.budget import BudgetGate
from llm_resilience.errors import BudgetExceededError
from llm_resilience.ledger import LedgerEntry
from llm_resilience.ledger._protocol import gate_reader, inline_recorder, window_key, window_keys
from llm_resilience.metering import BUDGET_SCOPE_KWARG, Meter
from llm_resilience.usage import Usage

NOW = datetime(2026, 11, 30, 23, 59, 59, 999999, tzinfo=UTC)


class _Model:
    model_name = "gpt-4o"
    max_output_tokens = None


def _budget(**limits: object) -> CostBudget:
    return CostBudget(3, 15, **limits)  # type: ignore[arg-type]


def _ledger_with_spend() -> InMemoryCostLedger:
    ledger = InMemoryCostLedger()
    ledger.record(LedgerEntry(NOW, "chat", cost=Decimal("0.5"), scope="tenant-1"))
    ledger.record(LedgerEntry(NOW - timedelta(days=1), "chat", cost=Decimal("2")))
    return ledger


def _outcome(gate: BudgetGate, admit: bool, scope: str | None) -> object:
    try:
        ticket = gate._admit(scope, "gpt-4o") if admit else gate.begin("chat", scope=scope)
    except BudgetExceededError as refused:
        return ("refused", refused.window, refused.limit, refused.spend, refused.scope)
    assert ticket is not None
    return ("admitted", ticket.surface, ticket.scope, ticket.reservation, ticket.run_id)


@pytest.mark.parametrize(
    "limits",
    [
        {"daily_limit": 1},
        {"daily_limit": "0.5"},
        {"monthly_limit": "2.5"},
        {"monthly_limit": "2.4"},
        {"daily_limit": 1, "monthly_limit": 3, "global_daily_limit": "0.5"},
        {"daily_limit": "0.7", "global_monthly_limit": "2.5"},
        {"daily_limit": 0},
        {"global_monthly_limit": 10},
    ],
)
@pytest.mark.parametrize("scope", [None, "tenant-1", "tenant-2"])
@pytest.mark.parametrize("held", [False, True])
def test_the_one_read_admission_refuses_and_admits_as_begin_does(
    limits: dict[str, object], scope: str | None, held: bool
) -> None:
    outcomes = []
    for admit in (True, False):
        ledger = _ledger_with_spend()
        if held:  # a live hold counts toward spend as an entry does
            ledger.reserve(Decimal("0.1"), limits={}, scope="tenant-1", now=NOW)
        gate = BudgetGate(_budget(**limits), ledger, now=lambda: NOW)
        outcomes.append(_outcome(gate, admit, scope))
    assert outcomes[0] == outcomes[1]


def test_the_one_read_admission_is_declined_for_a_strict_budget_or_another_ledger() -> None:
    class Overriding(InMemoryCostLedger):
        def spend(self, *args: object, **kwargs: object) -> Decimal:
            return Decimal(1000)  # this subclass's own read must be asked

    strict = BudgetGate(CostBudget(3, 15, daily_limit=1, strict=True), InMemoryCostLedger())
    assert strict._admit(None, "gpt-4o") is None
    overriding = BudgetGate(_budget(daily_limit=1), Overriding())
    assert overriding._admit(None, "gpt-4o") is None
    assert gate_reader(Overriding()) is None
    with pytest.raises(BudgetExceededError):  # through begin, which reads the override
        Meter(_budget(daily_limit=1), Overriding(), stack=_Model(), name_of=str).begin({})


@pytest.mark.parametrize("strict", [False, True])
def test_a_meters_call_records_the_same_entry_whichever_way_it_was_admitted(
    strict: bool,
) -> None:
    class Plain(InMemoryCostLedger):  # same reads, through the general path
        def spend(self, *args: object, **kwargs: object) -> Decimal:
            return super().spend(*args, **kwargs)  # type: ignore[arg-type]

    entries = []
    for ledger in (InMemoryCostLedger(), Plain()):
        meter = Meter(
            _budget(daily_limit=1, strict=strict),
            ledger,
            stack=_Model(),
            name_of=lambda model: model.model_name,  # type: ignore[attr-defined]
        )
        meter.gate._now = lambda: NOW
        call = {BUDGET_SCOPE_KWARG: "tenant-1", "max_tokens": 10}
        meter.begin(call, prompt=[("user", "Hi")]).settle(Usage(9, 20, estimated=False))
        assert call == {"max_tokens": 10}  # the scope popped, the rest left
        asyncio.run(meter.abegin()).settle(Usage(1, 2, estimated=True), named="gpt-4o-mini")
        entries.append(ledger.entries())
        assert ledger.spend("day", scope="tenant-1", now=NOW) == entries[-1][0].cost
    assert entries[0] == entries[1]
    assert [(entry.scope, entry.model) for entry in entries[0]] == [
        ("tenant-1", "gpt-4o"),
        (None, "gpt-4o-mini"),
    ]


def test_the_window_pair_names_a_day_and_its_month_as_window_key_does() -> None:
    for when in (NOW, NOW + timedelta(microseconds=1), datetime(2024, 2, 29, tzinfo=UTC)):
        assert window_keys(when) == (window_key("day", when), window_key("month", when))


def test_an_async_finish_records_in_place_as_the_shielded_write_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Shielded(InMemoryCostLedger):  # its own arecord: written through ``shielded``
        async def arecord(self, entry: LedgerEntry) -> None:
            self.record(entry)

    class Failing(InMemoryCostLedger):
        def record(self, entry: LedgerEntry) -> None:
            raise OSError("disk full")

    class FailingInPlace(InMemoryCostLedger):  # its record and arecord: the in-memory ones
        def _add(self, entry: LedgerEntry) -> None:
            raise OSError("disk full")

    assert inline_recorder(InMemoryCostLedger()) is not None
    assert inline_recorder(FailingInPlace()) is not None
    assert inline_recorder(Shielded()) is None
    assert inline_recorder(Failing()) is None
    entries = []
    for ledger in (InMemoryCostLedger(), Shielded()):
        gate = BudgetGate(_budget(daily_limit=1), ledger, now=lambda: NOW)
        ticket = gate._admit("tenant-1", "gpt-4o")
        assert ticket is not None
        entry = asyncio.run(ticket.afinish(Usage(9, 20, estimated=False)))
        assert ledger.entries() == [entry]
        entries.append(entry)
    assert entries[0] == entries[1]
    for failing in (Failing, FailingInPlace):
        ticket = BudgetGate(_budget(daily_limit=1), failing(), now=lambda: NOW).begin("chat")
        assert asyncio.run(ticket.afinish(Usage(9, 20, estimated=False))) is not None
    assert caplog.text.count("OSError") == 2  # warned, never raised, either way
