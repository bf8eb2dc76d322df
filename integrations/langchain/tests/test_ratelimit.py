"""RateLimitedChatModel and RateLimitedEmbeddings: what LangChain alone has (batches, tools)."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableBinding
from langchain_core.tools import tool
from pydantic import BaseModel

from langchain_llm_resilience import RateLimitedChatModel
from langchain_llm_resilience.testing import ScriptedChatModel
from llm_resilience import TokenBucketRateLimiter


class CountingLimiter:
    """A real limiter behind a counter of what the wrappers asked of it."""

    def __init__(self, limiter: Any = None, refuse: BaseException | None = None) -> None:
        self.limiter = limiter or TokenBucketRateLimiter(6000)
        self.refuse = refuse
        self.acquired: list[tuple[int, str]] = []
        self.reconciled: list[tuple[int, int]] = []
        self.tokens_per_minute = getattr(self.limiter, "tokens_per_minute", None)

    def acquire(self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat") -> bool:
        if self.refuse is not None:
            raise self.refuse
        self.acquired.append((num_tokens, surface))
        return bool(self.limiter.acquire(num_tokens, blocking=blocking, surface=surface))

    async def aacquire(
        self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat"
    ) -> bool:
        if self.refuse is not None:
            raise self.refuse
        self.acquired.append((num_tokens, surface))
        return bool(await self.limiter.aacquire(num_tokens, blocking=blocking, surface=surface))

    def reconcile(self, estimated_tokens: int, actual_tokens: int) -> None:
        self.reconciled.append((estimated_tokens, actual_tokens))
        self.limiter.reconcile(estimated_tokens, actual_tokens)


# What both adapters share (one permit per call shape, streams, refusals, token weights,
# options) is in tests/behaviour/test_ratelimit.py.


def test_a_batch_takes_one_permit_per_prompt() -> None:
    limiter = CountingLimiter()
    inner = ScriptedChatModel(responses=["one two three"])
    model = RateLimitedChatModel(inner=inner, limiter=limiter)

    model.batch(["e", "f"])

    assert limiter.acquired == [(0, "chat")] * 2
    assert inner.calls == 2


def test_tools_and_structured_output_pass_through_and_still_take_permits() -> None:
    @tool
    def magic_function(input: int) -> int:
        """Apply a magic function to an input."""
        return input + 2

    class Answer(BaseModel):
        """An answer."""

        city: str

    limiter = CountingLimiter()
    model = RateLimitedChatModel(inner=ScriptedChatModel(), limiter=limiter)
    bound = model.bind_tools([magic_function], tool_choice="any")
    assert isinstance(bound, RunnableBinding)
    message = bound.invoke("What is magic_function(3)?")
    assert message.tool_calls[0]["args"] == {"input": 3}
    structured = model.with_structured_output(Answer)
    assert isinstance(structured.invoke("The city is 'Paris'."), Answer)
    assert len(limiter.acquired) == 2


# An inner of the wrong kind, for both adapters and both layers:
# tests/behaviour/test_ratelimit.py.
