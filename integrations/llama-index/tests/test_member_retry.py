"""``member_retry=`` through LlamaIndex's real ``OpenAI`` LLM against local fault servers."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.resilience import FallbackLLM

from llm_resilience import RetryPolicy
from llm_resilience.testing import Fault, FaultInjectingServer

openai_llms = pytest.importorskip("llama_index.llms.openai")

PRIMARY_REPLY = "the primary answered after its wait"
SECONDARY_REPLY = "the secondary answered this request"
MESSAGES = [ChatMessage(role=MessageRole.USER, content="Capital of France?")]


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    with (
        FaultInjectingServer(reply=PRIMARY_REPLY, name="primary") as primary,
        FaultInjectingServer(reply=SECONDARY_REPLY, name="secondary") as secondary,
    ):
        yield primary, secondary


def llm(server: FaultInjectingServer) -> object:
    return openai_llms.OpenAI(
        model="gpt-4o-mini",
        api_base=server.openai_base_url,
        api_key="test",
        max_retries=0,
        timeout=10,
    )


@pytest.mark.parametrize("shape", ["chat", "astream_chat"])
async def test_a_429_with_retry_after_is_waited_out_and_the_same_llm_answers(
    shape: str, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> None:
    primary, secondary = servers
    primary.script(Fault.status(429, retry_after=1))
    chain = FallbackLLM(
        llms=[llm(primary), llm(secondary)],
        per_client_timeout=10,
        member_retry=RetryPolicy(attempts=2, max_delay=5, jitter=0),
    )
    started = time.monotonic()
    if shape == "chat":
        text = chain.chat(MESSAGES).message.content
    else:
        text = ""
        async for response in await chain.astream_chat(MESSAGES):
            text = response.message.content
    assert text == PRIMARY_REPLY
    assert time.monotonic() - started >= 1.0
    assert len(primary.requests) == 2
    assert secondary.requests == []
