"""Per-model prices from Pydantic's maintained table, `genai-prices` (the `prices` extra).

`table_prices(["gpt-4o", "claude-sonnet-4-5"], provider="openai")` looks each name up in
the table installed with `pip install "llm-resilience[prices]"` and builds the
[`ModelPrice`][llm_resilience.ModelPrice] a `CostBudget(prices=...)` takes: input, output,
cache read, cache write (five minutes) and one-hour cache write, per million tokens, as
exact `Decimal`s. Prices you give in `overrides` win over the table, and the result
records which table it came from (`TablePrices.source`).

What the table has and a `ModelPrice` cannot hold is said, never dropped in silence:

* tiered prices (Anthropic's long-context rates above 200,000 input tokens): the base
  rate by default, or the dearest tier with `tiers="highest"` (never under what the
  provider bills, over it for short prompts), and the tiered names listed in
  `TablePrices.tiered`;
* prices per request or per search (web search, storage): not token prices, not
  metered here.

A name the table does not know raises `LookupError` naming it, unless `overrides` prices
it: a budget must not quietly price a model at its surface rates.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from llm_resilience.money import ModelPrice

__all__ = ["TablePrices", "table_prices"]

Tiers = Literal["base", "highest"]

# The table's price keys a ModelPrice holds, by ModelPrice argument (first one present).
_KEYS = {
    "input_per_mtok": ("input_mtok",),
    "output_per_mtok": ("output_mtok",),
    "cache_read_price_per_mtok": ("cache_read_mtok",),
    "cache_write_price_per_mtok": ("cache_write_mtok", "cache_write_5m_mtok"),
    "cache_write_1h_price_per_mtok": ("cache_write_1h_mtok",),
}


class TablePrices(Mapping[str, ModelPrice]):
    """The prices `table_prices` built, by the names asked for, and where they came from."""

    __slots__ = ("_prices", "source", "taken_at", "tiered")

    def __init__(
        self,
        prices: Mapping[str, ModelPrice],
        *,
        source: str,
        taken_at: datetime,
        tiered: tuple[str, ...],
    ) -> None:
        self._prices = dict(prices)
        #: The table they came from: `"genai-prices 0.2.3"`.
        self.source = source
        #: The time whose prices were taken (a table keeps past prices too).
        self.taken_at = taken_at
        #: The names whose table price is tiered, priced by one tier (see `tiers=`).
        self.tiered = tiered

    def __getitem__(self, model: str) -> ModelPrice:
        return self._prices[model]

    def __iter__(self) -> Iterator[str]:
        return iter(self._prices)

    def __len__(self) -> int:
        return len(self._prices)

    def __repr__(self) -> str:
        return f"TablePrices({sorted(self._prices)!r}, source={self.source!r})"


def table_prices(
    models: Iterable[str],
    *,
    provider: str | None = None,
    overrides: Mapping[str, ModelPrice] | None = None,
    tiers: Tiers = "base",
    at: datetime | None = None,
) -> TablePrices:
    """`ModelPrice`s for `models` from the `genai-prices` table; `overrides` win.

    `provider` is the table's provider id (`"openai"`, `"anthropic"`, `"google"`, ...;
    None lets the table guess from the name). `at` picks the prices in force at that
    time (default: now); `tiers` is `"base"` or `"highest"` (see the module docstring).

    Examples:
        >>> prices = table_prices(["gpt-4o"], provider="openai")  # doctest: +SKIP
        >>> prices["gpt-4o"].output_per_mtok, prices.source  # doctest: +SKIP
        (Decimal('10'), 'genai-prices 0.2.3')
    """
    names = list(models) if not isinstance(models, str) else None
    if names is None or not all(isinstance(name, str) and name for name in names):
        raise TypeError(f"table_prices(models=) takes model names (a list of str), got {models!r}")
    if tiers not in ("base", "highest"):
        raise ValueError(f"table_prices(tiers=) must be 'base' or 'highest', got {tiers!r}")
    if provider is not None and (not isinstance(provider, str) or not provider):
        raise TypeError(
            f"table_prices(provider=) must be a provider id (str) or None, got {provider!r}"
        )
    given = dict(overrides or {})
    for name, price in given.items():
        if not isinstance(price, ModelPrice):
            raise TypeError(
                f"table_prices(overrides=) maps names to ModelPrice; {name!r} maps to {price!r}"
            )
    when = datetime.now(UTC) if at is None else at
    if when.tzinfo is None:
        raise ValueError("table_prices(at=) must be timezone-aware (a datetime with tzinfo)")
    snapshot, version = _table()
    built: dict[str, ModelPrice] = {}
    tiered: list[str] = []
    missing: list[str] = []
    for name in names:
        if name in given:
            built[name] = given[name]
            continue
        try:
            _, info = snapshot.find_provider_model(name, None, provider, None)
        except LookupError:
            missing.append(name)
            continue
        price, was_tiered = _model_price(info.get_prices(when), tiers)
        built[name] = price
        if was_tiered:
            tiered.append(name)
    if missing:
        where = f"provider {provider!r}" if provider else "any provider"
        raise LookupError(
            f"genai-prices {version} has no price for {missing!r} under {where}; "
            f"price them in table_prices(overrides={{name: ModelPrice(...)}})"
        )
    built.update({name: price for name, price in given.items() if name not in built})
    return TablePrices(built, source=f"genai-prices {version}", taken_at=when, tiered=tuple(tiered))


def _table() -> tuple[Any, str]:
    try:
        snapshot_module = importlib.import_module("genai_prices.data_snapshot")
    except ImportError as exc:
        raise ImportError(
            'table_prices needs the genai-prices table: pip install "llm-resilience[prices]"'
        ) from exc
    from importlib.metadata import version

    return snapshot_module.get_snapshot(), version("genai-prices")


def _model_price(table_price: Any, tiers: Tiers) -> tuple[ModelPrice, bool]:
    """A `ModelPrice` from the table's price object, and whether a tier was chosen."""
    values: dict[str, Decimal] = {}
    was_tiered = False
    for ours, theirs in _KEYS.items():
        rate = next(
            (found for key in theirs if (found := getattr(table_price, key, None)) is not None),
            None,
        )
        if rate is None:
            continue
        tier_list = getattr(rate, "tiers", None)
        if tier_list is not None:
            was_tiered = True
            rate = (
                max([rate.base, *(tier.price for tier in tier_list)])
                if tiers == "highest"
                else rate.base
            )
        values[ours] = Decimal(rate)
    return (
        ModelPrice(
            values.get("input_per_mtok", Decimal(0)),
            values.get("output_per_mtok", Decimal(0)),
            cache_read_price_per_mtok=values.get("cache_read_price_per_mtok"),
            cache_write_price_per_mtok=values.get("cache_write_price_per_mtok"),
            cache_write_1h_price_per_mtok=values.get("cache_write_1h_price_per_mtok"),
        ),
        was_tiered,
    )
