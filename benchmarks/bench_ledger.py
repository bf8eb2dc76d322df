"""Gate reads and writes of ``SqlCostLedger`` on SQLite and PostgreSQL.

Three measurements per database:

* **gate read latency**: ``spend("day")`` and ``spend("month")`` (what the budget gate
  reads before every call) on a ledger holding ``ROWS`` entries in the current UTC month
  (1,000,000; 100,000 with ``--quick``), p50/p99 over many calls, against the plain
  ``SELECT SUM(cost) FROM cost_ledger WHERE timestamp >= <month start>`` a ledger without
  running totals would run, issued through the bare driver (its floor). The rows are
  bulk-loaded in one transaction (SQLite: ``executemany``; PostgreSQL: ``COPY``), then the
  ledger is opened on them, which builds the running totals from the rows exactly as it
  does when migrating a first-release table: that open is timed too.
* **gate reads, one round trip or several**: a budget with day and month limits reads
  both windows (a scoped one four: scope and global of each). Before ``spends`` the gate
  read them one ``spend`` (one bounded operation, one round trip) each; now in one
  ``spends``. Both, and the whole gate (``begin`` + ``abandon``) each way, sync and
  async (one event loop, ``aspend``/``aspends`` in a worker thread).
* **records per second**: 8 writer processes (``spawn``, each with its own ledger) and,
  for reference, 1, each recording 2,000 fresh entries (300 with ``--quick``), timed
  from a barrier that releases them together to the last ``close()`` (every entry
  committed): durable (each record its own one-statement transaction before it returns)
  and with ``write_behind=0.05`` (batches of up to 100, one statement each).
* **gate reads under write load**: the gate with day and month limits (``begin`` +
  ``abandon``, sync and async), read by this process on the loaded ledger while 8 writer
  processes record fresh entries as fast as they can (durable, then write-behind), by
  a default ledger (exact: every read reaches the database, SQLite's kept reads aside)
  and by a write-behind one (the stored part reused for up to the interval). On
  PostgreSQL, its floor beside them, under the same load: the default ledger's gate
  read (the same statement, the same parameters, built by ``psycopg_spends``) and, the
  absolute floor, ``SELECT 1``, each on a bare psycopg connection in autocommit (no
  ledger, no gate, no worker thread), sync and async (``AsyncConnection``, one event
  loop): what one round trip costs this process while the writers hold the cores.

SQLite works in a temporary directory; PostgreSQL (``LLM_RESILIENCE_TEST_POSTGRES_URL``,
default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``) in a fresh schema dropped at
the end, skipped with a note when the server is not there. Prints markdown tables.

    python benchmarks/bench_ledger.py            # ~4 min on 2 cores
    python benchmarks/bench_ledger.py --quick    # ~30 s
    python benchmarks/bench_ledger.py --reads-only   # the reads, no writer processes
    python benchmarks/bench_ledger.py --postgres-only  # no SQLite reads under load
    python benchmarks/bench_ledger.py --sqlite-under-load  # only that: a million rows,
                                                           # 8 writers on one file (~2 min)
    python benchmarks/bench_ledger.py --postgres-under-load  # only that on PostgreSQL,
                                                             # with its floor (~2 min)
    python benchmarks/bench_ledger.py --postgres-interleaved  # the sync gate and its
                                                              # floors interleaved (~2 min)
    python benchmarks/bench_ledger.py --postgres-interleaved --idle  # the same, no writers
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import platform
import random
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing, contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from llm_resilience import CostBudget
from llm_resilience.budget import BudgetGate
from llm_resilience.ledger import LedgerEntry, SqlCostLedger
from llm_resilience.ledger._protocol import SpendWindow, window_bounds

POSTGRES_URL = os.environ.get(
    "LLM_RESILIENCE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
GOAL_P50_MS = 1.0
#: Goal of issue 23: the gate's p99 under the write load of ``WRITERS`` processes.
GOAL_LOADED_P99_MS = 1.0
WRITERS = 8
#: ``write_behind`` of the batching writers (and readers): committed at least this often.
WRITE_BEHIND = 0.05
COLUMNS = (
    "timestamp, kind, input_tokens, output_tokens, cost, pages, model, estimated, surface, scope"
)


def month_rows(count: int, now: datetime) -> Iterator[tuple[Any, ...]]:
    """``count`` chat entries spread over the current UTC month up to ``now``; one in ten
    scoped to a tenant; costs with up to 7 decimals, as token prices produce."""
    start, _ = window_bounds("month", now)
    span = (now - start).total_seconds()
    rng = random.Random(7)
    for n in range(count):
        at = start + timedelta(seconds=span * n / count)
        tokens_in, tokens_out = rng.randint(100, 4000), rng.randint(10, 800)
        cost = (Decimal(tokens_in) * 3 + Decimal(tokens_out) * 15) / 1_000_000
        scope = "tenant-1" if n % 10 == 0 else None
        yield at, "chat", tokens_in, tokens_out, cost, 0, "gpt-4o-mini", False, "chat", scope


def percentiles(samples_ns: list[int]) -> tuple[float, float]:
    """(p50, p99) in milliseconds."""
    ordered = sorted(samples_ns)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered) / 1e6, p99 / 1e6


def timed(call: Callable[[], object], repeats: int) -> list[int]:
    call()  # warm-up: connection, statement cache
    samples = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - started)
    return samples


# -- loading ------------------------------------------------------------------------------


def load_sqlite(path: Path, count: int, now: datetime) -> None:
    SqlCostLedger(f"sqlite:///{path}").close()  # our schema, empty
    connection = sqlite3.connect(path)
    with connection:
        connection.executemany(
            f"INSERT INTO cost_ledger ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                (at.strftime("%Y-%m-%d %H:%M:%S.%f"), kind, i, o, format(c, "f"), p, m, e, s, sc)
                for at, kind, i, o, c, p, m, e, s, sc in month_rows(count, now)
            ),
        )
        connection.execute("DELETE FROM cost_ledger_totals")  # rebuilt by the next open
    connection.close()


def load_postgres(url: str, count: int, now: datetime) -> None:
    import psycopg

    SqlCostLedger(url).close()
    with psycopg.connect(**postgres_params(url)) as connection, connection.cursor() as cursor:
        with cursor.copy(f"COPY cost_ledger ({COLUMNS}) FROM STDIN") as copy:
            for row in month_rows(count, now):
                copy.write_row(row)
        cursor.execute("DELETE FROM cost_ledger_totals")
        cursor.execute("ANALYZE cost_ledger")


def postgres_params(url: str) -> dict[str, Any]:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    params: dict[str, Any] = {
        "host": parsed.host,
        "port": parsed.port or 5432,
        "user": parsed.username,
        "dbname": parsed.database,
    }
    if parsed.password:
        params["password"] = parsed.password
    if "options" in parsed.query:
        params["options"] = parsed.query["options"]
    return params


@contextmanager
def postgres_schema() -> Iterator[str | None]:
    """A URL confined to a fresh schema, or None when PostgreSQL is not reachable."""
    try:
        import psycopg
        from sqlalchemy.engine import make_url
    except ImportError:
        yield None
        return
    base = make_url(POSTGRES_URL)
    try:
        socket.create_connection((base.host or "127.0.0.1", base.port or 5432), timeout=1).close()
    except OSError:
        yield None
        return
    name = f"bench_ledger_{uuid.uuid4().hex[:10]}"
    params = postgres_params(POSTGRES_URL)
    with psycopg.connect(**params, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {name}")
    try:
        scoped = base.update_query_dict({"options": f"-csearch_path={name}"})
        yield scoped.render_as_string(hide_password=False)
    finally:
        with psycopg.connect(**params, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA {name} CASCADE")


# -- measurements -------------------------------------------------------------------------


def gate_reads(
    database: str, url: str, count: int, repeats: int, scans: int, now: datetime
) -> list[str]:
    """Markdown rows: load, open (building totals), our reads, the scanning baseline."""
    started = time.perf_counter()
    if database == "SQLite":
        load_sqlite(Path(url.removeprefix("sqlite:///")), count, now)
    else:
        load_postgres(url, count, now)
    loaded = time.perf_counter() - started
    started = time.perf_counter()
    ledger = SqlCostLedger(url)
    opened = time.perf_counter() - started
    month_start, _ = window_bounds("month", now)

    if database == "SQLite":
        raw = sqlite3.connect(url.removeprefix("sqlite:///"))
        stamp = month_start.strftime("%Y-%m-%d %H:%M:%S.%f")

        def scan() -> object:
            query = "SELECT SUM(cost) FROM cost_ledger WHERE timestamp >= ?"
            return raw.execute(query, (stamp,)).fetchone()

        close_raw: Callable[[], None] = raw.close
    else:
        import psycopg

        pg = psycopg.connect(**postgres_params(url), autocommit=True)

        def scan() -> object:
            query = "SELECT SUM(cost) FROM cost_ledger WHERE timestamp >= %s"
            return pg.execute(query, (month_start,)).fetchone()

        close_raw = pg.close

    try:
        day = percentiles(timed(lambda: ledger.spend("day"), repeats))
        month = percentiles(timed(lambda: ledger.spend("month"), repeats))
        scoped = percentiles(timed(lambda: ledger.spend("month", scope="tenant-1"), repeats))
        gate = gate_rows(ledger, repeats)
        baseline = percentiles(timed(scan, scans))
        exact = ledger.spend("month")
    finally:
        close_raw()
        ledger.close()
    print(
        f"{database}: {count:,} rows loaded in {loaded:.1f} s; opening the ledger on them "
        f"(building the running totals) took {opened:.1f} s; spend('month') = {exact}",
        flush=True,
    )
    rows = [
        ("`spend('day')` (ours)", day, repeats),
        ("`spend('month')` (ours)", month, repeats),
        ("`spend('month', scope=...)` (ours)", scoped, repeats),
        *((name, result, repeats) for name, result in gate),
        ("`SELECT SUM(cost) ... >= month start` (driver)", baseline, scans),
    ]
    return [
        f"| {database} | {count:,} | {name} | {p50:.3f} | {p99:.3f} | {n} | "
        f"{baseline[0] / p50:,.0f}x |"
        for name, (p50, p99), n in rows
    ]


class PerWindow:
    """The ledger seen through the protocol only (no ``spends``): the gate then reads
    one window per round trip, as it did before ``spends``."""

    def __init__(self, ledger: SqlCostLedger) -> None:
        self._ledger = ledger

    def __getattr__(self, name: str) -> Any:
        if name in ("spends", "aspends"):
            raise AttributeError(name)
        return getattr(self._ledger, name)


async def asamples(call: Callable[[], Awaitable[object]], repeats: int) -> list[int]:
    """:func:`timed` for a coroutine function, on the running event loop."""
    await call()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        await call()
        samples.append(time.perf_counter_ns() - started)
    return samples


def atimed(call: Callable[[], Awaitable[object]], repeats: int) -> list[int]:
    """:func:`timed` for a coroutine function, every call awaited on one event loop."""
    return asyncio.run(asamples(call, repeats))


def gate_rows(ledger: SqlCostLedger, repeats: int) -> list[tuple[str, tuple[float, float]]]:
    """What a gate with day and month limits reads: the two windows one round trip each
    (before ``spends``), both in one ``spends``, the four windows of a scoped budget in
    one; and the whole gate (``begin`` + ``abandon``), sync and async, both ways."""
    both: list[SpendWindow] = [("day", None), ("month", None)]
    four: list[SpendWindow] = [
        ("day", "tenant-1"),
        ("day", None),
        ("month", "tenant-1"),
        ("month", None),
    ]
    budget = CostBudget(3, 15, daily_limit=10**9, monthly_limit=10**9)
    one_read, two_reads = BudgetGate(budget, ledger), BudgetGate(budget, PerWindow(ledger))  # type: ignore[arg-type]

    async def two_areads() -> object:
        return (await ledger.aspend("day"), await ledger.aspend("month"))

    async def gate_call(gate: BudgetGate) -> None:
        await (await gate.abegin("chat")).aabandon()

    measured = [
        (
            "two reads, `spend('day')` + `spend('month')`",
            lambda: [ledger.spend(w) for w, _ in both],
        ),
        ("one read, `spends([day, month])`", lambda: ledger.spends(both)),
        ("one read, `spends` of 4 windows (scope and global)", lambda: ledger.spends(four)),
        ("gate `begin` + `abandon`, two reads", lambda: two_reads.begin("chat").abandon()),
        ("gate `begin` + `abandon`, one read (`spends`)", lambda: one_read.begin("chat").abandon()),
    ]
    rows = [(name, percentiles(timed(call, repeats))) for name, call in measured]
    ameasured: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("async: two reads, `aspend` x 2", two_areads),
        ("async: one read, `aspends([day, month])`", lambda: ledger.aspends(both)),
        ("async gate `abegin` + `aabandon`, two reads", lambda: gate_call(two_reads)),
        ("async gate `abegin` + `aabandon`, one read", lambda: gate_call(one_read)),
    ]
    rows += [(name, percentiles(atimed(call, repeats))) for name, call in ameasured]
    return rows


def fresh_entry() -> LedgerEntry:
    """A new entry (its own ``entry_id``: every record stores a row and adds to the
    totals; the same entry recorded again would store nothing)."""
    return LedgerEntry(datetime.now(UTC), "chat", 1200, 300, Decimal("0.0081"), model="gpt-4o-mini")


def writer(url: str, start: Any, results: Any, writes: int, behind: float | None) -> None:
    ledger = SqlCostLedger(url, write_behind=behind)
    entries = [fresh_entry() for _ in range(writes)]  # made before the clock starts
    ledger.spend("day")  # connection open and warm before the clock starts
    start.wait()
    for entry in entries:
        ledger.record(entry)
    ledger.close()  # with write-behind: stores what is still queued
    results.put(time.perf_counter())


def driver_writer(url: str, start: Any, results: Any, writes: int) -> None:
    """The floor of a durable record on PostgreSQL: the ledger's own one-statement
    record, run straight on one psycopg connection (autocommit), no ledger around it."""
    import psycopg

    from llm_resilience.ledger._postgres import psycopg_statements, record_parameters

    statements, _ = psycopg_statements()
    entries = [fresh_entry() for _ in range(writes)]
    with psycopg.connect(**postgres_params(url), autocommit=True) as connection:
        connection.execute("SET TIME ZONE 'UTC'")
        start.wait()
        for entry in entries:
            connection.execute(statements[entry.scope is not None], record_parameters(entry))
    results.put(time.perf_counter())


def writes_per_second(
    url: str, processes: int, writes: int, behind: float | None, *, floor: bool = False
) -> float:
    """Records per second stored by ``processes`` writers, from the barrier to the last
    writer's ``close()`` (every entry committed); ``floor``: `driver_writer` instead."""
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(processes + 1), context.Queue()
    target, args = (
        (driver_writer, (url, start, results, writes))
        if floor
        else (writer, (url, start, results, writes, behind))
    )
    workers = [context.Process(target=target, args=args) for _ in range(processes)]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    finished = max(results.get(timeout=600) for _ in workers)
    for worker in workers:
        worker.join()
    return processes * writes / (finished - began)


