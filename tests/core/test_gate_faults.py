"""The budget gate under faults: bad construction, cancelled callers, quiet warnings."""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from llm_resilience.budget import BudgetGate, CostBudget, ModelPrice
from llm_resilience.errors import BudgetExceededError
from llm_resilience.ledger import InMemoryCostLedger, SqlCostLedger
from llm_resilience.usage import Usage

STRICT = CostBudget(3, 15, daily_limit=1000, strict=True)


def _live_holds(path: Path) -> int:
    with sqlite3.connect(path) as connection:
        (count,) = connection.execute("SELECT COUNT(*) FROM cost_ledger_reservations").fetchone()
    return int(count)


async def _eventually(check: Any, *, within: float = 5.0, steady: float = 0.5) -> None:
    """Wait until ``check()`` has held for ``steady`` seconds (at most ``within``): the
    writes a cancelled caller started end in the background, a little later."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    held_since: float | None = None
    while loop.time() < deadline:
        if not check():
            held_since = None
        elif held_since is None:
            held_since = loop.time()
        elif loop.time() - held_since >= steady:
            return
        await asyncio.sleep(0.02)


# -- construction ------------------------------------------------------------------------


def test_a_ledger_given_as_a_url_string_is_refused_suggesting_sql_cost_ledger() -> None:
    with pytest.raises(TypeError, match=r"ledger.*SqlCostLedger\('sqlite:///spend.db'\)"):
        BudgetGate(STRICT, "sqlite:///spend.db")  # type: ignore[arg-type]


@pytest.mark.parametrize("ledger", [42, object(), {"spend": 0}, 1.5])
def test_a_ledger_that_is_not_a_ledger_is_refused_naming_the_option(ledger: Any) -> None:
    with pytest.raises(TypeError, match=r"^ledger must be a cost ledger"):
        BudgetGate(STRICT, ledger)


@pytest.mark.parametrize(
    ("scope", "problem"),
    [
        ("tenant\x00one", "control character"),
        ("tenant\ud800", "lone surrogate"),
        ("t" * 10_000, "at most 256 characters"),
        ("", "non-empty"),
    ],
)
def test_a_scope_no_ledger_can_store_is_refused_before_the_call(scope: str, problem: str) -> None:
    gate = BudgetGate(STRICT, InMemoryCostLedger())
    with pytest.raises(ValueError, match=rf"scope.*{problem}"):
        gate.begin("chat", scope=scope)
    assert gate.ledger.spend("day") == 0


@pytest.mark.parametrize(
    ("option", "build"),
    [
        ("input_per_mtok", lambda: ModelPrice("1E+200000", 1)),
        ("output_per_mtok", lambda: ModelPrice(1, "1E-40")),
        ("input_price_per_mtok", lambda: CostBudget("1E+200000", 1, daily_limit=1)),
        ("daily_limit", lambda: CostBudget(1, 1, daily_limit="1E+16")),
    ],
)
def test_money_no_ledger_column_can_hold_is_refused_at_construction(
    option: str, build: Any
) -> None:
    with pytest.raises(ValueError, match=option):
        build()


def test_the_largest_allowed_price_is_stored_and_read_back_exactly(tmp_path: Path) -> None:
    price = ModelPrice("999999999999999.999999999999999999", 0)
    budget = CostBudget(daily_limit="999999999999999", prices={"dear": price})
    gate = BudgetGate(budget, SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}"))
    ticket = gate.begin("chat", model="dear")
    entry = ticket.finish(Usage(1, 0, estimated=False))
    assert entry is not None
    assert entry.cost == Decimal("999999999.999999999999999999999999")
    assert gate.ledger.spend("day") == entry.cost


# -- cancellation ------------------------------------------------------------------------


async def test_callers_cancelled_at_random_points_leave_no_hold_behind(tmp_path: Path) -> None:
    path = tmp_path / "spend.db"
    gate = BudgetGate(STRICT, SqlCostLedger(f"sqlite:///{path}"))
    rng = random.Random(20261130)
    finished = 0

    async def call() -> None:
        nonlocal finished
        ticket = await gate.abegin("chat", estimated_input_tokens=100, max_output_tokens=50)
        try:
            await asyncio.sleep(rng.uniform(0, 0.004))
        except BaseException:
            await ticket.aabandon()
            raise
        await ticket.afinish(Usage(100, 20, estimated=False))
        finished += 1

    tasks = [asyncio.create_task(call()) for _ in range(200)]
    loop = asyncio.get_running_loop()
    for task in tasks:
        loop.call_later(rng.uniform(0, 0.3), task.cancel)
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    cancelled = sum(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes)
    assert cancelled > 20, "the seed must cancel a good share of the calls mid-way"

    await _eventually(lambda: _live_holds(path) == 0)
    assert _live_holds(path) == 0
    entries = gate.ledger.entries()
    assert len(entries) >= finished
    assert gate.ledger.spend("day") == sum((entry.cost for entry in entries), Decimal(0))


async def test_a_caller_cancelled_while_its_hold_is_written_releases_it(tmp_path: Path) -> None:
    path = tmp_path / "spend.db"
    gate = BudgetGate(STRICT, SqlCostLedger(f"sqlite:///{path}"))
    # Hold the write lock so the reservation is still being written when the caller goes.
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    caller = asyncio.create_task(gate.abegin("chat", estimated_input_tokens=10))
    await asyncio.sleep(0.2)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    blocker.execute("COMMIT")
    blocker.close()

    await _eventually(lambda: _live_holds(path) == 0)
    assert _live_holds(path) == 0
    assert gate.ledger.spend("day") == 0


async def test_a_record_in_flight_when_its_caller_is_cancelled_is_still_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "spend.db"
    gate = BudgetGate(STRICT, SqlCostLedger(f"sqlite:///{path}"))
    ticket = await gate.abegin("chat", estimated_input_tokens=10)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    writer = asyncio.create_task(ticket.afinish(Usage(10, 5, estimated=False)))
    await asyncio.sleep(0.2)
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    blocker.execute("COMMIT")
    blocker.close()

    await _eventually(lambda: len(gate.ledger.entries()) == 1)
    assert [entry.input_tokens for entry in gate.ledger.entries()] == [10]
    assert _live_holds(path) == 0


# -- privacy -----------------------------------------------------------------------------


class _LeakyLedger(InMemoryCostLedger):
    """A ledger whose errors quote their parameters, as SQLAlchemy's do by default."""

    def spend(self, window: Any, *, scope: Any = None, now: Any = None) -> Decimal:
        raise OSError(f"read failed [parameters: ('day:2026-11-30', {scope!r})]")

    def record(self, entry: Any) -> None:
        raise OSError(f"write failed [parameters: ({entry.scope!r},)]")


