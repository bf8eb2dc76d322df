"""The accounting rules every adapter shares: what is reported, what is estimated, what it costs."""

from __future__ import annotations

from decimal import Decimal

import pytest

from llm_resilience.budget import ModelPrice
from llm_resilience.money import cost_of
from llm_resilience.tokens import count_message_tokens, count_tokens
from llm_resilience.usage import (
    NO_DETAILS,
    StreamUsage,
    TokenDetails,
    Usage,
    billed_apart,
    chat_usage,
    embedding_usage,
    estimate_request_tokens,
    estimated_usage,
    partial_stream_usage,
    reported_usage,
    with_billed_apart,
    with_unreported_compaction,
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
    # 27 significant digits (prices may have 18 decimal places): the product has 36.
    price = ModelPrice("123456789.123456789012345678", 0)
    cost = cost_of(Usage(999_999_999, 0, estimated=False), price)
    assert cost == Decimal("123456788999.999999888888888987654322")  # no 28-digit rounding


def test_embeddings_bill_at_the_embedding_rate_or_else_the_input_rate() -> None:
    usage = Usage(2_000_000, 0, estimated=True)
    assert cost_of(usage, ModelPrice(1, 5, "0.02"), surface="embedding") == Decimal("0.04")
    assert cost_of(usage, ModelPrice("0.13", 0), surface="embedding") == Decimal("0.26")


def test_usage_refuses_negative_or_non_integer_counts() -> None:
    with pytest.raises(ValueError, match="input_tokens"):
        Usage(-1, 0, estimated=False)
    with pytest.raises(ValueError, match="output_tokens"):
        Usage(0, 1.5, estimated=False)  # type: ignore[arg-type]


# -- a stream its consumer closed or cancelled before its end ---------------------------------


def test_a_stream_closed_before_its_first_chunk_records_nothing() -> None:
    assert partial_stream_usage(21, 7, prompt=PROMPT, deltas=[]) is None


def test_an_early_closed_stream_without_usage_is_estimated_over_prompt_and_delivered_text() -> None:
    deltas = ["Paris", " is", ""]
    usage = partial_stream_usage(None, None, prompt=PROMPT, deltas=deltas)
    assert usage == Usage(count_message_tokens(PROMPT), count_tokens("Paris is"), estimated=True)


def test_an_early_closed_stream_keeps_the_usage_reported_so_far() -> None:
    usage = partial_stream_usage(21, 7, prompt=PROMPT, deltas=["Paris", " is", " the"])
    assert usage == Usage(21, 7, estimated=False)


def test_an_output_count_reported_before_the_text_is_raised_to_the_delivered_text() -> None:
    # Anthropic reports output 1 at a stream's start; six text chunks later that is stale.
    deltas = ["Paris", " is", " the", " capital", " of", " France"]
    usage = partial_stream_usage(21, 1, prompt=PROMPT, deltas=deltas)
    assert usage == Usage(21, max(count_tokens("".join(deltas)), 6), estimated=True)


def test_an_early_closed_stream_counts_the_delivered_text_it_is_given_over_its_deltas() -> None:
    calls = 'get_weather{"city": "Paris"}'  # tool-call arguments carry no text delta
    usage = partial_stream_usage(None, None, prompt=PROMPT, deltas=[""], delivered_text=calls)
    assert usage == Usage(count_message_tokens(PROMPT), count_tokens(calls), estimated=True)


def test_a_partial_streams_zero_input_report_for_a_non_empty_prompt_is_estimated() -> None:
    usage = partial_stream_usage(0, 3, prompt=PROMPT, deltas=["Paris"])
    assert usage == Usage(count_message_tokens(PROMPT), count_tokens("Paris"), estimated=True)


# -- how streamed usage adds up -----------------------------------------------------------


def test_streamed_usage_keeps_the_largest_running_total_of_each_direction() -> None:
    anthropic = StreamUsage()
    anthropic.add(25, 1)  # message_start: input, and an opening output count
    anthropic.add(None, 40)  # message_delta: the final output count
    assert (anthropic.input_tokens, anthropic.output_tokens) == (25, 40)

    repeated = StreamUsage()
    for output in (3, 7, 12):  # a cumulative count repeated on every chunk
        repeated.add(25, output)
    assert (repeated.input_tokens, repeated.output_tokens) == (25, 12)


def test_streamed_usage_ignores_what_is_not_a_count() -> None:
    usage = StreamUsage()
    usage.add(None, None)
    assert (usage.input_tokens, usage.output_tokens) == (None, None)
    usage.add(-1, True)  # type: ignore[arg-type]
    assert (usage.input_tokens, usage.output_tokens) == (None, None)
    usage.add(0, 5)
    assert (usage.input_tokens, usage.output_tokens) == (0, 5)


# -- steps billed apart from the top-level counts (Anthropic's compaction) -------------------

# A recorded compacted call: the top-level counts are the answer's own step (229 in, 5 out);
# the summarising step before it read 100 tokens and wrote 55,096 to the cache, then wrote
# 131 tokens of summary.
COMPACTION = {
    "type": "compaction",
    "input_tokens": 100,
    "output_tokens": 131,
    "cache_read_input_tokens": 0,
    "cache_creation_input_tokens": 55_096,
    "cache_creation": {"ephemeral_5m_input_tokens": 55_096, "ephemeral_1h_input_tokens": 0},
}
MESSAGE_STEP = {
    "type": "message",
    "input_tokens": 229,
    "output_tokens": 5,
    "cache_read_input_tokens": 0,
    "cache_creation_input_tokens": 0,
}
COMPACTED = {
    "input_tokens": 229,
    "output_tokens": 5,
    "cache_read_input_tokens": 0,
    "cache_creation_input_tokens": 0,
    "iterations": [COMPACTION, MESSAGE_STEP],
}
SONNET = ModelPrice(3, 15, cache_read_price_per_mtok="0.30", cache_write_price_per_mtok="3.75")


def test_a_compaction_step_in_the_iterations_is_billed_on_top_of_the_top_level_counts() -> None:
    counts = with_billed_apart(229, 5, TokenDetails(0, 0), COMPACTED)
    usage = reported_usage(*counts[:2], prompt=PROMPT, details=counts[2])

    assert usage == Usage(
        55_425, 136, False, cache_read_tokens=0, cache_write_tokens=55_096, cache_write_1h_tokens=0
    )
    # 329 uncached x $3 + 55,096 written x $3.75 + 136 out x $15, per million tokens:
    # 275 times the 0.000762 the top-level counts alone cost.
    assert cost_of(usage, SONNET) == Decimal("0.209637")
    assert cost_of(Usage(229, 5, False), SONNET) == Decimal("0.000762")


def test_the_bill_is_the_sum_over_the_iterations_when_they_list_the_message_step() -> None:
    extra = billed_apart(COMPACTED)
    assert extra is not None
    steps = [COMPACTION, MESSAGE_STEP]
    assert 229 + extra.input_tokens == sum(
        step["input_tokens"] + step["cache_creation_input_tokens"] for step in steps
    )
    assert 5 + extra.output_tokens == sum(step["output_tokens"] for step in steps)


def test_only_compaction_steps_are_added_never_the_message_advisor_or_fallback_steps() -> None:
    others = [
        MESSAGE_STEP,
        {**MESSAGE_STEP, "type": "advisor_message", "model": "claude-opus-4-6"},
        {**MESSAGE_STEP, "type": "fallback_message", "model": "claude-sonnet-4-5"},
    ]
    assert billed_apart({**COMPACTED, "iterations": others}) is None
    assert with_billed_apart(229, 5, None, {"iterations": others}) == (229, 5, None)
    assert with_billed_apart(229, 5, None, {"input_tokens": 229, "output_tokens": 5}) == (
        229,
        5,
        None,
    )


def test_an_on_demand_compaction_with_zero_top_level_counts_is_still_a_report() -> None:
    # On-demand compaction reports 0 at the top level: with the step added it is a report,
    # not the "0 means missing" of an integration that fills a gap with 0.
    counts = with_billed_apart(0, 0, None, {"iterations": [COMPACTION]})
    usage = reported_usage(*counts[:2], prompt=PROMPT, details=counts[2])
    assert usage == Usage(
        55_196, 131, False, cache_read_tokens=0, cache_write_tokens=55_096, cache_write_1h_tokens=0
    )


def test_compaction_steps_are_read_from_sdk_objects_and_add_up_with_their_lifetimes() -> None:
    class Step:  # an SDK model: attributes, not keys
        type = "compaction"
        input_tokens, output_tokens = 10, 20
        cache_read_input_tokens, cache_creation_input_tokens = 300, 0
        cache_creation = {"ephemeral_5m_input_tokens": 40, "ephemeral_1h_input_tokens": 60}

    class Report:
        iterations = [Step(), Step(), {"type": "compaction", "input_tokens": "n/a"}]

    assert billed_apart(Report()) == Usage(
        820, 40, False, cache_read_tokens=600, cache_write_tokens=200, cache_write_1h_tokens=120
    )


def test_a_count_not_reported_at_the_top_level_stays_unreported() -> None:
    assert with_billed_apart(None, 5, None, COMPACTED)[:2] == (None, 136)


def test_a_summary_without_its_steps_counts_is_estimated_from_the_prompt_and_the_summary() -> None:
    # langchain-anthropic's stream chunks keep the top-level counts and the summary block.
    reported = Usage(229, 5, False, cache_read_tokens=20)
    summary = "The user asked about the renewal clause."

    usage = with_unreported_compaction(reported, prompt=PROMPT, summaries=[summary])

    assert usage == Usage(
        229 + count_message_tokens(PROMPT),
        5 + count_tokens(summary),
        estimated=True,
        cache_read_tokens=20,
    )
    # Two compactions, two steps; and nothing to estimate where the steps are reported
    # or no summary came.
    twice = with_unreported_compaction(reported, prompt=PROMPT, summaries=[summary, ""])
    assert twice.input_tokens == 229 + 2 * count_message_tokens(PROMPT)
    assert (
        with_unreported_compaction(
            reported, prompt=PROMPT, summaries=[summary], provider_usage=COMPACTED
        )
        == reported
    )
    assert with_unreported_compaction(reported, prompt=PROMPT, summaries=[]) is reported


def test_a_stream_report_of_nothing_leaves_the_stream_usage_as_it_was() -> None:
    usage = StreamUsage()
    usage.add(25, 1, TokenDetails(cache_read_tokens=10))
    before = (usage.input_tokens, usage.output_tokens, usage.details)
    for details in (None, NO_DETAILS, TokenDetails()):  # the last: equal, not the same
        usage.add(None, None, details)
        assert (usage.input_tokens, usage.output_tokens, usage.details) == before
    usage.add(None, 40)
    assert (usage.input_tokens, usage.output_tokens) == (25, 40)


@pytest.mark.parametrize(
    ("prompt", "text"), [([("user", "hello world")], "hi"), ([], ""), ([("system", "")], "a b c")]
)
def test_an_estimate_is_the_usage_its_counts_make(prompt: list[tuple[str, str]], text: str) -> None:
    built = estimated_usage(prompt, text)
    made = Usage(count_message_tokens(prompt), count_tokens(text), estimated=True)
    assert built == made
    assert repr(built) == repr(made)
    assert built.details == made.details
