"""LlamaIndex embedding models and vector stores whose every call runs under a retry policy.

What is retried, how often and how long between tries is
[`llm_resilience.RetryPolicy`][]'s decision; these classes only route each call of
the wrapped object through it.

Example:

```python
from llama_index.core import Settings, StorageContext, VectorStoreIndex
from llama_index.resilience import RetryingEmbedding, RetryingVectorStore

Settings.embed_model = RetryingEmbedding(inner=OpenAIEmbedding(max_retries=0))
store = RetryingVectorStore(inner=QdrantVectorStore(client=client, collection_name="docs"))
index = VectorStoreIndex.from_documents(
    documents, storage_context=StorageContext.from_defaults(vector_store=store)
)
```
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field
from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryResult,
)
from llama_index.resilience._delegate import DelegatingEmbedding, EmbeddingKind

from llm_resilience.checks import KnownKeywords
from llm_resilience.layers import WrapsOne, read_through, refuse_shadowing_write
from llm_resilience.redact import redacted_fields
from llm_resilience.retry import RetryPolicy, policy_option, warn_of_multiplied_retries

__all__ = ["RetryingEmbedding", "RetryingVectorStore"]


class RetryingEmbedding(DelegatingEmbedding):
    """An embedding model whose every provider call is retried under a [`RetryPolicy`][].

    Example:

    ```python
    Settings.embed_model = RetryingEmbedding(inner=OpenAIEmbedding(max_retries=0))
    ```

    One retried unit per provider call: a query, a text, or one batch of
    ``embed_batch_size`` texts (copied from the inner model, as are ``num_workers``,
    ``model_name`` and the cache), so a failed batch is retried alone. ``policy=None`` is
    the default policy (4 tries). A model that retries by itself (``max_retries`` > 0,
    as ``OpenAIEmbedding`` does by default) is warned about once, with the worst-case
    number of provider calls.
    """

    policy: Any = Field(exclude=True, description="The RetryPolicy every call runs under.")

    def __init__(
        self, *, inner: BaseEmbedding, policy: RetryPolicy | None = None, **kwargs: Any
    ) -> None:
        chosen = policy_option(policy)
        super().__init__(inner=inner, policy=chosen, **kwargs)
        warn_of_multiplied_retries(inner, chosen, wrapper="RetryingEmbedding")

    @classmethod
    def class_name(cls) -> str:
        return "RetryingEmbedding"

    def _embed(
        self, kind: EmbeddingKind, texts: list[str], invoke: Callable[[], list[Embedding]]
    ) -> list[Embedding]:
        attempt = super()._embed
        result: list[Embedding] = self.policy.call(attempt, kind, texts, invoke)
        return result

    async def _aembed(
        self,
        kind: EmbeddingKind,
        texts: list[str],
        invoke: Callable[[], Awaitable[list[Embedding]]],
    ) -> list[Embedding]:
        attempt = super()._aembed
        result: list[Embedding] = await self.policy.acall(attempt, kind, texts, invoke)
        return result


class RetryingVectorStore(BasePydanticVectorStore, WrapsOne, KnownKeywords):
    """A vector store whose every call (sync and async) is retried under a policy.

    Example:

    ```python
    store = RetryingVectorStore(inner=SimpleVectorStore())
    ```

    ``add``, ``delete``, ``query``, ``get_nodes``, ``delete_nodes``, ``clear``,
    ``persist`` and their async forms go to the inner store's own method, once per try,
    with every keyword given (``get_nodes(limit=10)`` of a ``QdrantVectorStore``); a
    generator of nodes is read once, before the first try. ``stores_text`` and
    ``is_embedding_query`` are the inner store's, ``client`` is its client. A method the
    inner store does not have raises ``AttributeError`` when called, and one it
    does not implement raises its ``NotImplementedError``; neither is retried.

    The inner store's own attributes read through the wrapper (``store.collection_name``,
    ``store.sparse_vector_name``), so code written against the bare store keeps working;
    its other methods do not (a call would not be retried: call them on ``store.inner``).
    Setting one of those attributes on the wrapper raises ``AttributeError``: set it on
    ``store.inner`` ([`read_through`][]).
    """

    inner: Any = Field(exclude=True, description="The wrapped vector store.")
    policy: Any = Field(exclude=True, description="The RetryPolicy every call runs under.")

    def __init__(self, *, inner: Any, policy: RetryPolicy | None = None, **kwargs: Any) -> None:
        if not (callable(getattr(inner, "add", None)) and callable(getattr(inner, "query", None))):
            raise TypeError(
                "inner must be a LlamaIndex vector store (with add and query, e.g. a "
                f"BasePydanticVectorStore); got {type(inner).__module__}."
                f"{type(inner).__qualname__}"
            )
        chosen = policy_option(policy)
        kwargs.setdefault("stores_text", bool(getattr(inner, "stores_text", False)))
        kwargs.setdefault("is_embedding_query", bool(getattr(inner, "is_embedding_query", True)))
        kwargs.update(inner=inner, policy=chosen)
        super().__init__(**kwargs)
        warn_of_multiplied_retries(inner, chosen, wrapper="RetryingVectorStore")

    @classmethod
    def class_name(cls) -> str:
        return "RetryingVectorStore"

    def __repr_args__(self) -> Any:
        return redacted_fields(super().__repr_args__())

    @property
    def client(self) -> Any:
        return getattr(self.inner, "client", None)

    def __getattr__(self, name: str) -> Any:
        """Reads the wrapper cannot answer go to the inner store (not its methods)."""
        try:
            return super().__getattr__(name)  # type: ignore[misc]  # pydantic's privates
        except AttributeError as missing:
            return read_through(
                self,
                name,
                self.__dict__.get("inner"),
                missing,
                role="inner store",
                methods_refused="a call through it would not be retried",
            )

    def __setattr__(self, name: str, value: Any) -> None:
        refuse_shadowing_write(self, name, self.__dict__.get("inner"), role="inner store")
        super().__setattr__(name, value)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        # Looked up per call, so a method the inner store lacks raises AttributeError.
        return self.policy.call(getattr(self.inner, name), *args, **kwargs)

    async def _acall(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return await self.policy.acall(getattr(self.inner, name), *args, **kwargs)

    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> list[str]:
        result: list[str] = self._call("add", nodes, **add_kwargs)
        return result

    async def async_add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        result: list[str] = await self._acall("async_add", nodes, **kwargs)
        return result

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        self._call("delete", ref_doc_id, **delete_kwargs)

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        await self._acall("adelete", ref_doc_id, **delete_kwargs)

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        result: VectorStoreQueryResult = self._call("query", query, **kwargs)
        return result

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        result: VectorStoreQueryResult = await self._acall("aquery", query, **kwargs)
        return result

    def get_nodes(
        self,
        node_ids: list[str] | None = None,
        filters: MetadataFilters | None = None,
        **kwargs: Any,
    ) -> list[BaseNode]:
        result: list[BaseNode] = self._call(
            "get_nodes", node_ids=node_ids, filters=filters, **kwargs
        )
        return result

    async def aget_nodes(
        self,
        node_ids: list[str] | None = None,
        filters: MetadataFilters | None = None,
        **kwargs: Any,
    ) -> list[BaseNode]:
        result: list[BaseNode] = await self._acall(
            "aget_nodes", node_ids=node_ids, filters=filters, **kwargs
        )
        return result

    def delete_nodes(
        self,
        node_ids: list[str] | None = None,
        filters: MetadataFilters | None = None,
        **delete_kwargs: Any,
    ) -> None:
        self._call("delete_nodes", node_ids=node_ids, filters=filters, **delete_kwargs)

    async def adelete_nodes(
        self,
        node_ids: list[str] | None = None,
        filters: MetadataFilters | None = None,
        **delete_kwargs: Any,
    ) -> None:
        await self._acall("adelete_nodes", node_ids=node_ids, filters=filters, **delete_kwargs)

    def clear(self) -> None:
        self._call("clear")

    async def aclear(self) -> None:
        await self._acall("aclear")

    def persist(self, persist_path: str = "./storage/vector_store.json", fs: Any = None) -> None:
        self._call("persist", persist_path=persist_path, fs=fs)
