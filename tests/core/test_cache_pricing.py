"""Cost is what the provider bills: cache reads, cache writes and reasoning priced apart.

The core rules only: how :class:`Usage` carries the split, how :class:`ModelPrice` prices
it, how a stream adds it up, how a strict hold covers it. Each provider's shape is read
by the adapters and proven in their own ``test_cache_pricing.py``.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from llm_resilience import BudgetGate, CostBudget, InMemoryCostLedger
from llm_resilience.frames import to_dataframe
from llm_resilience.ledger import CostLedger, LedgerEntry, SqlCostLedger
from llm_resilience.money import ModelPrice, cost_of
from llm_resilience.usage import (
    StreamUsage,
    TokenDetails,
    Usage,
    chat_usage,
    partial_stream_usage,
    reported_usage,
)

#: Claude Sonnet's published rates: writes 1.25x (5 minutes) and 2x (1 hour), reads 0.1x.
SONNET = ModelPrice(
    3,
    15,
    cache_read_price_per_mtok="0.30",
    cache_write_price_per_mtok="3.75",
    cache_write_1h_price_per_mtok=6,
)
PROMPT = [("user", "Summarise the attached contract.")]


def test_a_price_that_sets_no_cache_or_reasoning_rate_bills_every_token_as_before() -> None:
    usage = Usage(
        10_000,
        2_000,
        False,
        cache_read_tokens=6_000,
        cache_write_tokens=3_000,
        cache_write_1h_tokens=1_000,
        reasoning_tokens=1_500,
    )
    # 10,000 x $3 + 2,000 x $15, per million: the split changes nothing without its rates.
    assert cost_of(usage, ModelPrice(3, 15)) == Decimal("0.06")


def test_an_anthropic_cached_call_bills_each_part_once_at_its_own_rate() -> None:
    # 1,000 uncached + 6,000 read + 2,000 written for 5 min + 1,000 written for 1 h.
    usage = Usage(
        10_000,
        400,
        False,
        cache_read_tokens=6_000,
        cache_write_tokens=3_000,
        cache_write_1h_tokens=1_000,
    )
    expected = (
        1_000 * Decimal(3)
        + 6_000 * Decimal("0.30")
        + 2_000 * Decimal("3.75")
        + 1_000 * Decimal(6)
        + 400 * Decimal(15)
    ) / 1_000_000
    assert cost_of(usage, SONNET) == expected == Decimal("0.0243")


def test_cache_writes_are_not_also_billed_as_input() -> None:
    written = Usage(5_000, 0, False, cache_write_tokens=5_000)
    # Every token a write: 5,000 x $3.75 and nothing at the $3 input price on top.
    assert cost_of(written, SONNET) == Decimal("0.01875")


def test_reasoning_tokens_are_part_of_the_output_and_take_their_own_rate_when_set() -> None:
    usage = Usage(100, 1_000, False, reasoning_tokens=800)
    priced = ModelPrice(1, 10, reasoning_price_per_mtok=20)
    assert cost_of(usage, priced) == (100 * 1 + 200 * 10 + 800 * 20) / Decimal(1_000_000)
    assert cost_of(usage, ModelPrice(1, 10)) == Decimal("0.0101")


def test_each_optional_price_falls_back_to_the_plain_rate_on_its_own() -> None:
    usage = Usage(
        1_000, 10, False, cache_read_tokens=500, cache_write_tokens=300, cache_write_1h_tokens=100
    )
    reads_only = ModelPrice(2, 8, cache_read_price_per_mtok="0.2")
    # 500 reads at $0.2; the 200 + 100 writes and 200 uncached at $2; 10 out at $8.
    assert cost_of(usage, reads_only) == Decimal("0.00118")


@pytest.mark.parametrize(
    "option",
    [
        "cache_read_price_per_mtok",
        "cache_write_price_per_mtok",
        "cache_write_1h_price_per_mtok",
        "reasoning_price_per_mtok",
    ],
)
def test_bad_optional_prices_are_refused_naming_the_option(option: str) -> None:
    with pytest.raises(TypeError, match=option):
        ModelPrice(1, 1, **{option: 0.3})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=option):
        ModelPrice(1, 1, **{option: "-1"})
    assert getattr(ModelPrice(1, 1, **{option: " 0.5 "}), option) == Decimal("0.5")


def test_the_optional_prices_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        ModelPrice(1, 1, None, "0.1")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ({"cache_read_tokens": 60, "cache_write_tokens": 50}, "exceed input_tokens"),
        ({"cache_write_tokens": 10, "cache_write_1h_tokens": 11}, "cache_write_1h_tokens"),
        ({"cache_write_1h_tokens": 1}, "cache_write_1h_tokens"),
        ({"reasoning_tokens": 21}, "exceed output_tokens"),
    ],
)
def test_a_usage_whose_parts_exceed_their_total_is_refused(
    counts: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Usage(100, 20, False, **counts)


def test_a_negative_part_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="cache_read_tokens"):
        Usage(100, 20, False, cache_read_tokens=-1)


def test_a_report_keeps_its_parts_and_an_estimate_drops_them() -> None:
    details = TokenDetails(cache_read_tokens=90, reasoning_tokens=5)
    reported = chat_usage(100, 20, prompt=PROMPT, response_text="x", details=details)
    assert (reported.cache_read_tokens, reported.reasoning_tokens) == (90, 5)
    estimated = chat_usage(None, 20, prompt=PROMPT, response_text="x", details=details)
    assert estimated.estimated
    assert estimated.details == TokenDetails()


def test_reported_parts_that_do_not_fit_their_total_are_billed_at_the_plain_rate() -> None:
    odd = TokenDetails(
        cache_read_tokens=80, cache_write_tokens=30, cache_write_1h_tokens=40, reasoning_tokens=99
    )
    usage = reported_usage(100, 20, prompt=PROMPT, details=odd)
    assert usage is not None
    assert usage.details == TokenDetails()
    # A one-hour share above the writes drops that share only.
    usage = reported_usage(
        100,
        20,
        prompt=PROMPT,
        details=TokenDetails(cache_write_tokens=10, cache_write_1h_tokens=11),
    )
    assert usage is not None
    assert (usage.cache_write_tokens, usage.cache_write_1h_tokens) == (10, None)


def test_a_streams_parts_add_up_like_its_counts_each_keeping_its_largest_report() -> None:
    stream = StreamUsage()
    # Anthropic: message_start carries the input side, message_delta repeats it cumulatively.
    stream.add(1_000, 1, TokenDetails(cache_read_tokens=900, cache_write_tokens=50))
    stream.add(None, None, None)
    stream.add(1_000, 40, TokenDetails(cache_read_tokens=900, reasoning_tokens=30))
    assert stream.details == TokenDetails(
        cache_read_tokens=900, cache_write_tokens=50, reasoning_tokens=30
    )
    usage = chat_usage(
        stream.input_tokens,
        stream.output_tokens,
        prompt=PROMPT,
        response_text="",
        details=stream.details,
    )
    assert (
        cost_of(usage, SONNET)
        == (50 * Decimal(3) + 900 * Decimal("0.30") + 50 * Decimal("3.75") + 40 * Decimal(15))
        / 1_000_000
    )


def test_a_stream_closed_early_keeps_its_cache_reads_but_not_a_reasoning_count() -> None:
    # Output reported before the text (1 token, 3 text chunks): the output is estimated.
    usage = partial_stream_usage(
        1_000,
        1,
        prompt=PROMPT,
        deltas=["One", " two", " three"],
        details=TokenDetails(cache_read_tokens=900, reasoning_tokens=1),
    )
    assert usage is not None
    assert usage.estimated
    assert (usage.input_tokens, usage.cache_read_tokens, usage.reasoning_tokens) == (
        1_000,
        900,
        None,
    )


def test_a_strict_hold_covers_a_prompt_written_to_the_cache_at_the_dearest_rate() -> None:
    gate = BudgetGate(
        CostBudget(daily_limit=100, prices={"claude": SONNET}, strict=True),
        InMemoryCostLedger(),
    )
    hold = gate.worst_case_cost(
        "chat", estimated_input_tokens=10_000, max_output_tokens=100, model="claude"
    )
    every_input_written_for_an_hour = cost_of(
        Usage(10_000, 100, False, cache_write_tokens=10_000, cache_write_1h_tokens=10_000), SONNET
    )
    assert hold == every_input_written_for_an_hour == Decimal("0.0615")


def test_usage_shows_only_the_parts_that_were_reported() -> None:
    assert repr(Usage(3, 2, False)) == "Usage(input_tokens=3, output_tokens=2, estimated=False)"
    assert "reasoning_tokens=1" in repr(Usage(3, 2, False, reasoning_tokens=1))


# -- the ledger keeps the split ------------------------------------------------------------

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
DETAILS = ("cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens", "reasoning_tokens")
CACHED = Usage(
    10_000,
    400,
    False,
    cache_read_tokens=6_000,
    cache_write_tokens=3_000,
    cache_write_1h_tokens=1_000,
    reasoning_tokens=150,
)


def _split(entry: LedgerEntry) -> tuple[int, ...]:
    return tuple(getattr(entry, name) for name in DETAILS)


def _cached_entry(ledger: CostLedger) -> LedgerEntry:
    gate = BudgetGate(CostBudget(daily_limit=100, prices={"claude": SONNET}), ledger)
    entry = gate.begin("chat", model="claude").finish(CACHED)
    assert entry is not None
    return entry


def test_a_cached_calls_entry_keeps_its_split_beside_its_exact_cost() -> None:
    ledger = InMemoryCostLedger()
    entry = _cached_entry(ledger)
    assert _split(entry) == (6_000, 3_000, 1_000, 150)
    assert entry.cost == cost_of(CACHED, SONNET) == Decimal("0.0243")
    assert list(ledger.entries()) == [entry]
    # The gate's unchecked entry equals the checked one of the same values.
    assert entry == LedgerEntry(
        entry.timestamp,
        "chat",
        10_000,
        400,
        Decimal("0.0243"),
        model="claude",
        surface="chat",
        cache_read_tokens=6_000,
        cache_write_tokens=3_000,
        cache_write_1h_tokens=1_000,
        reasoning_tokens=150,
    )


def test_an_entry_without_a_reported_split_stores_zeros() -> None:
    ledger = InMemoryCostLedger()
    gate = BudgetGate(CostBudget(3, 15, daily_limit=100), ledger)
    entry = gate.begin("chat").finish(Usage(100, 10, False))
    assert entry is not None
    assert _split(entry) == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ({"cache_read_tokens": 90, "cache_write_tokens": 20}, "exceed input_tokens"),
        ({"cache_write_tokens": 5, "cache_write_1h_tokens": 6}, "cache_write_1h_tokens"),
        ({"reasoning_tokens": 11}, "exceed output_tokens"),
        ({"cache_read_tokens": -1}, "cache_read_tokens"),
    ],
)
def test_a_ledger_entry_whose_parts_exceed_their_total_is_refused(
    counts: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        LedgerEntry(NOW, "chat", 100, 10, Decimal(1), **counts)  # type: ignore[arg-type]


def test_an_entries_frame_has_a_column_per_part() -> None:
    pytest.importorskip("pandas")
    ledger = InMemoryCostLedger()
    _cached_entry(ledger)
    frame = to_dataframe(ledger.entries())
    assert frame[list(DETAILS)].to_dict("records") == [
        {
            "cache_read_tokens": 6_000,
            "cache_write_tokens": 3_000,
            "cache_write_1h_tokens": 1_000,
            "reasoning_tokens": 150,
        }
    ]


def _previous_release(url: str, run: Callable[[str], None]) -> Decimal:
    """A ledger as the previous release left it: one entry stored, no split columns.

    Today's ledger writes it, then the four columns are dropped (SQLite and PostgreSQL
    both can): what is left is the previous release's table, rows and totals."""
    ledger = SqlCostLedger(url)
    try:
        ledger.record(LedgerEntry(NOW, "chat", 100, 20, Decimal("0.5"), model="old"))
    finally:
        ledger.close()
    for name in DETAILS:
        run(f"ALTER TABLE cost_ledger DROP COLUMN {name}")
    return Decimal("0.5")


