"""``hedge_after`` through real LlamaIndex ``OpenAI`` members and the fault server.

The primary's server holds its first token back (``Fault.slow_first_token``); the
secondary's answers at once. The chain sits under a ``CostTrackedLLM``, so the ledger
is read too: one entry for the winner, plus a ``"hedge"`` entry when the loser's
provider reported usage. The primary's HTTP traffic goes through an ``httpx`` transport
that notes when a request is cancelled or a response closed. Instrumentation events
must show one call answered by the secondary.
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
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent
from llama_index.resilience import CostTrackedLLM, FallbackLLM

from llm_resilience import CostBudget, ModelPrice
from llm_resilience.budget import HEDGE_KIND
from llm_resilience.fallback._workers import _WORKERS
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.testing import Fault, FaultInjectingServer

openai_llms = pytest.importorskip("llama_index.llms.openai")

PRIMARY_REPLY = "the primary answered late"
SECONDARY_REPLY = "the secondary answered this request"
QUESTION = [ChatMessage(role=MessageRole.USER, content="Capital of France?")]
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


class _ChatEnds(BaseEventHandler):
    ends: list[str] = []

    @classmethod
    def class_name(cls) -> str:
        return "ChatEnds"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, LLMChatEndEvent) and event.response is not None:
            self.ends.append(str(event.response.message.content))


@pytest.fixture
def chat_ends() -> Iterator[_ChatEnds]:
    handler = _ChatEnds(ends=[])
    get_dispatcher().add_event_handler(handler)
    yield handler
    get_dispatcher().event_handlers.remove(handler)


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


Stack = tuple[CostTrackedLLM, InMemoryCostLedger, _Log]


def _stack(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    *,
    hedge_after: float | None = HEDGE_AFTER,
    budget: CostBudget | None = None,
) -> Stack:
    primary, secondary = servers
    log = _Log()
    members = [
        openai_llms.OpenAI(
            model="gpt-4o-mini",
            api_base=primary.openai_base_url,
            api_key="sk-FAKE-primary",
            max_retries=0,
            timeout=WAIT,
            http_client=httpx.Client(transport=_Transport(log)),
            async_http_client=httpx.AsyncClient(transport=_AsyncTransport(log)),
        ),
        openai_llms.OpenAI(
            model="gpt-4o",
            api_base=secondary.openai_base_url,
            api_key="sk-FAKE-secondary",
            max_retries=0,
            timeout=WAIT,
        ),
    ]
    # A member's first call builds its SDK client (tenths of a second on a loaded
    # machine): warm both, so the primary's request is on the wire before the hedge.
    for member, server in zip(members, servers, strict=True):
        member.chat(QUESTION)
        server.reset()
    log.events.clear()
    # Off by default: without hedge_after the option is not passed at all.
    options = {} if hedge_after is None else {"hedge_after": hedge_after}
    chain = FallbackLLM(llms=members, first_token_timeout=WAIT, **options)
    ledger = InMemoryCostLedger()
    if budget is None:
        budget = CostBudget(input_price_per_mtok=1, output_price_per_mtok=2, daily_limit=100)
    return CostTrackedLLM(inner=chain, budget=budget, ledger=ledger), ledger, log


def _winner_only(ledger: InMemoryCostLedger) -> None:
    # LlamaIndex's OpenAI does not ask for a stream's usage: streams are estimated.
    assert [(e.kind, e.model) for e in ledger.entries()] == [("chat", "gpt-4o")]


def test_chat_is_answered_by_the_hedge_and_the_late_primary_is_recorded_as_a_hedge(
    servers: tuple[FaultInjectingServer, FaultInjectingServer], chat_ends: _ChatEnds
) -> None:
    primary, secondary = servers
    llm, ledger, log = _stack(servers)
    chat_ends.ends.clear()  # the warm-up calls
    primary.script(Fault.slow_first_token(SLOW_SECONDS))
    response = llm.chat(QUESTION)
    assert response.message.content == SECONDARY_REPLY
    assert response.additional_kwargs["fallback_served_by"] == [1]
    assert chat_ends.ends == [SECONDARY_REPLY]
    assert len(secondary.requests) == 1
    _winner_only(ledger)
    # A sync call's loser cannot be interrupted: it runs to its end in its worker, and
    # the tokens its provider reported are recorded as spend, never as the answer.
    assert _settled()
    assert log.wait_for("closed")
    entries = ledger.entries()
    assert [(e.kind, e.model) for e in entries] == [("chat", "gpt-4o"), (HEDGE_KIND, "gpt-4o-mini")]
    assert entries[1].input_tokens > 0
    assert chat_ends.ends == [SECONDARY_REPLY]


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
    llm, ledger, _ = _stack(servers, budget=budget)
    primary.script(Fault.slow_first_token(SLOW_SECONDS))
    assert llm.chat(QUESTION).message.content == SECONDARY_REPLY
    assert _settled()
    deadline = time.monotonic() + WAIT
    while len(ledger.entries()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    hedge = next(e for e in ledger.entries() if e.kind == HEDGE_KIND)
    assert hedge.cache_read_tokens == 4
    uncached = hedge.input_tokens - hedge.cache_read_tokens
    assert hedge.cost == (Decimal(uncached) * 10 + 4 * 1 + Decimal(hedge.output_tokens) * 20) / (
        10**6
    )


async def test_achat_cancels_the_slow_primarys_request_when_the_hedge_answers(
    servers: tuple[FaultInjectingServer, FaultInjectingServer], chat_ends: _ChatEnds
) -> None:
    primary, _ = servers
    llm, ledger, log = _stack(servers)
    chat_ends.ends.clear()  # the warm-up calls
    primary.script(Fault.slow_first_token(SLOW_SECONDS * 10))
    response = await llm.achat(QUESTION)
    assert response.message.content == SECONDARY_REPLY
    assert log.events == ["started", "cancelled"]
    assert chat_ends.ends == [SECONDARY_REPLY]
    _winner_only(ledger)
    assert await _no_task_left()


def test_stream_chat_delivers_only_the_hedges_answer_and_closes_the_primary(
    servers: tuple[FaultInjectingServer, FaultInjectingServer], chat_ends: _ChatEnds
) -> None:
    primary, _ = servers
    llm, ledger, log = _stack(servers)
    chat_ends.ends.clear()  # the warm-up calls
    primary.script(Fault.slow_first_token(SLOW_SECONDS))
    chunks = list(llm.stream_chat(QUESTION))
    assert "".join(chunk.delta or "" for chunk in chunks) == SECONDARY_REPLY
    assert chunks[-1].additional_kwargs["fallback_served_by"] == [1]
    assert chat_ends.ends == [SECONDARY_REPLY]
    _winner_only(ledger)
    # The loser's worker is blocked in its read until a byte arrives: it then closes its
    # stream instead of reading the answer, and goes back to the pool. LlamaIndex's
    # OpenAI generator does not close the SDK's stream when it is closed; the response
    # is closed when that stream is collected.
    assert _settled()
    gc.collect()
    assert log.wait_for("closed")
    _winner_only(ledger)


async def test_astream_chat_delivers_only_the_hedges_answer_and_closes_the_primary_at_once(
    servers: tuple[FaultInjectingServer, FaultInjectingServer], chat_ends: _ChatEnds
) -> None:
    primary, _ = servers
    llm, ledger, log = _stack(servers)
    chat_ends.ends.clear()  # the warm-up calls
    primary.script(Fault.slow_first_token(SLOW_SECONDS * 10))
    text = ""
    async for chunk in await llm.astream_chat(QUESTION):
        if chunk.delta:
            assert "closed" in log.events  # closed before the first word arrived
        text += chunk.delta or ""
    assert text == SECONDARY_REPLY
    assert log.events == ["started", "closed"]
    assert chat_ends.ends == [SECONDARY_REPLY]
    _winner_only(ledger)
    assert await _no_task_left()


def test_without_hedge_after_a_slow_primary_is_simply_waited_for(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    llm, ledger, _ = _stack(servers, hedge_after=None)
    primary.script(Fault.slow_first_token(HEDGE_AFTER * 3))
    assert llm.chat(QUESTION).message.content == PRIMARY_REPLY
    assert secondary.requests == []
    assert [(e.kind, e.model) for e in ledger.entries()] == [("chat", "gpt-4o-mini")]


def test_hedge_after_is_validated_and_read_back_on_the_llm(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    llm, _, _ = _stack(servers)
    chain = llm.find_layer(FallbackLLM)
    assert chain is not None
    assert chain.hedge_after == HEDGE_AFTER
    members = list(chain.llms)
    assert FallbackLLM(llms=members).hedge_after is None
    with pytest.raises(ValueError, match="hedge_after must be greater than 0 seconds"):
        FallbackLLM(llms=members, hedge_after=-1)
    with pytest.raises(ValueError, match="hedge_after must be shorter than per_client_timeout"):
        FallbackLLM(llms=members, hedge_after=5, per_client_timeout=2)
