"""``member_retry=`` through each framework's real ``OpenAI`` client against local fault
servers.

A 429 with ``Retry-After: 0.3`` is waited out on the same member, which then answers (the
answer never comes sooner than the header asked, with a policy that would not wait by
itself); a persistent 503 is retried on the
same member, then the next member answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from driver import Mode
from fallback_driver import Servers, serving

from llm_resilience import RetryPolicy
from llm_resilience.testing import Fault

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


async def test_a_429_with_retry_after_is_waited_out_and_the_same_member_answers(
    driver: Any, mode: Mode, servers: Servers
) -> None:
    primary, secondary = servers
    # base_delay=0: only the header can make the retry wait.
    primary.script(Fault.status(429, retry_after=0.3))
    policy = RetryPolicy(attempts=2, base_delay=0, max_delay=5, jitter=0)
    model = chain(driver, servers, member_retry=policy)
    started = time.monotonic()
    assert (await driver.run(model, mode)).text == PRIMARY_REPLY
    assert time.monotonic() - started >= 0.3
    assert [request.fault.kind for request in primary.requests] == ["status", "ok"]
    assert secondary.requests == []


async def test_a_persistent_503_is_retried_then_the_next_member_answers(
    driver: Any, mode: Mode, servers: Servers, caplog: pytest.LogCaptureFixture
) -> None:
    primary, secondary = servers
    primary.script(Fault.status(503), Fault.status(503))
    model = chain(driver, servers, member_retry=RetryPolicy(attempts=2, base_delay=0.1, jitter=0))
    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        assert (await driver.run(model, mode)).text == SECONDARY_REPLY
    assert len(primary.requests) == 2
    assert len(secondary.requests) == 1
    messages = [r.getMessage() for r in caplog.records if r.name == "llm_resilience.fallback"]
    assert messages[0].startswith("Client 0 failed (")  # the error type is the SDK's
    assert messages[0].endswith("status 503); retrying the same client in 0.10 s (try 2 of 2).")
    assert len(messages) == 2  # then the chain's own "trying next client" line


async def test_without_member_retry_a_429_goes_straight_to_the_next_member(
    driver: Any, servers: Servers
) -> None:
    primary, secondary = servers
    primary.script(Fault.status(429, retry_after=1))
    started = time.monotonic()
    assert (await driver.run(chain(driver, servers), "call")).text == SECONDARY_REPLY
    assert time.monotonic() - started < 1.0
    assert (len(primary.requests), len(secondary.requests)) == (1, 1)


def test_members_that_retry_by_themselves_are_still_warned_about(
    driver: Any, servers: Servers, caplog: pytest.LogCaptureFixture
) -> None:
    primary, secondary = servers
    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        driver.fallback(
            [driver.openai_member(primary, max_retries=2), driver.openai_member(secondary)],
            member_retry=RetryPolicy(attempts=2),
        )
    assert any("retries by itself (max_retries=2)" in r.getMessage() for r in caplog.records)
