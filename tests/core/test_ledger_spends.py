"""Reading every window a budget needs in one go: ``spends``, and the gate reading through it.

A gate with day and month limits, scoped and global, reads up to four spends before each
call. Both of our ledgers answer them together (``spends``: one lock hold in memory; one
bounded operation and one statement in SQL), and any other ledger through its ``spend``
(``read_spends``, the protocol's default). The three ledgers are held equal to their own
per-window ``spend``, holds and pending writes included, and the gate refuses exactly at
a limit through that read, sync and async. On SQLite, where a write now adds its cost to
the totals in SQL, the totals stay exact decimal text and a record is committed when it
returns.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from llm_resilience import BudgetExceededError, CostBudget
from llm_resilience.budget import BudgetGate
from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry, SqlCostLedger, Window
from llm_resilience.ledger._protocol import SpendWindow, aread_spends, read_spends
from llm_resilience.usage import Usage

NOW = datetime(2026, 11, 30, 23, 30, tzinfo=UTC)  # the last day of a month
WINDOWS: list[SpendWindow] = [
    ("day", "tenant-1"),
    ("day", None),
    ("month", "tenant-1"),
    ("month", None),
    ("day", "tenant-2"),  # nothing recorded for it
]


@contextmanager
def postgres_schema(base_url: str) -> Iterator[str]:
    """A URL whose connections live in a fresh schema, dropped with its tables on exit."""
    pytest.importorskip("psycopg")
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    name = f"ledger_spends_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url)
    with admin.begin() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {name}")
    try:
        url = make_url(base_url).update_query_dict({"options": f"-csearch_path={name}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA {name} CASCADE")
        admin.dispose()


@contextmanager
def ledger_on(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if backend == "memory":
        yield InMemoryCostLedger()
        return
    if backend == "sqlite":
        ledger = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
        try:
            yield ledger
        finally:
            ledger.close()
        return
    with postgres_schema(request.getfixturevalue("postgres_url")) as url:
        ledger = SqlCostLedger(url)
        try:
            yield ledger
        finally:
            ledger.close()


def entry(cost: str, *, at: datetime = NOW, scope: str | None = None) -> LedgerEntry:
    return LedgerEntry(at, "chat", 100, 20, Decimal(cost), model="gpt-4o-mini", scope=scope)


def fill(ledger: Any) -> None:
    """Entries in today, earlier this month, last month and tomorrow (next month), scoped
    and not, with more decimal places than a float keeps; a live hold and a settled one."""
    ledger.record(entry("0.000000000000000000000001", scope="tenant-1"))
    ledger.record(entry("0.1", scope="tenant-1"))
    ledger.record(entry("0.2"))
    ledger.record(entry("1.25", at=NOW - timedelta(days=3), scope="tenant-1"))
    ledger.record(entry("7", at=NOW - timedelta(days=31)))  # October
    ledger.record(entry("9", at=NOW + timedelta(hours=1)))  # 1 December
    ledger.reserve(Decimal("0.05"), limits={}, scope="tenant-1", now=NOW)
    settled = ledger.reserve(Decimal("3"), limits={}, scope=None, now=NOW)
    ledger.settle(settled, None)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def filled(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Each ledger, `fill`ed."""
    with ledger_on(request.param, request, tmp_path) as ledger:
        fill(ledger)
        yield ledger


EXPECTED = (
    Decimal("0.150000000000000000000001"),  # today, tenant-1: 1e-24 + 0.1 + hold 0.05
    Decimal("0.350000000000000000000001"),  # today, everyone: + 0.2
    Decimal("1.400000000000000000000001"),  # November, tenant-1: + 1.25
    Decimal("1.600000000000000000000001"),  # November, everyone
    Decimal(0),
)


def test_spends_returns_what_spend_returns_for_each_window_in_order(filled: Any) -> None:
    each = tuple(filled.spend(window, scope=scope, now=NOW) for window, scope in WINDOWS)
    assert filled.spends(WINDOWS, now=NOW) == each == EXPECTED
    # A window named twice is read twice; none is a read of nothing.
    assert filled.spends([("day", None), ("day", None)], now=NOW) == EXPECTED[1:2] * 2
    assert filled.spends([], now=NOW) == ()


