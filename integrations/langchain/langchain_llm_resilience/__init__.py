"""LangChain adapters for llm-resilience.

Examples:
    >>> from langchain_llm_resilience import FallbackChatModel, RateLimitedChatModel

The agent middlewares (``BudgetMiddleware``, ``FallbackMiddleware``,
``RateLimitMiddleware``) need ``langchain>=1.5`` (the ``agents`` extra), which the model
wrappers do not: they load when first named, and name the extra when it is missing.
"""

from typing import TYPE_CHECKING, Any

from langchain_llm_resilience.builder import ResilienceBuilder
from langchain_llm_resilience.cost import (
    BUDGET_SCOPE_KWARG,
    CostTrackedChatModel,
    CostTrackedEmbeddings,
)
from langchain_llm_resilience.fallback import (
    SERVED_BY_KEY,
    STREAM_RESTART_EVENT,
    FallbackChatModel,
)
from langchain_llm_resilience.ratelimit import RateLimitedChatModel, RateLimitedEmbeddings
from langchain_llm_resilience.retry import RetryingEmbeddings, RetryingVectorStore

if TYPE_CHECKING:
    from langchain_llm_resilience.middleware_budget import DOWNGRADE_EVENT, BudgetMiddleware
    from langchain_llm_resilience.middleware_fallback import FallbackMiddleware
    from langchain_llm_resilience.middleware_ratelimit import RateLimitMiddleware

#: The agent middlewares' names and modules, loaded on first use (they need langchain).
_AGENTS = {
    "BudgetMiddleware": "middleware_budget",
    "DOWNGRADE_EVENT": "middleware_budget",
    "FallbackMiddleware": "middleware_fallback",
    "RateLimitMiddleware": "middleware_ratelimit",
}

__all__ = [
    "BUDGET_SCOPE_KWARG",
    "BudgetMiddleware",
    "CostTrackedChatModel",
    "CostTrackedEmbeddings",
    "DOWNGRADE_EVENT",
    "FallbackChatModel",
    "FallbackMiddleware",
    "RateLimitMiddleware",
    "RateLimitedChatModel",
    "RateLimitedEmbeddings",
    "ResilienceBuilder",
    "RetryingEmbeddings",
    "RetryingVectorStore",
    "SERVED_BY_KEY",
    "STREAM_RESTART_EVENT",
]


def __getattr__(name: str) -> Any:
    module = _AGENTS.get(name)
    if module is None:
        raise AttributeError(f"module 'langchain_llm_resilience' has no attribute {name!r}")
    from importlib import import_module

    try:
        value = getattr(import_module(f"langchain_llm_resilience.{module}"), name)
    except ModuleNotFoundError as missing:
        if (missing.name or "").partition(".")[0] not in ("langchain", "langgraph"):
            raise
        raise ImportError(
            f"{name} is agent middleware for langchain>=1.5 (langchain.agents), which is not "
            "installed: pip install 'langchain-llm-resilience[agents]'"
        ) from missing
    globals()[name] = value
    return value
