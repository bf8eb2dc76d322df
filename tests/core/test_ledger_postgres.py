"""What only the PostgreSQL ledger does (SPEC section 4).

The shared contract, including 8 processes x 500 records and cross-process ``reserve``,
runs on PostgreSQL in ``test_ledger_sql.py``. Here: a first-release PostgreSQL table
(``TIMESTAMP WITHOUT TIME ZONE``, plain ``NUMERIC``) migrated by concurrent openers,
session time zones, and how failures surface. Each test works in a fresh schema of the
``test`` database, dropped afterwards; the failure tests need no server at all.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from llm_resilience.ledger import LedgerEntry, SqlCostLedger

pytest.importorskip("psycopg")

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import OperationalError

from .test_ledger_write_behind import run_released

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
COLUMNS = [
    "id", "timestamp", "kind", "input_tokens", "output_tokens", "cost",
    "pages", "model", "estimated", "surface", "scope", "entry_id",
    "cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens", "reasoning_tokens",
    "run_id", "thread_id",
]  # fmt: skip


@contextmanager
def schema(base_url: str, **options: str) -> Iterator[tuple[str, Engine]]:
    """A URL confined to a fresh schema (plus libpq ``options``), and an engine on it."""
    name = f"ledger_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url)
    with admin.begin() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {name}")
    settings = " ".join(
        f"-c{key}={value}" for key, value in {"search_path": name, **options}.items()
    )
    url = make_url(base_url).update_query_dict({"options": settings, "application_name": name})
    rendered = url.render_as_string(hide_password=False)
    inside = create_engine(rendered)
    try:
        yield rendered, inside
    finally:
        inside.dispose()
        with admin.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA {name} CASCADE")
        admin.dispose()


def test_a_first_release_table_is_migrated_by_eight_concurrent_openers(postgres_url: str) -> None:
    with schema(postgres_url) as (url, engine):
        with engine.begin() as connection:
            connection.exec_driver_sql(
                "CREATE TABLE cost_ledger (id SERIAL PRIMARY KEY, timestamp TIMESTAMP NOT NULL, "
                "kind TEXT NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, "
                "cost NUMERIC NOT NULL)"
            )
            connection.exec_driver_sql(
                "INSERT INTO cost_ledger (timestamp, kind, input_tokens, output_tokens, cost) VALUES "
                "('2026-11-29 08:00:00', 'chat', 100, 20, 0.1), "
                "('2026-11-29 09:30:00', 'embedding', 50, 0, 0.2), "
                "('2026-11-03 10:00:00', 'chat', 10, 10, 1), "
                "('2026-10-31 23:59:59.999999', 'chat', 10, 10, 5)"
            )
        start, failures = threading.Barrier(8), []

        def open_it() -> None:
            start.wait()
            try:
                SqlCostLedger(url).close()
            except Exception as error:  # collected, asserted below
                failures.append(error)

        openers = [threading.Thread(target=open_it) for _ in range(8)]
        for opener in openers:
            opener.start()
        for opener in openers:
            opener.join()
        assert failures == []

        with engine.connect() as connection:
            columns = connection.exec_driver_sql(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = 'cost_ledger' "
                "ORDER BY ordinal_position"
            ).scalars()
            assert list(columns) == COLUMNS
        ledger = SqlCostLedger(url)
        try:
            assert [(e.timestamp, e.cost) for e in ledger.entries()] == [
                (datetime(2026, 10, 31, 23, 59, 59, 999999, tzinfo=UTC), Decimal(5)),
                (datetime(2026, 11, 3, 10, tzinfo=UTC), Decimal(1)),
                (datetime(2026, 11, 29, 8, tzinfo=UTC), Decimal("0.1")),
                (datetime(2026, 11, 29, 9, 30, tzinfo=UTC), Decimal("0.2")),
            ]
            assert ledger.spend("day", now=NOW) == Decimal("0.3")
            assert ledger.spend("month", now=NOW) == Decimal("1.3")  # built once, not 8 times
            assert all((e.run_id, e.thread_id) == (None, None) for e in ledger.entries())
            ledger.record(LedgerEntry(NOW, "chat", cost=Decimal("0.5"), run_id="r", thread_id="t"))
            assert ledger.run_spend(run="r") == ledger.run_spend(thread="t") == Decimal("0.5")
        finally:
            ledger.close()
        with engine.connect() as connection:
            indexes = connection.exec_driver_sql(
                "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
                "AND tablename = 'cost_ledger'"
            ).scalars()
            assert {"ix_cost_ledger_run_id", "ix_cost_ledger_thread_id"} <= set(indexes)


def test_a_migration_slower_than_the_operation_bound_between_statements_completes(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A busy machine may pause the opening process inside the migration's transaction
    # for longer than ``operation_timeout``: the session's server-side bounds (the idle
    # one included) must be the migration's there, or the server ends the session.
    from llm_resilience.ledger import _connections

    migrate = _connections.migrate

    def paused(connection: Any, *, postgres: bool) -> None:
        time.sleep(0.6)  # idle in the migration's transaction, past the 0.2 s bound
        migrate(connection, postgres=postgres)

    monkeypatch.setattr(_connections, "migrate", paused)
    with schema(postgres_url) as (url, _engine):
        ledger = SqlCostLedger(url, operation_timeout=0.2)
        try:
            ledger.record(LedgerEntry(NOW, "chat", 1, 1, Decimal("0.5")))
            assert ledger.spend("day", now=NOW) == Decimal("0.5")
        finally:
            ledger.close()


def test_timestamps_are_utc_whatever_the_session_time_zone(postgres_url: str) -> None:
    with schema(postgres_url, TimeZone="Asia/Tokyo") as (url, engine):
        with engine.begin() as connection:  # a first-release column without a time zone
            connection.exec_driver_sql(
                "CREATE TABLE cost_ledger (id SERIAL PRIMARY KEY, timestamp TIMESTAMP NOT NULL, "
                "kind TEXT NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, "
                "cost NUMERIC NOT NULL)"
            )
        late = datetime(2026, 11, 29, 23, 30, tzinfo=UTC)  # already the 30th in Tokyo
        ledger = SqlCostLedger(url)
        try:
            ledger.record(LedgerEntry(late, "chat", cost=Decimal("0.5")))
            assert ledger.entries()[0].timestamp == late
            assert ledger.spend("day", now=late) == Decimal("0.5")
        finally:
            ledger.close()
        with engine.connect() as connection:
            stored = connection.exec_driver_sql("SELECT timestamp FROM cost_ledger").scalar_one()
        assert stored == datetime(2026, 11, 29, 23, 30)  # naive, and UTC


def test_numeric_keeps_every_digit_of_a_cost(postgres_url: str) -> None:
    forty_digits = Decimal("123456789012345678901.2345678901234567890")
    with schema(postgres_url) as (url, _):
        ledger = SqlCostLedger(url)
        try:
            ledger.record(LedgerEntry(NOW, "chat", cost=forty_digits))
            assert ledger.entries()[0].cost == forty_digits
            assert ledger.spend("month", now=NOW) == forty_digits
        finally:
            ledger.close()


# One writer process: opens a durable ledger and a write-behind one on the same database,
# says it is ready, waits for "go" on stdin, records ``count`` entries through the
# write-behind ledger and, between every third, one through the durable ledger (scopes
# w0, w1, w2, today), closes both, and exits. Its log goes to stderr.
_WRITER = """
import logging, sys
from datetime import UTC, datetime
from decimal import Decimal
from llm_resilience.ledger import LedgerEntry, SqlCostLedger

