"""RetryingEmbedding and RetryingVectorStore over real stores, with faults injected below.

Faults are raised by the edge we do not own: the embedding model, the store's own
method, or the Qdrant client under ``llama-index-vector-stores-qdrant`` (local mode, no
server), with the exceptions those libraries really raise.
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
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.schema import TextNode
from llama_index.core.vector_stores import SimpleVectorStore
from llama_index.core.vector_stores.types import VectorStoreQuery
from llama_index.resilience import RetryingEmbedding, RetryingVectorStore
from pydantic import PrivateAttr

from llm_resilience import BudgetExceededError, RetryPolicy

# Local-mode Qdrant says payload indexes do nothing there; true, and beside the point.
pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect:UserWarning")

_REQUEST = httpx.Request("POST", "https://api.openai.com/v1/embeddings")


def rate_limited(retry_after: str | None = None) -> openai.RateLimitError:
    headers = {"retry-after": retry_after} if retry_after else {}
    response = httpx.Response(429, headers=headers, request=_REQUEST)
    return openai.RateLimitError("Error code: 429", response=response, body=None)


def unauthorised() -> openai.AuthenticationError:
    response = httpx.Response(401, request=_REQUEST)
    return openai.AuthenticationError("Error code: 401", response=response, body=None)


class Faults:
    """Replaces ``owner.name`` (on the instance) with a version that raises ``errors`` in
    turn, then works. With ``consume`` the first positional argument is read first."""

    def __init__(self, owner: Any, name: str, *errors: BaseException) -> None:
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

            replacement: Any = patched_async
        else:

            @functools.wraps(original)
            def patched(*args: Any, **kwargs: Any) -> Any:
                fail(args)
                return original(*args, **kwargs)

            replacement = patched
        # Pydantic models refuse unknown attributes through setattr; the instance's own
        # dictionary still shadows the class's method.
        object.__setattr__(owner, name, replacement)


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


# -- vector stores: every method over SimpleVectorStore ----------------------------------


def simple_store() -> SimpleVectorStore:
    store = SimpleVectorStore()
    store.add(
        [
            TextNode(id_="1", text="alpha", embedding=[1.0, 0.0], relationships={}),
            TextNode(id_="2", text="beta", embedding=[0.0, 1.0]),
        ]
    )
    return store


_QUERY = VectorStoreQuery(query_embedding=[1.0, 0.1], similarity_top_k=1)
_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("add", ([TextNode(id_="3", text="gamma", embedding=[0.5, 0.5])],), {}),
    ("async_add", ([TextNode(id_="3", text="gamma", embedding=[0.5, 0.5])],), {}),
    ("delete", ("1",), {}),
    ("adelete", ("1",), {}),
    ("query", (_QUERY,), {}),
    ("aquery", (_QUERY,), {}),
    ("delete_nodes", (), {"node_ids": ["1"]}),
    ("adelete_nodes", (), {"node_ids": ["1"]}),
    ("clear", (), {}),
    ("aclear", (), {}),
]


@pytest.mark.parametrize(("method", "args", "kwargs"), _CALLS, ids=[c[0] for c in _CALLS])
async def test_every_vector_store_method_retries_a_transport_failure(
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    policy: RetryPolicy,
    slept: list[float],
) -> None:
    expected_store = simple_store()
    expected = await run(getattr(expected_store, method)(*args, **kwargs))
    inner = simple_store()
    faults = Faults(inner, method, httpx.ConnectError("refused"))
    store = RetryingVectorStore(inner=inner, policy=policy)

    result = await run(getattr(store, method)(*args, **kwargs))

    assert result == expected
    assert inner.data == expected_store.data  # the store changed exactly as the bare one
    assert (faults.calls, slept) == (2, [1.0])


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_an_index_built_over_the_wrappers_retries_its_retrievals(
    asynchronous: bool, policy: RetryPolicy
) -> None:
    from llama_index.core import Document, StorageContext, VectorStoreIndex

    inner = SimpleVectorStore()
    store = RetryingVectorStore(inner=inner, policy=policy)
    embedding = RetryingEmbedding(inner=FlakyEmbedding(embed_dim=4), policy=policy)
    index = VectorStoreIndex.from_documents(
        [Document(text="alpha")],
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=embedding,
    )
    faults = Faults(inner, "aquery" if asynchronous else "query", httpx.ConnectError("reset"))
    retriever = index.as_retriever(similarity_top_k=1)

    found = await retriever.aretrieve("alpha") if asynchronous else retriever.retrieve("alpha")

    assert [hit.node.get_content() for hit in found] == ["alpha"]
    assert faults.calls == 2


def test_the_wrapper_copies_stores_text_and_is_embedding_query_and_answers_find_layer() -> None:
    inner = SimpleVectorStore()
    inner.is_embedding_query = False
    store = RetryingVectorStore(inner=inner)

    assert (store.stores_text, store.is_embedding_query) == (False, False)
    assert store.inner is inner
    assert store.client is inner.client
    assert store.find_layer(SimpleVectorStore) is inner


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_generator_of_nodes_is_read_once_and_the_retry_adds_all_of_it(
    asynchronous: bool, policy: RetryPolicy
) -> None:
    inner = SimpleVectorStore()
    name = "async_add" if asynchronous else "add"
    faults = Faults(inner, name, httpx.ConnectError("dropped halfway"))
    faults.consume = True
    produced: list[str] = []

    def nodes() -> Iterator[TextNode]:
        for index in range(3):
            produced.append(str(index))
            yield TextNode(id_=str(index), text=f"t{index}", embedding=[1.0, float(index)])

    store = RetryingVectorStore(inner=inner, policy=policy)
    ids = await run(getattr(store, name)(nodes()))

    assert ids == ["0", "1", "2"]
    assert produced == ["0", "1", "2"]
    assert sorted(inner.data.embedding_dict) == ["0", "1", "2"]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_store_that_keeps_failing_raises_the_last_attempts_own_error(
    asynchronous: bool, policy: RetryPolicy
) -> None:
    inner = simple_store()
    errors = [httpx.ConnectError(f"refused {n}") for n in range(4)]
    name = "aquery" if asynchronous else "query"
    faults = Faults(inner, name, *errors)

    with pytest.raises(httpx.ConnectError) as caught:
        await run(getattr(RetryingVectorStore(inner=inner, policy=policy), name)(_QUERY))

    assert caught.value is errors[-1]
    assert faults.calls == 4


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(unauthorised(), id="401"),
        pytest.param(BudgetExceededError("month", Decimal(9), Decimal(9)), id="budget"),
        pytest.param(asyncio.CancelledError(), id="cancelled"),
    ],
)
async def test_a_store_raises_permanent_errors_refusals_and_cancellation_at_once(
    error: BaseException, policy: RetryPolicy, slept: list[float]
) -> None:
    inner = simple_store()
    faults = Faults(inner, "aquery", error)

    with pytest.raises(type(error)):
        await RetryingVectorStore(inner=inner, policy=policy).aquery(_QUERY)

    assert (faults.calls, slept) == (1, [])


def test_a_method_the_inner_store_does_not_implement_is_raised_once(
    policy: RetryPolicy, slept: list[float]
) -> None:
    inner = simple_store()  # SimpleVectorStore keeps no nodes: get_nodes is not implemented
    calls = Faults(inner, "get_nodes")

    with pytest.raises(NotImplementedError):
        RetryingVectorStore(inner=inner, policy=policy).get_nodes(node_ids=["1"])

    assert (calls.calls, slept) == (1, [])


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


def qdrant_error(status: int, retry_after: str | None = None) -> Exception:
    from qdrant_client.http.exceptions import UnexpectedResponse

    headers = httpx.Headers({"retry-after": retry_after} if retry_after else {})
    return UnexpectedResponse(status, "error", b"", headers)


def qdrant_nodes() -> list[TextNode]:
    return [
        TextNode(id_="00000000-0000-0000-0000-00000000000" + str(n), text=t, embedding=e)
        for n, t, e in ((1, "alpha", [1.0, 0.0]), (2, "beta", [0.0, 1.0]))
    ]


@pytest.fixture
def qdrant_client() -> Any:
    qdrant = pytest.importorskip("qdrant_client")
    return qdrant.QdrantClient(":memory:")


def test_qdrant_queries_retry_the_clients_503_after_its_retry_after(
    qdrant_client: Any, policy: RetryPolicy, slept: list[float]
) -> None:
    from llama_index.vector_stores.qdrant import QdrantVectorStore

    inner = QdrantVectorStore(client=qdrant_client, collection_name="retry", max_retries=0)
    store = RetryingVectorStore(inner=inner, policy=policy)
    store.add(qdrant_nodes())
    faults = Faults(qdrant_client, "query_points", qdrant_error(503, retry_after="3"))

    result = store.query(VectorStoreQuery(query_embedding=[0.0, 1.0], similarity_top_k=1))

    assert [node.get_content() for node in result.nodes] == ["beta"]
    assert (faults.calls, slept) == (2, [3.0])
    assert store.stores_text is inner.stores_text is True


def test_qdrant_get_nodes_retries_a_dropped_connection(
    qdrant_client: Any, policy: RetryPolicy, slept: list[float]
) -> None:
    from llama_index.vector_stores.qdrant import QdrantVectorStore

    inner = QdrantVectorStore(client=qdrant_client, collection_name="retry", max_retries=0)
    store = RetryingVectorStore(inner=inner, policy=policy)
    store.add(qdrant_nodes())
    faults = Faults(qdrant_client, "scroll", httpx.ReadError("connection reset"))

    nodes = store.get_nodes(node_ids=[qdrant_nodes()[0].node_id])

    assert [node.get_content() for node in nodes] == ["alpha"]
    assert (faults.calls, slept) == (2, [1.0])


def test_qdrant_forbidden_is_raised_at_once(
    qdrant_client: Any, policy: RetryPolicy, slept: list[float]
) -> None:
    from llama_index.vector_stores.qdrant import QdrantVectorStore

    inner = QdrantVectorStore(client=qdrant_client, collection_name="retry", max_retries=0)
    store = RetryingVectorStore(inner=inner, policy=policy)
    store.add(qdrant_nodes())
    faults = Faults(qdrant_client, "query_points", qdrant_error(403))

    from qdrant_client.http.exceptions import UnexpectedResponse

    with pytest.raises(UnexpectedResponse, match="403"):
        store.query(VectorStoreQuery(query_embedding=[0.0, 1.0], similarity_top_k=1))

    assert (faults.calls, slept) == (1, [])


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
