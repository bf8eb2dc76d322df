"""The SQL ledger under faults: a silent or resetting PostgreSQL, a locked SQLite file.

Faults are made with ``llm_resilience.testing.FaultProxy`` in front of the real
PostgreSQL, a local socket that accepts and never answers, or a second SQLite connection
holding ``BEGIN EXCLUSIVE``; the shared servers are never stopped. Bounds are checked
with a generous margin (``BOUND + MARGIN``): they are behaviour, not speed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from llm_resilience import telemetry
from llm_resilience.ledger import LedgerEntry, LedgerTimeoutError, Reservation, SqlCostLedger
from llm_resilience.ledger._protocol import exact_sum
from llm_resilience.testing import FaultProxy

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
#: operation_timeout of the ledgers under test, in seconds.
BOUND = 0.5
#: What an operation may take beyond its bound here: far more than the watchdog's
#: reaction (a few ms), so a loaded machine cannot fail these tests.
MARGIN = 1.0
LIMITS = {("day", None): Decimal(1000)}


def entry(cost: str = "0.25", *, at: datetime = NOW, scope: str | None = None) -> LedgerEntry:
    return LedgerEntry(
        at, "chat", input_tokens=10, output_tokens=5, cost=Decimal(cost), scope=scope
    )


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``call`` took, and what it returned or raised."""
    started = time.monotonic()
    try:
        outcome = call()
    except Exception as error:
        outcome = error
    return time.monotonic() - started, outcome


@contextmanager
def postgres_schema(base_url: str) -> Iterator[str]:
    """A URL whose connections live in a fresh schema, dropped with its tables on exit."""
    pytest.importorskip("psycopg")
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    name = f"ledger_faults_{uuid.uuid4().hex[:12]}"
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
def proxied(url: str) -> Iterator[tuple[FaultProxy, str]]:
    """A FaultProxy in front of the server of ``url``, and ``url`` pointed at the proxy."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    with FaultProxy((parsed.host or "127.0.0.1", parsed.port or 5432)) as proxy:
        yield proxy, parsed.set(port=proxy.port).render_as_string(hide_password=False)


@contextmanager
def silent_server() -> Iterator[int]:
    """The port of a socket that accepts connections and never says a word."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        for connection in accepted:
            connection.close()


