"""LangChain's `ResilienceBuilder`: which LangChain wrapper each of the core's layers becomes.

A chat stack is made of `BaseChatModel`s (`FallbackChatModel`, `RateLimitedChatModel`,
`CostTrackedChatModel`), so it drops into any chain or agent that takes a chat model:

    stack = ResilienceBuilder().register_chat(ChatOpenAI(model="gpt-4o")).use_rate_limiting(
        chat_requests_per_minute=300
    ).build()
    chain = prompt | stack.chat | StrOutputParser()

What may follow what, and what is refused, is decided by the core's
`llm_resilience.builder.ResiliencePlan`; here live only the LangChain classes a surface
accepts (`BaseChatModel`, `Embeddings`, `VectorStore`) and the wrapper made for each layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.vectorstores import VectorStore

from langchain_llm_resilience.cost import CostTrackedChatModel, CostTrackedEmbeddings
from langchain_llm_resilience.fallback import FallbackChatModel
from langchain_llm_resilience.ratelimit import RateLimitedChatModel, RateLimitedEmbeddings
from langchain_llm_resilience.retry import RetryingEmbeddings, RetryingVectorStore
from llm_resilience.builder import (
    BudgetLayer,
    RateLimitLayer,
    ResiliencePlan,
    RetryLayer,
)

__all__ = ["ResilienceBuilder"]


class ResilienceBuilder(ResiliencePlan):
    """A resilience stack of LangChain runnables: every layer is itself a chat model.

    Examples:
        >>> stack = (
        ...     ResilienceBuilder()
        ...     .use_fallback_chain([primary, secondary], per_client_timeout=30)
        ...     .use_rate_limiting(chat_requests_per_minute=300)
        ...     .use_cost_budgeting(CostBudget(input_price_per_mtok=3, output_price_per_mtok=15,
        ...                                    daily_limit=25))
        ...     .build()
        ... )  # doctest: +SKIP
        >>> stack.chat  # CostTrackedChatModel(RateLimitedChatModel(FallbackChatModel(...)))
        ... # doctest: +SKIP

    `register_chat` takes a `BaseChatModel` (`use_fallback_chain` builds a
    `FallbackChatModel` from several), `register_embeddings` an `Embeddings` and
    `register_vector_store` a `VectorStore`; anything else raises `TypeError`. Rate
    limits become `RateLimitedChatModel` and `RateLimitedEmbeddings`, budgets
    `CostTrackedChatModel` and `CostTrackedEmbeddings`, `configure_resilience`
    `RetryingEmbeddings` and `RetryingVectorStore`. In what order they nest, and what is
    refused, is `ResiliencePlan`'s to say (and `docs/composition.md`'s).
    """

    __slots__ = ()

    _framework = "LangChain"
    _accepted = {
        "chat": (BaseChatModel,),
        "embeddings": (Embeddings,),
        "vector_store": (VectorStore,),
    }
    _wrappers = {
        (RateLimitLayer, "chat"): RateLimitedChatModel,
        (RateLimitLayer, "embeddings"): RateLimitedEmbeddings,
        (BudgetLayer, "chat"): CostTrackedChatModel,
        (BudgetLayer, "embeddings"): CostTrackedEmbeddings,
        (RetryLayer, "embeddings"): RetryingEmbeddings,
        (RetryLayer, "vector_store"): RetryingVectorStore,
    }

    def _fallback_chain(self, members: Sequence[Any], options: Mapping[str, Any]) -> Any:
        return FallbackChatModel(models=list(members), **options)
