"""``docs/providers.md`` is written from the matrix's cases, so it says what the tests prove."""

from __future__ import annotations

from provider_cases import COLUMNS, cells
from provider_surfaces import ROWS
from render_providers import COMMAND, PAGE, render


def test_the_providers_page_is_what_the_generator_writes_from_the_cases() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), (
        f"docs/providers.md is stale: run {COMMAND}"
    )


def test_every_row_and_failure_of_the_matrix_appears_on_the_page() -> None:
    page = render()
    for row in ROWS:
        assert f"`{row.client}`" in page
    for column in COLUMNS:
        assert f"| {column.title} |" in page
    assert f"{len(cells()) * 2} tests run the sync paths" in page