def test_ledger_failure_warnings_name_the_error_and_the_ledger_never_the_scope(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret_scope = "key:sk-FAKE-scope-0000"
    gate = BudgetGate(CostBudget(3, 15, daily_limit=10), _LeakyLedger())
    with caplog.at_level(logging.WARNING, logger="llm_resilience.budget"):
        ticket = gate.begin("chat", scope=secret_scope)
        ticket.finish(Usage(10, 5, estimated=False))
    text = "\n".join(
        record.getMessage() + (logging.Formatter().formatException(record.exc_info))
        if record.exc_info
        else record.getMessage()
        for record in caplog.records
    )
    assert "_LeakyLedger unreadable (OSError)" in text
    assert "_LeakyLedger unwritable (OSError)" in text
    assert "sk-FAKE" not in text


def test_reservation_ttl_of_timedelta_max_is_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match="reservation_ttl"):
        InMemoryCostLedger(reservation_ttl=timedelta.max)


def test_a_reached_limit_still_refuses_with_a_large_but_allowed_ttl() -> None:
    ledger = InMemoryCostLedger(reservation_ttl=timedelta(days=365))
    gate = BudgetGate(CostBudget(3, 15, daily_limit="0.0001", strict=True), ledger)
    gate.begin("chat", estimated_input_tokens=10, max_output_tokens=1)
    with pytest.raises(BudgetExceededError):
        gate.begin("chat", estimated_input_tokens=100, max_output_tokens=100)


def test_a_ledger_url_string_with_a_password_is_refused_without_showing_it() -> None:
    with pytest.raises(TypeError) as caught:
        BudgetGate(STRICT, "postgresql+psycopg://app:hunter2-secret@db/spend")  # type: ignore[arg-type]
    assert "hunter2" not in str(caught.value)
    assert "SqlCostLedger(" in str(caught.value)


class _SlowFailingLedger(InMemoryCostLedger):
    """An async ledger whose write fails after a while (no worker thread to finish it)."""

    async def arecord(self, entry: Any) -> None:
        await asyncio.sleep(0.05)
        raise OSError("write failed")


async def test_a_write_that_fails_after_its_caller_was_cancelled_is_still_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = BudgetGate(CostBudget(3, 15, daily_limit=10), _SlowFailingLedger())
    ticket = await gate.abegin("chat")
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    with caplog.at_level(logging.WARNING, logger="llm_resilience.budget"):
        writer = asyncio.create_task(ticket.afinish(Usage(10, 5, estimated=False)))
        await asyncio.sleep(0.01)
        writer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writer
        await asyncio.sleep(0.1)  # the shielded write goes on and fails
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Cost ledger")]
    assert warned == [
        "Cost ledger _SlowFailingLedger unwritable (OSError); "
        "the chat call succeeded but its cost was not recorded."
    ]
    assert unhandled == []


async def test_a_write_that_needs_no_wait_is_recorded_at_once_with_no_task_made() -> None:
    # afinish starts its write as an eager task would: an in-memory write never
    # suspends, so nothing is scheduled (a task per call cost tens of µs on async paths).
    memory, slow = InMemoryCostLedger(), _SlowLedger()
    instant_ticket = await BudgetGate(CostBudget(3, 15, daily_limit=10), memory).abegin("chat")
    waiting_ticket = await BudgetGate(CostBudget(3, 15, daily_limit=10), slow).abegin("chat")
    loop = asyncio.get_running_loop()
    made: list[object] = []
    default = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        made.append(coro)
        return default(loop, coro, **kwargs) if default else asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(counting)
    try:
        await instant_ticket.afinish(Usage(10, 5, estimated=False))
        assert made == []
        assert [entry.input_tokens for entry in memory.entries()] == [10]
        await waiting_ticket.afinish(Usage(1, 1, estimated=False))
    finally:
        loop.set_task_factory(default)
    assert len(made) == 1  # only the write that waited got a task of its own
    assert [entry.input_tokens for entry in slow.entries()] == [1]


class _SlowLedger(InMemoryCostLedger):
    """A ledger whose async write waits a little before it records."""

    async def arecord(self, entry: Any) -> None:
        await asyncio.sleep(0.01)
        self.record(entry)
