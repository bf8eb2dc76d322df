"""``first_token_timeout`` and ``idle_timeout`` through real LlamaIndex ``OpenAI`` members.

The primary talks to a local fault server that holds its first token back or stalls
mid-stream; the secondary is healthy. For ``chat``, ``achat``, ``stream_chat`` and
``astream_chat`` the chain moves on within about the limit, a stalled stream restarts
with a ``FallbackStreamRestartEvent``, and once the faults are over no worker thread is
busy and no task is pending.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.resilience import FallbackLLM, ResilienceBuilder
from llama_index.resilience.testing import FakeFunctionCallingLLM, RestartEvents, restart_events

from llm_resilience.fallback._workers import _WORKERS
from llm_resilience.testing import Fault, FaultInjectingServer

openai_llms = pytest.importorskip("llama_index.llms.openai")

PRIMARY_REPLY = "one two three four five six seven eight"
SECONDARY_REPLY = "the secondary answered this request"
QUESTION = [ChatMessage(role=MessageRole.USER, content="Capital of France?")]
LIMIT = 0.5
FAULT_SECONDS = 2.5
SLACK = 1.5

FAULTS = {
    "slow-first-token": Fault.slow_first_token(FAULT_SECONDS),
    "stall": Fault.stall_mid_stream(after_chunks=3, seconds=FAULT_SECONDS),
}


@pytest.fixture
def restarts() -> Iterator[RestartEvents]:
    with restart_events() as handler:
        yield handler


def _assert_no_thread_left(baseline: set[threading.Thread], within: float = 5.0) -> None:
    """Every thread the test started has ended or is a pooled worker waiting for work."""
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
    """No task but the test's own once the loop ran a few turns (asyncio closes the
    SDK's abandoned inner generators in tasks of its own)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while asyncio.all_tasks() != {asyncio.current_task()}:
        assert loop.time() < deadline, asyncio.all_tasks()
        await asyncio.sleep(0.01)


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    baseline = set(threading.enumerate())
    with (
        FaultInjectingServer(reply=PRIMARY_REPLY, name="primary") as primary,
        FaultInjectingServer(reply=SECONDARY_REPLY, name="secondary") as secondary,
    ):
        yield primary, secondary
    _assert_no_thread_left(baseline)


@pytest.fixture
def llm(servers: tuple[FaultInjectingServer, FaultInjectingServer]) -> FallbackLLM:
    members = [
        openai_llms.OpenAI(
            model=name, api_base=server.openai_base_url, api_key="t", max_retries=0, timeout=10
        )
        for name, server in zip(("gpt-4o-mini", "gpt-4o"), servers, strict=True)
    ]
    # A member's first sync call builds its SDK client (about 0.7 s on a loaded machine),
    # which first_token_timeout would count; warm them so the limit times the server.
    for member, server in zip(members, servers, strict=True):
        member.chat(QUESTION)
        server.reset()
    return FallbackLLM(
        llms=members, per_client_timeout=10, first_token_timeout=LIMIT, idle_timeout=LIMIT
    )


def _assert_failed_over_in_time(began: float) -> None:
    elapsed = time.monotonic() - began
    assert LIMIT * 0.9 <= elapsed < LIMIT + SLACK, elapsed


@pytest.mark.parametrize("fault", list(FAULTS))
def test_chat_moves_to_the_secondary_within_the_first_token_timeout(
    fault: str, llm: FallbackLLM, servers: tuple[FaultInjectingServer, ...]
) -> None:
    primary, secondary = servers
    primary.script(FAULTS[fault])
    began = time.monotonic()
    response = llm.chat(QUESTION)
    _assert_failed_over_in_time(began)
    assert response.message.content == SECONDARY_REPLY
    assert len(secondary.requests) == 1


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_achat_moves_to_the_secondary_within_the_first_token_timeout(
    fault: str, llm: FallbackLLM, servers: tuple[FaultInjectingServer, ...]
) -> None:
    primary, secondary = servers
    primary.script(FAULTS[fault])
    began = time.monotonic()
    response = await llm.achat(QUESTION)
    _assert_failed_over_in_time(began)
    assert response.message.content == SECONDARY_REPLY
    assert len(secondary.requests) == 1
    await _assert_no_task_left()


def _assert_restarted(fault: str, text: str, restarts: RestartEvents) -> None:
    if fault == "stall":
        assert text == "one two three" + SECONDARY_REPLY
        assert [
            (e.failed_client, e.next_client, e.chunks, e.error_type) for e in restarts.events
        ] == [(0, 1, 3, "TimeoutError")]
    else:
        # No content was delivered: nothing for the consumer to drop.
        assert text == SECONDARY_REPLY
        assert all(event.chunks == 0 for event in restarts.events)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_stream_chat_restarts_on_the_secondary_within_the_limit(
    fault: str, llm: FallbackLLM, servers: tuple[FaultInjectingServer, ...], restarts: RestartEvents
) -> None:
    primary, _ = servers
    primary.script(FAULTS[fault])
    began = time.monotonic()
    text = "".join(chunk.delta or "" for chunk in llm.stream_chat(QUESTION))
    _assert_failed_over_in_time(began)
    _assert_restarted(fault, text, restarts)


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_astream_chat_restarts_on_the_secondary_within_the_limit(
    fault: str, llm: FallbackLLM, servers: tuple[FaultInjectingServer, ...], restarts: RestartEvents
) -> None:
    primary, _ = servers
    primary.script(FAULTS[fault])
    began = time.monotonic()
    text = "".join([chunk.delta or "" async for chunk in await llm.astream_chat(QUESTION)])
    _assert_failed_over_in_time(began)
    _assert_restarted(fault, text, restarts)
    await _assert_no_task_left()


def test_the_time_limits_are_validated_and_read_back_on_the_llm(llm: FallbackLLM) -> None:
    assert (llm.first_token_timeout, llm.idle_timeout) == (LIMIT, LIMIT)
    with pytest.raises(ValueError, match="first_token_timeout must be greater than 0 seconds"):
        FallbackLLM(llms=list(llm.llms), first_token_timeout=-1)
    with pytest.raises(ValueError, match="idle_timeout must be at most 31536000 seconds"):
        FallbackLLM(llms=list(llm.llms), idle_timeout=10**9)


def test_the_builder_passes_the_time_limits_to_the_fallback_chain() -> None:
    members = [FakeFunctionCallingLLM(), FakeFunctionCallingLLM()]
    stack = ResilienceBuilder().use_fallback_chain(members, first_token_timeout=5).build()
    chain = stack.chat.find_layer(FallbackLLM)
    assert chain is not None
    assert (chain.first_token_timeout, chain.idle_timeout) == (5, None)
    with pytest.raises(ValueError, match="first_token_timeout must be greater than 0 seconds"):
        ResilienceBuilder().use_fallback_chain(members, first_token_timeout=0)
