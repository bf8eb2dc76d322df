"""llm-resilience: fallback, rate limiting, spend budgets and retries for LLM calls.

The framework-free core. Names load lazily on first use, so ``import llm_resilience``
costs almost nothing and never imports LangChain, LlamaIndex, SQLAlchemy or pandas.
The LangChain adapters live in ``langchain_llm_resilience`` and the LlamaIndex ones in
``llama_index.resilience``.

>>> from llm_resilience import FallbackChain
>>> FallbackChain(["a", "b"]).invoke(lambda index, client: client)
'a'
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_resilience.budget import BudgetGate, CostBudget, ModelPrice, ServingModel
    from llm_resilience.builder import ResiliencePlan, ResilienceStack
    from llm_resilience.errors import (
        BudgetExceededError,
        LedgerTimeoutError,
        LLMResilienceError,
        NoCapableMemberError,
        PerClientTimeoutError,
        RateLimitBackendError,
        RateLimitQueueFullError,
        RequestExceedsCapacityError,
        StreamInterruptedError,
    )
    from llm_resilience.fallback import (
        Cooldown,
        FallbackChain,
        MemberProfile,
        RequestNeeds,
        StreamRestart,
    )
    from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry, SqlCostLedger
    from llm_resilience.ratelimit import RedisTokenBucketRateLimiter, TokenBucketRateLimiter
    from llm_resilience.retry import RetryPolicy
    from llm_resilience.tokens import count_tokens
    from llm_resilience.transient import TransientClassifier, is_transient

__all__ = [
    "BudgetExceededError",
    "BudgetGate",
    "CostBudget",
    "Cooldown",
    "FallbackChain",
    "InMemoryCostLedger",
    "LLMResilienceError",
    "LedgerEntry",
    "LedgerTimeoutError",
    "MemberProfile",
    "ModelPrice",
    "NoCapableMemberError",
    "ServingModel",
    "PerClientTimeoutError",
    "RateLimitQueueFullError",
    "RedisTokenBucketRateLimiter",
    "RateLimitBackendError",
    "RequestExceedsCapacityError",
    "StreamInterruptedError",
    "RequestNeeds",
    "ResiliencePlan",
    "ResilienceStack",
    "RetryPolicy",
    "SqlCostLedger",
    "StreamRestart",
    "TokenBucketRateLimiter",
    "TransientClassifier",
    "__version__",
    "count_tokens",
    "is_transient",
]

_LOCATIONS = {
    "BudgetGate": "llm_resilience.budget",
    "CostBudget": "llm_resilience.budget",
    "ModelPrice": "llm_resilience.budget",
    "ServingModel": "llm_resilience.budget",
    "ResiliencePlan": "llm_resilience.builder",
    "ResilienceStack": "llm_resilience.builder",
    "BudgetExceededError": "llm_resilience.errors",
    "LLMResilienceError": "llm_resilience.errors",
    "LedgerTimeoutError": "llm_resilience.errors",
    "PerClientTimeoutError": "llm_resilience.errors",
    "RateLimitQueueFullError": "llm_resilience.errors",
    "RateLimitBackendError": "llm_resilience.errors",
    "RequestExceedsCapacityError": "llm_resilience.errors",
    "NoCapableMemberError": "llm_resilience.errors",
    "StreamInterruptedError": "llm_resilience.errors",
    "Cooldown": "llm_resilience.fallback",
    "FallbackChain": "llm_resilience.fallback",
    "MemberProfile": "llm_resilience.fallback",
    "RequestNeeds": "llm_resilience.fallback",
    "StreamRestart": "llm_resilience.fallback",
    "InMemoryCostLedger": "llm_resilience.ledger",
    "LedgerEntry": "llm_resilience.ledger",
    "SqlCostLedger": "llm_resilience.ledger",
    "RedisTokenBucketRateLimiter": "llm_resilience.ratelimit",
    "TokenBucketRateLimiter": "llm_resilience.ratelimit",
    "RetryPolicy": "llm_resilience.retry",
    "count_tokens": "llm_resilience.tokens",
    "TransientClassifier": "llm_resilience.transient",
    "is_transient": "llm_resilience.transient",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("llm-resilience")
    module = _LOCATIONS.get(name)
    if module is None:
        raise AttributeError(f"module 'llm_resilience' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
