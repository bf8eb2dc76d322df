"""RetryingEmbedding and RetryingVectorStore, where LlamaIndex alone differs.

Every store method's retries, refusals, generators, retrievers and Qdrant's own errors are
shared with LangChain: tests/behaviour/test_retry.py. Here: LlamaIndex's single-text
embeddings and its batches, the store attributes LlamaIndex reads, stores of its older
protocol, and the warning about a Qdrant store that retries by itself.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import httpx
import openai
import pytest
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.vector_stores import SimpleVectorStore
from llama_index.core.vector_stores.types import VectorStoreQuery
from llama_index.resilience import RetryingEmbedding, RetryingVectorStore
from pydantic import PrivateAttr

from llm_resilience import RetryPolicy

# Local-mode Qdrant says payload indexes do nothing there; true, and beside the point.
pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect:UserWarning")

_REQUEST = httpx.Request("POST", "https://api.openai.com/v1/embeddings")


def rate_limited(retry_after: str | None = None) -> openai.RateLimitError:
    headers = {"retry-after": retry_after} if retry_after else {}
    response = httpx.Response(429, headers=headers, request=_REQUEST)
    return openai.RateLimitError("Error code: 429", response=response, body=None)


class FlakyEmbedding(MockEmbedding):
    """Constant mock vectors after the given errors, one per provider call."""

    _errors: list[BaseException] = PrivateAttr(default_factory=list)
    _calls: int = PrivateAttr(default=0)

    def fail_with(self, *errors: BaseException) -> FlakyEmbedding:
        self._errors = list(errors)
        return self

    @property
    def calls(self) -> int:
        return self._calls

    def _fail(self) -> None:
        self._calls += 1
        if self._errors:
            raise self._errors.pop(0)

    def _get_query_embedding(self, query: str) -> list[float]:
        self._fail()
        return super()._get_query_embedding(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        self._fail()
        return await super()._aget_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        self._fail()
        return super()._get_text_embedding(text)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        self._fail()
        return await super()._aget_text_embedding(text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        self._fail()
        return [super(FlakyEmbedding, self)._get_text_embedding(text) for text in texts]

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        self._fail()
        return [super(FlakyEmbedding, self)._get_text_embedding(text) for text in texts]


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


# Queries and batches, refusals and the last attempt's error, for both adapters:
# tests/behaviour/test_retry.py.


@pytest.mark.parametrize(
    ("method", "argument"),
    [("get_text_embedding", "a"), ("aget_text_embedding", "a")],
)
async def test_every_single_text_embedding_retries_a_rate_limit_after_its_retry_after(
    method: str, argument: Any, policy: RetryPolicy, slept: list[float]
) -> None:
    inner = FlakyEmbedding(embed_dim=4).fail_with(
        rate_limited(retry_after="0.5"), httpx.ConnectError("refused")
    )
    embedding = RetryingEmbedding(inner=inner, policy=policy)

    result = await run(getattr(embedding, method)(argument))

    assert result == [0.5] * 4
    assert inner.calls == 3
    assert slept == [0.5, 2.0]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_failed_batch_is_retried_alone_in_the_inner_models_batch_size(
    asynchronous: bool, policy: RetryPolicy
) -> None:
    inner = FlakyEmbedding(embed_dim=4, embed_batch_size=2, num_workers=3)
    inner.fail_with(httpx.ConnectError("reset"))
    embedding = RetryingEmbedding(inner=inner, policy=policy)
    texts = ["a", "b", "c", "d", "e"]

    if asynchronous:
        vectors = await embedding.aget_text_embedding_batch(texts)
    else:
        vectors = embedding.get_text_embedding_batch(texts)

    assert (embedding.embed_batch_size, embedding.num_workers) == (2, 3)
    assert vectors == [[0.5] * 4] * 5
    assert inner.calls == 3 + 1  # three batches, the failed one once more


def test_the_embedding_wrapper_answers_find_layer_and_refuses_bad_input() -> None:
    inner = MockEmbedding(embed_dim=4)
    embedding = RetryingEmbedding(inner=inner)

    assert embedding.inner is inner
    assert embedding.find_layer(MockEmbedding) is inner
    assert embedding.find_layer(RetryingEmbedding) is embedding
    with pytest.raises(TypeError, match=r"policy must be an llm_resilience\.RetryPolicy"):
        RetryingEmbedding(inner=inner, policy="fast")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="inner must be a LlamaIndex"):
        RetryingVectorStore(inner=inner)


# -- vector stores --------------------------------------------------------------------------


def test_the_wrapper_copies_stores_text_and_is_embedding_query_and_answers_find_layer() -> None:
    inner = SimpleVectorStore()
    inner.is_embedding_query = False
    store = RetryingVectorStore(inner=inner)

    assert (store.stores_text, store.is_embedding_query) == (False, False)
    assert store.inner is inner
    assert store.client is inner.client
    assert store.find_layer(SimpleVectorStore) is inner


def test_a_method_the_inner_store_lacks_stays_missing_and_is_not_retried(
    policy: RetryPolicy, slept: list[float]
) -> None:
    class MinimalStore:
        """A store of LlamaIndex's older protocol: add, delete and query only."""

        stores_text = True
        is_embedding_query = True
        client = None

        def add(self, nodes: list[Any], **kwargs: Any) -> list[str]:
            return [node.node_id for node in nodes]

        def delete(self, ref_doc_id: str, **kwargs: Any) -> None:
            return None

        def query(self, query: VectorStoreQuery, **kwargs: Any) -> Any:
            return None

    store = RetryingVectorStore(inner=MinimalStore(), policy=policy)

    assert store.stores_text is True
    with pytest.raises(AttributeError, match="get_nodes"):
        store.get_nodes(node_ids=["1"])
    assert slept == []


# -- a real engine: Qdrant in local mode through llama-index-vector-stores-qdrant --------


@pytest.fixture
def qdrant_client() -> Any:
    qdrant = pytest.importorskip("qdrant_client")
    return qdrant.QdrantClient(":memory:")


def test_a_qdrant_store_that_retries_its_writes_by_itself_is_warned_about(
    qdrant_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from llama_index.vector_stores.qdrant import QdrantVectorStore

    caplog.set_level(logging.WARNING, logger="llm_resilience.retry")
    inner = QdrantVectorStore(client=qdrant_client, collection_name="retry")  # max_retries=3

    RetryingVectorStore(inner=inner)

    (record,) = caplog.records
    assert "QdrantVectorStore" in record.getMessage()
    assert "4 x (1 + 3) = 16 times" in record.getMessage()