def _upgraded_in_place(url: str, spent: Decimal) -> None:
    ledger = SqlCostLedger(url)
    try:
        (old,) = ledger.entries()
        assert (old.model, old.cost, _split(old)) == ("old", spent, (0, 0, 0, 0))
        written = _cached_entry(ledger)
        stored = ledger.entries()
        assert stored[-1] == written
        assert _split(stored[-1]) == (6_000, 3_000, 1_000, 150)
        # The running totals were kept, and the new entry added to them once.
        assert ledger.spend("day", now=NOW) == spent
        assert ledger.spend("day", now=written.timestamp) == written.cost
    finally:
        ledger.close()
    again = SqlCostLedger(url)  # opening an up-to-date ledger changes nothing
    try:
        assert [_split(e) for e in again.entries()] == [(0, 0, 0, 0), (6_000, 3_000, 1_000, 150)]
    finally:
        again.close()


def test_a_previous_release_sqlite_ledger_gains_the_split_columns_in_place(
    tmp_path: Path,
) -> None:
    path = tmp_path / "spend.db"
    url = f"sqlite:///{path}"

    def run(statement: str) -> None:
        with sqlite3.connect(path) as connection:
            connection.execute(statement)
        connection.close()

    spent = _previous_release(url, run)
    with sqlite3.connect(path) as connection:
        names = [row[1] for row in connection.execute("PRAGMA table_info(cost_ledger)")]
    connection.close()
    assert not set(DETAILS) & set(names)
    _upgraded_in_place(url, spent)


def test_a_previous_release_postgres_ledger_gains_the_split_columns_in_place(
    postgres_url: str,
) -> None:
    pytest.importorskip("psycopg")
    name = f"cache_split_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_url)
    with admin.begin() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {name}")
    url = (
        make_url(postgres_url)
        .update_query_dict({"options": f"-csearch_path={name}"})
        .render_as_string(hide_password=False)
    )
    inside = create_engine(url)

    def run(statement: str) -> None:
        with inside.begin() as connection:
            connection.exec_driver_sql(statement)

    try:
        _upgraded_in_place(url, _previous_release(url, run))
    finally:
        inside.dispose()
        with admin.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA {name} CASCADE")
        admin.dispose()
