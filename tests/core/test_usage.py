"""The accounting rules every adapter shares: what is reported, what is estimated, what it costs."""

from __future__ import annotations

from decimal import Decimal

import pytest

from llm_resilience.budget import ModelPrice
from llm_resilience.tokens import count_message_tokens, count_tokens
from llm_resilience.usage import (
    Usage,
    chat_usage,
    cost_of,
    embedding_usage,
    estimate_request_tokens,
)

PROMPT = [("system", "Be brief."), ("user", "What is the capital of France?")]
ANSWER = "Paris is the capital of France."


def test_chat_usage_keeps_the_providers_counts_when_both_are_reported() -> None:
    assert chat_usage(21, 7, prompt=PROMPT, response_text=ANSWER) == Usage(21, 7, estimated=False)


@pytest.mark.parametrize(
    ("reported_input", "reported_output"), [(None, 7), (21, None), (None, None)]
)
def test_chat_usage_estimates_both_sides_when_either_count_is_missing(
    reported_input: int | None, reported_output: int | None
) -> None:
    usage = chat_usage(reported_input, reported_output, prompt=PROMPT, response_text=ANSWER)
    assert usage == Usage(count_message_tokens(PROMPT), count_tokens(ANSWER), estimated=True)


def test_a_reported_input_of_zero_for_a_non_empty_prompt_is_not_a_report() -> None:
    usage = chat_usage(0, 7, prompt=PROMPT, response_text=ANSWER)
    assert usage == Usage(count_message_tokens(PROMPT), count_tokens(ANSWER), estimated=True)


def test_a_reported_input_of_zero_for_an_empty_prompt_is_believed() -> None:
    assert chat_usage(0, 3, prompt=[], response_text="hey") == Usage(0, 3, estimated=False)


def test_negative_reported_counts_are_estimated_instead_of_recorded() -> None:
    assert chat_usage(-1, 7, prompt=PROMPT, response_text=ANSWER).estimated


def test_embedding_usage_is_always_estimated_over_the_input_texts_with_no_output() -> None:
    texts = ["first chunk of a document", "second chunk"]
    usage = embedding_usage(texts)
    assert usage == Usage(sum(count_tokens(text) for text in texts), 0, estimated=True)
    assert embedding_usage([]) == Usage(0, 0, estimated=True)


def test_request_tokens_are_the_estimated_prompt_plus_the_max_output() -> None:
    assert estimate_request_tokens(PROMPT, 256) == count_message_tokens(PROMPT) + 256
    assert estimate_request_tokens(PROMPT, None) == count_message_tokens(PROMPT)
    with pytest.raises(ValueError, match="max_output_tokens"):
        estimate_request_tokens(PROMPT, -1)


def test_chat_cost_is_tokens_times_price_per_million_exactly() -> None:
    price = ModelPrice("3", "15")
    assert cost_of(Usage(1_000, 500, estimated=False), price) == Decimal("0.0105")
    assert cost_of(Usage(1, 0, estimated=False), ModelPrice("0.1", 0)) == Decimal("0.0000001")


def test_cost_never_rounds_however_many_digits_the_price_has() -> None:
    price = ModelPrice("0.1234567890123456789012345678901234567", 0)
    cost = cost_of(Usage(999_999_999, 0, estimated=False), price)
    assert cost * 1_000_000 == Decimal(999_999_999) * price.input_per_mtok  # no 28-digit rounding


def test_embeddings_bill_at_the_embedding_rate_or_else_the_input_rate() -> None:
    usage = Usage(2_000_000, 0, estimated=True)
    assert cost_of(usage, ModelPrice(1, 5, "0.02"), surface="embedding") == Decimal("0.04")
    assert cost_of(usage, ModelPrice("0.13", 0), surface="embedding") == Decimal("0.26")


def test_usage_refuses_negative_or_non_integer_counts() -> None:
    with pytest.raises(ValueError, match="input_tokens"):
        Usage(-1, 0, estimated=False)
    with pytest.raises(ValueError, match="output_tokens"):
        Usage(0, 1.5, estimated=False)  # type: ignore[arg-type]
