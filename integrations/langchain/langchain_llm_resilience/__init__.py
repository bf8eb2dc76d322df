"""LangChain adapters for llm-resilience.

Examples:
    >>> from langchain_llm_resilience import FallbackChatModel, RateLimitedChatModel
"""

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
from langchain_llm_resilience.middleware_budget import DOWNGRADE_EVENT, BudgetMiddleware
from langchain_llm_resilience.middleware_fallback import FallbackMiddleware
from langchain_llm_resilience.middleware_ratelimit import RateLimitMiddleware
from langchain_llm_resilience.ratelimit import RateLimitedChatModel, RateLimitedEmbeddings
from langchain_llm_resilience.retry import RetryingEmbeddings, RetryingVectorStore

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
