"""The architecture's import contracts (``[tool.importlinter]`` in pyproject.toml) hold, and
each can fail: every contract is broken here by one deliberate wrong import in a copy of
the tree, and ``lint-imports`` must report that contract broken (importing the face breaks
the layers too: the face imports every layer)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

#: Where each root package lives, relative to the repository.
PACKAGES = {
    "src": ROOT / "src" / "llm_resilience",
    "langchain": ROOT / "integrations" / "langchain" / "langchain_llm_resilience",
    "llama-index": ROOT / "integrations" / "llama-index" / "llama_index" / "resilience",
}

#: One wrong import per case: (contract id, file relative to the copied tree, the line added).
WRONG_IMPORTS = [
    # Storage reaching up into a policy.
    ("core-layers", "src/llm_resilience/ledger/_memory.py", "import llm_resilience.budget"),
    # The bottom layer reaching up.
    ("core-layers", "src/llm_resilience/checks.py", "import llm_resilience.money"),
    # A circle inside one package, which no layer sees.
    (
        "core-acyclic",
        "src/llm_resilience/ledger/_protocol.py",
        "import llm_resilience.ledger._memory",
    ),
    # As telemetry.py once did, for __version__.
    ("core-face-on-top", "src/llm_resilience/telemetry.py", "import llm_resilience"),
    (
        "adapters-independent",
        "langchain/langchain_llm_resilience/cost.py",
        "import llama_index.resilience.cost",
    ),
    ("core-framework-free", "src/llm_resilience/transient.py", "import openai"),
    ("core-framework-free", "src/llm_resilience/budget/_gate.py", "import langchain_core"),
    ("core-framework-free", "src/llm_resilience/self_retry.py", "from google import genai"),
    ("core-framework-free", "src/llm_resilience/usage.py", "import llama_index.resilience"),
    ("core-without-llama-index", "src/llm_resilience/tokens.py", "import llama_index.core"),
    (
        "core-without-llama-index",
        "src/llm_resilience/layers.py",
        "from llama_index.core.llms import LLM",
    ),
    (
        "adapters-public-core",
        "llama-index/llama_index/resilience/retry.py",
        "import llm_resilience.ledger._protocol",
    ),
    (
        "adapters-public-core",
        "langchain/langchain_llm_resilience/retry.py",
        "import llm_resilience._warned",
    ),
]


def _contracts() -> dict[str, str]:
    """Each contract's id and the name ``lint-imports`` reports it by."""
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return {contract["id"]: contract["name"] for contract in config["contracts"]}


def _copy_tree(destination: Path) -> dict[str, Path]:
    """The three root packages copied under ``destination``; the path entry of each."""
    entries = {}
    for key, package in PACKAGES.items():
        entry = destination / key
        target = entry / package.relative_to(package.parents[1 if key == "llama-index" else 0])
        shutil.copytree(package, target, ignore=shutil.ignore_patterns("__pycache__"))
        entries[key] = entry
    return entries


def _lint(entries: dict[str, Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = dict(os.environ)
    # The copies come first on the path, before the installed (editable) packages.
    environment["PYTHONPATH"] = os.pathsep.join(str(entry) for entry in entries.values())
    return subprocess.run(
        [str(LINT_IMPORTS), str(PYPROJECT), "--no-cache"],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _broken(output: str, contracts: dict[str, str]) -> set[str]:
    return {
        contract_id
        for contract_id, name in contracts.items()
        if re.search(rf"^{re.escape(name)} BROKEN\b", output, re.MULTILINE)
    }


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = _lint(_copy_tree(tmp_path), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(_contracts())} kept, 0 broken." in result.stdout


def test_every_contract_has_a_wrong_import_that_breaks_it() -> None:
    assert {contract_id for contract_id, _, _ in WRONG_IMPORTS} == set(_contracts())


@pytest.mark.parametrize(
    ("contract_id", "path", "line"),
    WRONG_IMPORTS,
    ids=[f"{contract_id}:{line}" for contract_id, _, line in WRONG_IMPORTS],
)
def test_one_wrong_import_breaks_its_contract(
    tmp_path: Path, contract_id: str, path: str, line: str
) -> None:
    entries = _copy_tree(tmp_path)
    changed = tmp_path / path
    changed.write_text(changed.read_text() + f"\n{line}\n")

    result = _lint(entries, tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert contract_id in _broken(result.stdout, _contracts()), result.stdout
