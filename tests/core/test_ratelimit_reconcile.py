"""The rules for a call's token weight: what it weighs before, how it settles after.

Both adapters call :func:`llm_resilience.ratelimit.request_weight` before a call and
:func:`llm_resilience.ratelimit.reconcile_with_usage` after a successful one; these tests
pin both rules on a real bucket with a frozen clock.
"""

from __future__ import annotations

import logging

import pytest

from llm_resilience.ratelimit import TokenBucketRateLimiter, reconcile_with_usage, request_weight
from llm_resilience.tokens import count_message_tokens, count_tokens

PROMPT = [("user", "What is the capital of France?")]


def frozen() -> float:
    return 0.0


def weighed_bucket() -> TokenBucketRateLimiter:
    """A full 1,000-token bucket that never refills, after one call weighed 600 tokens."""
    limiter = TokenBucketRateLimiter(60, tokens_per_minute=1000, clock=frozen)
    assert limiter.acquire(600, blocking=False) is True
    return limiter


def test_a_report_gives_the_unused_weight_back_to_the_bucket() -> None:
    limiter = weighed_bucket()
    assert reconcile_with_usage(limiter, 600, 20, 80, prompt=PROMPT) is True
    # 400 left, 500 given back: 900 available, not 901.
    assert limiter.acquire(900, blocking=False) is True
    assert limiter.acquire(1, blocking=False) is False


@pytest.mark.parametrize(
    ("reported_input", "reported_output"),
    [(None, 80), (20, None), (None, None), (0, 80), (-1, 80), (True, 80)],
    ids=["no-input", "no-output", "nothing", "zero-input", "negative", "bool"],
)
def test_counts_that_are_not_a_report_leave_the_estimate_standing(
    reported_input: int | None, reported_output: int | None
) -> None:
    limiter = weighed_bucket()
    assert reconcile_with_usage(limiter, 600, reported_input, reported_output, prompt=PROMPT) is (
        False
    )
    assert limiter.acquire(400, blocking=False) is True
    assert limiter.acquire(1, blocking=False) is False


def test_an_input_of_zero_is_a_report_when_the_prompt_is_empty() -> None:
    limiter = weighed_bucket()
    assert reconcile_with_usage(limiter, 600, 0, 100, prompt=[]) is True
    assert limiter.acquire(900, blocking=False) is True


def test_a_limiter_without_a_token_budget_is_left_alone() -> None:
    limiter = TokenBucketRateLimiter(60, clock=frozen)
    assert limiter.acquire(blocking=False) is True
    assert reconcile_with_usage(limiter, 0, 20, 80, prompt=PROMPT) is False
    granted = sum(limiter.acquire(blocking=False) for _ in range(60))
    assert granted == 59  # one request permit each; no token bucket to charge or refund


class UnreachableLimiter:
    """A user-supplied limiter whose store is gone: settling raises."""

    tokens_per_minute = 1000

    def reconcile(self, estimated_tokens: int, actual_tokens: int) -> None:
        raise ConnectionError("limiter store at 10.0.0.7:6379 refused the connection")


def test_a_limiter_that_cannot_settle_logs_its_error_type_and_does_not_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="llm_resilience.ratelimit"):
        assert reconcile_with_usage(UnreachableLimiter(), 600, 20, 80, prompt=PROMPT) is False
    [record] = caplog.records
    assert "ConnectionError" in record.getMessage()
    assert "10.0.0.7" not in caplog.text  # the error's text may carry an address or a key


def test_a_chat_call_weighs_its_prompt_and_its_output_cap() -> None:
    limiter = TokenBucketRateLimiter(60, tokens_per_minute=10_000, clock=frozen)
    weight = request_weight(limiter, prompt=PROMPT, max_output_tokens=256)
    assert weight == count_message_tokens(PROMPT) + 256
    assert request_weight(limiter, prompt=PROMPT) == count_message_tokens(PROMPT)


def test_an_embedding_call_weighs_its_texts() -> None:
    limiter = TokenBucketRateLimiter(60, tokens_per_minute=10_000, clock=frozen)
    texts = ["hello world", "the quick brown fox"]
    assert request_weight(limiter, texts=texts) == sum(count_tokens(text) for text in texts)


def test_without_a_token_budget_a_call_weighs_nothing() -> None:
    limiter = TokenBucketRateLimiter(60, clock=frozen)
    assert request_weight(limiter, prompt=PROMPT, max_output_tokens=256) == 0
    assert request_weight(limiter, texts=["hello"]) == 0