def test_repeated_reads_take_each_call_s_instant_for_holds_and_windows(filled: Any) -> None:
    # PostgreSQL keeps the read's text and parameters per windows and keys; the time
    # must still be each call's: a hold expires, the day and month turn, and an earlier
    # instant reads as it did.
    windows: list[SpendWindow] = [("day", "tenant-1"), ("month", None)]
    assert filled.spends(windows, now=NOW) == (EXPECTED[0], EXPECTED[3])
    hold_gone = NOW + filled.reservation_ttl + timedelta(seconds=1)
    assert hold_gone.date() == NOW.date()
    assert filled.spends(windows, now=hold_gone) == (
        EXPECTED[0] - Decimal("0.05"),
        EXPECTED[3] - Decimal("0.05"),
    )
    december = NOW + timedelta(hours=1)  # 1 December: only the 9 recorded then
    assert filled.spends(windows, now=december) == (Decimal(0), Decimal(9))
    assert filled.spends(windows, now=NOW) == (EXPECTED[0], EXPECTED[3])


async def test_aspends_returns_what_spends_returns(filled: Any) -> None:
    assert await filled.aspends(WINDOWS, now=NOW) == EXPECTED


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_spends_refuses_a_bad_window_or_scope_naming_it(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    with ledger_on(backend, request, tmp_path) as ledger:
        with pytest.raises(ValueError, match="window must be 'day' or 'month', got 'week'"):
            ledger.spends([("week", None)], now=NOW)
        with pytest.raises(TypeError, match="windows must hold"):
            ledger.spends(["day"], now=NOW)
        with pytest.raises(TypeError, match="windows must be a sequence"):
            ledger.spends("day", now=NOW)
        with pytest.raises(ValueError, match="scope"):
            ledger.spends([("day", "bad\x00scope")], now=NOW)
        with pytest.raises(ValueError, match="naive"):
            ledger.spends([("day", None)], now=datetime(2026, 11, 30))


def test_sqlite_spends_counts_writes_waiting_while_another_process_holds_the_lock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "spend.db"
    ledger = SqlCostLedger(f"sqlite:///{path}", operation_timeout=0.2)
    try:
        ledger.record(entry("0.5", scope="tenant-1"))
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            ledger.record(entry("0.25", scope="tenant-1"))  # waits in memory
            assert ledger.pending == 1
            # WAL: the read goes on during another's write, adding what waits.
            assert ledger.spends([("day", "tenant-1"), ("month", None)], now=NOW) == (
                Decimal("0.75"),
                Decimal("0.75"),
            )
        finally:
            holder.execute("COMMIT")
            holder.close()
        assert ledger.spends([("day", None)], now=NOW) == (Decimal("0.75"),)
        assert ledger.pending == 0
    finally:
        ledger.close()


def test_sqlite_totals_stay_exact_decimal_text_that_older_readers_read(tmp_path: Path) -> None:
    path = tmp_path / "spend.db"
    ledger = SqlCostLedger(f"sqlite:///{path}")
    try:
        for _ in range(3):
            ledger.record(entry("0.1"))
        ledger.record(entry("0.000000000000000000000001", scope="tenant-1"))
    finally:
        ledger.close()
    with sqlite3.connect(path) as raw:
        rows = raw.execute(
            "SELECT window_key, scope, total, typeof(total) FROM cost_ledger_totals "
            "ORDER BY window_key, scope"
        ).fetchall()
    assert rows == [
        ("day:2026-11-30", "", "0.300000000000000000000001", "text"),
        ("day:2026-11-30", "tenant-1", "0.000000000000000000000001", "text"),
        ("month:2026-11", "", "0.300000000000000000000001", "text"),
        ("month:2026-11", "tenant-1", "0.000000000000000000000001", "text"),
    ]


def test_a_sqlite_record_is_committed_when_it_returns(tmp_path: Path) -> None:
    path = tmp_path / "spend.db"
    ledger = SqlCostLedger(f"sqlite:///{path}")
    try:
        for count in range(1, 4):
            ledger.record(entry("0.25"))
            # Another connection (another process would do the same) sees it at once.
            with sqlite3.connect(path) as raw:
                stored = raw.execute("SELECT COUNT(*) FROM cost_ledger").fetchone()[0]
                total = raw.execute(
                    "SELECT total FROM cost_ledger_totals WHERE window_key = 'day:2026-11-30'"
                ).fetchone()[0]
            raw.close()
            assert (stored, Decimal(total)) == (count, Decimal("0.25") * count)
    finally:
        ledger.close()


class PerWindowLedger:
    """A third-party ledger: the protocol's methods only, no ``spends``."""

    def __init__(self) -> None:
        self.inner = InMemoryCostLedger()
        self.reads: list[tuple[Window, str | None]] = []

    def spend(self, window: Window, *, scope: str | None = None, now: Any = None) -> Decimal:
        self.reads.append((window, scope))
        return self.inner.spend(window, scope=scope, now=now)

    async def aspend(self, window: Window, *, scope: str | None = None, now: Any = None) -> Decimal:
        self.reads.append((window, scope))
        return self.inner.spend(window, scope=scope, now=now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CountingSpends(InMemoryCostLedger):
    """Our in-memory ledger, counting each kind of read the gate makes."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[Sequence[SpendWindow]] = []

    def spends(self, windows: Sequence[SpendWindow], *, now: Any = None) -> tuple[Decimal, ...]:
        self.batches.append(list(windows))
        return super().spends(windows, now=now)

    async def aspends(
        self, windows: Sequence[SpendWindow], *, now: Any = None
    ) -> tuple[Decimal, ...]:
        self.batches.append(list(windows))
        return InMemoryCostLedger.spends(self, windows, now=now)


class OwnSpend(InMemoryCostLedger):
    """A subclass that decides what a spend read is (it doubles it)."""

    def spend(self, window: Window, *, scope: str | None = None, now: Any = None) -> Decimal:
        return 2 * super().spend(window, scope=scope, now=now)


async def test_read_spends_falls_back_to_spend_for_a_ledger_without_spends() -> None:
    ledger = PerWindowLedger()
    ledger.inner.record(entry("0.5", scope="tenant-1"))
    pairs: list[SpendWindow] = [("day", "tenant-1"), ("month", None)]
    assert read_spends(ledger, pairs, now=NOW) == (Decimal("0.5"), Decimal("0.5"))  # type: ignore[arg-type]
    assert await aread_spends(ledger, pairs, now=NOW) == (Decimal("0.5"), Decimal("0.5"))  # type: ignore[arg-type]
    assert ledger.reads == pairs * 2


def test_read_spends_honours_a_subclass_that_overrides_spend_only() -> None:
    ledger = OwnSpend()
    ledger.record(entry("0.5"))
    assert read_spends(ledger, [("day", None), ("month", None)], now=NOW) == (
        Decimal("1.0"),
        Decimal("1.0"),
    )


def budget_gate(ledger: Any) -> BudgetGate:
    """Day and month limits, scoped and global: four reads per scoped call."""
    budget = CostBudget(
        3,
        15,
        daily_limit=Decimal("1.00"),
        monthly_limit=Decimal("5.00"),
        global_daily_limit=Decimal("2.00"),
        global_monthly_limit=Decimal("10.00"),
    )
    return BudgetGate(budget, ledger, now=lambda: NOW)


USAGE = Usage(0, 0, estimated=False)


def test_the_gate_reads_every_window_in_one_spends_and_refuses_exactly_at_the_limit() -> None:
    ledger = CountingSpends()
    gate = budget_gate(ledger)
    ledger.record(entry("0.99", scope="tenant-1"))
    gate.begin("chat", scope="tenant-1").finish(USAGE)  # 0.99 < 1.00: admitted
    assert ledger.batches == [
        [("day", "tenant-1"), ("day", None), ("month", "tenant-1"), ("month", None)]
    ]
    ledger.record(entry("0.01", scope="tenant-1"))  # exactly at the scope's daily limit
    with pytest.raises(BudgetExceededError) as refused:
        gate.begin("chat", scope="tenant-1")
    assert (refused.value.window, refused.value.scope) == ("day", "tenant-1")
    assert (refused.value.limit, refused.value.spend) == (Decimal("1.00"), Decimal("1.00"))
    gate.begin("chat", scope="tenant-2").abandon()  # another scope: 1.00 < 2.00 global
    ledger.record(entry("1.00", scope="tenant-2"))  # the global day is now exactly 2.00
    with pytest.raises(BudgetExceededError) as overall:
        gate.begin("chat", scope="tenant-3")  # its own spend is 0: the global limit refuses
    assert (overall.value.window, overall.value.scope, overall.value.spend) == (
        "day",
        None,
        Decimal("2.00"),
    )
    assert len(ledger.batches) == 4


async def test_the_async_gate_reads_every_window_in_one_aspends_and_refuses_at_the_limit() -> None:
    ledger = CountingSpends()
    gate = budget_gate(ledger)
    ledger.record(entry("0.99", scope="tenant-1"))
    ticket = await gate.abegin("chat", scope="tenant-1")
    await ticket.afinish(USAGE)
    ledger.record(entry("0.01", scope="tenant-1"))
    with pytest.raises(BudgetExceededError) as refused:
        await gate.abegin("chat", scope="tenant-1")
    assert (refused.value.window, refused.value.limit, refused.value.spend) == (
        "day",
        Decimal("1.00"),
        Decimal("1.00"),
    )
    assert len(ledger.batches) == 2


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_the_gate_on_a_sql_ledger_refuses_exactly_at_the_monthly_limit(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    with ledger_on(backend, request, tmp_path) as ledger:
        gate = budget_gate(ledger)
        ledger.record(entry("4.99", at=NOW - timedelta(days=2), scope="tenant-1"))
        gate.begin("chat", scope="tenant-1").abandon()
        (await gate.abegin("chat", scope="tenant-1")).abandon()
        ledger.record(entry("0.01", at=NOW - timedelta(days=2), scope="tenant-1"))
        with pytest.raises(BudgetExceededError) as refused:
            gate.begin("chat", scope="tenant-1")
        with pytest.raises(BudgetExceededError) as arefused:
            await gate.abegin("chat", scope="tenant-1")
        for error in (refused.value, arefused.value):
            assert (error.window, error.scope, error.limit, error.spend) == (
                "month",
                "tenant-1",
                Decimal("5.00"),
                Decimal("5.00"),
            )


def test_the_gate_reads_a_per_window_ledger_once_per_window() -> None:
    ledger = PerWindowLedger()
    gate = budget_gate(ledger)
    gate.begin("chat", scope="tenant-1").abandon()
    assert ledger.reads == [
        ("day", "tenant-1"),
        ("day", None),
        ("month", "tenant-1"),
        ("month", None),
    ]


class MonthUnreadable(PerWindowLedger):
    """A per-window ledger whose monthly read fails."""

    def spend(self, window: Window, *, scope: str | None = None, now: Any = None) -> Decimal:
        if window == "month":
            raise OSError("database is locked")
        return super().spend(window, scope=scope, now=now)

    async def aspend(self, window: Window, *, scope: str | None = None, now: Any = None) -> Decimal:
        return self.spend(window, scope=scope, now=now)


async def test_a_per_window_ledger_refusing_at_the_day_is_not_read_further_sync_or_async() -> None:
    ledger = MonthUnreadable()
    ledger.inner.record(entry("1.00", scope="tenant-1"))  # the scope's day is reached
    gate = budget_gate(ledger)
    with pytest.raises(BudgetExceededError) as refused:
        gate.begin("chat", scope="tenant-1")
    with pytest.raises(BudgetExceededError) as arefused:
        await gate.abegin("chat", scope="tenant-1")
    # Refused by the day, before the failing month would have let the call through.
    assert (refused.value.window, arefused.value.window) == ("day", "day")
    assert ("month", "tenant-1") not in ledger.reads
