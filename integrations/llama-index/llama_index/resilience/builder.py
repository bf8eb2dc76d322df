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

from llm_resilience.builder import (
    BudgetLayer,
    Layer,
    RateLimitLayer,
    ResiliencePlan,
    RetryLayer,
    Surface,
)

__all__ = ["ResilienceBuilder"]

_ACCEPTED: dict[Surface, tuple[type[Any], ...]] = {
    "chat": (LLM,),
    "embeddings": (BaseEmbedding,),
    "vector_store": (BasePydanticVectorStore, VectorStore),
}


class ResilienceBuilder(ResiliencePlan):
    """Put fallback, rate limiting, spend budgets and retries around LlamaIndex objects.

    Example::

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

    Surfaces: ``register_chat`` (an ``LLM``, or ``use_fallback_chain`` for a
    :class:`FallbackLLM`), ``register_embeddings`` (a ``BaseEmbedding``),
    ``register_vector_store`` (a vector store). Layers: ``use_rate_limiting``
    (:class:`RateLimitedLLM`, :class:`RateLimitedEmbedding`), ``use_cost_budgeting``
    (:class:`CostTrackedLLM`, :class:`CostTrackedEmbedding`), ``configure_resilience``
    (:class:`RetryingEmbedding`, :class:`RetryingVectorStore`). Each call wraps what is
    registered at that point, so the last call is the outermost layer; ``build()``
    returns ``.chat``, ``.embeddings`` and ``.vector_store``, each answering
    ``find_layer``. The rules and their errors are in ``docs/composition.md``.
    """

    __slots__ = ()

    def _check_surface(self, surface: Surface, value: object, option: str) -> None:
        expected = _ACCEPTED[surface]
        if not isinstance(value, expected):
            raise TypeError(
                f"{option} must be a LlamaIndex {expected[0].__name__}; got {type(value).__name__}"
            )

    def _fallback_chain(self, members: Sequence[Any], options: Mapping[str, Any]) -> Any:
        return FallbackLLM(llms=list(members), **options)

    def _wrap(self, surface: Surface, layer: Layer, inner: Any) -> Any:
        chat = surface == "chat"
        if isinstance(layer, RateLimitLayer):
            if chat:
                return RateLimitedLLM(inner=inner, limiter=layer.limiter)
            return RateLimitedEmbedding(inner=inner, limiter=layer.limiter)
        if isinstance(layer, BudgetLayer):
            if chat:
                return CostTrackedLLM(
                    inner=inner, budget=layer.budget, ledger=layer.ledger, scope=layer.scope
                )
            return CostTrackedEmbedding(
                inner=inner, budget=layer.budget, ledger=layer.ledger, scope=layer.scope
            )
        if isinstance(layer, RetryLayer):
            # Loaded only when asked for: the retry wrappers stand apart from the rest.
            from llama_index.resilience.retry import RetryingEmbedding, RetryingVectorStore

            if surface == "embeddings":
                return RetryingEmbedding(inner=inner, policy=layer.policy)
            return RetryingVectorStore(inner=inner, policy=layer.policy)
        return super()._wrap(surface, layer, inner)