@contextmanager
def locked(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holding the SQLite file's write lock (``BEGIN EXCLUSIVE``)."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield holder
    finally:
        if holder.in_transaction:
            holder.execute("COMMIT")
        holder.close()


def run_every_operation(ledger: SqlCostLedger, hold: Reservation) -> dict[str, tuple[float, Any]]:
    """Each operation, sync then async, timed: name -> (seconds, result or error)."""
    operations: dict[str, Callable[[], Any]] = {
        "spend": lambda: ledger.spend("day", now=NOW),
        "reserve": lambda: ledger.reserve(Decimal(1), limits=LIMITS, scope=None, now=NOW),
        "record": lambda: ledger.record(entry("0.5")),
        "settle": lambda: ledger.settle(hold, entry("0.75")),
    }
    coroutines: dict[str, Callable[[], Awaitable[Any]]] = {
        "aspend": lambda: ledger.aspend("day", now=NOW),
        "areserve": lambda: ledger.areserve(Decimal(1), limits=LIMITS, scope=None, now=NOW),
        "arecord": lambda: ledger.arecord(entry("0.5")),
        "asettle": lambda: ledger.asettle(hold, entry("0.75")),
    }
    outcomes = {name: timed(call) for name, call in operations.items()}
    for name, make in coroutines.items():
        outcomes[name] = timed(lambda make=make: asyncio.run(make()))  # type: ignore[misc]
    return outcomes


def assert_bounded(outcomes: dict[str, tuple[float, Any]], *, reads_fail: bool) -> None:
    """Every operation ended within the bound; writes returned, reads raised if told."""
    for name, (seconds, outcome) in outcomes.items():
        assert seconds < BOUND + MARGIN, (name, seconds)
        if name.lstrip("a") in ("record", "settle") or name == "asettle":
            assert outcome is None, (name, outcome)
        elif reads_fail or name.lstrip("a") == "reserve":
            assert isinstance(outcome, LedgerTimeoutError), (name, outcome)
            assert outcome.operation in ("spend", "reserve"), outcome.operation
            assert outcome.timeout == timedelta(seconds=BOUND)
            assert f"{BOUND:g} s" in str(outcome)


def assert_everything_stored(ledger: SqlCostLedger, recorded: Decimal) -> None:
    """After the next operation: no write left pending or stored twice, no hold left,
    and spend equal to the entries."""
    assert ledger.spend("day", now=NOW) == recorded  # no hold remains
    assert ledger.pending == 0
    stored = ledger.entries()
    assert len({e.entry_id for e in stored}) == len(stored)
    assert exact_sum(e.cost for e in stored) == recorded


# -- every operation is bounded ----------------------------------------------------------


def test_opening_a_postgres_that_accepts_and_never_answers_ends_within_operation_timeout() -> None:
    pytest.importorskip("psycopg")
    with silent_server() as port:
        seconds, outcome = timed(
            lambda: SqlCostLedger(
                f"postgresql+psycopg://postgres@127.0.0.1:{port}/test",
                operation_timeout=BOUND,
                connect_timeout=2,
            )
        )
        assert seconds < BOUND + MARGIN
        assert isinstance(outcome, LedgerTimeoutError)
        assert outcome.operation == "open"
        # The helper thread still waiting for libpq ends by its connect_timeout.
        for helper in threading.enumerate():
            if helper.name == "llm-resilience-ledger-connect":
                helper.join(timeout=2 + MARGIN)
                assert not helper.is_alive()


def test_a_postgres_silent_from_the_first_connection_bounds_every_operation(
    postgres_url: str,
) -> None:
    with postgres_schema(postgres_url) as url, proxied(url) as (proxy, through_proxy):
        ledger = SqlCostLedger(through_proxy, operation_timeout=BOUND, connect_timeout=2)
        try:
            hold = ledger.reserve(Decimal(1), limits=LIMITS, scope=None, now=NOW)
            ledger.close()  # no pooled connection left: every operation must connect
            proxy.mode = "silent"
            outcomes = run_every_operation(ledger, hold)
            assert_bounded(outcomes, reads_fail=True)
            assert ledger.pending == 4
            proxy.mode = "forward"
            # 2 records of 0.5, and the one settle that released the hold: 0.75 twice.
            assert_everything_stored(ledger, Decimal("2.5"))
        finally:
            ledger.close()


def test_a_postgres_going_silent_after_the_pool_has_connections_bounds_every_operation(
    postgres_url: str,
) -> None:
    with postgres_schema(postgres_url) as url, proxied(url) as (proxy, through_proxy):
        ledger = SqlCostLedger(through_proxy, operation_timeout=BOUND)
        try:
            hold = ledger.reserve(Decimal(1), limits=LIMITS, scope=None, now=NOW)
            warm = [threading.Thread(target=ledger.spend, args=("day",)) for _ in range(4)]
            for thread in warm:
                thread.start()
            for thread in warm:
                thread.join()
            proxy.mode = "silent"
            outcomes = run_every_operation(ledger, hold)
            assert_bounded(outcomes, reads_fail=True)
            proxy.mode = "forward"
            # The interrupted connections were discarded: the first call after the
            # outage succeeds instead of meeting a dead socket.
            assert_everything_stored(ledger, Decimal("2.5"))
        finally:
            ledger.close()


def test_a_sqlite_file_locked_by_another_connection_bounds_every_operation(
    tmp_path: Path,
) -> None:
    path = tmp_path / "spend.db"
    ledger = SqlCostLedger(f"sqlite:///{path}", operation_timeout=BOUND)
    try:
        hold = ledger.reserve(Decimal(1), limits=LIMITS, scope=None, now=NOW)
        with locked(path):
            outcomes = run_every_operation(ledger, hold)
            # WAL: reads go on during another's write, counting what waits in memory.
            assert_bounded(outcomes, reads_fail=False)
            assert outcomes["spend"][1] == Decimal(1)  # the hold
            # The hold is still there (its settle waits), and so are the pending entries.
            assert outcomes["aspend"][1] == Decimal(1) + Decimal("0.5") + Decimal("0.75")
            assert ledger.pending == 4
        assert_everything_stored(ledger, Decimal("2.5"))
    finally:
        ledger.close()


def test_an_async_operation_abandoned_by_its_caller_leaves_no_thread_past_its_bound(
    tmp_path: Path,
) -> None:
    path = tmp_path / "spend.db"
    ledger = SqlCostLedger(f"sqlite:///{path}", operation_timeout=BOUND)

    async def give_up_early() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                ledger.areserve(Decimal(1), limits=LIMITS, scope=None, now=NOW), 0.05
            )

    try:
        with locked(path):
            # asyncio.run returns once its worker threads have ended: the one still
            # waiting for the lock ends by the operation's deadline.
            seconds, outcome = timed(lambda: asyncio.run(give_up_early()))
            assert outcome is None
            assert seconds < BOUND + MARGIN
        assert ledger.spend("day", now=NOW) == Decimal(0)  # it never took the hold later
    finally:
        ledger.close()


