"""Broken streams through LlamaIndex's real ``OpenAI`` LLM against the fault server.

One undecodable SSE event restarts the stream on the next member, and the final
response holds only that member's answer; a stream missing ``data: [DONE]`` completes at
once with its usage; a restarted stream is recorded under the member that served.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.resilience import CostTrackedLLM, FallbackLLM
from llama_index.resilience.testing import (
    FakeFunctionCallingLLM,
    RestartEvents,
    rate_limit_error,
    restart_events,
)

from llm_resilience import Cooldown, CostBudget
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.testing import Fault, FaultInjectingServer

openai_llms = pytest.importorskip("llama_index.llms.openai")

PRIMARY_REPLY = "one two three four five six seven eight"
SECONDARY_REPLY = "the secondary answered this request"
MESSAGES = [ChatMessage(role=MessageRole.USER, content="Capital of France?")]


@pytest.fixture
def restarts() -> Iterator[RestartEvents]:
    with restart_events() as handler:
        yield handler


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    with (
        FaultInjectingServer(reply=PRIMARY_REPLY, name="primary") as primary,
        FaultInjectingServer(reply=SECONDARY_REPLY, name="secondary") as secondary,
    ):
        yield primary, secondary


def member(model: str, server: FaultInjectingServer) -> Any:
    return openai_llms.OpenAI(
        model=model,
        api_base=server.openai_base_url,
        api_key="test",
        max_retries=0,
        timeout=10,
        additional_kwargs={"stream_options": {"include_usage": True}},
    )


def chain(servers: tuple[FaultInjectingServer, FaultInjectingServer]) -> FallbackLLM:
    primary, secondary = servers
    return FallbackLLM(
        llms=[member("gpt-4o-mini", primary), member("gpt-4.1-mini", secondary)],
        per_client_timeout=10,
    )


async def streamed(llm: Any, method: str) -> list[ChatResponse]:
    if method == "stream_chat":
        return list(llm.stream_chat(MESSAGES))
    return [chunk async for chunk in await llm.astream_chat(MESSAGES)]


METHODS = ["stream_chat", "astream_chat"]


@pytest.mark.parametrize("method", METHODS)
async def test_a_malformed_event_mid_stream_restarts_on_the_next_member_and_answers_with_it(
    method: str,
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    restarts: RestartEvents,
) -> None:
    primary, secondary = servers
    primary.script(Fault.malformed_chunk(after_chunks=2))
    llm = chain(servers)
    chunks = await streamed(llm, method)
    final = chunks[-1]
    assert final.message.content == SECONDARY_REPLY
    assert final.raw.model == "gpt-4.1-mini"
    [restart] = restarts.events
    assert (restart.failed_client, restart.next_client, restart.chunks) == (0, 1, 2)
    assert restart.error_type == "JSONDecodeError"
    # The process is fine: the next call is the (now healthy) primary's.
    again = await streamed(llm, method)
    assert again[-1].message.content == PRIMARY_REPLY
    assert len(secondary.requests) == 1


@pytest.mark.parametrize("method", METHODS)
async def test_a_stream_without_done_completes_at_once_with_its_usage(
    method: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, secondary = servers
    primary.script(Fault.missing_done())
    started = time.monotonic()
    chunks = await streamed(chain(servers), method)
    assert time.monotonic() - started < 2.0
    assert chunks[-1].message.content == PRIMARY_REPLY
    usage = [c.raw.usage for c in chunks if getattr(c.raw, "usage", None) is not None]
    assert usage
    assert usage[-1].completion_tokens == len(PRIMARY_REPLY.split())
    assert secondary.requests == []


@pytest.mark.parametrize("method", METHODS)
async def test_a_stream_restarted_mid_way_is_recorded_under_the_member_that_served(
    method: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, _ = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    ledger = InMemoryCostLedger()
    budget = CostBudget(input_price_per_mtok=1, output_price_per_mtok=2, daily_limit=10)
    llm = CostTrackedLLM(inner=chain(servers), budget=budget, ledger=ledger)
    chunks = await streamed(llm, method)
    assert chunks[-1].message.content == SECONDARY_REPLY
    [entry] = ledger.entries()
    assert entry.model == "gpt-4.1-mini"


def test_health_shows_a_member_whose_breaker_opened_after_real_503s(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    llm = FallbackLLM(
        llms=[member("gpt-4o-mini", primary), member("gpt-4.1-mini", secondary)],
        cooldown=Cooldown(failures=2, window=60, duration=30),
    )
    assert [m.state for m in llm.health()] == ["closed", "closed"]
    primary.default_fault = Fault.status(503)
    llm.chat(MESSAGES)
    assert (llm.health()[0].state, llm.health()[0].failures) == ("closed", 1)
    llm.chat(MESSAGES)
    first, second = llm.health()
    assert first.state == "open"
    assert 29 < first.retry_in <= 30
    assert second.state == "closed"
    assert llm.chat(MESSAGES).message.content == SECONDARY_REPLY
    assert len(primary.requests) == 2  # skipped while open


class UnnamedFake(FakeFunctionCallingLLM):
    """A member whose stream chunks never name a model in ``raw`` (as some providers')."""

    def _raw(self, usage: dict[str, int] | None) -> dict[str, Any]:
        raw = super()._raw(usage)
        del raw["model"]
        return raw


@pytest.mark.parametrize("method", METHODS)
async def test_a_restarted_stream_never_keeps_the_failed_members_model_name(method: str) -> None:
    failing = FakeFunctionCallingLLM(
        model_name="model-a", text="one two three", fail_after_chunks=2, error=rate_limit_error()
    )
    serving = UnnamedFake(model_name="model-b", text="the answer")
    ledger = InMemoryCostLedger()
    budget = CostBudget(input_price_per_mtok=1, output_price_per_mtok=2, daily_limit=10)
    llm = CostTrackedLLM(inner=FallbackLLM(llms=[failing, serving]), budget=budget, ledger=ledger)
    chunks = await streamed(llm, method)
    assert chunks[-1].message.content == "the answer"
    [entry] = ledger.entries()
    assert entry.model == "model-b"
