"""``invoke`` over LangChain members that stream internally (``streaming=True``): a broken
stream inside a call is failed over like any other error (what both adapters share of
broken streams through real clients is in
``tests/behaviour/test_real_clients_broken_streams.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI

from langchain_llm_resilience import FallbackChatModel
from llm_resilience.testing import Fault, FaultInjectingServer

PRIMARY_REPLY = "one two three four five six seven eight"
SECONDARY_REPLY = "the secondary answered this request"
MODEL = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    # Fresh ports per test: the provider packages cache async HTTP clients per base URL.
    with (
        FaultInjectingServer(reply=PRIMARY_REPLY, name="primary") as primary,
        FaultInjectingServer(reply=SECONDARY_REPLY, name="secondary") as secondary,
    ):
        yield primary, secondary


def member(provider: str, server: FaultInjectingServer) -> BaseChatModel:
    if provider == "openai":
        return ChatOpenAI(
            model=MODEL["openai"],
            base_url=server.openai_base_url,
            api_key="test",  # type: ignore[arg-type]
            max_retries=0,
            timeout=10,
            stream_usage=True,
        )
    return ChatAnthropic(
        model_name=MODEL["anthropic"],
        base_url=server.anthropic_base_url,
        api_key="test",
        max_retries=0,
        timeout=10,
        stop=None,  # type: ignore[arg-type]
    )


async def test_invoke_over_members_that_stream_internally_answers_only_with_the_next_member(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    models: list[BaseChatModel] = [member("openai", primary), member("anthropic", secondary)]
    for model in models:
        model.streaming = True  # type: ignore[attr-defined]
    chain = FallbackChatModel(models=models)
    primary.script(Fault.malformed_chunk(after_chunks=2))
    answer = chain.invoke("Capital of France?")
    assert (answer.text, answer.response_metadata["model_name"]) == (
        SECONDARY_REPLY,
        MODEL["anthropic"],
    )
    primary.script(Fault.malformed_chunk(after_chunks=2))
    answer = await chain.ainvoke("Capital of France?")
    assert answer.text == SECONDARY_REPLY
    assert [request.stream for request in primary.requests] == [True, True]


# -- which model a restarted stream names ------------------------------------------------


# The Anthropic primary names its model in the stream's first event, so a drop after a
# few words leaves that name in the consumer's merge; the secondary names its own.
# -- circuit state -----------------------------------------------------------------------
