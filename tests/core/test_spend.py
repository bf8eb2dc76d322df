"""Spend exploration (SPEC sections 7 and 8): filtered entries, pages, and reports.

The same entries go into an in-memory, a SQLite and a PostgreSQL ledger (a fresh schema
of the ``test`` database, dropped afterwards); their reports must agree to the last digit.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from llm_resilience import CostBudget
from llm_resilience.ledger import (
    InMemoryCostLedger,
    LedgerEntry,
    SqlCostLedger,
    astored_run_spend,
    stored_run_spend,
)
from llm_resilience.money import exact_sum
from llm_resilience.spend import GROUPINGS, SpendRow, spend_report

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
T0 = datetime(2026, 10, 31, 23, 30, tzinfo=UTC)  # the last half hour of October


def _entries() -> list[LedgerEntry]:
    """Entries over a month boundary and three days, with ties and awkward money."""
    facts: list[tuple[timedelta, str, str | None, str | None, str | None, str, bool]] = [
        (timedelta(0), "chat", "gpt-4o", "chat", None, "0.1", False),
        (timedelta(0), "chat", "gpt-4o", "chat", "tenant-a", "0.2", True),
        (timedelta(0), "embedding", "emb-3", "embedding", "tenant-a", "0.000000000000000000000001", True),
        (timedelta(hours=1), "ocr", None, None, "tenant-b", "12345678901234567890.123456789", False),
        (timedelta(hours=1), "chat", "claude", "chat", None, "0.3", False),
        (timedelta(hours=25), "chat", "claude", "chat", "tenant-a", "1.0000000000000000001", True),
        (timedelta(hours=25), "chat", "gpt-4o", "chat", "tenant-b", "0", False),
        (timedelta(hours=49), "embedding", "emb-3", "embedding", None, "0.7", False),
    ]  # fmt: skip
    return [
        LedgerEntry(
            T0 + offset,
            kind,
            input_tokens=10 * index + 1,
            output_tokens=3 * index,
            cost=Decimal(cost),
            model=model,
            estimated=estimated,
            surface=surface,
            scope=scope,
        )
        for index, (offset, kind, model, surface, scope, cost, estimated) in enumerate(facts)
    ]


# The agent run and thread of each of ``_entries()``: two runs of one thread, a run of
# another, and calls outside any agent (None).
RUNS = ["run-1", "run-1", "run-1", "run-2", None, "run-2", "run-3", None]
THREADS = ["t-1", "t-1", "t-1", "t-1", None, "t-1", "t-2", None]


def _with_runs(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    return [
        dataclasses.replace(entry, run_id=run, thread_id=thread, entry_id=entry.entry_id)
        for entry, run, thread in zip(entries, RUNS, THREADS, strict=True)
    ]


ENTRIES = _with_runs(_entries())


def _cost_of(**field: str) -> Decimal:
    """The exact cost of the ``ENTRIES`` whose ``run_id``/``thread_id`` is as given."""
    ((name, value),) = field.items()
    return exact_sum(e.cost for e in ENTRIES if getattr(e, name) == value)


@contextmanager
def _postgres_ledger(base_url: str) -> Iterator[SqlCostLedger]:
    """A ledger confined to a fresh schema, dropped afterwards."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    name = f"spend_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url)
    with admin.begin() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {name}")
    url = make_url(base_url).update_query_dict({"options": f"-csearch_path={name}"})
    ledger = SqlCostLedger(url.render_as_string(hide_password=False))
    try:
        yield ledger
    finally:
        ledger.close()
        with admin.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA {name} CASCADE")
        admin.dispose()


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A ledger of each kind holding ``ENTRIES``."""
    kind = request.param
    if kind == "memory":
        memory = InMemoryCostLedger()
        for entry in ENTRIES:
            memory.record(entry)
        yield memory
        return
    if kind == "sqlite":
        sqlite = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
        for entry in ENTRIES:
            sqlite.record(entry)
        yield sqlite
        sqlite.close()
        return
    with _postgres_ledger(request.getfixturevalue("postgres_url")) as postgres:
        for entry in ENTRIES:
            postgres.record(entry)
        yield postgres


def _reference(by: str, **filters: Any) -> Any:
    memory = InMemoryCostLedger()
    for entry in ENTRIES:
        memory.record(entry)
    return spend_report(memory, by, **filters)  # type: ignore[arg-type]


@pytest.mark.parametrize("by", GROUPINGS)
def test_every_grouping_reports_the_same_exact_rows_on_every_ledger(ledger: Any, by: str) -> None:
    report = spend_report(ledger, by=by)
    reference = _reference(by)
    assert report.rows == reference.rows
    assert report.total == reference.total
    assert report.total.cost == Decimal("12345678901234567892.423456789000000000100001")
    assert report.total.calls == len(ENTRIES)


@pytest.mark.parametrize("by", GROUPINGS)
def test_a_ledgers_own_report_is_the_spend_report_without_a_budget(ledger: Any, by: str) -> None:
    since, until = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 3, tzinfo=UTC)
    own = ledger.report(by, since, until, scope="tenant-a")
    assert own == spend_report(ledger, by, since, until, scope="tenant-a")
    assert own.rows
    assert dict(own.remaining) == {}
    assert ledger.report(by=by).total == _reference(by).total


def test_day_and_month_keys_are_utc_dates_sorted_in_time_order(ledger: Any) -> None:
    days = spend_report(ledger, by="day")
    assert [row.key for row in days.rows] == [
        "2026-10-31",
        "2026-11-01",
        "2026-11-02",
        "2026-11-03",
    ]
    assert days.rows[0].cost == Decimal("0.300000000000000000000001")
    assert days.rows[0].calls == 3
    assert days.rows[0].estimated_calls == 2
    months = spend_report(ledger, by="month")
    assert [(row.key, row.calls) for row in months.rows] == [("2026-10", 3), ("2026-11", 5)]


def test_other_groupings_are_sorted_by_cost_descending_with_unknown_keys_as_none(
    ledger: Any,
) -> None:
    report = spend_report(ledger, by="model")
    assert [row.key for row in report.rows] == [None, "claude", "emb-3", "gpt-4o"]
    assert [row.cost for row in report.rows] == sorted(
        (row.cost for row in report.rows), reverse=True
    )
    scopes = {row.key: row for row in spend_report(ledger, by="scope").rows}
    assert scopes[None].cost == Decimal("1.1")  # unscoped: 0.1 + 0.3 + 0.7
    assert scopes["tenant-a"].input_tokens == 11 + 21 + 51


def test_since_until_and_scope_narrow_the_report(ledger: Any) -> None:
    since, until = datetime(2026, 11, 2, tzinfo=UTC), datetime(2026, 11, 3, tzinfo=UTC)
    report = spend_report(ledger, by="kind", since=since, until=until, scope="tenant-a")
    assert (report.since, report.until, report.scope) == (since, until, "tenant-a")
    assert report.rows == (SpendRow("chat", Decimal("1.0000000000000000001"), 1, 51, 15, 1),)
    assert report.rows == _reference("kind", since=since, until=until, scope="tenant-a").rows


def test_entries_filter_by_time_scope_model_and_kind_on_every_ledger(ledger: Any) -> None:
    assert ledger.entries(model="gpt-4o") == [e for e in ENTRIES if e.model == "gpt-4o"]
    assert ledger.entries(kind="ocr") == [ENTRIES[3]]
    assert ledger.entries(scope="tenant-b", kind="chat") == [ENTRIES[6]]
    november = datetime(2026, 11, 1, tzinfo=UTC)
    assert ledger.entries(november, scope="tenant-a") == [ENTRIES[5]]
    assert ledger.entries(until=november, model="claude") == []
    assert [e.cost for e in ledger.entries()] == [e.cost for e in ENTRIES]


async def test_aentries_answers_like_entries(ledger: Any) -> None:
    assert await ledger.aentries(scope="tenant-a", kind="chat") == [ENTRIES[1], ENTRIES[5]]


@pytest.mark.parametrize("page_size", [1, 2, 3, 100])
def test_iter_entries_streams_every_entry_once_in_order_across_page_boundaries(
    ledger: Any, page_size: int
) -> None:
    streamed = list(ledger.iter_entries(page_size=page_size))
    # Three entries share the first timestamp: a page boundary between them loses none.
    assert streamed == ENTRIES
    assert [e.entry_id for e in streamed] == [e.entry_id for e in ENTRIES]
    filtered = ledger.iter_entries(datetime(2026, 11, 1, tzinfo=UTC), kind="chat")
    assert list(filtered) == ENTRIES[4:7]


@pytest.mark.parametrize("page_size", [1, 2, 100])
async def test_aiter_entries_streams_like_iter_entries_without_blocking_the_loop(
    ledger: Any, page_size: int
) -> None:
    streamed = [entry async for entry in ledger.aiter_entries(page_size=page_size)]
    filtered = ledger.aiter_entries(datetime(2026, 11, 1, tzinfo=UTC), kind="chat")

    assert streamed == ENTRIES
    assert [entry async for entry in filtered] == ENTRIES[4:7]


async def test_aiter_entries_holds_no_connection_between_pages(tmp_path: Path) -> None:
    ledger = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
    for entry in ENTRIES:
        ledger.record(entry)
    stream = ledger.aiter_entries(page_size=2)
    assert await anext(stream) == ENTRIES[0]
    assert ledger._db.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    later = LedgerEntry(T0 + timedelta(days=5), "chat", cost=Decimal("9"))
    await ledger.arecord(later)
    assert [entry async for entry in stream] == [*ENTRIES[1:], later]
    ledger.close()


FIRST, LAST = datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)
#: Aware bounds at the ends of what ``datetime`` holds, in UTC and in other offsets.
FAR_BOUNDS = [
    (FIRST, LAST),
    (FIRST, None),
    (None, LAST),
    (datetime(1, 1, 1, 5, tzinfo=timezone(timedelta(hours=1))), None),
    (None, datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=5)))),
    (LAST, None),
    (None, FIRST + timedelta(microseconds=1)),
]


@pytest.mark.parametrize(("since", "until"), FAR_BOUNDS)
async def test_bounds_at_the_ends_of_time_list_what_the_memory_ledger_lists(
    ledger: Any, since: datetime | None, until: datetime | None
) -> None:
    # An entry at each end of time too. On SQLite a bound's day of slack overflowed, and
    # year 1 was stored as "1-01-01 ..." text that neither sorted nor read back.
    extremes = [LedgerEntry(FIRST, "chat", cost=Decimal(1)), LedgerEntry(LAST, "chat")]
    memory = InMemoryCostLedger()
    for entry in [*ENTRIES, *extremes]:
        memory.record(entry)
    for entry in extremes:
        ledger.record(entry)
    expected = memory.entries(since, until)
    assert expected  # every case lists something (a bound at an end keeps that end's entry)
    assert ledger.entries(since, until) == expected
    assert await ledger.aentries(since, until) == expected
    for page_size in (1, 100):
        assert list(ledger.iter_entries(since, until, page_size=page_size)) == expected
        streamed = ledger.aiter_entries(since, until, page_size=page_size)
        assert [entry async for entry in streamed] == expected
    for by in ("day", "month", "kind"):  # day keys of year 1 are "0001-01-01" everywhere
        reference = spend_report(memory, by, since, until)
        assert spend_report(ledger, by, since, until) == reference


def test_both_ledgers_refuse_a_page_size_below_one_on_the_call(ledger: Any) -> None:
    with pytest.raises(ValueError, match="page_size"):
        ledger.iter_entries(page_size=0)
    with pytest.raises(ValueError, match="page_size"):
        ledger.aiter_entries(page_size=0)


def test_iter_entries_holds_no_connection_between_pages(tmp_path: Path) -> None:
    ledger = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
    for entry in ENTRIES:
        ledger.record(entry)
    stream = ledger.iter_entries(page_size=2)
    assert next(stream) == ENTRIES[0]
    assert ledger._db.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    later = LedgerEntry(T0 + timedelta(days=5), "chat", cost=Decimal("9"))
    ledger.record(later)  # a write between pages neither waits nor is missed
    assert list(stream) == [*ENTRIES[1:], later]
    ledger.close()


def test_remaining_is_each_windows_limit_minus_spend_and_never_below_zero(ledger: Any) -> None:
    now = T0 + timedelta(hours=25, minutes=10)  # 2026-11-02
    budget = CostBudget(input_price_per_mtok=1, output_price_per_mtok=1, daily_limit="1.5")
    report = spend_report(ledger, by="day", scope="tenant-a", budget=budget, now=now)
    assert dict(report.remaining) == {"day": Decimal("0.4999999999999999999")}
    tight = CostBudget(
        input_price_per_mtok=1, output_price_per_mtok=1, monthly_limit=1, global_daily_limit=2
    )
    report = spend_report(ledger, by="day", scope="tenant-a", budget=tight, now=now)
    assert dict(report.remaining) == {"day": Decimal("0.9999999999999999999"), "month": 0}
    assert spend_report(ledger, by="day").remaining == {}


def test_a_grouping_outside_the_choices_is_refused_naming_by_and_them(ledger: Any) -> None:
    with pytest.raises(
        ValueError,
        match=r"by must be one of 'day', 'month', .*'scope', 'run', 'thread'; got 'week'",
    ):
        spend_report(ledger, by="week")


def test_naive_bounds_are_refused_not_guessed(ledger: Any) -> None:
    with pytest.raises(ValueError, match="since must be timezone-aware"):
        ledger.entries(since=datetime(2026, 11, 1))
    with pytest.raises(ValueError, match="until must be timezone-aware"):
        spend_report(ledger, until=datetime(2026, 11, 1))


def test_iter_entries_refuses_a_page_size_below_one_before_reading(tmp_path: Path) -> None:
    ledger = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
    with pytest.raises(ValueError, match="page_size"):
        ledger.iter_entries(page_size=0)
    ledger.close()


def test_a_third_party_ledger_with_only_entries_gets_the_same_report() -> None:
    class ListLedger:
        def entries(
            self, since: datetime | None = None, until: datetime | None = None
        ) -> list[LedgerEntry]:
            return [
                e
                for e in ENTRIES
                if (since is None or e.timestamp >= since)
                and (until is None or e.timestamp < until)
            ]

    for by in GROUPINGS:
        report = spend_report(ListLedger(), by, scope="tenant-a")
        assert report.rows == _reference(by, scope="tenant-a").rows


def test_estimated_share_is_the_fraction_of_estimated_calls() -> None:
    assert SpendRow("x", Decimal(1), 4, 0, 0, 3).estimated_share == 0.75
    assert SpendRow(None, Decimal(0), 0, 0, 0, 0).estimated_share == 0.0


def test_importing_the_report_module_loads_no_sqlalchemy_pandas_or_rich() -> None:
    probe = (
        "import sys, llm_resilience, llm_resilience.spend, llm_resilience.cli\n"
        "print(sorted(m for m in ('sqlalchemy', 'pandas', 'matplotlib', 'rich') "
        "if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


def test_a_migrated_first_release_sqlite_table_reports_its_numeric_costs_exactly(
    tmp_path: Path,
) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as connection:
        connection.execute(
            "CREATE TABLE cost_ledger (id INTEGER PRIMARY KEY, timestamp DATETIME NOT NULL, "
            "kind TEXT NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, "
            "cost NUMERIC NOT NULL)"
        )
        connection.executemany(
            "INSERT INTO cost_ledger (timestamp, kind, input_tokens, output_tokens, cost) "
            "VALUES (?, 'chat', 1, 1, ?)",
            [("2026-11-29 10:00:00", "0.1"), ("2026-11-29 11:00:00", "0.2"), ("2026-11-30", 3)],
        )
    ledger = SqlCostLedger(f"sqlite:///{path}")  # migrates in place
    ledger.record(LedgerEntry(datetime(2026, 11, 30, 1, tzinfo=UTC), "ocr", cost=Decimal("0.05")))
    report = spend_report(ledger, by="day")
    assert [(row.key, row.cost, row.calls) for row in report.rows] == [
        ("2026-11-29", Decimal("0.3"), 2),
        ("2026-11-30", Decimal("3.05"), 2),
    ]
    assert report.total.cost == Decimal("3.35")
    ledger.close()


# -- agent runs and threads ---------------------------------------------------------------


def test_report_by_run_and_by_thread_sums_each_ones_entries_exactly(ledger: Any) -> None:
    by_run = {row.key: (row.cost, row.calls) for row in spend_report(ledger, by="run").rows}
    assert by_run == {
        "run-1": (Decimal("0.300000000000000000000001"), 3),
        "run-2": (Decimal("12345678901234567891.1234567890000000001"), 2),
        "run-3": (Decimal("0.0"), 1),
        None: (Decimal("1.0"), 2),
    }
    by_thread = {row.key: row.calls for row in ledger.report(by="thread").rows}
    assert by_thread == {"t-1": 5, "t-2": 1, None: 2}


def test_run_and_thread_filters_narrow_a_report_and_are_reported(ledger: Any) -> None:
    runs_of_thread = spend_report(ledger, by="run", thread="t-1")
    assert [row.key for row in runs_of_thread.rows] == ["run-2", "run-1"]  # by cost
    assert (runs_of_thread.thread, runs_of_thread.run) == ("t-1", None)
    one_run = ledger.report(by="model", run="run-1")
    assert {row.key: row.calls for row in one_run.rows} == {"gpt-4o": 2, "emb-3": 1}
    assert one_run.run == "run-1"
    assert one_run.total.cost == _cost_of(run_id="run-1")
    assert spend_report(ledger, by="day", run="run-9").rows == ()


def test_entries_filter_by_run_and_thread_on_every_ledger(ledger: Any) -> None:
    assert ledger.entries(run="run-2") == [e for e in ENTRIES if e.run_id == "run-2"]
    assert ledger.entries(thread="t-2") == [e for e in ENTRIES if e.thread_id == "t-2"]
    assert ledger.entries(run="run-1", thread="t-2") == []
    assert [e.run_id for e in ledger.iter_entries(thread="t-1", page_size=2)] == [
        "run-1", "run-1", "run-1", "run-2", "run-2",
    ]  # fmt: skip
    with pytest.raises(TypeError, match="run must be text or None"):
        ledger.entries(run=7)


async def test_aentries_and_aiter_entries_filter_by_run_and_thread(ledger: Any) -> None:
    assert await ledger.aentries(run="run-3") == [e for e in ENTRIES if e.run_id == "run-3"]
    streamed = [e async for e in ledger.aiter_entries(thread="t-1", page_size=3)]
    assert streamed == [e for e in ENTRIES if e.thread_id == "t-1"]


def test_run_spend_is_the_exact_stored_cost_of_a_run_or_a_thread(ledger: Any) -> None:
    assert ledger.run_spend(run="run-2") == Decimal("12345678901234567891.1234567890000000001")
    assert ledger.run_spend(run="run-1") == Decimal("0.300000000000000000000001")
    assert ledger.run_spend(thread="t-1") == _cost_of(thread_id="t-1")
    assert ledger.run_spend(run="run-9") == Decimal(0)
    assert stored_run_spend(ledger, thread="t-2") == _cost_of(thread_id="t-2")


async def test_arun_spend_answers_like_run_spend(ledger: Any) -> None:
    assert await ledger.arun_spend(run="run-2") == ledger.run_spend(run="run-2")
    assert await ledger.arun_spend(thread="t-1") == _cost_of(thread_id="t-1")
    assert await astored_run_spend(ledger, run="run-1") == _cost_of(run_id="run-1")


@pytest.mark.parametrize("given", [{}, {"run": "run-1", "thread": "t-1"}])
async def test_run_spend_takes_exactly_one_of_run_and_thread(
    ledger: Any, given: dict[str, str]
) -> None:
    with pytest.raises(TypeError, match="exactly one of run= and thread="):
        ledger.run_spend(**given)
    with pytest.raises(TypeError, match="exactly one of run= and thread="):
        await ledger.arun_spend(**given)
    with pytest.raises(TypeError, match="exactly one of run= and thread="):
        stored_run_spend(ledger, **given)


def test_run_spend_refuses_an_id_no_ledger_can_hold(ledger: Any) -> None:
    with pytest.raises(ValueError, match="thread"):
        ledger.run_spend(thread="x" * 257)


class _ListLedger:
    """A third-party ledger that answers only ``entries(since, until)``."""

    def entries(
        self, since: datetime | None = None, until: datetime | None = None
    ) -> list[LedgerEntry]:
        return list(ENTRIES)


def test_a_ledger_without_run_spend_is_read_through_its_entries() -> None:
    assert stored_run_spend(_ListLedger(), run="run-2") == _cost_of(run_id="run-2")
    assert stored_run_spend(_ListLedger(), thread="t-9") == Decimal(0)
    report = spend_report(_ListLedger(), by="run", thread="t-1")
    assert report.rows == _reference("run", thread="t-1").rows


async def test_astored_run_spend_reads_entries_off_the_event_loop_without_run_spend() -> None:
    import threading

    readers: list[threading.Thread] = []

    class Watched(_ListLedger):
        def entries(
            self, since: datetime | None = None, until: datetime | None = None
        ) -> list[LedgerEntry]:
            readers.append(threading.current_thread())
            return super().entries(since, until)

    assert await astored_run_spend(Watched(), thread="t-1") == _cost_of(thread_id="t-1")
    assert readers
    assert readers[0] is not threading.main_thread()
