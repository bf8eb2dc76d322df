"""``SqlCostLedger(write_behind=...)``: records queued and committed by the ledger's writer
thread, on a real SQLite file (and the real PostgreSQL for the cross-process case).

What it must keep: this process's gates count a queued entry at once; other processes see
it within the interval; a caller writing faster than the database takes never loses an
entry; ``close`` and a normal exit store everything; a database that stops answering
keeps the queue (counted by reads) until it answers again; no writer thread outlives
``close``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from llm_resilience.ledger import LedgerEntry, SqlCostLedger
from llm_resilience.testing import FaultProxy

#: The write-behind interval of the ledgers under test, in seconds.
INTERVAL = 0.05
#: How long a test waits for something the interval promises: far beyond it, so that a
#: loaded machine cannot fail these tests (they check behaviour, not speed).
PATIENCE = 10.0


def entry(cost: str = "0.25", *, scope: str | None = None) -> LedgerEntry:
    return LedgerEntry(
        datetime.now(UTC), "chat", input_tokens=10, output_tokens=5, cost=Decimal(cost), scope=scope
    )


def writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("llm-resilience-ledger-writer")]


def eventually(check: Callable[[], bool]) -> float:
    """Seconds until ``check()`` holds (fails the test after PATIENCE)."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > PATIENCE:
            pytest.fail(f"not true within {PATIENCE} s")
        time.sleep(0.005)
    return time.monotonic() - started


def stored_costs(path: Path) -> list[str]:
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT cost FROM cost_ledger ORDER BY id").fetchall()
    connection.close()
    return [cost for (cost,) in rows]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "spend.db"


@contextmanager
def ledgers(url: str, **options: object) -> Iterator[tuple[SqlCostLedger, SqlCostLedger]]:
    """A write-behind ledger and a plain one (another process's view) on one database."""
    behind = SqlCostLedger(url, write_behind=INTERVAL, **options)  # type: ignore[arg-type]
    other = SqlCostLedger(url)
    try:
        yield behind, other
    finally:
        behind.close()
        other.close()


