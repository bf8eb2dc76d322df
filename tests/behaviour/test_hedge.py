"""``hedge_after`` through each framework's real clients and the fault server.

The primary (a real OpenAI client) holds its first token back (``Fault.slow_first_token``);
the secondary (``ChatAnthropic`` in LangChain, a second OpenAI model in LlamaIndex)
answers at once. The chain sits under the cost layer, so each test also reads the ledger:
one entry for the winner, plus a ``"hedge"`` entry when the loser's provider reported
usage. The primary's HTTP traffic goes through an ``httpx`` transport that notes when a
request is cancelled or a response closed, so the tests see the loser's connection
closed, not just the answer, and the framework's own end-of-run reports must show one
answer: the secondary's.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from driver import Mode
from fallback_driver import Servers, serving

from llm_resilience import CostBudget, ModelPrice
from llm_resilience.budget import HEDGE_KIND
from llm_resilience.fallback._workers import _WORKERS
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.testing import Fault

PRIMARY_REPLY = "the primary answered late"
SECONDARY_REPLY = "the secondary answered this request"
HEDGE_AFTER = 0.2
# Long enough that a chain waiting it out would be slow, short enough that an abandoned
# sync attempt finishes within the test.
SLOW_SECONDS = 1.5
WAIT = 15.0


class _Log:
    """What happened to the primary's HTTP requests: started, cancelled, closed."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self._lock = threading.Lock()

    def add(self, event: str) -> None:
        with self._lock:
            self.events.append(event)

    def wait_for(self, event: str) -> bool:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if event in self.events:
                return True
            time.sleep(0.02)
        return False

    def ended(self) -> bool:
        """The request was cancelled or its response closed."""
        return "cancelled" in self.events or "closed" in self.events


class _ClosingStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    def __init__(self, inner: Any, log: _Log) -> None:
        self._inner = inner
        self._log = log

    def __iter__(self) -> Iterator[bytes]:
        yield from self._inner

    async def __aiter__(self) -> Any:
        async for part in self._inner:
            yield part

    def close(self) -> None:
        self._log.add("closed")
        self._inner.close()

    async def aclose(self) -> None:
        self._log.add("closed")
        await self._inner.aclose()


def _tracked(response: httpx.Response, log: _Log) -> httpx.Response:
    return httpx.Response(
        status_code=response.status_code,
        headers=response.headers,
        stream=_ClosingStream(response.stream, log),
        extensions=response.extensions,
    )


class _Transport(httpx.HTTPTransport):
    def __init__(self, log: _Log) -> None:
        super().__init__()
        self._log = log

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self._log.add("started")
        return _tracked(super().handle_request(request), self._log)


class _AsyncTransport(httpx.AsyncHTTPTransport):
    def __init__(self, log: _Log) -> None:
        super().__init__()
        self._log = log

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self._log.add("started")
        try:
            response = await super().handle_async_request(request)
        except asyncio.CancelledError:
            self._log.add("cancelled")  # httpcore drops the connection it was using
            raise
        return _tracked(response, self._log)


@pytest.fixture
def servers() -> Iterator[Servers]:
    with serving(PRIMARY_REPLY, SECONDARY_REPLY) as started:
        yield started


