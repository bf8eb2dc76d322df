"""``llm-resilience spend``: the spend report of a ledger database, as a table, CSV or JSON.

The core's one built-in command (`llm_resilience.cli` registers it). It only reads:
a SQLite file is checked to exist and opened read-only (``mode=ro``), a PostgreSQL
session is read-only (``default_transaction_read_only``), and a database that holds no
current ledger is reported, not created or migrated. Nothing ends in a traceback: a
failure to read is one line on stderr naming the URL with its password masked, and an
option argparse refuses is its usage and one line naming the option.

Stored text is data, never markup: the table shows it as stored (rich never reads it as
markup, unprintable characters appear as escapes), and csv puts a ``'`` before a key that
a spreadsheet would run as a formula.

SQLAlchemy loads when the command runs, ``rich`` (the ``cli`` extra) only to draw the
table, and without it the table is plain aligned text.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from datetime import UTC, date, datetime, timedelta
from typing import IO, Any

from llm_resilience import checks
from llm_resilience.redact import scrubbed
from llm_resilience.spend import GROUPINGS, SpendReport, SpendRow, spend_report

__all__ = ["EXIT_DATABASE", "EXIT_OK", "EXIT_USAGE", "configure", "run"]

#: The report was written.
EXIT_OK = 0
#: The database could not be read: missing or unreadable file, no ledger in it, a server
#: that does not answer, a timeout.
EXIT_DATABASE = 1
#: The command was used wrongly: an unknown option or value, a bad date, a scope no
#: ledger can hold, a URL that is not a SQLite or PostgreSQL database URL (argparse exits
#: 2 for its own errors too).
EXIT_USAGE = 2
FORMATS = ("table", "csv", "json")
_COLUMNS = ("cost", "calls", "input_tokens", "output_tokens", "estimated_calls")
_UNKNOWN = {"scope": "(unscoped)", "run": "(no run)", "thread": "(no thread)"}

HELP = (
    "report spend from a ledger database, by day, month, model, kind, surface, scope, "
    "agent run or thread"
)
EPILOG = """\
Dates are UTC: YYYY-MM-DD, or an ISO 8601 time (without an offset it is UTC).
--since is inclusive; --until is exclusive, except that a bare date includes that day
(--since 2026-11-01 --until 2026-11-30 is all of November).
--by run (or thread) sums each agent run's (conversation thread's) entries; --run R and
--thread T keep one run's or thread's entries (--by model --run R: what run R spent on
each model; --by run --thread T: what each run of thread T cost).
Money is exact: csv and json carry it as decimal text. The database is only read:
a missing SQLite file is not created.

Stored text shows as stored (unprintable characters as escapes such as \\x1b); in csv a
key that starts with = + - @, a tab or a CR gets a leading ' so that a spreadsheet does
not run it (json keeps every key as stored).

exit codes: 0 report written, 1 database problem (missing or unreadable file, not a
ledger, server down, timeout), 2 usage error (bad option, date, scope or URL)."""


class _Problem(Exception):
    """A failure to report as one line, with the exit code it means."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _moment(text: str, *, end_of_day: bool) -> datetime | None:
    """A bound in UTC, or None (no bound) for one past an end of the UTC times a
    ``datetime`` holds that leaves nothing out: a --since before 0001-01-01, an --until
    after 9999-12-31. One past an end that would leave everything out is refused."""
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            moment = datetime(day.year, day.month, day.day, tzinfo=UTC)
            if end_of_day:
                # A bare --until date includes its day; after 9999-12-31 there is none.
                return None if day == date.max else moment + timedelta(days=1)
            return moment
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a UTC date YYYY-MM-DD or an ISO 8601 time, got {text!r}"
        ) from None
    try:
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except OverflowError:
        # Only an offset moves a time past an end: east of UTC in year 1, west in 9999.
        offset = moment.utcoffset()
        early = offset is not None and offset > timedelta(0)
        if early != end_of_day:
            return None
        end = "before 0001-01-01 00:00, the first" if early else "after 9999-12-31, the last"
        raise argparse.ArgumentTypeError(
            f"{text!r} is {end} UTC time a ledger can hold: the report would be empty"
        ) from None


def _since(text: str) -> datetime | None:
    return _moment(text, end_of_day=False)


def _until(text: str) -> datetime | None:
    return _moment(text, end_of_day=True)


