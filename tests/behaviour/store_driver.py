"""What the retrying vector store behaviours need of each framework, as mixins.

The two frameworks' stores share no method, so each mixin names the methods a behaviour
needs (a search, an add) and calls them; ``Faults`` makes the store's own method, or the
Qdrant client's under it, fail the way those libraries really fail.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

# The texts a store is seeded with; a search for the first finds it.
SEEDED = ("alpha", "beta", "gamma")
# The texts a generator yields into an add, with their ids.
GENERATED = (("1", "one"), ("2", "two"), ("3", "three"))


class Faults:
    """Replaces ``owner.name`` (on the instance) with a version that raises ``errors`` in
    turn, then works; ``calls`` counts the calls. With ``consume`` the first positional
    argument is read before raising, as a store that failed halfway through would have."""

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


async def run(value: Any) -> Any:
    """``value``, awaited if it is awaitable (a sync or an async method's result)."""
    return await value if inspect.isawaitable(value) else value


def qdrant_error(status: int, retry_after: str | None = None) -> Exception:
    """The error the Qdrant client raises for an HTTP ``status``."""
    import httpx
    from qdrant_client.http.exceptions import UnexpectedResponse

    headers = httpx.Headers({"retry-after": retry_after} if retry_after else {})
    return UnexpectedResponse(status, "error", b"", headers)


def qdrant_id(n: int) -> str:
    return f"00000000-0000-0000-0000-{n:012d}"


class LangChainStores:
    """LangChain's side: ``InMemoryVectorStore`` and ``langchain-qdrant``."""

    def retrying_store(self, inner: Any, **options: Any) -> Any:
        from langchain_llm_resilience import RetryingVectorStore

        return RetryingVectorStore(inner=inner, **options)

    def empty_store(self) -> Any:
        from langchain_core.embeddings import DeterministicFakeEmbedding
        from langchain_core.vectorstores import InMemoryVectorStore

        class ScoredMemoryStore(InMemoryVectorStore):
            """The in-memory store, able to answer relevance-score searches (cosine is one)."""

            def _select_relevance_score_fn(self) -> Any:
                return lambda score: score

        return ScoredMemoryStore(DeterministicFakeEmbedding(size=8))

    @staticmethod
    def store_calls() -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
        """Every method of the framework's store protocol, with arguments for a seeded store."""
        from langchain_core.documents import Document
        from langchain_core.embeddings import DeterministicFakeEmbedding

        vector = DeterministicFakeEmbedding(size=8).embed_query(SEEDED[0])
        calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
            ("add_texts", (["delta"],), {"ids": ["4"]}),
            ("add_documents", ([Document("delta", id="4")],), {}),
            ("delete", (["1"],), {}),
            ("get_by_ids", (["1", "2"],), {}),
            ("search", (SEEDED[0], "similarity"), {"k": 2}),
            ("similarity_search", (SEEDED[0],), {"k": 2}),
            ("similarity_search_with_score", (SEEDED[0],), {"k": 2}),
            ("similarity_search_with_relevance_scores", (SEEDED[0],), {"k": 2}),
            ("similarity_search_by_vector", (vector,), {"k": 2}),
            ("max_marginal_relevance_search", (SEEDED[0],), {"k": 2, "fetch_k": 3}),
            ("max_marginal_relevance_search_by_vector", (vector,), {"k": 2, "fetch_k": 3}),
        ]
        asynchronous = [(f"a{name}", args, kwargs) for name, args, kwargs in calls]
        asynchronous[4] = ("asearch", (SEEDED[0], "mmr"), {"k": 2})
        return [call for pair in zip(calls, asynchronous, strict=True) for call in pair]

    def state(self, store: Any) -> Any:
        """What ``store`` holds, to compare with another store's."""
        return store.store

    def seeded_store(self) -> Any:
        store = self.empty_store()
        store.add_texts(list(SEEDED), ids=[str(n) for n in range(1, len(SEEDED) + 1)])
        return store

    def search_method(self, asynchronous: bool) -> str:
        return "asimilarity_search" if asynchronous else "similarity_search"

    async def search(self, store: Any, asynchronous: bool) -> list[str]:
        """Search ``store`` for the first seeded text; the texts found."""
        method = getattr(store, self.search_method(asynchronous))
        return [doc.page_content for doc in await run(method(SEEDED[0], k=1))]

    def add_method(self, asynchronous: bool) -> str:
        return "aadd_texts" if asynchronous else "add_texts"

    async def add_generated(self, store: Any, asynchronous: bool, produced: list[str]) -> Any:
        """Add :data:`GENERATED` to ``store`` from a generator that notes what it yielded;
        the ids the store gave back."""

        def texts() -> Iterator[str]:
            for _, text in GENERATED:
                produced.append(text)
                yield text

        method = getattr(store, self.add_method(asynchronous))
        return await run(method(texts(), ids=[n for n, _ in GENERATED]))

    def stored(self, inner: Any) -> list[tuple[str, str]]:
        """The ids and texts ``inner`` holds."""
        return sorted((key, doc["text"]) for key, doc in inner.store.items())

    def unimplemented(self) -> tuple[Any, str, Callable[[Any], Any]]:
        """A store, the name of a method it does not implement, and a call of it."""
        from langchain_core.documents import Document
        from langchain_core.embeddings import DeterministicFakeEmbedding
        from langchain_core.vectorstores import InMemoryVectorStore

        class SearchOnly(InMemoryVectorStore):
            def get_by_ids(self, ids: Any, /) -> list[Document]:
                raise NotImplementedError("SearchOnly does not get by id")

        return (
            SearchOnly(DeterministicFakeEmbedding(size=8)),
            "get_by_ids",
            lambda store: store.get_by_ids(["1"]),
        )

    async def retrieve(self, store: Any, asynchronous: bool) -> list[str]:
        """Seed ``store`` through itself and ask the framework's retriever over it for the
        first seeded text; the texts found."""
        store.add_texts(list(SEEDED))
        retriever = store.as_retriever(search_kwargs={"k": 1})
        found = await retriever.ainvoke(SEEDED[0]) if asynchronous else retriever.invoke(SEEDED[0])
        return [doc.page_content for doc in found]

    def qdrant_store(self) -> tuple[Any, Any]:
        """A ``langchain-qdrant`` store in local mode seeded with :data:`SEEDED`, and the
        Qdrant client under it."""
        from langchain_core.embeddings import DeterministicFakeEmbedding
        from langchain_qdrant import QdrantVectorStore

        store = QdrantVectorStore.from_texts(
            list(SEEDED),
            DeterministicFakeEmbedding(size=8),
            location=":memory:",
            collection_name="retry",
            ids=[qdrant_id(n) for n in range(1, len(SEEDED) + 1)],
        )
        return store, store.client

    def qdrant_search(self, store: Any) -> list[str]:
        """Search the Qdrant store for the second seeded text through a retriever."""
        return [d.page_content for d in store.as_retriever(search_kwargs={"k": 1}).invoke("beta")]

    def qdrant_dropped(self, store: Any, client: Any) -> tuple[str, Callable[[], Any], Any]:
        """What a dropped connection is tried on: the client's method, an action through
        ``store`` and what the action gives when it succeeded once (two texts written
        from a generator, each once: the collection counts five)."""

        def write() -> int:
            store.add_texts(
                (text for text in ["delta", "epsilon"]), ids=[qdrant_id(4), qdrant_id(5)]
            )
            return int(client.count("retry").count)

        return "upsert", write, len(SEEDED) + 2

    async def qdrant_for(self, asynchronous: bool) -> Any:
        """A seeded Qdrant store that serves sync and async calls alike (LangChain's
        async methods run the sync ones in a thread)."""
        return self.qdrant_store()[0]

    async def qdrant_narrowed(self, store: Any, asynchronous: bool) -> list[str]:
        """A search narrowed by a keyword only ``langchain-qdrant`` takes (``offset=1``
        skips the best match); the texts found."""
        method = getattr(store, self.search_method(asynchronous))
        return [doc.page_content for doc in await run(method(SEEDED[0], k=1, offset=1))]

    #: A method ``langchain-qdrant``'s store has and the retrying store does not wrap.
    qdrant_unwrapped_method = "similarity_search_with_score_by_vector"


