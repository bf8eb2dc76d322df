"""FallbackChatModel as a LangChain citizen: runs and callbacks, usage, batch, caches,
LangChain's typed errors, tools, structured output and profiles.

What both adapters share (failover, errors, who served, restarts, per-member time limits,
options) is proven in ``tests/behaviour/test_fallback.py``.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from langchain_core.caches import InMemoryCache
from langchain_core.callbacks import BaseCallbackHandler, get_usage_metadata_callback
from langchain_core.exceptions import ModelAPIError, ModelRateLimitError
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_core.rate_limiters import InMemoryRateLimiter
from langchain_core.runnables import RunnableBinding, RunnableLambda
from langchain_core.tools import tool
from pydantic import BaseModel

from langchain_llm_resilience import STREAM_RESTART_EVENT, FallbackChatModel
from langchain_llm_resilience.testing import (
    FailingChatModel,
    ScriptedChatModel,
)
from llm_resilience import MemberProfile


class RunRecorder(BaseCallbackHandler):
    """Counts LLM runs and remembers their parents."""

    def __init__(self) -> None:
        self.starts: list[tuple[UUID, UUID | None]] = []
        self.ends: list[UUID] = []
        self.chain_runs: list[UUID] = []
        self.custom: list[tuple[str, Any, UUID]] = []

    def on_chat_model_start(
        self,
        serialized: Any,
        messages: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self.starts.append((run_id, parent_run_id))

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.ends.append(run_id)

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.chain_runs.append(run_id)

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.custom.append((name, data, run_id))


def chain(**overrides: Any) -> FallbackChatModel:
    params: dict[str, Any] = {
        "models": [
            FailingChatModel(),
            ScriptedChatModel(model="served-by-secondary", responses=["Paris."]),
        ],
    }
    params.update(overrides)
    return FallbackChatModel(**params)


# -- a real chat model -----------------------------------------------------------------


def test_the_wrapper_is_a_chat_model_where_with_fallbacks_is_not() -> None:
    primary, secondary = FailingChatModel(), ScriptedChatModel()
    assert isinstance(FallbackChatModel(models=[primary, secondary]), BaseChatModel)
    assert not isinstance(primary.with_fallbacks([secondary]), BaseChatModel)


def test_create_agent_runs_a_tool_through_a_failed_over_chain() -> None:
    from langchain.agents import create_agent

    @tool
    def magic_function(input: int) -> int:
        """Apply a magic function to an input."""
        return input + 2

    model = chain(models=[FailingChatModel(), ScriptedChatModel(model="secondary")])
    agent = create_agent(model, tools=[magic_function])
    result = agent.invoke({"messages": [HumanMessage("What is the value of magic_function(3)?")]})
    tool_messages = [m for m in result["messages"] if m.type == "tool"]
    assert [m.content for m in tool_messages] == ["5"]
    assert result["messages"][-1].type == "ai"


def test_one_call_is_one_llm_run_parented_under_the_caller() -> None:
    recorder = RunRecorder()
    model = chain()
    pipeline = RunnableLambda(lambda text: text) | model
    pipeline.invoke("Capital of France?", {"callbacks": [recorder]})
    assert len(recorder.starts) == 1
    assert len(recorder.ends) == 1
    run_id, parent = recorder.starts[0]
    assert recorder.ends == [run_id]
    assert parent == recorder.chain_runs[0]


def test_usage_is_counted_once_while_a_naive_wrapper_counts_it_twice() -> None:
    secondary = ScriptedChatModel(model="secondary", responses=["Paris."])
    with get_usage_metadata_callback() as ours:
        answer = FallbackChatModel(models=[FailingChatModel(), secondary]).invoke("Capital?")
    assert answer.usage_metadata is not None
    assert ours.usage_metadata == {"secondary": answer.usage_metadata}

    class NaiveWrapper(BaseChatModel):
        inner: BaseChatModel

        @property
        def _llm_type(self) -> str:
            return "naive"

        def _generate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> Any:
            from langchain_core.outputs import ChatGeneration, ChatResult

            return ChatResult(generations=[ChatGeneration(message=self.inner.invoke(messages))])

    with get_usage_metadata_callback() as naive:
        NaiveWrapper(inner=secondary).invoke("Capital?")
    assert (
        naive.usage_metadata["secondary"]["total_tokens"]
        == 2 * answer.usage_metadata["total_tokens"]
    )


async def test_batch_calls_fail_over() -> None:
    model = chain()
    assert [m.content for m in model.batch(["a", "b"])] == ["Paris.", "Paris."]
    assert [m.content for m in await model.abatch(["a", "b"])] == ["Paris.", "Paris."]


# -- members keep their own limiter and cache --------------------------------------------


class CountingLimiter(InMemoryRateLimiter):
    def __init__(self) -> None:
        super().__init__(requests_per_second=1000, max_bucket_size=1000)
        self.acquired = 0

    def acquire(self, *, blocking: bool = True) -> bool:
        self.acquired += 1
        return super().acquire(blocking=blocking)

    async def aacquire(self, *, blocking: bool = True) -> bool:
        self.acquired += 1
        return await super().aacquire(blocking=blocking)


def test_a_members_cache_answers_its_attempt() -> None:
    secondary = ScriptedChatModel(responses=["first", "second"], cache=InMemoryCache())
    model = FallbackChatModel(models=[FailingChatModel(), secondary])
    assert model.invoke("same question").content == "first"
    assert model.invoke("same question").content == "first"
    assert secondary.calls == 1


# -- what fails over ----------------------------------------------------------------------


def test_langchains_typed_errors_are_classified_by_status_not_is_retryable() -> None:
    server_error = ModelAPIError("internal error")
    server_error.status_code = 500  # type: ignore[attr-defined]
    assert server_error.is_retryable
    secondary = ScriptedChatModel()
    with pytest.raises(ModelAPIError):
        FallbackChatModel(models=[FailingChatModel(error=server_error), secondary]).invoke("x")
    assert secondary.calls == 0
    answer = FallbackChatModel(
        models=[FailingChatModel(error=ModelRateLimitError("slow down")), secondary]
    ).invoke("x")
    assert answer.response_metadata["fallback_served_by"] == [1]


async def test_astream_restart_reaches_callbacks_and_astream_events() -> None:
    model = chain(
        models=[FailingChatModel(chunks_before_error=2), ScriptedChatModel(responses=["a b c"])]
    )
    recorder = RunRecorder()
    chunks = [c async for c in model.astream("x", {"callbacks": [recorder]})]
    assert "".join(str(c.content) for c in chunks).endswith("a b c")
    ((name, data, run_id),) = recorder.custom
    assert name == STREAM_RESTART_EVENT
    assert data == {
        "failed_client": 0,
        "next_client": 1,
        "chunks": 2,
        "error_type": "RateLimitError",
        "continued": False,
    }
    assert run_id == recorder.starts[0][0]

    events = [e async for e in model.astream_events("x", version="v2")]
    custom = [e for e in events if e["event"] == "on_custom_event"]
    assert [e["name"] for e in custom] == [STREAM_RESTART_EVENT]
    model_start = next(e for e in events if e["event"] == "on_chat_model_start")
    assert custom[0]["run_id"] == model_start["run_id"]


# -- tools and structured output ------------------------------------------------------------


class Capital(BaseModel):
    """The capital city of a country."""

    country: str
    city: str


def test_bind_tools_binds_each_member_in_its_own_providers_format() -> None:
    from langchain_anthropic import ChatAnthropic
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        return "sunny"

    model = FallbackChatModel(
        models=[
            ChatOpenAI(model="gpt-4o", api_key="x", max_retries=0),  # type: ignore[arg-type]
            ChatAnthropic(
                model_name="claude-haiku-4-5", api_key="x", max_retries=0, timeout=None, stop=None
            ),  # type: ignore[arg-type]
        ]
    )
    bound = model.bind_tools([get_weather])
    assert isinstance(bound, RunnableBinding)
    assert isinstance(bound.bound, FallbackChatModel)
    openai_tools, anthropic_tools = (kwargs["tools"] for kwargs in bound.member_kwargs or [])
    assert openai_tools[0]["type"] == "function"
    assert openai_tools[0]["function"]["name"] == "get_weather"
    assert anthropic_tools[0]["name"] == "get_weather"
    assert "input_schema" in anthropic_tools[0]


def test_bound_tools_survive_a_failover() -> None:
    @tool
    def magic_function(input: int) -> int:
        """Apply a magic function to an input."""
        return input + 2

    bound = chain(models=[FailingChatModel(), ScriptedChatModel()]).bind_tools(
        [magic_function], tool_choice="any"
    )
    message = bound.invoke("What is magic_function(3)?")
    assert isinstance(message, AIMessage)
    assert message.tool_calls[0]["name"] == "magic_function"
    assert message.tool_calls[0]["args"] == {"input": 3}


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
async def test_structured_output_parses_with_the_member_that_answered(method: str) -> None:
    model = chain(models=[FailingChatModel(), ScriptedChatModel()])
    # JSON mode carries no schema to the provider, so the offline fake cannot know the
    # keys: parse into a plain dict there, into the pydantic model elsewhere.
    schema: Any = Capital if method != "json_mode" else Capital.model_json_schema()
    structured = model.with_structured_output(schema, method=method)
    prompt = "Give the country 'France' and the city 'Paris' as JSON."
    result = structured.invoke(prompt)
    if method != "json_mode":
        assert result == Capital(country="France", city="Paris")
    else:
        assert isinstance(result, dict)
        assert result
    assert (await structured.ainvoke(prompt)) == result
    raw = model.with_structured_output(schema, method=method, include_raw=True).invoke(prompt)
    assert raw["parsed"] == result
    assert raw["parsing_error"] is None
    assert raw["raw"].response_metadata["fallback_served_by"] == [1]


def test_profile_is_what_every_member_supports() -> None:
    model = FallbackChatModel(
        models=[
            ScriptedChatModel(
                profile={"max_input_tokens": 200_000, "tool_calling": True, "image_inputs": True}
            ),
            ScriptedChatModel(
                profile={
                    "max_input_tokens": 128_000,
                    "tool_calling": True,
                    "image_inputs": False,
                    "pdf_inputs": True,
                }
            ),
        ]
    )
    assert model.profile == {
        "max_input_tokens": 128_000,
        "tool_calling": True,
        "image_inputs": False,
    }


def test_profile_takes_the_declared_member_profiles_over_the_members_own() -> None:
    model = FallbackChatModel(
        models=[
            ScriptedChatModel(profile={"max_input_tokens": 1_000_000, "tool_calling": True}),
            ScriptedChatModel(),
        ],
        member_profiles=[MemberProfile(context_window=32_000), MemberProfile(tool_calling=True)],
    )
    assert model.profile == {"max_input_tokens": 32_000, "tool_calling": True}


# -- construction ---------------------------------------------------------------------------


def test_each_stream_ends_with_a_served_by_chunk_of_its_own() -> None:
    # The last chunk is copied from one built once: what a consumer does to one stream's
    # last chunk never shows in the next one, which equals the chunk built field by field.
    model = FallbackChatModel(
        models=[ScriptedChatModel(model="primary", responses=["Paris."]), ScriptedChatModel()]
    )
    first = list(model.stream("Capital of France?"))[-1]
    first.additional_kwargs["seen"] = True
    first.tool_call_chunks.append({"name": "seen", "args": "", "id": "1", "index": 0})
    first.tool_calls.append({"name": "seen", "args": {}, "id": "1"})

    last = list(model.stream("Capital of France?"))[-1]

    assert last == AIMessageChunk(
        content="", response_metadata=last.response_metadata, id=last.id, chunk_position="last"
    )
    assert last.response_metadata["fallback_served_by"] == [0]
    assert last.response_metadata["model_name"] == "primary"


def test_the_served_by_chunk_is_what_pydantics_own_copy_of_the_template_gives() -> None:
    from langchain_llm_resilience.fallback import _LAST_CHUNK, _LAST_MESSAGE, _served_by_chunk

    built = _served_by_chunk(1, {"model_name": "backup", "fallback_served_by": [0]})

    fields = {
        "response_metadata": {"model_name": "backup", "fallback_served_by": [1, 0]},
        "additional_kwargs": {},
        "tool_calls": [],
        "invalid_tool_calls": [],
        "tool_call_chunks": [],
    }
    message = _LAST_MESSAGE.model_copy(update=fields)
    expected = _LAST_CHUNK.model_copy(update={"message": message})
    assert built == expected
    for made, copied in ((built, expected), (built.message, expected.message)):
        assert type(made) is type(copied)
        assert made.__dict__ == copied.__dict__
        assert made.__pydantic_fields_set__ == copied.__pydantic_fields_set__
        assert made.__pydantic_extra__ == copied.__pydantic_extra__
        assert made.__pydantic_private__ == copied.__pydantic_private__
    assert built.message.response_metadata is not _LAST_MESSAGE.response_metadata
    assert built.message.additional_kwargs is not _LAST_MESSAGE.additional_kwargs
