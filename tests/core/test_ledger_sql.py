"""The SQL ledger on SQLite and, when the server is there, PostgreSQL (SPEC section 4).

The shared contract runs on both databases (the ``url`` fixture); each PostgreSQL run
gets a fresh schema, dropped afterwards. Cross-process tests run in real processes
started with ``spawn`` (:class:`Workers`), each opening its own ``SqlCostLedger``,
released together by a barrier. PostgreSQL-only behaviour is in ``test_ledger_postgres.py``.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from llm_resilience.checks import MAX_COST, MAX_COST_PLACES, MAX_COUNT, MAX_SCOPE_LENGTH
from llm_resilience.errors import BudgetExceededError
from llm_resilience.ledger import CostLedger, LedgerEntry, SqlCostLedger
from llm_resilience.ledger._protocol import exact_sum

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
COLUMNS = [
    "id", "timestamp", "kind", "input_tokens", "output_tokens", "cost",
    "pages", "model", "estimated", "surface", "scope", "entry_id",
    "cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens", "reasoning_tokens",
    "run_id", "thread_id",
]  # fmt: skip
# The first release's table, as it created it.
OLD_SCHEMA = (
    "CREATE TABLE cost_ledger (id INTEGER PRIMARY KEY, timestamp DATETIME NOT NULL, "
    "kind TEXT NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, "
    "cost NUMERIC NOT NULL)"
)


@contextmanager
def fresh_postgres_schema(base_url: str) -> Iterator[str]:
    """A URL whose connections live in a new schema, dropped (with its tables) on exit."""
    pytest.importorskip("psycopg")
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    schema = f"ledger_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url)
    with admin.begin() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
    try:
        url = make_url(base_url).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'spend.db'}"
        return
    with fresh_postgres_schema(request.getfixturevalue("postgres_url")) as scoped:
        yield scoped


@pytest.fixture
def ledger(url: str) -> Iterator[SqlCostLedger]:
    opened = SqlCostLedger(url)
    yield opened
    opened.close()


def entry(
    cost: str, *, at: datetime = NOW, kind: str = "chat", scope: str | None = None
) -> LedgerEntry:
    return LedgerEntry(at, kind, input_tokens=10, output_tokens=5, cost=Decimal(cost), scope=scope)


# -- cross-process harness -----------------------------------------------------------------

_WORKER = """
from decimal import Decimal
from llm_resilience.checks import MAX_COST, MAX_COST_PLACES, MAX_COUNT, MAX_SCOPE_LENGTH
from llm_resilience.errors import BudgetExceededError
from llm_resilience.ledger import LedgerEntry, SqlCostLedger

def run(task, url, start, count=0, cost=None, amount=None, limits=None, now=None):
    start.wait(timeout=120)
    ledger = SqlCostLedger(url)
    try:
        if task == "record":
            for _ in range(count):
                ledger.record(LedgerEntry(now, "chat", 3, 4, cost, scope=f"w{worker % 2}"))
            return count
        if task == "reserve":
            granted = 0
            for _ in range(count):
                try:
                    ledger.reserve(amount, limits=limits, scope=None, now=now)
                    granted += 1
                except BudgetExceededError:
                    pass
            return granted
        return "opened"
    finally:
        ledger.close()

while (job := jobs.get()) is not None:
    try:
        outcome = run(start=barriers[job.pop("processes")], **job)
    except BaseException:
        import traceback
        outcome = traceback.format_exc()
    results.put((worker, outcome))
