"""Rate limiting for LangChain: wrappers, and the core limiters in ``rate_limiter=`` slots.

Importing this module registers the core limiters as virtual subclasses of LangChain's
``BaseRateLimiter``, so ``ChatOpenAI(rate_limiter=TokenBucketRateLimiter(300))`` works:
their ``acquire(*, blocking=True)``/``aacquire`` already speak that interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

from langchain_core.embeddings import Embeddings
from langchain_core.messages import BaseMessage
from langchain_core.rate_limiters import BaseRateLimiter
from pydantic import Field, PrivateAttr

from langchain_llm_resilience._delegate import (
    DelegatingChatModel,
    documented_output_cap,
    private_state,
    prompt_pairs,
)
from llm_resilience.checks import KnownKeywords
from llm_resilience.layers import WrapsOne
from llm_resilience.metering import stack_output_caps
from llm_resilience.ratelimit import (
    LimiterOptions,
    RedisTokenBucketRateLimiter,
    TokenBucketRateLimiter,
    limiter_for,
    reconcile_with_usage,
    request_weight,
    weighs_tokens,
)
from llm_resilience.usage import output_cap, with_billed_apart

__all__ = ["RateLimitedChatModel", "RateLimitedEmbeddings"]

BaseRateLimiter.register(TokenBucketRateLimiter)
BaseRateLimiter.register(RedisTokenBucketRateLimiter)


class RateLimitedChatModel(DelegatingChatModel):
    """A chat model that waits for a permit before each call to ``inner``.

    Examples:
        >>> model = RateLimitedChatModel(inner=ChatOpenAI(model="gpt-4o"), requests_per_minute=300)
        ... # doctest: +SKIP

    One permit per call, taken before the inner model is called (a stream takes it on its
    first iteration and holds nothing while streaming). Over budget, callers wait, first
    come first served; with ``max_queued_requests`` a caller finding the queue full gets
    ``RateLimitQueueFullError`` at once and the inner model is never called. With
    ``tokens_per_minute`` a call also needs its estimated prompt tokens plus its output
    cap in token permits (`request_weight`; the cap is
    `output_cap`'s, as a strict budget's hold reads it),
    settled with the usage the provider reports afterwards by the core's rule
    (`reconcile_with_usage`: only a real report
    settles; a limiter that cannot settle logs a warning, the call still succeeds).
    ``tokens_per_minute`` alone (no ``requests_per_minute``) limits tokens only.
    ``limiter=`` shares one limiter (in-process or Redis) between wrappers instead.
    Tools, structured output and metadata pass through to ``inner``. Raises
    ``ValueError`` for no budget and no limiter, or for budgets beside a ``limiter``;
    `TypeError` for a keyword that is not a field (naming the closest one).
    """

    requests_per_minute: int | None = None
    """Permits per minute (>= 1): ``max(1, rpm // 60)`` refill every second, capacity rpm;
    None with ``tokens_per_minute`` set: requests unlimited."""
    max_queued_requests: int | None = None
    """Bound on waiting callers; None waits without bound."""
    tokens_per_minute: int | None = None
    """Optional token budget per minute (prompt estimate + max output tokens per call)."""
    limiter: Any = Field(default=None, exclude=True)
    """A shared limiter instead of the three numbers above."""

    _limiter: Any = PrivateAttr()
    _caps: tuple[int | None, ...] = PrivateAttr(default=())

    def __init__(self, **data: Any) -> None:
        limiter = limiter_for(
            requests_per_minute=data.get("requests_per_minute"),
            max_queued_requests=data.get("max_queued_requests"),
            tokens_per_minute=data.get("tokens_per_minute"),
            limiter=data.get("limiter"),
        )
        super().__init__(**data)
        self._limiter = limiter
        self._caps = stack_output_caps(self.inner, documented_output_cap)

    @property
    def _llm_type(self) -> str:
        return "rate-limited-chat-model"

    @property
    def rate_limiter_in_use(self) -> Any:
        """The limiter this wrapper takes its permits from."""
        return private_state(self)["_limiter"]

    def _weight(self, limiter: Any, messages: list[BaseMessage], kwargs: dict[str, Any]) -> int:
        if not weighs_tokens(limiter):
            return 0  # no token budget: nothing to tokenize
        return request_weight(
            limiter,
            prompt=prompt_pairs(messages),
            max_output_tokens=output_cap(kwargs, private_state(self)["_caps"]),
        )

    def _begin(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> int:
        limiter = private_state(self)["_limiter"]
        weight = self._weight(limiter, messages, kwargs)
        limiter.acquire(weight, surface="chat")
        return weight

    async def _abegin(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> int:
        limiter = private_state(self)["_limiter"]
        weight = self._weight(limiter, messages, kwargs)
        await limiter.aacquire(weight, surface="chat")
        return weight

    def _settles_streams(self) -> bool:
        # Only a token budget settles a call (with its reported usage).
        return weighs_tokens(private_state(self)["_limiter"])

    def _reads_answer(self, context: Any) -> bool:
        return bool(context)  # a call that weighed no tokens has nothing to reconcile

    def _end(self, context: Any, messages: list[BaseMessage], message: BaseMessage | None) -> None:
        if message is None or not self._reads_answer(context):
            return
        usage = getattr(message, "usage_metadata", None) or {}
        metadata = message.response_metadata
        # With what the raw usage bills apart (Anthropic's compaction steps): they count
        # against the provider's token limits too.
        reported_in, reported_out, _ = with_billed_apart(
            usage.get("input_tokens"),
            usage.get("output_tokens"),
            None,
            metadata.get("usage") if isinstance(metadata, dict) else None,
        )
        reconcile_with_usage(
            self.rate_limiter_in_use,
            context,
            reported_in,
            reported_out,
            prompt=prompt_pairs(messages),
        )


class RateLimitedEmbeddings(Embeddings, WrapsOne, KnownKeywords):
    """Embeddings that take one permit per call (per batch, not per text) from a limiter.

    Examples:
        >>> embeddings = RateLimitedEmbeddings(inner=OpenAIEmbeddings(), requests_per_minute=1200)
        ... # doctest: +SKIP

    The options are the core's `LimiterOptions`, as keywords: `requests_per_minute`,
    `max_queued_requests`, `tokens_per_minute` (a call weighs the estimated tokens of its
    texts), or `limiter`, one shared with other wrappers. The inner model is never called
    after a refusal or a cancellation while waiting. Raises `ValueError` for no budget
    and no limiter, or budgets beside a `limiter`; `TypeError` for an `inner` that is not
    an `Embeddings`, or an unknown option (naming the closest).
    """

    def __init__(self, *, inner: Embeddings, **options: Unpack[LimiterOptions]) -> None:
        if not isinstance(inner, Embeddings):
            raise TypeError(f"inner must be a LangChain Embeddings; got {type(inner).__name__}")
        #: The wrapped embeddings model.
        self.inner = inner
        #: The limiter this wrapper takes its permits from.
        self.limiter = limiter_for(**options)

    def _weight(self, texts: Sequence[str]) -> int:
        return request_weight(self.limiter, texts=texts)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.limiter.acquire(self._weight(texts), surface="embedding")
        return self.inner.embed_documents(texts)

    def embed_query(self, text: str) -> list[float]:
        self.limiter.acquire(self._weight([text]), surface="embedding")
        return self.inner.embed_query(text)

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        await self.limiter.aacquire(self._weight(texts), surface="embedding")
        return await self.inner.aembed_documents(texts)

    async def aembed_query(self, text: str) -> list[float]:
        await self.limiter.aacquire(self._weight([text]), surface="embedding")
        return await self.inner.aembed_query(text)
