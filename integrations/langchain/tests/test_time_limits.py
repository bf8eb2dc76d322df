"""``first_token_timeout`` and ``idle_timeout`` through real ``ChatOpenAI``/``ChatAnthropic``.

The primary (a real ``ChatOpenAI``) talks to a local fault server that either holds its
first token back or stalls mid-stream; the secondary (``ChatAnthropic`` or
``ChatOpenAI``) is healthy. For ``invoke``, ``ainvoke``, ``stream`` and ``astream`` the
chain must move on within about the limit, restart a stalled stream with the restart
event, and leave no worker thread busy and no task pending once the faults are over.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_openai import ChatOpenAI

from langchain_llm_resilience import FallbackChatModel, ResilienceBuilder
from langchain_llm_resilience.testing import RestartEvents
from llm_resilience.fallback._workers import _WORKERS
from llm_resilience.testing import Fault, FaultInjectingServer

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


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    baseline = set(threading.enumerate())
    with (
        FaultInjectingServer(reply=PRIMARY_REPLY, name="primary") as primary,
        FaultInjectingServer(reply=SECONDARY_REPLY, name="secondary") as secondary,
    ):
        yield primary, secondary
    _assert_no_thread_left(baseline)


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


def _chat_openai(server: FaultInjectingServer, name: str) -> ChatOpenAI:
    return ChatOpenAI(
        model=name,
        base_url=server.openai_base_url,
        api_key="test",  # type: ignore[arg-type]
        max_retries=0,
        timeout=10,
    )


def _chat_anthropic(server: FaultInjectingServer) -> ChatAnthropic:
    return ChatAnthropic(
        model_name="claude-haiku-4-5",
        base_url=server.anthropic_base_url,
        api_key="test",  # type: ignore[arg-type]
        max_retries=0,
        timeout=10,
        stop=None,
    )


# Which wire format fails (the primary's) and which one answers (the secondary's).
@pytest.fixture(params=["openai-then-anthropic", "openai-then-openai", "anthropic-then-openai"])
def model(
    request: pytest.FixtureRequest, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> FallbackChatModel:
    primary, secondary = servers
    first: BaseChatModel
    second: BaseChatModel
    if request.param == "openai-then-anthropic":
        first, second = _chat_openai(primary, "gpt-4o-mini"), _chat_anthropic(secondary)
    elif request.param == "openai-then-openai":
        first, second = _chat_openai(primary, "gpt-4o-mini"), _chat_openai(secondary, "gpt-4o")
    else:
        first, second = _chat_anthropic(primary), _chat_openai(secondary, "gpt-4o")
    # A member's first call sets up its SDK client, which first_token_timeout would
    # count; warm them so the limit times the server alone.
    for member, server in ((first, primary), (second, secondary)):
        member.invoke("warm up")
        server.reset()
    return FallbackChatModel(
        models=[first, second],
        per_client_timeout=10,
        first_token_timeout=LIMIT,
        idle_timeout=LIMIT,
    )


def _assert_failed_over_in_time(began: float) -> None:
    elapsed = time.monotonic() - began
    assert LIMIT * 0.9 <= elapsed < LIMIT + SLACK, elapsed


@pytest.mark.parametrize("fault", list(FAULTS))
def test_invoke_moves_to_the_secondary_within_the_first_token_timeout(
    fault: str, model: FallbackChatModel, servers: tuple[FaultInjectingServer, ...]
) -> None:
    primary, secondary = servers
    primary.script(FAULTS[fault])
    began = time.monotonic()
    answer = model.invoke("What is the capital of France?")
    _assert_failed_over_in_time(began)
    assert answer.content == SECONDARY_REPLY
    assert answer.response_metadata["fallback_served_by"] == [1]
    assert len(secondary.requests) == 1


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_ainvoke_moves_to_the_secondary_within_the_first_token_timeout(
    fault: str, model: FallbackChatModel, servers: tuple[FaultInjectingServer, ...]
) -> None:
    primary, secondary = servers
    primary.script(FAULTS[fault])
    began = time.monotonic()
    answer = await model.ainvoke("What is the capital of France?")
    _assert_failed_over_in_time(began)
    assert answer.content == SECONDARY_REPLY
    assert len(secondary.requests) == 1
    await _assert_no_task_left()


def _assert_restarted(fault: str, chunks: list[AIMessageChunk], restarts: RestartEvents) -> None:
    text = "".join(str(chunk.content) for chunk in chunks)
    if fault == "stall":
        # The prefix stays delivered; the restart event tells the consumer to drop it.
        assert text == "one two three" + SECONDARY_REPLY
        expected = 3
    else:
        # Only ChatOpenAI's empty opening chunk was delivered: nothing to drop.
        assert text == SECONDARY_REPLY
        expected = 0
    assert restarts.events == [
        {
            "failed_client": 0,
            "next_client": 1,
            "chunks": expected,
            "error_type": "TimeoutError",
            "continued": False,
        }
    ]
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert merged.response_metadata["fallback_served_by"] == [1]


@pytest.mark.parametrize("fault", list(FAULTS))
def test_stream_restarts_on_the_secondary_within_the_limit(
    fault: str, model: FallbackChatModel, servers: tuple[FaultInjectingServer, ...]
) -> None:
    primary, _ = servers
    primary.script(FAULTS[fault])
    restarts = RestartEvents()
    began = time.monotonic()
    chunks = list(model.stream("Capital of France?", {"callbacks": [restarts]}))
    _assert_failed_over_in_time(began)
    _assert_restarted(fault, chunks, restarts)


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_astream_restarts_on_the_secondary_within_the_limit(
    fault: str, model: FallbackChatModel, servers: tuple[FaultInjectingServer, ...]
) -> None:
    primary, _ = servers
    primary.script(FAULTS[fault])
    restarts = RestartEvents()
    began = time.monotonic()
    chunks = [c async for c in model.astream("Capital of France?", {"callbacks": [restarts]})]
    _assert_failed_over_in_time(began)
    _assert_restarted(fault, chunks, restarts)
    await _assert_no_task_left()


# -- a consumer that holds the last chunk ----------------------------------------------


def _fake_members() -> list[BaseChatModel]:
    return [
        GenericFakeChatModel(messages=iter([AIMessage(content="first answer")])),
        GenericFakeChatModel(messages=iter([AIMessage(content="second answer")])),
    ]


def test_a_finished_stream_is_not_restarted_when_the_consumer_holds_the_last_chunk() -> None:
    model = FallbackChatModel(models=_fake_members(), per_client_timeout=0.2)
    restarts = RestartEvents()
    chunks = []
    for chunk in model.stream("hi", {"callbacks": [restarts]}):
        chunks.append(chunk)
        if chunk.chunk_position == "last":
            time.sleep(0.3)  # longer than per_client_timeout, after the answer is whole
    assert "".join(str(chunk.content) for chunk in chunks) == "first answer"
    assert restarts.events == []


async def test_a_finished_astream_is_not_restarted_when_the_consumer_holds_the_last_chunk() -> None:
    model = FallbackChatModel(models=_fake_members(), per_client_timeout=0.2)
    restarts = RestartEvents()
    chunks = []
    async for chunk in model.astream("hi", {"callbacks": [restarts]}):
        chunks.append(chunk)
        await asyncio.sleep(0.3)  # after every chunk, the last included
    assert "".join(str(chunk.content) for chunk in chunks) == "first answer"
    assert restarts.events == []


# -- a healthy long answer ---------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_healthy_sixty_second_stream_is_never_cut_by_the_recommended_limits(
    long_stream_run: subprocess.Popen[str],
) -> None:
    """A 60 s answer with a token every 2 s finishes under first_token_timeout=5 and
    idle_timeout=5: no restart, nothing sent to the secondary. The stream runs in its own
    process (``long_stream.py``), started by the conftest when collection ends."""
    out, err = long_stream_run.communicate(timeout=170)
    assert long_stream_run.returncode == 0, err[-2000:]
    outcome = json.loads(out)
    assert outcome["seconds"] >= 30 * 2.0
    assert outcome["whole"] is True
    assert outcome["restarts"] == 0
    assert outcome["secondary_requests"] == 0


def test_the_time_limits_are_validated_and_read_back_on_the_model() -> None:
    model = FallbackChatModel(models=_fake_members(), first_token_timeout=5, idle_timeout=2.5)
    assert (model.first_token_timeout, model.idle_timeout) == (5, 2.5)
    with pytest.raises(ValueError, match="idle_timeout must be greater than 0 seconds; got 0"):
        FallbackChatModel(models=_fake_members(), idle_timeout=0)
    builder: Callable[..., Any] = FallbackChatModel
    with pytest.raises(ValueError, match="first_token_timeout must be None, a number"):
        builder(models=_fake_members(), first_token_timeout="soon")


@pytest.mark.parametrize("spelling", [30, 30.0, timedelta(seconds=30)], ids=["int", "float", "td"])
def test_a_duration_reads_back_and_keys_the_cache_as_seconds_as_float_whatever_its_spelling(
    spelling: float | timedelta,
) -> None:
    model = FallbackChatModel(
        models=_fake_members(), per_client_timeout=spelling, hedge_after=spelling / 10
    )
    reference = FallbackChatModel(models=_fake_members(), per_client_timeout=30.0, hedge_after=3.0)

    assert (model.per_client_timeout, model.hedge_after) == (30.0, 3.0)
    assert type(model.per_client_timeout) is float
    assert model._identifying_params == reference._identifying_params
    assert model._identifying_params["per_client_timeout"] == 30.0


def test_the_builder_passes_the_time_limits_to_the_fallback_chain() -> None:
    stack = (
        ResilienceBuilder()
        .use_fallback_chain(_fake_members(), first_token_timeout=5, idle_timeout=2)
        .build()
    )
    chain = stack.chat.find_layer(FallbackChatModel)
    assert chain is not None
    assert (chain.first_token_timeout, chain.idle_timeout) == (5, 2)
    with pytest.raises(ValueError, match="idle_timeout must be greater than 0 seconds"):
        ResilienceBuilder().use_fallback_chain(_fake_members(), idle_timeout=-2)
