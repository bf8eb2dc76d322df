"""Real provider clients over HTTP against local fault-injecting servers.

``ChatOpenAI`` and ``ChatAnthropic`` (the real SDKs underneath) talk to servers on
127.0.0.1 started by the test. The primary fails the way providers do (429, 503, a hang
past the per-client timeout, a stream cut mid-body); every time the chain must serve
the answer from the secondary, through ``invoke``, ``ainvoke``, ``stream`` and ``astream``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI

from langchain_llm_resilience import FallbackChatModel
from langchain_llm_resilience.testing import RestartEvents
from llm_resilience.testing import Fault, FaultInjectingServer

PRIMARY_REPLY = "one two three four five six seven eight"
SECONDARY_REPLY = "the secondary answered this request"
# A hang must outlast the per-client timeout; every other fault gets a generous one, so
# a loaded CI machine never turns a slow (healthy) secondary into a timeout.
HANG_TIMEOUT = 1.0
TIMEOUT = 10.0

FAULTS = {
    "429": Fault.status(429),
    "503": Fault.status(503),
    "hang": Fault.hang(),
    "drop-mid-stream": Fault.drop_mid_stream(after_chunks=3),
}


# Fresh servers (fresh ports) per test: the provider packages cache their async HTTP
# clients per base URL, and pytest-asyncio gives every test its own event loop.
@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    with (
        FaultInjectingServer(reply=PRIMARY_REPLY, name="primary") as primary,
        FaultInjectingServer(reply=SECONDARY_REPLY, name="secondary") as secondary,
    ):
        yield primary, secondary


@pytest.fixture(params=["anthropic-secondary", "openai-secondary"])
def chain(
    request: pytest.FixtureRequest, servers: tuple[FaultInjectingServer, FaultInjectingServer]
) -> Callable[..., FallbackChatModel]:
    primary, secondary = servers
    first = ChatOpenAI(
        model="gpt-4o-mini",
        base_url=primary.openai_base_url,
        api_key="test",  # type: ignore[arg-type]
        max_retries=0,
        timeout=10,
    )
    second: Any
    if request.param == "anthropic-secondary":
        second = ChatAnthropic(
            model_name="claude-haiku-4-5",
            base_url=secondary.anthropic_base_url,
            api_key="test",
            max_retries=0,
            timeout=10,
            stop=None,  # type: ignore[arg-type]
        )
    else:
        second = ChatOpenAI(
            model="gpt-4.1-mini",
            base_url=secondary.openai_base_url,
            api_key="test",  # type: ignore[arg-type]
            max_retries=0,
            timeout=10,
        )

    def build(fault: str | None = None) -> FallbackChatModel:
        timeout = HANG_TIMEOUT if fault == "hang" else TIMEOUT
        return FallbackChatModel(models=[first, second], per_client_timeout=timeout)

    return build


def _expected_warning(fault: str, streaming: bool) -> str:
    if not streaming:
        if fault == "hang":
            return "Client 0 timed out after 0:00:01; trying next client."
        return "Client 0 failed transiently; trying next client."
    if fault == "drop-mid-stream":
        return "Streaming client 0 failed mid-stream after 3 token(s); restarting with next client."
    if fault == "hang":
        return "Streaming client 0 timed out after 0:00:01 before streaming; trying next client."
    return "Streaming client 0 failed transiently before streaming; trying next client."


def _fallback_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "llm_resilience.fallback"]


@pytest.mark.parametrize("fault", list(FAULTS))
def test_invoke_is_served_by_the_secondary_when_the_real_primary_fails(
    fault: str,
    chain: Callable[..., FallbackChatModel],
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary, secondary = servers
    primary.script(FAULTS[fault])
    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        answer = chain(fault).invoke("What is the capital of France?")
    assert answer.content == SECONDARY_REPLY
    assert answer.response_metadata["fallback_served_by"] == [1]
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] > 0
    assert _fallback_warnings(caplog) == [_expected_warning(fault, streaming=False)]
    assert [r.fault.kind for r in primary.requests] == [FAULTS[fault].kind]
    assert len(secondary.requests) == 1


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_ainvoke_is_served_by_the_secondary_when_the_real_primary_fails(
    fault: str,
    chain: Callable[..., FallbackChatModel],
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary, secondary = servers
    primary.script(FAULTS[fault])
    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        answer = await chain(fault).ainvoke("What is the capital of France?")
    assert answer.content == SECONDARY_REPLY
    assert answer.response_metadata["fallback_served_by"] == [1]
    assert _fallback_warnings(caplog) == [_expected_warning(fault, streaming=False)]
    assert len(secondary.requests) == 1


def _assert_streamed(fault: str, chunks: list[AIMessageChunk], restarts: RestartEvents) -> None:
    text = "".join(str(chunk.content) for chunk in chunks)
    if fault == "drop-mid-stream":
        # The prefix the primary managed to send stays yielded; the secondary restarts.
        assert text == "one two three" + SECONDARY_REPLY
        assert restarts.events == [
            {
                "failed_client": 0,
                "next_client": 1,
                "chunks": 3,
                "error_type": "RemoteProtocolError",
                "continued": False,
            }
        ]
    else:
        assert text == SECONDARY_REPLY
        assert restarts.events == []
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert merged.response_metadata["fallback_served_by"] == [1]


@pytest.mark.parametrize("fault", list(FAULTS))
def test_stream_is_served_by_the_secondary_when_the_real_primary_fails(
    fault: str,
    chain: Callable[..., FallbackChatModel],
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary, _ = servers
    primary.script(FAULTS[fault])
    restarts = RestartEvents()
    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        chunks = list(chain(fault).stream("Capital of France?", {"callbacks": [restarts]}))
    _assert_streamed(fault, chunks, restarts)
    assert _fallback_warnings(caplog) == [_expected_warning(fault, streaming=True)]


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_astream_is_served_by_the_secondary_when_the_real_primary_fails(
    fault: str,
    chain: Callable[..., FallbackChatModel],
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary, _ = servers
    primary.script(FAULTS[fault])
    restarts = RestartEvents()
    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        chunks = [
            c async for c in chain(fault).astream("Capital of France?", {"callbacks": [restarts]})
        ]
    _assert_streamed(fault, chunks, restarts)
    assert _fallback_warnings(caplog) == [_expected_warning(fault, streaming=True)]


def test_a_healthy_real_primary_serves_without_touching_the_secondary(
    chain: Callable[..., FallbackChatModel],
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _primary, secondary = servers
    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        model = chain()
        answer = model.invoke("hello")
        streamed = "".join(str(c.content) for c in model.stream("hello"))
    assert answer.content == PRIMARY_REPLY == streamed
    assert answer.response_metadata["model_name"].startswith("gpt-4o-mini")
    assert secondary.requests == []
    assert _fallback_warnings(caplog) == []
