"""The short reads of a LlamaIndex answer (a plain OpenAI-shaped report, a message's role)
read what the general ones read."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    MessageRole,
)
from llama_index.resilience import _usage

PLAIN = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}


def _chat(raw: Any, **kwargs: Any) -> ChatResponse:
    message = ChatMessage(role="assistant", content="hi", additional_kwargs=kwargs)
    return ChatResponse(message=message, raw=raw)


RESPONSES = [
    _chat({"usage": dict(PLAIN)}),
    _chat({"usage": dict(PLAIN), "model": "gpt-4o", "id": "x"}),
    CompletionResponse(text="hi", raw={"usage": {"prompt_tokens": 0, "completion_tokens": 5}}),
    # Near misses: each takes the full probe, and must read the same.
    _chat({"usage": {**PLAIN, "prompt_tokens_details": {"cached_tokens": 10}}}),
    _chat({"usage": {**PLAIN, "cache_read_input_tokens": 4}}),
    _chat({"usage": {"prompt_tokens": 12}}),
    _chat({"usage": {"prompt_tokens": True, "completion_tokens": 5}}),
    _chat({"usage": {"prompt_tokens": -1, "completion_tokens": 5}}),
    _chat({"usage": dict(PLAIN), "usage_metadata": {"prompt_token_count": 7}}),
    _chat(
        {
            "usage": dict(PLAIN),
            "meta": {"billed_units": {"input_tokens": 3.0, "output_tokens": 4.0}},
        }
    ),
    _chat({"usage": dict(PLAIN)}, usage={"prompt_tokens": 1, "completion_tokens": 2}),
    _chat({"usage": {"inputTokens": 3, "outputTokens": 4}}),
    CompletionResponse(
        text="hi", raw={"usage": dict(PLAIN)}, additional_kwargs={"prompt_tokens": 9}
    ),
]


@pytest.mark.parametrize("response", RESPONSES)
def test_a_plain_report_reads_as_the_full_probe_reads_it(
    response: ChatResponse | CompletionResponse, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _usage.reported(response)
    short = _usage.plain_report(response)
    monkeypatch.setattr(_usage, "plain_report", lambda response: None)
    assert fast == _usage.reported(response)
    if short is not None:  # the short read's counts and model are the full reads'
        assert short == (*fast[:2], _usage.raw_model(response))


def test_only_a_plain_report_alone_takes_the_short_read() -> None:
    taken = [_usage.plain_report(response) is not None for response in RESPONSES]
    assert taken == [True, True, True] + [False] * (len(RESPONSES) - 3)


def test_a_message_role_is_named_by_its_value_as_the_enum_property_names_it() -> None:
    messages = [ChatMessage(role=role, content="x") for role in MessageRole]
    messages.append(ChatMessage(role="user", content="x"))
    assert _usage.prompt_pairs(messages) == [
        (str(getattr(message.role, "value", message.role)), "x") for message in messages
    ]