logging.basicConfig(level=logging.WARNING)
url, count = sys.argv[1], int(sys.argv[2])
durable, behind = SqlCostLedger(url), SqlCostLedger(url, write_behind=0.05)
print("ready", flush=True)
sys.stdin.readline()
for index in range(count):
    scope = f"w{index % 3}"
    behind.record(LedgerEntry(datetime.now(UTC), "chat", 3, 4, Decimal("0.02"), scope=scope))
    if index % 3 == 0:
        scope = f"w{index // 3 % 3}"
        durable.record(LedgerEntry(datetime.now(UTC), "chat", 3, 4, Decimal("0.01"), scope=scope))
behind.close()
durable.close()
"""


def test_eight_writer_processes_lose_no_entry_durable_or_write_behind(postgres_url: str) -> None:
    # Nothing recorded is ever lost: 8 processes writing at once, each through a durable
    # ledger (one statement per entry) and a write-behind one (batches of up to 100),
    # store every entry and every cent of the totals, with no write left waiting.
    processes, count = 8, 300
    with schema(postgres_url) as (url, engine):
        SqlCostLedger(url).close()  # the tables, created once
        writers, outputs = run_released(_WRITER, [[url, str(count)]] * processes)
        logs = [log for _, log in outputs]
        assert [writer.returncode for writer in writers] == [0] * processes, logs
        assert logs == [""] * processes  # no write kept waiting, none lost at exit
        with engine.connect() as connection:
            stored = connection.exec_driver_sql(
                "SELECT cost, count(*), count(DISTINCT entry_id) FROM cost_ledger GROUP BY cost"
            ).all()
            totals = dict(
                connection.exec_driver_sql(
                    "SELECT scope || ' ' || split_part(window_key, ':', 1), sum(total) "
                    "FROM cost_ledger_totals GROUP BY 1"
                ).all()
            )
        behind, durable = processes * count, processes * count // 3
        assert sorted(stored) == [
            (Decimal("0.01"), durable, durable),
            (Decimal("0.02"), behind, behind),
        ]
        per_scope = {f"w{i}": Decimal(0) for i in range(3)}  # what _WRITER records
        for index in range(count):
            per_scope[f"w{index % 3}"] += Decimal("0.02") * processes
            if index % 3 == 0:
                per_scope[f"w{index // 3 % 3}"] += Decimal("0.01") * processes
        everything = Decimal("0.02") * behind + Decimal("0.01") * durable
        assert totals == {
            " day": everything,
            " month": everything,
            **{
                f"{scope} {w}": money
                for scope, money in per_scope.items()
                for w in ("day", "month")
            },
        }


def test_a_write_the_database_ends_as_a_deadlock_is_tried_again_and_stored(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Another session holds this month's global totals and then asks for today's, which
    # the ledger's record holds while it waits for the month: a real deadlock. The
    # ledger's session (deadlock_timeout 300 ms, the other's 60 s) is the one PostgreSQL
    # ends with 40P01; the record must try again, not keep its write waiting.
    with schema(postgres_url, deadlock_timeout="300ms") as (url, engine):
        ledger = SqlCostLedger(url)
        day, month = "day:2026-11-29", "month:2026-11"
        with engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO cost_ledger_totals (window_key, scope, shard, total) "
                f"SELECT key, '', shard, 0 FROM unnest(ARRAY['{day}', '{month}']) AS key, "
                "generate_series(0, 15) AS shard"
            )
        other = engine.connect()
        try:
            other.exec_driver_sql("SET deadlock_timeout = '60s'")  # begins its transaction
            other.exec_driver_sql(
                f"UPDATE cost_ledger_totals SET total = total WHERE window_key = '{month}'"
            )
            recording = threading.Thread(
                target=ledger.record, args=(LedgerEntry(NOW, "chat", 1, 1, Decimal(1)),)
            )
            with caplog.at_level(logging.WARNING):
                recording.start()
                with engine.connect() as watcher:  # until the record waits for a month row
                    deadline = time.monotonic() + 10
                    while True:
                        waiting = watcher.exec_driver_sql(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                            "AND application_name = current_setting('application_name')"
                        ).scalar_one()
                        # A transaction reads pg_stat_activity once (stats_fetch_consistency
                        # = cache): end it, so the next poll sees a record connected since.
                        watcher.rollback()
                        if waiting:
                            break
                        assert time.monotonic() < deadline, "the record never waited"
                        time.sleep(0.01)
                other.exec_driver_sql(
                    f"UPDATE cost_ledger_totals SET total = total WHERE window_key = '{day}'"
                )
                other.commit()
                recording.join(10)
            assert not recording.is_alive()
            assert ledger.pending == 0
            assert [r.getMessage() for r in caplog.records] == []
            assert ledger.spends([("day", None), ("month", None)], now=NOW) == (Decimal(1),) * 2
            assert len(ledger.entries()) == 1
        finally:
            other.close()
            ledger.close()


def test_a_dropped_connection_fails_one_call_and_the_next_reconnects(postgres_url: str) -> None:
    with schema(postgres_url) as (url, engine):
        ledger = SqlCostLedger(url)
        try:
            ledger.record(LedgerEntry(NOW, "chat", cost=Decimal(1)))
            with engine.connect() as connection:
                killed = connection.exec_driver_sql(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = current_setting('application_name') "
                    "AND pid <> pg_backend_pid()"
                ).scalar_one()
            assert killed >= 1
            with pytest.raises(OperationalError, match=r"terminat|closed|connection"):
                ledger.spend("day", now=NOW)
            assert ledger.spend("day", now=NOW) == Decimal(1)
        finally:
            ledger.close()


def test_the_url_and_repr_never_show_the_password(postgres_url: str) -> None:
    with_password = make_url(postgres_url).set(password="s3cret")  # trust auth ignores it
    with schema(with_password.render_as_string(hide_password=False)) as (url, _):
        ledger = SqlCostLedger(url)
        try:
            assert "s3cret" not in repr(ledger)
            assert "s3cret" not in ledger.url
            assert "***" in ledger.url
        finally:
            ledger.close()


def test_a_refused_connection_raises_at_once() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(OperationalError, match=r"refused|failed"):
        SqlCostLedger(f"postgresql+psycopg://postgres@127.0.0.1:{port}/test")
    assert time.monotonic() - started < 2


def test_a_server_that_never_answers_fails_after_the_connect_timeout() -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, then says nothing
    port = silent.getsockname()[1]
    accepted: list[Any] = []
    keeper = threading.Thread(target=lambda: accepted.append(silent.accept()), daemon=True)
    keeper.start()
    started = time.monotonic()
    try:
        with pytest.raises(OperationalError, match=r"timeout|timed out"):
            SqlCostLedger(f"postgresql+psycopg://postgres@127.0.0.1:{port}/test", connect_timeout=2)
        assert time.monotonic() - started < 4  # libpq counts whole seconds, 2 at least
    finally:
        for connection, _ in accepted:
            connection.close()
        silent.close()
