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
from llm_resilience.builder import (
    BudgetLayer,
    Layer,
    RateLimitLayer,
    ResiliencePlan,
    RetryLayer,
    Surface,
)

__all__ = ["ResilienceBuilder"]

_ACCEPTED: dict[Surface, type[Any]] = {
    "chat": BaseChatModel,
    "embeddings": Embeddings,
    "vector_store": VectorStore,
}


class ResilienceBuilder(ResiliencePlan):
    """Put fallback, rate limiting, spend budgets and retries around LangChain objects.

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

    Surfaces: ``register_chat`` (a ``BaseChatModel``, or ``use_fallback_chain`` for a
    :class:`FallbackChatModel`), ``register_embeddings`` (an ``Embeddings``),
    ``register_vector_store`` (a ``VectorStore``). Layers: ``use_rate_limiting``
    (:class:`RateLimitedChatModel`, :class:`RateLimitedEmbeddings`),
    ``use_cost_budgeting`` (:class:`CostTrackedChatModel`,
    :class:`CostTrackedEmbeddings`), ``configure_resilience`` (``RetryingEmbeddings``,
    ``RetryingVectorStore``). Each call wraps what is registered at that point, so the
    last call is the outermost layer; ``build()`` returns ``.chat``, ``.embeddings`` and
    ``.vector_store``, each answering ``find_layer``. The rules and their errors are in
    ``docs/composition.md``.
    """

    __slots__ = ()

    def _check_surface(self, surface: Surface, value: object, option: str) -> None:
        expected = _ACCEPTED[surface]
        if not isinstance(value, expected):
            raise TypeError(
                f"{option} must be a LangChain {expected.__name__}; got {type(value).__name__}"
            )

    def _fallback_chain(self, members: Sequence[Any], options: Mapping[str, Any]) -> Any:
        return FallbackChatModel(models=list(members), **options)

    def _wrap(self, surface: Surface, layer: Layer, inner: Any) -> Any:
        chat = surface == "chat"
        if isinstance(layer, RateLimitLayer):
            limited = RateLimitedChatModel if chat else RateLimitedEmbeddings
            return limited(inner=inner, limiter=layer.limiter)
        if isinstance(layer, BudgetLayer):
            tracked = CostTrackedChatModel if chat else CostTrackedEmbeddings
            return tracked(inner=inner, budget=layer.budget, ledger=layer.ledger, scope=layer.scope)
        if isinstance(layer, RetryLayer):
            # Loaded only when asked for: the retry wrappers stand apart from the rest.
            from langchain_llm_resilience.retry import RetryingEmbeddings, RetryingVectorStore

            retrying = RetryingEmbeddings if surface == "embeddings" else RetryingVectorStore
            return retrying(inner=inner, policy=layer.policy)
        return super()._wrap(surface, layer, inner)
