"""Usage from each provider's real response shape reaches the ledger as reported.

A ``CostTrackedChatModel`` (LangChain) or ``CostTrackedLLM`` (LlamaIndex) wraps a
fallback chain whose first member's server answers 503 and whose second answers; the
one ledger entry must hold the served member's own counts from the provider's response
(the server reports the question's words in and one token per reply word out) with
``estimated=False``, for a call and for a stream.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from provider_surfaces import QUESTION, ROWS, Endpoint, Row

from llm_resilience import CostBudget
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.testing import Fault, FaultInjectingServer

HEALTHY_REPLY = "the healthy member answered this request"
REPORTED = (len(QUESTION.split()), len(HEALTHY_REPLY.split()))
# One token in costs 1 millionth, one out 2.
BUDGET = CostBudget(input_price_per_mtok=1, output_price_per_mtok=2, daily_limit=10)
COST = (REPORTED[0] * 1 + REPORTED[1] * 2) / Decimal(1_000_000)
# LlamaIndex's OpenAI (and its AzureOpenAI) does not ask for a stream's usage unless told to.
STREAM_USAGE = {"stream_options": {"include_usage": True}}
ASKED_FOR_STREAM_USAGE = {"openai-llamaindex", "azure-llamaindex"}


def _framework_rows() -> list[object]:
    return [
        pytest.param(
            row,
            id=row.key,
            marks=[pytest.mark.skip(reason=f"{row.package} not installed")]
            if importlib.util.find_spec(row.package.split(".")[0]) is None
            else [],
        )
        for row in ROWS
        if row.surface != "SDK"
    ]


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    with (
        FaultInjectingServer(name="failing") as failing,
        FaultInjectingServer(reply=HEALTHY_REPLY, name="healthy") as healthy,
    ):
        failing.script(Fault.status(503))
        yield failing, healthy


def _tracked(
    row: Row, servers: tuple[FaultInjectingServer, FaultInjectingServer], *, ask_usage: bool
) -> Any:
    failing, healthy = servers
    members = [
        row.member(Endpoint("127.0.0.1", server.port), timeout=10, max_retries=0)
        for server in (failing, healthy)
    ]
    if ask_usage and row.key in ASKED_FOR_STREAM_USAGE:
        for member in members:
            member.additional_kwargs = STREAM_USAGE
    chain = row.chain(members, None)
    if row.surface == "LangChain":
        from langchain_llm_resilience import CostTrackedChatModel

        return CostTrackedChatModel(inner=chain, budget=BUDGET, ledger=InMemoryCostLedger())
    from llama_index.resilience import CostTrackedLLM

    return CostTrackedLLM(inner=chain, budget=BUDGET, ledger=InMemoryCostLedger())


@pytest.mark.parametrize("mode", ["call", "stream"])
@pytest.mark.parametrize("row", _framework_rows())
def test_the_served_members_reported_usage_reaches_the_ledger_unestimated(
    row: Row, mode: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    _, healthy = servers
    tracked = _tracked(row, servers, ask_usage=True)
    answer = row.call(tracked) if mode == "call" else "".join(row.stream(tracked))
    assert answer == HEALTHY_REPLY
    [entry] = list(tracked.ledger.entries())
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == (*REPORTED, False)
    assert entry.cost == COST
    # The model the response named: the request's, or the server's own name for an Azure
    # request, which names its deployment in the path instead.
    assert entry.model == (healthy.requests[0].model or "fault-server-model")


def test_a_llama_index_openai_stream_not_asked_for_usage_is_recorded_as_estimated(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    [row] = [row for row in ROWS if row.key == "openai-llamaindex"]
    pytest.importorskip("llama_index.llms.openai")
    tracked = _tracked(row, servers, ask_usage=False)
    assert "".join(row.stream(tracked)) == HEALTHY_REPLY
    [entry] = list(tracked.ledger.entries())
    assert entry.estimated is True


def _framework_rows_of(wire: str) -> list[object]:
    """The framework rows of one provider's wire."""
    return [
        param
        for param in _framework_rows()
        if getattr(param, "values", (None,))[0].wire == wire  # type: ignore[union-attr]
    ]


