"""How LlamaIndex's raw responses are read for cache pricing (Anthropic, OpenAI, Bedrock).

What a cached call costs through each provider's real client, called or streamed, is in
tests/behaviour/test_cache_pricing.py, for both adapters.
"""

from __future__ import annotations

from anthropic.types import CacheCreation, Usage
from llama_index.core.base.llms.types import ChatMessage, ChatResponse
from llama_index.resilience._usage import reported_details, reported_tokens

from llm_resilience.usage import TokenDetails


def test_anthropic_writes_without_a_lifetime_split_count_as_plain_cache_writes() -> None:
    raw = {"usage": Usage(input_tokens=10, output_tokens=3, cache_creation_input_tokens=500)}
    response = ChatResponse(message=ChatMessage(content="x"), raw=raw)
    assert reported_tokens(response) == (510, 3)
    assert reported_details(response) == TokenDetails(cache_write_tokens=500)


def test_anthropic_writes_split_by_lifetime_keep_their_one_hour_share() -> None:
    usage = Usage(
        input_tokens=10,
        output_tokens=3,
        cache_read_input_tokens=40,
        cache_creation_input_tokens=500,
        cache_creation=CacheCreation(ephemeral_5m_input_tokens=200, ephemeral_1h_input_tokens=300),
    )
    response = ChatResponse(message=ChatMessage(content="x"), raw={"usage": usage})
    assert reported_tokens(response) == (550, 3)
    assert reported_details(response) == TokenDetails(
        cache_read_tokens=40, cache_write_tokens=500, cache_write_1h_tokens=300
    )


def test_an_openai_responses_api_usage_reads_its_cached_and_reasoning_tokens() -> None:
    raw = {
        "usage": {
            "input_tokens": 100,
            "output_tokens": 30,
            "input_tokens_details": {"cached_tokens": 64},
            "output_tokens_details": {"reasoning_tokens": 20},
        }
    }
    response = ChatResponse(message=ChatMessage(content="x"), raw=raw)
    # The Responses API's input_tokens include the cached ones: nothing is added.
    assert reported_tokens(response) == (100, 30)
    assert reported_details(response) == TokenDetails(cache_read_tokens=64, reasoning_tokens=20)


def test_a_usage_without_details_reports_none() -> None:
    raw = {"usage": {"prompt_tokens": 5, "completion_tokens": 2}}
    response = ChatResponse(message=ChatMessage(content="x"), raw=raw)
    assert reported_details(response) == TokenDetails()


def test_a_bedrock_stream_s_metadata_event_reports_its_usage_with_the_cache_added_back() -> None:
    # A stream's last chunk carries the ``metadata`` event as its raw.
    usage = {
        "inputTokens": 10,
        "outputTokens": 3,
        "totalTokens": 63,
        "cacheReadInputTokens": 40,
        "cacheWriteInputTokens": 10,
    }
    response = ChatResponse(message=ChatMessage(content="x"), raw={"metadata": {"usage": usage}})
    assert reported_tokens(response) == (60, 3)
    assert reported_details(response) == TokenDetails(cache_read_tokens=40, cache_write_tokens=10)


def test_a_bedrock_content_chunk_reports_no_usage() -> None:
    delta = {"contentBlockDelta": {"delta": {"text": "x"}, "contentBlockIndex": 0}}
    response = ChatResponse(message=ChatMessage(content="x"), raw=delta)
    assert reported_tokens(response) == (None, None)
    assert reported_details(response) == TokenDetails()
