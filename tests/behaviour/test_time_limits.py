"""``first_token_timeout`` and ``idle_timeout`` through each framework's real clients.

The primary talks to a local fault server that either holds its first token back or
stalls mid-stream; the secondary is healthy. In every call shape the chain must move on
within about the limit, restart a stalled stream with the restart event, and leave no
worker thread busy and no task pending once the faults are over.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from driver import STREAMS, Mode
from fallback_driver import PAIRS, Servers, serving, wire_pair

from llm_resilience.fallback._workers import _WORKERS
from llm_resilience.testing import Fault

PRIMARY_REPLY = "one two three four five six seven eight"
SECONDARY_REPLY = "the secondary answered this request"
LIMIT = 0.5
# The fault outlasts the limit by far, so a chain that waited it out would be seen.
FAULT_SECONDS = 2.5
# Time to fail over and get the secondary's answer, on top of the limit, on a loaded CI.
SLACK = 1.5
FAULTS = {
    "slow-first-token": Fault.slow_first_token(FAULT_SECONDS),
    "stall": Fault.stall_mid_stream(after_chunks=3, seconds=FAULT_SECONDS),
}


def _assert_no_thread_left(baseline: set[threading.Thread], within: float = 5.0) -> None:
    """Every thread the test started has ended, or is a pooled worker waiting for work.

    An abandoned sync attempt keeps its worker until the provider's read returns (the
    fault ends, or the server closes the connection): then it must go back to the pool.
    """
    deadline = time.monotonic() + within
    while True:
        extra = [t for t in threading.enumerate() if t not in baseline and t.is_alive()]
        workers = [t for t in threading.enumerate() if t.name == "llm-resilience-attempt"]
        busy_workers = len(workers) - len(_WORKERS._idle)
        others = [t for t in extra if t.name != "llm-resilience-attempt"]
        if busy_workers == 0 and not others:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"threads left behind: {others}, busy workers: {busy_workers}")
        time.sleep(0.05)


async def _assert_no_task_left(within: float = 2.0) -> None:
    """No task but the test's own is left once the loop has run a few turns.

    The SDKs' inner async generators (openai's SSE decoder, httpx's body readers) are
    not closed by a cancelled read; asyncio closes them in a task of its own on the next
    turns, so the check lets the loop run before it looks.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while asyncio.all_tasks() != {asyncio.current_task()}:
        assert loop.time() < deadline, asyncio.all_tasks()
        await asyncio.sleep(0.01)


@pytest.fixture
def servers() -> Iterator[Servers]:
    baseline = set(threading.enumerate())
    with serving(PRIMARY_REPLY, SECONDARY_REPLY) as started:
        yield started
    _assert_no_thread_left(baseline)


@pytest.fixture(params=PAIRS)
def chain(request: pytest.FixtureRequest, driver: Any, servers: Servers) -> Any:
    first, second = wire_pair(request)
    members = [
        driver.member(first, servers[0], model="gpt-4o-mini"),
        driver.member(second, servers[1], model="gpt-4o"),
    ]
    # A member's first call sets up its SDK client, which first_token_timeout would
    # count; warm them so the limit times the server alone.
    for member, server in zip(members, servers, strict=True):
        driver.warm(member)
        server.reset()
    return driver.fallback(
        members, per_client_timeout=10, first_token_timeout=LIMIT, idle_timeout=LIMIT
    )


def _assert_failed_over_in_time(began: float) -> None:
    elapsed = time.monotonic() - began
    assert LIMIT * 0.9 <= elapsed < LIMIT + SLACK, elapsed


@pytest.mark.parametrize("mode", ["call", "acall"])
@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_call_moves_to_the_secondary_within_the_first_token_timeout(
    driver: Any, mode: Mode, fault: str, chain: Any, servers: Servers
) -> None:
    primary, secondary = servers
    primary.script(FAULTS[fault])
    began = time.monotonic()
    reply = await driver.run(chain, mode)
    _assert_failed_over_in_time(began)
    assert reply.text == SECONDARY_REPLY
    assert driver.served_by(reply) == 1
    assert len(secondary.requests) == 1
    if mode == "acall":
        await _assert_no_task_left()


