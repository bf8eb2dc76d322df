"""``llm-resilience spend``: the report of a ledger database, its formats and exit codes.

Exit codes: 0 report written, 1 database problem, 2 usage error. Every failure is one
line on stderr naming the URL, password masked; the command never creates a database.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from llm_resilience.cli import main
from llm_resilience.ledger import LedgerEntry, SqlCostLedger

T0 = datetime(2026, 11, 29, 22, tzinfo=UTC)
COSTS = ["0.1", "0.2", "12345678901234567890.000000000000000000000001", "0.3", "0"]


def _record(ledger: SqlCostLedger) -> None:
    for index, cost in enumerate(COSTS):
        ledger.record(
            LedgerEntry(
                T0 + timedelta(hours=index),
                "chat",
                input_tokens=100 + index,
                output_tokens=10 * index,
                cost=Decimal(cost),
                model=None if index == 4 else ("gpt-4o", "claude")[index % 2],
                estimated=index % 2 == 1,
                surface="chat",
                scope="tenant-a" if index < 2 else None,
            )
        )


@pytest.fixture
def ledger_file(tmp_path: Path) -> Path:
    """A SQLite ledger file holding five entries over two UTC days."""
    path = tmp_path / "spend.db"
    ledger = SqlCostLedger(f"sqlite:///{path}")
    _record(ledger)
    ledger.close()
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_csv_parses_back_to_the_exact_report(
    ledger_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(
        ["spend", "--db", f"sqlite:///{ledger_file}", "--by", "model", "--format", "csv"], capsys
    )
    assert (code, err) == (0, "")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(row["model"], Decimal(row["cost"]), int(row["calls"])) for row in rows] == [
        ("gpt-4o", Decimal("12345678901234567890.100000000000000000000001"), 2),
        ("claude", Decimal("0.5"), 2),
        ("", Decimal("0"), 1),
    ]
    assert rows[1]["estimated_calls"] == "2"


def test_json_parses_back_to_the_exact_report_with_its_bounds(
    ledger_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["spend", "--db", f"sqlite:///{ledger_file}", "--format", "json"]
    code, out, _ = _run([*argv, "--since", "2026-11-30", "--until", "2026-11-30"], capsys)
    assert code == 0
    document = json.loads(out)
    assert document["since"] == "2026-11-30T00:00:00+00:00"
    assert document["until"] == "2026-12-01T00:00:00+00:00"  # a bare --until date is included
    assert [(row["key"], Decimal(row["cost"])) for row in document["rows"]] == [
        ("2026-11-30", Decimal("12345678901234567890.300000000000000000000001"))
    ]
    assert document["total"]["calls"] == 3


def test_scope_limits_the_report_to_that_scope(
    ledger_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["spend", "--db", f"sqlite:///{ledger_file}", "--scope", "tenant-a", "--format", "json"]
    code, out, _ = _run(argv, capsys)
    assert code == 0
    assert json.loads(out)["total"]["cost"] == "0.3"


def test_the_table_shows_every_digit_of_money_and_a_total(
    ledger_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(["spend", "--db", f"sqlite:///{ledger_file}", "--by", "scope"], capsys)
    assert code == 0
    assert "12345678901234567890.300000000000000000000001" in out
    assert "12345678901234567890.600000000000000000000001" in out  # the total
    assert "(unscoped)" in out


def test_without_rich_the_table_is_plain_aligned_text(
    ledger_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "rich.console", None)
    monkeypatch.setitem(sys.modules, "rich.table", None)
    code, out, _ = _run(["spend", "--db", f"sqlite:///{ledger_file}", "--by", "kind"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "Spend by kind"
    assert lines[1].split() == [
        "kind",
        "cost",
        "calls",
        "input",
        "tokens",
        "output",
        "tokens",
        "estimated",
    ]
    assert lines[3].split()[:3] == ["chat", "12345678901234567890.600000000000000000000001", "5"]
    assert lines[-1].split()[0] == "total"
    assert len({len(line) for line in lines[1:]}) == 1  # one width: aligned


#: Stored text that rich would read as markup or emoji codes, or a terminal as escapes.
ODD_SCOPES = ["[/x]", "[bold red]tenant-7[/]", ":thumbs_up:"]
ODD_MODELS = ["[link=https://example.invalid]gpt[/link]", "\x1b[31mred\x1b[0m", "left\u202eright"]
#: Stored text a spreadsheet would run as a formula (OWASP's first characters), and not;
#: a scope holds no tab or CR (no control character), a model may.
FORMULAS = ["=cmd|' /C calc'!A0", "+1", "-0.5", "@SUM(A1)", "\tx", "\rx", "a=b"]
#: Models that end a CSV row early unless quoted.
BREAKS = ["two\nlines", "carriage\rreturn"]


@pytest.fixture
def odd_ledger_file(tmp_path: Path) -> Path:
    """A SQLite ledger whose scopes and models are text no output may interpret."""
    path = tmp_path / "odd.db"
    ledger = SqlCostLedger(f"sqlite:///{path}")
    for scope, model in zip(ODD_SCOPES, ODD_MODELS, strict=True):
        ledger.record(LedgerEntry(T0, "chat", 1, 1, Decimal("0.5"), model=model, scope=scope))
    for text in FORMULAS:
        scope = None if text[0] in "\t\r" else text
        ledger.record(LedgerEntry(T0, "chat", 1, 1, Decimal("0.25"), model=text, scope=scope))
    for text in BREAKS:
        ledger.record(LedgerEntry(T0, "chat", 1, 1, Decimal("0.125"), model=text))
    ledger.close()
    return path


def _without_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("rich", "rich.console", "rich.table", "rich.text"):
        monkeypatch.setitem(sys.modules, name, None)


def test_a_scope_that_is_rich_markup_is_drawn_as_stored_by_the_console_script(
    odd_ledger_file: Path,
) -> None:
    script = Path(sys.executable).with_name("llm-resilience")
    result = subprocess.run(
        [str(script), "spend", "--db", f"sqlite:///{odd_ledger_file}", "--by", "scope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")  # was a MarkupError traceback
    for scope in ODD_SCOPES:
        assert f"│ {scope} " in result.stdout


@pytest.mark.parametrize("rich", [True, False], ids=["rich", "plain"])
def test_stored_text_in_every_cell_and_title_of_the_table_is_shown_as_stored(
    rich: bool,
    odd_ledger_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not rich:
        _without_rich(monkeypatch)
    db = ["spend", "--db", f"sqlite:///{odd_ledger_file}"]
    code, out, err = _run([*db, "--by", "model"], capsys)
    assert (code, err) == (0, "")
    assert "[link=https://example.invalid]gpt[/link]" in out  # not a hyperlink to "gpt"
    # Escape sequences and bidi controls appear as escapes, never reach the terminal.
    assert "\x1b" not in out
    assert "\u202e" not in out
    assert "\\x1b[31mred\\x1b[0m" in out
    assert "left\\u202eright" in out
    for scope in ODD_SCOPES:
        code, out, err = _run([*db, "--by", "scope", "--scope", scope], capsys)
        assert (code, err) == (0, "")
        assert f"Spend by scope, scope {scope}" in out  # the title
        assert scope in out.split("Spend by scope, scope", 1)[1].split("\n", 1)[1]  # a cell


def test_csv_cells_of_stored_text_that_start_like_a_formula_get_a_leading_quote(
    odd_ledger_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["spend", "--db", f"sqlite:///{odd_ledger_file}"]
    neutralised = {f"'{text}" for text in FORMULAS if text != "a=b"}
    code, out, _ = _run([*db, "--by", "model", "--format", "csv"], capsys)
    assert code == 0
    rows = {row["model"]: row for row in csv.DictReader(io.StringIO(out, newline=""))}
    assert set(rows) == {*ODD_MODELS, *BREAKS, "a=b", *neutralised}  # no row broken up
    # The numbers are ours and stay numbers.
    assert (rows["'=cmd|' /C calc'!A0"]["cost"], rows["'-0.5"]["calls"]) == ("0.25", "1")
    code, out, _ = _run([*db, "--by", "scope", "--format", "csv"], capsys)
    assert code == 0
    scopes = {row["scope"] for row in csv.DictReader(io.StringIO(out))}
    assert scopes == {*ODD_SCOPES, "a=b", "", *(s for s in neutralised if s[1] not in "\t\r")}
    code, out, _ = _run([*db, "--by", "model", "--format", "json"], capsys)
    assert code == 0
    # JSON is no spreadsheet: every key as stored.
    assert {row["key"] for row in json.loads(out)["rows"]} == {*ODD_MODELS, *FORMULAS, *BREAKS}


@pytest.mark.parametrize(
    ("option", "bound"),
    [("--until", "9999-12-31"), ("--since", "0001-01-01T00:00:00+01:00")],
)
def test_a_bound_past_the_open_end_of_time_is_no_bound(
    option: str, bound: str, ledger_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["spend", "--db", f"sqlite:///{ledger_file}", "--format", "json", option, bound]
    code, out, err = _run(argv, capsys)  # was an OverflowError traceback
    assert (code, err) == (0, "")
    document = json.loads(out)
    assert document[option[2:]] is None
    assert document["total"]["calls"] == len(COSTS)


@pytest.mark.parametrize(
    ("option", "bound", "said"),
    [
        ("--since", "9999-12-31T23:30:00-01:00", "after 9999-12-31"),
        ("--until", "0001-01-01T00:30:00+01:00", "before 0001-01-01 00:00"),
    ],
)
def test_a_bound_that_would_leave_out_all_of_time_is_a_usage_error(
    option: str, bound: str, said: str, ledger_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["spend", "--db", f"sqlite:///{ledger_file}", option, bound])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage:")
    assert err.splitlines()[-1].startswith(f"llm-resilience spend: error: argument {option}: ")
    assert said in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("scope", "said"),
    [
        ("", "expected a scope"),
        ("x" * 257, "at most 256 characters"),
        ("a\nb", "control character (U+000A)"),
        ("a\x00b", "control character (U+0000)"),
    ],
)
def test_a_scope_no_ledger_can_hold_is_a_usage_error_not_a_database_problem(
    scope: str, said: str, ledger_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:  # was exit 1, "cannot read" the database
        main(["spend", "--db", f"sqlite:///{ledger_file}", f"--scope={scope}"])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("llm-resilience spend: error: argument --scope: ")
    assert said in last


def test_a_missing_file_exits_1_with_one_line_and_is_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.db"
    code, out, err = _run(["spend", "--db", f"sqlite:///{missing}"], capsys)
    assert (code, out) == (1, "")
    assert err == f"llm-resilience spend: sqlite:///{missing}: no such file\n"
    assert not missing.exists()


def test_a_file_that_is_not_a_database_exits_1_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not SQLite " * 50)
    code, _, err = _run(["spend", "--db", f"sqlite:///{garbage}"], capsys)
    assert code == 1
    assert err.count("\n") == 1
    assert "file is not a database" in err
    assert "Traceback" not in err


def test_a_foreign_sqlite_database_is_refused_and_left_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    foreign = tmp_path / "app.db"
    with sqlite3.connect(foreign) as connection:
        connection.execute("CREATE TABLE users (id INTEGER)")
    code, _, err = _run(["spend", "--db", f"sqlite:///{foreign}"], capsys)
    assert code == 1
    assert err.endswith("not an llm-resilience ledger (no cost_ledger table)\n")
    with sqlite3.connect(foreign) as connection:
        tables = [name for (name,) in connection.execute("SELECT name FROM sqlite_master")]
    assert tables == ["users"]


def test_an_unreachable_server_exits_1_with_the_password_masked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "postgresql://app:hunter2@127.0.0.1:1/spend"
    code, _, err = _run(["spend", "--db", url], capsys)
    assert code == 1
    assert err.count("\n") == 1
    assert "postgresql://app:**********@127.0.0.1:1/spend" in err
    assert "hunter2" not in err


@pytest.mark.parametrize(
    "url", ["mysql://app:hunter2@db/spend", "not a url at all", "sqlite://", "sqlite:///:memory:"]
)
def test_a_url_that_names_no_ledger_file_or_server_is_a_usage_error(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(["spend", "--db", url], capsys)
    assert code == 2
    assert err.count("\n") == 1
    assert "hunter2" not in err


@pytest.mark.parametrize(
    "extra", [["--by", "week"], ["--since", "yesterday"], ["--format", "xml"], []]
)
def test_bad_options_exit_2_through_argparse(
    extra: list[str], ledger_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["spend", *extra] if not extra else ["spend", "--db", f"sqlite:///{ledger_file}", *extra]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["spend", "--help"])
    out = capsys.readouterr().out
    assert "0 report written, 1 database problem" in out
    assert "2 usage error" in out


@pytest.mark.postgres
def test_a_postgres_ledger_is_reported_and_an_empty_schema_is_not_written_to(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.engine import make_url

    admin = create_engine(postgres_url)
    names = [f"spend_cli_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    with admin.begin() as connection:
        for name in names:
            connection.exec_driver_sql(f"CREATE SCHEMA {name}")
    urls = [
        make_url(postgres_url)
        .update_query_dict({"options": f"-csearch_path={name}"})
        .render_as_string(hide_password=False)
        for name in names
    ]
    try:
        ledger = SqlCostLedger(urls[0])
        _record(ledger)
        ledger.close()
        code, out, _ = _run(["spend", "--db", urls[0], "--by", "month", "--format", "json"], capsys)
        assert code == 0
        assert json.loads(out)["rows"][0] == {
            "key": "2026-11",
            "cost": "12345678901234567890.600000000000000000000001",
            "calls": 5,
            "input_tokens": 510,
            "output_tokens": 100,
            "estimated_calls": 2,
        }
        code, _, err = _run(["spend", "--db", urls[1]], capsys)
        assert code == 1
        assert "no cost_ledger table" in err
        with admin.connect() as connection:
            assert inspect(connection).get_table_names(schema=names[1]) == []
    finally:
        with admin.begin() as connection:
            for name in names:
                connection.exec_driver_sql(f"DROP SCHEMA {name} CASCADE")
        admin.dispose()


def test_the_installed_console_script_writes_the_report(ledger_file: Path) -> None:
    script = Path(sys.executable).with_name("llm-resilience")
    result = subprocess.run(
        [str(script), "spend", "--db", f"sqlite:///{ledger_file}", "--format", "csv"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines() == [
        "day,cost,calls,input_tokens,output_tokens,estimated_calls",
        "2026-11-29,0.3,2,201,10,1",
        "2026-11-30,12345678901234567890.300000000000000000000001,3,309,90,1",
    ]


# -- agent runs and threads ---------------------------------------------------------------


@pytest.fixture
def runs_ledger_file(tmp_path: Path) -> Path:
    """Two runs of thread t-1, one run (named like a formula) of t-2, and a call outside."""
    path = tmp_path / "runs.db"
    ledger = SqlCostLedger(f"sqlite:///{path}")
    for index, (cost, run, thread) in enumerate(
        [
            ("0.1", "run-1", "t-1"),
            ("0.2", "run-1", "t-1"),
            ("0.000000000000000000000001", "run-2", "t-1"),
            ("7", '=HYPERLINK("x")', "t-2"),
            ("0.5", None, None),
        ]
    ):
        ledger.record(
            LedgerEntry(
                T0 + timedelta(minutes=index),
                "chat",
                cost=Decimal(cost),
                model="gpt-4o" if index < 2 else "claude",
                run_id=run,
                thread_id=thread,
            )
        )
    ledger.close()
    return path


def test_by_run_sums_each_agent_run_and_names_calls_outside_any(
    runs_ledger_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["spend", "--db", f"sqlite:///{runs_ledger_file}"]
    code, out, _ = _run([*db, "--by", "run", "--format", "json"], capsys)
    assert code == 0
    document = json.loads(out)
    assert document["by"] == "run"
    assert [(row["key"], Decimal(row["cost"]), row["calls"]) for row in document["rows"]] == [
        ('=HYPERLINK("x")', Decimal(7), 1),
        (None, Decimal("0.5"), 1),
        ("run-1", Decimal("0.3"), 2),
        ("run-2", Decimal("0.000000000000000000000001"), 1),
    ]
    code, out, _ = _run([*db, "--by", "run"], capsys)
    assert code == 0
    assert "(no run)" in out
    assert "Spend by run" in out
    assert "7.800000000000000000000001" in out  # the total, every digit


def test_run_and_thread_options_keep_one_runs_or_threads_entries(
    runs_ledger_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["spend", "--db", f"sqlite:///{runs_ledger_file}", "--format", "json"]
    code, out, _ = _run([*db, "--by", "model", "--run", "run-1"], capsys)
    assert code == 0
    document = json.loads(out)
    assert (document["run"], document["thread"]) == ("run-1", None)
    assert [(row["key"], row["cost"]) for row in document["rows"]] == [("gpt-4o", "0.3")]
    code, out, _ = _run([*db, "--by", "run", "--thread", "t-1"], capsys)
    assert code == 0
    document = json.loads(out)
    assert [row["key"] for row in document["rows"]] == ["run-1", "run-2"]
    assert document["total"]["cost"] == "0.300000000000000000000001"
    code, out, _ = _run(
        ["spend", "--db", f"sqlite:///{runs_ledger_file}", "--thread", "t-2"], capsys
    )
    assert code == 0
    assert "thread t-2" in out  # the table's title says the filter


def test_csv_by_run_or_thread_makes_an_id_that_starts_like_a_formula_inert(
    runs_ledger_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["spend", "--db", f"sqlite:///{runs_ledger_file}", "--format", "csv"]
    code, out, _ = _run([*db, "--by", "run"], capsys)
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {row["run"] for row in rows} == {'\'=HYPERLINK("x")', "", "run-1", "run-2"}
    code, out, _ = _run([*db, "--by", "thread", "--run", '=HYPERLINK("x")'], capsys)
    assert code == 0
    assert [(row["thread"], row["cost"]) for row in csv.DictReader(io.StringIO(out))] == [
        ("t-2", "7")
    ]


@pytest.mark.parametrize("option", ["--run", "--thread"])
def test_an_empty_or_unstorable_run_or_thread_is_a_usage_error(
    option: str, runs_ledger_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["spend", "--db", f"sqlite:///{runs_ledger_file}"]
    for value in ("", "x" * 257):
        with pytest.raises(SystemExit) as exited:
            main([*db, option, value])
        assert exited.value.code == 2
        assert option in capsys.readouterr().err
