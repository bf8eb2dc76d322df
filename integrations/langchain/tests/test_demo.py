"""``llm-resilience demo``: the offline outage demo runs, fails over and cleans up."""

from __future__ import annotations

import re
import socket
import threading

import pytest

from llm_resilience.cli import main


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
    assert "timed out after 0:00:00.500000 before streaming" in output
    assert "failed mid-stream after 3 token(s); restarting with next client." in output
    assert "restart event: dropping 3 chunk(s)" in output
    rows = [line for line in output.splitlines() if re.match(r"^\d  ", line)]
    assert len(rows) == 5
    assert "primary (gpt-4o-mini)" in rows[0]
    assert all("secondary (claude-haiku-4-5)" in row for row in rows[1:])
    # The consumer dropped the failed prefix on the restart event: the final answer is whole.
    assert (
        "= secondary (claude-haiku-4-5): Paris is the capital of France, served by the secondary."
        in output
    )
    assert "5 calls, 5 answered; 4 served by the secondary" in output
    leftover = [
        t
        for t in threading.enumerate()
        if t.ident not in threads_before and t.is_alive() and not t.daemon
    ]
    assert leftover == []


def test_the_cli_requires_a_command() -> None:
    with pytest.raises(SystemExit) as raised:
        main([])
    assert raised.value.code == 2
