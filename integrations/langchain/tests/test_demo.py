"""``llm-resilience demo``: the offline outage demo runs the full stack and cleans up."""

from __future__ import annotations

import re
import socket
import threading
from collections import Counter
from pathlib import Path

import pytest

from llm_resilience.cli import main
from llm_resilience.ledger import SqlCostLedger


def spend_rows(output: str) -> dict[str, list[str]]:
    """The final spend table, by model: calls, input tokens, output tokens, cost."""
    table = output.split("Spend of this run, per model", 1)[1].splitlines()[3:]
    rows: dict[str, list[str]] = {}
    for line in table:
        model, *cells = line.split()
        rows[model] = cells
        if model == "total":
            return rows
    raise AssertionError("the spend table has no total row")


def test_the_demo_fails_over_on_every_injected_fault_and_leaves_nothing_listening(
    capsys: pytest.CaptureFixture[str],
) -> None:
    threads_before = {t.ident for t in threading.enumerate()}
    assert main(["demo"]) == 0
    output = capsys.readouterr().out

    ports = {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", output)}
    assert len(ports) == 2
    for port in ports:
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            pass

    assert "Client 0 failed transiently; trying next client." in output
    assert "timed out after 0:00:02 before streaming" in output
    assert "failed mid-stream after 3 token(s); restarting with next client." in output
    assert "consumer drops the 3 word(s) streamed before the restart" in output
    rows = [line for line in output.splitlines() if re.match(r"^\d  ", line)]
    assert len(rows) == 5
    assert "primary (gpt-4o-mini)" in rows[0]
    assert all("secondary (claude-haiku-4-5)" in row for row in rows[1:])
    # The consumer dropped the failed prefix on the restart: the final answer is whole.
    assert (
        "= secondary (claude-haiku-4-5): Paris is the capital of France, served by the secondary."
        in output
    )
    assert "5 calls, 5 answered; 4 served by the secondary" in output
    # The burst all answered, some after waiting for the rate limiter; the budget refused.
    assert "= 12 answered in" in output
    assert "x refused, no provider called: Spending limit reached" in output
    # Without --db the ledger lived in a temporary folder, gone now.
    (database,) = set(re.findall(r"ledger sqlite:///(\S+?\.db)", output))
    assert not Path(database).parent.exists()
    assert re.search(r"Finished in \d+\.\d s\.", output)
    leftover = [
        t
        for t in threading.enumerate()
        if t.ident not in threads_before and t.is_alive() and not t.daemon
    ]
    assert leftover == []


def test_the_demo_records_one_ledger_entry_per_answered_call_in_the_given_database(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'spend.db'}"

    assert main(["demo", "--db", url]) == 0

    output = capsys.readouterr().out
    counts = re.search(r"(\d+) calls answered and recorded .*?, (\d+) refused", output)
    assert counts is not None
    answered, refused = int(counts[1]), int(counts[2])
    assert refused == 1
    table = spend_rows(output)
    assert set(table) == {"gpt-4o-mini", "claude-haiku-4-5", "total"}
    assert table["claude-haiku-4-5"][0] == "4"  # the fallback member served the outage
    assert int(table["total"][0]) == answered
    ledger = SqlCostLedger(url)
    try:
        entries = ledger.entries()
    finally:
        ledger.close()
    assert len(entries) == answered
    assert len({entry.scope for entry in entries}) == 1
    calls = Counter(entry.model for entry in entries)
    assert calls["claude-haiku-4-5"] == 4
    assert calls["gpt-4o-mini"] == int(table["gpt-4o-mini"][0])
    assert str(sum(entry.cost for entry in entries)) == table["total"][-1]
    assert [p.name for p in tmp_path.iterdir()] == ["spend.db"]
    assert re.search(r"Finished in \d+\.\d s\.", output)


@pytest.mark.parametrize(
    "url", ["not a database url", "sqlite:////nonexistent-folder/spend.db"], ids=["url", "path"]
)
def test_an_unusable_db_url_is_reported_without_a_traceback(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    assert main(["demo", "--db", url]) == 2
    captured = capsys.readouterr()
    assert "cannot open the ledger" in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_the_cli_requires_a_command() -> None:
    with pytest.raises(SystemExit) as raised:
        main([])
    assert raised.value.code == 2
