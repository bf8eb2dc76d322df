"""The API reference renders our docstrings as written: no Sphinx markup left raw.

Docstrings are Google style with Markdown text (mkdocs.yml: ``docstring_style: google``,
``scoped_crossrefs``). The site is built once, strict, into a temporary directory, and
the rendered reference pages are read as a reader sees them: a Sphinx role
(``:class:`Foo```) or directive (``.. note::``) would show as its raw text, a reST literal
paragraph as a sentence ending in ``::``, and a ``>>>`` example outside a code block as
blockquotes nested three deep (Markdown reads each ``>`` as one level).
"""

from __future__ import annotations

import os
import posixpath
import re
import subprocess
import sys
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_PAGES = sorted(path.stem for path in (ROOT / "docs" / "reference").glob("*.md"))

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|exc|data|obj|ref|const|any):")
_DIRECTIVE = re.compile(r"\.\. [\w-]+::")
_UNPARSED_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Yields|Raises|Examples):")
_UNRESOLVED_REF = re.compile(r"\[[^\]\n]*\]\[[^\]\n]*\]")
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source"}


@dataclass
class Page:
    """What a reader sees of one rendered page."""

    #: Text outside <pre> and <code>: where raw markup would show.
    prose: list[str] = field(default_factory=list)
    #: The text of each <p>, code included.
    paragraphs: list[str] = field(default_factory=list)
    #: The deepest nesting of <blockquote> elements.
    blockquote_depth: int = 0
    #: hrefs of the cross-references autorefs resolved.
    crossrefs: list[str] = field(default_factory=list)
    #: Every element id.
    ids: set[str] = field(default_factory=set)
    #: Docstring sections mkdocstrings parsed (Examples:, Args:, ...).
    section_titles: list[str] = field(default_factory=list)


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self._open: list[str] = []
        self._paragraph: list[str] | None = None
        self._section_title: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if attributes.get("id"):
            self.page.ids.add(str(attributes["id"]))
        classes = (attributes.get("class") or "").split()
        if tag == "a" and "autorefs-internal" in classes:
            self.page.crossrefs.append(str(attributes.get("href")))
        if tag in _VOID:
            return
        self._open.append(tag)
        if tag == "blockquote":
            depth = self._open.count("blockquote")
            self.page.blockquote_depth = max(self.page.blockquote_depth, depth)
        if tag == "p":
            self._paragraph = []
        if tag == "span" and "doc-section-title" in classes:
            self._section_title = []

    def handle_endtag(self, tag: str) -> None:
        if tag not in self._open:
            return
        while self._open and self._open.pop() != tag:
            pass
        if tag == "p" and self._paragraph is not None:
            self.page.paragraphs.append("".join(self._paragraph).strip())
            self._paragraph = None
        if tag in ("span", "p") and self._section_title is not None:
            self.page.section_titles.append("".join(self._section_title).strip())
            self._section_title = None

    def handle_data(self, data: str) -> None:
        if self._paragraph is not None:
            self._paragraph.append(data)
        if self._section_title is not None:
            self._section_title.append(data)
        if "pre" not in self._open and "code" not in self._open:
            self.page.prose.append(data)


def _read(path: Path) -> Page:
    reader = _Reader()
    reader.feed(path.read_text(encoding="utf-8"))
    reader.close()
    return reader.page


@dataclass(frozen=True)
class Build:
    site: Path
    returncode: int
    warnings: list[str]


#: Set by ``make test``, which runs ``make docs`` (a strict build) before the suite: that
#: site is read instead of building the same one again.
PREBUILT_SITE = "LLM_RESILIENCE_DOCS_SITE"
#: What the site is built from: a prebuilt site older than any of these is not used.
SOURCES = ("mkdocs.yml", "docs", "src", "integrations/langchain", "integrations/llama-index")


_NOT_SOURCES = {"__pycache__", "build", ".venv", ".ipynb_checkpoints"}


def _newest_source() -> float:
    newest = 0.0
    for name in SOURCES:
        path = ROOT / name
        for file in [path] if path.is_file() else path.rglob("*"):
            parts = set(file.relative_to(ROOT).parts)
            if parts & _NOT_SOURCES or any(part.endswith(".egg-info") for part in parts):
                continue
            if file.is_file():
                newest = max(newest, file.stat().st_mtime)
    return newest


