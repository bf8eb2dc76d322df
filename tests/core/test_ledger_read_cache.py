"""The SQLite ledger's kept gate reads (``ledger/_readcache.py``): a read answered
without the totals query must still be exactly what the database holds, whoever wrote.

Every test here uses a real SQLite file; the second process is a real ``python``
process opening its own ``SqlCostLedger`` on the same file.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from llm_resilience.errors import BudgetExceededError
from llm_resilience.ledger import LedgerEntry, SqlCostLedger

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
WINDOWS = [("day", None), ("month", None), ("day", "a"), ("month", "a")]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "spend.db"


@pytest.fixture
def ledger(path: Path) -> Iterator[SqlCostLedger]:
    opened = SqlCostLedger(f"sqlite:///{path}")
    yield opened
    opened.close()


def entry(cost: str, *, at: datetime = NOW, scope: str | None = None) -> LedgerEntry:
    return LedgerEntry(
        at, "chat", input_tokens=10, output_tokens=5, cost=Decimal(cost), scope=scope
    )


def in_another_process(path: Path, body: str) -> None:
    """Run ``body`` in a new Python process with ``ledger`` open on ``path``."""
    script = (
        textwrap.dedent(
            f"""
        from datetime import UTC, datetime, timedelta
        from decimal import Decimal
        from llm_resilience.ledger import LedgerEntry, SqlCostLedger

        NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
        ledger = SqlCostLedger("sqlite:///{path}")
        """
        )
        + textwrap.dedent(body)
        + "\nledger.close()\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def test_a_record_by_another_process_is_seen_by_the_kept_read_on_its_next_read(
    ledger: SqlCostLedger, path: Path
) -> None:
    ledger.record(entry("0.5"))
    assert ledger.spends(WINDOWS, now=NOW) == (Decimal("0.5"), Decimal("0.5"), 0, 0)
    assert ledger.spend("day", now=NOW) == Decimal("0.5")  # both kept now

    in_another_process(
        path, 'ledger.record(LedgerEntry(NOW, "chat", 1, 1, Decimal("0.25"), scope="a"))'
    )

    assert ledger.spends(WINDOWS, now=NOW) == (
        Decimal("0.75"),
        Decimal("0.75"),
        Decimal("0.25"),
        Decimal("0.25"),
    )
    assert ledger.spend("day", now=NOW) == Decimal("0.75")


def test_a_hold_taken_by_another_process_is_seen_and_refuses_this_process_strict_hold(
    ledger: SqlCostLedger, path: Path
) -> None:
    limits = {("day", None): Decimal("1")}
    assert ledger.spend("day", now=NOW) == 0  # kept: nothing spent
    in_another_process(
        path,
        'ledger.reserve(Decimal("0.75"), limits={("day", None): Decimal("1")}, scope=None, now=NOW)',
    )

    assert ledger.spend("day", now=NOW) == Decimal("0.75")
    with pytest.raises(BudgetExceededError):
        ledger.reserve(Decimal("0.5"), limits=limits, scope=None, now=NOW)


def test_a_kept_read_stops_counting_a_hold_once_the_hold_has_expired(path: Path) -> None:
    ledger = SqlCostLedger(f"sqlite:///{path}", reservation_ttl=60)
    try:
        ledger.record(entry("0.1"))
        ledger.reserve(Decimal("0.5"), limits={("day", None): Decimal("9")}, scope=None, now=NOW)
        assert ledger.spend("day", now=NOW) == Decimal("0.6")
        assert ledger.spend("day", now=NOW + timedelta(seconds=59)) == Decimal("0.6")
        # Nothing committed since: only the hold's expiry changes the answer.
        assert ledger.spend("day", now=NOW + timedelta(seconds=60)) == Decimal("0.1")
    finally:
        ledger.close()


def test_a_read_at_an_earlier_instant_counts_a_hold_that_a_later_read_found_expired(
    path: Path,
) -> None:
    ledger = SqlCostLedger(f"sqlite:///{path}", reservation_ttl=60)
    try:
        ledger.reserve(Decimal("0.5"), limits={("day", None): Decimal("9")}, scope=None, now=NOW)
        assert ledger.spend("day", now=NOW + timedelta(seconds=90)) == 0
        assert ledger.spend("day", now=NOW + timedelta(seconds=30)) == Decimal("0.5")
    finally:
        ledger.close()


def test_this_process_records_keep_every_kept_read_exact(ledger: SqlCostLedger, path: Path) -> None:
    # Records of both scopes, of another day and of another month, each followed by a
    # read of every window: each read must match the sums of what was recorded.
    rng = random.Random(3)
    expected = dict.fromkeys(range(len(WINDOWS)), Decimal(0))
    for _ in range(60):
        at = rng.choice([NOW, NOW - timedelta(days=1), NOW - timedelta(days=40)])
        scope = rng.choice([None, "a", "b"])
        cost = Decimal(rng.randrange(1, 10**6)) / 10**7
        ledger.record(entry(str(cost), at=at, scope=scope))
        for slot, (window, each) in enumerate(WINDOWS):
            same = at.date() == NOW.date() if window == "day" else at.month == NOW.month
            if same and (each is None or each == scope):
                expected[slot] += cost
        assert ledger.spends(WINDOWS, now=NOW) == tuple(expected.values())
    reopened = SqlCostLedger(f"sqlite:///{path}")
    try:
        assert reopened.spends(WINDOWS, now=NOW) == tuple(expected.values())
    finally:
        reopened.close()


def test_an_entry_recorded_twice_is_counted_once_by_the_kept_read(
    ledger: SqlCostLedger,
) -> None:
    once = entry("0.3")
    ledger.record(once)
    assert ledger.spend("day", now=NOW) == Decimal("0.3")
    ledger.record(once)  # the same entry_id: stored nothing
    assert ledger.spend("day", now=NOW) == Decimal("0.3")


def test_a_settle_that_releases_a_hold_is_seen_by_the_next_read(ledger: SqlCostLedger) -> None:
    hold = ledger.reserve(Decimal("0.5"), limits={("day", None): Decimal("9")}, scope=None, now=NOW)
    assert ledger.spend("day", now=NOW) == Decimal("0.5")
    ledger.settle(hold, entry("0.2"))
    assert ledger.spend("day", now=NOW) == Decimal("0.2")
    limits = {("day", None): Decimal("9")}
    ledger.settle(ledger.reserve(Decimal("0.1"), limits=limits, scope=None, now=NOW), None)
    assert ledger.spend("day", now=NOW) == Decimal("0.2")


def test_another_ledger_of_this_process_is_seen_like_another_process(path: Path) -> None:
    first, second = SqlCostLedger(f"sqlite:///{path}"), SqlCostLedger(f"sqlite:///{path}")
    try:
        first.record(entry("0.1"))
        assert first.spend("day", now=NOW) == Decimal("0.1")
        second.record(entry("0.2"))
        assert first.spend("day", now=NOW) == Decimal("0.3")
        first.record(entry("0.4"))  # on a connection whose kept read is now stale
        assert first.spend("day", now=NOW) == Decimal("0.7")
        assert second.spend("day", now=NOW) == Decimal("0.7")
    finally:
        first.close()
        second.close()


def test_a_repeated_read_with_nothing_committed_runs_no_totals_query(
    ledger: SqlCostLedger,
) -> None:
    ledger.record(entry("0.1"))
    ledger.spends(WINDOWS, now=NOW)
    ledger.record(entry("0.2"))  # this process's own write: accounted for, not re-read
    statements: list[str] = []
    for driver, _, _ in ledger._db._idle:
        driver.set_trace_callback(statements.append)
    assert ledger.spends(WINDOWS, now=NOW) == (Decimal("0.3"), Decimal("0.3"), 0, 0)
    # The lock-wait bound is set again when the time left has drifted past its slack (a
    # slow machine); that is no read of the totals.
    read = [each for each in statements if not each.startswith("PRAGMA busy_timeout")]
    assert read == ["PRAGMA data_version"]