# -- the option ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "write_behind must be greater than 0 seconds"),
        (-1, "write_behind must be greater than 0 seconds"),
        (61, "write_behind must be None or at most 60 seconds"),
        (timedelta(minutes=2), "write_behind must be None or at most 60 seconds"),
        ("50ms", "write_behind must be None, a number of seconds|write_behind must be a number"),
        (True, "write_behind must be"),
    ],
)
def test_a_bad_write_behind_is_refused_at_construction_naming_the_option(
    path: Path, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SqlCostLedger(f"sqlite:///{path}", write_behind=value)  # type: ignore[arg-type]


def test_write_behind_is_off_by_default_and_kept_as_a_timedelta(path: Path) -> None:
    plain = SqlCostLedger(f"sqlite:///{path}")
    behind = SqlCostLedger(f"sqlite:///{path}", write_behind=0.25)
    try:
        assert plain.write_behind is None
        assert behind.write_behind == timedelta(seconds=0.25)
    finally:
        plain.close()
        behind.close()


# -- queued, counted, committed -----------------------------------------------------------


def test_a_queued_record_counts_here_at_once_and_reaches_other_processes_within_the_interval(
    path: Path,
) -> None:
    with ledgers(f"sqlite:///{path}") as (behind, other):
        behind.spends([("day", None), ("month", None)])  # a cached read, before the record
        behind.record(entry("0.25"))
        assert behind.spends([("day", None), ("month", None)]) == (Decimal("0.25"),) * 2
        assert behind.spend("day") == Decimal("0.25")
        waited = eventually(lambda: other.spend("day") == Decimal("0.25"))
        assert waited < PATIENCE
        assert behind.pending == 0
        # Stored once: the writer's commit and the queue are never both counted for long.
        assert behind.spend("day") == Decimal("0.25")
        assert stored_costs(path) == ["0.25"]


async def test_an_async_record_is_queued_without_a_worker_thread_and_counted_at_once(
    path: Path,
) -> None:
    with ledgers(f"sqlite:///{path}") as (behind, other):
        await behind.aspends([("day", None), ("month", None)])
        before = threading.active_count()
        await behind.arecord(entry("0.5"))
        assert await behind.aspends([("day", None), ("month", None)]) == (Decimal("0.5"),) * 2
        assert await behind.aspend("day") == Decimal("0.5")
        # The writer thread is the only thread the record may have started.
        assert threading.active_count() - before <= 1
        await asyncio.to_thread(eventually, lambda: other.spend("day") == Decimal("0.5"))


def test_another_process_spend_reaches_this_gate_within_the_interval(path: Path) -> None:
    with ledgers(f"sqlite:///{path}") as (behind, other):
        assert behind.spend("day") == 0
        other.record(entry("1.5"))
        eventually(lambda: behind.spend("day") == Decimal("1.5"))


def test_a_hold_taken_here_counts_in_this_process_gate_at_once(path: Path) -> None:
    with ledgers(f"sqlite:///{path}") as (behind, _):
        assert behind.spend("day") == 0  # cached: no hold yet
        hold = behind.reserve(Decimal("2"), limits={("day", None): Decimal(10)}, scope=None)
        assert behind.spend("day") == Decimal("2")
        behind.settle(hold, entry("0.75"))
        assert behind.spend("day") == Decimal("0.75")


def test_writing_faster_than_the_database_takes_loses_no_entry(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A queue of 200 at most: the caller must store the queue itself long before it fills.
    with ledgers(f"sqlite:///{path}", max_pending=200) as (behind, other):
        with caplog.at_level(logging.WARNING):
            for _ in range(3000):
                behind.record(entry("0.01"))
        assert behind.dropped == 0
        assert not [r for r in caplog.records if "dropped" in r.getMessage()]
        # While the writer's last batches land a read may count one twice, never miss one.
        assert behind.spend("day") >= Decimal("30.00")
        eventually(lambda: behind.pending == 0)
        assert behind.spend("day") == Decimal("30.00")
    assert len(stored_costs(path)) == 3000
    assert other.spend("day") == Decimal("30.00")


def test_a_batch_stores_an_entry_once_when_repeated_or_already_stored(path: Path) -> None:
    other = SqlCostLedger(f"sqlite:///{path}")
    behind = SqlCostLedger(f"sqlite:///{path}", write_behind=60)  # one batch, at close
    stored_before, repeated, single = entry("1"), entry("0.1"), entry("0.01")
    other.record(stored_before)
    for each in (stored_before, repeated, repeated, single):
        behind.record(each)
    behind.close()
    assert sorted(stored_costs(path)) == ["0.01", "0.1", "1"]
    assert other.spends([("day", None), ("month", None)]) == (Decimal("1.11"),) * 2
    other.close()


@pytest.mark.postgres
def test_on_postgres_a_batch_stores_an_entry_once_and_adds_it_to_each_total_once(
    postgres_schema_url: str,
) -> None:
    other = SqlCostLedger(postgres_schema_url)
    behind = SqlCostLedger(postgres_schema_url, write_behind=60)  # one batch, at close
    stored_before, repeated = entry("1", scope="a"), entry("0.1", scope="b")
    unnamed = LedgerEntry(datetime.now(UTC), "chat", cost=Decimal("0.001"), entry_id=None)
    other.record(stored_before)
    for each in (stored_before, repeated, repeated, entry("0.01", scope="a"), unnamed, unnamed):
        behind.record(each)
    behind.close()
    try:
        costs = sorted(e.cost for e in other.entries())
        assert costs == [Decimal("0.001"), Decimal("0.001"), Decimal("0.01"), Decimal("0.1"), 1]
        windows = [("day", None), ("month", None), ("day", "a"), ("month", "b")]
        assert other.spends(windows) == (
            Decimal("1.112"),
            Decimal("1.112"),
            Decimal("1.01"),
            Decimal("0.1"),
        )
    finally:
        other.close()


def test_close_stores_the_queue_and_ends_the_writer_thread(path: Path) -> None:
    behind = SqlCostLedger(f"sqlite:///{path}", write_behind=60)  # never on its own
    for _ in range(5):
        behind.record(entry("0.1"))
    assert len(writer_threads()) == 1
    assert stored_costs(path) == []
    behind.close()
    assert stored_costs(path) == ["0.1"] * 5
    assert behind.pending == 0
    assert writer_threads() == []


def test_a_closed_ledger_used_again_starts_a_new_writer_and_stores_again(path: Path) -> None:
    behind = SqlCostLedger(f"sqlite:///{path}", write_behind=INTERVAL)
    behind.record(entry("0.1"))
    behind.close()
    behind.record(entry("0.2"))
    eventually(lambda: stored_costs(path) == ["0.1", "0.2"])
    behind.close()
    assert writer_threads() == []


def test_no_writer_thread_runs_before_the_first_record(path: Path) -> None:
    behind = SqlCostLedger(f"sqlite:///{path}", write_behind=INTERVAL)
    try:
        behind.spend("day")
        assert writer_threads() == []
    finally:
        behind.close()


_AT_EXIT = """
import sys
from datetime import UTC, datetime
from decimal import Decimal
from llm_resilience.ledger import LedgerEntry, SqlCostLedger

ledger = SqlCostLedger(sys.argv[1], write_behind=60)
for _ in range(3):
    ledger.record(LedgerEntry(datetime.now(UTC), "chat", 10, 5, Decimal("0.25")))
# No close(): a normal exit must still store the queue.
"""


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_a_process_exiting_without_close_stores_its_queue(
    database: str, path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{path}"
        if database == "sqlite"
        else request.getfixturevalue("postgres_schema_url")
    )
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_AT_EXIT), url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    reader = SqlCostLedger(url)
    try:
        assert [entry.cost for entry in reader.entries()] == [Decimal("0.25")] * 3
        assert reader.spend("day") == Decimal("0.75")  # and the totals: once each
    finally:
        reader.close()


# Records an entry every millisecond, forever; prints (unbuffered, so a kill -9 loses
# none of it) when each record was made and when each flush of the writer started.
_UNTIL_KILLED = """
import logging, os, re, sys, time
from datetime import UTC, datetime
from decimal import Decimal
from llm_resilience.ledger import LedgerEntry, SqlCostLedger

class Flushes(logging.Handler):
    def emit(self, record):
        found = re.search(r"stored \\d+ queued writes in ([0-9.]+) ms", record.getMessage())
        if found:
            os.write(1, f"flush {record.created - float(found[1]) / 1000:.6f} {found[1]}\\n".encode())

log = logging.getLogger("llm_resilience.ledger._sql")
log.setLevel(logging.DEBUG)
log.addHandler(Flushes())
log.propagate = False
ledger = SqlCostLedger(sys.argv[1], write_behind=float(sys.argv[2]))
process = int(sys.argv[3])  # the first hex digit of its ids: processes may share a database
os.write(1, b"ready\\n")
sequence = 0
while True:
    sequence += 1
    made = time.time()
    ledger.record(
        LedgerEntry(
            datetime.now(UTC), "chat", 1, 1, Decimal("0.01"), entry_id=f"{process:x}{sequence:031x}"
        )
    )
    os.write(1, f"record {sequence} {made:.6f}\\n".encode())
    time.sleep(0.001)
"""


def run_released(
    script: str, argvs: list[list[str]]
) -> tuple[list[subprocess.Popen[str]], list[tuple[str, str]]]:
    """Run ``script`` once per argument list, each in its own Python process; release them
    all at once (each prints "ready", then waits for "go"), and return the processes and
    their ``(stdout, stderr)`` once all have ended (any still running at a failure is
    killed)."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    try:
        for process in processes:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready"
        for process in processes:  # released together
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        return processes, [process.communicate(timeout=60) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()


def records_in_an_outage_drop_the_oldest_at_once(
    behind: SqlCostLedger, caplog: pytest.LogCaptureFixture
) -> None:
    """Fill ``behind``'s queue (100) while its database is away, then 200 records more:
    each returns at once, the oldest 200 are dropped and counted, one WARNING says so."""
    with caplog.at_level(logging.WARNING):
        for _ in range(100):
            behind.record(entry("0.01"))
        eventually(lambda: any("could not" in r.message for r in caplog.records))
        newest = [entry("0.02") for _ in range(100)]
        for each in [entry("0.03") for _ in range(100)] + newest:
            started = time.monotonic()
            behind.record(each)
            assert time.monotonic() - started < FAST, "record waited on the database"
    assert (behind.pending, behind.dropped) == (100, 200)
    assert len([r for r in caplog.records if "dropped" in r.message]) == 1


class Heartbeat:
    """How late a 10 ms sleep wakes on the running event loop, beat after beat, from
    creation until `stop`: a loop that a blocking call stalls wakes late."""

    def __init__(self) -> None:
        self._beats: list[float] = []
        self._stopping = asyncio.Event()
        self._task = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            await asyncio.sleep(0.01)
            self._beats.append(time.monotonic() - started - 0.01)

    async def stop(self) -> list[float]:
        """Stop beating; each beat's lateness, in seconds."""
        self._stopping.set()
        await self._task
        return self._beats


def stored_ids(url: str) -> list[str]:
    """Every ``entry_id`` stored in the ledger at ``url``, read without the ledger."""
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return [i for (i,) in connection.exec_driver_sql("SELECT entry_id FROM cost_ledger")]
    finally:
        engine.dispose()


#: What the writer thread may start late on a loaded machine, beyond its cadence.
LATE = 0.05


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_a_kill_9_loses_at_most_the_last_interval_and_one_flush(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # The promise (docs/cost-budgeting.md): a crash loses at most the entries recorded in
    # the last interval plus one flush's duration. Four processes, each killed at its own
    # moment of the writer's cadence: each with its own SQLite file, or all four on one
    # PostgreSQL schema (their ids tell them apart).
    if database == "sqlite":
        urls = [f"sqlite:///{tmp_path / f'spend-{index}.db'}" for index in range(4)]
    else:
        urls = [request.getfixturevalue("postgres_schema_url")] * 4
    children = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_UNTIL_KILLED), url, str(INTERVAL), str(index)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for index, url in enumerate(urls)
    ]
    kills = []
    # What each child printed before its kill, read while waiting for its first flush.
    early: list[list[str]] = [[] for _ in children]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        # Killed once each has stored at least once (opening a PostgreSQL connection can
        # take longer than a fixed pause on a loaded machine), then at its own moment.
        deadline = time.monotonic() + 30
        for child, lines in zip(children, early, strict=True):
            assert child.stdout is not None
            while not (lines and lines[-1].startswith("flush")):
                assert time.monotonic() < deadline, "a writer never stored its queue"
                lines.append(child.stdout.readline())
        time.sleep(0.1)
        for child in children:
            time.sleep(random.uniform(0.01, 0.06))
            kills.append(time.time())
            os.kill(child.pid, signal.SIGKILL)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    losses = []
    for index, (child, url, killed) in enumerate(zip(children, urls, kills, strict=True)):
        assert child.stdout is not None
        printed = "".join(early[index]) + child.communicate(timeout=30)[0]
        lines = [line.split() for line in printed.splitlines()]
        made = {int(line[1]): float(line[2]) for line in lines if line[0] == "record"}
        flushes = [(float(line[1]), float(line[2]) / 1000) for line in lines if line[0] == "flush"]
        stored = {int(each[1:], 16) for each in stored_ids(url) if int(each[0], 16) == index}
        lost = sorted(set(made) - stored)
        losses += lost
        assert flushes
        assert stored == set(range(1, len(stored) + 1)), "stored in order: the oldest first"
        # Lost: only entries made after the last flush that ended before the kill began...
        last_start = max(start for start, took in flushes if start + took < killed)
        assert all(made[each] > last_start - 0.001 for each in lost)
        # ...which began at most an interval (and a late thread) before the next one.
        longest = max(took for _, took in flushes)
        assert all(killed - made[each] < INTERVAL + longest + LATE for each in lost), (
            max(killed - made[each] for each in lost),
            longest,
        )
    assert losses, "every kill came just after a flush: nothing was at risk"


