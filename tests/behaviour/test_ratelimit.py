"""The rate-limited layers in both adapters: one permit per call, before the call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from cost_driver import EMBED_SHAPES
from driver import PROMPT, STREAMS, Mode

from llm_resilience.errors import RateLimitQueueFullError, RequestExceedsCapacityError
from llm_resilience.ratelimit import TokenBucketRateLimiter
from llm_resilience.testing import Fault, FaultInjectingServer
from llm_resilience.usage import estimate_request_tokens


class SpyLimiter:
    """A limiter that grants at once and remembers every permit and reconciliation."""

    def __init__(
        self,
        *,
        tokens_per_minute: int | None = None,
        error: BaseException | None = None,
        calls: Any = None,
    ) -> None:
        self.tokens_per_minute = tokens_per_minute
        self.error = error
        self.calls = calls
        self.acquired: list[tuple[int, str]] = []
        self.inner_calls_when_acquired: list[int] = []
        self.reconciled: list[tuple[int, int]] = []

    def acquire(self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat") -> bool:
        if self.error is not None:
            raise self.error
        self.acquired.append((num_tokens, surface))
        if self.calls is not None:
            self.inner_calls_when_acquired.append(self.calls())
        return True

    async def aacquire(
        self, num_tokens: int = 0, *, blocking: bool = True, surface: str = "chat"
    ) -> bool:
        return self.acquire(num_tokens, blocking=blocking, surface=surface)

    def reconcile(self, estimated_tokens: int, actual_tokens: int) -> None:
        self.reconciled.append((estimated_tokens, actual_tokens))


def frozen_bucket(**options: Any) -> TokenBucketRateLimiter:
    """A real bucket whose clock never moves: no permit is ever refilled."""
    return TokenBucketRateLimiter(clock=lambda: 0.0, **options)


async def until_queued(limiter: TokenBucketRateLimiter, waiting: int) -> None:
    for _ in range(1000):
        if limiter.queued >= waiting:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("no caller started waiting")


# -- one permit per call ---------------------------------------------------------------


async def test_every_call_shape_takes_one_permit_before_the_inner_call(
    driver: Any, mode: Mode
) -> None:
    inner = driver.answering("one two three")
    limiter = SpyLimiter(calls=lambda: driver.calls(inner))
    model = driver.rate_limited(inner, limiter=limiter)

    reply = await driver.run(model, mode)

    assert reply.text == "one two three"
    assert limiter.acquired == [(0, "chat")]
    assert limiter.inner_calls_when_acquired == [0]
    assert driver.calls(inner) == 1


def test_a_stream_takes_its_permit_on_first_iteration_not_when_created(driver: Any) -> None:
    inner = driver.answering()
    limiter = SpyLimiter()
    stream = driver.open_stream(driver.rate_limited(inner, limiter=limiter), PROMPT)
    assert limiter.acquired == []

    next(stream)
    assert limiter.acquired == [(0, "chat")]
    list(stream)
    assert len(limiter.acquired) == 1
    assert driver.calls(inner) == 1


async def test_an_async_stream_takes_its_permit_on_first_iteration_not_when_created(
    driver: Any,
) -> None:
    limiter = SpyLimiter()
    stream = await driver.aopen_stream(
        driver.rate_limited(driver.answering(), limiter=limiter), PROMPT
    )
    assert limiter.acquired == []

    await stream.__anext__()
    assert limiter.acquired == [(0, "chat")]


def test_calls_beyond_the_burst_are_held_by_a_real_bucket(driver: Any) -> None:
    limiter = frozen_bucket(requests_per_minute=2)
    model = driver.rate_limited(driver.answering(), limiter=limiter)
    driver.run_sync(model)
    driver.run_sync(model)

    assert limiter.acquire(blocking=False) is False


async def test_over_a_fallback_chain_a_call_takes_one_permit_however_many_models_it_tries(
    driver: Any, mode: Mode
) -> None:
    primary, secondary = driver.failing(), driver.answering("Paris.")
    limiter = SpyLimiter()
    model = driver.rate_limited(driver.fallback([primary, secondary]), limiter=limiter)

    reply = await driver.run(model, mode)

    assert reply.text == "Paris."
    assert len(limiter.acquired) == 1
    assert (driver.calls(primary), driver.calls(secondary)) == (1, 1)


def test_find_layer_finds_each_layer_of_a_stack(driver: Any) -> None:
    member = driver.answering()
    chain = driver.fallback([member, driver.answering()])
    model = driver.rate_limited(chain, requests_per_minute=60)

    assert model.find_layer(type(model)) is model
    assert model.find_layer(type(chain)) is chain
    assert model.find_layer(type(member)) is member


# -- refusals and cancellation never reach the inner model -------------------------------


async def test_a_refused_permit_never_reaches_the_inner_model(driver: Any, mode: Mode) -> None:
    inner = driver.answering()
    model = driver.rate_limited(inner, limiter=SpyLimiter(error=RateLimitQueueFullError(4)))

    with pytest.raises(RateLimitQueueFullError):
        await driver.run(model, mode)

    assert driver.calls(inner) == 0


async def test_a_caller_finding_the_queue_full_is_refused_at_once(driver: Any) -> None:
    inner = driver.answering()
    limiter = frozen_bucket(requests_per_minute=1, max_queued_requests=1)
    model = driver.rate_limited(inner, limiter=limiter)
    await driver.run(model, "acall")  # the only permit
    waiting = asyncio.create_task(driver.run(model, "acall"))
    await until_queued(limiter, 1)

    with pytest.raises(RateLimitQueueFullError):
        await driver.run(model, "acall")

    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert driver.calls(inner) == 1


@pytest.mark.parametrize("mode", ["acall", "astream"])
async def test_cancelling_a_call_waiting_for_its_permit_never_reaches_the_inner_model(
    driver: Any, mode: Mode
) -> None:
    inner = driver.answering()
    limiter = frozen_bucket(requests_per_minute=1)
    model = driver.rate_limited(inner, limiter=limiter)
    await driver.run(model, "acall")  # the only permit

    waiting = asyncio.create_task(driver.run(model, mode))
    await until_queued(limiter, 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting

    assert driver.calls(inner) == 1
    assert limiter.queued == 0


def test_a_call_weighing_more_than_the_token_budget_fails_at_once(driver: Any) -> None:
    inner = driver.answering()
    model = driver.rate_limited(inner, requests_per_minute=60, tokens_per_minute=100)

    with pytest.raises(RequestExceedsCapacityError):
        driver.run_sync(model, max_tokens=256)

    assert driver.calls(inner) == 0


# -- token weight and reconciliation -------------------------------------------------------


async def test_with_a_token_budget_a_call_weighs_its_prompt_and_output_cap_and_is_reconciled(
    driver: Any, mode: Mode
) -> None:
    limiter = SpyLimiter(tokens_per_minute=100_000)
    model = driver.rate_limited(driver.answering(), limiter=limiter)

    reply = await driver.run(model, mode, max_tokens=200)

    expected = estimate_request_tokens([(driver.prompt_role, PROMPT)], 200)
    assert limiter.acquired == [(expected, "chat")]
    assert limiter.reconciled == [(expected, sum(driver.reported_usage(reply)))]


@pytest.mark.parametrize("mode", STREAMS)
async def test_a_failed_stream_is_not_reconciled(driver: Any, mode: Mode) -> None:
    limiter = SpyLimiter(tokens_per_minute=100_000)
    error = driver.rate_limit_error()
    model = driver.rate_limited(driver.failing(error, chunks_before_error=2), limiter=limiter)

    with pytest.raises(type(error)):
        await driver.run(model, mode)

    assert len(limiter.acquired) == 1
    assert limiter.reconciled == []


async def test_without_a_token_budget_nothing_is_weighed_or_reconciled(
    driver: Any, mode: Mode
) -> None:
    limiter = SpyLimiter()
    model = driver.rate_limited(driver.answering(), limiter=limiter)

    await driver.run(model, mode, max_tokens=50)

    assert limiter.acquired == [(0, "chat")]
    assert limiter.reconciled == []


# -- options -------------------------------------------------------------------------------


def test_a_shared_limiter_is_used_as_given_and_numbers_build_one_per_layer(driver: Any) -> None:
    shared = TokenBucketRateLimiter(requests_per_minute=60)
    chat = driver.rate_limited(driver.answering(), limiter=shared)
    embeddings = driver.rate_limited_embeddings(driver.embeddings(2), limiter=shared)
    assert driver.limiter_of(chat) is shared
    assert embeddings.limiter is shared

    own_chat = driver.rate_limited(driver.answering(), requests_per_minute=60)
    own_embeddings = driver.rate_limited_embeddings(driver.embeddings(2), requests_per_minute=60)
    assert driver.limiter_of(own_chat) is not own_embeddings.limiter


def test_the_numbers_build_a_token_bucket(driver: Any) -> None:
    model = driver.rate_limited(
        driver.answering(), requests_per_minute=300, max_queued_requests=5, tokens_per_minute=60_000
    )
    limiter = driver.limiter_of(model)

    assert isinstance(limiter, TokenBucketRateLimiter)
    assert (limiter.permits_per_period, limiter.capacity) == (5, 300)
    assert (limiter.max_queued_requests, limiter.token_capacity) == (5, 60_000)


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({}, ValueError, ["requests_per_minute", "limiter"]),
        (
            {"requests_per_minute": 60, "limiter": TokenBucketRateLimiter(60)},
            ValueError,
            ["either", "requests_per_minute", "limiter"],
        ),
        (
            {"limiter": TokenBucketRateLimiter(60), "tokens_per_minute": 100},
            ValueError,
            ["tokens_per_minute"],
        ),
        ({"limiter": "fast"}, TypeError, ["acquire", "aacquire", "str"]),
        ({"limiter": object()}, TypeError, ["acquire", "aacquire", "object"]),
        ({"requests_per_minute": 0}, ValueError, ["requests_per_minute", ">= 1"]),
        ({"requests_per_minute": 60, "max_queued_requests": 0}, ValueError, ["max_queued"]),
    ],
)
@pytest.mark.parametrize("kind", ["chat", "embeddings"])
def test_bad_options_raise_an_error_naming_them(
    driver: Any, kind: str, options: dict[str, Any], error: type[Exception], words: list[str]
) -> None:
    inner = driver.answering() if kind == "chat" else driver.embeddings(2)
    build = driver.rate_limited if kind == "chat" else driver.rate_limited_embeddings
    with pytest.raises(error) as raised:
        build(inner, **options)

    for word in words:
        assert word in str(raised.value)


@pytest.mark.parametrize("kind", ["chat", "embeddings"])
def test_an_inner_of_the_wrong_kind_is_refused_with_a_type_error_naming_the_kind(
    driver: Any, kind: str
) -> None:
    # A chat layer over embeddings, an embeddings layer over a chat model.
    if kind == "chat":
        build, wrong = driver.rate_limited, driver.embeddings(2)
    else:
        build, wrong = driver.rate_limited_embeddings, driver.answering()
    with pytest.raises(TypeError) as raised:
        build(wrong, requests_per_minute=60)

    message = str(raised.value)
    assert message.startswith(f"inner must be a {driver.framework_title} ")
    meant = message.split("got")[0].lower()  # the kind asked for, before the one given
    assert ("embedding" in meant) is (kind == "embeddings")
    assert type(wrong).__name__ in message


# -- embeddings ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["query", "aquery", "batch", "abatch"])
async def test_an_embeddings_call_of_a_few_texts_takes_one_permit(driver: Any, shape: Any) -> None:
    limiter = SpyLimiter()
    embeddings = driver.rate_limited_embeddings(driver.embeddings(8), limiter=limiter)

    vectors = await driver.embed(embeddings, ["a", "b", "c", "d"], shape)

    assert vectors == (1 if "query" in shape else 4)
    assert limiter.acquired == [(0, "embedding")]


def test_with_a_token_budget_an_embeddings_batch_weighs_its_texts(driver: Any) -> None:
    limiter = SpyLimiter(tokens_per_minute=10_000)
    embeddings = driver.rate_limited_embeddings(driver.embeddings(2), limiter=limiter)

    driver.embed_sync(embeddings, ["hello world", "hello"])

    assert limiter.acquired == [(3, "embedding")]
    assert limiter.reconciled == []


@pytest.mark.parametrize("shape", EMBED_SHAPES)
async def test_a_refused_embeddings_permit_never_reaches_the_inner_model(
    driver: Any, shape: Any
) -> None:
    inner = driver.flaky_embeddings()  # no errors: it only counts its requests
    limiter = SpyLimiter(error=RateLimitQueueFullError(1))
    embeddings = driver.rate_limited_embeddings(inner, limiter=limiter)

    with pytest.raises(RateLimitQueueFullError):
        await driver.embed(embeddings, ["a", "b"], shape)

    assert inner.calls == 0


async def test_a_compacted_answer_is_reconciled_with_its_summarising_step(
    driver: Any, mode: Mode
) -> None:
    # Anthropic counts the compaction step against its token limits as it bills it: 55,425
    # in and 136 out, of which the top-level counts say 229 and 5.
    limiter = SpyLimiter(tokens_per_minute=1_000_000)
    with FaultInjectingServer(reply="The contract renews every year.") as server:
        summary = None if mode in driver.compaction_beta_breaks else "A summary."
        server.script(
            Fault.compacted(
                input_tokens=100, output_tokens=131, cache_write_5m=55_096, summary=summary
            )
        )
        inner = driver.compacting_anthropic(server, "claude-sonnet-4-5")
        model = driver.rate_limited(inner, limiter=limiter)
        await driver.run(model, mode, prompt=" ".join(["clause"] * 229), max_tokens=200)

    [(_, actual)] = limiter.reconciled
    # langchain-anthropic's stream chunks keep only the top-level counts.
    assert actual == (234 if mode in driver.compaction_unreported else 55_561)
