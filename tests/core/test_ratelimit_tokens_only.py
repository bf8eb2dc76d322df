"""Limiters with a token budget and no request budget, as LlamaIndex's own limiter allows.

``TokenBucketRateLimiter(None, tokens_per_minute=...)`` (and the Redis one) count tokens
only: requests are never counted, never wait. A limiter with neither budget would limit
nothing and is refused at construction, naming both options.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from llm_resilience.ratelimit import (
    RedisTokenBucketRateLimiter,
    TokenBucketRateLimiter,
    limiter_for,
)

NEITHER = "give requests_per_minute, tokens_per_minute"


class FrozenClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_tokens_only_limiter_counts_tokens_and_never_requests() -> None:
    clock = FrozenClock()
    limiter = TokenBucketRateLimiter(None, tokens_per_minute=600, clock=clock)

    assert limiter.requests_per_minute is None
    assert (limiter.capacity, limiter.permits_per_period) == (None, None)
    assert (limiter.token_capacity, limiter.tokens_per_period) == (600, 10)
    assert repr(limiter) == (
        "TokenBucketRateLimiter(requests_per_minute=None, max_queued_requests=None, "
        "tokens_per_minute=600)"
    )
    # Far more requests than any request budget would let through in one instant.
    assert all(limiter.acquire(0, blocking=False) for _ in range(5_000))
    # The tokens: a full bucket of 600, then 10 more each 1-second step.
    assert [limiter.acquire(100, blocking=False) for _ in range(7)] == [True] * 6 + [False]
    clock.now += 0.99
    assert limiter.acquire(10, blocking=False) is False
    clock.now += 0.01
    assert limiter.acquire(10, blocking=False) is True
    assert limiter.acquire(1, blocking=False) is False


async def test_a_tokens_only_limiter_queues_async_callers_on_tokens_alone() -> None:
    clock = FrozenClock()
    limiter = TokenBucketRateLimiter(None, tokens_per_minute=120, clock=clock)
    assert await limiter.aacquire(120) is True

    assert await limiter.aacquire(2, blocking=False) is False
    clock.now += 1.0  # one step: 2 tokens
    assert await limiter.aacquire(2, blocking=False) is True
    assert await limiter.aacquire(0, blocking=False) is True


@pytest.mark.parametrize(
    "build",
    [
        lambda: TokenBucketRateLimiter(),
        lambda: TokenBucketRateLimiter(None, max_queued_requests=5, tokens_per_minute=None),
        lambda: limiter_for(),
        lambda: limiter_for(max_queued_requests=5),
        lambda: RedisTokenBucketRateLimiter(name="no-budget"),
    ],
    ids=["in-process", "in-process-queue-only", "limiter_for", "limiter_for-queue-only", "redis"],
)
def test_a_limiter_with_neither_budget_is_refused_naming_both_options(build: Any) -> None:
    with pytest.raises(ValueError, match=NEITHER) as raised:
        build()
    assert "tokens_per_minute" in str(raised.value)


def test_a_limiter_built_like_llama_indexs_with_only_tokens_per_minute_is_tokens_only() -> None:
    # LlamaIndex's TokenBucketRateLimiter(tokens_per_minute=...) spelling, unchanged.
    limiter = TokenBucketRateLimiter(tokens_per_minute=40_000)
    redis_limiter = RedisTokenBucketRateLimiter(tokens_per_minute=40_000, name="tokens")

    for built in (limiter, redis_limiter):
        assert (built.requests_per_minute, built.tokens_per_minute) == (None, 40_000)
    redis_limiter.close()


def test_limiter_for_builds_a_tokens_only_limiter_from_tokens_per_minute_alone() -> None:
    limiter = limiter_for(tokens_per_minute=40_000, max_queued_requests=3)

    assert isinstance(limiter, TokenBucketRateLimiter)
    assert (limiter.requests_per_minute, limiter.tokens_per_minute) == (None, 40_000)
    assert limiter.max_queued_requests == 3


# -- the shared bucket ------------------------------------------------------------------


@pytest.fixture
def redis_limiter(redis_url: str) -> Iterator[RedisTokenBucketRateLimiter]:
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    limiter = RedisTokenBucketRateLimiter(
        None, tokens_per_minute=600, name="tokens-only", redis_url=redis_url
    )
    try:
        yield limiter
    finally:
        limiter.close()
        client.flushdb()
        client.close()


@pytest.mark.redis
def test_a_tokens_only_redis_limiter_counts_tokens_and_never_requests(
    redis_limiter: RedisTokenBucketRateLimiter,
) -> None:
    limiter = redis_limiter
    assert (limiter.requests_per_minute, limiter.capacity, limiter.permits_per_period) == (
        None,
        None,
        None,
    )

    assert all(limiter.acquire(0, blocking=False) for _ in range(300))
    # 600 tokens in the bucket: six calls of 100 now, the seventh is refused.
    granted = [limiter.acquire(100, blocking=False) for _ in range(7)]
    assert granted == [True] * 6 + [False]
    assert limiter.acquire(0, blocking=False) is True


@pytest.mark.redis
async def test_a_tokens_only_redis_limiter_serves_async_callers_alike(
    redis_limiter: RedisTokenBucketRateLimiter,
) -> None:
    limiter = redis_limiter
    assert all([await limiter.aacquire(0, blocking=False) for _ in range(100)])
    assert await limiter.aacquire(600, blocking=False) is True
    assert await limiter.aacquire(100, blocking=False) is False
    await limiter.aclose()
