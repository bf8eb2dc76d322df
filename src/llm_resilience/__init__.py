"""llm-resilience: fallback, rate limiting, spend budgets and retries for LLM calls.

The framework-free core. Names load lazily on first use, so ``import llm_resilience``
costs almost nothing and never imports LangChain, LlamaIndex, SQLAlchemy or pandas. Each
public name is written twice: in the ``TYPE_CHECKING`` imports (its module and its type)
and in ``__all__`` (sorted; ``tests/test_public_api.py`` holds the two equal).

The layers, top to bottom (``docs/architecture.md``; ``lint-imports`` enforces them): this
face and the CLI; the builder, the metered call and spend reports; the policies (``budget``,
``fallback``, ``ratelimit``, then ``retry``); storage (``ledger``); ``money``; the shared
rules (``usage``, ``self_retry``, ``transient``, ``telemetry``, ``redact``, ``tokens``,
``layers``); ``errors``; ``checks``.
The LangChain adapters live in ``langchain_llm_resilience`` and the LlamaIndex ones in
``llama_index.resilience``.

Examples:
    >>> from llm_resilience import FallbackChain
    >>> FallbackChain(["a", "b"]).invoke(lambda index, client: client)
    'a'
"""

from __future__ import annotations

import functools
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_resilience.budget import BudgetGate, CostBudget, ModelPrice, ServingModel
    from llm_resilience.builder import ResiliencePlan, ResilienceStack
    from llm_resilience.errors import (
        AttemptCapExceededError,
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
        RedisCircuitStore,
        RequestNeeds,
        StreamRestart,
    )
    from llm_resilience.frames import to_dataframe
    from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry, SqlCostLedger
    from llm_resilience.ratelimit import RedisTokenBucketRateLimiter, TokenBucketRateLimiter
    from llm_resilience.retry import RetryPolicy
    from llm_resilience.retry_budget import RedisRetryBudgetStore, RetryBudget
    from llm_resilience.runs import AttemptCap, AttemptEvent
    from llm_resilience.tokens import count_tokens
    from llm_resilience.transient import TransientClassifier, is_budget_exhausted, is_transient

__all__ = [
    "AttemptCap",
    "AttemptCapExceededError",
    "AttemptEvent",
    "BudgetExceededError",
    "BudgetGate",
    "Cooldown",
    "CostBudget",
    "FallbackChain",
    "InMemoryCostLedger",
    "LLMResilienceError",
    "LedgerEntry",
    "LedgerTimeoutError",
    "MemberProfile",
    "ModelPrice",
    "NoCapableMemberError",
    "PerClientTimeoutError",
    "RateLimitBackendError",
    "RateLimitQueueFullError",
    "RedisCircuitStore",
    "RedisRetryBudgetStore",
    "RedisTokenBucketRateLimiter",
    "RequestExceedsCapacityError",
    "RequestNeeds",
    "ResiliencePlan",
    "ResilienceStack",
    "RetryBudget",
    "RetryPolicy",
    "ServingModel",
    "SqlCostLedger",
    "StreamInterruptedError",
    "StreamRestart",
    "TokenBucketRateLimiter",
    "TransientClassifier",
    "__version__",
    "count_tokens",
    "is_budget_exhausted",
    "is_transient",
    "to_dataframe",
]


@functools.cache
def _locations() -> dict[str, str]:
    """Where each lazy name lives, read once from the ``TYPE_CHECKING`` imports above: they
    are the one table of them (type checkers read it too)."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    )
    return {
        alias.name: statement.module
        for statement in block.body
        if isinstance(statement, ast.ImportFrom) and statement.module is not None
        for alias in statement.names
    }


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("llm-resilience")
    module = _locations().get(name)
    if module is None:
        raise AttributeError(f"module 'llm_resilience' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
