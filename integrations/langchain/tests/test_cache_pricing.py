"""A cached call costs what the provider bills, through ChatOpenAI and ChatAnthropic.

The real clients talk to a local fault-injecting server whose answers report cache reads,
cache writes (Anthropic's 5-minute and 1-hour) and reasoning tokens in each provider's own
usage shape; langchain-openai and langchain-anthropic turn them into ``usage_metadata``,
and the ledger entry's cost must equal the hand-computed Decimal, called or streamed.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI

from langchain_llm_resilience import CostTrackedChatModel
from langchain_llm_resilience.cost import token_details
from llm_resilience import CostBudget, ModelPrice
from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry
from llm_resilience.testing import FaultInjectingServer
from llm_resilience.usage import TokenDetails

PROMPT = "Summarise the attached contract"  # 4 words: the server's uncached input
REPLY = "The contract renews yearly."  # 4 chunks: the server's visible output

SONNET = ModelPrice(
    3,
    15,
    cache_read_price_per_mtok="0.30",
    cache_write_price_per_mtok="3.75",
    cache_write_1h_price_per_mtok=6,
    reasoning_price_per_mtok=20,
)
# No reasoning price: reasoning bills at the output price.
GPT = ModelPrice("2.50", 10, cache_read_price_per_mtok="1.25")

ANTHROPIC_DETAILS = {
    "cache_read": 6000,
    "cache_write_5m": 2000,
    "cache_write_1h": 1000,
    "reasoning": 100,
}
OPENAI_DETAILS = {"cache_read": 6000, "reasoning": 100}

# By hand, per million tokens: 4 uncached x $3 + 6,000 read x $0.30 + 2,000 written for
# 5 minutes x $3.75 + 1,000 written for an hour x $6 + 4 output x $15 + 100 thinking
# x $20. Charging the writes as input as well would add 3,000 x $3.
ANTHROPIC_COST = Decimal("0.017372")
# 4 uncached x $2.50 + 6,000 read x $1.25 + (4 visible + 100 reasoning) x $10.
OPENAI_COST = Decimal("0.00855")

MODES = ["invoke", "ainvoke", "stream", "astream"]


@pytest.fixture
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply=REPLY, name="cache") as running:
        yield running


def _tracked(inner: Any) -> tuple[CostTrackedChatModel, InMemoryCostLedger]:
    ledger = InMemoryCostLedger()
    budget = CostBudget(daily_limit=10, prices={"claude-sonnet-4-5": SONNET, "gpt-5": GPT})
    return CostTrackedChatModel(inner=inner, budget=budget, ledger=ledger), ledger


async def _run(model: CostTrackedChatModel, mode: str) -> str:
    messages = [HumanMessage(PROMPT)]
    if mode == "invoke":
        return model.invoke(messages).text
    if mode == "ainvoke":
        return (await model.ainvoke(messages)).text
    if mode == "stream":
        return "".join(chunk.text for chunk in model.stream(messages))
    return "".join([chunk.text async for chunk in model.astream(messages)])


def _only_entry(ledger: InMemoryCostLedger) -> LedgerEntry:
    entries = list(ledger.entries())
    assert len(entries) == 1
    return entries[0]


@pytest.mark.parametrize("mode", MODES)
async def test_an_anthropic_cached_call_costs_each_part_at_its_rate_and_writes_once(
    server: FaultInjectingServer, mode: str
) -> None:
    server.usage_details = ANTHROPIC_DETAILS
    inner = ChatAnthropic(
        model_name="claude-sonnet-4-5",
        base_url=server.anthropic_base_url,
        api_key="sk-FAKE-anthropic",  # type: ignore[arg-type]
        max_retries=0,
        timeout=10,
        stop=None,
    )
    model, ledger = _tracked(inner)
    assert await _run(model, mode) == REPLY
    entry = _only_entry(ledger)
    # langchain-anthropic adds Anthropic's cache reads and writes back into the input.
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == (9004, 104, False)
    assert entry.cost == ANTHROPIC_COST


@pytest.mark.parametrize("mode", MODES)
async def test_an_openai_cached_reasoning_call_costs_its_cache_reads_at_their_rate(
    server: FaultInjectingServer, mode: str
) -> None:
    server.usage_details = OPENAI_DETAILS
    inner = ChatOpenAI(
        model="gpt-5",
        base_url=server.openai_base_url,
        api_key="sk-FAKE-openai",  # type: ignore[arg-type]
        max_retries=0,
        timeout=10,
    )
    model, ledger = _tracked(inner)
    assert await _run(model, mode) == REPLY
    entry = _only_entry(ledger)
    # OpenAI's prompt_tokens already hold the cached tokens, completion_tokens the reasoning.
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == (6004, 104, False)
    assert entry.cost == OPENAI_COST


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


# Bedrock (ChatBedrockConverse over a boto3 client): the same tokens in Converse's shape,
# inputTokens without the cache, the writes split by lifetime in cacheDetails, and the
# thinking inside outputTokens, never reported apart: it bills at the output price.
BEDROCK_MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"
# 4 uncached x $3 + 6,000 read x $0.30 + 2,000 written for 5 minutes x $3.75 + 1,000
# written for an hour x $6 + (4 visible + 100 thinking) output x $15.
BEDROCK_COST = Decimal("0.016872")


@pytest.mark.parametrize("mode", MODES)
async def test_a_bedrock_cached_call_costs_each_part_at_its_rate_and_writes_once(
    server: FaultInjectingServer, mode: str
) -> None:
    langchain_aws = pytest.importorskip("langchain_aws")
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    server.usage_details = ANTHROPIC_DETAILS
    client = boto3.client(
        "bedrock-runtime",
        endpoint_url=server.anthropic_base_url,
        region_name="us-east-1",
        aws_access_key_id="sk-FAKE-aws-access-key-id",
        aws_secret_access_key="sk-FAKE-aws-secret-access-key",
        config=Config(retries={"total_max_attempts": 1}, read_timeout=10),
    )
    inner = langchain_aws.ChatBedrockConverse(model=BEDROCK_MODEL, client=client)
    ledger = InMemoryCostLedger()
    budget = CostBudget(daily_limit=10, prices={BEDROCK_MODEL: SONNET})
    model = CostTrackedChatModel(inner=inner, budget=budget, ledger=ledger)
    assert await _run(model, mode) == REPLY
    entry = _only_entry(ledger)
    # langchain-aws adds Bedrock's cache reads and writes back into the input.
    assert (entry.model, entry.input_tokens, entry.output_tokens) == (BEDROCK_MODEL, 9004, 104)
    assert (entry.cache_read_tokens, entry.cache_write_tokens, entry.cache_write_1h_tokens) == (
        6000,
        3000,
        1000,
    )
    assert not entry.estimated
    assert entry.cost == BEDROCK_COST


GROQ_MODEL = "openai/gpt-oss-120b"
GROQ_PRICE = ModelPrice("0.15", "0.60", cache_read_price_per_mtok="0.075")
# 4 uncached x $0.15 + 6,000 read x $0.075 + (4 visible + 100 reasoning) x $0.60.
GROQ_COST = Decimal("0.000513")


@pytest.mark.parametrize("mode", MODES)
async def test_a_groq_cached_reasoning_call_costs_its_cache_reads_at_their_rate(
    server: FaultInjectingServer, mode: str
) -> None:
    langchain_groq = pytest.importorskip("langchain_groq")
    server.usage_details = OPENAI_DETAILS
    inner = langchain_groq.ChatGroq(
        model=GROQ_MODEL,
        base_url=server.anthropic_base_url,
        api_key="sk-FAKE-groq",
        max_retries=0,
        timeout=10,
    )
    ledger = InMemoryCostLedger()
    budget = CostBudget(daily_limit=10, prices={GROQ_MODEL: GROQ_PRICE})
    model = CostTrackedChatModel(inner=inner, budget=budget, ledger=ledger)
    assert await _run(model, mode) == REPLY
    entry = _only_entry(ledger)
    # Groq's prompt_tokens hold the cached tokens, completion_tokens the reasoning; a
    # stream's usage comes in its last chunk's x_groq.usage.
    assert (entry.model, entry.input_tokens, entry.output_tokens) == (GROQ_MODEL, 6004, 104)
    assert (entry.cache_read_tokens, entry.reasoning_tokens, entry.estimated) == (6000, 100, False)
    assert entry.cost == GROQ_COST