"""


class Workers:
    """Spawned processes, started once per module and given one job at a time.

    Each job runs in the first ``processes`` workers, released together by a barrier,
    and each of them opens its own ``SqlCostLedger``. The worker is a source string run
    by ``exec`` because a spawned child cannot import a test module pytest loaded by path.
    """

    SIZES = (8, 16)

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        # Kept on self: a barrier collected before a child unpickles it is gone for good.
        self.barriers = {size: context.Barrier(size) for size in self.SIZES}
        self.results: Any = context.Queue()
        self.jobs: list[Any] = [context.Queue() for _ in range(max(self.SIZES))]
        self.processes = [
            context.Process(
                target=exec,
                args=(
                    _WORKER,
                    {
                        "worker": index,
                        "jobs": jobs,
                        "results": self.results,
                        "barriers": self.barriers,
                    },
                ),
                daemon=True,
            )
            for index, jobs in enumerate(self.jobs)
        ]
        for process in self.processes:
            process.start()

    def run(self, processes: int, task: str, url: str, **params: Any) -> list[Any]:
        """Outcomes of ``task`` run at once by ``processes`` workers, in worker order."""
        for jobs in self.jobs[:processes]:
            jobs.put({"processes": processes, "task": task, "url": url, **params})
        outcomes = dict(self.results.get(timeout=120) for _ in range(processes))
        return [outcomes[index] for index in range(processes)]

    def stop(self) -> None:
        for jobs in self.jobs:
            jobs.put(None)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


@pytest.fixture(scope="module")
def workers() -> Iterator[Workers]:
    started = Workers()
    yield started
    started.stop()


# -- the contract, on both databases -------------------------------------------------------


def test_the_sql_ledger_follows_the_protocol_and_says_it_is_persistent(
    ledger: SqlCostLedger,
) -> None:
    assert isinstance(ledger, CostLedger)
    assert SqlCostLedger.persistent is True


def test_point_one_plus_point_two_is_exactly_point_three_after_a_round_trip(url: str) -> None:
    first = SqlCostLedger(url)
    first.record(entry("0.1"))
    first.record(entry("0.2"))
    first.close()
    reopened = SqlCostLedger(url)
    try:
        assert reopened.spend("day", now=NOW) == Decimal("0.3")
        costs = [e.cost for e in reopened.entries()]
        assert costs == [Decimal("0.1"), Decimal("0.2")]
        assert exact_sum(costs) == Decimal("0.3")
    finally:
        reopened.close()


def test_many_tiny_costs_and_costs_beyond_float_precision_stay_exact(ledger: SqlCostLedger) -> None:
    for _ in range(300):
        ledger.record(entry("0.0000000000000000001"))  # 1e-19
    # 39 significant digits, the most a cost may have (below 10**15 money, 24 places).
    long_cost = Decimal("123456789012345.123456789012345678901234")
    ledger.record(entry(str(long_cost), scope="t"))
    # The default decimal context (28 digits) would round this sum.
    assert ledger.spend("day", now=NOW) == Decimal("123456789012345.123456789012345708901234")
    assert ledger.spend("month", scope="t", now=NOW) == long_cost
    assert ledger.entries()[-1].cost == long_cost


def test_spend_counts_utc_days_and_months_entries_of_any_kind_and_scopes(
    ledger: SqlCostLedger,
) -> None:
    ledger.record(entry("1", at=datetime(2026, 10, 31, 23, 59, 59, 999999, tzinfo=UTC)))
    ledger.record(entry("2", at=datetime(2026, 11, 1, tzinfo=UTC), scope="a"))
    ledger.record(entry("4", at=datetime(2026, 11, 28, 23, 59, 59, tzinfo=UTC), scope="b"))
    ledger.record(
        LedgerEntry(datetime(2026, 11, 29, tzinfo=UTC), "ocr", pages=40, cost=Decimal(8), scope="a")
    )
    assert ledger.spend("day", now=NOW) == Decimal(8)
    assert ledger.spend("month", now=NOW) == Decimal(14)
    assert ledger.spend("month", scope="a", now=NOW) == Decimal(10)
    assert ledger.spend("day", scope="b", now=NOW) == Decimal(0)
    assert ledger.spend("month", now=datetime(2026, 10, 1, tzinfo=UTC)) == Decimal(1)


def test_entries_keep_every_field_and_are_half_open_and_oldest_first(ledger: SqlCostLedger) -> None:
    full = LedgerEntry(
        NOW + timedelta(microseconds=1), "chat", input_tokens=1200, output_tokens=300,
        cost=Decimal("0.0081"), pages=0, model="gpt-4o-mini", estimated=True,
        surface="chat", scope="tenant-7",
    )  # fmt: skip
    later = LedgerEntry(NOW + timedelta(hours=1), "ocr", pages=3, cost=Decimal("0.0045"))
    earlier = entry("0.5", at=NOW - timedelta(hours=1))
    for each in (later, full, earlier):
        ledger.record(each)
    assert ledger.entries() == [earlier, full, later]
    assert ledger.entries(since=NOW, until=NOW + timedelta(hours=1)) == [full]
    assert ledger.entries(since=NOW + timedelta(hours=1)) == [later]


def test_holds_count_until_settled_and_settling_records_in_the_same_step(
    ledger: SqlCostLedger,
) -> None:
    limits = {("day", None): Decimal(10), ("month", "a"): Decimal(4)}
    ledger.record(entry("1", scope="a"))
    hold = ledger.reserve(Decimal(3), limits=limits, scope="a", now=NOW)
    assert ledger.spend("day", now=NOW) == Decimal(4)
    assert ledger.spend("month", scope="a", now=NOW) == Decimal(4)
    with pytest.raises(BudgetExceededError) as refused:
        ledger.reserve(Decimal("0.01"), limits=limits, scope="a", now=NOW)
    assert (refused.value.window, refused.value.scope, refused.value.spend) == (
        "month",
        "a",
        Decimal(4),
    )
    ledger.settle(hold, entry("2.5", scope="a"))
    assert ledger.spend("month", scope="a", now=NOW) == Decimal("3.5")
    ledger.settle(hold, None)  # a second settle releases nothing more
    assert ledger.spend("day", now=NOW) == Decimal("3.5")


def test_a_hold_nobody_settles_stops_counting_after_its_ttl(url: str) -> None:
    ledger = SqlCostLedger(url, reservation_ttl=timedelta(minutes=5))
    try:
        ledger.reserve(Decimal(9), limits={}, scope=None, now=NOW)
        assert ledger.spend("day", now=NOW + timedelta(minutes=4)) == Decimal(9)
        assert ledger.spend("day", now=NOW + timedelta(minutes=5)) == Decimal(0)
        after = ledger.reserve(
            Decimal(1),
            limits={("day", None): Decimal(1)},
            scope=None,
            now=NOW + timedelta(minutes=5),
        )
        assert after.amount == Decimal(1)
    finally:
        ledger.close()


async def test_the_async_methods_match_the_sync_ones(ledger: SqlCostLedger) -> None:
    await ledger.arecord(entry("0.1"))
    hold = await ledger.areserve(
        Decimal(1), limits={("day", None): Decimal(2)}, scope=None, now=NOW
    )
    assert await ledger.aspend("day", now=NOW) == Decimal("1.1")
    await ledger.asettle(hold, entry("0.2"))
    assert await ledger.aspend("month", now=NOW) == Decimal("0.3")


def test_eight_processes_recording_500_each_lose_and_double_nothing(
    url: str, workers: Workers
) -> None:
    cost = Decimal("0.1000000000000000001")  # 19 significant digits: no float survives this
    outcomes = workers.run(8, "record", url, count=500, cost=cost, now=NOW)
    assert outcomes == [500] * 8
    ledger = SqlCostLedger(url)
    try:
        stored = ledger.entries()
        assert len(stored) == 4000
        assert exact_sum(e.cost for e in stored) == cost * 4000 == Decimal("400.0000000000000004")
        assert ledger.spend("day", now=NOW) == cost * 4000
        assert ledger.spend("month", scope="w0", now=NOW) == cost * 2000
    finally:
        ledger.close()


def test_eight_processes_reserving_get_exactly_the_holds_the_limit_admits(
    url: str, workers: Workers
) -> None:
    limits = {("day", None): Decimal("2.5"), ("month", None): Decimal(1000)}  # admits 25 of 0.1
    outcomes = workers.run(
        8, "reserve", url, count=6, amount=Decimal("0.1"), limits=limits, now=NOW
    )
    for granted in outcomes:
        assert isinstance(granted, int), granted
    assert sum(outcomes) == 25, outcomes
    ledger = SqlCostLedger(url)
    try:
        assert ledger.spend("day", now=NOW) == Decimal("2.5")
    finally:
        ledger.close()


# -- SQLite --------------------------------------------------------------------------------


def old_sqlite_ledger(path: Path, extra_rows: int = 0) -> Decimal:
    """A first-release ledger file; returns the spend of NOW's month in it."""
    with sqlite3.connect(path) as connection:
        connection.execute(OLD_SCHEMA)
        rows = [
            ("2026-11-29 08:00:00.000000", "chat", 100, 20, 0.1),  # stored as REAL
            ("2026-11-29 09:30:00", "embedding", 50, 0, "0.2"),  # text, turned REAL by affinity
            ("2026-11-03T10:00:00Z", "chat", 10, 10, 1),
            ("2026-11-29T00:30:00+01:00", "chat", 10, 10, 7),  # the 28th in UTC
            ("2026-10-31 23:59:59.999999", "chat", 10, 10, 5),  # last month
        ]
        rows += [("2026-11-15 12:00:00.000000", "chat", 1, 1, "0.001")] * extra_rows
        connection.executemany(
            "INSERT INTO cost_ledger (timestamp, kind, input_tokens, output_tokens, cost) VALUES (?, ?, ?, ?, ?)",
            rows,
        )
    connection.close()
    return Decimal("8.3") + Decimal("0.001") * extra_rows


