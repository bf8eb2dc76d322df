"""RateLimitedChatModel and RateLimitedEmbeddings: a permit before every inner call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.runnables import RunnableBinding
from langchain_core.tools import tool
from pydantic import BaseModel

from langchain_llm_resilience import FallbackChatModel, RateLimitedChatModel, RateLimitedEmbeddings
from langchain_llm_resilience.testing import FailingChatModel, ScriptedChatModel
from llm_resilience import RateLimitQueueFullError, TokenBucketRateLimiter


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


async def test_every_call_shape_takes_exactly_one_permit_before_the_inner_call() -> None:
    limiter = CountingLimiter()
    inner = ScriptedChatModel(responses=["one two three"])
    model = RateLimitedChatModel(inner=inner, limiter=limiter)
    model.invoke("a")
    await model.ainvoke("b")
    assert "".join(str(c.content) for c in model.stream("c")) == "one two three"
    assert "".join([str(c.content) async for c in model.astream("d")]) == "one two three"
    model.batch(["e", "f"])
    assert limiter.acquired == [(0, "chat")] * 6
    assert inner.calls == 6


def test_a_stream_takes_its_permit_on_first_iteration_not_when_created() -> None:
    limiter = CountingLimiter()
    model = RateLimitedChatModel(inner=ScriptedChatModel(), limiter=limiter)
    stream = model.stream("hello")
    assert limiter.acquired == []
    next(stream)
    assert limiter.acquired == [(0, "chat")]
    list(stream)
    assert len(limiter.acquired) == 1


def test_the_inner_model_is_never_called_after_a_refusal() -> None:
    inner = ScriptedChatModel()
    model = RateLimitedChatModel(
        inner=inner, limiter=CountingLimiter(refuse=RateLimitQueueFullError(3))
    )
    with pytest.raises(RateLimitQueueFullError):
        model.invoke("a")
    with pytest.raises(RateLimitQueueFullError):
        list(model.stream("a"))
    assert inner.calls == 0


async def test_a_caller_cancelled_while_waiting_never_reaches_the_inner_model() -> None:
    inner = ScriptedChatModel()
    model = RateLimitedChatModel(inner=inner, requests_per_minute=1)  # capacity 1, 1 per second
    await model.ainvoke("first")
    waiting = asyncio.create_task(model.ainvoke("second"))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert inner.calls == 1


def test_one_permit_covers_a_whole_fallback_sequence() -> None:
    limiter = CountingLimiter()
    chain = FallbackChatModel(models=[FailingChatModel(), ScriptedChatModel(responses=["ok"])])
    model = RateLimitedChatModel(inner=chain, limiter=limiter)
    assert model.invoke("x").content == "ok"
    assert len(limiter.acquired) == 1
    assert model.find_layer(FallbackChatModel) is chain
    assert model.find_layer(ScriptedChatModel) is chain.models[1]


def test_tokens_per_minute_weighs_the_prompt_and_max_tokens_and_reconciles_usage() -> None:
    limiter = CountingLimiter(TokenBucketRateLimiter(6000, tokens_per_minute=600_000))
    inner = ScriptedChatModel(responses=["a short answer"])
    model = RateLimitedChatModel(inner=inner, limiter=limiter)
    answer = model.invoke("How long is a piece of string?", max_tokens=100)
    ((weight, _),) = limiter.acquired
    assert weight > 100  # the prompt estimate plus the 100 output tokens asked for
    usage = answer.usage_metadata
    assert usage is not None
    assert limiter.reconciled == [(weight, usage["input_tokens"] + usage["output_tokens"])]


async def test_a_token_budget_is_reconciled_after_every_call_shape_and_a_request_budget_never() -> (
    None
):
    weighed = CountingLimiter(TokenBucketRateLimiter(6000, tokens_per_minute=600_000))
    counted = CountingLimiter()
    for limiter in (weighed, counted):
        model = RateLimitedChatModel(
            inner=ScriptedChatModel(responses=["one two three"]), limiter=limiter
        )
        model.invoke("a", max_tokens=50)
        await model.ainvoke("b", max_tokens=50)
        assert "".join(str(c.content) for c in model.stream("c", max_tokens=50))
        assert "".join([str(c.content) async for c in model.astream("d", max_tokens=50)])

    assert [weight for weight, _ in weighed.reconciled] == [w for w, _ in weighed.acquired]
    assert len(weighed.reconciled) == 4
    assert all(actual > 0 for _, actual in weighed.reconciled)  # the streams' usage too
    assert counted.reconciled == []  # no token budget: nothing weighed, nothing to settle


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


async def test_an_embedding_batch_takes_one_permit_not_one_per_text() -> None:
    limiter = CountingLimiter()
    embeddings = RateLimitedEmbeddings(inner=DeterministicFakeEmbedding(size=8), limiter=limiter)
    vectors = embeddings.embed_documents(["a", "b", "c", "d"])
    assert len(vectors) == 4
    embeddings.embed_query("q")
    await embeddings.aembed_documents(["a", "b"])
    await embeddings.aembed_query("q")
    assert limiter.acquired == [(0, "embedding")] * 4


def test_chat_and_embedding_limiters_are_independent() -> None:
    chat = RateLimitedChatModel(inner=ScriptedChatModel(), requests_per_minute=60)
    embeddings = RateLimitedEmbeddings(
        inner=DeterministicFakeEmbedding(size=4), requests_per_minute=60
    )
    assert chat.rate_limiter_in_use is not embeddings.limiter


@pytest.mark.parametrize(
    ("params", "error", "words"),
    [
        ({}, ValueError, ["requests_per_minute", "limiter"]),
        (
            {"requests_per_minute": 60, "limiter": TokenBucketRateLimiter(60)},
            ValueError,
            ["either"],
        ),
        ({"limiter": "fast"}, TypeError, ["limiter", "str"]),
        ({"requests_per_minute": 0}, ValueError, ["requests_per_minute"]),
        (
            {"requests_per_minute": 60, "max_queued_requests": 0},
            ValueError,
            ["max_queued_requests"],
        ),
    ],
)
def test_bad_options_fail_at_construction_naming_the_option(
    params: dict[str, Any], error: type[Exception], words: list[str]
) -> None:
    with pytest.raises(error) as raised:
        RateLimitedChatModel(inner=ScriptedChatModel(), **params)
    for word in words:
        assert word in str(raised.value)
    with pytest.raises(error):
        RateLimitedEmbeddings(inner=DeterministicFakeEmbedding(size=4), **params)


def test_embeddings_reject_an_inner_that_is_not_embeddings() -> None:
    with pytest.raises(TypeError, match="inner"):
        RateLimitedEmbeddings(inner="text-embedding-3-small", requests_per_minute=60)  # type: ignore[arg-type]


def test_a_misspelled_option_is_refused_naming_the_one_meant_not_dropped() -> None:
    misspelled: dict[str, Any] = {"requests_per_minute": 60, "max_queue_requests": 3}
    with pytest.raises(TypeError, match="did you mean 'max_queued_requests'"):
        RateLimitedChatModel(inner=ScriptedChatModel(), **misspelled)
    with pytest.raises(TypeError, match="did you mean 'max_queued_requests'"):
        RateLimitedEmbeddings(inner=DeterministicFakeEmbedding(size=4), **misspelled)
