"""The spend plots: what each figure shows is the exact spend, rendered without pyplot."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from io import BytesIO

import pytest

pytest.importorskip("matplotlib")

from matplotlib.dates import num2date
from matplotlib.figure import Figure

from llm_resilience.budget import CostBudget
from llm_resilience.ledger import LedgerEntry
from llm_resilience.money import exact_sum
from llm_resilience.plots import (
    UNKNOWN_MODEL,
    plot_daily_spend,
    plot_month_to_date,
    plot_token_mix,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _at(day: int, hour: int = 12) -> datetime:
    return datetime(2026, 11, day, hour, tzinfo=UTC)


def _entries() -> list[LedgerEntry]:
    return [
        LedgerEntry(_at(2, 9), "chat", 1000, 200, Decimal("0.1"), model="gpt-4o"),
        LedgerEntry(_at(2, 10), "chat", 500, 100, Decimal("0.2"), model="gpt-4o"),
        LedgerEntry(_at(2, 11), "chat", 3000, 50, Decimal("0.03"), model="claude-haiku"),
        # Day 3 has no spend: it must still be on the axis, as a gap.
        LedgerEntry(_at(4, 8), "chat", 2000, 400, Decimal("0.7"), model="gpt-4o"),
        LedgerEntry(_at(4, 23), "ocr", pages=10, cost=Decimal("0.015")),
        # Another month: left out of November's month-to-date.
        LedgerEntry(datetime(2026, 10, 31, 23, tzinfo=UTC), "chat", 1, 1, Decimal("5")),
    ]


def _png(figure: Figure) -> bytes:
    buffer = BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _bar_days(container: object) -> list[date]:
    return [
        num2date(patch.get_x() + patch.get_width() / 2).date()
        for patch in container.patches  # type: ignore[attr-defined]
    ]


def test_daily_spend_stacks_each_models_exact_day_sum_and_draws_the_daily_limit() -> None:
    entries = [entry for entry in _entries() if entry.timestamp.month == 11]
    figure = plot_daily_spend(entries, budget=CostBudget(daily_limit="0.75"))

    assert _png(figure).startswith(PNG_SIGNATURE)
    axes = figure.axes[0]
    bars = {container.get_label(): container for container in axes.containers}
    # Largest total at the bottom: gpt-4o (1.0), claude-haiku (0.03), the unnamed OCR job.
    assert list(bars) == ["gpt-4o", "claude-haiku", UNKNOWN_MODEL]
    days = [date(2026, 11, 2), date(2026, 11, 3), date(2026, 11, 4)]
    below = [Decimal(0)] * len(days)
    for model, container in bars.items():
        assert _bar_days(container) == days
        sums = [
            exact_sum(
                e.cost
                for e in entries
                if (e.model or UNKNOWN_MODEL) == model and e.timestamp.date() == day
            )
            for day in days
        ]
        # Each bar starts at the exact spend of the models below it, as a float ...
        assert [patch.get_y() for patch in container.patches] == [float(b) for b in below]
        # ... and matplotlib stores its height as (bottom + height) - bottom: one rounding.
        heights = [patch.get_height() for patch in container.patches]
        assert heights == pytest.approx([float(amount) for amount in sums], rel=1e-12, abs=1e-18)
        below = [exact_sum(pair) for pair in zip(below, sums, strict=True)]
    # The stacked OCR bar of the 4th sits on gpt-4o's 0.7 (claude-haiku has 0 that day).
    assert bars[UNKNOWN_MODEL].patches[2].get_y() == 0.7
    assert below == [Decimal("0.33"), Decimal(0), Decimal("0.715")]
    (limit_line,) = axes.lines
    assert list(limit_line.get_ydata()) == [0.75, 0.75]
    assert limit_line.get_label() == "daily limit 0.75"
    # Headroom above the taller of the highest day and the limit, so neither is cut off.
    assert axes.get_ylim() == (0.0, 0.75 * 1.08)


def test_daily_spend_without_a_budget_or_a_daily_limit_draws_no_line() -> None:
    entries = _entries()

    without = plot_daily_spend(entries).axes[0]
    assert len(without.lines) == 0
    assert without.get_ylim()[1] == 5.0 * 1.08  # October's 5, the tallest day
    monthly_only = CostBudget(monthly_limit=100)
    assert len(plot_daily_spend(entries, budget=monthly_only).axes[0].lines) == 0


def test_month_to_date_is_the_running_exact_sum_of_the_month_against_its_limit() -> None:
    figure = plot_month_to_date(_entries(), budget=CostBudget(monthly_limit=2), month="2026-11")

    assert _png(figure).startswith(PNG_SIGNATURE)
    axes = figure.axes[0]
    spent, limit_line = axes.lines
    # From 0 at midnight on the 1st to the end (next midnight) of each day up to the 4th.
    assert [num2date(x).date() for x in spent.get_xdata()] == [
        date(2026, 11, day) for day in (1, 2, 3, 4, 5)
    ]
    assert list(spent.get_ydata()) == [0.0, 0.0, 0.33, 0.33, float(Decimal("1.045"))]
    assert spent.get_label() == "spent 1.045"
    assert list(limit_line.get_ydata()) == [2.0, 2.0]
    assert limit_line.get_label() == "monthly limit 2"
    # The axis spans the whole month, so the room left under the limit shows.
    low, high = axes.get_xlim()
    assert (num2date(low).date(), num2date(high).date()) == (date(2026, 11, 1), date(2026, 12, 1))


def test_month_to_date_defaults_to_the_month_of_the_latest_entry() -> None:
    october = [entry for entry in _entries() if entry.timestamp.month == 10]
    figure = plot_month_to_date([*october, _entries()[0]])
    assert figure.axes[0].get_title() == "Month to date, 2026-11 (UTC)"

    figure = plot_month_to_date(_entries(), month=date(2026, 10, 15))
    (spent,) = figure.axes[0].lines
    assert spent.get_ydata()[-1] == 5.0
    assert len(spent.get_ydata()) == 1 + 31  # the start, then the end of each day


def test_month_to_date_names_the_month_option_when_it_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"month must be 'YYYY-MM' text .*'November'"):
        plot_month_to_date(_entries(), month="November")
    with pytest.raises(TypeError, match="month must be 'YYYY-MM' text, a date or None"):
        plot_month_to_date(_entries(), month=202611)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="month must be timezone-aware"):
        plot_month_to_date(_entries(), month=datetime(2026, 11, 1))


def test_token_mix_shows_input_and_output_tokens_per_model_and_skips_per_page_kinds() -> None:
    figure = plot_token_mix(_entries())

    assert _png(figure).startswith(PNG_SIGNATURE)
    axes = figure.axes[0]
    inputs, outputs = axes.containers
    assert (inputs.get_label(), outputs.get_label()) == ("input", "output")
    labels = [label.get_text() for label in axes.get_xticklabels()]
    # The OCR entry has no tokens; the October call has a model of None and 2 tokens.
    assert labels == ["gpt-4o", "claude-haiku", UNKNOWN_MODEL]
    assert [patch.get_height() for patch in inputs.patches] == [3500.0, 3000.0, 1.0]
    assert [patch.get_height() for patch in outputs.patches] == [700.0, 50.0, 1.0]


def test_no_entries_still_render_an_empty_figure() -> None:
    for figure in (plot_daily_spend([]), plot_month_to_date([]), plot_token_mix([])):
        assert _png(figure).startswith(PNG_SIGNATURE)
        assert len(figure.axes[0].patches) == 0


def test_the_plots_refuse_what_is_not_entries_or_a_budget_by_name() -> None:
    with pytest.raises(TypeError, match="entries must be an iterable of LedgerEntry"):
        plot_token_mix([{"model": "gpt-4o"}])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="budget must be a CostBudget or None"):
        plot_daily_spend(_entries(), budget=Decimal(25))  # type: ignore[arg-type]


def test_plotting_never_selects_a_pyplot_backend() -> None:
    code = (
        "import sys\n"
        "from datetime import UTC, datetime\n"
        "from decimal import Decimal\n"
        "from llm_resilience.ledger import LedgerEntry\n"
        "from llm_resilience.plots import plot_daily_spend\n"
        "e = LedgerEntry(datetime(2026, 11, 2, tzinfo=UTC), 'chat', cost=Decimal('1'))\n"
        "plot_daily_spend([e]).savefig(sys.argv[1] if len(sys.argv) > 1 else '/dev/null',"
        " format='png')\n"
        "print('matplotlib.pyplot' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"


def test_a_day_boundary_is_the_utc_midnight() -> None:
    late = LedgerEntry(
        datetime(2026, 11, 2, 23, 30, tzinfo=UTC) + timedelta(minutes=45),
        "chat",
        cost=Decimal("1"),
        model="m",
    )
    figure = plot_daily_spend([late])
    (container,) = figure.axes[0].containers
    assert _bar_days(container) == [date(2026, 11, 3)]


#: Model names matplotlib would read as mathtext (one is not valid TeX) or leave out of a
#: legend (a leading underscore).
ODD_MODELS = ["$\\alpha$-model", "$\\undefinedcommand$", "cost $5 and $6", "_private-model"]


def test_model_names_are_drawn_as_written_in_legends_and_tick_labels() -> None:
    entries = [
        LedgerEntry(_at(2), "chat", 10 * (index + 1), 1, Decimal("0.1"), model=model)
        for index, model in enumerate(ODD_MODELS)
    ]
    daily = plot_daily_spend(entries)
    mix = plot_token_mix(entries)
    for figure in (daily, mix):
        assert _png(figure).startswith(PNG_SIGNATURE)  # an invalid "$...$" failed to draw
    legend = daily.axes[0].get_legend()
    texts = legend.get_texts()
    assert sorted(text.get_text() for text in texts) == sorted(ODD_MODELS)
    ticks = mix.axes[0].get_xticklabels()
    assert sorted(tick.get_text() for tick in ticks) == sorted(ODD_MODELS)
    assert not any(text.get_parse_math() for text in [*texts, *ticks])
