"""Which configured price a served model's name takes: aliases and their dated snapshots,
no prefix that crosses a model family, and a guessed price warned about once and counted."""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

import pytest

from llm_resilience import telemetry
from llm_resilience.budget import BudgetGate, CostBudget, _matching
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.money import ModelPrice
from llm_resilience.usage import Usage

from .test_budget import counter_points

SONNET = ModelPrice(3, 15)
GPT_4O = ModelPrice("2.5", 10)
GPT_4O_MINI = ModelPrice("0.15", "0.6")


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_matching, "_warned", set())


@pytest.mark.parametrize(
    ("keys", "served", "rule", "key"),
    [
        (["gpt-4o"], "gpt-4o", "exact", "gpt-4o"),
        (["gpt-4o"], "gpt-4o-2024-08-06", "snapshot", "gpt-4o"),
        (["claude-sonnet-4-5"], "claude-sonnet-4-5-20250929", "snapshot", "claude-sonnet-4-5"),
        (["claude-sonnet-4-5"], "claude-sonnet-4-5@20250929", "snapshot", "claude-sonnet-4-5"),
        (
            ["claude-sonnet-4-5-20250929"],
            "claude-sonnet-4-5",
            "alias",
            "claude-sonnet-4-5-20250929",
        ),
        (["claude-sonnet-4-5-20250929"], "claude-sonnet-4-5-20250929", "exact", None),
        (["gpt-4o"], "gpt-4o-mini", "default", None),
        (["gpt-4o"], "gpt-4o-mini-2024-07-18", "default", None),
        (["gpt-4"], "gpt-4-turbo", "default", None),
        (["gpt-4o", "gpt-4o-mini"], "gpt-4o-mini-2024-07-18", "snapshot", "gpt-4o-mini"),
        (["gpt-4o-2024-05-13"], "gpt-4o-2024-08-06", "default", None),
        (["gpt-4o-2024-05-13", "gpt-4o-2024-08-06"], "gpt-4o", "default", None),
        (["claude-3-5-sonnet"], "claude-3-5-sonnet-latest", "default", None),
        (["gpt-4o"], "openai/gpt-4o", "default", None),
    ],
)
def test_a_served_name_takes_its_own_key_its_alias_or_its_one_snapshot_and_nothing_else(
    keys: list[str], served: str, rule: str, key: str | None
) -> None:
    prices = {name: ModelPrice(index + 1, index + 1) for index, name in enumerate(keys)}
    match = _matching.match_price(prices, served)
    assert match.rule == rule
    if rule == "default":
        assert match.price is None
    else:
        assert match.key == (key or served)
        assert match.price is prices[match.key]


def test_a_call_naming_the_snapshot_and_a_stream_naming_the_alias_cost_the_same() -> None:
    # LlamaIndex's Anthropic call records the dated snapshot, its stream only the alias.
    for key in ("claude-sonnet-4-5", "claude-sonnet-4-5-20250929"):
        ledger = InMemoryCostLedger()
        gate = BudgetGate(CostBudget(daily_limit=10, prices={key: SONNET}), ledger)
        usage = Usage(1000, 100, estimated=False)
        gate.begin("chat").finish(usage, model="claude-sonnet-4-5-20250929")
        gate.begin("chat").finish(usage, model="claude-sonnet-4-5")
        assert [entry.cost for entry in ledger.entries()] == [Decimal("0.0045")] * 2


def test_gpt_4o_mini_is_not_priced_at_gpt_4o_by_its_name_starting_the_same() -> None:
    budget = CostBudget(daily_limit=10, prices={"gpt-4o": GPT_4O})
    assert budget.price_for("gpt-4o-mini") is not GPT_4O
    assert budget.price_match("gpt-4o-mini").rule == "default"


def test_a_model_priced_at_the_surface_prices_is_warned_about_once_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = BudgetGate(CostBudget(daily_limit=10, prices={"gpt-4o": GPT_4O}), InMemoryCostLedger())
    usage = Usage(10, 10, estimated=False)
    with caplog.at_level(logging.WARNING, logger="llm_resilience.budget"):
        for _ in range(3):
            gate.begin("chat").finish(usage, model="gpt-4o-mini")
            gate.begin("chat").finish(usage, model="gpt-4o-2024-08-06")  # its alias: silent
        gate.begin("chat").finish(usage, model="claude-haiku-4-5")
    warned = [record.getMessage() for record in caplog.records]
    assert len(warned) == 2
    assert "'gpt-4o-mini'" in warned[0]
    assert "surface prices" in warned[0]
    assert "'claude-haiku-4-5'" in warned[1]


def test_an_alias_priced_by_its_one_dated_key_is_warned_about_once_naming_both(
    caplog: pytest.LogCaptureFixture,
) -> None:
    prices = {"claude-sonnet-4-5-20250929": SONNET}
    gate = BudgetGate(CostBudget(daily_limit=10, prices=prices), InMemoryCostLedger())
    with caplog.at_level(logging.WARNING, logger="llm_resilience.budget"):
        for _ in range(2):
            gate.begin("chat").finish(Usage(1, 1, estimated=False), model="claude-sonnet-4-5")
    [warned] = [record.getMessage() for record in caplog.records]
    assert "'claude-sonnet-4-5'" in warned
    assert "'claude-sonnet-4-5-20250929'" in warned


def test_every_entry_priced_by_a_guess_is_counted_by_model_and_rule(metric_reader: Any) -> None:
    prices = {"gpt-4o": GPT_4O, "claude-sonnet-4-5-20250929": SONNET}
    gate = BudgetGate(CostBudget(daily_limit=10, prices=prices), InMemoryCostLedger())
    usage = Usage(1, 1, estimated=False)
    for served in ["gpt-4o-mini", "gpt-4o-mini", "claude-sonnet-4-5", "gpt-4o-2024-08-06"]:
        gate.begin("chat").finish(usage, model=served)
    gate.begin("embedding").finish(Usage(1, 0, estimated=False))  # names no model
    assert counter_points(metric_reader)[telemetry.BUDGET_UNPRICED] == {
        (("gen_ai.request.model", "gpt-4o-mini"), ("rule", "default"), ("surface", "chat")): 2,
        (
            ("gen_ai.request.model", "claude-sonnet-4-5"),
            ("rule", "alias"),
            ("surface", "chat"),
        ): 1,
        (("gen_ai.request.model", ""), ("rule", "default"), ("surface", "embedding")): 1,
    }


def test_the_warned_names_stop_growing_at_their_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_matching, "_WARNED_CAP", 3)
    default = _matching.match_price({}, "x")
    for index in range(10):
        _matching.warn_guessed_price(f"model-{index}", default, "chat")
    assert len(_matching._warned) == 3
