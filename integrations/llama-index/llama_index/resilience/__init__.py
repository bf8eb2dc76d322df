"""LlamaIndex adapters for llm-resilience.

Example:

```python
from llama_index.resilience import CostTrackedLLM, FallbackLLM, RateLimitedLLM
from llm_resilience import CostBudget

llm = CostTrackedLLM(
    inner=RateLimitedLLM(
        inner=FallbackLLM(llms=[primary, secondary], per_client_timeout=30),
        requests_per_minute=300,
    ),
    budget=CostBudget(input_price_per_mtok=3, output_price_per_mtok=15, daily_limit=25),
)
```
"""

from __future__ import annotations

from llama_index.resilience.agents import RunBudgetLLM, agent_thread
from llama_index.resilience.builder import ResilienceBuilder
from llama_index.resilience.cost import BUDGET_SCOPE_KWARG, CostTrackedEmbedding, CostTrackedLLM
from llama_index.resilience.events import (
    FallbackStreamRestartEvent,
    RunBudgetDowngradeEvent,
    RunBudgetSpentEvent,
)
from llama_index.resilience.fallback import SERVED_BY_KEY, FallbackLLM
from llama_index.resilience.ratelimit import RateLimitedEmbedding, RateLimitedLLM
from llama_index.resilience.retry import RetryingEmbedding, RetryingVectorStore

__all__ = [
    "BUDGET_SCOPE_KWARG",
    "CostTrackedEmbedding",
    "CostTrackedLLM",
    "FallbackLLM",
    "FallbackStreamRestartEvent",
    "RateLimitedEmbedding",
    "RateLimitedLLM",
    "ResilienceBuilder",
    "RetryingEmbedding",
    "RetryingVectorStore",
    "RunBudgetDowngradeEvent",
    "RunBudgetLLM",
    "RunBudgetSpentEvent",
    "SERVED_BY_KEY",
    "agent_thread",
]
