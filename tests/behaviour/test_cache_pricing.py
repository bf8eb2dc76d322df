"""A cached call costs what the provider bills, through each framework's real clients.

The real clients talk to a local fault-injecting server whose answers report cache reads,
cache writes (Anthropic's 5-minute and 1-hour) and reasoning tokens in each provider's own
usage shape; each adapter reads them, and the ledger entry's cost must equal the
hand-computed Decimal, called or streamed.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from driver import Mode

from llm_resilience import CostBudget, ModelPrice
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.testing import FaultInjectingServer

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
GROQ = ModelPrice("0.15", "0.60", cache_read_price_per_mtok="0.075")

ANTHROPIC_DETAILS = {
    "cache_read": 6000,
    "cache_write_5m": 2000,
    "cache_write_1h": 1000,
    "reasoning": 100,
}
OPENAI_DETAILS = {"cache_read": 6000, "reasoning": 100}


@pytest.fixture
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply=REPLY, name="cache") as running:
        yield running


async def only_entry(
    driver: Any, server: Any, provider: str, model: str, price: ModelPrice, mode: Mode
) -> Any:
    inner = driver.provider_client(provider, server, model)
    ledger = InMemoryCostLedger()
    budget = CostBudget(daily_limit=10, prices={model: price})
    layer = driver.cost_tracked(inner, budget=budget, ledger=ledger)
    assert (await driver.run(layer, mode, prompt=PROMPT)).text == REPLY
    [entry] = ledger.entries()
    assert (entry.model, entry.estimated) == (model, False)
    return entry


async def test_an_anthropic_cached_call_costs_each_part_at_its_rate_and_writes_once(
    driver: Any, mode: Mode, server: FaultInjectingServer
) -> None:
    server.usage_details = ANTHROPIC_DETAILS
    entry = await only_entry(driver, server, "anthropic", "claude-sonnet-4-5", SONNET, mode)
    # Anthropic's input_tokens leave the cache out: the reads and writes are added back.
    assert (entry.input_tokens, entry.output_tokens) == (9004, 104)
    assert (entry.cache_read_tokens, entry.cache_write_tokens, entry.cache_write_1h_tokens) == (
        6000,
        3000,
        1000,
    )
    # By hand, per million tokens: 4 uncached x $3 + 6,000 read x $0.30 + 2,000 written
    # for 5 minutes x $3.75 + 1,000 written for an hour x $6 + 4 output x $15 + 100
    # thinking x $20. Charging the writes as input as well would add 3,000 x $3.
    assert entry.cost == Decimal("0.017372")


async def test_an_openai_cached_reasoning_call_costs_its_cache_reads_at_their_rate(
    driver: Any, mode: Mode, server: FaultInjectingServer
) -> None:
    server.usage_details = OPENAI_DETAILS
    entry = await only_entry(driver, server, "openai", "gpt-5", GPT, mode)
    # OpenAI's prompt_tokens already hold the cached tokens, completion_tokens the reasoning.
    assert (entry.input_tokens, entry.output_tokens) == (6004, 104)
    assert (entry.cache_read_tokens, entry.reasoning_tokens) == (6000, 100)
    # 4 uncached x $2.50 + 6,000 read x $1.25 + (4 visible + 100 reasoning) x $10.
    assert entry.cost == Decimal("0.00855")


async def test_a_bedrock_cached_call_costs_each_part_at_its_rate_and_writes_once(
    driver: Any, mode: Mode, server: FaultInjectingServer
) -> None:
    # Converse's shape: inputTokens without the cache, the writes split by lifetime in
    # cacheDetails, and the thinking inside outputTokens, never reported apart: it bills
    # at the output price.
    server.usage_details = ANTHROPIC_DETAILS
    model = "anthropic.claude-sonnet-4-5-20250929-v1:0"
    entry = await only_entry(driver, server, "bedrock", model, SONNET, mode)
    assert (entry.input_tokens, entry.output_tokens) == (9004, 104)
    assert (entry.cache_read_tokens, entry.cache_write_tokens, entry.cache_write_1h_tokens) == (
        6000,
        3000,
        1000,
    )
    # 4 uncached x $3 + 6,000 read x $0.30 + 2,000 written for 5 minutes x $3.75 + 1,000
    # written for an hour x $6 + (4 visible + 100 thinking) output x $15.
    assert entry.cost == Decimal("0.016872")


async def test_a_groq_cached_reasoning_call_costs_its_cache_reads_at_their_rate(
    driver: Any, mode: Mode, server: FaultInjectingServer
) -> None:
    # Groq's prompt_tokens hold the cached tokens, completion_tokens the reasoning; a
    # stream's usage comes in its last chunk's x_groq.usage.
    server.usage_details = OPENAI_DETAILS
    entry = await only_entry(driver, server, "groq", "openai/gpt-oss-120b", GROQ, mode)
    assert (entry.input_tokens, entry.output_tokens) == (6004, 104)
    assert (entry.cache_read_tokens, entry.reasoning_tokens) == (6000, 100)
    # 4 uncached x $0.15 + 6,000 read x $0.075 + (4 visible + 100 reasoning) x $0.60.
    assert entry.cost == Decimal("0.000513")
