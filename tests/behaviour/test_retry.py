"""The retrying embeddings and vector store layers in both adapters, with faults raised
by the edge below: the embeddings model, the store's own method, or the Qdrant client
under each framework's Qdrant store (local mode, no server).

Each framework's every store method, and what only one framework's stores have, stay in
its own tree: the two frameworks' stores share no method.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import httpx
import openai
import pytest
from cost_driver import EMBED_SHAPES
from store_driver import (
    GENERATED,
    SEEDED,
    Faults,
    LangChainStores,
    LlamaIndexStores,
    qdrant_error,
    run,
)

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


# -- vector stores -------------------------------------------------------------------------

SYNC_AND_ASYNC = pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
PERMANENT = pytest.mark.parametrize(
    "error",
    [
        pytest.param(unauthorised(), id="401"),
        pytest.param(BudgetExceededError("month", Decimal(9), Decimal(9)), id="budget"),
        pytest.param(asyncio.CancelledError(), id="cancelled"),
    ],
)

# Each framework's own store methods: the driver fixture is parametrized here with them.
STORE_CALLS = [
    pytest.param(name, call, id=f"{name}-{call[0]}")
    for name, stores in (("langchain", LangChainStores), ("llamaindex", LlamaIndexStores))
    for call in stores.store_calls()
]


@pytest.mark.parametrize(("driver", "call"), STORE_CALLS, indirect=["driver"])
async def test_every_vector_store_method_retries_a_transport_failure_and_returns_the_inner_result(
    driver: Any,
    call: tuple[str, tuple[Any, ...], dict[str, Any]],
    policy: RetryPolicy,
    slept: list[float],
) -> None:
    method, args, kwargs = call
    bare = driver.seeded_store()
    expected = await run(getattr(bare, method)(*args, **kwargs))
    inner = driver.seeded_store()
    faults = Faults(inner, method, httpx.ConnectError("refused"))

    result = await run(
        getattr(driver.retrying_store(inner, policy=policy), method)(*args, **kwargs)
    )

    assert repr(result) == repr(expected)
    assert driver.state(inner) == driver.state(bare)  # the store changed exactly as the bare one
    assert (faults.calls, slept) == (2, [1.0])


@SYNC_AND_ASYNC
async def test_a_store_that_keeps_failing_raises_the_last_attempts_own_error(
    driver: Any, asynchronous: bool, policy: RetryPolicy
) -> None:
    inner = driver.seeded_store()
    errors = [httpx.ConnectError(f"refused {n}") for n in range(4)]
    faults = Faults(inner, driver.search_method(asynchronous), *errors)

    with pytest.raises(httpx.ConnectError) as caught:
        await driver.search(driver.retrying_store(inner, policy=policy), asynchronous)

    assert caught.value is errors[-1]
    assert faults.calls == 4


@SYNC_AND_ASYNC
@PERMANENT
async def test_a_store_raises_permanent_errors_refusals_and_cancellation_at_once(
    driver: Any, error: BaseException, asynchronous: bool, policy: RetryPolicy, slept: list[float]
) -> None:
    inner = driver.empty_store()
    faults = Faults(inner, driver.add_method(asynchronous), error)

    with pytest.raises(type(error)):
        await driver.add_generated(driver.retrying_store(inner, policy=policy), asynchronous, [])

    assert (faults.calls, slept) == (1, [])


@SYNC_AND_ASYNC
async def test_a_generator_of_texts_is_read_once_and_the_retry_adds_all_of_it(
    driver: Any, asynchronous: bool, policy: RetryPolicy
) -> None:
    inner = driver.empty_store()
    faults = Faults(inner, driver.add_method(asynchronous), httpx.ConnectError("dropped halfway"))
    faults.consume = True  # the failed attempt read its input, as a real store would
    produced: list[str] = []

    store = driver.retrying_store(inner, policy=policy)
    ids = await driver.add_generated(store, asynchronous, produced)

    assert list(ids) == [node_id for node_id, _ in GENERATED]
    assert produced == [text for _, text in GENERATED]
    assert driver.stored(inner) == sorted(GENERATED)
    assert faults.calls == 2


@SYNC_AND_ASYNC
async def test_a_retriever_built_over_the_wrapper_retries_its_searches(
    driver: Any, asynchronous: bool, policy: RetryPolicy, slept: list[float]
) -> None:
    inner = driver.empty_store()
    faults = Faults(inner, driver.search_method(asynchronous), rate_limited(), rate_limited())

    found = await driver.retrieve(driver.retrying_store(inner, policy=policy), asynchronous)

    assert found == [SEEDED[0]]
    assert (faults.calls, slept) == (3, [1.0, 2.0])


def test_a_method_the_inner_store_does_not_implement_is_raised_once_without_retrying(
    driver: Any, policy: RetryPolicy, slept: list[float]
) -> None:
    inner, name, call = driver.unimplemented()
    faults = Faults(inner, name)

    with pytest.raises(NotImplementedError):
        call(driver.retrying_store(inner, policy=policy))

    assert (faults.calls, slept) == (1, [])


@pytest.fixture
def qdrant(driver: Any) -> tuple[Any, Any]:
    """The framework's Qdrant store in local mode, seeded, and the client under it."""
    pytest.importorskip("qdrant_client")
    store: tuple[Any, Any] = driver.qdrant_store()
    return store


