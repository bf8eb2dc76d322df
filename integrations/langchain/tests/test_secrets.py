"""No LangChain wrapper shows a member's credentials: LangChain's reprs, dumps and traces.

What both adapters share (wrappers' repr and str, nested stacks, error messages) is in
tests/behaviour/test_secrets.py.

The members are the real provider classes, built with keys, auth headers and URLs that
carry passwords (constructing them needs no network; they are never called). The
rule itself (what is a secret) is tested once, in ``tests/core/test_redact.py``.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from langchain_anthropic import ChatAnthropic
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.load import dumpd
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from langchain_llm_resilience import (
    CostTrackedChatModel,
    FallbackChatModel,
    RateLimitedChatModel,
)
from langchain_llm_resilience.testing import ScriptedChatModel
from llm_resilience import CostBudget
from llm_resilience.ledger import InMemoryCostLedger

OPENAI_KEY = "sk-FAKE-openai-key-for-tests"
ANTHROPIC_KEY = "sk-FAKE-anthropic-key-for-tests"
EMBEDDINGS_KEY = "sk-FAKE-embeddings-key-for-tests"
HEADER_TOKEN = "HEADERTOKENqwerty"
QUERY_KEY = "QUERYKEYzxcvb"
URL_PASSWORD = "URLPASSWORDhunter2"
PROXY_PASSWORD = "PROXYPASSWORDletmein"
SECRETS = (
    OPENAI_KEY,
    ANTHROPIC_KEY,
    EMBEDDINGS_KEY,
    HEADER_TOKEN,
    QUERY_KEY,
    URL_PASSWORD,
    PROXY_PASSWORD,
)
BUDGET = CostBudget(
    input_price_per_mtok=3, output_price_per_mtok=15, embedding_price_per_mtok=1, daily_limit=25
)


def openai_model() -> ChatOpenAI:
    return ChatOpenAI(
        model="gpt-4o",
        api_key=OPENAI_KEY,
        base_url=f"https://team:{URL_PASSWORD}@gateway.example/v1",
        openai_proxy=f"http://proxyuser:{PROXY_PASSWORD}@proxy.example:3128",
        default_headers={"Authorization": f"Bearer {HEADER_TOKEN}"},
        default_query={"api-key": QUERY_KEY},
        max_retries=0,
    )


def anthropic_model() -> ChatAnthropic:
    return ChatAnthropic(
        model="claude-sonnet-4-5",
        api_key=ANTHROPIC_KEY,
        base_url=f"https://team:{URL_PASSWORD}@gateway.example",
        default_headers={"x-api-key": HEADER_TOKEN},
        max_retries=0,
    )


def fallback(*models: BaseChatModel) -> FallbackChatModel:
    return FallbackChatModel(models=list(models or (openai_model(), anthropic_model())))


def stack() -> CostTrackedChatModel:
    """CostTracked(RateLimited(Fallback([openai, anthropic]))), as the builder makes it."""
    return CostTrackedChatModel(
        inner=RateLimitedChatModel(inner=fallback(), requests_per_minute=60),
        budget=BUDGET,
        ledger=InMemoryCostLedger(),
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


def test_a_fallback_chat_model_repr_still_names_its_members_and_their_models() -> None:
    text = repr(fallback())
    assert "models=[ChatOpenAI(" in text
    assert "ChatAnthropic(" in text
    assert "model_name='gpt-4o'" in text
    assert "model='claude-sonnet-4-5'" in text
    assert "openai_api_key=SecretStr('**********')" in text
    assert "default_headers={'Authorization': '**********'}" in text
    assert "openai_api_base='https://team:**********@gateway.example/v1'" in text


def test_bound_tools_and_structured_output_print_without_credentials() -> None:
    @tool
    def lookup(city: str) -> str:
        """Look up a city."""
        return city

    class Answer(BaseModel):
        city: str

    model = stack()
    for runnable in (model.bind_tools([lookup]), model.with_structured_output(Answer)):
        for text in shown(runnable):
            assert_no_secret(text)
        assert "CostTrackedChatModel(" in repr(runnable)


def test_serializing_a_stack_for_tracing_adds_no_credential() -> None:
    model = stack()
    # What LangChain and LangSmith record about a model: its serialized form (which for
    # our wrappers carries the repr), its identifying and invocation parameters, and
    # its LangSmith parameters; plus pydantic's own dump.
    for record in (
        dumpd(model),
        model.to_json(),
        model._identifying_params,
        model.asdict(),
        model._get_invocation_params(stop=["\n"]),
        model._get_ls_params(),
        model.model_dump(),
    ):
        assert_no_secret(repr(record))


class SerializedRecorder(BaseCallbackHandler):
    """Keeps what a tracer receives when a chat model run starts."""

    def __init__(self) -> None:
        self.starts: list[dict[str, Any]] = []

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        self.starts.append({"serialized": serialized, **kwargs})


def test_a_traced_call_through_a_stack_sends_no_credential_to_callbacks() -> None:
    # The offline primary answers, so the keyed real models are carried but never called.
    model = CostTrackedChatModel(
        inner=RateLimitedChatModel(
            inner=fallback(ScriptedChatModel(), openai_model(), anthropic_model()),
            requests_per_minute=60,
        ),
        budget=BUDGET,
        ledger=InMemoryCostLedger(),
    )
    recorder = SerializedRecorder()
    model.invoke("hello", config={"callbacks": [recorder]})
    assert recorder.starts
    for start in recorder.starts:
        assert_no_secret(repr(start))