def indexes_of(path: Path) -> set[str]:
    with sqlite3.connect(path) as connection:
        names = {row[1] for row in connection.execute("PRAGMA index_list(cost_ledger)")}
    connection.close()
    return names


def columns_of(path: Path) -> list[str]:
    with sqlite3.connect(path) as connection:
        names = [row[1] for row in connection.execute("PRAGMA table_info(cost_ledger)")]
    connection.close()
    return names


def test_a_first_release_sqlite_table_is_migrated_in_place_keeping_every_row(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    old_sqlite_ledger(path)
    ledger = SqlCostLedger(f"sqlite:///{path}")
    try:
        assert columns_of(path) == COLUMNS
        stored = ledger.entries()
        assert [(e.timestamp, e.kind, e.cost) for e in stored] == [
            (datetime(2026, 10, 31, 23, 59, 59, 999999, tzinfo=UTC), "chat", Decimal(5)),
            (datetime(2026, 11, 3, 10, tzinfo=UTC), "chat", Decimal(1)),
            (datetime(2026, 11, 28, 23, 30, tzinfo=UTC), "chat", Decimal(7)),
            (datetime(2026, 11, 29, 8, tzinfo=UTC), "chat", Decimal("0.1")),
            (datetime(2026, 11, 29, 9, 30, tzinfo=UTC), "embedding", Decimal("0.2")),
        ]
        assert all(
            (e.pages, e.model, e.estimated, e.scope) == (0, None, False, None) for e in stored
        )
        assert all((e.run_id, e.thread_id) == (None, None) for e in stored)
        assert {"ix_cost_ledger_run_id", "ix_cost_ledger_thread_id"} <= indexes_of(path)
        # Totals were built from the old rows: exactly, and once.
        assert ledger.spend("day", now=NOW) == Decimal("0.3")
        assert ledger.spend("day", now=NOW - timedelta(days=1)) == Decimal(7)
        assert ledger.spend("month", now=NOW) == Decimal("8.3")
        assert [e.cost for e in ledger.entries(since=datetime(2026, 11, 28, 23, tzinfo=UTC), until=NOW)] == [
            Decimal(7), Decimal("0.1"), Decimal("0.2"),
        ]  # fmt: skip
        ledger.record(entry("0.123456789012345"))  # 15 significant digits: exact even here
    finally:
        ledger.close()
    again = SqlCostLedger(f"sqlite:///{path}")
    try:
        assert columns_of(path) == COLUMNS
        assert again.spend("month", now=NOW) == Decimal("8.423456789012345")
        assert again.entries()[-1].cost == Decimal("0.123456789012345")
    finally:
        again.close()


def test_sixteen_processes_opening_one_first_release_file_at_once_all_succeed(
    tmp_path: Path, workers: Workers
) -> None:
    path = tmp_path / "old.db"
    month = old_sqlite_ledger(path, extra_rows=5000)
    outcomes = workers.run(16, "open", f"sqlite:///{path}")
    assert outcomes == ["opened"] * 16
    assert columns_of(path) == COLUMNS  # each added column exists once, in order
    ledger = SqlCostLedger(f"sqlite:///{path}")
    try:
        assert len(ledger.entries()) == 5005
        assert ledger.spend("month", now=NOW) == month  # totals built once, not 16 times
    finally:
        ledger.close()


def test_a_new_sqlite_ledger_stores_money_as_text_and_runs_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "spend.db"
    ledger = SqlCostLedger(f"sqlite:///{path}")
    ledger.record(entry("0.30"))
    ledger.close()
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT cost, typeof(cost) FROM cost_ledger").fetchall() == [
            ("0.30", "text")
        ]
        assert (
            connection.execute("SELECT typeof(total) FROM cost_ledger_totals").fetchall()
            == [("text",)] * 2
        )
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    connection.close()


