"""The server's assistant prefill, ``Fault.prefill_rejected`` and ``Fault.content_filtered``,
through the real ``openai`` and ``anthropic`` SDKs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from llm_resilience import is_transient
from llm_resilience.fallback._continuation import is_prefill_rejection
from llm_resilience.testing import Fault, FaultInjectingServer

REPLY = "Paris is the capital of France."
QUESTION = {"role": "user", "content": "What is the capital of France?"}


@pytest.fixture(scope="module")
def shared_server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply=REPLY, name="prefill") as running:
        yield running


@pytest.fixture
def server(shared_server: FaultInjectingServer) -> FaultInjectingServer:
    shared_server.reset()
    shared_server.default_fault = Fault.ok()
    return shared_server


def anthropic_client(server: FaultInjectingServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.anthropic_base_url, api_key="sk-FAKE-anthropic", max_retries=0
    )


def openai_client(server: FaultInjectingServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_base_url, api_key="sk-FAKE-openai", max_retries=0)


def anthropic_text(server: FaultInjectingServer, messages: list[Any], stream: bool) -> str:
    client = anthropic_client(server)
    if not stream:
        message = client.messages.create(model="claude-haiku-4-5", max_tokens=50, messages=messages)
        return "".join(block.text for block in message.content if block.type == "text")
    events = client.messages.create(
        model="claude-haiku-4-5", max_tokens=50, messages=messages, stream=True
    )
    return "".join(
        event.delta.text
        for event in events
        if event.type == "content_block_delta" and event.delta.type == "text_delta"
    )


def openai_text(server: FaultInjectingServer, messages: list[Any], stream: bool) -> str:
    client = openai_client(server)
    if not stream:
        completion = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        return completion.choices[0].message.content or ""
    chunks = client.chat.completions.create(model="gpt-4o-mini", messages=messages, stream=True)
    return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)


TEXT = {"anthropic": anthropic_text, "openai": openai_text}


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "call"])
def test_a_final_assistant_message_is_continued_so_prefill_and_answer_join_to_the_reply(
    server: FaultInjectingServer, provider: str, stream: bool
) -> None:
    prefill = {"role": "assistant", "content": "Paris is the"}
    rest = TEXT[provider](server, [QUESTION, prefill], stream)
    assert rest == " capital of France."
    assert "Paris is the" + rest == REPLY
    assert [r.prefilled for r in server.requests] == [True]


def test_a_prefill_that_is_not_the_start_of_the_reply_gets_the_whole_reply(
    server: FaultInjectingServer,
) -> None:
    prefill = {"role": "assistant", "content": [{"type": "text", "text": "Lyon"}]}
    assert anthropic_text(server, [QUESTION, prefill], True) == REPLY


def test_anthropic_refuses_a_prefill_ending_in_whitespace_as_the_api_does(
    server: FaultInjectingServer,
) -> None:
    prefill = {"role": "assistant", "content": "Paris is "}
    with pytest.raises(anthropic.BadRequestError, match="trailing whitespace"):
        anthropic_text(server, [QUESTION, prefill], True)


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_prefill_rejected_refuses_a_prefill_with_a_400_the_rule_recognises(
    server: FaultInjectingServer, provider: str
) -> None:
    server.script(Fault.prefill_rejected())
    prefill = {"role": "assistant", "content": "Paris is"}
    error_type = anthropic.BadRequestError if provider == "anthropic" else openai.BadRequestError
    with pytest.raises(error_type) as caught:
        TEXT[provider](server, [QUESTION, prefill], True)
    assert caught.value.status_code == 400
    assert "does not support assistant message prefill" in str(caught.value)
    assert is_prefill_rejection(caught.value)
    assert not is_transient(caught.value)


def test_prefill_rejected_answers_a_request_without_prefill_normally(
    server: FaultInjectingServer,
) -> None:
    # As the default, it is a model that never takes a prefill but answers everything else.
    server.default_fault = Fault.prefill_rejected()
    assert anthropic_text(server, [QUESTION], True) == REPLY
    with pytest.raises(anthropic.BadRequestError):
        anthropic_text(server, [QUESTION, {"role": "assistant", "content": "Paris"}], False)
    assert anthropic_text(server, [QUESTION], False) == REPLY


def test_content_filtered_cuts_an_openai_stream_with_finish_reason_content_filter(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.content_filtered(after_chunks=2))
    chunks = list(
        openai_client(server).chat.completions.create(
            model="gpt-4o-mini", messages=[QUESTION], stream=True
        )
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == "Paris is"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "content_filter"


def test_content_filtered_cuts_an_openai_call_with_finish_reason_content_filter(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.content_filtered(after_chunks=1))
    completion = openai_client(server).chat.completions.create(
        model="gpt-4o-mini", messages=[QUESTION]
    )
    assert completion.choices[0].message.content == "Paris"
    assert completion.choices[0].finish_reason == "content_filter"


def test_content_filtered_ends_an_anthropic_stream_with_stop_reason_refusal(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.content_filtered(after_chunks=1))
    with anthropic_client(server).messages.stream(
        model="claude-haiku-4-5", max_tokens=50, messages=[QUESTION]
    ) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "refusal"
    assert "".join(block.text for block in message.content if block.type == "text") == "Paris"


def test_a_filtered_prompt_is_an_openai_400_with_code_content_filter_and_not_transient(
    server: FaultInjectingServer,
) -> None:
    server.script(Fault.content_filtered(prompt=True))
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client(server).chat.completions.create(model="gpt-4o-mini", messages=[QUESTION])
    assert caught.value.code == "content_filter"
    assert not is_transient(caught.value)


@pytest.mark.parametrize("after_chunks", [-1, 1.5, True])
def test_content_filtered_refuses_a_bad_after_chunks_naming_it(after_chunks: Any) -> None:
    with pytest.raises(ValueError, match="after_chunks"):
        Fault.content_filtered(after_chunks=after_chunks)