def _identifier(option: str, text: str) -> str:
    """A --scope, --run or --thread value: text a ledger can hold (as a scope)."""
    if not text:
        raise argparse.ArgumentTypeError(
            f"expected a {option}; leave --{option} out for every {option}"
        )
    try:
        checked = checks.scope(option, text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    assert checked is not None
    return checked


def _scope(text: str) -> str:
    return _identifier("scope", text)


def _run(text: str) -> str:
    return _identifier("run", text)


def _thread(text: str) -> str:
    return _identifier("thread", text)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``spend``'s options to its subparser."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "--db",
        required=True,
        metavar="URL",
        help="the ledger: sqlite:///spend.db or postgresql://user@host/db",
    )
    parser.add_argument("--by", choices=GROUPINGS, default="day", help="grouping (default: day)")
    parser.add_argument("--since", type=_since, metavar="DATE", help="first UTC date or time")
    parser.add_argument("--until", type=_until, metavar="DATE", help="last UTC date, or end time")
    parser.add_argument(
        "--scope", type=_scope, metavar="S", help="only this budget scope (default: all)"
    )
    parser.add_argument(
        "--run",
        type=_run,
        dest="run_id",  # ``run`` is the command's own entry point (cli.py)
        metavar="R",
        help="only this agent run's entries (default: all)",
    )
    parser.add_argument(
        "--thread",
        type=_thread,
        dest="thread_id",
        metavar="T",
        help="only this thread's entries (default: all)",
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="default: table")


def _read_only_url(url: str) -> str:
    """``url`` rewritten to open the database read-only; a SQLite file must exist."""
    from sqlalchemy import exc as sa_exc
    from sqlalchemy.engine import URL, make_url

    try:
        parsed = make_url(url)
    except (sa_exc.ArgumentError, ValueError):
        raise _Problem("not a database URL", EXIT_USAGE) from None
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        options = parsed.query.get("options", "")
        # Read-only sessions; the statement bound covers the schema check made before
        # the ledger opens (the ledger then sets its own).
        read_only = f"{options} -c default_transaction_read_only=on -c statement_timeout=5000"
        read_only = read_only.strip()
        return parsed.update_query_dict({"options": read_only}).render_as_string(
            hide_password=False
        )
    if backend != "sqlite":
        raise _Problem(
            f"a {parsed.drivername!r} URL; expected sqlite:///path.db or postgresql://...",
            EXIT_USAGE,
        )
    path = parsed.database
    if not path or path == ":memory:" or "mode" in parsed.query or "uri" in parsed.query:
        raise _Problem("expected the URL of a SQLite file, sqlite:///path/to/spend.db", EXIT_USAGE)
    if not os.path.exists(path):
        raise _Problem("no such file", EXIT_DATABASE)
    if not os.path.isfile(path):
        raise _Problem("not a file", EXIT_DATABASE)
    if not os.access(path, os.R_OK):
        raise _Problem("the file is not readable", EXIT_DATABASE)
    from urllib.parse import quote

    uri = f"file:{quote(os.path.abspath(path))}"
    sqlite_url = URL.create("sqlite", database=uri, query={"mode": "ro", "uri": "true"})
    return sqlite_url.render_as_string(hide_password=False)


def _check_ledger(url: str) -> None:
    """Refuse a database without a current ledger before the ledger would create one."""
    from sqlalchemy import create_engine, inspect

    from llm_resilience.ledger._schema import is_current

    postgres = url.startswith("postgresql")
    arguments: dict[str, Any] = {"connect_timeout": 5} if postgres else {"timeout": 5}
    engine = create_engine(url, connect_args=arguments)
    try:
        with engine.connect() as connection:
            if "cost_ledger" not in inspect(connection).get_table_names():
                raise _Problem("not an llm-resilience ledger (no cost_ledger table)", EXIT_DATABASE)
            if not is_current(connection):
                raise _Problem(
                    "a ledger of an older release: open it once with SqlCostLedger(url) "
                    "to migrate it, then report",
                    EXIT_DATABASE,
                )
    finally:
        engine.dispose()


def _reason(error: BaseException) -> str:
    """One line saying what went wrong, without parameters or a password."""
    cause = getattr(error, "orig", None) or error
    lines = str(cause).strip().splitlines()
    text = lines[0] if lines else ""
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__


def _report(url: str, arguments: argparse.Namespace) -> SpendReport:
    from llm_resilience.ledger import SqlCostLedger

    _check_ledger(url)
    ledger = SqlCostLedger(url)
    try:
        return spend_report(
            ledger,
            by=arguments.by,
            since=arguments.since,
            until=arguments.until,
            scope=arguments.scope,
            run=arguments.run_id,
            thread=arguments.thread_id,
        )
    finally:
        ledger.close()


def run(arguments: argparse.Namespace) -> int:
    """Write the report of ``arguments.db``; the exit code (see the module's constants)."""
    shown = scrubbed(arguments.db)
    try:
        url = _read_only_url(arguments.db)
        report = _report(url, arguments)
    except _Problem as problem:
        print(f"llm-resilience spend: {shown}: {problem}", file=sys.stderr)
        return problem.code
    except Exception as error:  # any failure to read: one line, never a traceback
        message = scrubbed(_reason(error))
        print(f"llm-resilience spend: cannot read {shown}: {message}", file=sys.stderr)
        return EXIT_DATABASE
    write = {"csv": _write_csv, "json": _write_json}.get(arguments.format, _write_table)
    write(report, sys.stdout)
    return EXIT_OK