def steady_writer(url: str, behind: float | None, measure: Any, stop: Any, counts: Any) -> None:
    """Records fresh entries as fast as it can until ``stop`` is set; reports how many
    it recorded while ``measure`` was set."""
    ledger = SqlCostLedger(url, write_behind=behind)
    written = recorded = 0
    while not stop.is_set():
        for _ in range(50):
            ledger.record(fresh_entry())
        recorded += 50
        if measure.is_set():
            written += 50
    ledger.close()
    counts.put((written, recorded, ledger.dropped))


def stored_rows(url: str) -> int:
    """Entries stored in the ledger at ``url``, counted without it."""
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return int(connection.exec_driver_sql("SELECT count(*) FROM cost_ledger").scalar_one())
    finally:
        engine.dispose()


GATE_READ_FLOOR = "floor: the gate's statement on bare psycopg"
SELECT_ONE_FLOOR = "floor: `SELECT 1` on bare psycopg"
OWN_READ_FLOOR = "floor: the gate's statement on the ledger's own psycopg connection"


def postgres_floors(url: str, repeats: int) -> list[tuple[str, str, tuple[float, float]]]:
    """(reader, sync or async, (p50, p99)): the default ledger's gate read on PostgreSQL
    (the statement and parameters of ``spends([day, month])``, as ``psycopg_spends``
    builds them) and ``SELECT 1``, each on a bare psycopg connection in autocommit set
    up as the ledger's (UTC), no ledger around it; sync, then async on one event loop."""
    import psycopg

    from llm_resilience.ledger._postgres import psycopg_spends

    windows: list[SpendWindow] = [("day", None), ("month", None)]  # what the gate reads
    statement, parameters = psycopg_spends(windows, datetime.now(UTC))
    params = postgres_params(url)
    with psycopg.connect(**params, autocommit=True) as connection:
        connection.execute("SET TIME ZONE 'UTC'")
        cursor = connection.cursor()  # one kept, as the ledger keeps one per connection
        read = percentiles(timed(lambda: cursor.execute(statement, parameters).fetchall(), repeats))
        one = percentiles(timed(lambda: cursor.execute("SELECT 1").fetchall(), repeats))

    async def run() -> tuple[list[int], list[int]]:
        aconnection = await psycopg.AsyncConnection.connect(**params, autocommit=True)
        async with aconnection:
            await aconnection.execute("SET TIME ZONE 'UTC'")

            async def aread() -> object:
                return await (await aconnection.execute(statement, parameters)).fetchall()

            async def aone() -> object:
                return await (await aconnection.execute("SELECT 1")).fetchall()

            return await asamples(aread, repeats), await asamples(aone, repeats)

    aread_samples, aone_samples = asyncio.run(run())
    return [
        (GATE_READ_FLOOR, "sync", read),
        (GATE_READ_FLOOR, "async", percentiles(aread_samples)),
        (SELECT_ONE_FLOOR, "sync", one),
        (SELECT_ONE_FLOOR, "async", percentiles(aone_samples)),
    ]