@pytest.mark.parametrize("mode", STREAMS)
@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_stream_restarts_on_the_secondary_within_the_limit(
    driver: Any, mode: Mode, fault: str, chain: Any, servers: Servers
) -> None:
    servers[0].script(FAULTS[fault])
    began = time.monotonic()
    with driver.restarts(chain) as (watched, restarts):
        reply = await driver.run(watched, mode)
    _assert_failed_over_in_time(began)
    if fault == "stall":
        # The prefix stays delivered; the restart event tells the consumer to drop it.
        assert reply.text == "one two three" + SECONDARY_REPLY
        assert list(restarts) == [(0, 1, 3, "TimeoutError", False)]
    else:
        # No text was delivered: nothing to drop. (A client that passed on an empty
        # opening chunk, as LangChain's ChatOpenAI does, reports a restart of none.)
        assert reply.text == SECONDARY_REPLY
        assert len(restarts) <= 1
        assert all((r.chunks, r.error_type) == (0, "TimeoutError") for r in restarts)
    assert driver.served_by(reply) == 1
    if mode == "astream":
        await _assert_no_task_left()


# -- a consumer that holds the last chunk ----------------------------------------------


def _read_slowly(stream: Iterator[Any]) -> list[Any]:
    received = []
    for chunk in stream:
        received.append(chunk)
        time.sleep(0.3)  # longer than per_client_timeout, once the chunk is out
    return received


@pytest.mark.parametrize("mode", STREAMS)
async def test_a_finished_stream_is_not_restarted_when_the_consumer_holds_its_chunks(
    driver: Any, mode: Mode
) -> None:
    chain = driver.fallback(
        [driver.answering("first"), driver.answering("second")], per_client_timeout=0.2
    )
    with driver.restarts(chain) as (watched, restarts):
        stream = await driver.opened(watched, mode)
        received: list[Any] = []
        if mode == "stream":
            received = _read_slowly(stream)
        else:
            async for chunk in stream:
                received.append(chunk)
                await asyncio.sleep(0.3)
    assert "".join(driver.text_of(chunk) for chunk in received) == "first"
    assert list(restarts) == []


# -- options ---------------------------------------------------------------------------


def test_the_time_limits_are_validated_and_read_back_on_the_chain(driver: Any) -> None:
    members = [driver.answering(), driver.answering()]
    chain = driver.fallback(members, first_token_timeout=5, idle_timeout=2.5)
    assert (chain.first_token_timeout, chain.idle_timeout) == (5, 2.5)
    with pytest.raises(ValueError, match="idle_timeout must be greater than 0 seconds; got 0"):
        driver.fallback(members, idle_timeout=0)
    with pytest.raises(ValueError, match="first_token_timeout must be greater than 0 seconds"):
        driver.fallback(members, first_token_timeout=-1)
    with pytest.raises(ValueError, match="idle_timeout must be at most 31536000 seconds"):
        driver.fallback(members, idle_timeout=10**9)
    with pytest.raises(TypeError, match="first_token_timeout must be None, a number"):
        driver.fallback(members, first_token_timeout="soon")


def test_the_builder_passes_the_time_limits_to_the_fallback_chain(driver: Any) -> None:
    members = [driver.answering(), driver.answering()]
    chain = driver.built_chain(members, first_token_timeout=5, idle_timeout=2)
    assert (chain.first_token_timeout, chain.idle_timeout) == (5, 2)
    assert driver.built_chain(members, first_token_timeout=5).idle_timeout is None
    with pytest.raises(ValueError, match="idle_timeout must be greater than 0 seconds"):
        driver.built_chain(members, idle_timeout=-2)
    with pytest.raises(ValueError, match="first_token_timeout must be greater than 0 seconds"):
        driver.built_chain(members, first_token_timeout=0)
