"""How LangChain's ``usage_metadata`` token details are read for cache pricing.

What a cached call costs through each provider's real client, called or streamed, is in
tests/behaviour/test_cache_pricing.py, for both adapters.
"""

from __future__ import annotations

from langchain_llm_resilience.cost import token_details
from llm_resilience.usage import TokenDetails


def test_a_usage_metadata_without_lifetimes_reads_its_generic_cache_counts() -> None:
    usage = {
        "input_tokens": 500,
        "output_tokens": 40,
        "total_tokens": 540,
        "input_token_details": {"cache_read": 300, "cache_creation": 150},
        "output_token_details": {"reasoning": 25},
    }
    assert token_details(usage) == TokenDetails(
        cache_read_tokens=300, cache_write_tokens=150, reasoning_tokens=25
    )


def test_an_openai_flex_usage_metadata_reads_its_tier_prefixed_counts() -> None:
    usage = {
        "input_tokens": 500,
        "output_tokens": 40,
        "total_tokens": 540,
        "input_token_details": {"flex_cache_read": 300, "flex": 200},
        "output_token_details": {"flex_reasoning": 25, "flex": 15},
    }
    assert token_details(usage) == TokenDetails(cache_read_tokens=300, reasoning_tokens=25)


def test_a_usage_metadata_with_no_details_reads_none_of_them() -> None:
    assert token_details({"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}) == (
        TokenDetails()
    )
    assert token_details(None) == TokenDetails()
