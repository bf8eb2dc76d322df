"""The retrying embeddings layer in both adapters, with faults raised by the model below.

The vector stores' retries stay in each adapter's tree: the two frameworks' stores share
no method.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import httpx
import openai
import pytest
from cost_driver import EMBED_SHAPES

from llm_resilience import BudgetExceededError, RetryPolicy

_REQUEST = httpx.Request("POST", "https://api.openai.com/v1/embeddings")


def rate_limited(retry_after: str | None = None) -> openai.RateLimitError:
    headers = {"retry-after": retry_after} if retry_after else {}
    response = httpx.Response(429, headers=headers, request=_REQUEST)
    return openai.RateLimitError("Error code: 429", response=response, body=None)


def unauthorised() -> openai.AuthenticationError:
    response = httpx.Response(401, request=_REQUEST)
    return openai.AuthenticationError("Error code: 401", response=response, body=None)


@pytest.fixture
def slept() -> list[float]:
    return []


@pytest.fixture
def policy(slept: list[float]) -> RetryPolicy:
    async def asleep(seconds: float) -> None:
        slept.append(seconds)

    return RetryPolicy(jitter=0, sleep=slept.append, asleep=asleep)


@pytest.mark.parametrize("shape", EMBED_SHAPES)
async def test_every_embeddings_call_retries_a_rate_limit_after_its_retry_after(
    driver: Any, shape: Any, policy: RetryPolicy, slept: list[float]
) -> None:
    inner = driver.flaky_embeddings(rate_limited(retry_after="0.5"), httpx.ConnectError("refused"))
    embeddings = driver.retrying_embeddings(inner, policy=policy)

    assert await driver.embed(embeddings, ["a", "b"], shape) == (1 if "query" in shape else 2)

    assert inner.calls == 3
    assert slept == [0.5, 2.0]  # Retry-After, then the backoff for the second retry


@pytest.mark.parametrize("shape", ["query", "aquery"])
@pytest.mark.parametrize(
    "error",
    [
        pytest.param(unauthorised(), id="401"),
        pytest.param(BudgetExceededError("day", Decimal(1), Decimal(1)), id="budget"),
        pytest.param(asyncio.CancelledError(), id="cancelled"),
    ],
)
async def test_embeddings_raise_a_permanent_error_a_refusal_or_a_cancellation_at_once(
    driver: Any, error: BaseException, shape: Any, policy: RetryPolicy, slept: list[float]
) -> None:
    inner = driver.flaky_embeddings(error)
    embeddings = driver.retrying_embeddings(inner, policy=policy)

    with pytest.raises(type(error)) as caught:
        await driver.embed(embeddings, ["a"], shape)

    assert caught.value is error
    assert (inner.calls, slept) == (1, [])


def test_embeddings_that_keep_failing_raise_the_last_attempts_own_error(
    driver: Any, policy: RetryPolicy
) -> None:
    errors = [rate_limited() for _ in range(4)]
    embeddings = driver.retrying_embeddings(driver.flaky_embeddings(*errors), policy=policy)

    with pytest.raises(openai.RateLimitError) as caught:
        driver.embed_sync(embeddings, ["a"])

    assert caught.value is errors[-1]


def test_the_embeddings_wrapper_answers_find_layer_and_refuses_a_bad_policy(driver: Any) -> None:
    inner = driver.embeddings(4)
    embeddings = driver.retrying_embeddings(inner)

    assert embeddings.inner is inner
    assert embeddings.find_layer(type(inner)) is inner
    assert embeddings.find_layer(type(embeddings)) is embeddings
    with pytest.raises(TypeError, match=r"policy must be an llm_resilience\.RetryPolicy"):
        driver.retrying_embeddings(inner, policy="fast")