@contextmanager
def writers_running(url: str, behind: float | None) -> Iterator[tuple[Any, list[Any]]]:
    """``WRITERS`` processes recording into ``url`` as fast as they can (durable, or with
    write-behind ``behind``), each up and writing. Yields the event that has them count
    what they record while set, and the list their reports (``steady_writer``'s) are in
    once the block is left: then they are stopped and have closed their ledgers."""
    context = multiprocessing.get_context("spawn")
    measure, stop, counts = context.Event(), context.Event(), context.Queue()
    workers = [
        context.Process(target=steady_writer, args=(url, behind, measure, stop, counts))
        for _ in range(WRITERS)
    ]
    for worker in workers:
        worker.start()
    time.sleep(3)  # every writer up and writing
    reports: list[Any] = []
    try:
        yield measure, reports
    finally:
        stop.set()
        reports += [counts.get(timeout=600) for _ in workers]
        for worker in workers:
            worker.join()  # each has closed its ledger and exited


def interleaved_under_load(url: str, repeats: int, *, load: bool = True) -> list[str]:
    """Markdown rows: the default ledger's sync gate read (``begin`` + ``abandon``) and
    its floors (its statement on the ledger's own psycopg connection; `postgres_floors`'
    statement and ``SELECT 1`` on a bare connection), interleaved while ``WRITERS``
    processes record durably as fast as they can: rounds of 50 reads of each, the order
    rotating every round, so all run under the same load (``reads_under_load`` times
    them one after the other). Without ``load``, no writers: the ledger's own work per
    read stands out against its statement's on an idle server."""
    import psycopg

    from llm_resilience.ledger._postgres import psycopg_spends

    budget = CostBudget(3, 15, daily_limit=10**9, monthly_limit=10**9)
    windows: list[SpendWindow] = [("day", None), ("month", None)]
    statement, parameters = psycopg_spends(windows, datetime.now(UTC))
    writers = writers_running(url, None) if load else nullcontext()
    with writers, closing(SqlCostLedger(url)) as ledger:
        gate = BudgetGate(budget, ledger)
        with psycopg.connect(**postgres_params(url), autocommit=True) as connection:
            connection.execute("SET TIME ZONE 'UTC'")
            cursor = connection.cursor()  # one kept, as the ledger keeps one
            gate.begin("chat").abandon()  # the ledger's own connection open, kept idle
            # The same statement on the ledger's own connection: one server backend for
            # both, so the difference is the ledger's own work, not where each runs.
            (own,) = ledger._db._postgres_idle  # its one cursor, kept with it
            calls: dict[str, Callable[[], object]] = {
                "default (exact), sync gate": lambda: gate.begin("chat").abandon(),
                OWN_READ_FLOOR: lambda: own.execute(statement, parameters).fetchall(),
                GATE_READ_FLOOR: lambda: cursor.execute(statement, parameters).fetchall(),
                SELECT_ONE_FLOOR: lambda: cursor.execute("SELECT 1").fetchall(),
            }
            samples: dict[str, list[int]] = {name: [] for name in calls}
            names = list(calls)
            for round_ in range(max(1, repeats // 50)):
                shift = round_ % len(names)
                for name in names[shift:] + names[:shift]:
                    samples[name] += timed(calls[name], 50)
    load_average = os.getloadavg()[0]
    return [
        f"| {name} | {p50:.3f} | {p99:.3f} | {len(samples[name])} | {load_average:.1f} |"
        for name, (p50, p99) in ((name, percentiles(samples[name])) for name in names)
    ]


def reads_under_load(url: str, repeats: int) -> list[str]:
    """Markdown rows: the gate (day and month limits) read sync and async by this
    process while ``WRITERS`` processes record as fast as they can, durable per record
    and with write-behind; the readers' ledger default, and with write-behind too; on
    PostgreSQL, then its floor under the same load (`postgres_floors`)."""
    budget = CostBudget(3, 15, daily_limit=10**9, monthly_limit=10**9)
    rows = []
    for behind in (None, WRITE_BEHIND):
        before = stored_rows(url)
        with writers_running(url, behind) as (measure, reports):
            measure.set()
            began = time.perf_counter()
            try:
                for reader_behind in (None, WRITE_BEHIND):
                    ledger = SqlCostLedger(url, write_behind=reader_behind)
                    gate = BudgetGate(budget, ledger)

                    async def gate_call() -> None:
                        await (await gate.abegin("chat")).aabandon()  # noqa: B023

                    try:
                        sync = percentiles(timed(lambda: gate.begin("chat").abandon(), repeats))  # noqa: B023
                        aio = percentiles(atimed(gate_call, repeats))
                    finally:
                        ledger.close()
                    for name, (p50, p99) in (("sync", sync), ("async", aio)):
                        rows.append(
                            (
                                "durable" if behind is None else f"write-behind {behind} s",
                                "default"
                                if reader_behind is None
                                else f"write-behind {reader_behind} s",
                                name,
                                p50,
                                p99,
                            )
                        )
                if url.startswith("postgresql"):
                    writers = "durable" if behind is None else f"write-behind {behind} s"
                    rows += [
                        (writers, reader, name, p50, p99)
                        for reader, name, (p50, p99) in postgres_floors(url, repeats)
                    ]
            finally:
                measure.clear()
                elapsed = time.perf_counter() - began
        rate = sum(written for written, _, _ in reports) / elapsed
        recorded = sum(total for _, total, _ in reports)
        stored = f"{stored_rows(url) - before:,} / {recorded:,}"
        print(
            f"{url.split(':')[0]} writers {'durable' if behind is None else behind}: "
            f"stored / recorded {stored}, ledger.dropped {sum(d for _, _, d in reports)}, "
            f"load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        rows = [(*row[:5], rate, stored) if len(row) == 5 else row for row in rows]
    return [
        f"| {writers} | {WRITERS} | {rate:,.0f} | {stored} | {reader} | {name} | {p50:.3f} "
        f"| {p99:.3f} | {repeats} |"
        for writers, reader, name, p50, p99, rate, stored in rows
    ]


@contextmanager
def loaded_postgres(rows: int, now: datetime) -> Iterator[str | None]:
    """A fresh schema holding ``rows`` entries with their running totals built (the URL),
    or None, said, when PostgreSQL is not reachable."""
    with postgres_schema() as postgres:
        if postgres is None:
            print(f"PostgreSQL not reachable at {POSTGRES_URL}: skipped.")
        else:
            load_postgres(postgres, rows, now)
            SqlCostLedger(postgres).close()  # builds the running totals from the rows
        yield postgres


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100k rows, fewer repeats")
    parser.add_argument("--reads-only", action="store_true", help="skip the writer processes")
    parser.add_argument(
        "--postgres-only", action="store_true", help="no reads under load on SQLite"
    )
    parser.add_argument(
        "--sqlite-under-load",
        action="store_true",
        help="only the gate reads under write load on SQLite (the million-row overload)",
    )
    parser.add_argument(
        "--postgres-under-load",
        action="store_true",
        help="only the gate reads under write load on PostgreSQL, with their floor",
    )
    parser.add_argument(
        "--postgres-interleaved",
        action="store_true",
        help="only the default sync gate and its floors, interleaved under durable writers",
    )
    parser.add_argument(
        "--idle",
        action="store_true",
        help="with --postgres-interleaved: no writers (the ledger's own work per read)",
    )
    args = parser.parse_args(argv)
    logging.getLogger("llm_resilience").setLevel(logging.ERROR)
    rows = 100_000 if args.quick else 1_000_000
    repeats, scans = (300, 5) if args.quick else (3000, 20)
    writes = 300 if args.quick else 2000
    now = datetime.now(UTC)

    print(
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} CPUs, {platform.platform()}\n",
        flush=True,
    )
    reads = [
        "| database | rows in month | read | p50 ms | p99 ms | calls | scan p50 / this p50 |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    throughput = [
        "| database | mode | writer processes | records/s |",
        "| --- | --- | ---: | ---: |",
    ]
    loaded = [
        "| database | writers' mode | writer processes | records/s meanwhile "
        "| stored / recorded (after close) | reader's ledger | gate | p50 ms | p99 ms | calls |",
        "| --- | --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: |",
    ]
    modes = ((None, "durable per record"), (WRITE_BEHIND, f"write-behind {WRITE_BEHIND} s"))
    if args.sqlite_under_load:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "spend.db"
            url = f"sqlite:///{path}"
            load_sqlite(path, rows, now)
            SqlCostLedger(url).close()  # builds the running totals from the rows
            loaded += [f"| SQLite {row}" for row in reads_under_load(url, repeats)]
        print(f"\n### Gate reads under write load ({WRITERS} processes, {rows:,} rows)\n")
        print("\n".join(loaded))
        return 0
    if args.postgres_interleaved:
        with loaded_postgres(rows, now) as postgres:
            if postgres is None:
                return 1
            interleaved = interleaved_under_load(postgres, repeats, load=not args.idle)
        under = "no writers" if args.idle else f"under {WRITERS} durable writers"
        print(
            f"\n### PostgreSQL: the sync gate and its floors, interleaved, {under} "
            f"({rows:,} rows)\n"
        )
        print("| reader | p50 ms | p99 ms | calls | load average |")
        print("| --- | ---: | ---: | ---: | ---: |")
        print("\n".join(interleaved))
        return 0
    if args.postgres_under_load:
        with loaded_postgres(rows, now) as postgres:
            if postgres is None:
                return 1
            loaded += [f"| PostgreSQL {row}" for row in reads_under_load(postgres, repeats)]
        print(
            f"\n### Gate reads under write load ({WRITERS} processes, {rows:,} rows; "
            f"goal p99 under {GOAL_LOADED_P99_MS} ms)\n"
        )
        print("\n".join(loaded))
        return 0
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'spend.db'}"
        reads += gate_reads("SQLite", url, rows, repeats, scans, now)
        if not args.reads_only and not args.postgres_only:
            loaded += [f"| SQLite {row}" for row in reads_under_load(url, repeats)]
        for behind, mode in () if args.reads_only else modes:
            for processes in (WRITERS, 1):
                url = f"sqlite:///{Path(folder) / f'writers-{processes}-{behind}.db'}"
                rate = writes_per_second(url, processes, writes, behind)
                throughput.append(f"| SQLite | {mode} | {processes} | {rate:,.0f} |")
    with postgres_schema() as postgres:
        if postgres is None:
            print(f"PostgreSQL not reachable at {POSTGRES_URL}: skipped.\n")
        else:
            reads += gate_reads("PostgreSQL", postgres, rows, repeats, scans, now)
            if not args.reads_only:
                loaded += [f"| PostgreSQL {row}" for row in reads_under_load(postgres, repeats)]
            for processes in () if args.reads_only else (WRITERS, 1):
                rate = writes_per_second(postgres, processes, writes, None, floor=True)
                throughput.append(
                    f"| PostgreSQL | floor: the same one-statement record on psycopg, "
                    f"no ledger | {processes} | {rate:,.0f} |"
                )
            for behind, mode in () if args.reads_only else modes:
                for processes in (WRITERS, 1):
                    rate = writes_per_second(postgres, processes, writes, behind)
                    throughput.append(f"| PostgreSQL | {mode} | {processes} | {rate:,.0f} |")

    print("\n### Gate reads\n")
    print("\n".join(reads))
    print(
        f"\nGoal: p50 of our reads under {GOAL_P50_MS} ms. Our reads are exact Decimal "
        "(running totals plus live holds); the SQLite scan sums text as floats.\n"
    )
    print(
        f"### Writes ({writes:,} fresh entries per process; durable: each its own "
        f"transaction, one statement; write-behind: batches, every {WRITE_BEHIND} s "
        "or 100 entries; timed to the last close())\n"
    )
    print("\n".join(throughput))
    if len(loaded) > 2:
        print(
            f"\n### Gate reads under write load ({WRITERS} processes recording as fast as "
            f"they can; goal p99 under {GOAL_LOADED_P99_MS} ms)\n"
        )
        print("\n".join(loaded))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
