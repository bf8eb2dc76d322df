"""The three distributions as a new user gets them: built, checked, installed, run.

The module builds each distribution (sdist, then the wheel from the sdist, as PyPI users
get them) once, checks the metadata PyPI shows, then installs the wheels into one fresh
``python -m venv`` as a new user would (the core and the LangChain adapter, then the
extras and the LlamaIndex adapter on top) and runs the ``llm-resilience`` command there.

It needs ``build`` (and ``twine`` for the check), which the ``dev`` dependency group
installs; without them it skips, except under ``CI=true`` where it fails (deselect it with
``-m 'not packaging'``). Dependencies come from PyPI through pip's cache;
``LLM_RESILIENCE_WHEELHOUSE`` (default: a folder in the user's cache) keeps their wheels,
so later runs install without asking an index.
"""

from __future__ import annotations

import email.parser
import email.policy
import importlib.metadata
import os
import re
import subprocess
import sys
import time
import tomllib
import zipfile
from email.message import Message
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = {
    "llm-resilience": ROOT,
    "langchain-llm-resilience": ROOT / "integrations" / "langchain",
    "llama-index-resilience": ROOT / "integrations" / "llama-index",
}
URL = "https://github.com/llm-resilience/llm-resilience"
# Installing into the fresh venv from a filled wheelhouse must stay well inside this.
INSTALL_BUDGET_SECONDS = 90.0


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _require(distribution: str) -> None:
    # By distribution, not module: the repository's own build/ folder is importable as "build".
    if _installed(distribution):
        return
    reason = f"{distribution} is not installed (pip install --group dev)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}, and CI=true requires the packaging checks")
    pytest.skip(reason)


