"""Broken streams through each framework's real clients against the fault server.

A stream with one undecodable SSE event restarts on the next member; a stream missing its
end marker (``[DONE]``, ``message_stop``) still completes at once with its usage; a
stream restarted after the first member already named its model is recorded in the
ledger under the member that served; a breaker opened by real 503s shows in ``health()``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from driver import STREAMS, Mode
from fallback_driver import PAIRS, Servers, serving, wire_pair

from llm_resilience import Cooldown, CostBudget
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.testing import Fault

PRIMARY_REPLY = "one two three four five six seven eight"
SECONDARY_REPLY = "the secondary answered this request"
# The primary's and the secondary's model, by wire format.
MODELS = {"openai": ("gpt-4o-mini", "gpt-4.1-mini"), "anthropic": ("claude-haiku-4-5",) * 2}


@pytest.fixture
def servers() -> Iterator[Servers]:
    with serving(PRIMARY_REPLY, SECONDARY_REPLY) as started:
        yield started


@pytest.fixture(params=PAIRS)
def pair(request: pytest.FixtureRequest) -> tuple[str, str]:
    return wire_pair(request)


def members(driver: Any, servers: Servers, pair: tuple[str, str]) -> list[Any]:
    (primary, secondary), (first, second) = servers, pair
    return [
        driver.member(first, primary, model=MODELS[first][0], stream_usage=True),
        driver.member(second, secondary, model=MODELS[second][1], stream_usage=True),
    ]


def chain(driver: Any, servers: Servers, pair: tuple[str, str], **options: Any) -> Any:
    return driver.fallback(members(driver, servers, pair), per_client_timeout=10, **options)


@pytest.mark.parametrize("mode", STREAMS)
async def test_a_malformed_event_mid_stream_restarts_the_stream_on_the_next_member(
    driver: Any, mode: Mode, servers: Servers, pair: tuple[str, str]
) -> None:
    primary, secondary = servers
    primary.script(Fault.malformed_chunk(after_chunks=2))
    model = chain(driver, servers, pair)
    with driver.restarts(model) as (watched, restarts):
        reply = await driver.run(watched, mode)
    assert reply.text == "one two" + SECONDARY_REPLY
    assert driver.whole_text(reply).endswith(SECONDARY_REPLY)
    assert list(restarts) == [(0, 1, 2, "JSONDecodeError", False)]
    assert driver.served_by(reply) == 1
    assert driver.model_name_of(reply) == driver.streamed_model_name(pair[1], MODELS[pair[1]][1])
    # The process is fine: the next call is served by the (now healthy) primary.
    assert (await driver.run(model, mode)).text == PRIMARY_REPLY
    assert len(secondary.requests) == 1


@pytest.mark.parametrize("mode", STREAMS)
async def test_a_malformed_event_before_any_text_leaves_only_the_next_members_text(
    driver: Any, mode: Mode, servers: Servers, pair: tuple[str, str]
) -> None:
    servers[0].script(Fault.malformed_chunk(after_chunks=0))
    with driver.restarts(chain(driver, servers, pair)) as (watched, restarts):
        reply = await driver.run(watched, mode)
    assert reply.text == SECONDARY_REPLY
    assert driver.model_name_of(reply) == driver.streamed_model_name(pair[1], MODELS[pair[1]][1])
    # Where the primary's client passed its opening (non-text) events on, a restart of no
    # tokens; where it reads them without yielding, a failure before streaming.
    opened = driver.passes_opening_events(pair[0])
    assert [restart.chunks for restart in restarts] == ([0] if opened else [])


@pytest.mark.parametrize("mode", STREAMS)
async def test_a_stream_without_its_end_marker_completes_at_once_with_its_usage(
    driver: Any, mode: Mode, servers: Servers, pair: tuple[str, str]
) -> None:
    primary, secondary = servers
    primary.script(Fault.missing_done())
    started = time.monotonic()
    reply = await driver.run(chain(driver, servers, pair), mode)
    assert time.monotonic() - started < 2.0
    assert reply.text == PRIMARY_REPLY
    assert driver.served_by(reply) == 0
    assert driver.output_tokens_of(reply) == len(PRIMARY_REPLY.split())
    assert driver.input_tokens_of(reply) > 0
    assert secondary.requests == []


@pytest.mark.parametrize("mode", STREAMS)
async def test_a_stream_restarted_mid_way_is_recorded_under_the_member_that_served(
    driver: Any, mode: Mode, servers: Servers, pair: tuple[str, str]
) -> None:
    # An Anthropic primary names its model in the stream's first event, so a drop after
    # a few words leaves that name in the consumer's merge; the secondary names its own.
    servers[0].script(Fault.drop_mid_stream(after_chunks=3))
    ledger = InMemoryCostLedger()
    budget = CostBudget(input_price_per_mtok=3, output_price_per_mtok=15, daily_limit=10)
    model = driver.cost_tracked(chain(driver, servers, pair), budget=budget, ledger=ledger)
    reply = await driver.run(model, mode)
    assert reply.text.endswith(SECONDARY_REPLY)
    assert driver.model_name_of(reply) == driver.streamed_model_name(pair[1], MODELS[pair[1]][1])
    (entry,) = ledger.entries()
    assert entry.model == MODELS[pair[1]][1]


async def test_health_shows_a_member_whose_breaker_opened_after_real_503s(
    driver: Any, servers: Servers
) -> None:
    primary, _ = servers
    model = chain(
        driver, servers, ("openai", "openai"), cooldown=Cooldown(failures=2, window=60, duration=30)
    )
    assert [member.state for member in model.health()] == ["closed", "closed"]
    primary.default_fault = Fault.status(503)
    await driver.run(model, "call")
    assert (model.health()[0].state, model.health()[0].failures) == ("closed", 1)
    await driver.run(model, "call")
    first, second = model.health()
    assert first.state == "open"
    assert 29 < first.retry_in <= 30
    assert second.state == "closed"
    assert (await driver.run(model, "call")).text == SECONDARY_REPLY
    assert len(primary.requests) == 2  # skipped while open