# Local-mode Qdrant says payload indexes do nothing there; true, and beside the point.
QDRANT_WARNING = pytest.mark.filterwarnings("ignore:Payload indexes have no effect:UserWarning")


@QDRANT_WARNING
def test_qdrant_searches_retry_the_clients_503_after_its_retry_after(
    driver: Any, qdrant: tuple[Any, Any], policy: RetryPolicy, slept: list[float]
) -> None:
    inner, client = qdrant
    faults = Faults(client, "query_points", qdrant_error(503, retry_after="3"))
    store = driver.retrying_store(inner, policy=policy)

    assert driver.qdrant_search(store) == ["beta"]
    assert (faults.calls, slept) == (2, [3.0])


@QDRANT_WARNING
def test_qdrant_retries_a_dropped_connection_and_does_the_work_once(
    driver: Any, qdrant: tuple[Any, Any], policy: RetryPolicy, slept: list[float]
) -> None:
    inner, client = qdrant
    name, action, expected = driver.qdrant_dropped(
        driver.retrying_store(inner, policy=policy), client
    )
    faults = Faults(client, name, httpx.ReadError("connection reset"))

    assert action() == expected
    assert (faults.calls, slept) == (2, [1.0])


@QDRANT_WARNING
def test_qdrant_forbidden_is_raised_at_once(
    driver: Any, qdrant: tuple[Any, Any], policy: RetryPolicy, slept: list[float]
) -> None:
    from qdrant_client.http.exceptions import UnexpectedResponse

    inner, client = qdrant
    faults = Faults(client, "query_points", qdrant_error(403))

    with pytest.raises(UnexpectedResponse, match="403"):
        driver.qdrant_search(driver.retrying_store(inner, policy=policy))

    assert (faults.calls, slept) == (1, [])


@QDRANT_WARNING
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_keyword_only_the_qdrant_store_takes_reaches_it_through_the_wrapper(
    driver: Any, asynchronous: bool, policy: RetryPolicy
) -> None:
    pytest.importorskip("qdrant_client")
    inner = await driver.qdrant_for(asynchronous)
    expected = await driver.qdrant_narrowed(inner, asynchronous)
    assert len(expected) == 1  # the keyword narrowed what the store read

    store = driver.retrying_store(inner, policy=policy)

    assert await driver.qdrant_narrowed(store, asynchronous) == expected


@QDRANT_WARNING
def test_the_inner_stores_own_attributes_read_through_the_wrapper(
    driver: Any, qdrant: tuple[Any, Any], policy: RetryPolicy
) -> None:
    inner, client = qdrant
    store = driver.retrying_store(inner, policy=policy)

    assert store.collection_name == "retry"
    assert store.client is client
    assert store.sparse_vector_name == inner.sparse_vector_name
    # The wrapper's own attributes answer for themselves.
    assert (store.inner, store.policy) == (inner, policy)


@QDRANT_WARNING
def test_an_attribute_the_inner_store_lacks_names_both_and_private_names_stay_the_wrappers(
    driver: Any, qdrant: tuple[Any, Any], policy: RetryPolicy
) -> None:
    inner, _ = qdrant
    store = driver.retrying_store(inner, policy=policy)

    with pytest.raises(AttributeError) as raised:
        store.no_such_setting  # noqa: B018
    assert str(raised.value) == (
        "'RetryingVectorStore' object has no attribute 'no_such_setting', nor has its "
        "inner store (QdrantVectorStore)"
    )
    assert (raised.value.name, raised.value.obj) == ("no_such_setting", store)
    assert inner._client is not None  # both frameworks' Qdrant stores keep one
    with pytest.raises(AttributeError, match="'RetryingVectorStore' object has no attribute"):
        store._client  # noqa: B018


@QDRANT_WARNING
def test_a_method_of_the_inner_store_the_wrapper_does_not_retry_is_not_handed_out(
    driver: Any, qdrant: tuple[Any, Any], policy: RetryPolicy
) -> None:
    inner, _ = qdrant
    name = driver.qdrant_unwrapped_method
    assert callable(getattr(inner, name))
    store = driver.retrying_store(inner, policy=policy)

    with pytest.raises(
        AttributeError, match=rf"would not be retried; \.inner\.{name}\(\.\.\.\) calls it"
    ):
        getattr(store, name)


@QDRANT_WARNING
def test_a_write_of_an_attribute_read_through_is_refused_and_the_inner_store_keeps_it(
    driver: Any, qdrant: tuple[Any, Any], policy: RetryPolicy
) -> None:
    inner, _ = qdrant
    store = driver.retrying_store(inner, policy=policy)

    with pytest.raises(AttributeError, match=r"set collection_name on \.inner"):
        store.collection_name = "other"

    assert (inner.collection_name, store.collection_name) == ("retry", "retry")
    # The wrapper's own attributes are its own to write, and stay on it.
    replacement = RetryPolicy(attempts=1)
    store.policy = replacement
    assert store.policy is replacement
    assert not hasattr(inner, "policy")
