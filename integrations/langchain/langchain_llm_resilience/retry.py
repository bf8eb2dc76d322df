"""LangChain embeddings and vector stores whose every call runs under a retry policy.

What is retried, how often and how long between tries is
[`llm_resilience.RetryPolicy`][]'s decision; these classes only route each public
method of the wrapped object through it.

Examples:
    >>> from langchain_core.embeddings import DeterministicFakeEmbedding
    >>> from langchain_core.vectorstores import InMemoryVectorStore
    >>> store = RetryingVectorStore(inner=InMemoryVectorStore(DeterministicFakeEmbedding(size=8)))
    >>> store.add_texts(["hello"], ids=["1"])
    ['1']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore

from llm_resilience.checks import KnownKeywords
from llm_resilience.layers import WrapsOne, read_through, refuse_shadowing_write
from llm_resilience.retry import RetryPolicy, policy_option, warn_of_multiplied_retries

__all__ = ["RetryingEmbeddings", "RetryingVectorStore"]


class RetryingEmbeddings(Embeddings, WrapsOne, KnownKeywords):
    """Embeddings whose every call (sync and async) is retried under a [`RetryPolicy`][].

    Examples:
        >>> from langchain_openai import OpenAIEmbeddings
        >>> embeddings = RetryingEmbeddings(inner=OpenAIEmbeddings(max_retries=0))  # doctest: +SKIP

    ``policy=None`` is the default policy (4 tries, 1 s, 2 s, 4 s apart plus jitter). A
    model that retries by itself (``max_retries`` > 0) is warned about once, with the
    worst-case number of provider calls.
    """

    def __init__(self, *, inner: Embeddings, policy: RetryPolicy | None = None) -> None:
        if not isinstance(inner, Embeddings):
            raise TypeError(f"inner must be a LangChain Embeddings; got {type(inner).__name__}")
        #: The wrapped embeddings model.
        self.inner = inner
        #: The policy every call runs under.
        self.policy = policy_option(policy)
        warn_of_multiplied_retries(inner, self.policy, wrapper=type(self).__name__)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.policy.call(self.inner.embed_documents, texts)

    def embed_query(self, text: str) -> list[float]:
        return self.policy.call(self.inner.embed_query, text)

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return await self.policy.acall(self.inner.aembed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        return await self.policy.acall(self.inner.aembed_query, text)


class RetryingVectorStore(VectorStore, WrapsOne, KnownKeywords):
    """A vector store whose every public call (sync and async) is retried under a policy.

    ```pycon
    >>> store = RetryingVectorStore(inner=QdrantVectorStore(...))  # doctest: +SKIP
    >>> store.as_retriever().invoke("query")  # the retriever's searches retry too  # doctest: +SKIP

    ```

    Adding, deleting, getting by id and every search (similarity, with scores, with
    relevance scores, by vector, max marginal relevance, ``search`` by type) go to the
    inner store's own method, once per try; a generator of texts or documents is read
    once, before the first try. ``as_retriever()`` builds a retriever over this wrapper,
    so its searches retry. ``embeddings`` is the inner store's. A method the inner store
    does not implement raises its ``NotImplementedError``, which is never retried.

    ``from_texts``/``from_documents`` cannot build a wrapper: which store to build is
    yours to say. Build the store, then wrap it:
    ``RetryingVectorStore(inner=InMemoryVectorStore.from_texts(texts, embedding))``.

    The inner store's own attributes read through the wrapper (``store.collection_name``,
    ``store.client``), so code written against the bare store keeps working; its other
    methods do not (a call would not be retried: call them on ``store.inner``). Setting
    one of those attributes on the wrapper raises ``AttributeError``: set it on
    ``store.inner`` ([`read_through`][]).
    """

    #: The wrapped vector store.
    inner: VectorStore
    #: The policy every call runs under.
    policy: RetryPolicy

    def __init__(self, *, inner: VectorStore, policy: RetryPolicy | None = None) -> None:
        if not isinstance(inner, VectorStore):
            raise TypeError(f"inner must be a LangChain VectorStore; got {type(inner).__name__}")
        self.inner = inner
        self.policy = policy_option(policy)
        warn_of_multiplied_retries(inner, self.policy, wrapper=type(self).__name__)

    def __getattr__(self, name: str) -> Any:
        """Reads the wrapper cannot answer go to the inner store (not its methods)."""
        return read_through(
            self,
            name,
            self.__dict__.get("inner"),
            role="inner store",
            methods_refused="a call through it would not be retried",
        )

    def __setattr__(self, name: str, value: Any) -> None:
        refuse_shadowing_write(self, name, self.__dict__.get("inner"), role="inner store")
        super().__setattr__(name, value)

    @property
    def embeddings(self) -> Embeddings | None:
        return self.inner.embeddings

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return self.inner._select_relevance_score_fn()

    def _get_retriever_tags(self) -> list[str]:
        # Tag retrievers with the inner store's class (what users trace by) and ours.
        tags = [type(self.inner).__name__, type(self).__name__]
        if self.embeddings is not None:
            tags.append(self.embeddings.__class__.__name__)
        return tags

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[Any, Any]] | None = None,
        **kwargs: Any,
    ) -> RetryingVectorStore:
        raise NotImplementedError(
            "RetryingVectorStore.from_texts cannot choose a store to build; build it and "
            "wrap it: RetryingVectorStore(inner=YourStore.from_texts(texts, embedding))"
        )

    # -- writes ---------------------------------------------------------------------------

    def add_texts(
        self, texts: Iterable[str], metadatas: list[dict[Any, Any]] | None = None, **kwargs: Any
    ) -> list[str]:
        return self.policy.call(self.inner.add_texts, texts, metadatas, **kwargs)

    async def aadd_texts(
        self, texts: Iterable[str], metadatas: list[dict[Any, Any]] | None = None, **kwargs: Any
    ) -> list[str]:
        return await self.policy.acall(self.inner.aadd_texts, texts, metadatas, **kwargs)

    def add_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        return self.policy.call(self.inner.add_documents, documents, **kwargs)

    async def aadd_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        return await self.policy.acall(self.inner.aadd_documents, documents, **kwargs)

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        return self.policy.call(self.inner.delete, ids, **kwargs)

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        return await self.policy.acall(self.inner.adelete, ids, **kwargs)

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        return self.policy.call(self.inner.get_by_ids, ids)

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        return await self.policy.acall(self.inner.aget_by_ids, ids)

    # -- searches -------------------------------------------------------------------------

    def search(self, query: str, search_type: str, **kwargs: Any) -> list[Document]:
        return self.policy.call(self.inner.search, query, search_type, **kwargs)

    async def asearch(self, query: str, search_type: str, **kwargs: Any) -> list[Document]:
        return await self.policy.acall(self.inner.asearch, query, search_type, **kwargs)

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return self.policy.call(self.inner.similarity_search, query, k, **kwargs)

    async def asimilarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return await self.policy.acall(self.inner.asimilarity_search, query, k, **kwargs)

    def similarity_search_with_score(
        self, *args: Any, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return self.policy.call(self.inner.similarity_search_with_score, *args, **kwargs)

    async def asimilarity_search_with_score(
        self, *args: Any, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return await self.policy.acall(self.inner.asimilarity_search_with_score, *args, **kwargs)

    def similarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return self.policy.call(
            self.inner.similarity_search_with_relevance_scores, query, k, **kwargs
        )

    async def asimilarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return await self.policy.acall(
            self.inner.asimilarity_search_with_relevance_scores, query, k, **kwargs
        )

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, **kwargs: Any
    ) -> list[Document]:
        return self.policy.call(self.inner.similarity_search_by_vector, embedding, k, **kwargs)

    async def asimilarity_search_by_vector(
        self, embedding: list[float], k: int = 4, **kwargs: Any
    ) -> list[Document]:
        return await self.policy.acall(
            self.inner.asimilarity_search_by_vector, embedding, k, **kwargs
        )

    def max_marginal_relevance_search(
        self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, **kwargs: Any
    ) -> list[Document]:
        return self.policy.call(
            self.inner.max_marginal_relevance_search, query, k, fetch_k, lambda_mult, **kwargs
        )

    async def amax_marginal_relevance_search(
        self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, **kwargs: Any
    ) -> list[Document]:
        return await self.policy.acall(
            self.inner.amax_marginal_relevance_search, query, k, fetch_k, lambda_mult, **kwargs
        )

    def max_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        **kwargs: Any,
    ) -> list[Document]:
        return self.policy.call(
            self.inner.max_marginal_relevance_search_by_vector,
            embedding,
            k,
            fetch_k,
            lambda_mult,
            **kwargs,
        )

    async def amax_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        **kwargs: Any,
    ) -> list[Document]:
        return await self.policy.acall(
            self.inner.amax_marginal_relevance_search_by_vector,
            embedding,
            k,
            fetch_k,
            lambda_mult,
            **kwargs,
        )
