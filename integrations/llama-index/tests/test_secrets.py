"""No LlamaIndex wrapper shows a member's credentials: LlamaIndex's reprs, dicts and events.

What both adapters share (wrappers' repr and str, nested stacks, error messages) is in
tests/behaviour/test_secrets.py.

LlamaIndex's ``OpenAI`` keeps its ``api_key`` as a plain ``str`` field, so pydantic's
repr of a wrapper printed it. The members here are the real provider classes, built with
keys, auth headers and URLs that carry passwords (constructing them needs no network;
they are never called). llama-index-embeddings-openai is not installed, so the embedding
member is a small ``BaseEmbedding`` with the same credential fields as its
``OpenAIEmbedding``. The rule itself is tested once, in ``tests/core/test_redact.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.llms.llm import LLM
from llama_index.llms.anthropic import Anthropic
from llama_index.llms.openai import OpenAI
from llama_index.resilience import (
    CostTrackedEmbedding,
    CostTrackedLLM,
    FallbackLLM,
    RateLimitedEmbedding,
    RateLimitedLLM,
)
from llama_index.resilience.testing import FakeFunctionCallingLLM
from pydantic import Field

from llm_resilience import CostBudget
from llm_resilience.ledger import InMemoryCostLedger

OPENAI_KEY = "sk-FAKE-openai-key-for-tests"
ANTHROPIC_KEY = "sk-FAKE-anthropic-key-for-tests"
EMBEDDING_KEY = "sk-FAKE-embedding-key-for-tests"
HEADER_TOKEN = "HEADERTOKENqwerty"
EXTRA_HEADER_KEY = "EXTRAHEADERKEYasdf"
URL_PASSWORD = "URLPASSWORDhunter2"
SECRETS = (
    OPENAI_KEY,
    ANTHROPIC_KEY,
    EMBEDDING_KEY,
    HEADER_TOKEN,
    EXTRA_HEADER_KEY,
    URL_PASSWORD,
)
BUDGET = CostBudget(
    input_price_per_mtok=3, output_price_per_mtok=15, embedding_price_per_mtok=1, daily_limit=25
)
MESSAGES = [ChatMessage(role=MessageRole.USER, content="hello")]


def openai_llm() -> OpenAI:
    return OpenAI(
        model="gpt-4o",
        api_key=OPENAI_KEY,
        api_base=f"https://team:{URL_PASSWORD}@gateway.example/v1",
        default_headers={"Authorization": f"Bearer {HEADER_TOKEN}"},
        additional_kwargs={"extra_headers": {"X-Gateway-Key": EXTRA_HEADER_KEY}},
        max_retries=0,
    )


def anthropic_llm() -> Anthropic:
    return Anthropic(
        model="claude-sonnet-4-5",
        api_key=ANTHROPIC_KEY,
        base_url=f"https://team:{URL_PASSWORD}@gateway.example",
        default_headers={"x-api-key": HEADER_TOKEN},
        max_retries=0,
    )


class KeyedEmbedding(BaseEmbedding):
    """An embedding model with llama-index-embeddings-openai's credential fields."""

    api_key: str = Field(default=EMBEDDING_KEY)
    api_base: str = Field(default=f"https://team:{URL_PASSWORD}@gateway.example/v1")
    default_headers: dict[str, str] = Field(
        default_factory=lambda: {"Authorization": f"Bearer {HEADER_TOKEN}"}
    )

    def _get_query_embedding(self, query: str) -> list[float]:
        return [0.0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return [0.0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return [0.0]


def fallback(*llms: LLM) -> FallbackLLM:
    return FallbackLLM(llms=list(llms or (openai_llm(), anthropic_llm())))


def stack(*llms: LLM, **options: Any) -> CostTrackedLLM:
    """CostTracked(RateLimited(Fallback([openai, anthropic]))), as the builder makes it."""
    return CostTrackedLLM(
        inner=RateLimitedLLM(inner=fallback(*llms), requests_per_minute=60),
        budget=BUDGET,
        ledger=InMemoryCostLedger(),
        **options,
    )


def shown(obj: object) -> list[str]:
    """Every way a user or a logger prints ``obj``."""
    texts = [repr(obj), str(obj), f"{obj!r}", f"{obj}", "%s %r" % (obj, obj)]  # noqa: UP031
    rich = getattr(obj, "__rich_repr__", None)
    if rich is not None:
        texts.append(repr(list(rich())))
    return texts


def assert_no_secret(text: str) -> None:
    leaked = [secret for secret in SECRETS if secret in text]
    assert not leaked, f"{leaked} shown in: {text[:400]}..."


def test_a_fallback_llm_repr_never_shows_a_members_api_key() -> None:
    llm = fallback()
    for text in shown(llm):
        assert_no_secret(text)
    text = repr(llm)
    assert text.startswith("FallbackLLM(")
    assert "llms=(OpenAI(" in text
    assert "Anthropic(" in text
    assert "model='gpt-4o'" in text
    assert "model='claude-sonnet-4-5'" in text
    assert "api_key='**********'" in text
    assert "default_headers={'Authorization': '**********'}" in text
    assert "api_base='https://team:**********@gateway.example/v1'" in text


def test_serializing_a_stack_adds_no_credential() -> None:
    llm = stack()
    embedding = CostTrackedEmbedding(
        inner=RateLimitedEmbedding(inner=KeyedEmbedding(), requests_per_minute=60), budget=BUDGET
    )
    # What LlamaIndex puts in events and callback payloads (to_dict), and pydantic's dumps.
    for model in (llm, embedding):
        for record in (model.to_dict(), model.to_json(), model.model_dump(), model.dict()):
            assert_no_secret(repr(record))
    assert_no_secret(repr(llm.metadata))


class EventRecorder(BaseEventHandler):
    """Collects every instrumentation event dispatched while it is attached."""

    events: list[BaseEvent] = []

    @classmethod
    def class_name(cls) -> str:
        return "SecretsEventRecorder"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        self.events.append(event)


@pytest.fixture
def recorder() -> Iterator[EventRecorder]:
    root = get_dispatcher()
    handler = EventRecorder(events=[])
    root.add_event_handler(handler)
    yield handler
    root.event_handlers.remove(handler)


def test_a_traced_call_through_a_stack_sends_no_credential_to_events_or_callbacks(
    recorder: EventRecorder,
) -> None:
    # The offline primary answers, so the keyed real LLMs are carried but never called.
    debug = LlamaDebugHandler()
    llm = stack(
        FakeFunctionCallingLLM(),
        openai_llm(),
        anthropic_llm(),
        callback_manager=CallbackManager([debug]),
    )

    llm.chat(MESSAGES)

    assert recorder.events
    for event in recorder.events:
        assert_no_secret(repr(event))
        assert_no_secret(repr(event.model_dump()))
    pairs = debug.get_event_pairs(CBEventType.LLM)
    assert pairs
    for pair in pairs:
        for event in pair:
            assert_no_secret(repr(event.payload))
