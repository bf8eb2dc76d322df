"""Spend as charts: per day by model, month to date against the limit, tokens per model.

Each function takes ledger entries (``ledger.entries(...)``) and returns a
`matplotlib.figure.Figure` drawn on an Agg canvas, made without ``pyplot``: no
backend is selected or changed, no window opens, ``plt.show()`` is never called. Save it
with ``fig.savefig(...)``; a notebook shows it when it is a cell's last expression.

Heights and lines are exact `Decimal` sums converted to float once, at the
end. Days are UTC days, as the budget's windows are. Entries without a model are drawn
under ``"unknown"``.

matplotlib loads only when a function is called (``pip install
"llm-resilience[pandas]"``), so ``import llm_resilience`` never imports it.

Examples:
    >>> from datetime import UTC, datetime
    >>> from decimal import Decimal
    >>> from llm_resilience.ledger import LedgerEntry
    >>> entries = [LedgerEntry(datetime(2026, 11, 2, 9, tzinfo=UTC), "chat", 900, 100,
    ...                        Decimal("0.004"), model="gpt-4o-mini")]
    >>> fig = plot_daily_spend(entries)
    >>> [float(bar.get_height()) for bar in fig.axes[0].patches]
    [0.004]
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from llm_resilience.ledger._protocol import LedgerEntry, window_bounds
from llm_resilience.money import exact_sum

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from llm_resilience.budget import CostBudget

__all__ = ["UNKNOWN_MODEL", "plot_daily_spend", "plot_month_to_date", "plot_token_mix"]

#: The label of entries that do not name the model that served them.
UNKNOWN_MODEL = "unknown"


def _figure(width: float = 9.0, height: float = 4.5) -> tuple[Figure, Axes]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            'llm_resilience.plots needs matplotlib: pip install "llm-resilience[pandas]"'
        ) from error
    figure = Figure(figsize=(width, height), layout="constrained")
    # An Agg canvas of its own: savefig works and no global pyplot backend is touched.
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def _day_numbers(days: Iterable[date]) -> list[float]:
    """Days as matplotlib date numbers, the x values of a date axis."""
    from matplotlib.dates import date2num

    # date2num is untyped in matplotlib 3.x.
    return [float(date2num(day)) for day in days]  # type: ignore[no-untyped-call]


def _entries(option: str, entries: Iterable[LedgerEntry]) -> list[LedgerEntry]:
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Iterable):
        raise TypeError(f"{option} must be an iterable of LedgerEntry, got {entries!r}")
    checked = list(entries)
    for entry in checked:
        if not isinstance(entry, LedgerEntry):
            raise TypeError(
                f"{option} must be an iterable of LedgerEntry, "
                f"got an item of type {type(entry).__name__}"
            )
    return checked


def _limit(budget: CostBudget | None, name: str) -> Decimal | None:
    if budget is None:
        return None
    from llm_resilience.budget import CostBudget

    if not isinstance(budget, CostBudget):
        raise TypeError(f"budget must be a CostBudget or None, got {budget!r}")
    limit: Decimal | None = getattr(budget, name)
    return limit


def _model(entry: LedgerEntry) -> str:
    return entry.model if entry.model is not None else UNKNOWN_MODEL


def _legend(axes: Axes, **options: Any) -> None:
    """The legend of every labelled line and bar container, each label as written: a
    model's name is text, never mathtext (``$...$``, which also fails to draw when it is
    not valid TeX), and is listed even when it starts with ``_``, which matplotlib's own
    collection of handles would skip."""
    # matplotlib's own order, lines first; a bar container is no Artist to its stubs.
    handles: list[Any] = [*axes.lines, *axes.containers]
    legend = axes.legend(handles, [handle.get_label() for handle in handles], **options)
    for text in legend.get_texts():
        text.set_parse_math(False)


def _money_label(amount: Decimal) -> str:
    return f"{amount:,}"


def plot_daily_spend(entries: Iterable[LedgerEntry], budget: CostBudget | None = None) -> Figure:
    """Spend per UTC day, one bar per day stacked by the model that served.

    Examples:
        >>> from llm_resilience.budget import CostBudget
        >>> fig = plot_daily_spend([], budget=CostBudget(daily_limit=25))
        >>> [float(line.get_ydata()[0]) for line in fig.axes[0].lines]
        [25.0]

    Every day from the first entry's to the last entry's is on the axis, days without
    spend as gaps; each model is one bar container labelled with its name, models in
    order of total spend (largest at the bottom). With a ``budget`` that has a
    ``daily_limit``, the limit is a dashed horizontal line labelled with it (the limit
    applies to each scope's own spend, so pass one scope's entries to compare a scope).
    ``TypeError`` for anything but ``LedgerEntry`` items or a ``CostBudget``.
    """
    checked = _entries("entries", entries)
    limit = _limit(budget, "daily_limit")
    figure, axes = _figure()
    per_model_day: dict[str, dict[date, list[Decimal]]] = {}
    for entry in checked:
        day = entry.timestamp.date()
        per_model_day.setdefault(_model(entry), {}).setdefault(day, []).append(entry.cost)
    days: list[date] = []
    if checked:
        first = min(entry.timestamp.date() for entry in checked)
        last = max(entry.timestamp.date() for entry in checked)
        days = [first + timedelta(days=offset) for offset in range((last - first).days + 1)]
    totals = {
        model: exact_sum(cost for costs in by_day.values() for cost in costs)
        for model, by_day in per_model_day.items()
    }
    # Bottoms are exact running sums, so a stack's top is the day's exact spend as a float,
    # not the drift of adding float heights.
    below = [Decimal(0)] * len(days)
    for model in sorted(per_model_day, key=lambda name: (-totals[name], name)):
        by_day = per_model_day[model]
        sums = [exact_sum(by_day.get(day, ())) for day in days]
        axes.bar(
            _day_numbers(days),
            [float(amount) for amount in sums],
            bottom=[float(amount) for amount in below],
            width=0.8,
            label=model,
        )
        below = [exact_sum(pair) for pair in zip(below, sums, strict=True)]
    if limit is not None:
        axes.axhline(
            float(limit),
            color="crimson",
            linestyle="--",
            label=f"daily limit {_money_label(limit)}",
        )
    axes.set_title("Spend per day (UTC), by model")
    axes.set_ylabel("cost")
    axes.set_xlabel("day")
    if per_model_day or limit is not None:
        # Beside the axes, so it never hides a bar.
        _legend(axes, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    # Set, not autoscaled: a zero-height bar's sticky edge at a stack's top would cut the
    # headroom above the tallest day.
    top = max([*below, *([] if limit is None else [limit])], default=Decimal(0))
    if top > 0:
        axes.set_ylim(0, float(top) * 1.08)
    axes.xaxis_date()
    figure.autofmt_xdate()
    return figure


def _month_start(month: object, checked: list[LedgerEntry]) -> datetime:
    if month is None:
        when = max(entry.timestamp for entry in checked) if checked else datetime.now(UTC)
    elif isinstance(month, datetime):
        if month.tzinfo is None or month.utcoffset() is None:
            raise ValueError(f"month must be timezone-aware when a datetime, got {month!r}")
        when = month.astimezone(UTC)
    elif isinstance(month, date):
        when = datetime(month.year, month.month, 1, tzinfo=UTC)
    elif isinstance(month, str):
        try:
            when = datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC)
        except ValueError:
            raise ValueError(
                f"month must be 'YYYY-MM' text (such as '2026-11'), got {month!r}"
            ) from None
    else:
        raise TypeError(f"month must be 'YYYY-MM' text, a date or None, got {month!r}")
    return window_bounds("month", when)[0]


def plot_month_to_date(
    entries: Iterable[LedgerEntry],
    budget: CostBudget | None = None,
    month: str | date | None = None,
) -> Figure:
    """Cumulative spend of one UTC month, day by day, against the monthly limit.

    Examples:
        >>> from datetime import UTC, datetime
        >>> entries = [LedgerEntry(datetime(2026, 11, day, tzinfo=UTC), "chat",
        ...                        cost=Decimal("1.25")) for day in (1, 3)]
        >>> fig = plot_month_to_date(entries, month="2026-11")
        >>> [float(y) for y in fig.axes[0].lines[0].get_ydata()]
        [0.0, 1.25, 1.25, 2.5]

    The line starts at 0 at midnight on the 1st and has one point at the end of each day
    (the next UTC midnight) up to the month's last day with spend, each the exact spend
    so far; with a limit drawn, the axis spans the whole month.
    Entries outside the month are left out. ``month`` is ``"YYYY-MM"``, a ``date`` or an
    aware ``datetime`` (its UTC month); None means the month of the latest entry (the
    current UTC month when there are none). With a ``budget`` that has a
    ``monthly_limit``, the limit is a dashed horizontal line labelled with it. Bad
    ``month`` text raises ``ValueError``; other types ``TypeError``.
    """
    checked = _entries("entries", entries)
    limit = _limit(budget, "monthly_limit")
    start = _month_start(month, checked)
    end = window_bounds("month", start)[1]
    in_month = [entry for entry in checked if start <= entry.timestamp < end]
    figure, axes = _figure()
    per_day: dict[date, list[Decimal]] = {}
    for entry in in_month:
        per_day.setdefault(entry.timestamp.date(), []).append(entry.cost)
    # Up to the last day with spend, not past it: the month's future is not zero spend.
    days = (
        [start.date() + timedelta(days=offset) for offset in range(max(per_day).day)]
        if per_day
        else []
    )
    running = Decimal(0)
    ends = [start.date()] if days else []
    cumulative: list[float] = [0.0] if days else []
    for day in days:
        running = exact_sum([running, *per_day.get(day, ())])
        ends.append(day + timedelta(days=1))
        cumulative.append(float(running))
    axes.plot(
        _day_numbers(ends),
        cumulative,
        marker="o",
        markersize=3,
        label=f"spent {_money_label(running)}",
    )
    if limit is not None:
        axes.axhline(
            float(limit),
            color="crimson",
            linestyle="--",
            label=f"monthly limit {_money_label(limit)}",
        )
        axes.set_xlim(*_day_numbers([start.date(), end.date()]))
    axes.set_ylim(bottom=0)
    axes.set_title(f"Month to date, {start.date().isoformat()[:7]} (UTC)")
    axes.set_ylabel("cumulative cost")
    axes.set_xlabel("day")
    axes.legend(loc="upper left", fontsize="small")
    axes.xaxis_date()
    figure.autofmt_xdate()
    return figure


def plot_token_mix(entries: Iterable[LedgerEntry]) -> Figure:
    """Input and output tokens per model, as two bars side by side.

    Examples:
        >>> from datetime import UTC, datetime
        >>> when = datetime(2026, 11, 2, tzinfo=UTC)
        >>> fig = plot_token_mix([LedgerEntry(when, "chat", 1200, 300, model="gpt-4o"),
        ...                       LedgerEntry(when, "chat", 800, 100, model="gpt-4o")])
        >>> [[float(bar.get_height()) for bar in bars] for bars in fig.axes[0].containers]
        [[2000.0], [400.0]]

    Models are in order of total tokens, largest first; the first bar container is
    ``"input"`` and the second ``"output"``. Entries with no tokens (per-page kinds such
    as ``"ocr"``) add nothing. ``TypeError`` for anything but ``LedgerEntry`` items.
    """
    checked = _entries("entries", entries)
    figure, axes = _figure()
    tokens: dict[str, list[int]] = {}
    for entry in checked:
        if entry.input_tokens == 0 and entry.output_tokens == 0:
            continue
        counts = tokens.setdefault(_model(entry), [0, 0])
        counts[0] += entry.input_tokens
        counts[1] += entry.output_tokens
    models = sorted(tokens, key=lambda name: (-sum(tokens[name]), name))
    positions = list(range(len(models)))
    width = 0.4
    axes.bar(
        [position - width / 2 for position in positions],
        [float(tokens[model][0]) for model in models],
        width=width,
        label="input",
    )
    axes.bar(
        [position + width / 2 for position in positions],
        [float(tokens[model][1]) for model in models],
        width=width,
        label="output",
    )
    # Model names as written: never mathtext ("$...$").
    axes.set_xticks(positions, models, rotation=20, ha="right", parse_math=False)
    axes.set_title("Tokens per model")
    axes.set_ylabel("tokens")
    axes.legend(loc="upper right", fontsize="small")
    return figure
