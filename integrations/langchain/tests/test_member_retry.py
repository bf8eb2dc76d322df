"""``member_retry=`` through real ``ChatOpenAI`` clients against local fault servers.

A 429 with ``Retry-After: 1`` is waited out on the same member, which then answers (the
answer never comes sooner than the header asked); a persistent 503 is retried on the
same member, then the next member answers. Every call shape: ``invoke``, ``ainvoke``,
``stream``, ``astream``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_openai import ChatOpenAI

from langchain_llm_resilience import FallbackChatModel
from langchain_llm_resilience.builder import ResilienceBuilder
from llm_resilience import RetryPolicy
from llm_resilience.testing import Fault, FaultInjectingServer

PRIMARY_REPLY = "the primary answered after its wait"
SECONDARY_REPLY = "the secondary answered this request"
SHAPES = ["invoke", "ainvoke", "stream", "astream"]


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    # Fresh servers per test: the SDKs cache async HTTP clients per base URL.
    with (
        FaultInjectingServer(reply=PRIMARY_REPLY, name="primary") as primary,
        FaultInjectingServer(reply=SECONDARY_REPLY, name="secondary") as secondary,
    ):
        yield primary, secondary


def openai_model(server: FaultInjectingServer, max_retries: int = 0) -> ChatOpenAI:
    return ChatOpenAI(
        model="gpt-4o-mini",
        base_url=server.openai_base_url,
        api_key="test",  # type: ignore[arg-type]
        max_retries=max_retries,
        timeout=10,
    )


def chain(
    servers: tuple[FaultInjectingServer, FaultInjectingServer], **options: Any
) -> FallbackChatModel:
    primary, secondary = servers
    return FallbackChatModel(
        models=[openai_model(primary), openai_model(secondary)],
        per_client_timeout=10,
        **options,
    )


async def answer(model: FallbackChatModel, shape: str) -> str:
    prompt = "What is the capital of France?"
    if shape == "invoke":
        return str(model.invoke(prompt).content)
    if shape == "ainvoke":
        return str((await model.ainvoke(prompt)).content)
    if shape == "stream":
        return "".join(str(chunk.content) for chunk in model.stream(prompt))
    return "".join([str(chunk.content) async for chunk in model.astream(prompt)])


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_429_with_retry_after_is_waited_out_and_the_same_member_answers(
    shape: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, secondary = servers
    primary.script(Fault.status(429, retry_after=1))
    model = chain(servers, member_retry=RetryPolicy(attempts=2, max_delay=5, jitter=0))
    started = time.monotonic()
    assert await answer(model, shape) == PRIMARY_REPLY
    assert time.monotonic() - started >= 1.0
    assert [request.fault.kind for request in primary.requests] == ["status", "ok"]
    assert secondary.requests == []


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_persistent_503_is_retried_then_the_next_member_answers(
    shape: str,
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary, secondary = servers
    primary.script(Fault.status(503), Fault.status(503))
    model = chain(servers, member_retry=RetryPolicy(attempts=2, base_delay=0.1, jitter=0))
    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        assert await answer(model, shape) == SECONDARY_REPLY
    assert len(primary.requests) == 2
    assert len(secondary.requests) == 1
    messages = [r.getMessage() for r in caplog.records if r.name == "llm_resilience.fallback"]
    assert messages[0].startswith("Client 0 failed (")  # the error type is the SDK's
    assert messages[0].endswith("status 503); retrying the same client in 0.10 s (try 2 of 2).")
    assert len(messages) == 2  # then the chain's own "trying next client" line


def test_without_member_retry_a_429_goes_straight_to_the_next_member(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    primary.script(Fault.status(429, retry_after=1))
    started = time.monotonic()
    assert chain(servers).invoke("Hello?").content == SECONDARY_REPLY
    assert time.monotonic() - started < 1.0
    assert (len(primary.requests), len(secondary.requests)) == (1, 1)


def test_members_that_retry_by_themselves_are_still_warned_about(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary, secondary = servers
    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        FallbackChatModel(
            models=[openai_model(primary, max_retries=2), openai_model(secondary)],
            member_retry=RetryPolicy(attempts=2),
        )
    assert any("retries by itself (max_retries=2)" in r.getMessage() for r in caplog.records)


def test_the_builder_passes_member_retry_to_the_chain(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    policy = RetryPolicy(attempts=2, jitter=0)
    stack = (
        ResilienceBuilder()
        .use_fallback_chain([openai_model(primary), openai_model(secondary)], member_retry=policy)
        .build()
    )
    assert stack.chat.member_retry is policy
    assert stack.chat._chain.member_retry is policy
