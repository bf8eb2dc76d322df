"""``mid_stream=`` through LlamaIndex's real ``OpenAI`` LLM against the fault server.

A plain consumer concatenates ``response.delta``. Under ``"raise"`` a primary cut after
three words gives it those words and then a clean ``StreamInterruptedError`` carrying
them, never the next member's whole answer glued on; under ``"restart"`` (the default)
the next member's answer follows and a ``FallbackStreamRestartEvent`` is dispatched;
under ``"continue"`` a fallback declared ``MemberProfile(assistant_prefill=True)`` gets
the three words as a last assistant message and streams the rest, so the deltas join
into exactly one answer (a fallback that rejects the prefill restarts instead).

The members are two ``OpenAI`` LLMs, the second declared as taking a prefill: the
fault server's OpenAI route continues a final assistant message as OpenAI-compatible
servers such as vLLM's (``continue_final_message``) do. LlamaIndex's own ``Anthropic``,
which the adapter marks as taking a prefill without a declaration, is proven in
``test_real_anthropic.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.resilience import FallbackLLM
from llama_index.resilience.testing import RestartEvents, restart_events

from llm_resilience import MemberProfile, StreamInterruptedError, is_transient
from llm_resilience.testing import Fault, FaultInjectingServer

openai_llms = pytest.importorskip("llama_index.llms.openai")

PRIMARY_REPLY = "one two three four five six seven eight"
SECONDARY_REPLY = "the secondary answered this request"
DELIVERED = "one two three"
MESSAGES = [ChatMessage(role=MessageRole.USER, content="Capital of France?")]


@pytest.fixture
def restarts() -> Iterator[RestartEvents]:
    with restart_events() as handler:
        yield handler


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    with (
        FaultInjectingServer(reply=PRIMARY_REPLY, name="primary") as primary,
        FaultInjectingServer(reply=SECONDARY_REPLY, name="secondary") as secondary,
    ):
        yield primary, secondary


def member(model: str, server: FaultInjectingServer) -> Any:
    return openai_llms.OpenAI(
        model=model,
        api_base=server.openai_base_url,
        api_key="test",
        max_retries=0,
        timeout=10,
    )


def chain(
    servers: tuple[FaultInjectingServer, FaultInjectingServer], **options: Any
) -> FallbackLLM:
    primary, secondary = servers
    return FallbackLLM(
        llms=[member("gpt-4o-mini", primary), member("gpt-4.1-mini", secondary)], **options
    )


def consume(llm: FallbackLLM, received: list[str]) -> str:
    """A plain consumer: it concatenates the deltas and listens for nothing."""
    for response in llm.stream_chat(MESSAGES):
        received.append(response.delta or "")
    return "".join(received)


async def aconsume(llm: FallbackLLM, received: list[str]) -> str:
    async for response in await llm.astream_chat(MESSAGES):
        received.append(response.delta or "")
    return "".join(received)


def check_interrupted(error: StreamInterruptedError) -> None:
    assert (error.client_index, error.chunks, error.delivered_text) == (0, 3, DELIVERED)
    assert DELIVERED not in str(error)
    assert error.__cause__ is not None
    assert is_transient(error.__cause__)


def test_mid_stream_is_validated_naming_the_option_and_the_values() -> None:
    with FaultInjectingServer() as server:
        llms = [member("gpt-4o-mini", server), member("gpt-4.1-mini", server)]
        with pytest.raises(
            ValueError, match=r"mid_stream must be one of 'restart', 'continue', 'raise'"
        ):
            FallbackLLM(llms=llms, mid_stream="retry")
        assert FallbackLLM(llms=llms).mid_stream == "restart"


def test_restart_gives_a_plain_consumer_the_prefix_then_the_next_answer_with_the_event(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    restarts: RestartEvents,
) -> None:
    primary, _ = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    assert consume(chain(servers), []) == DELIVERED + SECONDARY_REPLY
    assert [(e.failed_client, e.next_client, e.chunks) for e in restarts.events] == [(0, 1, 3)]


def test_raise_gives_stream_chat_the_prefix_then_a_clean_error_and_no_second_answer(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    restarts: RestartEvents,
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    llm = chain(servers, mid_stream="raise")
    received: list[str] = []
    with pytest.raises(StreamInterruptedError) as caught:
        consume(llm, received)
    assert "".join(received) == DELIVERED
    check_interrupted(caught.value)
    assert secondary.requests == []
    assert restarts.events == []
    assert consume(llm, []) == PRIMARY_REPLY


async def test_raise_gives_astream_chat_the_prefix_then_a_clean_error(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    llm = chain(servers, mid_stream="raise")
    received: list[str] = []
    with pytest.raises(StreamInterruptedError) as caught:
        await aconsume(llm, received)
    assert "".join(received) == DELIVERED
    check_interrupted(caught.value)
    assert secondary.requests == []


async def test_raise_still_falls_back_quietly_when_the_stream_fails_before_any_text(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, _ = servers
    primary.script(Fault.drop_mid_stream(after_chunks=0))
    llm = chain(servers, mid_stream="raise")
    assert await aconsume(llm, []) == SECONDARY_REPLY


# -- continue ----------------------------------------------------------------------------


def continuing(
    servers: tuple[FaultInjectingServer, FaultInjectingServer], **options: Any
) -> FallbackLLM:
    _, secondary = servers
    secondary.reply = PRIMARY_REPLY  # the fallback would give the same answer
    return chain(
        servers,
        mid_stream="continue",
        member_profiles=[None, MemberProfile(assistant_prefill=True)],
        **options,
    )


def test_continue_gives_stream_chat_exactly_one_answer_from_a_prefill_member(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    restarts: RestartEvents,
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    responses = list(continuing(servers).stream_chat(MESSAGES))
    assert "".join(response.delta or "" for response in responses) == PRIMARY_REPLY
    # The accumulated message of the last chunk is the whole answer too.
    assert responses[-1].message.content == PRIMARY_REPLY
    assert [(e.failed_client, e.next_client, e.chunks, e.continued) for e in restarts.events] == [
        (0, 1, 3, True)
    ]
    assert [r.prefilled for r in secondary.requests] == [True]


async def test_continue_gives_astream_chat_exactly_one_answer(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    restarts: RestartEvents,
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    assert await aconsume(continuing(servers), []) == PRIMARY_REPLY
    assert [e.continued for e in restarts.events] == [True]
    assert [r.prefilled for r in secondary.requests] == [True]


def test_continue_restarts_with_the_event_on_a_fallback_not_declared_to_take_prefill(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    restarts: RestartEvents,
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    assert consume(chain(servers, mid_stream="continue"), []) == DELIVERED + SECONDARY_REPLY
    assert [(e.chunks, e.continued) for e in restarts.events] == [(3, False)]
    assert [r.prefilled for r in secondary.requests] == [False]


async def test_a_prefill_rejection_ends_in_a_complete_answer_via_restart_never_the_rejection(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    restarts: RestartEvents,
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    secondary.default_fault = Fault.prefill_rejected()
    assert await aconsume(continuing(servers), []) == DELIVERED + PRIMARY_REPLY
    assert [(e.failed_client, e.next_client, e.continued) for e in restarts.events] == [
        (0, 1, True),
        (1, 1, False),
    ]
    assert [r.prefilled for r in secondary.requests] == [True, False]


def test_a_sync_prefill_rejection_ends_in_a_complete_answer_via_restart(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    secondary.default_fault = Fault.prefill_rejected()
    assert consume(continuing(servers), []) == DELIVERED + PRIMARY_REPLY


def test_a_filtered_prompt_propagates_and_is_never_sent_to_the_fallback(
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    primary, secondary = servers
    primary.script(Fault.content_filtered(prompt=True))
    with pytest.raises(openai.BadRequestError) as caught:
        consume(continuing(servers), [])
    assert caught.value.code == "content_filter"
    assert secondary.requests == []
