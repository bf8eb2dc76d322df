"""The ledger's vocabulary (entries, windows) and the in-memory ledger (SPEC section 4).

Every test passes ``now`` explicitly, so UTC windows are exact and nothing depends on
the wall clock; the concurrency tests use real threads released together by a barrier.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from llm_resilience.errors import BudgetExceededError
from llm_resilience.ledger import CostLedger, InMemoryCostLedger, LedgerEntry
from llm_resilience.ledger._protocol import exact_sum, window_bounds, window_key

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def entry(
    cost: str, *, at: datetime = NOW, kind: str = "chat", scope: str | None = None
) -> LedgerEntry:
    return LedgerEntry(at, kind, input_tokens=10, output_tokens=5, cost=Decimal(cost), scope=scope)


# -- LedgerEntry ---------------------------------------------------------------------------


def test_a_naive_timestamp_is_refused_naming_timestamp() -> None:
    with pytest.raises(ValueError, match="timestamp"):
        LedgerEntry(datetime(2026, 11, 29, 12), "chat")


def test_a_float_cost_is_refused_naming_cost() -> None:
    with pytest.raises(TypeError, match="cost"):
        LedgerEntry(NOW, "chat", cost=0.1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("input_tokens", -1, ValueError),
        ("output_tokens", 1.5, TypeError),
        ("pages", True, TypeError),
        ("cost", Decimal("-0.01"), ValueError),
        ("cost", Decimal("NaN"), ValueError),
        ("kind", "", TypeError),
        ("scope", "", ValueError),  # one scope rule everywhere: empty is a bad value
        ("scope", 7, TypeError),
        ("estimated", 1, TypeError),
    ],
)
def test_invalid_fields_are_refused_naming_the_field(
    field: str, value: object, error: type[Exception]
) -> None:
    fields: dict[str, object] = {"timestamp": NOW, "kind": "chat", field: value}
    with pytest.raises(error, match=field):
        LedgerEntry(**fields)  # type: ignore[arg-type]


def test_an_aware_timestamp_is_stored_in_utc_and_an_int_cost_as_decimal() -> None:
    tokyo = timezone(timedelta(hours=9))
    stored = LedgerEntry(datetime(2026, 11, 30, 8, 30, tzinfo=tokyo), "chat", cost=2)  # type: ignore[arg-type]
    assert stored.timestamp == datetime(2026, 11, 29, 23, 30, tzinfo=UTC)
    assert stored.timestamp.tzinfo is UTC
    assert stored.cost == Decimal(2)
    assert isinstance(stored.cost, Decimal)


def test_per_page_entries_need_no_tokens() -> None:
    ocr = LedgerEntry(NOW, "ocr", pages=12, cost=Decimal("0.018"))
    assert (ocr.input_tokens, ocr.output_tokens, ocr.pages) == (0, 0, 12)


# -- windows and exact sums ----------------------------------------------------------------


def test_windows_are_the_utc_date_and_the_utc_month_from_its_first_day() -> None:
    last = datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert window_key("day", last) == "day:2026-12-31"
    assert window_key("month", last) == "month:2026-12"
    assert window_bounds("day", last) == (
        datetime(2026, 12, 31, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )
    assert window_bounds("month", last) == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )
    with pytest.raises(ValueError, match="window"):
        window_key("week", last)  # type: ignore[arg-type]


def test_exact_sum_never_rounds_to_the_default_28_digits() -> None:
    huge, tiny = Decimal("1000000000000"), Decimal("0.0000000000000000000000000001")
    assert exact_sum([huge, tiny]) - huge == tiny
    assert huge + tiny - huge != tiny  # what the default context would have done


# -- the in-memory ledger --------------------------------------------------------------------


def test_the_in_memory_ledger_follows_the_protocol_and_says_it_is_not_persistent() -> None:
    ledger = InMemoryCostLedger()
    assert isinstance(ledger, CostLedger)
    assert InMemoryCostLedger.persistent is False


def test_point_one_plus_point_two_is_exactly_point_three() -> None:
    ledger = InMemoryCostLedger()
    ledger.record(entry("0.1"))
    ledger.record(entry("0.2"))
    assert ledger.spend("day", now=NOW) == Decimal("0.3")
    assert ledger.spend("month", now=NOW) == Decimal("0.3")


def test_ten_thousand_tiny_costs_sum_exactly() -> None:
    ledger = InMemoryCostLedger()
    for _ in range(10_000):
        ledger.record(entry("0.0000001"))
    assert ledger.spend("day", now=NOW) == Decimal("0.001")


def test_spend_counts_the_utc_day_and_the_utc_month_from_its_first_day() -> None:
    ledger = InMemoryCostLedger()
    ledger.record(entry("1", at=datetime(2026, 10, 31, 23, 59, 59, tzinfo=UTC)))  # last month
    ledger.record(entry("2", at=datetime(2026, 11, 1, 0, 0, tzinfo=UTC)))  # first instant
    ledger.record(entry("4", at=datetime(2026, 11, 28, 23, 59, 59, tzinfo=UTC)))  # yesterday
    ledger.record(entry("8", at=datetime(2026, 11, 29, 0, 0, tzinfo=UTC)))  # today
    # 01:00 in UTC+03:00 is still yesterday in UTC.
    ledger.record(entry("16", at=datetime(2026, 11, 29, 1, 0, tzinfo=timezone(timedelta(hours=3)))))
    assert ledger.spend("day", now=NOW) == Decimal(8)
    assert ledger.spend("month", now=NOW) == Decimal(2 + 4 + 8 + 16)
    assert ledger.spend("month", now=datetime(2026, 10, 15, tzinfo=UTC)) == Decimal(1)


def test_entries_of_any_kind_count_toward_the_same_windows() -> None:
    ledger = InMemoryCostLedger()
    ledger.record(entry("0.5", kind="chat"))
    ledger.record(LedgerEntry(NOW, "ocr", pages=20, cost=Decimal("0.03")))
    ledger.record(entry("0.01", kind="embedding"))
    assert ledger.spend("day", now=NOW) == Decimal("0.54")


def test_the_global_total_counts_every_scope_and_a_scope_only_its_own() -> None:
    ledger = InMemoryCostLedger()
    ledger.record(entry("1"))
    ledger.record(entry("2", scope="tenant-a"))
    ledger.record(entry("4", scope="tenant-b"))
    assert ledger.spend("day", now=NOW) == Decimal(7)
    assert ledger.spend("day", scope="tenant-a", now=NOW) == Decimal(2)
    assert ledger.spend("month", scope="tenant-b", now=NOW) == Decimal(4)
    assert ledger.spend("day", scope="nobody", now=NOW) == Decimal(0)


def test_a_naive_now_or_an_unknown_window_is_refused() -> None:
    ledger = InMemoryCostLedger()
    with pytest.raises(ValueError, match="now"):
        ledger.spend("day", now=datetime(2026, 11, 29))
    with pytest.raises(ValueError, match="window"):
        ledger.spend("year")  # type: ignore[arg-type]


def test_entries_are_half_open_and_oldest_first() -> None:
    ledger = InMemoryCostLedger()
    times = [NOW + timedelta(minutes=m) for m in (3, 1, 2, 0)]
    for minute, at in enumerate(times):
        ledger.record(entry(str(minute), at=at))
    assert [e.timestamp for e in ledger.entries()] == sorted(times)
    window = ledger.entries(since=NOW + timedelta(minutes=1), until=NOW + timedelta(minutes=3))
    assert [e.timestamp for e in window] == [NOW + timedelta(minutes=1), NOW + timedelta(minutes=2)]


def test_a_hold_counts_toward_spend_in_its_windows_and_scopes_until_settled() -> None:
    ledger = InMemoryCostLedger()
    ledger.record(entry("1"))
    hold = ledger.reserve(
        Decimal("2"), limits={("day", None): Decimal(10)}, scope="tenant-a", now=NOW
    )
    assert hold.amount == Decimal(2)
    assert (hold.scope, hold.timestamp) == ("tenant-a", NOW)
    assert ledger.spend("day", now=NOW) == Decimal(3)
    assert ledger.spend("month", scope="tenant-a", now=NOW) == Decimal(2)
    assert ledger.spend("day", scope="tenant-b", now=NOW) == Decimal(0)
    assert ledger.spend("day", now=NOW + timedelta(days=1)) == Decimal(0)

    ledger.settle(hold, entry("0.75", scope="tenant-a"))
    assert ledger.spend("day", now=NOW) == Decimal("1.75")
    assert ledger.spend("day", scope="tenant-a", now=NOW) == Decimal("0.75")
    ledger.settle(hold, None)  # settling twice releases nothing more
    assert ledger.spend("day", now=NOW) == Decimal("1.75")


def test_settling_without_an_entry_only_releases_the_hold() -> None:
    ledger = InMemoryCostLedger()
    hold = ledger.reserve(Decimal("5"), limits={}, scope=None, now=NOW)
    ledger.settle(hold, None)
    assert ledger.spend("day", now=NOW) == Decimal(0)
    assert ledger.entries() == []


def test_only_the_latest_max_entries_are_kept_but_spend_counts_them_all() -> None:
    ledger = InMemoryCostLedger(max_entries=3)
    for minute in range(5):
        ledger.record(entry(str(minute), at=NOW + timedelta(minutes=minute)))
    assert [e.cost for e in ledger.entries()] == [Decimal(2), Decimal(3), Decimal(4)]
    assert ledger.spend("day", now=NOW) == Decimal(10)
    with pytest.raises(ValueError, match="max_entries"):
        InMemoryCostLedger(max_entries=0)


def test_a_hold_that_would_pass_a_limit_is_refused_with_the_window_limit_and_spend() -> None:
    ledger = InMemoryCostLedger()
    ledger.record(entry("7", scope="tenant-a"))
    limits = {("day", None): Decimal(100), ("month", "tenant-a"): Decimal(10)}
    ledger.reserve(Decimal("3"), limits=limits, scope="tenant-a", now=NOW)  # exactly reaches 10
    with pytest.raises(BudgetExceededError) as refused:
        ledger.reserve(Decimal("0.01"), limits=limits, scope="tenant-a", now=NOW)
    assert (refused.value.window, refused.value.scope) == ("month", "tenant-a")
    assert (refused.value.limit, refused.value.spend) == (Decimal(10), Decimal(10))
    assert ledger.spend("day", now=NOW) == Decimal(10)  # the refused hold holds nothing


def test_a_limit_of_zero_refuses_even_a_hold_of_zero() -> None:
    ledger = InMemoryCostLedger()
    with pytest.raises(BudgetExceededError):
        ledger.reserve(Decimal(0), limits={("day", None): Decimal(0)}, scope=None, now=NOW)


def test_a_hold_nobody_settles_stops_counting_after_its_ttl() -> None:
    ledger = InMemoryCostLedger(reservation_ttl=timedelta(minutes=5))
    ledger.reserve(Decimal("9"), limits={}, scope=None, now=NOW)
    assert ledger.spend("day", now=NOW + timedelta(minutes=4, seconds=59)) == Decimal(9)
    assert ledger.spend("day", now=NOW + timedelta(minutes=5)) == Decimal(0)
    later = ledger.reserve(
        Decimal("1"), limits={("day", None): Decimal(1)}, scope=None, now=NOW + timedelta(minutes=5)
    )
    assert later.amount == Decimal(1)


def test_reserve_validates_its_amount_and_limits() -> None:
    ledger = InMemoryCostLedger()
    with pytest.raises(TypeError, match="amount"):
        ledger.reserve(0.5, limits={}, scope=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limit"):
        ledger.reserve(Decimal(1), limits={("day", None): 2.0}, scope=None)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="window"):
        ledger.reserve(Decimal(1), limits={("week", None): Decimal(2)}, scope=None)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="reservation_ttl"):
        InMemoryCostLedger(reservation_ttl=timedelta(0))


def test_eight_threads_reserving_against_a_limit_get_exactly_the_holds_it_admits() -> None:
    ledger = InMemoryCostLedger()
    limits = {("day", None): Decimal("2.5"), ("month", None): Decimal(1000)}  # admits 25 of 0.1
    start = threading.Barrier(8)
    granted: list[int] = []

    def worker() -> None:
        start.wait()
        won = 0
        for _ in range(10):
            try:
                ledger.reserve(Decimal("0.1"), limits=limits, scope=None, now=NOW)
                won += 1
            except BudgetExceededError:
                pass
        granted.append(won)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(granted) == 25
    assert ledger.spend("day", now=NOW) == Decimal("2.5")


def test_eight_threads_recording_lose_and_double_nothing() -> None:
    ledger = InMemoryCostLedger()
    start = threading.Barrier(8)

    def worker() -> None:
        start.wait()
        for _ in range(500):
            ledger.record(entry("0.001", scope="t"))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ledger.entries()) == 4000
    assert ledger.spend("day", now=NOW) == ledger.spend("month", scope="t", now=NOW) == Decimal(4)


async def test_the_async_methods_match_the_sync_ones() -> None:
    ledger = InMemoryCostLedger()
    await asyncio.gather(*(ledger.arecord(entry("0.1")) for _ in range(3)))
    hold = await ledger.areserve(
        Decimal("1"), limits={("day", None): Decimal(2)}, scope=None, now=NOW
    )
    assert await ledger.aspend("day", now=NOW) == Decimal("1.3")
    await ledger.asettle(hold, entry("0.2"))
    assert await ledger.aspend("month", now=NOW) == Decimal("0.5")


def test_importing_the_ledger_package_does_not_import_sqlalchemy() -> None:
    probe = (
        "import sys, llm_resilience.ledger as ledger\n"
        "assert 'sqlalchemy' not in sys.modules and 'sqlmodel' not in sys.modules\n"
        "ledger.SqlCostLedger\n"
        "assert 'sqlalchemy' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# -- agent runs and threads ---------------------------------------------------------------


def _run_entry(cost: str, run: str | None, thread: str | None = None) -> LedgerEntry:
    return LedgerEntry(NOW, "chat", cost=Decimal(cost), run_id=run, thread_id=thread)


def test_entries_keep_their_run_and_thread_and_filter_by_them() -> None:
    ledger = InMemoryCostLedger()
    first, second = _run_entry("0.1", "run-1", "t-1"), _run_entry("0.2", "run-2", "t-1")
    ledger.record(first)
    ledger.settle(ledger.reserve(Decimal(1), limits={}, scope=None, now=NOW), second)
    ledger.record(_run_entry("0.4", None))
    assert ledger.entries(run="run-2") == [second]
    assert ledger.entries(thread="t-1") == [first, second]
    assert (ledger.entries()[0].run_id, ledger.entries()[-1].run_id) == ("run-1", None)
    assert ledger.run_spend(run="run-1") == Decimal("0.1")
    assert ledger.run_spend(thread="t-1") == Decimal("0.3")


def test_run_spend_counts_entries_max_entries_no_longer_lists() -> None:
    ledger = InMemoryCostLedger(max_entries=2)
    for cost in ("0.1", "0.2", "0.3", "0.4"):
        ledger.record(_run_entry(cost, "run-1", "t-1"))
    assert len(ledger.entries(run="run-1")) == 2
    assert ledger.run_spend(run="run-1") == ledger.run_spend(thread="t-1") == Decimal("1.0")


def test_only_the_runs_and_threads_recorded_to_most_recently_are_remembered() -> None:
    ledger = InMemoryCostLedger(max_entries=2)  # remembers 2 x 2 runs and threads
    ledger.record(_run_entry("1", "old-run"))
    for index in range(4):
        ledger.record(_run_entry("0.5", f"run-{index}"))
    ledger.record(_run_entry("0.5", "run-3"))
    assert ledger.run_spend(run="old-run") == Decimal(0)  # forgotten, as its entries are
    assert ledger.run_spend(run="run-3") == Decimal("1.0")
    assert ledger.run_spend(run="run-0") == Decimal("0.5")  # still among the latest four


async def test_async_run_spend_and_entries_match_the_sync_ones() -> None:
    ledger = InMemoryCostLedger()
    await ledger.arecord(_run_entry("0.25", "run-1", "t-1"))
    await ledger.arecord(_run_entry("0.5", "run-2", "t-1"))
    assert await ledger.arun_spend(thread="t-1") == Decimal("0.75")
    assert await ledger.aentries(run="run-2") == ledger.entries(run="run-2")
    assert [e async for e in ledger.aiter_entries(thread="t-1")] == ledger.entries()
