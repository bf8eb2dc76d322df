"""A cached call costs what the provider bills, through LlamaIndex's OpenAI and Anthropic.

The real LLMs talk to a local fault-injecting server whose answers report cache reads,
cache writes (Anthropic's 5-minute and 1-hour) and reasoning tokens in each provider's own
usage shape; the adapter reads them from the raw responses, and the ledger entry's cost
must equal the hand-computed Decimal, called or streamed.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from anthropic.types import CacheCreation, Usage
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.resilience import CostTrackedLLM
from llama_index.resilience._usage import reported_details, reported_tokens

from llm_resilience import CostBudget, ModelPrice
from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry
from llm_resilience.testing import FaultInjectingServer
from llm_resilience.usage import TokenDetails

anthropic_llms = pytest.importorskip("llama_index.llms.anthropic")
openai_llms = pytest.importorskip("llama_index.llms.openai")

PROMPT = "Summarise the attached contract"  # 4 words: the server's uncached input
REPLY = "The contract renews yearly."  # 4 chunks: the server's visible output
MESSAGES = [ChatMessage(role=MessageRole.USER, content=PROMPT)]
CLAUDE, GPT = "claude-haiku-4-5", "gpt-4o"
CALLS = ["chat", "achat", "stream_chat", "astream_chat"]

CLAUDE_PRICE = ModelPrice(
    1,
    5,
    cache_read_price_per_mtok="0.10",
    cache_write_price_per_mtok="1.25",
    cache_write_1h_price_per_mtok=2,
    reasoning_price_per_mtok=7,
)
GPT_PRICE = ModelPrice("2.50", 10, cache_read_price_per_mtok="1.25")
BUDGET = CostBudget(daily_limit=10, prices={CLAUDE: CLAUDE_PRICE, GPT: GPT_PRICE})

ANTHROPIC_DETAILS = {
    "cache_read": 6000,
    "cache_write_5m": 2000,
    "cache_write_1h": 1000,
    "reasoning": 100,
}
OPENAI_DETAILS = {"cache_read": 6000, "reasoning": 100}
# By hand, per million tokens: 4 uncached x $1 + 6,000 read x $0.10 + 2,000 written for
# 5 minutes x $1.25 + 1,000 written for an hour x $2 + 4 output x $5 + 100 thinking x $7.
ANTHROPIC_COST = Decimal("0.005824")
# 4 uncached x $2.50 + 6,000 read x $1.25 + (4 visible + 100 reasoning) x $10.
OPENAI_COST = Decimal("0.00855")


@pytest.fixture
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply=REPLY, name="cache") as running:
        yield running


async def _answer(llm: Any, method: str) -> str:
    if method == "chat":
        return str(llm.chat(MESSAGES).message.content)
    if method == "achat":
        return str((await llm.achat(MESSAGES)).message.content)
    if method == "stream_chat":
        return "".join(response.delta or "" for response in llm.stream_chat(MESSAGES))
    stream = await llm.astream_chat(MESSAGES)
    return "".join([response.delta or "" async for response in stream])


def _only_entry(ledger: InMemoryCostLedger) -> LedgerEntry:
    entries = list(ledger.entries())
    assert len(entries) == 1
    return entries[0]


@pytest.mark.parametrize("method", CALLS)
async def test_an_anthropic_cached_call_costs_each_part_at_its_rate_and_writes_once(
    server: FaultInjectingServer, method: str
) -> None:
    server.usage_details = ANTHROPIC_DETAILS
    inner = anthropic_llms.Anthropic(
        model=CLAUDE,
        base_url=server.anthropic_base_url,
        api_key="sk-FAKE-anthropic",
        max_retries=0,
        timeout=10,
    )
    ledger = InMemoryCostLedger()
    llm = CostTrackedLLM(inner=inner, budget=BUDGET, ledger=ledger)
    assert await _answer(llm, method) == REPLY
    entry = _only_entry(ledger)
    # Anthropic's input_tokens leave the cache out: the adapter adds reads and writes back.
    assert (entry.model, entry.input_tokens, entry.output_tokens) == (CLAUDE, 9004, 104)
    assert not entry.estimated
    assert entry.cost == ANTHROPIC_COST


@pytest.mark.parametrize("method", CALLS)
async def test_an_openai_cached_reasoning_call_costs_its_cache_reads_at_their_rate(
    server: FaultInjectingServer, method: str
) -> None:
    server.usage_details = OPENAI_DETAILS
    inner = openai_llms.OpenAI(
        model=GPT,
        api_base=server.openai_base_url,
        api_key="sk-FAKE-openai",
        max_retries=0,
        timeout=10,
        additional_kwargs={"stream_options": {"include_usage": True}},
    )
    ledger = InMemoryCostLedger()
    llm = CostTrackedLLM(inner=inner, budget=BUDGET, ledger=ledger)
    assert await _answer(llm, method) == REPLY
    entry = _only_entry(ledger)
    # OpenAI's prompt_tokens already hold the cached tokens, completion_tokens the reasoning.
    assert (entry.model, entry.input_tokens, entry.output_tokens) == (GPT, 6004, 104)
    assert not entry.estimated
    assert entry.cost == OPENAI_COST


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


# Bedrock (BedrockConverse): the same tokens in Converse's shape, inputTokens without the
# cache, the writes split by lifetime in cacheDetails, the thinking inside outputTokens and
# never reported apart, so billed at the output price. Not aioboto3: its async methods run
# the sync client in a thread.
BEDROCK_MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
# 4 uncached x $1 + 6,000 read x $0.10 + 2,000 written for 5 minutes x $1.25 + 1,000
# written for an hour x $2 + (4 visible + 100 thinking) output x $5.
BEDROCK_COST = Decimal("0.005624")


@pytest.mark.parametrize("method", CALLS)
async def test_a_bedrock_cached_call_costs_each_part_at_its_rate_and_writes_once(
    server: FaultInjectingServer, method: str
) -> None:
    bedrock_llms = pytest.importorskip("llama_index.llms.bedrock_converse")
    from botocore.config import Config

    server.usage_details = ANTHROPIC_DETAILS
    inner = bedrock_llms.BedrockConverse(
        model=BEDROCK_MODEL,
        endpoint_url=server.anthropic_base_url,
        aws_access_key_id="sk-FAKE-aws-access-key-id",
        aws_secret_access_key="sk-FAKE-aws-secret-access-key",
        region_name="us-east-1",
        max_retries=1,
        botocore_config=Config(retries={"total_max_attempts": 1}, read_timeout=10),
    )
    ledger = InMemoryCostLedger()
    budget = CostBudget(daily_limit=10, prices={BEDROCK_MODEL: CLAUDE_PRICE})
    llm = CostTrackedLLM(inner=inner, budget=budget, ledger=ledger)
    assert await _answer(llm, method) == REPLY
    entry = _only_entry(ledger)
    # Bedrock's inputTokens leave the cache out: the adapter adds reads and writes back.
    assert (entry.model, entry.input_tokens, entry.output_tokens) == (BEDROCK_MODEL, 9004, 104)
    assert (entry.cache_read_tokens, entry.cache_write_tokens, entry.cache_write_1h_tokens) == (
        6000,
        3000,
        1000,
    )
    assert not entry.estimated
    assert entry.cost == BEDROCK_COST


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


GROQ_MODEL = "openai/gpt-oss-120b"
GROQ_PRICE = ModelPrice("0.15", "0.60", cache_read_price_per_mtok="0.075")
# 4 uncached x $0.15 + 6,000 read x $0.075 + (4 visible + 100 reasoning) x $0.60.
GROQ_COST = Decimal("0.000513")


@pytest.mark.parametrize("method", CALLS)
async def test_a_groq_cached_reasoning_call_costs_its_cache_reads_at_their_rate(
    server: FaultInjectingServer, method: str
) -> None:
    groq_llms = pytest.importorskip("llama_index.llms.groq")
    server.usage_details = OPENAI_DETAILS
    # Not asked for stream usage: Groq sends it in the last chunk's x_groq.usage anyway.
    inner = groq_llms.Groq(
        model=GROQ_MODEL,
        api_base=f"{server.anthropic_base_url}/openai/v1",
        api_key="sk-FAKE-groq",
        max_retries=0,
        timeout=10,
        context_window=131_072,
    )
    ledger = InMemoryCostLedger()
    budget = CostBudget(daily_limit=10, prices={GROQ_MODEL: GROQ_PRICE})
    llm = CostTrackedLLM(inner=inner, budget=budget, ledger=ledger)
    assert await _answer(llm, method) == REPLY
    entry = _only_entry(ledger)
    assert (entry.model, entry.input_tokens, entry.output_tokens) == (GROQ_MODEL, 6004, 104)
    assert (entry.cache_read_tokens, entry.reasoning_tokens, entry.estimated) == (6000, 100, False)
    assert entry.cost == GROQ_COST