def _run(
    command: list[str], *, cwd: Path | None = None, timeout: float = 300, bytecode: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` without this venv's paths; ``bytecode`` lets it write ``.pyc`` files.

    The fresh venv's packages are installed uncompiled (``--no-compile``): its commands
    run with ``bytecode=True`` so that each module compiles once, on its first import, into
    the temporary venv, rather than on every command (LangChain alone takes seconds).
    """
    return subprocess.run(
        command,
        cwd=cwd,
        env=_env(bytecode=bytecode),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _env(*, bytecode: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _checked(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (
        f"{' '.join(result.args)} exited {result.returncode}\n"
        f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
    )
    return result


def _wheel_name(distribution: str) -> str:
    return distribution.replace("-", "_")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the sdist and wheel of each distribution, built in parallel."""
    _require("build")
    _require("setuptools")
    out = tmp_path_factory.mktemp("dist")
    started = time.monotonic()
    builds = {
        name: subprocess.Popen(
            # The dev group's setuptools (the build-system requirement): no isolated
            # environment to set up; `make dist` builds isolated, as a publisher would.
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, path in PROJECTS.items()
    }
    for name, process in builds.items():
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, f"building {name} failed:\n{output[-4000:]}"
        assert "cannot be found" not in output, f"building {name} warned:\n{output[-4000:]}"
    print(f"\nbuilt 3 sdists and wheels in {time.monotonic() - started:.1f} s")
    return out


def _wheel(dist: Path, distribution: str) -> Path:
    (wheel,) = dist.glob(f"{_wheel_name(distribution)}-*.whl")
    return wheel


def _metadata(wheel: Path) -> tuple[Message, set[str]]:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (path,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        text = archive.read(path).decode()
    return email.parser.Parser(policy=email.policy.compat32).parsestr(text), names


def test_each_adapter_ships_the_same_license_as_the_core() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License")
    assert "Copyright (c) 2026 The llm-resilience authors" in license_text
    for path in PROJECTS.values():
        assert (path / "LICENSE").read_text() == license_text, path
        project = tomllib.loads((path / "pyproject.toml").read_text())["project"]
        assert project["license"] == "MIT"
        assert project["license-files"] == ["LICENSE"]
        assert "dev" not in project.get("optional-dependencies", {}), "dev is published"


@pytest.mark.parametrize("distribution", list(PROJECTS))
def test_the_wheel_metadata_is_complete(dist: Path, distribution: str) -> None:
    metadata, names = _metadata(_wheel(dist, distribution))
    assert metadata["Name"] == distribution
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    assert metadata["Author"] == "The llm-resilience authors"
    assert "llm" in (metadata["Keywords"] or "").split(",")
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL") or [])
    assert set(urls) == {"Homepage", "Documentation", "Source", "Issues"}
    assert all(url.startswith(URL) for url in urls.values())

    classifiers = metadata.get_all("Classifier") or []
    for wanted in (
        "Development Status :: 3 - Alpha",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Typing :: Typed",
    ):
        assert wanted in classifiers
    if _installed("trove-classifiers"):
        from trove_classifiers import classifiers as known

        assert set(classifiers) <= known, set(classifiers) - known

    extras = set(metadata.get_all("Provides-Extra") or [])
    assert "dev" not in extras
    if distribution == "langchain-llm-resilience":
        assert "demo" in extras
    assert any(name.endswith("/py.typed") for name in names)

    assert metadata["Description-Content-Type"] == "text/markdown"
    description = metadata.get_payload()
    assert isinstance(description, str)
    assert len(description) > 500
    # Relative links break on PyPI: every link in the long description is absolute.
    links = re.findall(r"\]\(([^)]+)\)", description)
    assert links
    assert [link for link in links if not link.startswith("https://")] == []


def test_twine_check_strict_passes(dist: Path) -> None:
    _require("twine")
    files = sorted(str(path) for path in dist.iterdir())
    assert len(files) == 6
    result = _checked(_run([sys.executable, "-m", "twine", "check", "--strict", *files]))
    assert result.stdout.count("PASSED") == 6


def _wheelhouse() -> Path:
    configured = os.environ.get("LLM_RESILIENCE_WHEELHOUSE")
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "llm-resilience" / "wheelhouse"


def _pip_install(venv_python: Path, requirements: list[str]) -> bool:
    """Install into the fresh venv with this venv's pip; dependencies from the wheelhouse.

    A wheelhouse missing something is refilled from PyPI (through pip's cache) once;
    returns whether that was needed.
    """
    pip = [sys.executable, "-m", "pip", "--python", str(venv_python)]
    wheelhouse = _wheelhouse()
    wheelhouse.mkdir(parents=True, exist_ok=True)
    offline = [*pip, "install", "--no-compile", "--quiet", "--no-index"]
    result = _run([*offline, "--find-links", str(wheelhouse), *requirements])
    if result.returncode == 0:
        return False
    download = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(wheelhouse)]
    _checked(_run([*download, *requirements]))
    for ours in PROJECTS:  # our own wheels always come from this build, never the cache
        for stale in wheelhouse.glob(f"{_wheel_name(ours)}-*"):
            stale.unlink()
    _checked(_run([*offline, "--find-links", str(wheelhouse), *requirements]))
    return True


@pytest.mark.timeout(600)
def test_the_built_wheels_install_into_a_fresh_venv_demo_names_its_extra_until_installed(
    dist: Path, tmp_path: Path
) -> None:
    """One fresh venv, as a new user fills it: the core and the adapter, then the extras.

    First without the ``demo`` extra: ``llm-resilience demo`` prints one line naming it.
    Then with what that line names (and the core's ``cli`` extra and the LlamaIndex
    adapter) installed on top: every package imports from the venv and the CLI runs.
    """
    started = time.monotonic()
    venv = tmp_path / "venv"
    _checked(_run([sys.executable, "-m", "venv", "--without-pip", str(venv)]))
    python = venv / "bin" / "python"
    cli = str(venv / "bin" / "llm-resilience")
    adapter = _wheel(dist, "langchain-llm-resilience")

    downloaded = _pip_install(python, [str(_wheel(dist, "llm-resilience")), str(adapter)])
    installed = time.monotonic() - started
    result = _run([cli, "demo"], cwd=tmp_path, bytecode=True)
    assert result.returncode == 2, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert 'pip install "langchain-llm-resilience[demo]"' in lines[0]
    # The agent middlewares need langchain (the agents extra); the wrappers do not.
    middleware = _run(
        [str(python), "-c", "from langchain_llm_resilience import BudgetMiddleware"],
        cwd=tmp_path,
        bytecode=True,
    )
    assert middleware.returncode == 1, middleware
    assert "langchain-llm-resilience[agents]" in middleware.stderr, middleware.stderr

    core_extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get(
        "optional-dependencies", {}
    )
    core = str(_wheel(dist, "llm-resilience")) + ("[cli]" if "cli" in core_extras else "")
    requirements = [
        core,
        f"{adapter}[demo,agents]",
        str(_wheel(dist, "llama-index-resilience")),
    ]
    resumed = time.monotonic()
    downloaded = _pip_install(python, requirements) or downloaded
    installed += time.monotonic() - resumed

    # The demo spends most of its ten seconds waiting (a hang, the rate limiter): the
    # other checks run meanwhile.
    demo = subprocess.Popen(
        [cli, "demo"],
        cwd=tmp_path,
        env=_env(bytecode=True),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _other_cli_checks(python, venv, cli, tmp_path)
        demo_out, demo_err = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()
    _checked(subprocess.CompletedProcess(demo.args, demo.returncode, demo_out, demo_err))
    assert "served by the secondary" in demo_out, demo_out[-4000:]
    print(
        f"\nfresh venv: installed in {installed:.1f} s, "
        f"all checks in {time.monotonic() - started:.1f} s"
    )
    if not downloaded:  # a first run on a new machine also fills the wheelhouse from PyPI
        assert installed < INSTALL_BUDGET_SECONDS


def _other_cli_checks(python: Path, venv: Path, cli: str, tmp_path: Path) -> None:
    """Every package imports from the venv; the CLI's help lists demo (and spend's)."""
    probe = _checked(
        _run(
            [
                str(python),
                "-c",
                "import llm_resilience, langchain_llm_resilience, llama_index.resilience as li;"
                "from langchain_llm_resilience import BudgetMiddleware;"
                "print(llm_resilience.__file__, langchain_llm_resilience.__file__, li.__file__)",
            ],
            cwd=tmp_path,
            bytecode=True,
        )
    )
    assert all(path.startswith(str(venv)) for path in probe.stdout.split()), probe.stdout

    usage = _checked(_run([cli, "--help"], cwd=tmp_path, bytecode=True)).stdout
    assert "demo" in usage
    if re.search(r"^\s+spend\b", usage, re.MULTILINE):  # once the core registers it
        spend = _checked(_run([cli, "spend", "--help"], cwd=tmp_path, bytecode=True)).stdout
        assert "--db" in spend
