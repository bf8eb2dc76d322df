"""``llm-resilience demo`` without the ``demo`` extra: one line naming the extra, exit 2."""

from __future__ import annotations

import sys

import pytest

from llm_resilience.cli import main


@pytest.mark.parametrize("missing", ["langchain_anthropic", "langchain_openai"])
def test_demo_without_a_provider_client_prints_one_line_naming_the_extra(
    missing: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # import raises ModuleNotFoundError
    assert main(["demo"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert 'pip install "langchain-llm-resilience[demo]"' in lines[0]
    assert missing in lines[0]
    assert "Traceback" not in captured.err
