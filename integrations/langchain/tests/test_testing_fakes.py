"""The offline fakes in ``langchain_llm_resilience.testing`` behave as documented."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from typing import Any

import openai
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from langchain_llm_resilience import FallbackChatModel
from langchain_llm_resilience.testing import (
    FailingChatModel,
    ScriptedChatModel,
    rate_limit_error,
    service_unavailable_error,
)
from llm_resilience.transient import is_transient, retry_after_of, status_code_of


class _MagicInput(BaseModel):
    input: int = Field(..., gt=-1000, lt=1000)


@tool(args_schema=_MagicInput)
def magic_function(input: int) -> int:
    """Apply a magic function to an input."""
    return input + 2


@tool
def get_weather(location: str) -> str:
    """Get the weather at a location."""
    return "sunny"


class Joke(BaseModel):
    """Joke to tell user."""

    setup: str = Field(description="question to set up a joke")
    punchline: str = Field(description="answer to resolve the joke")


def _collect(chunks: Iterable[Any]) -> AIMessageChunk:
    full: AIMessageChunk | None = None
    for chunk in chunks:
        assert isinstance(chunk, AIMessageChunk)
        full = chunk if full is None else full + chunk
    assert full is not None
    return full


# -- provider errors --------------------------------------------------------------------


def test_rate_limit_error_is_a_real_openai_429_the_transient_rule_recognises() -> None:
    error = rate_limit_error(retry_after=2.5)

    assert isinstance(error, openai.RateLimitError)
    assert error.response.status_code == 429
    assert error.response.request.url.host == "api.openai.com"
    assert status_code_of(error) == 429
    assert is_transient(error)
    assert retry_after_of(error) == 2.5


def test_service_unavailable_error_is_a_real_openai_503_the_transient_rule_recognises() -> None:
    error = service_unavailable_error()

    assert isinstance(error, openai.InternalServerError)
    assert status_code_of(error) == 503
    assert is_transient(error)


# -- FailingChatModel -------------------------------------------------------------------


def test_failing_model_raises_a_fresh_copy_of_its_configured_error_on_every_call() -> None:
    model = FailingChatModel()

    with pytest.raises(openai.RateLimitError) as first:
        model.invoke("Hello")
    with pytest.raises(openai.RateLimitError) as second:
        list(model.stream("Hello"))

    assert first.value is not second.value
    assert second.value is model.last_error
    for raised in (first.value, second.value):
        assert (raised.status_code, str(raised)) == (429, str(model.error))
    assert model.error.__traceback__ is None  # never raised itself, so it grows nothing
    assert model.calls == 2


async def test_failing_model_raises_a_custom_error_asynchronously() -> None:
    model = FailingChatModel(error=ValueError("bad request"))

    with pytest.raises(ValueError, match="bad request"):
        await model.ainvoke("Hello")
    assert model.calls == 1


def test_failing_model_streams_the_configured_chunks_before_failing() -> None:
    model = FailingChatModel(chunks_before_error=3)
    received: list[str] = []

    def drain() -> None:
        for chunk in model.stream("Hello"):
            received.append(chunk.text)

    with pytest.raises(openai.RateLimitError):
        drain()

    assert received == ["partial-0 ", "partial-1 ", "partial-2 "]


async def test_failing_model_astreams_the_configured_chunks_before_failing() -> None:
    model = FailingChatModel(chunks_before_error=2, error=service_unavailable_error())
    received: list[str] = []

    async def drain() -> None:
        async for chunk in model.astream("Hello"):
            received.append(chunk.text)

    with pytest.raises(openai.InternalServerError):
        await drain()

    assert received == ["partial-0 ", "partial-1 "]


def test_failing_model_sync_hang_ends_early_when_released() -> None:
    model = FailingChatModel(hang_seconds=30)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            model.invoke("Hello")
        except BaseException as error:
            outcome.append(error)

    worker = threading.Thread(target=call)
    started = time.monotonic()
    worker.start()
    time.sleep(0.05)
    model.release()
    worker.join(timeout=5)

    assert time.monotonic() - started < 5
    assert outcome == [model.last_error]


async def test_failing_model_async_hang_is_cancellable_by_a_timeout() -> None:
    model = FailingChatModel(hang_seconds=30)

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(model.ainvoke("Hello"), timeout=0.05)

    assert time.monotonic() - started < 5
    assert model.calls == 1


def test_failing_model_accepts_tools_and_structured_output_and_still_fails() -> None:
    model = FailingChatModel()

    with pytest.raises(openai.RateLimitError):
        model.bind_tools([magic_function], tool_choice="any").invoke("magic_function(3)?")
    with pytest.raises(openai.RateLimitError):
        model.with_structured_output(Joke).invoke("Tell me a joke.")


# -- ScriptedChatModel ------------------------------------------------------------------


def test_scripted_model_cycles_its_responses_and_reports_usage_and_model_name() -> None:
    model = ScriptedChatModel(model="scripted-1", responses=["One.", "Two words."])

    first = model.invoke("Hello there")
    second = model.invoke("Hello there")
    third = model.invoke("Hello there")

    assert [first.text, second.text, third.text] == ["One.", "Two words.", "One."]
    assert first.response_metadata["model_name"] == "scripted-1"
    # "Hello there" is 2 rough tokens plus 3 of framing; "One." is 2 (word and mark).
    assert first.usage_metadata == {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}
    assert model.calls == 3


def test_scripted_model_omits_usage_when_told_to() -> None:
    model = ScriptedChatModel(report_usage=False)

    assert model.invoke("Hello").usage_metadata is None


def test_scripted_model_streams_word_chunks_and_ends_with_usage_on_the_last_chunk() -> None:
    model = ScriptedChatModel(responses=["Streaming is fun today."])

    chunks = list(model.stream("Hello"))
    full = _collect(chunks)

    assert [c.text for c in chunks[:-1]] == ["Streaming ", "is ", "fun ", "today."]
    assert chunks[-1].chunk_position == "last"
    assert [c.usage_metadata is not None for c in chunks].count(True) == 1
    assert full.text == "Streaming is fun today."
    assert full.usage_metadata is not None
    assert full.usage_metadata["output_tokens"] == 5
    assert full.response_metadata["model_name"] == "scripted-chat"


async def test_scripted_model_astream_matches_ainvoke() -> None:
    model = ScriptedChatModel(responses=["Same answer either way."])

    chunks = [chunk async for chunk in model.astream("Hello")]
    answer = await model.ainvoke("Hello")

    assert _collect(chunks).text == answer.text == "Same answer either way."


def test_scripted_model_cuts_text_at_stop_sequences_and_max_tokens() -> None:
    model = ScriptedChatModel(responses=["Alpha beta gamma delta."], stop=["delta"])

    assert model.invoke("Hi").text == "Alpha beta gamma "
    assert model.invoke("Hi", stop=["beta"]).text == "Alpha "
    assert ScriptedChatModel(responses=["a b c d e"], max_tokens=2).invoke("Hi").text == "a b "


def test_scripted_model_reports_a_per_call_model_override() -> None:
    model = ScriptedChatModel(model="default-model")

    answer = model.invoke("Hello", model="override-model")

    assert answer.response_metadata["model_name"] == "override-model"
    assert model._get_ls_params(model="override-model")["ls_model_name"] == "override-model"


def test_scripted_model_calls_a_forced_tool_with_arguments_from_the_prompt() -> None:
    model = ScriptedChatModel().bind_tools([magic_function, get_weather], tool_choice="any")

    answer = model.invoke("What is the value of magic_function(3)? Use the tool.")

    assert isinstance(answer, AIMessage)
    assert [(c["name"], c["args"]) for c in answer.tool_calls] == [("magic_function", {"input": 3})]
    assert answer.tool_calls[0]["id"]


def test_scripted_model_clamps_numbers_to_the_tool_schema_bounds() -> None:
    model = ScriptedChatModel().bind_tools([magic_function], tool_choice="magic_function")

    answer = model.invoke("Compute magic_function(5000).")

    assert isinstance(answer, AIMessage)
    assert answer.tool_calls[0]["args"] == {"input": 999}


def test_scripted_model_streams_a_tool_call_that_merges_into_the_same_call() -> None:
    model = ScriptedChatModel().bind_tools([get_weather])

    full = _collect(model.stream("What is the weather in San Francisco, CA?"))

    assert [(c["name"], c["args"]) for c in full.tool_calls] == [
        ("get_weather", {"location": "San Francisco, CA"})
    ]


def test_scripted_model_answers_in_text_when_no_bound_tool_is_relevant_or_after_a_tool() -> None:
    model = ScriptedChatModel(responses=["Plain text."]).bind_tools([get_weather])

    unrelated = model.invoke("Hello!")
    after_tool = model.invoke(
        [
            HumanMessage("What is the weather in Paris?"),
            AIMessage(
                "",
                tool_calls=[{"name": "get_weather", "args": {"location": "Paris"}, "id": "1"}],
            ),
            ToolMessage("sunny", tool_call_id="1", name="get_weather"),
        ]
    )

    assert isinstance(unrelated, AIMessage)
    assert isinstance(after_tool, AIMessage)
    assert (unrelated.text, unrelated.tool_calls) == ("Plain text.", [])
    assert (after_tool.text, after_tool.tool_calls) == ("The get_weather tool returned: sunny", [])


def test_scripted_model_refuses_a_tool_choice_that_names_no_bound_tool() -> None:
    with pytest.raises(ValueError, match="not among"):
        ScriptedChatModel().bind_tools([get_weather], tool_choice="magic_function")


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
def test_scripted_model_structured_output_fills_the_schema_by_every_method(method: str) -> None:
    model = ScriptedChatModel().with_structured_output(Joke, method=method)  # type: ignore[arg-type]
    prompt = "Tell me a joke about cats as JSON with 'setup' and 'punchline' keys."

    joke = model.invoke(prompt)
    streamed = list(model.stream(prompt))

    assert isinstance(joke, Joke)
    assert isinstance(streamed[-1], Joke)


def test_scripted_model_structured_output_with_include_raw_returns_the_message_too() -> None:
    model = ScriptedChatModel().with_structured_output(Joke.model_json_schema(), include_raw=True)

    result = model.invoke("Tell me a joke.")

    assert isinstance(result, dict)
    assert isinstance(result["raw"], AIMessage)
    assert set(result["parsed"]) == {"setup", "punchline"}
    assert result["parsing_error"] is None


# -- the two together -------------------------------------------------------------------


def test_a_fallback_chain_of_the_fakes_is_served_by_the_scripted_secondary() -> None:
    primary = FailingChatModel()
    secondary = ScriptedChatModel(model="secondary", responses=["Served."])
    chain = FallbackChatModel(models=[primary, secondary])

    answer = chain.invoke("Hello")

    assert answer.text == "Served."
    assert answer.response_metadata["model_name"] == "secondary"
    assert (primary.calls, secondary.calls) == (1, 1)
