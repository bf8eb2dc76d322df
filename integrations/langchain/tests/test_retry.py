"""RetryingEmbeddings and RetryingVectorStore, where LangChain alone differs.

Every store method's retries, refusals, generators, retrievers and Qdrant's own errors are
shared with LlamaIndex: tests/behaviour/test_retry.py. Here: the warnings about models
that retry by themselves, LangChain's type checks and constructors, and LangChain's own
vector store suite run over the wrapper.
"""

from __future__ import annotations

import logging

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_openai import OpenAIEmbeddings
from langchain_tests.integration_tests import VectorStoreIntegrationTests

from langchain_llm_resilience import (
    RateLimitedEmbeddings,
    RetryingEmbeddings,
    RetryingVectorStore,
)
from llm_resilience import RetryPolicy

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
    assert [r for r in caplog.records if r.name.startswith("llm_resilience")] == []


def test_wrong_inner_or_policy_types_are_refused_naming_the_option() -> None:
    with pytest.raises(TypeError, match="inner must be a LangChain Embeddings"):
        RetryingEmbeddings(inner="model")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="inner must be a LangChain VectorStore"):
        RetryingVectorStore(inner=DeterministicFakeEmbedding(size=8))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"policy must be an llm_resilience\.RetryPolicy"):
        RetryingEmbeddings(inner=DeterministicFakeEmbedding(size=8), policy=3)  # type: ignore[arg-type]


# -- vector stores --------------------------------------------------------------------------


def test_the_wrapper_passes_embeddings_through_and_answers_find_layer() -> None:
    inner = InMemoryVectorStore(DeterministicFakeEmbedding(size=8))
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
