"""A rate-limited wrapper with a token budget and no request budget, in both adapters.

``tokens_per_minute`` alone limits tokens only (as LlamaIndex's
``TokenBucketRateLimiter(tokens_per_minute=...)`` allows): each call weighs its estimated
prompt plus its output cap and waits on tokens alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

NEITHER = "give requests_per_minute, tokens_per_minute"


async def until_queued(limiter: Any) -> None:
    for _ in range(1_000):
        if limiter.queued:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the call never queued")


def test_a_chat_wrapper_given_only_a_token_budget_counts_no_requests(driver: Any) -> None:
    inner = driver.answering("ok")
    model = driver.rate_limited(inner, tokens_per_minute=600_000)
    limiter = driver.limiter_of(model)

    assert (limiter.requests_per_minute, limiter.tokens_per_minute) == (None, 600_000)
    for _ in range(100):
        driver.run_sync(model)
    assert driver.calls(inner) == 100


async def test_a_call_waits_on_tokens_alone_when_the_token_budget_is_spent(driver: Any) -> None:
    inner = driver.answering()
    model = driver.rate_limited(inner, tokens_per_minute=1_000)
    limiter = driver.limiter_of(model)
    assert limiter.acquire(1_000, blocking=False) is True  # another caller spent the minute

    waiting = asyncio.ensure_future(driver.run(model, "acall", max_tokens=100))
    await until_queued(limiter)

    assert driver.calls(inner) == 0
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert (driver.calls(inner), limiter.queued) == (0, 0)


@pytest.mark.parametrize(
    "build",
    [
        lambda driver: driver.rate_limited(driver.answering()),
        lambda driver: driver.rate_limited(driver.answering(), max_queued_requests=3),
        lambda driver: driver.rate_limited_embeddings(driver.embeddings(4)),
    ],
    ids=["chat", "chat-queue-only", "embeddings"],
)
def test_a_wrapper_with_no_budget_and_no_limiter_is_refused_naming_both_budgets(
    driver: Any, build: Any
) -> None:
    with pytest.raises(ValueError, match=NEITHER):
        build(driver)


async def test_an_embeddings_wrapper_with_only_a_token_budget_weighs_its_texts(
    driver: Any,
) -> None:
    embeddings = driver.rate_limited_embeddings(driver.embeddings(4), tokens_per_minute=600)
    limiter = embeddings.limiter

    assert limiter.requests_per_minute is None
    assert await driver.embed(embeddings, ["one two three"] * 3, "batch") == 3
    assert limiter.acquire(591, blocking=False) is True  # 9 tokens were taken
    assert limiter.acquire(1, blocking=False) is False
