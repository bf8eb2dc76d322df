"""``retry_budget=`` through each framework's chain and real ``OpenAI`` clients.

An exhausted budget turns the same-member retry into an immediate fallback (no wait);
a per-call attempt cap stops the chain after that many attempts with the last error.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from driver import Mode
from fallback_driver import Servers, serving

from llm_resilience import RetryBudget, RetryPolicy
from llm_resilience.testing import Fault
from llm_resilience.transient import status_code_of

PRIMARY_REPLY = "the primary answered after its wait"
SECONDARY_REPLY = "the secondary answered this request"


@pytest.fixture
def servers() -> Iterator[Servers]:
    with serving(PRIMARY_REPLY, SECONDARY_REPLY) as started:
        yield started


def chain(driver: Any, servers: Servers, **options: Any) -> Any:
    primary, secondary = servers
    return driver.fallback(
        [driver.openai_member(primary), driver.openai_member(secondary)],
        per_client_timeout=10,
        **options,
    )


async def test_an_exhausted_retry_budget_moves_on_at_once_instead_of_retrying(
    driver: Any, mode: Mode, servers: Servers
) -> None:
    primary, secondary = servers
    primary.script(Fault.status(429, retry_after=1), Fault.ok())
    # No traffic yet and no floor: the window allows no retry at all.
    spent = RetryBudget(ratio=0.2, min_per_second=0)
    model = chain(
        driver,
        servers,
        member_retry=RetryPolicy(attempts=3, max_delay=5, jitter=0),
        retry_budget=spent,
    )
    started = time.monotonic()
    assert (await driver.run(model, mode)).text == SECONDARY_REPLY
    assert time.monotonic() - started < 1.0  # the Retry-After was never waited out
    assert len(primary.requests) == 1
    assert len(secondary.requests) == 1
    assert spent.counts().calls == 1


async def test_a_per_call_attempt_cap_stops_the_chain_with_the_last_error(
    driver: Any, mode: Mode, servers: Servers
) -> None:
    primary, secondary = servers
    primary.script(Fault.status(503), Fault.status(503), Fault.status(503))
    model = chain(
        driver,
        servers,
        member_retry=RetryPolicy(attempts=3, base_delay=0, jitter=0),
        retry_budget=RetryBudget(ratio=1, max_attempts_per_call=2),
    )
    with pytest.raises(Exception) as caught:
        await driver.run(model, mode)
    assert status_code_of(caught.value) == 503
    assert len(primary.requests) == 2  # the first try and one retry: the cap
    assert secondary.requests == []


def test_the_chain_keeps_the_retry_budget_it_was_given(driver: Any, servers: Servers) -> None:
    budget = RetryBudget(ratio=0.1)
    model = chain(driver, servers, retry_budget=budget)
    assert model._chain.retry_budget is budget


def test_a_retry_budget_of_the_wrong_type_is_refused_naming_the_option(
    driver: Any, servers: Servers
) -> None:
    with pytest.raises((TypeError, ValueError), match="retry_budget"):
        chain(driver, servers, retry_budget=0.2)