def _settled() -> bool:
    """Every pooled worker is idle again (an abandoned attempt returned to the pool)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        workers = [t for t in threading.enumerate() if t.name == "llm-resilience-attempt"]
        if len(workers) == len(_WORKERS._idle):
            return True
        time.sleep(0.02)
    return False


async def _no_task_left() -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while asyncio.all_tasks() != {asyncio.current_task()}:
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


class Stack:
    """The cost layer over a hedged chain, its ledger, the primary's HTTP log and the
    winner's model name."""

    def __init__(
        self,
        driver: Any,
        servers: Servers,
        *,
        hedge_after: float | None = HEDGE_AFTER,
        budget: CostBudget | None = None,
    ) -> None:
        primary, secondary = servers
        self.log = _Log()
        members = [
            driver.openai_member(
                primary,
                "gpt-4o-mini",
                timeout=WAIT,
                http_clients=(
                    httpx.Client(transport=_Transport(self.log)),
                    httpx.AsyncClient(transport=_AsyncTransport(self.log)),
                ),
            )
        ]
        second, self.winner = driver.other_wire_member(secondary)
        members.append(second)
        # A member's first call builds its SDK client (tenths of a second on a loaded
        # machine): warm both, so the primary's request is on the wire before the hedge.
        for member, server in zip(members, servers, strict=True):
            driver.warm(member)
            server.reset()
        self.log.events.clear()
        # Off by default: without hedge_after the option is not passed at all.
        options = {} if hedge_after is None else {"hedge_after": hedge_after}
        self.chain = driver.fallback(members, first_token_timeout=WAIT, **options)
        self.ledger = InMemoryCostLedger()
        if budget is None:
            budget = CostBudget(input_price_per_mtok=1, output_price_per_mtok=2, daily_limit=100)
        self.model = driver.cost_tracked(self.chain, budget=budget, ledger=self.ledger)

    def entries(self) -> list[tuple[str, str]]:
        return [(entry.kind, entry.model) for entry in self.ledger.entries()]

    def wait_for_entries(self, count: int) -> list[Any]:
        deadline = time.monotonic() + WAIT
        while len(self.ledger.entries()) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return list(self.ledger.entries())


async def test_a_call_is_answered_by_the_hedge_and_the_late_primary_is_recorded_as_a_hedge(
    driver: Any, servers: Servers
) -> None:
    primary, secondary = servers
    stack = Stack(driver, servers)
    primary.script(Fault.slow_first_token(SLOW_SECONDS))
    with driver.reported_answers(stack.model) as (watched, answers):
        reply = await driver.run(watched, "call")
    assert reply.text == SECONDARY_REPLY
    assert answers == [SECONDARY_REPLY]
    assert driver.served_by(reply) == 1
    assert [(r.stream, r.model) for r in secondary.requests] == [(False, stack.winner)]
    assert stack.entries() == [("chat", stack.winner)]
    # A sync call's loser cannot be interrupted: it runs to its end in its worker, and
    # the tokens its provider reported are recorded as spend, never as the answer.
    assert _settled()
    assert stack.log.wait_for("closed")
    stack.wait_for_entries(2)
    assert stack.entries() == [("chat", stack.winner), (HEDGE_KIND, "gpt-4o-mini")]
    assert stack.ledger.entries()[1].input_tokens > 0
    assert answers == [SECONDARY_REPLY]


async def test_a_late_primarys_cached_tokens_are_priced_at_the_cache_rate_in_its_hedge_entry(
    driver: Any, servers: Servers
) -> None:
    primary, _ = servers
    primary.usage_details = {"cache_read": 4}
    budget = CostBudget(
        input_price_per_mtok=1,
        output_price_per_mtok=2,
        daily_limit=100,
        prices={"gpt-4o-mini": ModelPrice(10, 20, cache_read_price_per_mtok=1)},
    )
    stack = Stack(driver, servers, budget=budget)
    primary.script(Fault.slow_first_token(SLOW_SECONDS))
    assert (await driver.run(stack.model, "call")).text == SECONDARY_REPLY
    assert _settled()
    hedge = next(e for e in stack.wait_for_entries(2) if e.kind == HEDGE_KIND)
    assert hedge.cache_read_tokens == 4
    uncached = hedge.input_tokens - hedge.cache_read_tokens
    assert hedge.cost == (Decimal(uncached) * 10 + 4 * 1 + Decimal(hedge.output_tokens) * 20) / (
        10**6
    )


