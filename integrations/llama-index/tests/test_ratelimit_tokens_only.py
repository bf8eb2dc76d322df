"""Token budgets without a request budget, in our wrappers and in LlamaIndex's own slot.

``RateLimitedLLM(inner=llm, tokens_per_minute=...)`` limits tokens only, like LlamaIndex's
``TokenBucketRateLimiter(tokens_per_minute=...)``: our wrapper weighs each call (estimated
prompt plus output cap). LlamaIndex's own ``rate_limiter=`` slot calls ``acquire()``
without a token count, so there a tokens-only budget limits nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.embeddings import MockEmbedding
from llama_index.resilience import RateLimitedEmbedding, RateLimitedLLM
from llama_index.resilience.testing import FakeFunctionCallingLLM

from llm_resilience.ratelimit import TokenBucketRateLimiter

NEITHER = "give requests_per_minute, tokens_per_minute"
MESSAGES = [ChatMessage(role=MessageRole.USER, content="What is the capital of France?")]


class AskedLimiter(TokenBucketRateLimiter):
    """Remembers the token count of every ``acquire``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: list[int] = []

    def acquire(self, num_tokens: int = 0, **kwargs: Any) -> bool:
        self.asked.append(num_tokens)
        return super().acquire(num_tokens, **kwargs)


async def _until_queued(limiter: Any) -> None:
    for _ in range(1_000):
        if limiter.queued:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the call never queued")


async def test_an_llm_call_waits_on_tokens_alone_when_the_token_budget_is_spent() -> None:
    inner = FakeFunctionCallingLLM(num_output=100)
    llm = RateLimitedLLM(inner=inner, tokens_per_minute=1_000)
    limiter = llm.limiter
    assert (limiter.requests_per_minute, limiter.tokens_per_minute) == (None, 1_000)
    assert limiter.acquire(1_000, blocking=False) is True  # another caller spent the minute

    waiting = asyncio.ensure_future(llm.achat(MESSAGES))
    await _until_queued(limiter)

    assert inner.calls == 0
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert (inner.calls, limiter.queued) == (0, 0)


def test_in_llama_indexs_own_slot_a_tokens_only_budget_limits_nothing() -> None:
    # One token a minute: any call our wrapper weighs could never be granted.
    limiter = AskedLimiter(None, tokens_per_minute=1)
    in_slot = FakeFunctionCallingLLM(rate_limiter=limiter)

    for _ in range(20):
        in_slot.chat(MESSAGES)

    assert in_slot.calls == 20
    assert limiter.asked == [0] * 20  # LlamaIndex's callback calls acquire() with no count
    assert limiter.acquire(1, blocking=False) is True  # so the token was never touched


@pytest.mark.parametrize(
    "build",
    [
        lambda: RateLimitedLLM(inner=FakeFunctionCallingLLM()),
        lambda: RateLimitedLLM(inner=FakeFunctionCallingLLM(), max_queued_requests=3),
        lambda: RateLimitedEmbedding(inner=MockEmbedding(embed_dim=4)),
    ],
    ids=["llm", "llm-queue-only", "embedding"],
)
def test_a_wrapper_with_no_budget_and_no_limiter_is_refused_naming_both_budgets(
    build: Any,
) -> None:
    with pytest.raises(ValueError, match=NEITHER):
        build()


def test_an_embedding_wrapper_with_only_a_token_budget_weighs_its_texts() -> None:
    embedding = RateLimitedEmbedding(inner=MockEmbedding(embed_dim=4), tokens_per_minute=600)

    assert embedding.limiter.requests_per_minute is None
    assert len(embedding.get_text_embedding_batch(["one two three"] * 3)) == 3
    assert embedding.limiter.acquire(591, blocking=False) is True  # 9 tokens were taken
    assert embedding.limiter.acquire(1, blocking=False) is False
