"""Prices from the genai-prices table: each agrees with the table's own calc_price, to the
Decimal, on its README's examples (OpenAI and Anthropic, cache reads and writes)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from llm_resilience.budget import BudgetGate, CostBudget
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.money import ModelPrice, cost_of
from llm_resilience.prices import TablePrices, table_prices
from llm_resilience.usage import Usage

genai_prices = pytest.importorskip("genai_prices", reason="the prices extra is not installed")

# The prices in force at one time, so a later table release does not move these cases.
AT = datetime(2026, 11, 1, tzinfo=UTC)


def table_total(usage: Usage, model: str, provider: str) -> Decimal:
    their_usage = genai_prices.Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens or 0,
        cache_write_tokens=usage.cache_write_tokens or 0,
        **(
            {"cache_write_1h_tokens": usage.cache_write_1h_tokens}
            if usage.cache_write_1h_tokens
            else {}
        ),
    )
    calculation = genai_prices.calc_price(
        their_usage, model_ref=model, provider_id=provider, genai_request_timestamp=AT
    )
    return calculation.total_price


@pytest.mark.parametrize(
    ("model", "provider", "usage"),
    [
        # The README's first example.
        ("gpt-4o", "openai", Usage(1000, 100, False)),
        ("gpt-4o-mini", "openai", Usage(12_000, 800, False, cache_read_tokens=9_000)),
        # The README's cached-input example: 4,735 of 4,740 input tokens written to the cache.
        ("claude-sonnet-4-20250514", "anthropic", Usage(4740, 255, False, cache_write_tokens=4735)),
        # The README's extract_usage example (504 uncached + 123 written, as Anthropic reports).
        ("claude-sonnet-4-20250514", "anthropic", Usage(627, 97, False, cache_write_tokens=123)),
        (
            "claude-sonnet-4-5",
            "anthropic",
            Usage(
                60_000,
                2_000,
                False,
                cache_read_tokens=40_000,
                cache_write_tokens=15_000,
                cache_write_1h_tokens=5_000,
            ),
        ),
        ("text-embedding-3-small", "openai", Usage(5000, 0, False)),
    ],
)
def test_a_table_price_costs_what_the_table_itself_calculates(
    model: str, provider: str, usage: Usage
) -> None:
    prices = table_prices([model], provider=provider, at=AT)
    ours = cost_of(usage, prices[model])
    assert ours == table_total(usage, model, provider)
    assert ours > 0


def test_a_budget_on_table_prices_records_the_tables_cost() -> None:
    prices = table_prices(["claude-sonnet-4-20250514"], provider="anthropic", at=AT)
    ledger = InMemoryCostLedger()
    gate = BudgetGate(CostBudget(daily_limit=10, prices=prices), ledger)
    usage = Usage(4740, 255, False, cache_write_tokens=4735)
    gate.begin("chat").finish(usage, model="claude-sonnet-4-20250514")
    [entry] = ledger.entries()
    assert entry.cost == table_total(usage, "claude-sonnet-4-20250514", "anthropic")


def test_the_prices_record_which_table_release_they_came_from() -> None:
    from importlib.metadata import version

    prices = table_prices(["gpt-4o"], provider="openai", at=AT)
    assert isinstance(prices, TablePrices)
    assert prices.source == f"genai-prices {version('genai-prices')}"
    assert prices.taken_at == AT
    assert "genai-prices" in repr(prices)


def test_prices_you_give_win_over_the_table_and_price_names_it_lacks() -> None:
    mine = ModelPrice(1, 2)
    local = ModelPrice("0.1", "0.2")
    prices = table_prices(
        ["gpt-4o", "my-local-model"],
        provider="openai",
        overrides={"gpt-4o": mine, "my-local-model": local},
        at=AT,
    )
    assert prices["gpt-4o"] is mine
    assert prices["my-local-model"] is local


def test_a_name_the_table_does_not_know_is_refused_naming_it() -> None:
    with pytest.raises(LookupError, match=r"'no-such-model-xyz'.*overrides"):
        table_prices(["gpt-4o", "no-such-model-xyz"], provider="openai", at=AT)


def test_a_tiered_price_takes_its_base_rate_or_the_dearest_tier_and_says_which_were_tiered() -> (
    None
):
    base = table_prices(["claude-sonnet-4-5"], provider="anthropic", at=AT)
    highest = table_prices(["claude-sonnet-4-5"], provider="anthropic", tiers="highest", at=AT)
    assert base.tiered == highest.tiered == ("claude-sonnet-4-5",)
    assert base["claude-sonnet-4-5"].input_per_mtok == Decimal(3)
    assert highest["claude-sonnet-4-5"].input_per_mtok == Decimal(6)
    assert highest["claude-sonnet-4-5"].output_per_mtok == Decimal("22.5")
    # Over 200,000 input tokens the table bills the dearer tier: "highest" is never under it.
    long_prompt = Usage(250_000, 1_000, False)
    assert cost_of(long_prompt, highest["claude-sonnet-4-5"]) == table_total(
        long_prompt, "claude-sonnet-4-5", "anthropic"
    )
    assert table_prices(["gpt-4o"], provider="openai", at=AT).tiered == ()


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"models": "gpt-4o"}, TypeError, "models="),
        ({"models": ["gpt-4o"], "tiers": "top"}, ValueError, "tiers="),
        ({"models": ["gpt-4o"], "provider": 3}, TypeError, "provider="),
        ({"models": ["gpt-4o"], "overrides": {"gpt-4o": 2.5}}, TypeError, "overrides="),
        ({"models": ["gpt-4o"], "at": datetime(2026, 1, 1)}, ValueError, "at="),
    ],
)
def test_bad_arguments_are_refused_naming_the_option(
    kwargs: dict[str, object], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        table_prices(**kwargs)  # type: ignore[arg-type]
