"""to_dataframe: entries and reports as DataFrames with the right dtypes and exact money."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")

from llm_resilience.frames import ENTRY_COLUMNS, REPORT_COLUMNS, to_dataframe  # noqa: E402
from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry, SqlCostLedger  # noqa: E402
from llm_resilience.money import exact_sum  # noqa: E402
from llm_resilience.spend import spend_report  # noqa: E402

START = datetime(2026, 11, 1, tzinfo=UTC)


def _entries() -> list[LedgerEntry]:
    """Costs whose float sum drifts (0.1 is not a binary fraction) but whose exact sum is round."""
    entries = [
        LedgerEntry(
            START + timedelta(hours=hour),
            "chat",
            input_tokens=1000 + hour,
            output_tokens=200,
            cost=Decimal("0.1"),
            model="gpt-4o-mini" if hour % 2 else "claude-haiku",
            scope="tenant-a" if hour % 3 else None,
            surface="chat",
            estimated=hour % 5 == 0,
        )
        for hour in range(30)
    ]
    entries.append(
        LedgerEntry(
            START + timedelta(days=1, hours=3),
            "ocr",
            pages=14,
            cost=Decimal("0.000000000000000000000007"),
            model="mistral-ocr",
        )
    )
    return entries


def test_an_entries_frame_has_one_documented_dtype_per_column() -> None:
    df = to_dataframe(_entries())

    assert {name: str(dtype) for name, dtype in df.dtypes.items()} == ENTRY_COLUMNS
    assert str(df["timestamp"].dtype) == "datetime64[ns, UTC]"
    assert isinstance(df["kind"].dtype, pd.StringDtype)
    assert len(df) == 31


def test_the_exact_sum_of_the_cost_column_equals_the_ledgers_spend(tmp_path: Path) -> None:
    ledger = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
    try:
        for entry in _entries():
            ledger.record(entry)
        df = to_dataframe(ledger.entries())
        month_spend = ledger.spend("month", now=START)
    finally:
        ledger.close()

    assert all(type(cost) is Decimal for cost in df["cost"])
    assert exact_sum(df["cost"]) == month_spend == Decimal("3.000000000000000000000007")
    # Why cost stays Decimal: thirty float 0.1s do not add up to 3.
    assert sum(df["cost_float"].tolist()) != 3.0


def test_each_row_keeps_the_entrys_facts_and_missing_text_is_na() -> None:
    entries = _entries()
    df = to_dataframe(entries)

    ocr = df[df["kind"] == "ocr"].iloc[0]
    assert ocr["pages"] == 14
    assert ocr["cost"] == Decimal("0.000000000000000000000007")
    assert ocr["cost_float"] == 7e-24
    assert ocr["scope"] is pd.NA
    assert ocr["surface"] is pd.NA
    assert df["timestamp"].iloc[0] == pd.Timestamp(START)
    assert df["estimated"].tolist() == [entry.estimated for entry in entries]
    assert df["entry_id"].tolist() == [entry.entry_id for entry in entries]


def test_grouping_the_float_cost_by_model_is_what_a_plot_needs() -> None:
    df = to_dataframe(_entries())

    by_model = df.groupby("model")["cost_float"].sum()

    assert by_model["claude-haiku"] == pytest.approx(1.5)
    assert by_model["gpt-4o-mini"] == pytest.approx(1.5)
    assert by_model.dtype == "float64"


def test_no_entries_give_an_empty_frame_with_the_same_columns_and_dtypes() -> None:
    df = to_dataframe(InMemoryCostLedger().entries())

    assert df.empty
    assert {name: str(dtype) for name, dtype in df.dtypes.items()} == ENTRY_COLUMNS


def test_a_report_frame_has_one_row_per_report_row_and_exact_costs() -> None:
    ledger = InMemoryCostLedger()
    for entry in _entries():
        ledger.record(entry)
    report = spend_report(ledger, by="model")

    df = to_dataframe(report)

    assert {name: str(dtype) for name, dtype in df.dtypes.items()} == REPORT_COLUMNS
    assert df.attrs["by"] == "model"
    assert df["key"].tolist() == [row.key for row in report.rows]
    assert exact_sum(df["cost"]) == report.total.cost == Decimal("3.000000000000000000000007")
    by_key = df.set_index("key")
    assert by_key.loc["claude-haiku", "calls"] == 15
    # Hours 0, 10 and 20 are estimated, all even hours: claude-haiku's.
    assert by_key.loc["claude-haiku", "estimated_calls"] == 3
    assert by_key.loc["claude-haiku", "estimated_share"] == 0.2
    assert by_key.loc["mistral-ocr", "cost"] == Decimal("0.000000000000000000000007")


def test_a_report_row_without_a_key_is_na() -> None:
    ledger = InMemoryCostLedger()
    for entry in _entries():
        ledger.record(entry)

    df = to_dataframe(spend_report(ledger, by="scope"))

    unscoped = df[df["key"].isna()]
    assert len(unscoped) == 1
    assert unscoped["calls"].iloc[0] == 11  # hours 0, 3, ..., 27 and the OCR job


def test_a_ledger_itself_gives_the_frame_of_all_its_entries(tmp_path: Path) -> None:
    from llm_resilience import to_dataframe as from_the_face

    ledger = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
    for entry in _entries():
        ledger.record(entry)

    df = from_the_face(ledger)
    assert len(df) == 31
    assert df.equals(to_dataframe(ledger.entries()))
    assert len(from_the_face(InMemoryCostLedger())) == 0
    ledger.close()


def test_without_pandas_the_error_names_the_pandas_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # what an environment without it raises

    with pytest.raises(ImportError, match=r'pandas extra: pip install "llm-resilience\[pandas\]"'):
        to_dataframe([])


def test_anything_but_entries_or_a_report_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="a ledger, an iterable of LedgerEntry or a SpendReport"):
        to_dataframe([{"cost": "0.1"}])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="got str"):
        to_dataframe("entries")  # type: ignore[arg-type]


def test_importing_the_package_loads_neither_pandas_nor_matplotlib() -> None:
    code = (
        "import sys, llm_resilience, llm_resilience.ledger\n"
        "from llm_resilience import LedgerEntry, CostBudget\n"
        "print(sorted(m for m in ('pandas', 'matplotlib') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


def test_the_run_and_thread_of_each_entry_are_columns_to_group_by(tmp_path: Path) -> None:
    ledger = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
    for cost, run, thread in [
        ("0.1", "run-1", "t-1"),
        ("0.2", "run-1", "t-1"),
        ("0.4", None, None),
    ]:
        ledger.record(LedgerEntry(START, "chat", cost=Decimal(cost), run_id=run, thread_id=thread))
    df = to_dataframe(ledger)
    ledger.close()
    assert isinstance(df["run_id"].dtype, pd.StringDtype)
    assert df["run_id"].tolist()[:2] == ["run-1", "run-1"]
    assert df["thread_id"].isna().tolist() == [
        False,
        False,
        True,
    ]
    by_run = df.groupby("run_id")["cost"].agg(lambda costs: exact_sum(costs))
    assert by_run.to_dict() == {"run-1": Decimal("0.3")}
    report = to_dataframe(spend_report(InMemoryCostLedger(), by="run"))
    assert report.attrs["by"] == "run"
