"""The fakes shipped for users' tests behave as documented."""

from __future__ import annotations

import threading
import time

import openai
import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.tools import FunctionTool
from llama_index.resilience.testing import (
    FakeFunctionCallingLLM,
    api_status_error,
    rate_limit_error,
)

from llm_resilience import is_transient
from llm_resilience.transient import retry_after_of

HELLO = [ChatMessage(role=MessageRole.USER, content="Say hello")]


def test_rate_limit_error_is_the_openai_sdks_own_429() -> None:
    error = rate_limit_error(retry_after=20)

    assert isinstance(error, openai.RateLimitError)
    assert error.status_code == 429
    assert is_transient(error)
    assert retry_after_of(error) == 20


@pytest.mark.parametrize(
    ("status", "kind", "transient"),
    [
        (400, openai.BadRequestError, False),
        (401, openai.AuthenticationError, False),
        (500, openai.InternalServerError, False),
        (503, openai.InternalServerError, True),
    ],
)
def test_api_status_error_builds_the_sdk_error_for_the_status(
    status: int, kind: type[Exception], transient: bool
) -> None:
    error = api_status_error(status)

    assert isinstance(error, kind)
    assert is_transient(error) is transient


def test_a_stream_yields_word_chunks_then_a_usage_chunk() -> None:
    fake = FakeFunctionCallingLLM(text="Hello there friend")

    chunks = list(fake.stream_chat(HELLO))

    assert [chunk.delta for chunk in chunks] == ["Hello", " there", " friend", ""]
    assert chunks[-1].message.content == "Hello there friend"
    assert chunks[-1].raw["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 3,
        "total_tokens": 5,
    }
    assert "usage" not in chunks[0].raw


async def test_a_stream_fails_after_the_configured_number_of_chunks() -> None:
    fake = FakeFunctionCallingLLM(text="a b c", fail_after_chunks=2, error=rate_limit_error())
    stream = await fake.astream_complete("go")
    received = [(await anext(stream)).delta, (await anext(stream)).delta]

    with pytest.raises(openai.RateLimitError):
        await anext(stream)
    assert received == ["a", " b"]


def test_release_ends_a_hang_at_once() -> None:
    fake = FakeFunctionCallingLLM(hang_seconds=30)
    threading.Timer(0.05, fake.release).start()
    started = time.monotonic()

    answer = fake.complete("hi").text

    assert answer == "The fake model answers."
    assert time.monotonic() - started < 5


def test_the_tool_is_called_only_when_offered_and_not_after_its_result() -> None:
    def lookup(city: str) -> str:
        """Look a city up."""
        return city

    call = ToolSelection(tool_id="t1", tool_name="lookup", tool_kwargs={"city": "Paris"})
    fake = FakeFunctionCallingLLM(tool_call=call, text="Done.")
    tool = FunctionTool.from_defaults(fn=lookup)

    asked = fake.chat_with_tools([tool], user_msg="Find Paris")
    after_result = fake.chat_with_tools(
        [tool],
        chat_history=[
            ChatMessage(role=MessageRole.USER, content="Find Paris"),
            ChatMessage(role=MessageRole.TOOL, content="Paris"),
        ],
    )

    assert fake.get_tool_calls_from_response(asked) == [call]
    assert fake.chat(HELLO).message.content == "Done."
    assert after_result.message.content == "Done."
    assert fake.calls == 3
