"""A restarted LlamaIndex stream never keeps the failed member's model name, even when
the member that served names none in ``raw`` (what both adapters share of broken
streams through real clients is in ``tests/behaviour/test_real_clients_broken_streams.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.resilience import CostTrackedLLM, FallbackLLM
from llama_index.resilience.testing import (
    FakeFunctionCallingLLM,
    rate_limit_error,
)

from llm_resilience import CostBudget
from llm_resilience.ledger import InMemoryCostLedger

PRIMARY_REPLY = "one two three four five six seven eight"
SECONDARY_REPLY = "the secondary answered this request"
MESSAGES = [ChatMessage(role=MessageRole.USER, content="Capital of France?")]


async def streamed(llm: Any, method: str) -> list[ChatResponse]:
    if method == "stream_chat":
        return list(llm.stream_chat(MESSAGES))
    return [chunk async for chunk in await llm.astream_chat(MESSAGES)]


METHODS = ["stream_chat", "astream_chat"]


class UnnamedFake(FakeFunctionCallingLLM):
    """A member whose stream chunks never name a model in ``raw`` (as some providers')."""

    def _raw(self, usage: dict[str, int] | None) -> dict[str, Any]:
        raw = super()._raw(usage)
        del raw["model"]
        return raw


@pytest.mark.parametrize("method", METHODS)
async def test_a_restarted_stream_never_keeps_the_failed_members_model_name(method: str) -> None:
    failing = FakeFunctionCallingLLM(
        model_name="model-a", text="one two three", fail_after_chunks=2, error=rate_limit_error()
    )
    serving = UnnamedFake(model_name="model-b", text="the answer")
    ledger = InMemoryCostLedger()
    budget = CostBudget(input_price_per_mtok=1, output_price_per_mtok=2, daily_limit=10)
    llm = CostTrackedLLM(inner=FallbackLLM(llms=[failing, serving]), budget=budget, ledger=ledger)
    chunks = await streamed(llm, method)
    assert chunks[-1].message.content == "the answer"
    [entry] = ledger.entries()
    assert entry.model == "model-b"
