"""A completed stream's ledger entry: its chunks' usage and model, as LangChain merges them.

The cost layer reads a completed stream's usage and model name from its chunks without
merging their content (the merge is only needed to estimate); these tests hold the entry
to what the merged message says, for usage that arrives in increments across chunks.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGenerationChunk, ChatResult

from langchain_llm_resilience import CostTrackedChatModel, FallbackChatModel
from langchain_llm_resilience.testing import ScriptedChatModel
from llm_resilience import CostBudget, ModelPrice
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.tokens import count_message_tokens, count_tokens

SERVED = "gpt-4o-2024-08-06"
PRICE = ModelPrice(2, 8)


def _usage(input_tokens: int, output_tokens: int) -> UsageMetadata:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }


class IncrementalUsageChat(BaseChatModel):
    """A provider at the edge whose stream reports usage in increments: the prompt's
    tokens on its first chunk, the answer's on the chunks that carry it (or no usage)."""

    reports_usage: bool = True

    @property
    def _llm_type(self) -> str:
        return "incremental-usage"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        raise AssertionError("the stream is under test")

    def _chunks(self) -> Iterator[ChatGenerationChunk]:
        reports = self.reports_usage
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                usage_metadata=_usage(7, 0) if reports else None,
                response_metadata={"model_name": SERVED},
            )
        )
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content="Hello", usage_metadata=_usage(0, 2) if reports else None
            )
        )
        yield ChatGenerationChunk(message=AIMessageChunk(content=","))  # no usage at all
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content=" world",
                usage_metadata=_usage(0, 3) if reports else None,
                response_metadata={"stop_reason": "end_turn"},
            )
        )

    def _stream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> Iterator[ChatGenerationChunk]:
        yield from self._chunks()

    async def _astream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in self._chunks():
            yield chunk


def tracked(inner: BaseChatModel) -> tuple[CostTrackedChatModel, InMemoryCostLedger]:
    ledger = InMemoryCostLedger()
    model = CostTrackedChatModel(
        inner=inner,
        budget=CostBudget(3, 15, daily_limit=10, prices={"gpt-4o": PRICE}),
        ledger=ledger,
    )
    return model, ledger


def _layers(shape: str, reports_usage: bool) -> BaseChatModel:
    provider = IncrementalUsageChat(reports_usage=reports_usage)
    if shape == "alone":
        return provider
    return FallbackChatModel(models=[provider, ScriptedChatModel(model="scripted-1")])


async def _consume(model: CostTrackedChatModel, call: str) -> list[AIMessageChunk]:
    if call == "stream":
        return list(model.stream("x"))
    return [chunk async for chunk in model.astream("x")]


@pytest.mark.parametrize("shape", ["alone", "in-a-fallback-chain"])
@pytest.mark.parametrize("call", ["stream", "astream"])
async def test_a_stream_reporting_usage_in_increments_records_their_sum_at_the_served_price(
    shape: str, call: str
) -> None:
    model, ledger = tracked(_layers(shape, reports_usage=True))
    chunks = await _consume(model, call)
    merged = functools.reduce(operator.add, chunks)
    (entry,) = ledger.entries()
    assert merged.usage_metadata is not None
    assert (entry.input_tokens, entry.output_tokens) == (
        merged.usage_metadata["input_tokens"],
        merged.usage_metadata["output_tokens"],
    )
    assert (entry.input_tokens, entry.output_tokens) == (7, 5)
    assert entry.estimated is False
    assert entry.model == SERVED
    assert entry.cost == (7 * PRICE.input_per_mtok + 5 * PRICE.output_per_mtok) / 10**6


@pytest.mark.parametrize("shape", ["alone", "in-a-fallback-chain"])
@pytest.mark.parametrize("call", ["stream", "astream"])
async def test_a_stream_without_usage_records_its_prompt_and_merged_text_estimated(
    shape: str, call: str
) -> None:
    model, ledger = tracked(_layers(shape, reports_usage=False))
    await _consume(model, call)
    (entry,) = ledger.entries()
    assert entry.estimated is True
    assert entry.input_tokens == count_message_tokens([("human", "x")])
    assert entry.output_tokens == count_tokens("Hello, world")
    assert entry.model == SERVED
    assert entry.cost == (
        entry.input_tokens * PRICE.input_per_mtok + entry.output_tokens * PRICE.output_per_mtok
    ) / Decimal(10**6)


def _chunk(usage: UsageMetadata | None, metadata: dict[str, Any] | None = None) -> Any:
    return ChatGenerationChunk(
        message=AIMessageChunk(content="a", usage_metadata=usage, response_metadata=metadata or {})
    )


_DETAILED: UsageMetadata = {
    "input_tokens": 120,
    "output_tokens": 9,
    "total_tokens": 129,
    "input_token_details": {"cache_read": 100},
    "output_token_details": {"reasoning": 4},
}


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param([_chunk(None), _chunk(None), _chunk(_usage(7, 5))], id="report-last"),
        pytest.param([_chunk(_usage(7, 5)), _chunk(None), _chunk(None)], id="report-first"),
        pytest.param([_chunk(None), _chunk(_DETAILED, {"model_name": SERVED})], id="details"),
        pytest.param(
            [_chunk(_usage(7, 0), {"model_name": SERVED}), _chunk(None), _chunk(_usage(0, 5))],
            id="increments",
        ),
        pytest.param(
            [_chunk(None, {"id": "a"}), _chunk(None, {"stop_reason": "end"}), _chunk(None)],
            id="no-report-metadata-spread",
        ),
        pytest.param([_chunk(None), _chunk(None)], id="nothing"),
        pytest.param(
            [
                _chunk(None),
                ChatGenerationChunk(
                    message=AIMessageChunk(
                        content=[{"type": "text", "text": "b", "index": 0}],
                        usage_metadata=_usage(7, 5),
                    )
                ),
            ],
            id="content-blocks",
        ),
    ],
)
def test_a_streams_usage_and_metadata_are_read_as_langchains_merge_reads_them(
    chunks: list[ChatGenerationChunk],
) -> None:
    # merged_usage_and_metadata skips the merge of content; its usage and metadata must
    # be what the merged message carries, for every shape of report.
    from langchain_core.outputs.chat_generation import merge_chat_generation_chunks

    from langchain_llm_resilience._delegate import merged_usage_and_metadata

    parts = merged_usage_and_metadata(chunks)
    merged = merge_chat_generation_chunks(chunks)
    assert parts is not None
    assert merged is not None
    usage, metadata, blocks = parts
    assert usage == merged.message.usage_metadata  # type: ignore[attr-defined]
    assert metadata == merged.message.response_metadata
    # Whether a compaction block may be there: only a list of content blocks holds one.
    assert blocks == any(type(chunk.message.content) is not str for chunk in chunks)