# -- writes the database did not take are kept -------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_fifty_calls_made_while_the_ledger_is_away_are_stored_once_each_in_order(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    def calls(ledger: SqlCostLedger, holds: list[Reservation]) -> list[LedgerEntry]:
        made = []
        for index in range(50):
            one = entry(f"0.0{index % 10}1", at=NOW + timedelta(microseconds=index))
            if index % 5 == 0:
                ledger.settle(holds[index // 5], one)
            else:
                ledger.record(one)
            made.append(one)
        return made

    if backend == "sqlite":
        path = tmp_path / "spend.db"
        ledger = SqlCostLedger(f"sqlite:///{path}", operation_timeout=0.05)
        holds = [ledger.reserve(Decimal(1), limits=LIMITS, scope=None, now=NOW) for _ in range(10)]
        with locked(path):
            made = calls(ledger, holds)
            assert ledger.pending == 50
    else:
        with (
            postgres_schema(request.getfixturevalue("postgres_url")) as url,
            proxied(url) as (proxy, through_proxy),
        ):
            ledger = SqlCostLedger(through_proxy, operation_timeout=BOUND)
            holds = [
                ledger.reserve(Decimal(1), limits=LIMITS, scope=None, now=NOW) for _ in range(10)
            ]
            proxy.mode = "reset"
            made = calls(ledger, holds)
            assert ledger.pending == 50
            proxy.mode = "forward"
            ledger.spend("day", now=NOW)  # the next operation stores them first
            stored = ledger.entries()
            ledger.close()
    if backend == "sqlite":
        ledger.spend("day", now=NOW)
        stored = ledger.entries()
    try:
        assert [e.entry_id for e in stored] == [e.entry_id for e in made]
        assert stored == made
        recorded = exact_sum(e.cost for e in made)
        if backend == "sqlite":
            assert_everything_stored(ledger, recorded)
    finally:
        ledger.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_an_entry_written_twice_is_stored_and_counted_once(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    def check(url: str) -> None:
        ledger = SqlCostLedger(url)
        try:
            once = entry("0.5", scope="t")
            ledger.record(once)
            ledger.record(once)  # a retry of a write that had reached the database
            hold = ledger.reserve(Decimal(2), limits=LIMITS, scope="t", now=NOW)
            settled = entry("0.25", scope="t")
            ledger.settle(hold, settled)
            ledger.settle(hold, settled)
            assert [e.entry_id for e in ledger.entries()] == [once.entry_id, settled.entry_id]
            assert ledger.spend("day", now=NOW) == Decimal("0.75")
            assert ledger.spend("month", scope="t", now=NOW) == Decimal("0.75")
        finally:
            ledger.close()

    if backend == "sqlite":
        check(f"sqlite:///{tmp_path / 'spend.db'}")
    else:
        with postgres_schema(request.getfixturevalue("postgres_url")) as url:
            check(url)


def metric_points(reader: Any) -> dict[str, int]:
    """Each metric's value: counters since the last call (deltas), the up-down counter
    since the process started (cumulative)."""
    totals: dict[str, int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                change = sum(point.value for point in metric.data.data_points)
                totals[metric.name] = totals.get(metric.name, 0) + change
    return totals


def test_the_queue_keeps_the_newest_max_pending_writes_and_counts_what_it_drops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, metric_reader: Any
) -> None:
    path = tmp_path / "spend.db"
    ledger = SqlCostLedger(f"sqlite:///{path}", operation_timeout=0.05, max_pending=3)
    try:
        made = [entry(f"{index}", at=NOW + timedelta(seconds=index)) for index in range(5)]
        before = metric_points(metric_reader).get(telemetry.LEDGER_PENDING, 0)
        with locked(path), caplog.at_level(logging.WARNING, "llm_resilience"):
            for each in made:
                ledger.record(each)
            assert (ledger.pending, ledger.dropped) == (3, 2)
            points = metric_points(metric_reader)
            assert points[telemetry.LEDGER_PENDING] == before + 3
            assert points[telemetry.LEDGER_DROPPED] == 2
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 5  # one per call that could not be written
        for warning in warnings:
            assert "could not record (LedgerTimeoutError)" in warning.getMessage()
            assert "spend.db" in warning.getMessage()  # names the ledger
        assert "dropped" in warnings[-1].getMessage()
        assert [e.entry_id for e in ledger.entries()] == [e.entry_id for e in made[2:]]
        assert ledger.pending == 0
        assert metric_points(metric_reader)[telemetry.LEDGER_PENDING] == before
    finally:
        ledger.close()


def test_a_settle_that_failed_leaves_no_hold_once_the_next_operation_has_run(
    tmp_path: Path,
) -> None:
    path = tmp_path / "spend.db"
    ledger = SqlCostLedger(f"sqlite:///{path}", operation_timeout=0.1)
    try:
        hold = ledger.reserve(Decimal(5), limits=LIMITS, scope="a", now=NOW)
        with locked(path):
            ledger.settle(hold, entry("2", scope="a"))
            assert ledger.pending == 1
            # Meanwhile the hold and the entry waiting both count: never less than spent.
            assert ledger.spend("day", scope="a", now=NOW) == Decimal(7)
        assert ledger.spend("day", scope="a", now=NOW) == Decimal(2)
        with sqlite3.connect(path) as connection:
            assert connection.execute(
                "SELECT count(*) FROM cost_ledger_reservations"
            ).fetchone() == (0,)
        connection.close()
        assert ledger.entries()[0].cost == Decimal(2)
    finally:
        ledger.close()


def test_close_stores_what_waits_and_reports_what_it_could_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "spend.db"
    ledger = SqlCostLedger(f"sqlite:///{path}", operation_timeout=BOUND)
    with locked(path):
        ledger.record(entry("0.25"))
        with caplog.at_level(logging.WARNING, "llm_resilience"):
            seconds, _ = timed(ledger.close)
        assert seconds < BOUND + MARGIN
        assert "closed with 1 writes (0.25 of spend) not yet stored" in caplog.text
    assert ledger.pending == 1
    asyncio.run(ledger.aclose())  # the lock is gone: stored now
    assert ledger.pending == 0
    reopened = SqlCostLedger(f"sqlite:///{path}")
    try:
        assert reopened.spend("day", now=NOW) == Decimal("0.25")
    finally:
        reopened.close()


_AT_EXIT = """
import logging, sqlite3, sys
from datetime import UTC, datetime
from decimal import Decimal
from llm_resilience.ledger import LedgerEntry, SqlCostLedger

logging.basicConfig(level=logging.WARNING)
path, release = sys.argv[1], sys.argv[2] == "release"
ledger = SqlCostLedger(f"sqlite:///{path}", operation_timeout=0.2)
holder = sqlite3.connect(path, isolation_level=None)
holder.execute("BEGIN EXCLUSIVE")
ledger.record(LedgerEntry(datetime(2026, 11, 29, tzinfo=UTC), "chat", cost=Decimal("0.25")))
assert ledger.pending == 1
if release:
    holder.execute("COMMIT")
"""


@pytest.mark.parametrize("release", [True, False])
def test_at_exit_waiting_writes_are_stored_or_logged_with_their_count_and_money(
    tmp_path: Path, release: bool
) -> None:
    path = tmp_path / "spend.db"
    finished = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_AT_EXIT),
            str(path),
            "release" if release else "keep",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    with sqlite3.connect(path) as connection:
        stored = connection.execute("SELECT cost FROM cost_ledger").fetchall()
    connection.close()
    if release:
        assert stored == [("0.25",)]
        assert "never stored" not in finished.stderr
    else:
        assert stored == []
        assert "1 writes (0.25 of spend) were never stored" in finished.stderr


# -- nothing private leaves the ledger ------------------------------------------------------

SECRET = "user-4f9c2e@example.com"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_no_sql_parameter_reaches_an_exception_message_or_a_log(
    backend: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def check(url: str, refuse: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.exc import DBAPIError

        ledger = SqlCostLedger(url, echo=True)
        admin = create_engine(url)
        try:
            with admin.begin() as connection:
                for statement in refuse.split(";;"):
                    connection.exec_driver_sql(statement)
            with caplog.at_level(logging.DEBUG):
                with pytest.raises(DBAPIError, match="refused by test") as refused:
                    ledger.record(entry("0.5", scope=SECRET))  # the database refuses it
                ledger.spend("day", scope=SECRET, now=NOW)
            chain = [refused.value, refused.value.__cause__, refused.value.__context__]
            assert all(SECRET not in str(error) for error in chain)
            assert SECRET not in caplog.text
            assert "parameters hidden" in caplog.text  # echo=True logged the statements
        finally:
            admin.dispose()
            ledger.close()

    if backend == "sqlite":
        check(
            f"sqlite:///{tmp_path / 'spend.db'}",
            "CREATE TRIGGER refuse BEFORE INSERT ON cost_ledger "
            f"WHEN NEW.scope = '{SECRET}' BEGIN SELECT RAISE(ABORT, 'refused by test'); END",
        )
    else:
        with postgres_schema(request.getfixturevalue("postgres_url")) as url:
            check(
                url,
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'refused by test'; END $$;;"
                "CREATE TRIGGER refuse BEFORE INSERT ON cost_ledger FOR EACH ROW "
                f"WHEN (NEW.scope = '{SECRET}') EXECUTE FUNCTION refuse()",
            )


def test_a_write_kept_and_a_read_timing_out_name_no_parameter(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "spend.db"
    ledger = SqlCostLedger(f"sqlite:///{path}", operation_timeout=0.1)
    try:
        with locked(path), caplog.at_level(logging.DEBUG):
            ledger.record(entry("0.5", scope=SECRET))
            with pytest.raises(LedgerTimeoutError) as timed_out:
                ledger.reserve(Decimal(1), limits={("day", SECRET): Decimal(9)}, scope=SECRET)
        assert "could not record (LedgerTimeoutError)" in caplog.text
        assert SECRET not in caplog.text
        assert SECRET not in str(timed_out.value)
        assert SECRET not in str(timed_out.value.__cause__)
    finally:
        ledger.close()
