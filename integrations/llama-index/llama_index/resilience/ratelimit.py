"""``RateLimitedLLM`` and ``RateLimitedEmbedding``: LlamaIndex layers over a token bucket.

The adapter only translates: the bucket, its queue and its derivation are the core's
(`llm_resilience.ratelimit`). Each call takes one permit before the inner call; a
stream takes it on its first iteration and holds nothing while streaming; an embedding
batch takes one permit, not one per text. A refused or cancelled wait never reaches the
inner model.

Importing this module also registers the core limiters as LlamaIndex
``BaseRateLimiter``\\ s, so they fit any LlamaIndex model's own ``rate_limiter=`` field.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.llms.llm import LLM
from llama_index.core.rate_limiter import BaseRateLimiter
from llama_index.resilience._delegate import (
    PASS_THROUGH,
    AnyResponse,
    CallKind,
    DelegatingEmbedding,
    DelegatingLLM,
    EmbeddingKind,
    Request,
)
from llama_index.resilience._usage import StreamTally, num_output, prompt_pairs, reported_tokens

from llm_resilience.metering import stack_output_caps
from llm_resilience.ratelimit import (
    RedisTokenBucketRateLimiter,
    TokenBucketRateLimiter,
    limiter_for,
    reconcile_with_usage,
    request_weight,
    weighs_tokens,
)
from llm_resilience.usage import output_cap

__all__ = ["RateLimitedEmbedding", "RateLimitedLLM"]

# The core limiters implement LlamaIndex's acquire/async_acquire signatures.
BaseRateLimiter.register(TokenBucketRateLimiter)
BaseRateLimiter.register(RedisTokenBucketRateLimiter)


class RateLimitedLLM(DelegatingLLM):
    """An LLM that waits for a rate-limit permit before each call.

    Example:

    ```python
    from llama_index.core import Settings
    from llama_index.llms.openai import OpenAI
    from llama_index.resilience import RateLimitedLLM

    Settings.llm = RateLimitedLLM(inner=OpenAI(model="gpt-4o"), requests_per_minute=300)
    ```

    Give either budgets (a new
    [`TokenBucketRateLimiter`][] from
    ``requests_per_minute``: ``max(1, rpm // 60)`` permits a second, a burst of ``rpm``;
    ``tokens_per_minute``; or both, with ``max_queued_requests`` if set; tokens alone
    leave requests unlimited) or ``limiter``, a limiter shared with other layers (a
    [`RedisTokenBucketRateLimiter`][] shares one budget
    across processes). Each of the eight chat/completion calls takes one permit first,
    waiting first come first served; a stream takes it on first iteration.

    When the limiter has ``tokens_per_minute``, a call also weighs its estimated prompt
    tokens plus its output cap (`output_cap`: the call's
    ``max_tokens``, ``max_completion_tokens`` or ``max_output_tokens``, else the largest
    cap an LLM below states, its own field or its ``metadata.num_output``: the cap a
    strict budget holds), and the weight is settled with the usage the provider
    reports afterwards by the core's rule
    (`reconcile_with_usage`).

    Raises ``ValueError`` when neither budgets nor ``limiter`` are given, or both,
    ``TypeError`` for a limiter without ``acquire``/``aacquire``, an ``inner`` that is
    not an ``LLM``, or a keyword that is neither an option nor a field (naming the
    closest); the limiter raises
    [`RateLimitQueueFullError`][llm_resilience.RateLimitQueueFullError] when its queue is full.
    Tools, structured output and metadata pass through to ``inner``.
    """

    limiter: Any = Field(exclude=True, description="The rate limiter every call waits on.")

    _caps: tuple[int | None, ...] = PrivateAttr(default=())

    def __init__(
        self,
        *,
        inner: LLM,
        requests_per_minute: int | None = None,
        max_queued_requests: int | None = None,
        tokens_per_minute: int | None = None,
        limiter: Any = None,
        **kwargs: Any,
    ) -> None:
        chosen = limiter_for(
            requests_per_minute=requests_per_minute,
            max_queued_requests=max_queued_requests,
            tokens_per_minute=tokens_per_minute,
            limiter=limiter,
        )
        super().__init__(inner=inner, limiter=chosen, **kwargs)
        self._caps = stack_output_caps(inner, num_output)

    @classmethod
    def class_name(cls) -> str:
        return "RateLimitedLLM"

    def _weighed(self, request: Request, kwargs: dict[str, Any]) -> _Permit:
        prompt = prompt_pairs(request)
        cap = output_cap(kwargs, self._caps)
        return _Permit(request_weight(self.limiter, prompt=prompt, max_output_tokens=cap), prompt)

    def _begin(self, kind: CallKind, request: Request, kwargs: dict[str, Any]) -> Any:
        limiter = self.limiter
        if not weighs_tokens(limiter):
            # No token budget: nothing to tokenize, nothing to reconcile afterwards.
            limiter.acquire(0, surface="chat")
            return PASS_THROUGH
        permit = self._weighed(request, kwargs)
        limiter.acquire(permit.weight, surface="chat")
        return permit

    async def _abegin(self, kind: CallKind, request: Request, kwargs: dict[str, Any]) -> Any:
        limiter = self.limiter
        if not weighs_tokens(limiter):
            await limiter.aacquire(0, surface="chat")
            return PASS_THROUGH
        permit = self._weighed(request, kwargs)
        await limiter.aacquire(permit.weight, surface="chat")
        return permit

    def _on_chunk(self, context: Any, chunk: AnyResponse) -> None:
        permit: _Permit = context
        permit.tally.add(chunk)

    def _end(self, context: Any, response: AnyResponse | None) -> None:
        permit: _Permit = context
        if response is None:
            return
        if permit.tally.started:
            reported_in, reported_out = permit.tally.input_tokens, permit.tally.output_tokens
        else:
            reported_in, reported_out = reported_tokens(response)
        reconcile_with_usage(
            self.limiter, permit.weight, reported_in, reported_out, prompt=permit.prompt
        )


class RateLimitedEmbedding(DelegatingEmbedding):
    """An embedding model that waits for a rate-limit permit before each call.

    Example:

    ```python
    from llama_index.core import Settings
    from llama_index.embeddings.openai import OpenAIEmbedding
    from llama_index.resilience import RateLimitedEmbedding

    Settings.embed_model = RateLimitedEmbedding(
        inner=OpenAIEmbedding(), requests_per_minute=3000
    )
    ```

    One permit per provider call: a query, a text, or a batch of up to
    ``embed_batch_size`` texts (so ``get_text_embedding_batch`` over 100 texts with a
    batch size of 10 takes 10 permits). Options and errors are
    [`RateLimitedLLM`][]'s; with ``tokens_per_minute`` a call weighs the estimated
    tokens of its texts (never reconciled: embedding usage is not reported).
    """

    limiter: Any = Field(exclude=True, description="The rate limiter every call waits on.")

    def __init__(
        self,
        *,
        inner: BaseEmbedding,
        requests_per_minute: int | None = None,
        max_queued_requests: int | None = None,
        tokens_per_minute: int | None = None,
        limiter: Any = None,
        **kwargs: Any,
    ) -> None:
        chosen = limiter_for(
            requests_per_minute=requests_per_minute,
            max_queued_requests=max_queued_requests,
            tokens_per_minute=tokens_per_minute,
            limiter=limiter,
        )
        super().__init__(inner=inner, limiter=chosen, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "RateLimitedEmbedding"

    def _weight(self, texts: list[str]) -> int:
        return request_weight(self.limiter, texts=texts)

    def _begin(self, kind: EmbeddingKind, texts: list[str]) -> None:
        self.limiter.acquire(self._weight(texts), surface="embedding")

    async def _abegin(self, kind: EmbeddingKind, texts: list[str]) -> None:
        await self.limiter.aacquire(self._weight(texts), surface="embedding")


class _Permit:
    """One call granted by tokens: its weight, its prompt and its stream tally (a call
    without a token budget has nothing to settle: it passes through)."""

    __slots__ = ("prompt", "tally", "weight")

    def __init__(self, weight: int, prompt: list[tuple[str, str]]) -> None:
        self.weight = weight
        self.prompt = prompt
        self.tally = StreamTally()
