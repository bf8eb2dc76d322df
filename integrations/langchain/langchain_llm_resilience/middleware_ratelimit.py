"""``RateLimitMiddleware``: requests and tokens per minute around an agent's model calls.

Translation only: the limiter is the core's ([`limiter_for`][llm_resilience.ratelimit.limiter_for]:
local bucket or Redis), a call's token weight is the core's
[`request_weight`][llm_resilience.ratelimit.request_weight] (the prompt's tokens plus the
call's output cap) and its settlement the core's
[`reconcile_with_usage`][llm_resilience.ratelimit.reconcile_with_usage] with the answer's
``usage_metadata``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Unpack

from langchain.agents.middleware.types import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage

from langchain_llm_resilience._delegate import documented_output_cap, prompt_pairs
from llm_resilience.checks import KnownKeywords
from llm_resilience.metering import stack_output_caps
from llm_resilience.ratelimit import (
    LimiterOptions,
    limiter_for,
    reconcile_with_usage,
    request_weight,
    weighs_tokens,
)
from llm_resilience.usage import output_cap, with_billed_apart

__all__ = ["RateLimitMiddleware"]


class RateLimitMiddleware(AgentMiddleware[Any, Any, Any], KnownKeywords):
    """Waits for a request permit (and token permits) before each model call of an agent.

    Examples:
        >>> agent = create_agent(
        ...     ChatOpenAI(model="gpt-4o"), tools=[search],
        ...     middleware=[RateLimitMiddleware(requests_per_minute=300,
        ...                                     tokens_per_minute=200_000)],
        ... )  # doctest: +SKIP

    One request permit per model call; with ``tokens_per_minute`` the call also weighs
    its prompt's estimated tokens plus its output cap (the request's ``max_tokens`` or
    the like in ``model_settings``, else the model's own cap), settled afterwards with
    the ``usage_metadata`` the answer reports (unused tokens go back; only a real report
    settles). ``limiter=`` shares one limiter (a ``TokenBucketRateLimiter``, or a
    ``RedisTokenBucketRateLimiter`` across processes) instead of the numbers. Over budget
    the call waits, first come first served; with ``max_queued_requests`` a caller
    finding the queue full gets ``RateLimitQueueFullError`` at once, and a call heavier
    than the whole token budget ``RequestExceedsCapacityError``; neither is retried nor
    failed over by ``FallbackMiddleware``. Listed after ``FallbackMiddleware``, each
    attempt waits for its own permit; before it, the call waits once. Raises
    ``ValueError`` for no budget and no limiter, or budgets beside a ``limiter``;
    ``TypeError`` for a keyword it does not take (naming the closest).
    """

    def __init__(self, name: str | None = None, **options: Unpack[LimiterOptions]) -> None:
        super().__init__()
        #: The limiter the calls take their permits from.
        self.limiter = limiter_for(**options)
        self._name = name

    @property
    def name(self) -> str:
        """The middleware's node name in the agent graph."""
        return self._name or "RateLimitMiddleware"

    def __repr__(self) -> str:
        return f"RateLimitMiddleware(limiter={type(self.limiter).__name__})"

    def _weight(self, request: ModelRequest[Any]) -> int:
        if not weighs_tokens(self.limiter):
            return 0  # no token budget: nothing to tokenize
        caps = stack_output_caps(request.model, documented_output_cap)
        return request_weight(
            self.limiter,
            prompt=prompt_pairs(_prompt(request)),
            max_output_tokens=output_cap(request.model_settings, caps),
        )

    def _settle(self, request: ModelRequest[Any], weight: int, response: Any) -> None:
        message = _answer(response)
        if not weight or message is None:
            return
        usage: dict[str, Any] = dict(message.usage_metadata or {})
        metadata = message.response_metadata
        reported_in, reported_out, _ = with_billed_apart(
            usage.get("input_tokens"),
            usage.get("output_tokens"),
            None,
            metadata.get("usage") if isinstance(metadata, dict) else None,
        )
        reconcile_with_usage(
            self.limiter, weight, reported_in, reported_out, prompt=prompt_pairs(_prompt(request))
        )

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage:
        weight = self._weight(request)
        self.limiter.acquire(weight, surface="chat")
        response = handler(request)
        self._settle(request, weight, response)
        return response

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage:
        weight = self._weight(request)
        await self.limiter.aacquire(weight, surface="chat")
        response = await handler(request)
        self._settle(request, weight, response)
        return response


def _prompt(request: ModelRequest[Any]) -> list[BaseMessage]:
    system = [request.system_message] if request.system_message is not None else []
    return [*system, *request.messages]


def _answer(response: Any) -> AIMessage | None:
    if isinstance(response, AIMessage):
        return response
    for message in getattr(response, "result", None) or ():
        if isinstance(message, AIMessage):
            return message
    return None