def test_a_locked_database_keeps_the_queue_counted_and_stores_it_once_it_answers(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with ledgers(f"sqlite:///{path}", operation_timeout=0.2) as (behind, _):
        behind.spend("day")
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            with caplog.at_level(logging.WARNING):
                for _ in range(4):
                    behind.record(entry("0.25"))
                time.sleep(1.0)  # several intervals, each a failed store
            assert behind.pending == 4
            assert behind.spends([("day", None)], now=None) == (Decimal("1.00"),)
            warnings = [r for r in caplog.records if "could not store queued writes" in r.message]
            assert len(warnings) == 1, "one WARNING per outage, not one per interval"
        finally:
            holder.execute("COMMIT")
            holder.close()
        eventually(lambda: behind.pending == 0)
        assert stored_costs(path) == ["0.25"] * 4
        assert behind.spend("day") == Decimal("1.00")


#: operation_timeout of the ledgers facing an outage below: what a record waited, for
#: every record from the 1,000th queued entry on, before write-behind never waited.
WAIT = 1.0
#: How long one record or arecord may take while the database is away: a lock and an
#: append (a few µs; a quarter of WAIT, so that a loaded machine cannot fail the test).
FAST = WAIT / 4
#: How much later than its 10 ms a heartbeat's sleep may end during ``arecord``.
STALL = WAIT / 5


async def record_through_an_outage(ledger: SqlCostLedger, count: int) -> None:
    """``count`` records then ``count`` arecords, each timed, with a 10 ms heartbeat on
    the event loop; fails at the first slow call or stalled beat.

    The collector is off meanwhile: late in a full suite a process holds enough objects
    for one full collection to take over a second (seen once as a 1.3 s ``arecord``), and
    that is not the database holding the call."""
    gc.disable()
    try:
        await _timed_records(ledger, count)
    finally:
        gc.enable()


async def _timed_records(ledger: SqlCostLedger, count: int) -> None:
    for _ in range(count):
        started = time.monotonic()
        ledger.record(entry("0.01"))
        assert time.monotonic() - started < FAST, "record waited on the database"
    heartbeat = Heartbeat()
    await asyncio.sleep(0.02)
    for index in range(count):
        started = time.monotonic()
        await ledger.arecord(entry("0.01"))
        assert time.monotonic() - started < FAST, "arecord waited on the database"
        if index % 50 == 0:
            await asyncio.sleep(0.001)  # what a caller between two model calls does
    beats = await heartbeat.stop()
    assert beats
    assert max(beats) < STALL, f"the event loop stalled {max(beats):.3f} s"


async def test_a_locked_database_never_holds_a_record_or_the_event_loop(path: Path) -> None:
    # 2,000 records and 2,000 arecords while another connection holds the write lock:
    # each returns at once, the loop's heartbeat never stalls, and once the lock is
    # released every entry is stored.
    with ledgers(f"sqlite:///{path}", operation_timeout=WAIT) as (behind, other):
        behind.spend("day")
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            await record_through_an_outage(behind, 2000)
            assert behind.pending == 4000
            assert behind.spend("day") == Decimal("40.00")  # counted while waiting
        finally:
            holder.execute("COMMIT")
            holder.close()
        await asyncio.to_thread(eventually, lambda: behind.pending == 0)
        assert behind.dropped == 0
        assert len(stored_costs(path)) == 4000
        assert other.spend("day") == Decimal("40.00")


@pytest.mark.postgres
async def test_a_silent_postgres_never_holds_a_record_or_the_event_loop(
    postgres_schema_url: str,
) -> None:
    from sqlalchemy.engine import make_url

    parsed = make_url(postgres_schema_url)
    with FaultProxy((parsed.host or "127.0.0.1", parsed.port or 5432)) as proxy:
        through = parsed.set(port=proxy.port).render_as_string(hide_password=False)
        behind = SqlCostLedger(through, write_behind=INTERVAL, operation_timeout=WAIT)
        other = SqlCostLedger(postgres_schema_url)
        try:
            behind.spend("day")
            proxy.mode = "silent"
            await record_through_an_outage(behind, 2000)
            assert behind.pending == 4000
            proxy.mode = "forward"
            await asyncio.to_thread(eventually, lambda: behind.pending == 0)
            assert behind.dropped == 0
            assert other.spend("day") == Decimal("40.00")
            assert len(other.entries()) == 4000
        finally:
            behind.close()
            other.close()


def test_a_full_queue_in_an_outage_drops_its_oldest_at_once_counted_and_warned_once(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # max_pending bounds the memory an outage takes, with write-behind as without: once
    # the writer has found the database away, a record into a full queue does not wait.
    with ledgers(f"sqlite:///{path}", operation_timeout=WAIT, max_pending=100) as (behind, _):
        behind.spend("day")
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            records_in_an_outage_drop_the_oldest_at_once(behind, caplog)
        finally:
            holder.execute("COMMIT")
            holder.close()
        eventually(lambda: behind.pending == 0)
        assert stored_costs(path) == ["0.02"] * 100


# -- a database busy with other writers: backpressure, never a dropped entry ------------

# One writer process: opens a write-behind ledger with a small queue and a short bound
# (so its writer's wait for SQLite's write lock runs out within seconds under contention),
# says it is ready, waits for "go" on stdin, records fresh entries as fast as it can for
# the given seconds, closes, and prints how many it made, dropped, and left pending. Its
# log (WARNING and up) goes to stderr.
_CONTENDING = """
import logging, sys, time
from datetime import UTC, datetime
from decimal import Decimal
from llm_resilience.ledger import LedgerEntry, SqlCostLedger

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
url, seconds = sys.argv[1], float(sys.argv[2])
ledger = SqlCostLedger(url, write_behind=0.05, max_pending=100, operation_timeout=0.2)
ledger.spend("day")
print("ready", flush=True)
sys.stdin.readline()
made = 0
until = time.monotonic() + seconds
while time.monotonic() < until:
    ledger.record(LedgerEntry(datetime.now(UTC), "chat", 1, 1, Decimal("0.01")))
    made += 1
ledger.close()
print(made, ledger.dropped, ledger.pending, flush=True)
"""


def test_write_behind_processes_contending_for_one_sqlite_file_lose_no_entry(
    path: Path,
) -> None:
    # Six processes record as fast as they can into one SQLite file, each through a
    # write-behind ledger whose queue holds 100 entries and whose bound is 0.2 s: their
    # writers' waits for the write lock run out while the others commit. That is a busy
    # database, not one that is away: records wait for room instead of dropping the
    # oldest, and every entry made is stored once every writer has closed.
    processes, seconds = 6, 2.0
    url = f"sqlite:///{path}"
    SqlCostLedger(url).close()  # the tables, created once
    writers, outputs = run_released(_CONTENDING, [[url, str(seconds)]] * processes)
    logs = "".join(log for _, log in outputs)
    assert [writer.returncode for writer in writers] == [0] * processes, logs
    reports = [tuple(int(n) for n in out.split()) for out, _ in outputs]
    made = sum(each for each, _, _ in reports)
    assert [(dropped, pending) for _, dropped, pending in reports] == [(0, 0)] * processes, logs
    assert "dropped" not in logs, logs
    assert "never stored" not in logs, logs
    assert "busy with other writers" in logs, "no writer waited out its bound: no contention"
    assert len(stored_costs(path)) == made
    reader = SqlCostLedger(url)
    try:
        assert reader.spend("day") == Decimal("0.01") * made  # the totals: once each
    finally:
        reader.close()


@contextmanager
def hogging_the_write_lock(path: Path) -> Iterator[None]:
    """Another connection takes SQLite's write lock, commits a row, and takes it again
    at once, over and over, until the block ends: the lock changes hands, yet a writer
    waiting for it (SQLite's busy handler sleeps between its tries) seldom gets it."""
    stop = threading.Event()

    def hog() -> None:
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        connection.execute("CREATE TABLE IF NOT EXISTS hog (x INTEGER)")
        while not stop.is_set():
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("INSERT INTO hog VALUES (1)")
            time.sleep(0.003)
            connection.execute("COMMIT")
        connection.close()

    hogging = threading.Thread(target=hog, daemon=True)
    hogging.start()
    try:
        yield
    finally:
        stop.set()
        hogging.join(PATIENCE)


async def test_an_async_record_into_the_full_queue_of_a_busy_database_waits_off_the_event_loop(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Another connection keeps committing, so the writer's waits for the write lock run
    # out (0.3 s) while the lock changes hands: a busy database, not an outage. A full
    # queue then makes arecord wait for room, in a worker thread: the event loop's
    # heartbeat never stalls, nothing is dropped, and an arecord cancelled while it waits
    # still queues its entry (the call it accounts for happened), stored once.
    with ledgers(f"sqlite:///{path}", operation_timeout=0.3, max_pending=20) as (behind, _):
        behind.spend("day")
        with caplog.at_level(logging.WARNING), hogging_the_write_lock(path):
            made = 0

            def busy() -> bool:  # records until the writer says the database is busy
                nonlocal made
                if any("busy with other writers" in r.message for r in caplog.records):
                    return True
                behind.record(entry("0.01"))
                made += 1
                return False

            await asyncio.to_thread(eventually, busy)
            heartbeat = Heartbeat()
            # Records until one waits for room (the writer may just have made some).
            took: list[float] = []
            while not took or max(took) < 0.1:
                assert len(took) < 2_000, f"no arecord waited for room: {max(took):.3f} s"
                started = time.monotonic()
                await behind.arecord(entry("0.01"))
                took.append(time.monotonic() - started)
            # Cancelled while it waits for room: the first arecord that waits past 10 ms
            # (the writer may have just made room for the ones before it).
            waited = 0
            for _ in range(200):
                try:
                    await asyncio.wait_for(behind.arecord(entry("0.01")), 0.01)
                except TimeoutError:
                    break
                waited += 1
            else:
                pytest.fail("no arecord waited for room: the queue never filled")
            beats = await heartbeat.stop()
        assert max(beats) < STALL, f"the event loop stalled {max(beats):.3f} s"
        await asyncio.to_thread(eventually, lambda: behind.pending == 0)
        assert behind.dropped == 0
        assert not [r for r in caplog.records if "dropped" in r.message]
        recorded = made + len(took) + waited + 1  # the one cancelled too
        assert len(stored_costs(path)) == recorded
        assert behind.spend("day") == Decimal("0.01") * recorded


@pytest.mark.postgres
def test_an_unreachable_postgres_drops_the_oldest_at_once_counted_and_warned_once(
    postgres_schema_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A database that is away (every connection reset) is an outage, not contention: a
    # full queue drops its oldest entry at once, counted and warned once, and no record
    # waits on the database.
    from sqlalchemy.engine import make_url

    parsed = make_url(postgres_schema_url)
    with FaultProxy((parsed.host or "127.0.0.1", parsed.port or 5432)) as proxy:
        through = parsed.set(port=proxy.port).render_as_string(hide_password=False)
        behind = SqlCostLedger(
            through, write_behind=INTERVAL, operation_timeout=WAIT, max_pending=100
        )
        other = SqlCostLedger(postgres_schema_url)
        try:
            behind.spend("day")
            proxy.mode = "reset"
            records_in_an_outage_drop_the_oldest_at_once(behind, caplog)
            assert not [r for r in caplog.records if "busy" in r.message]
            proxy.mode = "forward"
            eventually(lambda: behind.pending == 0)
            assert [e.cost for e in other.entries()] == [Decimal("0.02")] * 100
        finally:
            behind.close()
            other.close()


@pytest.mark.postgres
def test_on_postgres_a_queued_record_reaches_another_ledger_within_the_interval(
    postgres_schema_url: str,
) -> None:
    with ledgers(postgres_schema_url) as (behind, other):
        behind.record(entry("0.25", scope="team-a"))
        assert behind.spend("day", scope="team-a") == Decimal("0.25")
        eventually(lambda: other.spend("day", scope="team-a") == Decimal("0.25"))
        eventually(lambda: behind.pending == 0)
        assert behind.spend("month") == Decimal("0.25")


@pytest.mark.parametrize(
    ("windows", "error"),
    [
        ("day", TypeError),
        ([["day", None]], TypeError),
        ([("week", None)], ValueError),
        ([("day", "")], ValueError),
    ],
)
def test_a_gate_read_with_bad_windows_is_refused_every_time_not_remembered(
    path: Path, windows: object, error: type[Exception]
) -> None:
    behind = SqlCostLedger(f"sqlite:///{path}", write_behind=INTERVAL)
    try:
        for _ in range(2):
            with pytest.raises(error):
                behind.spends(windows)  # type: ignore[arg-type]
        assert behind.spends([("day", None)]) == (Decimal(0),)
    finally:
        behind.close()


# -- agent runs and threads ---------------------------------------------------------------


def run_entry(cost: str, run: str, thread: str | None = None) -> LedgerEntry:
    return LedgerEntry(datetime.now(UTC), "chat", cost=Decimal(cost), run_id=run, thread_id=thread)


def test_a_runs_queued_entries_count_in_its_run_spend_at_once(path: Path) -> None:
    other = SqlCostLedger(f"sqlite:///{path}")
    behind = SqlCostLedger(f"sqlite:///{path}", write_behind=60)  # nothing stored till close
    try:
        other.record(run_entry("0.5", "run-1", "t-1"))
        behind.record(run_entry("0.25", "run-1", "t-1"))
        behind.record(run_entry("0.125", "run-2", "t-1"))
        assert behind.pending == 2
        assert behind.run_spend(run="run-1") == Decimal("0.75")  # stored + queued
        assert behind.run_spend(thread="t-1") == Decimal("0.875")
        assert behind.pending == 2  # the read left storing the queue to the writer
        assert other.run_spend(run="run-1") == Decimal("0.5")  # not stored yet
        behind.close()
        assert other.run_spend(run="run-1") == behind.run_spend(run="run-1") == Decimal("0.75")
        assert [e.run_id for e in other.entries(thread="t-1")] == ["run-1", "run-1", "run-2"]
    finally:
        behind.close()
        other.close()


async def test_a_runs_queued_entries_count_in_its_async_run_spend_at_once(path: Path) -> None:
    behind = SqlCostLedger(f"sqlite:///{path}", write_behind=60)
    try:
        await behind.arecord(run_entry("0.3", "run-1"))
        await behind.arecord(run_entry("0.1", "run-1"))
        assert await behind.arun_spend(run="run-1") == Decimal("0.4")
        assert behind.pending == 2
    finally:
        await behind.aclose()
    reopened = SqlCostLedger(f"sqlite:///{path}")
    assert await reopened.arun_spend(run="run-1") == Decimal("0.4")
    reopened.close()