async def test_an_async_call_cancels_the_slow_primarys_request_when_the_hedge_answers(
    driver: Any, servers: Servers
) -> None:
    primary, _ = servers
    stack = Stack(driver, servers)
    primary.script(Fault.slow_first_token(SLOW_SECONDS * 10))
    with driver.reported_answers(stack.model) as (watched, answers):
        reply = await driver.run(watched, "acall")
    assert reply.text == SECONDARY_REPLY
    assert answers == [SECONDARY_REPLY]
    assert driver.served_by(reply) == 1
    assert stack.log.events == ["started", "cancelled"]
    assert stack.entries() == [("chat", stack.winner)]
    assert await _no_task_left()


async def test_a_stream_delivers_only_the_hedges_answer_and_closes_the_primary(
    driver: Any, servers: Servers
) -> None:
    primary, _ = servers
    stack = Stack(driver, servers)
    primary.script(Fault.slow_first_token(SLOW_SECONDS))
    with driver.reported_answers(stack.model) as (watched, answers):
        reply = await driver.run(watched, "stream")
    assert reply.text == SECONDARY_REPLY
    assert answers == [SECONDARY_REPLY]
    assert driver.served_by(reply) == 1
    assert stack.entries() == [("chat", stack.winner)]
    # The loser's worker is blocked in its read until a byte arrives: it then closes its
    # stream instead of reading the answer, and goes back to the pool. (LlamaIndex's
    # OpenAI generator does not close the SDK's stream when it is closed; the response
    # is closed when that stream is collected.)
    assert _settled()
    gc.collect()
    assert stack.log.wait_for("closed")
    assert stack.entries() == [("chat", stack.winner)]


async def test_an_async_stream_delivers_only_the_hedges_answer_and_closes_the_primary_at_once(
    driver: Any, servers: Servers
) -> None:
    primary, _ = servers
    stack = Stack(driver, servers)
    primary.script(Fault.slow_first_token(SLOW_SECONDS * 10))
    received: list[str] = []
    with driver.reported_answers(stack.model) as (watched, answers):
        async for chunk in await driver.opened(watched, "astream"):
            piece = driver.text_of(chunk)
            if piece:
                assert stack.log.ended()  # closed before the first word of the answer arrived
            received.append(piece)
    assert "".join(received) == SECONDARY_REPLY
    assert answers == [SECONDARY_REPLY]
    assert stack.log.events == ["started", "closed"]
    assert stack.entries() == [("chat", stack.winner)]
    assert await _no_task_left()


@pytest.mark.parametrize("mode", ["call", "stream"])
async def test_without_hedge_after_a_slow_primary_is_simply_waited_for(
    driver: Any, mode: Mode, servers: Servers
) -> None:
    primary, secondary = servers
    stack = Stack(driver, servers, hedge_after=None)
    primary.script(Fault.slow_first_token(HEDGE_AFTER * 3))
    assert (await driver.run(stack.model, mode)).text == PRIMARY_REPLY
    assert secondary.requests == []
    assert stack.entries() == [("chat", "gpt-4o-mini")]


def test_hedge_after_is_validated_and_read_back_on_the_chain(driver: Any) -> None:
    members = [driver.answering(), driver.answering()]
    assert driver.fallback(members, hedge_after=HEDGE_AFTER).hedge_after == HEDGE_AFTER
    assert driver.fallback(members).hedge_after is None
    for bad in (0, -1):
        with pytest.raises(ValueError, match="hedge_after must be greater than 0 seconds"):
            driver.fallback(members, hedge_after=bad)
    with pytest.raises(ValueError, match="hedge_after must be shorter than first_token_timeout"):
        driver.fallback(members, hedge_after=5, first_token_timeout=5)
    with pytest.raises(ValueError, match="hedge_after must be shorter than per_client_timeout"):
        driver.fallback(members, hedge_after=5, per_client_timeout=2)
    assert driver.built_chain(members, hedge_after=1.5).hedge_after == 1.5
