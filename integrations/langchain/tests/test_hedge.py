"""``hedge_after`` through real ``ChatOpenAI``/``ChatAnthropic`` clients and the fault server.

The primary's server holds its first token back (``Fault.slow_first_token``); the
secondary's answers at once. The chain sits under a ``CostTrackedChatModel``, so each
test also reads the ledger: one entry for the winner, plus a ``"hedge"`` entry when the
loser's provider reported usage. The primary's HTTP traffic goes through an ``httpx``
transport that notes when a request is cancelled or a response closed, so the tests see
the loser's connection closed, not just the answer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI

from langchain_llm_resilience import CostTrackedChatModel, FallbackChatModel, ResilienceBuilder
from llm_resilience import CostBudget, ModelPrice
from llm_resilience.budget import HEDGE_KIND
from llm_resilience.fallback._workers import _WORKERS
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.testing import Fault, FaultInjectingServer

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


class _Transport(httpx.HTTPTransport):
    def __init__(self, log: _Log) -> None:
        super().__init__()
        self._log = log

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self._log.add("started")
        response = super().handle_request(request)
        return _tracked(response, self._log)


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


def _tracked(response: httpx.Response, log: _Log) -> httpx.Response:
    return httpx.Response(
        status_code=response.status_code,
        headers=response.headers,
        stream=_ClosingStream(response.stream, log),
        extensions=response.extensions,
    )


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    with (
        FaultInjectingServer(reply=PRIMARY_REPLY, name="primary") as primary,
        FaultInjectingServer(reply=SECONDARY_REPLY, name="secondary") as secondary,
    ):
        yield primary, secondary


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


def _primary(server: FaultInjectingServer, log: _Log) -> BaseChatModel:
    return ChatOpenAI(
        model="gpt-4o-mini",
        base_url=server.openai_base_url,
        api_key="sk-FAKE-primary",  # type: ignore[arg-type]
        max_retries=0,
        timeout=WAIT,
        http_client=httpx.Client(transport=_Transport(log)),
        http_async_client=httpx.AsyncClient(transport=_AsyncTransport(log)),
    )


def _secondary(server: FaultInjectingServer) -> BaseChatModel:
    return ChatAnthropic(
        model_name="claude-sonnet-4-5",
        base_url=server.anthropic_base_url,
        api_key="sk-FAKE-secondary",  # type: ignore[arg-type]
        max_retries=0,
        default_request_timeout=WAIT,
        stop=None,
    )


Stack = tuple[CostTrackedChatModel, InMemoryCostLedger, _Log]


def _stack(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    *,
    hedge_after: float | None = HEDGE_AFTER,
    budget: CostBudget | None = None,
) -> Stack:
    primary, secondary = servers
    log = _Log()
    members = [_primary(primary, log), _secondary(secondary)]
    # Warm both members, so the primary's request is on the wire before the hedge.
    for member, server in zip(members, servers, strict=True):
        member.invoke("warm up")
        server.reset()
    log.events.clear()
    # Off by default: without hedge_after the option is not passed at all.
    options = {} if hedge_after is None else {"hedge_after": hedge_after}
    chain = FallbackChatModel(models=members, first_token_timeout=WAIT, **options)
    ledger = InMemoryCostLedger()
    if budget is None:
        budget = CostBudget(input_price_per_mtok=1, output_price_per_mtok=2, daily_limit=100)
    return CostTrackedChatModel(inner=chain, budget=budget, ledger=ledger), ledger, log


def _winner_only(ledger: InMemoryCostLedger) -> None:
    entries = ledger.entries()
    assert [(e.kind, e.model, e.estimated) for e in entries] == [
        ("chat", "claude-sonnet-4-5", False)
    ]


def _text(chunks: list[AIMessageChunk]) -> str:
    return "".join(str(chunk.content) for chunk in chunks)


def _served_by(chunks: list[AIMessageChunk]) -> Any:
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    return merged.response_metadata["fallback_served_by"]


def test_invoke_is_answered_by_the_hedge_and_the_late_primary_is_recorded_as_a_hedge(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    model, ledger, log = _stack(servers)
    primary.script(Fault.slow_first_token(SLOW_SECONDS))
    answer = model.invoke("Capital of France?")
    assert answer.content == SECONDARY_REPLY
    assert answer.response_metadata["fallback_served_by"] == [1]
    assert [(r.stream, r.model) for r in secondary.requests] == [(False, "claude-sonnet-4-5")]
    _winner_only(ledger)
    # A sync call's loser cannot be interrupted: it runs to its end in its worker, and
    # the tokens its provider reported are recorded as spend, never as the answer.
    assert _settled()
    assert log.wait_for("closed")
    kinds = [(e.kind, e.model) for e in ledger.entries()]
    assert kinds == [("chat", "claude-sonnet-4-5"), (HEDGE_KIND, "gpt-4o-mini")]
    assert ledger.entries()[1].input_tokens > 0


def test_a_late_primarys_cached_tokens_are_priced_at_the_cache_rate_in_its_hedge_entry(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, _ = servers
    primary.usage_details = {"cache_read": 4}
    budget = CostBudget(
        input_price_per_mtok=1,
        output_price_per_mtok=2,
        daily_limit=100,
        prices={"gpt-4o-mini": ModelPrice(10, 20, cache_read_price_per_mtok=1)},
    )
    model, ledger, _ = _stack(servers, budget=budget)
    primary.script(Fault.slow_first_token(SLOW_SECONDS))
    assert model.invoke("Capital of France?").content == SECONDARY_REPLY
    assert _settled()
    hedge = next(e for e in _wait_for_entries(ledger, 2) if e.kind == HEDGE_KIND)
    assert hedge.cache_read_tokens == 4
    uncached = hedge.input_tokens - hedge.cache_read_tokens
    assert hedge.cost == (Decimal(uncached) * 10 + 4 * 1 + Decimal(hedge.output_tokens) * 20) / (
        10**6
    )


def _wait_for_entries(ledger: InMemoryCostLedger, count: int) -> list[Any]:
    deadline = time.monotonic() + WAIT
    while len(ledger.entries()) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return list(ledger.entries())


async def test_ainvoke_cancels_the_slow_primarys_request_when_the_hedge_answers(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, _ = servers
    model, ledger, log = _stack(servers)
    primary.script(Fault.slow_first_token(SLOW_SECONDS * 10))
    answer = await model.ainvoke("Capital of France?")
    assert answer.content == SECONDARY_REPLY
    assert answer.response_metadata["fallback_served_by"] == [1]
    assert log.events == ["started", "cancelled"]
    _winner_only(ledger)
    assert await _no_task_left()


def test_stream_delivers_only_the_hedges_answer_and_closes_the_primary(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, _ = servers
    model, ledger, log = _stack(servers)
    primary.script(Fault.slow_first_token(SLOW_SECONDS))
    chunks = list(model.stream("Capital of France?"))
    assert _text(chunks) == SECONDARY_REPLY
    assert _served_by(chunks) == [1]
    _winner_only(ledger)
    # The loser's worker is blocked in its read until a byte arrives: it then closes
    # the response at once instead of reading the answer.
    assert log.wait_for("closed")
    assert _settled()
    _winner_only(ledger)


async def test_astream_delivers_only_the_hedges_answer_and_closes_the_primary_at_once(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, _ = servers
    model, ledger, log = _stack(servers)
    primary.script(Fault.slow_first_token(SLOW_SECONDS * 10))
    chunks = []
    async for chunk in model.astream("Capital of France?"):
        if str(chunk.content):
            assert log.ended()  # closed before the first word of the answer arrived
        chunks.append(chunk)
    assert _text(chunks) == SECONDARY_REPLY
    assert _served_by(chunks) == [1]
    assert log.events == ["started", "closed"]
    _winner_only(ledger)
    assert await _no_task_left()


@pytest.mark.parametrize("shape", ["invoke", "stream"])
def test_without_hedge_after_a_slow_primary_is_simply_waited_for(
    shape: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, secondary = servers
    model, ledger, _ = _stack(servers, hedge_after=None)
    primary.script(Fault.slow_first_token(HEDGE_AFTER * 3))
    call: Callable[[], str] = (
        (lambda: str(model.invoke("Hi").content))
        if shape == "invoke"
        else (lambda: _text(list(model.stream("Hi"))))
    )
    assert call() == PRIMARY_REPLY
    assert secondary.requests == []
    assert [e.kind for e in ledger.entries()] == ["chat"]


def test_hedge_after_is_validated_and_read_back_on_the_model(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    model, _, _ = _stack(servers)
    chain = model.find_layer(FallbackChatModel)
    assert chain is not None
    assert chain.hedge_after == HEDGE_AFTER
    primary, secondary = servers
    members = [_secondary(primary), _secondary(secondary)]
    assert FallbackChatModel(models=members).hedge_after is None
    with pytest.raises(ValueError, match="hedge_after must be greater than 0 seconds"):
        FallbackChatModel(models=members, hedge_after=0)
    with pytest.raises(ValueError, match="hedge_after must be shorter than first_token_timeout"):
        FallbackChatModel(models=members, hedge_after=5, first_token_timeout=5)
    stack = ResilienceBuilder().use_fallback_chain(members, hedge_after=1.5).build()
    built = stack.chat.find_layer(FallbackChatModel)
    assert built is not None
    assert built.hedge_after == 1.5
