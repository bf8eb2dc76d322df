"""A meter's settled call reaches the in-memory ledger as a row (`row_recorder`): the
entry it reads back, the totals and the warnings are those of the entry path."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from llm_resilience import CostBudget, InMemoryCostLedger
from llm_resilience.ledger import LedgerEntry
from llm_resilience.ledger._protocol import EntryRow, row_recorder
from llm_resilience.metering import BUDGET_SCOPE_KWARG, Meter
from llm_resilience.usage import Usage

NOW = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC)


class _Model:
    model_name = "gpt-4o"
    max_output_tokens = None


class _ThroughRecord(InMemoryCostLedger):
    """Takes every entry through its own ``record``: a gate never hands it a row."""

    def record(self, entry: LedgerEntry) -> None:
        super().record(entry)


def _meter(ledger: InMemoryCostLedger) -> Meter:
    meter = Meter(
        CostBudget(3, 15, daily_limit=100, monthly_limit=1000),
        ledger,
        stack=_Model(),
        name_of=lambda model: model.model_name,  # type: ignore[attr-defined]
    )
    meter.gate._now = lambda: NOW
    return meter


_USAGES = (
    Usage(
        120,
        9,
        False,
        cache_read_tokens=100,
        cache_write_tokens=20,
        cache_write_1h_tokens=8,
        reasoning_tokens=5,
    ),
    Usage(7, 3, True),
    Usage(1, 0, False),
)


def _settle_each(meter: Meter) -> None:
    for number, usage in enumerate(_USAGES):
        call = {BUDGET_SCOPE_KWARG: f"tenant-{number % 2}"}
        meter.begin(call).settle(usage, named="gpt-4o-mini" if number else None)
    call = asyncio.run(meter.abegin({}))
    asyncio.run(call.asettle(Usage(40, 2, False)))
    meter.begin({}).end_early(Usage(3, 1, True), named="gpt-4o")


def test_a_settled_call_reads_back_as_the_entry_the_entry_path_records() -> None:
    rows, entries = InMemoryCostLedger(), _ThroughRecord()
    assert row_recorder(rows) is not None
    assert row_recorder(entries) is None
    for ledger in (rows, entries):
        _settle_each(_meter(ledger))
    assert len(rows.entries()) == len(_USAGES) + 2
    assert rows.entries() == entries.entries()  # every field but the id
    ids = [entry.entry_id for entry in rows.entries()]
    assert all(re.fullmatch(r"[0-9a-f]{32}", str(each)) for each in ids)
    assert len(set(ids)) == len(ids)
    for window in ("day", "month"):
        for scope in (None, "tenant-0", "tenant-1"):
            spent = rows.spend(window, scope=scope, now=NOW)
            assert spent == entries.spend(window, scope=scope, now=NOW)
            assert spent > 0
    # The first call's details landed in their own fields.
    first = rows.entries()[0]
    assert (first.cache_read_tokens, first.cache_write_tokens) == (100, 20)
    assert (first.cache_write_1h_tokens, first.reasoning_tokens) == (8, 5)
    assert (first.surface, first.kind, first.pages, first.scope) == ("chat", "chat", 0, "tenant-0")


def test_rows_are_built_once_in_recording_order_within_the_entry_bound() -> None:
    ledger = InMemoryCostLedger(max_entries=3)
    meter = _meter(ledger)
    ledger.record(LedgerEntry(NOW - timedelta(seconds=1), "ocr", pages=2, cost=Decimal("0.2")))
    meter.begin({}).settle(Usage(10, 1, False))
    ledger.record(LedgerEntry(NOW, "ocr", pages=1, cost=Decimal("0.1")))
    meter.begin({}).settle(Usage(20, 2, False))
    read = ledger.entries()
    # The oldest (an entry recorded directly) fell out of the bound; the rest keep order.
    assert [(entry.kind, entry.input_tokens, entry.pages) for entry in read] == [
        ("chat", 10, 0),
        ("ocr", 0, 1),
        ("chat", 20, 0),
    ]
    again = ledger.entries()
    assert all(first is second for first, second in zip(read, again, strict=True))
    # Every entry still counts, the one no longer listed too.
    assert ledger.spend("day", now=NOW) == Decimal("0.3") + sum(
        (entry.cost for entry in read if entry.kind == "chat"), Decimal(0)
    )


def test_a_row_the_ledger_cannot_record_is_warned_about_and_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Full(InMemoryCostLedger):
        def _record_row(self, row: EntryRow) -> None:
            raise OSError("disk full")

    meter = _meter(Full())
    meter.begin({}).settle(Usage(9, 20, False))
    asyncio.run(asyncio.run(meter.abegin({})).asettle(Usage(9, 20, False)))
    assert caplog.text.count("OSError") == 2
    assert "disk full" not in caplog.text  # the error's type only