class LlamaIndexStores:
    """LlamaIndex's side: ``SimpleVectorStore`` and ``llama-index-vector-stores-qdrant``."""

    def retrying_store(self, inner: Any, **options: Any) -> Any:
        from llama_index.resilience import RetryingVectorStore

        return RetryingVectorStore(inner=inner, **options)

    def empty_store(self) -> Any:
        from llama_index.core.vector_stores import SimpleVectorStore

        return SimpleVectorStore()

    @staticmethod
    def store_calls() -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
        from llama_index.core.schema import TextNode
        from llama_index.core.vector_stores.types import VectorStoreQuery

        query = VectorStoreQuery(query_embedding=[1.0, 0.1, 0.0], similarity_top_k=1)
        calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
            ("add", ([TextNode(id_="3", text="delta", embedding=[0.5, 0.5, 0.0])],), {}),
            ("delete", ("1",), {}),
            ("query", (query,), {}),
            ("delete_nodes", (), {"node_ids": ["1"]}),
            ("clear", (), {}),
        ]
        asynchronous = [(f"a{name}", args, kwargs) for name, args, kwargs in calls]
        asynchronous[0] = ("async_add", *calls[0][1:])
        return [call for pair in zip(calls, asynchronous, strict=True) for call in pair]

    def state(self, store: Any) -> Any:
        return store.data

    def _nodes(self, texts: Any) -> list[Any]:
        from llama_index.core.schema import TextNode

        return [
            TextNode(id_=str(n), text=text, embedding=[1.0 if i == n else 0.0 for i in range(3)])
            for n, text in enumerate(texts)
        ]

    def seeded_store(self) -> Any:
        store = self.empty_store()
        store.add(self._nodes(SEEDED))
        return store

    def search_method(self, asynchronous: bool) -> str:
        return "aquery" if asynchronous else "query"

    async def search(self, store: Any, asynchronous: bool) -> list[str]:
        from llama_index.core.vector_stores.types import VectorStoreQuery

        # SimpleVectorStore keeps no text: the id found names the seeded text.
        query = VectorStoreQuery(query_embedding=[1.0, 0.1, 0.0], similarity_top_k=1)
        result = await run(getattr(store, self.search_method(asynchronous))(query))
        return [SEEDED[int(node_id)] for node_id in result.ids]

    def add_method(self, asynchronous: bool) -> str:
        return "async_add" if asynchronous else "add"

    async def add_generated(self, store: Any, asynchronous: bool, produced: list[str]) -> Any:
        from llama_index.core.schema import TextNode

        def nodes() -> Iterator[TextNode]:
            for node_id, text in GENERATED:
                produced.append(text)
                yield TextNode(id_=node_id, text=text, embedding=[1.0, float(node_id)])

        return await run(getattr(store, self.add_method(asynchronous))(nodes()))

    def stored(self, inner: Any) -> list[tuple[str, str]]:
        # SimpleVectorStore keeps ids and embeddings only: the ids name the texts.
        texts = dict(GENERATED)
        return sorted((key, texts[key]) for key in inner.data.embedding_dict)

    def unimplemented(self) -> tuple[Any, str, Callable[[Any], Any]]:
        # SimpleVectorStore keeps no nodes: get_nodes is not implemented.
        return self.seeded_store(), "get_nodes", lambda store: store.get_nodes(node_ids=["1"])

    async def retrieve(self, store: Any, asynchronous: bool) -> list[str]:
        from llama_index.core import Document, StorageContext, VectorStoreIndex
        from llama_index.core.embeddings import MockEmbedding
        from llama_index.resilience import RetryingEmbedding

        index = VectorStoreIndex.from_documents(
            [Document(text=SEEDED[0])],
            storage_context=StorageContext.from_defaults(vector_store=store),
            embed_model=RetryingEmbedding(inner=MockEmbedding(embed_dim=4)),
        )
        retriever = index.as_retriever(similarity_top_k=1)
        found = (
            await retriever.aretrieve(SEEDED[0]) if asynchronous else retriever.retrieve(SEEDED[0])
        )
        return [hit.node.get_content() for hit in found]

    def qdrant_store(self) -> tuple[Any, Any]:
        from llama_index.core.schema import TextNode
        from llama_index.vector_stores.qdrant import QdrantVectorStore
        from qdrant_client import QdrantClient

        client = QdrantClient(":memory:")
        store = QdrantVectorStore(client=client, collection_name="retry", max_retries=0)
        store.add(
            [
                TextNode(
                    id_=qdrant_id(n),
                    text=text,
                    embedding=[1.0 if i == n else 0.0 for i in range(3)],
                )
                for n, text in enumerate(SEEDED)
            ]
        )
        return store, client

    def qdrant_search(self, store: Any) -> list[str]:
        from llama_index.core.vector_stores.types import VectorStoreQuery

        result = store.query(VectorStoreQuery(query_embedding=[0.0, 1.0, 0.0], similarity_top_k=1))
        return [node.get_content() for node in result.nodes]

    def qdrant_dropped(self, store: Any, client: Any) -> tuple[str, Callable[[], Any], Any]:
        """Nodes read back by id."""

        def read() -> list[str]:
            return [node.get_content() for node in store.get_nodes(node_ids=[qdrant_id(0)])]

        return "scroll", read, [SEEDED[0]]

    async def qdrant_for(self, asynchronous: bool) -> Any:
        """A seeded Qdrant store for sync or async calls: LlamaIndex's store speaks to a
        separate async client, whose local-mode data the sync client does not see."""
        if not asynchronous:
            return self.qdrant_store()[0]
        from llama_index.core.schema import TextNode
        from llama_index.vector_stores.qdrant import QdrantVectorStore
        from qdrant_client import AsyncQdrantClient

        # Its async add writes nothing with max_retries=0 (a loop that never runs), so
        # the store is seeded with one try and then left to the wrapper's retries alone.
        store = QdrantVectorStore(
            aclient=AsyncQdrantClient(":memory:"), collection_name="retry", max_retries=1
        )
        await store.async_add(
            [
                TextNode(
                    id_=qdrant_id(n),
                    text=text,
                    embedding=[1.0 if i == n else 0.0 for i in range(3)],
                )
                for n, text in enumerate(SEEDED)
            ]
        )
        store.max_retries = 0
        return store

    async def qdrant_narrowed(self, store: Any, asynchronous: bool) -> list[str]:
        """Nodes read with keywords only Qdrant's store takes: ``limit=1`` (one of the
        three) and ``shard_identifier`` (None: no sharding)."""
        method = store.aget_nodes if asynchronous else store.get_nodes
        nodes = await run(method(limit=1, shard_identifier=None))
        return [node.get_content() for node in nodes]

    #: A method Qdrant's store has and the retrying store does not wrap.
    qdrant_unwrapped_method = "use_old_sparse_encoder"
