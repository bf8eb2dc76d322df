"""The LlamaIndex builder: the core's plan of layers, turned into LlamaIndex components.

Every layer of a built stack is itself an `LLM` or a `BaseEmbedding`, so the result goes
where LlamaIndex looks for models, `Settings` or a query engine:

    stack = (
        ResilienceBuilder()
        .register_chat(OpenAI(model="gpt-4o"))
        .register_embeddings(OpenAIEmbedding())
        .use_rate_limiting(chat_requests_per_minute=300)
        .build()
    )
    Settings.llm, Settings.embed_model = stack.chat, stack.embeddings

The ordering and refusal rules belong to `llm_resilience.builder.ResiliencePlan`. This
module names the LlamaIndex types each surface takes (an `LLM`, a `BaseEmbedding`, a
pydantic or legacy vector store) and builds `FallbackLLM`, `RateLimitedLLM`,
`CostTrackedLLM` and the embedding and retry layers from the plan's steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import LLM
from llama_index.core.vector_stores.types import BasePydanticVectorStore, VectorStore
from llama_index.resilience.cost import CostTrackedEmbedding, CostTrackedLLM
from llama_index.resilience.fallback import FallbackLLM
from llama_index.resilience.ratelimit import RateLimitedEmbedding, RateLimitedLLM
from llama_index.resilience.retry import RetryingEmbedding, RetryingVectorStore

from llm_resilience.builder import (
    BudgetLayer,
    RateLimitLayer,
    ResiliencePlan,
    RetryLayer,
)

__all__ = ["ResilienceBuilder"]


class ResilienceBuilder(ResiliencePlan):
    """LlamaIndex components wrapped in resilience layers, ready for `Settings`.

    Example:

    ```python
    stack = (
        ResilienceBuilder()
        .use_fallback_chain([primary, secondary], per_client_timeout=30)
        .use_rate_limiting(chat_requests_per_minute=300)
        .use_cost_budgeting(
            CostBudget(input_price_per_mtok=3, output_price_per_mtok=15, daily_limit=25)
        )
        .build()
    )
    Settings.llm = stack.chat  # CostTrackedLLM(RateLimitedLLM(FallbackLLM(...)))
    ```

    The chat surface is an `LLM` (or the `FallbackLLM` that `use_fallback_chain` builds),
    the embeddings a `BaseEmbedding`, the vector store a `BasePydanticVectorStore` or a
    legacy `VectorStore`; another type raises `TypeError`. The layers are
    `RateLimitedLLM`/`RateLimitedEmbedding`, `CostTrackedLLM`/`CostTrackedEmbedding` and
    `RetryingEmbedding`/`RetryingVectorStore`, each an LLM, embedding or store itself.
    The nesting and refusal rules are the core's `ResiliencePlan` (see
    `docs/composition.md`).
    """

    __slots__ = ()

    _framework = "LlamaIndex"
    _accepted = {
        "chat": (LLM,),
        "embeddings": (BaseEmbedding,),
        "vector_store": (BasePydanticVectorStore, VectorStore),
    }
    _wrappers = {
        (RateLimitLayer, "chat"): RateLimitedLLM,
        (RateLimitLayer, "embeddings"): RateLimitedEmbedding,
        (BudgetLayer, "chat"): CostTrackedLLM,
        (BudgetLayer, "embeddings"): CostTrackedEmbedding,
        (RetryLayer, "embeddings"): RetryingEmbedding,
        (RetryLayer, "vector_store"): RetryingVectorStore,
    }

    def _fallback_chain(self, members: Sequence[Any], options: Mapping[str, Any]) -> Any:
        return FallbackLLM(llms=list(members), **options)
