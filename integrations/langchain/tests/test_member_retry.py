"""``ResilienceBuilder`` passes ``member_retry=`` to LangChain's chain (what a member retry
does, in both adapters and every call shape, is in ``tests/behaviour/test_member_retry.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from langchain_openai import ChatOpenAI

from langchain_llm_resilience.builder import ResilienceBuilder
from llm_resilience import RetryPolicy
from llm_resilience.testing import FaultInjectingServer

PRIMARY_REPLY = "the primary answered after its wait"
SECONDARY_REPLY = "the secondary answered this request"


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    # Fresh servers per test: the SDKs cache async HTTP clients per base URL.
    with (
        FaultInjectingServer(reply=PRIMARY_REPLY, name="primary") as primary,
        FaultInjectingServer(reply=SECONDARY_REPLY, name="secondary") as secondary,
    ):
        yield primary, secondary


def openai_model(server: FaultInjectingServer, max_retries: int = 0) -> ChatOpenAI:
    return ChatOpenAI(
        model="gpt-4o-mini",
        base_url=server.openai_base_url,
        api_key="test",  # type: ignore[arg-type]
        max_retries=max_retries,
        timeout=10,
    )


def test_the_builder_passes_member_retry_to_the_chain(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    policy = RetryPolicy(attempts=2, jitter=0)
    stack = (
        ResilienceBuilder()
        .use_fallback_chain([openai_model(primary), openai_model(secondary)], member_retry=policy)
        .build()
    )
    assert stack.chat.member_retry is policy
    assert stack.chat._chain.member_retry is policy
