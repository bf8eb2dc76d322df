"""``llm-resilience``: commands come from entry points; the core imports no adapter."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable

import pytest

from llm_resilience.cli import Command, main


def test_importing_the_core_and_its_cli_imports_no_adapter_or_framework() -> None:
    probe = (
        "import sys, llm_resilience, llm_resilience.cli\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'langchain_llm_resilience', 'langchain_core', 'langchain', 'llama_index'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


def test_demo_without_the_adapter_prints_a_one_line_install_hint_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo"], commands={}) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert 'pip install "langchain-llm-resilience[demo]"' in lines[0]
    assert "Traceback" not in captured.err


def test_help_lists_demo_even_when_its_package_is_missing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["--help"], commands={})
    assert raised.value.code == 0
    assert "demo" in capsys.readouterr().out


def test_a_registered_command_runs_with_its_own_arguments() -> None:
    seen: list[str] = []

    def configure(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--name", required=True)

    def run(arguments: argparse.Namespace) -> int:
        seen.append(arguments.name)
        return 0

    command = Command(help="greet", run=run, configure=configure)
    assert main(["greet", "--name", "ada"], commands={"greet": lambda: command}) == 0
    assert seen == ["ada"]


def test_only_the_command_that_runs_is_imported() -> None:
    def must_not_load() -> object:
        raise AssertionError("a command that is not run was imported")

    table: dict[str, Callable[[], object]] = {
        "demo": must_not_load,
        "ok": lambda: Command(help="ok", run=lambda _: 0),
    }
    assert main(["ok"], commands=table) == 0


def test_a_command_whose_package_fails_to_import_prints_a_hint_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def broken() -> object:
        raise ModuleNotFoundError("No module named 'langchain_core'")

    assert main(["demo"], commands={"demo": broken}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "langchain_core" in err
    assert 'pip install "langchain-llm-resilience[demo]"' in err


def test_an_entry_point_that_is_not_a_command_is_refused_with_a_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["odd"], commands={"odd": lambda: "not a command"}) == 2
    assert "not a Command" in capsys.readouterr().err