def test_a_writer_waits_for_another_processes_write_lock_instead_of_failing(tmp_path: Path) -> None:
    path = tmp_path / "spend.db"
    ledger = SqlCostLedger(f"sqlite:///{path}")
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    releaser = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    releaser.start()
    started = time.monotonic()
    try:
        ledger.record(entry("1"))
        assert time.monotonic() - started >= 0.25
        assert ledger.spend("day", now=NOW) == Decimal(1)
    finally:
        releaser.join()
        other.close()
        ledger.close()


def test_an_in_memory_sqlite_ledger_is_one_database_for_every_thread() -> None:
    ledger = SqlCostLedger("sqlite://")
    try:
        threads = [threading.Thread(target=ledger.record, args=(entry("0.25"),)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert ledger.spend("day", now=NOW) == Decimal(1)
    finally:
        ledger.close()


def test_failures_surface_as_exceptions_promptly(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(OperationalError, match="unable to open database file"):
        SqlCostLedger(f"sqlite:///{tmp_path / 'missing' / 'spend.db'}")
    ledger = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
    with sqlite3.connect(tmp_path / "spend.db") as connection:
        connection.execute("DROP TABLE cost_ledger_totals")
    connection.close()
    with pytest.raises(OperationalError, match="no such table"):
        ledger.spend("day")
    ledger.record(entry("1"))  # not lost: it waits for the database to take it
    assert ledger.pending == 1
    with pytest.raises(OperationalError, match="no such table"):
        ledger.spend("day")
    ledger.close()
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "bad_url",
    [
        "",
        "not a url",
        None,
        123,
        b"sqlite://",
        "postgresql+asyncpg://user@127.0.0.1/db",
        "sqlite+aiosqlite:///spend.db",
        "mysql://user@127.0.0.1/db",
    ],
)
def test_a_url_that_is_not_one_of_the_accepted_forms_is_a_value_error_naming_them(
    bad_url: object,
) -> None:
    forms = (
        r"url must .*'sqlite:///.*'sqlite://'.*'postgresql\+psycopg://user@host/db'.*'postgresql://"
    )
    with pytest.raises(ValueError, match=forms):
        SqlCostLedger(bad_url)  # type: ignore[arg-type]


def test_a_postgresql_url_without_a_driver_opens_with_psycopg(postgres_url: str) -> None:
    with fresh_postgres_schema(postgres_url) as scoped:
        ledger = SqlCostLedger(scoped.replace("postgresql+psycopg://", "postgresql://"))
        try:
            assert ledger.url.startswith("postgresql+psycopg://")
            ledger.record(entry("1"))
            assert ledger.spend("day", now=NOW) == Decimal(1)
        finally:
            ledger.close()


@pytest.mark.parametrize("option", ["operation_timeout", "connect_timeout", "reservation_ttl"])
@pytest.mark.parametrize("value", [0, -1.5, float("nan"), timedelta.max, "5", timedelta(0)])
def test_durations_out_of_range_are_value_errors_naming_the_option(
    option: str, value: object
) -> None:
    with pytest.raises(ValueError, match=option):
        SqlCostLedger("sqlite://", **{option: value})  # type: ignore[arg-type]


def test_durations_are_seconds_or_timedeltas_and_max_pending_is_at_least_one() -> None:
    ledger = SqlCostLedger("sqlite://", operation_timeout=timedelta(seconds=2), connect_timeout=3)
    try:
        assert ledger.operation_timeout == timedelta(seconds=2)
        assert ledger.connect_timeout == timedelta(seconds=3)
    finally:
        ledger.close()
    for value in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="max_pending"):
            SqlCostLedger("sqlite://", max_pending=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("scope", ["tenant-\x00", "tenant-\ud800", "x" * 10_000])
def test_a_scope_with_a_nul_a_lone_surrogate_or_10_kb_of_text_is_refused_naming_scope(
    scope: str,
) -> None:
    with pytest.raises(ValueError, match="scope"):
        LedgerEntry(NOW, "chat", scope=scope)
    ledger = SqlCostLedger("sqlite://")
    try:
        with pytest.raises(ValueError, match="scope"):
            ledger.spend("day", scope=scope)
        with pytest.raises(ValueError, match="scope"):
            ledger.reserve(Decimal(1), limits={("day", scope): Decimal(5)}, scope=None)
        with pytest.raises(ValueError, match="scope"):
            ledger.reserve(Decimal(1), limits={}, scope=scope)
    finally:
        ledger.close()


def test_the_largest_allowed_values_are_stored_and_read_back_exactly(
    ledger: SqlCostLedger,
) -> None:
    largest = LedgerEntry(
        NOW,
        "chat",
        input_tokens=MAX_COUNT,
        output_tokens=MAX_COUNT,
        cost=Decimal("9" * MAX_COST.adjusted() + "." + "9" * MAX_COST_PLACES),  # 54 nines
        pages=MAX_COUNT,
        scope="\U0001f600" * MAX_SCOPE_LENGTH,  # 4 bytes each in UTF-8
    )
    ledger.record(largest)
    stored = ledger.entries()
    assert stored == [largest]
    assert stored[0].entry_id == largest.entry_id
    assert ledger.spend("month", scope=largest.scope, now=NOW) == largest.cost
    assert ledger.spend("day", now=NOW) == largest.cost
    for option in ("input_tokens", "output_tokens", "pages"):
        with pytest.raises(ValueError, match=option):
            LedgerEntry(NOW, "chat", **{option: MAX_COUNT + 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cost"):
        LedgerEntry(NOW, "chat", cost=MAX_COST)


def test_rows_stored_before_todays_bounds_are_read_back_as_they_are(tmp_path: Path) -> None:
    path = tmp_path / "spend.db"
    SqlCostLedger(f"sqlite:///{path}").close()
    tiny, scope = "0.000000000000000000000000000001", "s" * 300  # 30 places, 300 characters
    with sqlite3.connect(path) as connection:
        connection.execute(
            "INSERT INTO cost_ledger (timestamp, kind, input_tokens, output_tokens, cost, scope)"
            " VALUES ('2026-11-29 08:00:00.000000', 'chat', 1, 1, ?, ?)",
            (tiny, scope),
        )
    connection.close()
    ledger = SqlCostLedger(f"sqlite:///{path}")
    try:
        [old] = ledger.entries()
        assert (old.cost, old.scope, old.entry_id) == (Decimal(tiny), scope, None)
    finally:
        ledger.close()


def test_only_sqlite_and_postgresql_urls_are_accepted_and_options_are_checked() -> None:
    with pytest.raises(ValueError, match="mysql"):
        SqlCostLedger("mysql://user@127.0.0.1/db")
    with pytest.raises(ValueError, match="reservation_ttl"):
        SqlCostLedger("sqlite://", reservation_ttl=timedelta(seconds=-1))
    with pytest.raises(ValueError, match="connect_timeout"):
        SqlCostLedger("sqlite://", connect_timeout=0)


# -- agent runs and threads ---------------------------------------------------------------


def run_entry(cost: str, run: str | None, thread: str | None = None) -> LedgerEntry:
    return LedgerEntry(
        NOW, "chat", input_tokens=10, output_tokens=5, cost=Decimal(cost),
        model="gpt-4o", run_id=run, thread_id=thread,
    )  # fmt: skip


def test_run_and_thread_ids_survive_record_settle_and_a_batch(url: str) -> None:
    ledger = SqlCostLedger(url)
    behind = SqlCostLedger(url, write_behind=60)  # its queue goes in as one batch
    try:
        ledger.record(run_entry("0.1", "run-1", "t-1"))
        hold = ledger.reserve(Decimal(1), limits={}, scope=None, now=NOW)
        ledger.settle(hold, run_entry("0.2", "run-1", "t-1"))
        ledger.record(run_entry("0.4", None, "t-1"))
        for cost in ("0.01", "0.02", "0.03"):
            behind.record(run_entry(cost, "run-2", "t-1"))
        behind.close()  # stores the queue: SQLite's multi-row INSERT, PostgreSQL's unnest
        assert [(e.cost, e.run_id, e.thread_id) for e in ledger.entries()] == [
            (Decimal("0.1"), "run-1", "t-1"),
            (Decimal("0.2"), "run-1", "t-1"),
            (Decimal("0.4"), None, "t-1"),
            (Decimal("0.01"), "run-2", "t-1"),
            (Decimal("0.02"), "run-2", "t-1"),
            (Decimal("0.03"), "run-2", "t-1"),
        ]
        assert ledger.run_spend(run="run-1") == Decimal("0.3")
        assert ledger.run_spend(run="run-2") == Decimal("0.06")
        assert ledger.run_spend(thread="t-1") == Decimal("0.76")
    finally:
        behind.close()
        ledger.close()


async def test_async_record_and_settle_store_run_and_thread_ids(url: str) -> None:
    ledger = SqlCostLedger(url)
    try:
        await ledger.arecord(run_entry("0.5", "run-a", "t-a"))
        hold = await ledger.areserve(Decimal(1), limits={}, scope=None, now=NOW)
        await ledger.asettle(hold, run_entry("0.25", "run-a", None))
        stored = await ledger.aentries(run="run-a")
        assert [(e.cost, e.thread_id) for e in stored] == [
            (Decimal("0.5"), "t-a"),
            (Decimal("0.25"), None),
        ]
        assert await ledger.arun_spend(run="run-a") == Decimal("0.75")
        assert await ledger.arun_spend(thread="t-a") == Decimal("0.5")
    finally:
        await ledger.aclose()


def test_run_spend_sums_exactly_past_the_default_context_and_float_digits(url: str) -> None:
    ledger = SqlCostLedger(url)
    tiny, large = "0.000000000000000000000001", "12345678901234567890.1"
    try:
        for cost in (tiny, large, tiny, "0.1", "0.2"):
            ledger.record(run_entry(cost, "run-x"))
        ledger.record(run_entry("7", "run-y"))
        assert ledger.run_spend(run="run-x") == Decimal(
            "12345678901234567890.400000000000000000000002"
        )
    finally:
        ledger.close()


def test_a_runs_spend_is_read_through_its_index_not_a_scan(url: str) -> None:
    ledger = SqlCostLedger(url)
    ledger.record(run_entry("0.1", "run-1", "t-1"))
    ledger.close()
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            for column in ("run_id", "thread_id"):
                if url.startswith("sqlite"):
                    plan = connection.exec_driver_sql(
                        f"EXPLAIN QUERY PLAN SELECT cost FROM cost_ledger WHERE {column} = ?",
                        ("x",),
                    ).all()
                    assert f"USING INDEX ix_cost_ledger_{column}" in str(plan)
                else:  # a table this small is scanned unless scans are ruled out
                    connection.exec_driver_sql("SET enable_seqscan = off")
                    plan = connection.exec_driver_sql(
                        f"EXPLAIN SELECT cost FROM cost_ledger WHERE {column} = %(v)s", {"v": "x"}
                    ).all()
                    assert f"ix_cost_ledger_{column}" in str(plan)
    finally:
        engine.dispose()


def test_a_previous_release_table_gains_run_and_thread_in_place_keeping_every_row(
    url: str,
) -> None:
    ledger = SqlCostLedger(url)
    ledger.record(run_entry("0.1", None))
    ledger.record(run_entry("0.2", None))
    ledger.close()
    from sqlalchemy import create_engine

    engine = create_engine(url)
    with engine.begin() as connection:  # back to the shape the previous release wrote
        for column in ("run_id", "thread_id"):
            connection.exec_driver_sql(f"DROP INDEX ix_cost_ledger_{column}")
            connection.exec_driver_sql(f"ALTER TABLE cost_ledger DROP COLUMN {column}")
    engine.dispose()
    reopened = SqlCostLedger(url)
    try:
        stored = reopened.entries()
        assert [(e.cost, e.run_id, e.thread_id) for e in stored] == [
            (Decimal("0.1"), None, None),
            (Decimal("0.2"), None, None),
        ]
        assert reopened.spend("day", now=NOW) == Decimal("0.3")  # totals untouched
        reopened.record(run_entry("0.4", "run-1", "t-1"))
        assert reopened.run_spend(run="run-1") == Decimal("0.4")
        assert reopened.entries(thread="t-1")[0].cost == Decimal("0.4")
        assert reopened.spend("day", now=NOW) == Decimal("0.7")
    finally:
        reopened.close()
