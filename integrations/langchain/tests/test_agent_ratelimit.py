"""``RateLimitMiddleware`` in a ``create_agent`` agent with a tool: each model call takes a
request permit and weighs its prompt plus output cap in tokens, settled with the answer's
``usage_metadata``; a refusal is never retried. Sync and async."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.tools import tool

from langchain_llm_resilience import FallbackMiddleware, RateLimitMiddleware
from langchain_llm_resilience._delegate import prompt_pairs
from langchain_llm_resilience.testing import FailingChatModel, ScriptedChatModel
from llm_resilience import RequestExceedsCapacityError, TokenBucketRateLimiter
from llm_resilience.tokens import count_message_tokens

QUESTION = "what is magic_function(3)?"


@tool
def magic_function(input: int) -> int:
    """Applies a magic function to an input."""
    return input + 2


def frozen() -> float:
    return 0.0


class Seen(AgentMiddleware):  # type: ignore[type-arg]
    """Records each model call's prompt and answer (listed after the limiter)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, Any]] = []

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        response = handler(request)
        self.calls.append((request, response))
        return response

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        response = await handler(request)
        self.calls.append((request, response))
        return response


def run_agent(agent: Any, mode: str) -> Any:
    payload = {"messages": [("user", QUESTION)]}
    if mode == "invoke":
        return agent.invoke(payload)
    if mode == "ainvoke":
        return asyncio.run(agent.ainvoke(payload))
    if mode == "stream":
        return list(agent.stream(payload, stream_mode="messages"))

    async def collect() -> list[Any]:
        return [part async for part in agent.astream(payload, stream_mode="messages")]

    return asyncio.run(collect())


MODES = ["invoke", "ainvoke", "stream", "astream"]


class Weighing(RateLimitMiddleware):
    """Records each call's weight, as the limiter was asked for it."""

    weights: list[int]

    def _weight(self, request: Any) -> int:
        weight = super()._weight(request)
        self.weights.append(weight)
        return weight


@pytest.mark.parametrize("mode", MODES)
def test_each_call_weighs_prompt_and_output_cap_and_settles_with_the_reported_usage(
    mode: str,
) -> None:
    limiter = TokenBucketRateLimiter(60, tokens_per_minute=10_000, clock=frozen)
    limits = Weighing(limiter=limiter)
    limits.weights = []
    seen = Seen()
    model = ScriptedChatModel(max_tokens=200)
    agent = create_agent(model, tools=[magic_function], middleware=[limits, seen])
    run_agent(agent, mode)
    assert len(seen.calls) == 2  # the tool call, then the answer
    used = 0
    for (request, response), weight in zip(seen.calls, limits.weights, strict=True):
        prompt = prompt_pairs(
            [*([request.system_message] if request.system_message else []), *request.messages]
        )
        assert weight == count_message_tokens(prompt) + 200  # the model's own output cap
        usage = response.result[0].usage_metadata
        used += usage["input_tokens"] + usage["output_tokens"]
    # Every estimate was settled to what the answers reported: exactly that is spent.
    assert limiter.acquire(10_000 - used, blocking=False) is True
    assert limiter.acquire(1, blocking=False) is False


@pytest.mark.parametrize("mode", MODES)
def test_a_request_the_limiter_refuses_is_never_failed_over(mode: str) -> None:
    seen = Seen()
    agent = create_agent(
        FailingChatModel(),
        tools=[magic_function],
        middleware=[
            FallbackMiddleware(ScriptedChatModel()),
            RateLimitMiddleware(tokens_per_minute=10),
            seen,
        ],
    )
    with pytest.raises(RequestExceedsCapacityError):
        run_agent(agent, mode)
    assert seen.calls == []  # no model was called, and the fallback was not asked


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_listed_after_the_fallback_each_attempt_takes_its_own_permit(mode: str) -> None:
    limiter = TokenBucketRateLimiter(60, clock=frozen)
    agent = create_agent(
        FailingChatModel(),
        tools=[magic_function],
        middleware=[FallbackMiddleware(ScriptedChatModel()), RateLimitMiddleware(limiter=limiter)],
    )
    run_agent(agent, mode)
    # Two model calls, each failing over once: four permits of sixty.
    assert sum(limiter.acquire(blocking=False) for _ in range(60)) == 56


def test_the_middleware_refuses_a_misspelled_option_and_no_budget() -> None:
    with pytest.raises(TypeError, match="did you mean 'tokens_per_minute'"):
        RateLimitMiddleware(token_per_minute=10)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="requests_per_minute"):
        RateLimitMiddleware()
