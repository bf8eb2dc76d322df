"""The limiter options every rate-limited wrapper takes (``LimiterOptions``, ``limiter_for``)."""

from __future__ import annotations

from typing import Any

import pytest

from llm_resilience.ratelimit import LimiterOptions, TokenBucketRateLimiter, limiter_for


def test_an_unknown_option_is_refused_naming_it_and_the_closest_option() -> None:
    misspelled: dict[str, Any] = {"requests_per_minute": 300, "max_queue_requests": 5}
    with pytest.raises(
        TypeError, match="limiter_for takes no keyword 'max_queue_requests'"
    ) as raised:
        limiter_for(**misspelled)
    assert "did you mean 'max_queued_requests'?" in str(raised.value)


def test_an_option_close_to_none_is_refused_with_every_option_named() -> None:
    with pytest.raises(TypeError, match="limiter_for takes no keyword 'burst'") as raised:
        limiter_for(**{"burst": 10})  # type: ignore[typeddict-unknown-key]
    assert "did you mean" not in str(raised.value)
    for name in LimiterOptions.__annotations__:
        assert name in str(raised.value)


def test_every_declared_option_reaches_the_limiter_it_builds() -> None:
    options: LimiterOptions = {
        "requests_per_minute": 120,
        "max_queued_requests": 4,
        "tokens_per_minute": 9_000,
    }
    limiter = limiter_for(**options)
    assert isinstance(limiter, TokenBucketRateLimiter)
    assert (limiter.requests_per_minute, limiter.max_queued_requests) == (120, 4)
    assert limiter.tokens_per_minute == 9_000
    assert limiter_for(limiter=limiter) is limiter
