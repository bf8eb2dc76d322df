"""Every Python sample in README.md and docs/*.md runs, offline.

A ```python block is a complete program: it is executed as it stands, in a fresh namespace
and a temporary working directory (samples that open ``sqlite:///spend.db`` write there).
Samples reach providers only through the local servers of ``llm_resilience.testing``.

A block that cannot run offline (it needs a real provider account, a PostgreSQL or Redis
server, or a client library that does not work with the installed SDKs) is marked on the
line before its fence with ``<!-- fragment: why -->``; it is only compiled, and the reason
is required so that a reader knows what to supply.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`]*)$")
_HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$")
_FRAGMENT = re.compile(r"^\s*<!--\s*fragment\s*(?::\s*(?P<reason>.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Sample:
    """One ```python block of a document."""

    document: str
    heading: str
    line: int
    source: str
    #: Why the sample only compiles; None for a complete program.
    fragment_reason: str | None

    @property
    def test_id(self) -> str:
        return f"{self.document} > {self.heading}"


def extract_samples(path: Path, root: Path = ROOT) -> Iterator[Sample]:
    """The ```python blocks of ``path``, each with the heading above it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    heading = "(top)"
    index = 0
    while index < len(lines):
        line = lines[index]
        fence = _FENCE.match(line)
        if fence is None:
            title = _HEADING.match(line)
            if title is not None:
                heading = title["title"].replace("`", "")
            index += 1
            continue
        start = index
        index += 1
        body: list[str] = []
        while index < len(lines) and not _FENCE.match(lines[index]):
            body.append(lines[index])
            index += 1
        index += 1  # the closing fence
        if fence["info"].strip() != "python":
            continue
        previous = next((text for text in reversed(lines[:start]) if text.strip()), "")
        marker = _FRAGMENT.match(previous)
        reason = None
        if marker is not None:
            reason = (marker["reason"] or "").strip()
        yield Sample(
            document=path.relative_to(root).as_posix(),
            heading=heading,
            line=start + 1,
            source=textwrap.dedent("\n".join(body)) + "\n",
            fragment_reason=reason,
        )


SAMPLES = [sample for path in DOCUMENTS for sample in extract_samples(path)]


def _ids(samples: list[Sample]) -> list[str]:
    """Test ids naming the file and heading, numbered when a heading has several samples."""
    counts: dict[str, int] = {}
    ids = []
    for sample in samples:
        counts[sample.test_id] = counts.get(sample.test_id, 0) + 1
        number = counts[sample.test_id]
        ids.append(sample.test_id if number == 1 else f"{sample.test_id} #{number}")
    return ids


PROGRAMS = [sample for sample in SAMPLES if sample.fragment_reason is None]
FRAGMENTS = [sample for sample in SAMPLES if sample.fragment_reason is not None]


@pytest.fixture
def isolated_globals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A scratch working directory, and LlamaIndex's global Settings put back afterwards."""
    monkeypatch.chdir(tmp_path)
    from llama_index.core import Settings

    saved = dict(vars(Settings))
    try:
        yield
    finally:
        vars(Settings).clear()
        vars(Settings).update(saved)


@pytest.mark.usefixtures("isolated_globals")
# Qdrant's in-memory mode, which the retry samples use, warns about a feature it skips.
@pytest.mark.filterwarnings("ignore:Payload indexes have no effect:UserWarning")
@pytest.mark.parametrize("sample", PROGRAMS, ids=_ids(PROGRAMS))
def test_documented_program_runs_offline(sample: Sample) -> None:
    code = compile(sample.source, f"{sample.document}:{sample.line}", "exec")
    exec(code, {"__name__": "__main__"})


@pytest.mark.parametrize("sample", FRAGMENTS, ids=_ids(FRAGMENTS))
def test_documented_fragment_compiles_and_says_why_it_cannot_run(sample: Sample) -> None:
    assert sample.fragment_reason, (
        f"{sample.document}:{sample.line}: say why the sample cannot run, "
        "as <!-- fragment: reason -->"
    )
    compile(sample.source, f"{sample.document}:{sample.line}", "exec")


def test_samples_are_collected_from_the_readme_and_the_guides() -> None:
    documents = {sample.document for sample in SAMPLES}
    assert "README.md" in documents
    assert "docs/getting-started.md" in documents
    assert "docs/fallback.md" in documents
    # Most samples run; fragments are the exception.
    assert len(PROGRAMS) > 2 * len(FRAGMENTS)


def test_extractor_reads_headings_indented_blocks_and_fragment_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n```python\nx = 1\n```\n\n## The `Section`\n\n"
        "- item\n\n  ```python\n  y = 2\n  ```\n\n"
        "<!-- fragment: needs a real database -->\n```python\nconnect()\n```\n"
        "```bash\nls\n```\n",
        encoding="utf-8",
    )
    samples = [(s.heading, s.source, s.fragment_reason) for s in extract_samples(page, tmp_path)]
    assert samples == [
        ("Title", "x = 1\n", None),
        ("The Section", "y = 2\n", None),
        ("The Section", "connect()\n", "needs a real database"),
    ]
