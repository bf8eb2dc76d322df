"""RetryingEmbeddings and RetryingVectorStore over real stores, with faults injected below.

Faults are raised by the edge we do not own: the embeddings model, the store's own
method, or the Qdrant client under ``langchain-qdrant`` (local mode, no server), with the
exceptions those libraries really raise.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import openai
import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_openai import OpenAIEmbeddings
from langchain_tests.integration_tests import VectorStoreIntegrationTests

from langchain_llm_resilience import (
    RateLimitedEmbeddings,
    RetryingEmbeddings,
    RetryingVectorStore,
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


class Faults:
    """Replaces ``owner.name`` with a version that raises ``errors`` in turn, then works.

    With ``consume`` the first positional argument is read before raising, as a store
    that failed halfway through its input would have read it.
    """

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, *errors: BaseException
    ) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.consume = False
        original = getattr(owner, name)

        def fail(args: tuple[Any, ...]) -> None:
            self.calls += 1
            if self.consume and args:
                list(args[0])
            if self.errors:
                raise self.errors.pop(0)

        if inspect.iscoroutinefunction(original):

            @functools.wraps(original)
            async def patched_async(*args: Any, **kwargs: Any) -> Any:
                fail(args)
                return await original(*args, **kwargs)

            monkeypatch.setattr(owner, name, patched_async)
        else:

            @functools.wraps(original)
            def patched(*args: Any, **kwargs: Any) -> Any:
                fail(args)
                return original(*args, **kwargs)

            monkeypatch.setattr(owner, name, patched)


@pytest.fixture
def slept() -> list[float]:
    return []


@pytest.fixture
def policy(slept: list[float]) -> RetryPolicy:
    async def asleep(seconds: float) -> None:
        slept.append(seconds)

    return RetryPolicy(jitter=0, sleep=slept.append, asleep=asleep)


async def run(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


# -- embeddings ----------------------------------------------------------------------------

# Every call shape's retries, refusals and the last attempt's error, for both adapters:
# tests/behaviour/test_retry.py.


def test_a_real_openai_embeddings_model_that_retries_by_itself_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_resilience.retry")
    inner = OpenAIEmbeddings(api_key="sk-test-not-a-key", max_retries=2)  # type: ignore[arg-type]

    RetryingEmbeddings(inner=inner)
    RetryingEmbeddings(inner=inner)

    (record,) = caplog.records
    message = record.getMessage()
    assert "OpenAIEmbeddings" in message
    assert "max_retries=2" in message
    assert "4 x (1 + 2) = 12 times" in message
    assert "sk-test" not in message


def test_self_retrying_embeddings_under_another_layer_are_still_noticed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_resilience.retry")
    inner = OpenAIEmbeddings(api_key="sk-test-not-a-key", max_retries=2)  # type: ignore[arg-type]

    RetryingEmbeddings(inner=RateLimitedEmbeddings(inner=inner, requests_per_minute=600))

    (record,) = caplog.records
    assert "OpenAIEmbeddings (under the wrapped RateLimitedEmbeddings)" in record.getMessage()


def test_a_store_over_self_retrying_embeddings_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_resilience.retry")
    embedding = OpenAIEmbeddings(api_key="sk-test-not-a-key", max_retries=3)  # type: ignore[arg-type]

    RetryingVectorStore(inner=InMemoryVectorStore(embedding), policy=RetryPolicy(attempts=2))

    (record,) = caplog.records
    assert "2 x (1 + 3) = 8 times" in record.getMessage()


def test_embeddings_with_no_retries_of_their_own_are_not_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_resilience.retry")
    RetryingEmbeddings(inner=OpenAIEmbeddings(api_key="sk-test-not-a-key", max_retries=0))  # type: ignore[arg-type]
    assert caplog.records == []


def test_wrong_inner_or_policy_types_are_refused_naming_the_option() -> None:
    with pytest.raises(TypeError, match="inner must be a LangChain Embeddings"):
        RetryingEmbeddings(inner="model")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="inner must be a LangChain VectorStore"):
        RetryingVectorStore(inner=DeterministicFakeEmbedding(size=8))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"policy must be an llm_resilience\.RetryPolicy"):
        RetryingEmbeddings(inner=DeterministicFakeEmbedding(size=8), policy=3)  # type: ignore[arg-type]


# -- vector stores: every method over InMemoryVectorStore ---------------------------------


class ScoredMemoryStore(InMemoryVectorStore):
    """The in-memory store, able to answer relevance-score searches (cosine is one)."""

    def _select_relevance_score_fn(self) -> Any:
        return lambda score: score


def memory_store() -> InMemoryVectorStore:
    store = ScoredMemoryStore(DeterministicFakeEmbedding(size=8))
    store.add_texts(["alpha", "beta", "gamma"], ids=["1", "2", "3"])
    return store


_QUERY_VECTOR = DeterministicFakeEmbedding(size=8).embed_query("alpha")
_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("add_texts", (["delta"],), {"ids": ["4"]}),
    ("aadd_texts", (["delta"],), {"ids": ["4"]}),
    ("add_documents", ([Document("delta", id="4")],), {}),
    ("aadd_documents", ([Document("delta", id="4")],), {}),
    ("delete", (["1"],), {}),
    ("adelete", (["1"],), {}),
    ("get_by_ids", (["1", "2"],), {}),
    ("aget_by_ids", (["1", "2"],), {}),
    ("search", ("alpha", "similarity"), {"k": 2}),
    ("asearch", ("alpha", "mmr"), {"k": 2}),
    ("similarity_search", ("alpha",), {"k": 2}),
    ("asimilarity_search", ("alpha",), {"k": 2}),
    ("similarity_search_with_score", ("alpha",), {"k": 2}),
    ("asimilarity_search_with_score", ("alpha",), {"k": 2}),
    ("similarity_search_with_relevance_scores", ("alpha",), {"k": 2}),
    ("asimilarity_search_with_relevance_scores", ("alpha",), {"k": 2}),
    ("similarity_search_by_vector", (_QUERY_VECTOR,), {"k": 2}),
    ("asimilarity_search_by_vector", (_QUERY_VECTOR,), {"k": 2}),
    ("max_marginal_relevance_search", ("alpha",), {"k": 2, "fetch_k": 3}),
    ("amax_marginal_relevance_search", ("alpha",), {"k": 2, "fetch_k": 3}),
    ("max_marginal_relevance_search_by_vector", (_QUERY_VECTOR,), {"k": 2, "fetch_k": 3}),
    ("amax_marginal_relevance_search_by_vector", (_QUERY_VECTOR,), {"k": 2, "fetch_k": 3}),
]


@pytest.mark.parametrize(("method", "args", "kwargs"), _CALLS, ids=[c[0] for c in _CALLS])
async def test_every_vector_store_method_retries_a_transport_failure_and_returns_the_inner_result(
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    policy: RetryPolicy,
    slept: list[float],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    expected = await run(getattr(memory_store(), method)(*args, **kwargs))
    inner = memory_store()
    faults = Faults(monkeypatch, inner, method, httpx.ConnectError("refused"))
    store = RetryingVectorStore(inner=inner, policy=policy)

    result = await run(getattr(store, method)(*args, **kwargs))

    if method.lstrip("a").startswith("dd_"):
        assert result == expected  # same ids
    else:
        assert repr(result) == repr(expected)
    assert (faults.calls, slept) == (2, [1.0])


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_store_that_keeps_failing_raises_the_last_attempts_own_error(
    asynchronous: bool, policy: RetryPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    inner = memory_store()
    errors = [httpx.ConnectError(f"refused {n}") for n in range(4)]
    name = "asimilarity_search" if asynchronous else "similarity_search"
    faults = Faults(monkeypatch, inner, name, *errors)
    store = RetryingVectorStore(inner=inner, policy=policy)

    with pytest.raises(httpx.ConnectError) as caught:
        await run(getattr(store, name)("alpha"))

    assert caught.value is errors[-1]
    assert faults.calls == 4


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    "error",
    [
        pytest.param(unauthorised(), id="401"),
        pytest.param(BudgetExceededError("month", Decimal(9), Decimal(9)), id="budget"),
        pytest.param(asyncio.CancelledError(), id="cancelled"),
    ],
)
async def test_a_store_raises_permanent_errors_refusals_and_cancellation_at_once(
    error: BaseException,
    asynchronous: bool,
    policy: RetryPolicy,
    slept: list[float],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inner = memory_store()
    name = "aadd_texts" if asynchronous else "add_texts"
    faults = Faults(monkeypatch, inner, name, error)
    store = RetryingVectorStore(inner=inner, policy=policy)

    with pytest.raises(type(error)):
        await run(getattr(store, name)(["delta"]))

    assert (faults.calls, slept) == (1, [])


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_generator_of_texts_is_read_once_and_the_retry_adds_all_of_it(
    asynchronous: bool, policy: RetryPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    inner = InMemoryVectorStore(DeterministicFakeEmbedding(size=8))
    name = "aadd_texts" if asynchronous else "add_texts"
    faults = Faults(monkeypatch, inner, name, httpx.ConnectError("dropped halfway"))
    faults.consume = True  # the failed attempt read its input, as a real store would
    produced: list[str] = []

    def texts() -> Iterator[str]:
        for text in ("one", "two", "three"):
            produced.append(text)
            yield text

    store = RetryingVectorStore(inner=inner, policy=policy)
    ids = await run(getattr(store, name)(texts(), ids=["1", "2", "3"]))

    assert ids == ["1", "2", "3"]
    assert produced == ["one", "two", "three"]
    assert [doc.page_content for doc in inner.get_by_ids(["1", "2", "3"])] == [
        "one",
        "two",
        "three",
    ]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_retriever_built_from_the_wrapper_retries_its_searches(
    asynchronous: bool, policy: RetryPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    inner = memory_store()
    name = "asimilarity_search" if asynchronous else "similarity_search"
    faults = Faults(monkeypatch, inner, name, rate_limited(), rate_limited())
    retriever = RetryingVectorStore(inner=inner, policy=policy).as_retriever(search_kwargs={"k": 1})

    if asynchronous:
        documents = await retriever.ainvoke("alpha")
    else:
        documents = retriever.invoke("alpha")

    assert [doc.page_content for doc in documents] == ["alpha"]
    assert faults.calls == 3


def test_the_wrapper_passes_embeddings_through_and_answers_find_layer() -> None:
    inner = memory_store()
    store = RetryingVectorStore(inner=inner)

    assert store.inner is inner
    assert store.embeddings is inner.embeddings
    assert store.find_layer(InMemoryVectorStore) is inner
    assert store.find_layer(RetryingVectorStore) is store
    assert store.find_layer(RetryingEmbeddings) is None
    embeddings = RetryingEmbeddings(inner=DeterministicFakeEmbedding(size=8))
    assert embeddings.find_layer(DeterministicFakeEmbedding) is embeddings.inner


def test_from_texts_refuses_and_says_to_wrap_a_built_store() -> None:
    with pytest.raises(NotImplementedError, match=r"RetryingVectorStore\(inner="):
        RetryingVectorStore.from_texts(["a"], DeterministicFakeEmbedding(size=8))


def test_a_method_the_inner_store_does_not_implement_fails_once_without_retrying(
    policy: RetryPolicy, slept: list[float]
) -> None:
    class SearchOnly(InMemoryVectorStore):
        def get_by_ids(self, ids: Any, /) -> list[Document]:
            raise NotImplementedError("SearchOnly does not get by id")

    store = RetryingVectorStore(inner=SearchOnly(DeterministicFakeEmbedding(size=8)), policy=policy)
    with pytest.raises(NotImplementedError):
        store.get_by_ids(["1"])
    assert slept == []


# -- a real engine: Qdrant in local mode through langchain-qdrant -------------------------


@pytest.fixture
def qdrant_store() -> Any:
    langchain_qdrant = pytest.importorskip("langchain_qdrant")
    return langchain_qdrant.QdrantVectorStore.from_texts(
        ["alpha", "beta", "gamma"],
        DeterministicFakeEmbedding(size=8),
        location=":memory:",
        collection_name="retry",
        ids=[
            "00000000-0000-0000-0000-000000000001",
            "00000000-0000-0000-0000-000000000002",
            "00000000-0000-0000-0000-000000000003",
        ],
    )


def qdrant_error(status: int, retry_after: str | None = None) -> Exception:
    from qdrant_client.http.exceptions import UnexpectedResponse

    headers = httpx.Headers({"retry-after": retry_after} if retry_after else {})
    return UnexpectedResponse(status, "error", b"", headers)


def test_qdrant_searches_retry_the_clients_503_after_its_retry_after(
    qdrant_store: Any, policy: RetryPolicy, slept: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = Faults(
        monkeypatch, qdrant_store.client, "query_points", qdrant_error(503, retry_after="3")
    )
    store = RetryingVectorStore(inner=qdrant_store, policy=policy)

    documents = store.as_retriever(search_kwargs={"k": 1}).invoke("beta")

    assert [doc.page_content for doc in documents] == ["beta"]
    assert (faults.calls, slept) == (2, [3.0])


def test_qdrant_writes_retry_a_dropped_connection_and_store_each_text_once(
    qdrant_store: Any, policy: RetryPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = Faults(monkeypatch, qdrant_store.client, "upsert", httpx.ConnectError("reset"))
    store = RetryingVectorStore(inner=qdrant_store, policy=policy)

    store.add_texts(
        (text for text in ["delta", "epsilon"]),
        ids=[
            "00000000-0000-0000-0000-000000000004",
            "00000000-0000-0000-0000-000000000005",
        ],
    )

    assert faults.calls == 2
    assert qdrant_store.client.count("retry").count == 5


def test_qdrant_forbidden_is_raised_at_once(
    qdrant_store: Any, policy: RetryPolicy, slept: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = Faults(monkeypatch, qdrant_store.client, "query_points", qdrant_error(403))
    store = RetryingVectorStore(inner=qdrant_store, policy=policy)

    from qdrant_client.http.exceptions import UnexpectedResponse

    with pytest.raises(UnexpectedResponse, match="403") as caught:
        store.similarity_search("alpha")

    assert type(caught.value).__name__ == "UnexpectedResponse"
    assert (faults.calls, slept) == (1, [])


# -- LangChain's own vector store suite, run over the wrapper ------------------------------


class TestRetryingVectorStoreStandard(VectorStoreIntegrationTests):
    """The wrapper over a real in-memory store passes LangChain's vector store contract."""

    @pytest.fixture
    def vectorstore(self) -> RetryingVectorStore:  # type: ignore[override]
        return RetryingVectorStore(inner=InMemoryVectorStore(embedding=self.get_embeddings()))


def test_retrying_wrappers_name_what_they_wrap_under_the_core_layer_contract() -> None:
    from llm_resilience.layers import leaves

    embeddings = DeterministicFakeEmbedding(size=4)
    store = InMemoryVectorStore(embeddings)
    assert RetryingEmbeddings(inner=embeddings).layers_below() == (embeddings,)
    assert RetryingVectorStore(inner=store).layers_below() == (store,)
    assert leaves(RetryingVectorStore(inner=store)) == [store]
