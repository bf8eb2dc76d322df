"""Both adapters' wrappers refuse, at construction, options that would silently disable them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from llm_resilience import CostBudget, InMemoryCostLedger, RetryPolicy

BUDGET = CostBudget(3, 15, daily_limit=10)
LAYERS = ["chat", "embeddings"]


def layer(driver: Any, kind: str, **options: Any) -> Any:
    if kind == "chat":
        return driver.cost_tracked(driver.answering(), budget=BUDGET, **options)
    return driver.cost_tracked_embeddings(driver.embeddings(), budget=BUDGET, **options)


@pytest.mark.parametrize("kind", LAYERS)
def test_a_ledger_given_as_a_url_string_is_refused_suggesting_sql_cost_ledger(
    driver: Any, kind: str
) -> None:
    with pytest.raises(TypeError, match=r"ledger.*SqlCostLedger\('sqlite:///spend.db'\)"):
        layer(driver, kind, ledger="sqlite:///spend.db")


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("ledger", [42, object()])
def test_a_ledger_that_is_not_a_ledger_is_refused(driver: Any, kind: str, ledger: Any) -> None:
    with pytest.raises(TypeError, match="ledger must be a cost ledger"):
        layer(driver, kind, ledger=ledger)


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("scope", ["tenant\x00", "t" * 10_000, "key\ud800"])
def test_a_scope_no_ledger_can_store_is_refused_at_construction(
    driver: Any, kind: str, scope: str
) -> None:
    with pytest.raises(ValueError, match="scope"):
        layer(driver, kind, scope=scope)


def test_a_per_call_scope_no_ledger_can_store_is_refused_before_the_call(driver: Any) -> None:
    inner = driver.answering()
    model = driver.cost_tracked(inner, budget=BUDGET)
    with pytest.raises(ValueError, match="budget_scope"):
        driver.run_sync(model, budget_scope="tenant\x00one")
    assert model.gate.ledger.spend("day") == 0
    assert driver.calls(inner) == 0


@pytest.mark.parametrize("timeout", [1e10, 1e300, timedelta.max])
def test_a_per_client_timeout_beyond_the_documented_maximum_is_refused(
    driver: Any, timeout: Any
) -> None:
    with pytest.raises(ValueError, match=r"per_client_timeout must be at most"):
        driver.fallback([driver.answering(), driver.answering()], per_client_timeout=timeout)


def two(driver: Any) -> list[Any]:
    return [driver.answering(), driver.answering()]


#: Every constructor of both adapters (and the builder's ``use_fallback_chain``), given
#: one misspelled option: a constructor, the misspelling, and the option it means.
MISSPELLED: dict[str, tuple[Callable[..., Any], str, str]] = {
    "fallback": (lambda d, **o: d.fallback(two(d), **o), "per_client_timout", "per_client_timeout"),
    "fallback-hedge": (lambda d, **o: d.fallback(two(d), **o), "hedge_afer", "hedge_after"),
    "builder-fallback": (
        lambda d, **o: d.builder().use_fallback_chain(two(d), **o),
        "per_client_timout",
        "per_client_timeout",
    ),
    "rate-limited-chat": (
        lambda d, **o: d.rate_limited(d.answering(), **o),
        "requests_per_minut",
        "requests_per_minute",
    ),
    "rate-limited-chat-queue": (
        lambda d, **o: d.rate_limited(d.answering(), requests_per_minute=60, **o),
        "max_queue_requests",
        "max_queued_requests",
    ),
    "rate-limited-embeddings-queue": (
        lambda d, **o: d.rate_limited_embeddings(d.embeddings(), requests_per_minute=60, **o),
        "max_queue_requests",
        "max_queued_requests",
    ),
    "rate-limited-embeddings": (
        lambda d, **o: d.rate_limited_embeddings(d.embeddings(), **o),
        "requests_per_minut",
        "requests_per_minute",
    ),
    "cost-chat": (
        lambda d, **o: d.cost_tracked(d.answering(), budget=BUDGET, **o),
        "scoep",
        "scope",
    ),
    "cost-chat-budget": (lambda d, **o: d.cost_tracked(d.answering(), **o), "budgt", "budget"),
    "cost-embeddings": (
        lambda d, **o: d.cost_tracked_embeddings(d.embeddings(), budget=BUDGET, **o),
        "scoep",
        "scope",
    ),
    "cost-embeddings-ledger": (
        lambda d, **o: d.cost_tracked_embeddings(d.embeddings(), budget=BUDGET, **o),
        "ledgr",
        "ledger",
    ),
    "retrying-embeddings": (
        lambda d, **o: d.retrying_embeddings(d.embeddings(), **o),
        "polcy",
        "policy",
    ),
    "retrying-store": (lambda d, **o: d.retrying_store(d.empty_store(), **o), "polcy", "policy"),
}
#: A value for each misspelled option that the right spelling would take.
VALUES = {
    "per_client_timout": 5,
    "hedge_afer": 0.5,
    "requests_per_minut": 60,
    "max_queue_requests": 3,
    "scoep": "tenant-7",
    "budgt": BUDGET,
    "ledgr": InMemoryCostLedger(),
    "polcy": RetryPolicy(attempts=1),
}


@pytest.mark.parametrize("case", sorted(MISSPELLED))
@pytest.mark.filterwarnings("ignore:No persistent cost ledger")
def test_a_misspelled_option_is_refused_at_construction_naming_the_option_meant(
    driver: Any, case: str
) -> None:
    build, wrong, meant = MISSPELLED[case]

    with pytest.raises(TypeError, match=rf"no keyword '{wrong}'; did you mean '{meant}'\?"):
        build(driver, **{wrong: VALUES[wrong]})
