"""A rate-limited wrapper with a token budget and no request budget.

``RateLimitedChatModel(inner=m, tokens_per_minute=...)`` limits tokens only (as
LlamaIndex's ``TokenBucketRateLimiter(tokens_per_minute=...)`` allows): each call weighs
its estimated prompt plus its output cap and waits on tokens alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding

from langchain_llm_resilience import RateLimitedChatModel, RateLimitedEmbeddings
from langchain_llm_resilience.testing import ScriptedChatModel

NEITHER = "give requests_per_minute, tokens_per_minute"


async def _until_queued(limiter: Any) -> None:
    for _ in range(1_000):
        if limiter.queued:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the call never queued")


def test_a_chat_wrapper_given_only_a_token_budget_counts_no_requests() -> None:
    inner = ScriptedChatModel(responses=["ok"])
    model = RateLimitedChatModel(inner=inner, tokens_per_minute=600_000)
    limiter = model.rate_limiter_in_use

    assert (limiter.requests_per_minute, limiter.tokens_per_minute) == (None, 600_000)
    for _ in range(100):
        assert model.invoke("hi").text == "ok"
    assert inner.calls == 100


async def test_a_chat_call_waits_on_tokens_alone_when_the_token_budget_is_spent() -> None:
    inner = ScriptedChatModel(responses=["ok"])
    model = RateLimitedChatModel(inner=inner, tokens_per_minute=1_000)
    limiter = model.rate_limiter_in_use
    assert limiter.acquire(1_000, blocking=False) is True  # another caller spent the minute

    waiting = asyncio.ensure_future(model.ainvoke("hi", max_tokens=100))
    await _until_queued(limiter)

    assert inner.calls == 0
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert (inner.calls, limiter.queued) == (0, 0)


@pytest.mark.parametrize(
    "build",
    [
        lambda: RateLimitedChatModel(inner=ScriptedChatModel()),
        lambda: RateLimitedChatModel(inner=ScriptedChatModel(), max_queued_requests=3),
        lambda: RateLimitedEmbeddings(inner=DeterministicFakeEmbedding(size=4)),
    ],
    ids=["chat", "chat-queue-only", "embeddings"],
)
def test_a_wrapper_with_no_budget_and_no_limiter_is_refused_naming_both_budgets(
    build: Any,
) -> None:
    with pytest.raises(ValueError, match=NEITHER):
        build()


def test_an_embeddings_wrapper_with_only_a_token_budget_weighs_its_texts() -> None:
    embeddings = RateLimitedEmbeddings(
        inner=DeterministicFakeEmbedding(size=4), tokens_per_minute=600
    )

    assert embeddings.limiter.requests_per_minute is None
    assert len(embeddings.embed_documents(["one two three"] * 3)) == 3
    assert embeddings.limiter.acquire(591, blocking=False) is True  # 9 tokens were taken
    assert embeddings.limiter.acquire(1, blocking=False) is False