def _entry_after_failover(
    row: Row, mode: str, details: dict[str, int], *, fault: Fault, ask_usage: bool = True
) -> Any:
    """The one ledger entry of a call (or stream) whose first member fails with ``fault``
    and whose second answers, reporting ``details`` (cache and reasoning counts)."""
    with (
        FaultInjectingServer(name="failing") as failing,
        FaultInjectingServer(reply=HEALTHY_REPLY, name="healthy", usage_details=details) as healthy,
    ):
        failing.script(fault)
        tracked = _tracked(row, (failing, healthy), ask_usage=ask_usage)
        answer = row.call(tracked) if mode == "call" else "".join(row.stream(tracked))
    assert answer == HEALTHY_REPLY
    [entry] = list(tracked.ledger.entries())
    return entry


@pytest.mark.parametrize("mode", ["call", "stream"])
@pytest.mark.parametrize("row", _framework_rows_of("gemini"))
def test_gemini_s_cached_and_thought_tokens_reach_the_ledger_as_reported(
    row: Row, mode: str
) -> None:
    # Gemini's promptTokenCount includes the cached tokens; thoughtsTokenCount is billed
    # as output but not inside candidatesTokenCount.
    details = {"cache_read": 3, "reasoning": 2}
    entry = _entry_after_failover(row, mode, details, fault=Fault.status(503))
    assert (entry.input_tokens, entry.output_tokens) == (REPORTED[0] + 3, REPORTED[1] + 2)
    assert (entry.cache_read_tokens, entry.reasoning_tokens, entry.estimated) == (3, 2, False)


@pytest.mark.parametrize("mode", ["call", "stream"])
@pytest.mark.parametrize("row", _framework_rows_of("bedrock"))
def test_bedrock_s_cache_reads_and_writes_reach_the_ledger_as_reported(row: Row, mode: str) -> None:
    # Bedrock's inputTokens leave the cache out (cacheReadInputTokens, cacheWriteInputTokens,
    # the writes split by lifetime in cacheDetails); its thinking is inside outputTokens.
    details = {"cache_read": 5, "cache_write_5m": 3, "cache_write_1h": 2, "reasoning": 4}
    entry = _entry_after_failover(row, mode, details, fault=Fault.status(503))
    assert (entry.input_tokens, entry.output_tokens) == (REPORTED[0] + 10, REPORTED[1] + 4)
    assert (entry.cache_read_tokens, entry.cache_write_tokens, entry.cache_write_1h_tokens) == (
        5,
        5,
        2,
    )
    # Bedrock does not split the thinking out: the ledger holds no reasoning count.
    assert (entry.reasoning_tokens or 0, entry.estimated) == (0, False)


@pytest.mark.parametrize("mode", ["call", "stream"])
@pytest.mark.parametrize("row", _framework_rows_of("groq"))
def test_groq_s_cached_and_reasoning_tokens_reach_the_ledger_as_reported(
    row: Row, mode: str
) -> None:
    # Groq reports OpenAI's shape: cached tokens inside prompt_tokens, reasoning inside
    # completion_tokens; a stream's usage in its last chunk's x_groq.usage, unasked.
    details = {"cache_read": 3, "reasoning": 2}
    entry = _entry_after_failover(row, mode, details, fault=Fault.status(498), ask_usage=False)
    assert (entry.input_tokens, entry.output_tokens) == (REPORTED[0] + 3, REPORTED[1] + 2)
    assert (entry.cache_read_tokens, entry.reasoning_tokens, entry.estimated) == (3, 2, False)


@pytest.mark.parametrize("mode", ["call", "stream"])
@pytest.mark.parametrize("row", _framework_rows_of("ollama"))
def test_ollama_s_eval_counts_reach_the_ledger_with_its_thinking_inside_the_output(
    row: Row, mode: str
) -> None:
    # Ollama reports prompt_eval_count and eval_count only: a thinking model's thinking is
    # inside eval_count, and a prompt prefix reused from its KV cache is not counted at
    # all, so the server's cache reads never show and the ledger holds no split.
    details = {"cache_read": 3, "reasoning": 2}
    entry = _entry_after_failover(row, mode, details, fault=Fault.status(503))
    assert (entry.input_tokens, entry.output_tokens) == (REPORTED[0], REPORTED[1] + 2)
    assert (entry.cache_read_tokens, entry.reasoning_tokens or 0) == (0, 0)
    assert (entry.estimated, entry.model) == (False, "llama3.2")