def _prebuilt() -> Build | None:
    """The site ``make docs`` just built strict, if named and newer than all it renders.

    A strict build fails on any warning and ``make test`` stops there, so a site it
    leaves behind had none and built with exit status 0.
    """
    configured = os.environ.get(PREBUILT_SITE)
    if not configured:
        return None
    site = ROOT / configured
    index = site / "index.html"
    if not index.is_file() or index.stat().st_mtime < _newest_source():
        return None
    return Build(site, 0, [])


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """The docs site, built once into a temporary directory, its warnings kept.

    Built with ``--no-strict`` so that a warning fails one test, which names it, while
    the other tests still read the pages; ``make docs`` builds strict, and the first test
    holds the build to that. Under ``make test`` the site ``make docs`` built just before
    is read instead (see `_prebuilt`).
    """
    prebuilt = _prebuilt()
    if prebuilt is not None:
        return prebuilt
    site_dir = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--no-strict", "--site-dir", str(site_dir)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (site_dir / "reference").is_dir(), f"mkdocs build failed:\n{result.stderr[-3000:]}"
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    return Build(site_dir, result.returncode, warnings)


@pytest.fixture(scope="module")
def site(build: Build) -> Path:
    return build.site


@pytest.fixture(scope="module")
def reference(site: Path) -> dict[str, Page]:
    return {name: _read(site / "reference" / name / "index.html") for name in REFERENCE_PAGES}


def test_the_site_builds_without_a_warning_as_make_docs_strict_requires(build: Build) -> None:
    assert build.returncode == 0
    assert build.warnings == []


def test_the_site_builds_strict_with_every_reference_page(reference: dict[str, Page]) -> None:
    assert set(reference) >= {"core", "langchain", "llama-index", "testing", "adapter-kit"}


@pytest.mark.parametrize("name", REFERENCE_PAGES)
def test_reference_page_shows_no_sphinx_role_or_directive(
    reference: dict[str, Page], name: str
) -> None:
    text = "".join(reference[name].prose)
    roles = sorted({match[0] for match in _ROLE.finditer(text)})
    directives = sorted({match[0] for match in _DIRECTIVE.finditer(text)})
    assert roles == [], f"raw Sphinx roles on reference/{name}: {roles}"
    assert directives == [], f"raw reST directives on reference/{name}: {directives}"


@pytest.mark.parametrize("name", REFERENCE_PAGES)
def test_reference_page_has_no_paragraph_ending_in_a_literal_block_marker(
    reference: dict[str, Page], name: str
) -> None:
    literal = [p[-80:] for p in reference[name].paragraphs if p.endswith("::")]
    assert literal == [], f"reST '::' paragraphs on reference/{name}: {literal}"


@pytest.mark.parametrize("name", REFERENCE_PAGES)
def test_reference_page_shows_doctest_examples_as_code_not_blockquotes(
    reference: dict[str, Page], name: str
) -> None:
    page = reference[name]
    # ">>> x" outside a code block is three nested blockquotes; our docstrings quote nothing.
    assert page.blockquote_depth == 0, f"blockquotes on reference/{name} (a '>>>' example?)"
    prompts = [chunk.strip()[:80] for chunk in page.prose if ">>>" in chunk]
    assert prompts == [], f"'>>>' outside code on reference/{name}: {prompts}"


@pytest.mark.parametrize("name", REFERENCE_PAGES)
def test_reference_page_has_no_unresolved_link_or_unparsed_section(
    reference: dict[str, Page], name: str
) -> None:
    page = reference[name]
    text = "".join(page.prose)
    unresolved = _UNRESOLVED_REF.findall(text)
    assert unresolved == [], f"cross-references left as text on reference/{name}: {unresolved}"
    unparsed = [
        p[:80]
        for p in page.paragraphs
        if _UNPARSED_SECTION.match(p) and p not in page.section_titles
    ]
    assert unparsed == [], f"docstring sections rendered as text on reference/{name}: {unparsed}"


def test_examples_render_as_parsed_docstring_sections(reference: dict[str, Page]) -> None:
    titles = [title for page in reference.values() for title in page.section_titles]
    assert titles.count("Examples:") >= 50


def test_cross_references_land_on_object_headings_that_exist(
    site: Path, reference: dict[str, Page]
) -> None:
    ids_by_page: dict[str, set[str]] = {}
    links = 0
    dangling = []
    for name, page in reference.items():
        for href in page.crossrefs:
            target, _, anchor = href.partition("#")
            path = posixpath.normpath(posixpath.join(f"reference/{name}/", target or "."))
            if path not in ids_by_page:
                ids_by_page[path] = _read(site / path / "index.html").ids
            links += 1
            if not anchor or anchor not in ids_by_page[path]:
                dangling.append(f"reference/{name}: {href}")
    assert dangling == []
    # Docstrings link the objects they name: the core's page alone links dozens.
    assert links >= 100
    assert any("#llm_resilience." in href for href in reference["langchain"].crossrefs)
