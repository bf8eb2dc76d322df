"""Token budgets without a request budget in LlamaIndex's own ``rate_limiter=`` slot.

That slot calls ``acquire()`` without a token count, so there a tokens-only budget limits
nothing (our wrappers weigh each call: tests/behaviour/test_ratelimit_tokens_only.py).
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.resilience.testing import FakeFunctionCallingLLM

from llm_resilience.ratelimit import TokenBucketRateLimiter

MESSAGES = [ChatMessage(role=MessageRole.USER, content="What is the capital of France?")]


class AskedLimiter(TokenBucketRateLimiter):
    """Remembers the token count of every ``acquire``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: list[int] = []

    def acquire(self, num_tokens: int = 0, **kwargs: Any) -> bool:
        self.asked.append(num_tokens)
        return super().acquire(num_tokens, **kwargs)


def test_in_llama_indexs_own_slot_a_tokens_only_budget_limits_nothing() -> None:
    # One token a minute: any call our wrapper weighs could never be granted.
    limiter = AskedLimiter(None, tokens_per_minute=1)
    in_slot = FakeFunctionCallingLLM(rate_limiter=limiter)

    for _ in range(20):
        in_slot.chat(MESSAGES)

    assert in_slot.calls == 20
    assert limiter.asked == [0] * 20  # LlamaIndex's callback calls acquire() with no count
    assert limiter.acquire(1, blocking=False) is True  # so the token was never touched
