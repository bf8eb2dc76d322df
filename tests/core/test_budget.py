"""The budget gate: limits per UTC window and scope, exact money, strict reservations."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from llm_resilience import telemetry
from llm_resilience.budget import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    BudgetGate,
    BudgetTicket,
    CostBudget,
    ModelPrice,
    ServingModel,
    dearest_model,
    served_model,
)
from llm_resilience.errors import BudgetExceededError
from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry, Reservation, Window
from llm_resilience.money import cost_of
from llm_resilience.tokens import count_message_tokens, count_tokens
from llm_resilience.usage import Usage

NOON = datetime(2026, 3, 14, 12, tzinfo=UTC)


class Clock:
    """A settable UTC clock for the gate's ``now``."""

    def __init__(self, when: datetime = NOON) -> None:
        self.when = when

    def __call__(self) -> datetime:
        return self.when


class CountingLedger(InMemoryCostLedger):
    """An in-memory ledger that remembers every spend read, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[Window, str | None]] = []

    def spend(
        self, window: Window, *, scope: str | None = None, now: datetime | None = None
    ) -> Decimal:
        self.reads.append((window, scope))
        return super().spend(window, scope=scope, now=now)


class BrokenLedger(InMemoryCostLedger):
    """Fails to read (``spend``/``reserve``) or to write (``record``/``settle``) on demand."""

    persistent = True  # keep the in-memory warning out of these tests

    def __init__(self, *, reads: bool = False, writes: bool = False) -> None:
        super().__init__()
        self.fail_reads = reads
        self.fail_writes = writes

    def _read(self) -> None:
        if self.fail_reads:
            raise OSError("database is locked")

    def _write(self) -> None:
        if self.fail_writes:
            raise OSError("disk I/O error")

    def spend(
        self, window: Window, *, scope: str | None = None, now: datetime | None = None
    ) -> Decimal:
        self._read()
        return super().spend(window, scope=scope, now=now)

    def reserve(
        self,
        amount: Decimal,
        *,
        limits: Mapping[tuple[Window, str | None], Decimal],
        scope: str | None,
        now: datetime | None = None,
    ) -> Reservation:
        self._read()
        return super().reserve(amount, limits=limits, scope=scope, now=now)

    def record(self, entry: LedgerEntry) -> None:
        self._write()
        super().record(entry)

    def settle(self, reservation: Reservation, entry: LedgerEntry | None) -> None:
        self._write()
        super().settle(reservation, entry)


def spend_to(
    ledger: InMemoryCostLedger, amount: str, *, when: datetime = NOON, scope: str | None = None
) -> None:
    ledger.record(LedgerEntry(when, "chat", cost=Decimal(amount), scope=scope))


def gate_for(
    budget: CostBudget, ledger: InMemoryCostLedger | None = None, when: datetime = NOON
) -> BudgetGate:
    return BudgetGate(budget, InMemoryCostLedger() if ledger is None else ledger, now=Clock(when))


# -- validation ---------------------------------------------------------------------------


def test_floats_are_refused_with_a_message_naming_the_option_and_the_fix() -> None:
    with pytest.raises(TypeError, match=r"daily_limit.*use Decimal\('0.15'\) or a string"):
        CostBudget(daily_limit=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="input_price_per_mtok"):
        CostBudget(0.15, daily_limit=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="output_per_mtok"):
        ModelPrice(1, 0.6)  # type: ignore[arg-type]


def test_negative_values_are_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match="monthly_limit"):
        CostBudget(monthly_limit=-1)
    with pytest.raises(ValueError, match="embedding_price_per_mtok"):
        CostBudget(embedding_price_per_mtok="-0.02", daily_limit=1)
    with pytest.raises(ValueError, match="embedding_per_mtok"):
        ModelPrice(1, 2, "-1")
    with pytest.raises(ValueError, match="global_daily_limit"):
        CostBudget(global_daily_limit="a lot")


def test_a_budget_needs_at_least_one_limit_and_says_which_options_count() -> None:
    with pytest.raises(
        ValueError, match="daily_limit, monthly_limit, global_daily_limit or global_monthly_limit"
    ):
        CostBudget(input_price_per_mtok=3, output_price_per_mtok=15)


def test_prices_must_be_model_prices_and_strict_a_bool() -> None:
    with pytest.raises(TypeError, match=r"prices\['gpt-4o'\] must be a ModelPrice"):
        CostBudget(daily_limit=1, prices={"gpt-4o": (2.5, 10)})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="strict must be True or False"):
        CostBudget(daily_limit=1, strict="yes")  # type: ignore[arg-type]


def test_money_given_as_int_str_or_decimal_is_stored_exactly_and_the_budget_is_frozen() -> None:
    budget = CostBudget("0.15", 1, Decimal("0.02"), daily_limit="25.10")
    assert (budget.input_price_per_mtok, budget.output_price_per_mtok) == (
        Decimal("0.15"),
        Decimal(1),
    )
    assert budget.embedding_price_per_mtok == Decimal("0.02")
    assert budget.daily_limit == Decimal("25.10")
    assert budget.monthly_limit is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        budget.daily_limit = Decimal(1)  # type: ignore[misc]


def test_begin_names_the_allowed_surfaces() -> None:
    gate = gate_for(CostBudget(daily_limit=1))
    with pytest.raises(ValueError, match="'chat' or 'embedding'"):
        gate.begin("completion")  # type: ignore[arg-type]


# -- the gate -----------------------------------------------------------------------------


def test_a_call_is_refused_once_spend_reaches_the_limit_exactly() -> None:
    ledger = InMemoryCostLedger()
    gate = gate_for(CostBudget(daily_limit="0.50"), ledger)
    spend_to(ledger, "0.49")
    gate.begin("chat").abandon()
    spend_to(ledger, "0.01")
    with pytest.raises(BudgetExceededError) as refused:
        gate.begin("chat")
    assert (refused.value.window, refused.value.limit, refused.value.spend) == (
        "day",
        Decimal("0.50"),
        Decimal("0.50"),
    )
    assert refused.value.scope is None


def test_the_day_is_checked_before_the_month() -> None:
    ledger = CountingLedger()
    gate = gate_for(CostBudget(daily_limit=1, monthly_limit=1), ledger)
    gate.begin("chat").abandon()
    assert ledger.reads == [("day", None), ("month", None)]
    spend_to(ledger, "1")
    with pytest.raises(BudgetExceededError) as refused:
        gate.begin("chat")
    assert refused.value.window == "day"


def test_an_unconfigured_window_is_never_read() -> None:
    ledger = CountingLedger()
    gate = gate_for(CostBudget(monthly_limit=10), ledger)
    asyncio.run(gate.abegin("embedding"))
    gate.begin("chat")
    assert ledger.reads == [("month", None), ("month", None)]


def test_windows_are_utc_calendar_days_and_months() -> None:
    ledger = InMemoryCostLedger()
    last_second = datetime(2026, 1, 31, 23, 59, 59, tzinfo=UTC)
    spend_to(ledger, "1", when=last_second)
    budget = CostBudget(daily_limit=1, monthly_limit=1)

    with pytest.raises(BudgetExceededError):  # still the 31st in UTC, though Feb 1 in +02:00
        gate_for(
            budget, ledger, datetime(2026, 2, 1, 1, 59, 59, tzinfo=timezone(timedelta(hours=2)))
        ).begin("chat")
    gate_for(budget, ledger, datetime(2026, 2, 1, 0, 0, 0, tzinfo=UTC)).begin(
        "chat"
    )  # new day and month

    ticket = gate_for(budget, ledger, datetime(2026, 2, 1, tzinfo=UTC)).begin("chat")
    ticket.finish(Usage(0, 0, estimated=False))
    assert [entry.timestamp.date().isoformat() for entry in ledger.entries()] == [
        "2026-01-31",
        "2026-02-01",
    ]


def test_a_limit_of_zero_refuses_every_call_in_every_mode_even_with_an_unreadable_ledger() -> None:
    for budget in (CostBudget(daily_limit=0), CostBudget(monthly_limit=0, strict=True)):
        with pytest.raises(BudgetExceededError) as refused:
            gate_for(budget).begin("embedding")
        assert refused.value.limit == 0
        with pytest.raises(BudgetExceededError):
            BudgetGate(budget, BrokenLedger(reads=True)).begin("chat")


def test_money_is_exact_so_point_one_plus_point_two_is_point_three() -> None:
    ledger = InMemoryCostLedger()
    gate = gate_for(CostBudget(input_price_per_mtok="0.1", daily_limit="0.3"), ledger)
    gate.begin("chat").finish(Usage(1_000_000, 0, estimated=False))
    gate.begin("chat").finish(Usage(2_000_000, 0, estimated=False))
    assert [entry.cost for entry in ledger.entries()] == [Decimal("0.1"), Decimal("0.2")]
    assert ledger.spend("day", now=NOON) == Decimal("0.3")
    with pytest.raises(BudgetExceededError):  # 0.3 >= 0.3: no float dust lets it through
        gate.begin("chat")


def test_recorded_entries_carry_the_serving_model_its_price_and_the_estimated_flag() -> None:
    ledger = InMemoryCostLedger()
    budget = CostBudget(
        1,
        2,
        "0.5",
        daily_limit=100,
        prices={"gpt-4o": ModelPrice("2.5", 10), "gpt-4o-mini": ModelPrice("0.15", "0.6")},
    )
    gate = gate_for(budget, ledger)
    usage = Usage(1_000_000, 1_000_000, estimated=True)
    gate.begin("chat", model="gpt-4o").finish(
        usage, model="gpt-4o-mini-2024-07-18"
    )  # longest prefix
    gate.begin("chat", model="gpt-4o").finish(usage, model="gpt-4o-2024-08-06")
    gate.begin("chat", model="gpt-4o").finish(usage)  # the model asked for, when none is named
    gate.begin("chat").finish(usage, model="claude-sonnet-4-5")  # unpriced: surface prices
    gate.begin("embedding").finish(
        Usage(1_000_000, 0, estimated=True), model="text-embedding-3-small"
    )
    recorded = [(e.model, e.cost, e.kind, e.surface, e.estimated) for e in ledger.entries()]
    assert recorded == [
        ("gpt-4o-mini-2024-07-18", Decimal("0.75"), "chat", "chat", True),
        ("gpt-4o-2024-08-06", Decimal("12.5"), "chat", "chat", True),
        ("gpt-4o", Decimal("12.5"), "chat", "chat", True),
        ("claude-sonnet-4-5", Decimal("3"), "chat", "chat", True),
        ("text-embedding-3-small", Decimal("0.5"), "embedding", "embedding", True),
    ]


def test_the_gates_entry_holds_every_field_where_a_checked_ledger_entry_would() -> None:
    # The gate builds its entries unchecked, slot by slot (checked_entry): each value
    # must land in its own field, and the result must equal LedgerEntry's own.
    when = datetime(2026, 12, 6, 23, 30, tzinfo=UTC)
    ledger = InMemoryCostLedger()
    gate = BudgetGate(CostBudget(3, 15, daily_limit=100), ledger, now=lambda: when)
    usage = Usage(
        120,
        9,
        estimated=False,
        cache_read_tokens=100,
        cache_write_tokens=20,
        cache_write_1h_tokens=8,
        reasoning_tokens=5,
    )
    ticket = gate.begin("chat", scope="tenant-7", run_id="run-1", thread_id="thread-1")
    entry = ticket.finish(usage, model="gpt-x")
    assert entry is not None
    expected = {
        "timestamp": when,
        "kind": "chat",
        "input_tokens": 120,
        "output_tokens": 9,
        "cost": cost_of(usage, gate.budget.price_for("gpt-x")),
        "pages": 0,
        "model": "gpt-x",
        "estimated": False,
        "surface": "chat",
        "scope": "tenant-7",
        "cache_read_tokens": 100,
        "cache_write_tokens": 20,
        "cache_write_1h_tokens": 8,
        "reasoning_tokens": 5,
        "run_id": "run-1",
        "thread_id": "thread-1",
    }
    fields = {each.name: getattr(entry, each.name) for each in dataclasses.fields(entry)}
    assert fields.pop("entry_id") != ""
    assert fields == expected
    assert LedgerEntry(**expected, entry_id=entry.entry_id) == entry
    assert ledger.entries() == [entry]


def test_a_scope_is_gated_by_its_own_spend_and_by_the_global_limits() -> None:
    ledger = InMemoryCostLedger()
    gate = gate_for(CostBudget(daily_limit=5, global_daily_limit=8), ledger)
    spend_to(ledger, "5", scope="tenant-1")
    with pytest.raises(BudgetExceededError) as own:
        gate.begin("chat", scope="tenant-1")
    assert (own.value.scope, own.value.limit, own.value.spend) == (
        "tenant-1",
        Decimal(5),
        Decimal(5),
    )
    gate.begin("chat", scope="tenant-2").abandon()  # tenant-1's spend is not tenant-2's

    spend_to(ledger, "3", scope="tenant-2")  # 8 spent across tenants: the global limit
    with pytest.raises(BudgetExceededError) as overall:
        gate.begin("chat", scope="tenant-3")
    assert (overall.value.scope, overall.value.limit, overall.value.spend) == (
        None,
        Decimal(8),
        Decimal(8),
    )


def test_an_unscoped_call_is_gated_by_the_global_spend_under_the_lower_limit() -> None:
    ledger = CountingLedger()
    gate = gate_for(CostBudget(daily_limit=10, global_daily_limit=3), ledger)
    spend_to(ledger, "3", scope="tenant-1")
    with pytest.raises(BudgetExceededError) as refused:
        gate.begin("chat")
    assert (refused.value.limit, refused.value.spend, refused.value.scope) == (
        Decimal(3),
        Decimal(3),
        None,
    )
    assert ledger.reads == [("day", None)]  # one read per window, not one per limit


def test_scoped_entries_record_their_scope() -> None:
    ledger = InMemoryCostLedger()
    gate_for(CostBudget(1, daily_limit=1), ledger).begin("chat", scope="key-7").finish(
        Usage(10, 0, False)
    )
    assert ledger.entries()[0].scope == "key-7"
    assert ledger.spend("day", scope="key-7", now=NOON) == Decimal("0.00001")


# -- strict mode and concurrency ----------------------------------------------------------

# Each call may cost 0.01 (1000 output tokens at 10 per million); 0.90 of 1.00 is spent,
# so exactly 10 more calls fit.
PER_CALL = Decimal("0.01")
CALLS = 50


def nearly_spent(strict: bool) -> tuple[BudgetGate, InMemoryCostLedger]:
    ledger = InMemoryCostLedger()
    spend_to(ledger, "0.90")
    return gate_for(CostBudget(0, 10, daily_limit="1.00", strict=strict), ledger), ledger


def run_threads(gate: BudgetGate) -> int:
    """50 threads pass (or fail) the gate together; none records until all have tried."""
    start = threading.Barrier(CALLS)
    gated = threading.Barrier(CALLS)
    admitted: list[BudgetTicket] = []

    def call() -> None:
        start.wait(timeout=5)
        try:
            ticket: BudgetTicket | None = gate.begin("chat", max_output_tokens=1000)
        except BudgetExceededError:
            ticket = None
        gated.wait(timeout=5)  # the worst case for a pre-call check: all in flight at once
        if ticket is not None:
            admitted.append(ticket)
            ticket.finish(Usage(0, 1000, estimated=False))

    threads = [threading.Thread(target=call) for _ in range(CALLS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    return len(admitted)


def test_strict_mode_never_overshoots_with_fifty_concurrent_threads() -> None:
    gate, ledger = nearly_spent(strict=True)
    admitted = run_threads(gate)
    assert admitted == 10
    assert ledger.spend("day", now=NOON) == Decimal("1.00")


def test_default_mode_overshoots_by_every_call_in_flight_with_fifty_threads() -> None:
    gate, ledger = nearly_spent(strict=False)
    admitted = run_threads(gate)
    assert admitted == CALLS
    overshoot = ledger.spend("day", now=NOON) - Decimal("1.00")
    assert overshoot == Decimal("0.40")  # 50 x 0.01 on top of 0.90: 40 calls' worth too many


async def test_strict_mode_never_overshoots_with_fifty_concurrent_tasks() -> None:
    gate, ledger = nearly_spent(strict=True)

    async def call() -> bool:
        try:
            ticket = await gate.abegin("chat", max_output_tokens=1000)
        except BudgetExceededError:
            return False
        await asyncio.sleep(0)  # let the other tasks reach the gate meanwhile
        await ticket.afinish(Usage(0, 1000, estimated=False))
        return True

    results = await asyncio.gather(*(call() for _ in range(CALLS)))
    assert sum(results) == 10
    assert ledger.spend("day", now=NOON) == Decimal("1.00")


async def test_default_mode_overshoots_with_fifty_tasks_that_all_pass_the_gate_first() -> None:
    gate, ledger = nearly_spent(strict=False)
    tickets = await asyncio.gather(*(gate.abegin("chat") for _ in range(CALLS)))
    await asyncio.gather(*(ticket.afinish(Usage(0, 1000, estimated=False)) for ticket in tickets))
    assert ledger.spend("day", now=NOON) - Decimal("1.00") == Decimal("0.40")


def test_strict_mode_holds_the_worst_case_with_4096_output_tokens_by_default() -> None:
    gate = gate_for(CostBudget(3, 15, daily_limit=10, strict=True))
    ticket = gate.begin("chat", estimated_input_tokens=1000)
    assert DEFAULT_MAX_OUTPUT_TOKENS == 4096
    assert ticket.reservation is not None
    assert ticket.reservation.amount == Decimal("0.06444")  # 1000 x 3 + 4096 x 15, per million
    held = gate.begin("embedding", estimated_input_tokens=1000, max_output_tokens=500).reservation
    assert held is not None
    assert held.amount == Decimal(0)  # embeddings have no output; surface embedding price is 0


def test_strict_mode_counts_the_prompt_the_call_gives_and_holds_it_with_the_output_cap() -> None:
    gate = gate_for(CostBudget(3, 15, daily_limit=10, strict=True))
    prompt = [("system", "Be brief."), ("user", "What is the capital of France?")]
    ticket = gate.begin("chat", prompt=prompt, max_output_tokens=100)
    assert ticket.reservation is not None
    prompt_tokens = count_message_tokens(prompt)
    assert ticket.reservation.amount == (prompt_tokens * 3 + 100 * 15) / Decimal(1_000_000)


async def test_strict_mode_counts_an_embedding_calls_texts() -> None:
    gate = gate_for(CostBudget(0, 0, embedding_price_per_mtok=1, daily_limit=10, strict=True))
    texts = ["hello world", "the quick brown fox"]
    ticket = await gate.abegin("embedding", texts=texts)
    assert ticket.reservation is not None
    tokens = sum(count_tokens(text) for text in texts)
    assert ticket.reservation.amount == tokens / Decimal(1_000_000)


def test_default_mode_takes_the_calls_shape_without_holding_anything() -> None:
    ledger = InMemoryCostLedger()
    gate = gate_for(CostBudget(3, 15, daily_limit=10), ledger)
    ticket = gate.begin("chat", prompt=[("user", "hi")], max_output_tokens=100)
    assert ticket.reservation is None
    assert ledger.spend("day", now=NOON) == 0


@pytest.mark.parametrize(
    ("surface", "shape", "named"),
    [
        ("chat", {"texts": ["hi"]}, "texts"),
        ("embedding", {"prompt": [("user", "hi")]}, "prompt"),
        ("chat", {"prompt": [("user", "hi")], "estimated_input_tokens": 5}, "not both"),
    ],
)
def test_a_call_shape_that_does_not_fit_the_surface_is_refused(
    surface: Any, shape: dict[str, Any], named: str
) -> None:
    gate = gate_for(CostBudget(3, 15, daily_limit=10, strict=True))
    with pytest.raises(ValueError, match=named):
        gate.begin(surface, **shape)


def test_the_served_model_is_the_first_real_name_most_specific_first() -> None:
    assert served_model("gpt-4o-2024-08-06", "secondary", "fallback") == "gpt-4o-2024-08-06"
    assert served_model(None, "", "secondary", "fallback") == "secondary"
    # A framework's placeholder is not a name: an unnamed model is recorded as None.
    assert served_model(None, "unknown") is None
    assert served_model(None, 42, "gpt-4o") == "gpt-4o"
    assert served_model() is None


def test_finishing_replaces_the_hold_with_the_real_cost() -> None:
    ledger = InMemoryCostLedger()
    gate = gate_for(CostBudget(0, 10, daily_limit=1, strict=True), ledger)
    ticket = gate.begin("chat", max_output_tokens=1000)
    assert ledger.spend("day", now=NOON) == PER_CALL  # the hold counts while the call runs
    ticket.finish(Usage(0, 300, estimated=False))
    assert ledger.spend("day", now=NOON) == Decimal("0.003")


def test_abandoning_releases_the_reservation_and_records_nothing() -> None:
    ledger = InMemoryCostLedger()
    gate = gate_for(CostBudget(0, 10, daily_limit="0.01", strict=True), ledger)
    ticket = gate.begin("chat", max_output_tokens=1000)
    with pytest.raises(BudgetExceededError):
        gate.begin("chat", max_output_tokens=1000)
    ticket.abandon()
    assert ledger.spend("day", now=NOON) == 0
    gate.begin("chat", max_output_tokens=1000)  # the released hold fits again
    assert ledger.entries() == []


async def test_async_abandon_releases_the_reservation_too() -> None:
    ledger = InMemoryCostLedger()
    gate = gate_for(CostBudget(0, 10, daily_limit="0.01", strict=True), ledger)
    ticket = await gate.abegin("chat", max_output_tokens=1000)
    await ticket.aabandon()
    assert ledger.spend("day", now=NOON) == 0
    await gate.abegin("chat", max_output_tokens=1000)


def test_the_first_of_finish_or_abandon_wins() -> None:
    ledger = InMemoryCostLedger()
    gate = gate_for(CostBudget(1, daily_limit=1, strict=True), ledger)
    ticket = gate.begin("chat", max_output_tokens=10)
    assert ticket.finish(Usage(5, 5, estimated=False)) is not None
    ticket.abandon()  # e.g. from a finally block
    assert ticket.finish(Usage(5, 5, estimated=False)) is None
    assert len(ledger.entries()) == 1


def test_a_failed_call_in_default_mode_records_nothing() -> None:
    ledger = InMemoryCostLedger()
    gate_for(CostBudget(daily_limit=1), ledger).begin("chat").abandon()
    assert ledger.entries() == []


# -- ledger failures and warnings ---------------------------------------------------------


@pytest.mark.parametrize("strict", [False, True])
def test_an_unreadable_ledger_lets_the_call_through_with_a_warning(
    strict: bool, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = BrokenLedger(reads=True)
    gate = gate_for(CostBudget(daily_limit=1, monthly_limit=1, strict=strict), ledger)
    with caplog.at_level(logging.WARNING, logger="llm_resilience.budget"):
        ticket = gate.begin("chat", scope="tenant-1")
    assert ticket.reservation is None
    assert [record.getMessage() for record in caplog.records] == [
        "Cost ledger BrokenLedger unreadable (OSError); letting this chat call through ungated."
    ]
    ticket.finish(Usage(1, 1, estimated=False))
    assert len(ledger.entries()) == 1


async def test_an_unreadable_ledger_lets_async_calls_through_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = gate_for(CostBudget(daily_limit=1), BrokenLedger(reads=True))
    with caplog.at_level(logging.WARNING, logger="llm_resilience.budget"):
        ticket = await gate.abegin("embedding")
    assert isinstance(ticket, BudgetTicket)
    assert "ungated" in caplog.text


@pytest.mark.parametrize("strict", [False, True])
async def test_an_unwritable_ledger_lets_the_call_succeed_with_a_warning(
    strict: bool, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = BrokenLedger(writes=True)
    gate = gate_for(CostBudget(1, daily_limit=1, strict=strict), ledger)
    with caplog.at_level(logging.WARNING, logger="llm_resilience.budget"):
        entry = gate.begin("chat").finish(Usage(10, 0, estimated=False))
        async_entry = await (await gate.abegin("chat")).afinish(Usage(10, 0, estimated=False))
    assert entry is not None
    assert async_entry is not None
    assert entry.cost == Decimal("0.00001")
    messages = [record.getMessage() for record in caplog.records]
    assert (
        messages
        == [
            "Cost ledger BrokenLedger unwritable (OSError); the chat call succeeded but its cost was not recorded."
        ]
        * 2
    )


def test_the_in_memory_default_warns_once_per_gate_naming_sql_cost_ledger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="llm_resilience.budget"):
        gate = BudgetGate(CostBudget(daily_limit=1), now=Clock())
        gate.begin("chat").finish(Usage(1, 1, estimated=False))
        gate.begin("chat").finish(Usage(1, 1, estimated=False))
        BudgetGate(CostBudget(daily_limit=1), BrokenLedger())  # persistent: no warning
        BudgetGate(CostBudget(daily_limit=1), InMemoryCostLedger())  # chosen: no warning
    assert isinstance(gate.ledger, InMemoryCostLedger)
    assert len(caplog.records) == 1
    assert "SqlCostLedger" in caplog.records[0].getMessage()
    assert "resets when the process restarts" in caplog.records[0].getMessage()


def test_a_naive_clock_is_refused_instead_of_guessed() -> None:
    gate = BudgetGate(CostBudget(daily_limit=1), BrokenLedger(), now=lambda: datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        gate.begin("chat")


# -- telemetry ----------------------------------------------------------------------------


def counter_points(reader: Any) -> dict[str, dict[tuple[tuple[str, Any], ...], Any]]:
    found: dict[str, dict[tuple[tuple[str, Any], ...], Any]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name in (
                    telemetry.LLM_TOKENS,
                    telemetry.LLM_COST,
                    telemetry.BUDGET_UNPRICED,
                ):
                    points = found.setdefault(metric.name, {})
                    for point in metric.data.data_points:
                        points[tuple(sorted(point.attributes.items()))] = point.value
                    found[metric.name + ".unit"] = {(): metric.unit}
    return found


def test_finishing_counts_tokens_and_cost_with_genai_attributes(metric_reader: Any) -> None:
    gate = gate_for(CostBudget(3, 15, 1, daily_limit=100))
    gate.begin("chat").finish(Usage(1000, 200, estimated=False))
    gate.begin("embedding").finish(Usage(500, 0, estimated=True))
    gate.begin("chat").abandon()  # abandoned calls count nothing

    points = counter_points(metric_reader)
    assert points[telemetry.LLM_TOKENS + ".unit"] == {(): "{token}"}
    assert points[telemetry.LLM_TOKENS] == {
        (
            ("direction", "in"),
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.token.type", "input"),
            ("surface", "chat"),
        ): 1000,
        (
            ("direction", "out"),
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.token.type", "output"),
            ("surface", "chat"),
        ): 200,
        (
            ("direction", "in"),
            ("gen_ai.operation.name", "embeddings"),
            ("gen_ai.token.type", "input"),
            ("surface", "embedding"),
        ): 500,
    }
    assert points[telemetry.LLM_COST] == {
        (("gen_ai.operation.name", "chat"), ("surface", "chat")): pytest.approx(0.006),
        (("gen_ai.operation.name", "embeddings"), ("surface", "embedding")): pytest.approx(0.0005),
    }


def test_importing_the_budget_imports_neither_sqlalchemy_nor_opentelemetry() -> None:
    import subprocess
    import sys

    code = (
        "import sys, llm_resilience.budget\n"
        "print(sorted(m for m in ('sqlalchemy', 'sqlmodel', 'opentelemetry') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_a_strict_hold_is_priced_at_the_dearest_model_that_may_serve() -> None:
    budget = CostBudget(
        input_price_per_mtok=1,
        output_price_per_mtok=1,
        daily_limit=100,
        strict=True,
        prices={"cheap": ModelPrice(1, 2), "dear": ModelPrice(10, 40)},
    )
    gate = BudgetGate(budget, InMemoryCostLedger())
    cheap = gate.worst_case_cost(
        "chat", estimated_input_tokens=1000, max_output_tokens=1000, model="cheap"
    )
    either = gate.worst_case_cost(
        "chat",
        estimated_input_tokens=1000,
        max_output_tokens=1000,
        model="cheap",
        may_serve=["dear"],
    )
    assert cheap == Decimal("0.003")
    assert either == Decimal("0.05")
    ticket = gate.begin(
        "chat", estimated_input_tokens=1000, max_output_tokens=1000, may_serve=["cheap", "dear"]
    )
    assert ticket.reservation is not None
    assert ticket.reservation.amount == Decimal("0.05")
    ticket.abandon()


# -- strict holds up to each serving model's own output cap ------------------------------------

CAPPED_PRICES = {"cheap": ModelPrice(1, 2), "dear": ModelPrice(10, 40), "long": ModelPrice(1, 10)}


def capped_gate(ledger: InMemoryCostLedger | None = None) -> BudgetGate:
    budget = CostBudget(1, 1, daily_limit=100, strict=True, prices=CAPPED_PRICES)
    return gate_for(budget, ledger or InMemoryCostLedger())


def test_a_member_allowed_8000_output_tokens_makes_the_hold_8000_tokens_at_its_price() -> None:
    ledger = InMemoryCostLedger()
    ticket = capped_gate(ledger).begin(
        "chat",
        estimated_input_tokens=1000,
        model="cheap",
        may_serve=["cheap", ServingModel("long", max_output_tokens=8000)],
    )
    assert ticket.reservation is not None
    # long: 1,000 x 1 + 8,000 x 10 millionths, not the 4,096 tokens (0.04196) held before;
    # cheap, uncapped: 1,000 x 1 + 4,096 x 2.
    assert ticket.reservation.amount == Decimal("0.081")
    assert ledger.spend("day", now=NOON) == Decimal("0.081")
    ticket.abandon()


@pytest.mark.parametrize(
    ("cheap_cap", "dear_cap", "expected"),
    [
        (8000, 500, Decimal("0.03")),  # dear: 10,000 + 500 x 40 beats cheap's 1,000 + 16,000
        (64000, 1000, Decimal("0.129")),  # cheap: 1,000 + 64,000 x 2 beats dear's 50,000
    ],
)
def test_the_dearest_combination_of_output_cap_and_price_sets_the_hold(
    cheap_cap: int, dear_cap: int, expected: Decimal
) -> None:
    hold = capped_gate().worst_case_cost(
        "chat",
        estimated_input_tokens=1000,
        may_serve=[ServingModel("cheap", cheap_cap), ServingModel("dear", dear_cap)],
    )
    assert hold == expected


def test_a_calls_own_max_output_tokens_caps_every_model_that_may_serve() -> None:
    hold = capped_gate().worst_case_cost(
        "chat",
        estimated_input_tokens=1000,
        max_output_tokens=100,
        may_serve=[ServingModel("long", 8000), ServingModel("dear", 64000)],
    )
    assert hold == Decimal("0.014")  # dear: 10,000 + 100 x 40


def test_a_model_named_plainly_and_with_a_cap_is_held_at_its_cap() -> None:
    gate = capped_gate()
    hold = gate.worst_case_cost(
        "chat", model="dear", may_serve=["dear", ServingModel("dear", max_output_tokens=100)]
    )
    assert hold == Decimal("0.004")  # 100 x 40, not the default 4,096 x 40
    uncapped = gate.worst_case_cost("chat", model="dear", may_serve=[ServingModel("dear")])
    assert uncapped == Decimal(DEFAULT_MAX_OUTPUT_TOKENS * 40) / 10**6


def test_a_chain_without_a_model_name_is_held_only_for_its_members() -> None:
    # The surface prices (1, 1) would hold 4,096 tokens; the only member stops at 100.
    hold = capped_gate().worst_case_cost("chat", may_serve=[ServingModel("cheap", 100)])
    assert hold == Decimal("0.0002")
    assert capped_gate().worst_case_cost("chat") == Decimal("0.004096")


def test_embeddings_hold_no_output_whatever_the_caps() -> None:
    hold = capped_gate().worst_case_cost(
        "embedding", estimated_input_tokens=1000, may_serve=[ServingModel("dear", 8000)]
    )
    assert hold == Decimal("0.01")


@pytest.mark.parametrize(
    ("make", "error", "word"),
    [
        (lambda: ServingModel(""), TypeError, "ServingModel.name"),
        (lambda: ServingModel("m", max_output_tokens=-1), ValueError, "max_output_tokens"),
        (lambda: ServingModel("m", max_output_tokens=True), ValueError, "max_output_tokens"),
        (lambda: capped_gate().worst_case_cost("chat", may_serve="dear"), TypeError, "may_serve"),
        (lambda: capped_gate().begin("chat", may_serve=[3]), TypeError, "may_serve"),  # type: ignore[list-item]
    ],
    ids=["empty-name", "negative-cap", "bool-cap", "a-str-for-may-serve", "a-number-in-may-serve"],
)
def test_bad_serving_models_are_refused_naming_the_field(
    make: Any, error: type[Exception], word: str
) -> None:
    with pytest.raises(error, match=word):
        make()


def test_an_entry_of_an_unknown_model_is_priced_at_the_dearest_that_may_have_served() -> None:
    budget = CostBudget(daily_limit=1, prices=CAPPED_PRICES)  # surface prices 0
    usage = Usage(1000, 100, estimated=True)
    assert dearest_model(budget, usage, ["cheap", ServingModel("dear", 10), "long"]) == "dear"
    # A cap bounds a hold, not the usage being priced: dear's 40 per output token wins.
    candidates = [ServingModel("long", 8000), ServingModel("dear", 1)]
    assert dearest_model(budget, Usage(0, 100_000, estimated=True), candidates) == "dear"
    assert dearest_model(budget, Usage(0, 1000, estimated=True), ["cheap", "long"]) == "long"
    assert dearest_model(budget, usage, []) is None  # the surface prices


# -- the gate's entries: built unchecked from checked values, equal to checked ones ----------


@pytest.mark.parametrize("scope", [None, "tenant-1", "équipe\u00a0nord"])
def test_the_gates_entry_equals_a_ledger_entry_validated_from_the_same_values(
    scope: str | None,
) -> None:
    budget = CostBudget(3, 15, daily_limit=25, prices={"gpt-4o": ModelPrice("2.5", 10)})
    gate = BudgetGate(budget, InMemoryCostLedger(), now=Clock())

    entry = gate.begin("chat", scope=scope, estimated_input_tokens=12).finish(
        Usage(1200, 345, estimated=True), model="gpt-4o-2024-08-06"
    )

    assert entry is not None
    values = {f.name: getattr(entry, f.name) for f in dataclasses.fields(LedgerEntry)}
    validated = LedgerEntry(**values)
    assert validated == entry
    assert validated.entry_id == entry.entry_id
    assert len(entry.entry_id or "") == 32
    assert (entry.kind, entry.surface, entry.pages, entry.scope) == ("chat", "chat", 0, scope)
    assert entry.cost == Decimal("0.00645")  # 1200 x 2.5 + 345 x 10, per million


@pytest.mark.parametrize(
    ("model", "estimated", "error"),
    [
        ("", False, "model must be non-empty text"),
        (42, False, "model must be non-empty text"),
        ("gpt-4o", "yes", "estimated must be a bool"),
    ],
)
def test_finish_refuses_a_served_model_or_flag_no_ledger_entry_could_hold(
    model: Any, estimated: Any, error: str
) -> None:
    ledger = InMemoryCostLedger()
    ticket = BudgetGate(CostBudget(3, 15, daily_limit=25), ledger, now=Clock()).begin("chat")

    with pytest.raises(TypeError, match=error):
        ticket.finish(Usage(10, 5, estimated=estimated), model=model)

    assert ledger.entries() == []


@pytest.mark.parametrize("scope", [None, "tenant-1"])
async def test_a_strict_call_checks_its_scope_once_and_parses_no_limit_again(
    monkeypatch: pytest.MonkeyPatch, scope: str | None
) -> None:
    from llm_resilience import checks
    from llm_resilience.ledger import _protocol

    budget = CostBudget(3, 15, daily_limit=1, monthly_limit=5, global_daily_limit=2, strict=True)
    gate = BudgetGate(budget, InMemoryCostLedger(), now=lambda: NOON)
    scopes: list[object] = []
    limits: list[object] = []
    check_scope, parse = checks.scope, _protocol.money

    def counted_scope(option: str, value: object) -> str | None:
        scopes.append(value)
        return check_scope(option, value)

    def counted_money(option: str, value: object) -> Decimal:
        if option == "limit":
            limits.append(value)
        return parse(option, value)

    monkeypatch.setattr(checks, "scope", counted_scope)
    monkeypatch.setattr(_protocol, "money", counted_money)

    checked = [] if scope is None else [scope]  # None needs no check at all
    ticket = gate.begin("chat", scope=scope, prompt=[("user", "Hi")], max_output_tokens=10)
    assert ticket.reservation is not None
    assert scopes == checked
    await gate.abegin("chat", scope=scope, prompt=[("user", "Hi")], max_output_tokens=10)
    assert scopes == checked * 2
    assert limits == []


def test_a_ledger_still_checks_limits_that_were_not_built_by_a_gate() -> None:
    ledger = InMemoryCostLedger()
    with pytest.raises(ValueError, match="scope"):
        ledger.reserve(Decimal(1), limits={("day", "\x00"): Decimal(5)}, scope=None, now=NOON)
    with pytest.raises(TypeError, match="limit"):
        ledger.reserve(Decimal(1), limits={("day", None): 5.0}, scope=None, now=NOON)  # type: ignore[dict-item]
