"""Users' tests can move a limiter's time with ``freezegun``, as the frameworks' tests do.

The in-process limiter reads ``time.monotonic`` on every look at the bucket (not a
function bound at import), so ``freeze_time`` and its ``tick`` move its 1-second steps.
"""

from __future__ import annotations

import asyncio

import freezegun
import pytest
from freezegun import freeze_time

from llm_resilience.ratelimit import TokenBucketRateLimiter

# freeze_time reads every attribute of every loaded module; the cohere SDK (imported by
# the Cohere tests of the same session) loads its types lazily on attribute access, and
# building those pydantic models under a frozen clock fails on freezegun's FakeDatetime.
freezegun.configure(extend_ignore_list=["cohere"])


def drain(limiter: TokenBucketRateLimiter) -> int:
    taken = 0
    while limiter.acquire(blocking=False):
        taken += 1
    return taken


def test_a_frozen_clock_holds_the_bucket_and_ticking_it_refills_one_step() -> None:
    with freeze_time("2026-01-01 12:00:00") as frozen:
        limiter = TokenBucketRateLimiter(requests_per_minute=120)  # 2 a second, burst 120
        assert drain(limiter) == 120

        frozen.tick(0.999)  # still inside the first step: nothing refilled
        assert limiter.acquire(blocking=False) is False
        frozen.tick(0.001)
        assert drain(limiter) == 2
        frozen.tick(60)  # a minute later the bucket is full again, and no fuller
        assert drain(limiter) == 120


def test_ticking_a_frozen_clock_refills_a_tokens_only_budget_step_by_step() -> None:
    with freeze_time("2026-01-01 12:00:00") as frozen:
        limiter = TokenBucketRateLimiter(None, tokens_per_minute=600)  # 10 tokens a second
        assert limiter.acquire(600, blocking=False) is True
        assert limiter.acquire(1, blocking=False) is False

        frozen.tick(3)
        assert limiter.acquire(30, blocking=False) is True
        assert limiter.acquire(1, blocking=False) is False


async def test_async_callers_follow_the_frozen_clock_too() -> None:
    # real_asyncio keeps the event loop's own timers on real time.
    with freeze_time("2026-01-01 12:00:00", real_asyncio=True) as frozen:
        limiter = TokenBucketRateLimiter(60)
        assert all([await limiter.aacquire(blocking=False) for _ in range(60)])
        assert await limiter.aacquire(blocking=False) is False

        waiter = asyncio.ensure_future(limiter.aacquire())
        await asyncio.sleep(0.05)
        assert not waiter.done()
        assert limiter.queued == 1
        frozen.tick(1.0)
        # The waiter's own timer runs on real time (about a second away); any look at
        # the bucket on the moved clock grants it now.
        assert await limiter.aacquire(blocking=False) is False
        for _ in range(5):
            await asyncio.sleep(0)
        assert waiter.done()
        assert waiter.result() is True


def test_a_limiter_built_with_its_own_clock_ignores_freezegun() -> None:
    now = [0.0]
    with freeze_time("2026-01-01 12:00:00") as frozen:
        limiter = TokenBucketRateLimiter(60, clock=lambda: now[0])
        assert drain(limiter) == 60
        frozen.tick(5)
        assert limiter.acquire(blocking=False) is False
        now[0] = 1.0
        assert drain(limiter) == 1


@pytest.mark.parametrize("clock", ["now", 3.0])
def test_a_clock_that_is_not_callable_is_refused_naming_the_option(clock: object) -> None:
    with pytest.raises(TypeError, match="clock must be a callable returning seconds"):
        TokenBucketRateLimiter(60, clock=clock)  # type: ignore[arg-type]