def _row_fields(row: SpendRow) -> dict[str, Any]:
    return {
        "key": row.key,
        "cost": format(row.cost, "f"),
        "calls": row.calls,
        "input_tokens": row.input_tokens,
        "output_tokens": row.output_tokens,
        "estimated_calls": row.estimated_calls,
    }


def _write_json(report: SpendReport, out: IO[str]) -> None:
    """The report as one JSON object; money as decimal text, unknown keys as null."""
    document = {
        "by": report.by,
        "since": None if report.since is None else report.since.isoformat(),
        "until": None if report.until is None else report.until.isoformat(),
        "scope": report.scope,
        "run": report.run,
        "thread": report.thread,
        "rows": [_row_fields(row) for row in report.rows],
        "total": _row_fields(report.total),
    }
    json.dump(document, out, indent=2)
    out.write("\n")


#: First characters that make a spreadsheet read a cell as a formula (OWASP's list).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _inert(text: str) -> str:
    """A stored text cell a spreadsheet shows rather than runs: one that starts like a
    formula gets a leading ``'``, as OWASP's CSV-injection advice says."""
    return f"'{text}" if text.startswith(_FORMULA_STARTS) else text


def _write_csv(report: SpendReport, out: IO[str]) -> None:
    """One line per row, headed by the grouping's name; no total line (sum the rows).

    The key is stored text (a model, scope, run id, ...), so it is made inert (`_inert`);
    the numbers are ours and written as they are."""
    # Rows end in "\n"; each is formatted with "\r\n" first, because the csv module only
    # quotes a field that holds a character of its terminator: a bare CR must be quoted
    # too, or a reader splits the row there.
    line = io.StringIO()
    writer = csv.writer(line, lineterminator="\r\n")

    def write(cells: tuple[object, ...]) -> None:
        line.seek(0)
        line.truncate()
        writer.writerow(cells)
        out.write(line.getvalue()[:-2] + "\n")

    write((report.by, *_COLUMNS))
    for row in report.rows:
        fields = _row_fields(row)
        key = "" if row.key is None else _inert(row.key)
        write((key, *(fields[c] for c in _COLUMNS)))


def _shown(text: str) -> str:
    """Stored text for a terminal: as stored, except that characters that are not
    printable (escape sequences, newlines, bidi controls) appear as Python escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _cells(report: SpendReport, row: SpendRow, total: bool) -> list[str]:
    key = "total" if total else _shown(row.key or _UNKNOWN.get(report.by, "(unknown)"))
    return [
        key,
        format(row.cost, "f"),
        f"{row.calls:,}",
        f"{row.input_tokens:,}",
        f"{row.output_tokens:,}",
        f"{row.estimated_share:.0%}",
    ]


def _title(report: SpendReport) -> str:
    parts = [f"Spend by {report.by}"]
    if report.since is not None:
        parts.append(f"since {report.since:%Y-%m-%d %H:%M} UTC")
    if report.until is not None:
        parts.append(f"until {report.until:%Y-%m-%d %H:%M} UTC")
    if report.scope is not None:
        parts.append(f"scope {_shown(report.scope)}")
    if report.run is not None:
        parts.append(f"run {_shown(report.run)}")
    if report.thread is not None:
        parts.append(f"thread {_shown(report.thread)}")
    return ", ".join(parts)


def _write_table(report: SpendReport, out: IO[str]) -> None:
    """A table with a total line: drawn by ``rich`` when installed, else plain text."""
    headers = [report.by, "cost", "calls", "input tokens", "output tokens", "estimated"]
    body = [_cells(report, row, False) for row in report.rows]
    total = _cells(report, report.total, True)
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        _write_plain(_title(report), headers, body, total, out)
        return
    # Every string as Text: rich reads markup ("[/x]", "[link=...]") and emoji codes in a
    # plain str, and stored text must show as stored.
    table = Table(title=Text(_title(report)), show_footer=True)
    for index, header in enumerate(headers):
        # Fold, never truncate: a cut cost would be a wrong number.
        table.add_column(
            Text(header),
            footer=Text(total[index]),
            justify="left" if index == 0 else "right",
            overflow="fold",
        )
    for cells in body:
        table.add_row(*map(Text, cells))
    lines = [headers, *body, total]
    needed = sum(max(len(line[index]) for line in lines) + 3 for index in range(len(headers)))
    width = None if out.isatty() else max(80, needed + 1)
    Console(file=out, width=width, markup=False, emoji=False, highlight=False).print(table)


def _write_plain(
    title: str, headers: list[str], body: list[list[str]], total: list[str], out: IO[str]
) -> None:
    lines = [headers, *body, total]
    widths = [max(len(line[index]) for line in lines) for index in range(len(headers))]

    def render(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join((first, *rest)).rstrip()

    rule = "  ".join("-" * width for width in widths)
    out.write("\n".join((title, render(headers), rule, *map(render, body), rule, render(total))))
    out.write("\n")
