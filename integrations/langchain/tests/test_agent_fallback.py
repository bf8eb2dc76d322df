"""``FallbackMiddleware`` in a ``create_agent`` agent with a tool: failover, retries, caps,
what a fallback may be sent, and the attempt events a UI reads beside the tokens.

Over the shipped fakes, and over the fault-injecting server with real ``ChatOpenAI`` and
``ChatAnthropic``. Every case runs sync and async (``invoke``/``ainvoke``,
``stream``/``astream``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from langchain_llm_resilience import FallbackMiddleware
from langchain_llm_resilience.testing import FailingChatModel, ScriptedChatModel
from llm_resilience import AttemptCapExceededError, BudgetExceededError, NoCapableMemberError
from llm_resilience.retry import RetryPolicy
from llm_resilience.retry_budget import RetryBudget
from llm_resilience.testing import Fault, FaultInjectingServer

QUESTION = "what is magic_function(3)?"
BACKUP_ANSWER = "The magic_function tool returned: 5"


@tool
def magic_function(input: int) -> int:
    """Applies a magic function to an input."""
    return input + 2


class PartialToolCallThenFail(FailingChatModel):
    """Streams half a tool call (its name and the start of its arguments), then a 429."""

    def _partial(self, index: int) -> ChatGenerationChunk:
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                tool_call_chunks=[
                    tool_call_chunk(
                        name="magic_function", args='{"input": 99', id="call_x", index=0
                    )
                ],
            )
        )


class Recorder(AgentMiddleware):  # type: ignore[type-arg]
    """Listed after FallbackMiddleware: sees each attempt's request as it is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Any] = []

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        self.requests.append(request)
        return handler(request)

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        self.requests.append(request)
        return await handler(request)


def run_agent(agent: Any, mode: str, message: str = QUESTION, **config: Any) -> Any:
    """The agent's final state through ``mode``: invoke, ainvoke, stream or astream."""
    payload = {"messages": [("user", message)]}
    if mode == "invoke":
        return agent.invoke(payload, config or None)
    if mode == "ainvoke":
        return asyncio.run(agent.ainvoke(payload, config or None))
    if mode == "stream":
        return list(agent.stream(payload, config or None, stream_mode=["messages", "custom"]))
    return asyncio.run(
        _collect(agent.astream(payload, config or None, stream_mode=["messages", "custom"]))
    )


async def _collect(stream: Any) -> list[Any]:
    return [part async for part in stream]


def kept_tokens(parts: list[Any]) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The consumer the docs show: tokens by message id, a superseded attempt's dropped."""
    texts: dict[str, str] = {}
    dropped: set[str] = set()
    events: list[dict[str, Any]] = []
    for mode, part in parts:
        if mode == "custom" and part.get("type") == "llm_resilience.attempt":
            events.append(part)
            if part["kind"] == "superseded" and part["message_id"]:
                dropped.add(part["message_id"])
                texts.pop(part["message_id"], None)
        elif mode == "messages":
            message, _ = part
            if isinstance(message, AIMessageChunk) and message.id not in dropped:
                texts[message.id] = texts.get(message.id, "") + message.text
    return texts, events


MODES = ["invoke", "ainvoke", "stream", "astream"]
STREAMS = ["stream", "astream"]


@pytest.mark.parametrize("timed", [None, 5.0], ids=["untimed", "timed"])
@pytest.mark.parametrize("mode", STREAMS)
def test_a_consumer_drops_the_superseded_attempts_tokens_and_keeps_one_answer(
    mode: str, timed: float | None
) -> None:
    agent = create_agent(
        FailingChatModel(chunks_before_error=2),
        tools=[magic_function],
        middleware=[FallbackMiddleware(ScriptedChatModel(), per_client_timeout=timed)],
    )
    texts, events = kept_tokens(run_agent(agent, mode))
    assert "partial" not in "".join(texts.values())  # the failed prefix is dropped
    assert BACKUP_ANSWER in texts.values()
    kinds = [(event["attempt"], event["kind"], event["reason"]) for event in events]
    # Two model calls (the tool call, then the answer), each failing over once.
    assert kinds == [
        (1, "started", None),
        (1, "superseded", "RateLimitError"),
        (2, "started", None),
        (2, "succeeded", None),
        (3, "started", None),
        (3, "superseded", "RateLimitError"),
        (4, "started", None),
        (4, "succeeded", None),
    ]
    ids = {event["attempt"]: event["message_id"] for event in events}
    assert all(ids.values())
    assert len(set(ids.values())) == 4  # each attempt its own id


@pytest.mark.parametrize("mode", MODES)
def test_a_partial_tool_call_of_a_failed_attempt_is_never_spliced_into_the_answer(
    mode: str,
) -> None:
    agent = create_agent(
        PartialToolCallThenFail(chunks_before_error=1),
        tools=[magic_function],
        middleware=[FallbackMiddleware(ScriptedChatModel())],
    )
    if mode in STREAMS:
        parts = run_agent(agent, mode)
        _, events = kept_tokens(parts)
        dropped = {e["message_id"] for e in events if e["kind"] == "superseded"}
        merged: dict[str, AIMessageChunk] = {}
        streamed = [part for mode_, part in parts if mode_ == "messages"]
        for message, _ in streamed:
            if isinstance(message, AIMessageChunk) and message.id not in dropped:
                merged[message.id] = (
                    merged[message.id] + message if message.id in merged else message
                )
        streamed_calls = [call for chunk in merged.values() for call in chunk.tool_calls]
        assert [call["args"] for call in streamed_calls] == [{"input": 3}]  # never 99, spliced
        tool_messages = [message for message, _ in streamed if message.type == "tool"]
        assert [m.content for m in tool_messages] == ["5"]
        return
    state = run_agent(agent, mode)
    calls = [message.tool_calls for message in state["messages"] if isinstance(message, AIMessage)]
    assert calls[0] == [
        {
            "name": "magic_function",
            "args": {"input": 3},
            "id": calls[0][0]["id"],
            "type": "tool_call",
        }
    ]
    assert calls[0][0]["id"] != "call_x"
    assert state["messages"][-1].content == BACKUP_ANSWER


@pytest.mark.parametrize("mode", MODES)
def test_the_attempt_cap_counts_retries_and_fallbacks_across_the_whole_run(mode: str) -> None:
    recorder = Recorder()
    middleware = FallbackMiddleware(ScriptedChatModel(), max_attempts_per_run=3)
    agent = create_agent(
        FailingChatModel(), tools=[magic_function], middleware=[middleware, recorder]
    )
    # Call one: attempts 1 (fails) and 2 (answers with the tool call); call two: attempt 3
    # fails, and a fourth is refused although the backup would answer.
    with pytest.raises(AttemptCapExceededError) as caught:
        run_agent(agent, mode)
    assert caught.value.max_attempts == 3
    assert type(caught.value.__cause__).__name__ == "RateLimitError"
    assert len(recorder.requests) == 3
    # The next run starts its own count.
    recorder.requests.clear()
    with pytest.raises(AttemptCapExceededError):
        run_agent(agent, mode)
    assert len(recorder.requests) == 3


@pytest.mark.parametrize("mode", MODES)
def test_a_blown_budget_is_neither_retried_nor_failed_over(mode: str) -> None:
    from decimal import Decimal

    recorder = Recorder()
    blown = BudgetExceededError("day", Decimal("1"), Decimal("1"))
    agent = create_agent(
        FailingChatModel(error=blown),
        tools=[magic_function],
        middleware=[
            FallbackMiddleware(ScriptedChatModel(), member_retry=RetryPolicy(attempts=3)),
            recorder,
        ],
    )
    with pytest.raises(BudgetExceededError):
        run_agent(agent, mode)
    assert [request.model.model_name for request in recorder.requests] == ["failing-chat"]


@pytest.mark.parametrize("mode", MODES)
def test_a_non_anthropic_fallback_gets_the_request_without_cache_control(mode: str) -> None:
    recorder = Recorder()

    class Caching(AgentMiddleware):  # type: ignore[type-arg]
        """What Anthropic's prompt-caching middleware leaves on a request."""

        def _marked(self, request: Any) -> Any:
            mark = {"type": "ephemeral"}
            last = request.messages[-1]
            blocks = [{"type": "text", "text": last.text, "cache_control": mark}]
            return request.override(
                model_settings={**request.model_settings, "cache_control": mark},
                messages=[*request.messages[:-1], last.model_copy(update={"content": blocks})],
                tools=[*request.tools, {**_tool_schema(), "cache_control": mark}],
            )

        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            return handler(self._marked(request))

        async def awrap_model_call(self, request: Any, handler: Any) -> Any:
            return await handler(self._marked(request))

    agent = create_agent(
        FailingChatModel(),
        tools=[magic_function],
        middleware=[Caching(), FallbackMiddleware(ScriptedChatModel()), recorder],
    )
    run_agent(agent, mode, message="hello")
    primary, fallback = recorder.requests[:2]
    assert "cache_control" in primary.model_settings
    assert "cache_control" in str(primary.messages[-1].content)
    assert "cache_control" not in fallback.model_settings
    assert "cache_control" not in str(fallback.messages[-1].content)
    assert all("cache_control" not in tool for tool in fallback.tools if isinstance(tool, dict))


def _tool_schema() -> dict[str, Any]:
    return {
        "name": "lookup",
        "description": "Look a word up.",
        "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}},
    }


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_server_tool_is_never_sent_to_another_provider(mode: str) -> None:
    class WithServerTool(AgentMiddleware):  # type: ignore[type-arg]
        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            return handler(request.override(tools=[*request.tools, SEARCH]))

        async def awrap_model_call(self, request: Any, handler: Any) -> Any:
            return await handler(request.override(tools=[*request.tools, SEARCH]))

    recorder = Recorder()
    agent = create_agent(
        ChatAnthropic(
            model_name="claude-haiku-4-5",
            base_url="http://127.0.0.1:9",
            api_key="x",
            max_retries=0,
            timeout=2,
        ),  # type: ignore[call-arg]
        tools=[magic_function],
        middleware=[WithServerTool(), FallbackMiddleware(ScriptedChatModel()), recorder],
    )
    with pytest.raises(NoCapableMemberError) as caught:
        run_agent(agent, mode)
    assert caught.value.missing == {1: ("server_tools",)}
    assert len(recorder.requests) == 1  # the primary only


SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}


@pytest.mark.parametrize("mode", ["ainvoke", "astream"])
def test_a_hung_first_token_is_superseded_as_a_first_token_timeout(mode: str) -> None:
    agent = create_agent(
        FailingChatModel(hang_seconds=5),
        tools=[magic_function],
        # The limit binds the backup too: 0.3 s leaves it room for a collector's pause on a
        # loaded machine (0.1 s once timed the backup out under two suite workers).
        middleware=[FallbackMiddleware(ScriptedChatModel(), first_token_timeout=0.3)],
    )
    started = time.monotonic()
    parts = run_agent(agent, mode)
    assert time.monotonic() - started < 2  # two model calls, each superseded after 0.3 s
    if mode == "astream":
        _, events = kept_tokens(parts)
        reasons = [event["reason"] for event in events if event["kind"] == "superseded"]
        assert reasons == ["first_token_timeout", "first_token_timeout"]
    else:
        assert parts["messages"][-1].content == BACKUP_ANSWER


@pytest.mark.parametrize("mode", MODES)
def test_a_retry_budget_that_refuses_moves_the_model_call_on_at_once(mode: str) -> None:
    spent = RetryBudget(ratio=0, min_per_second=0)  # no retry at all
    recorder = Recorder()
    middleware = FallbackMiddleware(
        ScriptedChatModel(),
        member_retry=RetryPolicy(attempts=3, base_delay=5, jitter=0),
        retry_budget=spent,
    )
    assert middleware._chain_for(ScriptedChatModel()).retry_budget is spent
    agent = create_agent(
        FailingChatModel(), tools=[magic_function], middleware=[middleware, recorder]
    )
    started = time.monotonic()
    run_agent(agent, mode)
    assert time.monotonic() - started < 2  # no 5 s wait before retrying the primary
    names = [request.model.model_name for request in recorder.requests]
    assert names.count("failing-chat") == 2  # once per model call, never retried
    assert spent.counts().calls == 2
    with pytest.raises(TypeError, match="did you mean 'retry_budget'"):
        FallbackMiddleware(ScriptedChatModel(), retry_budgt=spent)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="retry_budget"):
        FallbackMiddleware(ScriptedChatModel(), retry_budget=0.2)  # type: ignore[arg-type]


def test_the_middleware_refuses_a_misspelled_option_and_no_fallback() -> None:
    with pytest.raises(TypeError, match="did you mean 'max_attempts_per_run'"):
        FallbackMiddleware(ScriptedChatModel(), max_attempt_per_run=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="at least one fallback"):
        FallbackMiddleware()
    with pytest.raises(ValueError, match="per_client_timeout"):
        FallbackMiddleware(ScriptedChatModel(), per_client_timeout=-1)


# -- real clients over the fault-injecting server ------------------------------------------


@pytest.fixture
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    with (
        FaultInjectingServer(reply="the primary answered", name="primary") as primary,
        FaultInjectingServer(reply="the secondary answered", name="secondary") as secondary,
    ):
        yield primary, secondary


def _openai(server: FaultInjectingServer) -> ChatOpenAI:
    return ChatOpenAI(
        model="gpt-4o-mini",
        base_url=server.openai_base_url,
        api_key="test",  # type: ignore[arg-type]
        max_retries=0,
        timeout=10,
    )


def _anthropic(server: FaultInjectingServer) -> ChatAnthropic:
    return ChatAnthropic(  # type: ignore[call-arg]
        model_name="claude-haiku-4-5",
        base_url=server.anthropic_base_url,
        api_key="test",
        max_retries=0,
        timeout=10,
    )


@pytest.mark.parametrize("mode", MODES)
def test_real_clients_fail_over_mid_stream_with_the_failed_prefix_marked(
    servers: tuple[FaultInjectingServer, FaultInjectingServer], mode: str
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=2), Fault.status(503))
    agent = create_agent(
        _openai(primary), tools=[], middleware=[FallbackMiddleware(_anthropic(secondary))]
    )
    outcome = run_agent(agent, mode, message="hello")
    if mode in STREAMS:
        texts, events = kept_tokens(outcome)
        assert list(texts.values()) == ["the secondary answered"]
        superseded = [event for event in events if event["kind"] == "superseded"]
        assert [event["model"] for event in superseded] == ["gpt-4o-mini"]
    else:
        assert outcome["messages"][-1].text == "the secondary answered"
    assert len(secondary.requests) == 1


@pytest.mark.parametrize("mode", MODES)
def test_real_clients_wait_out_retry_after_on_the_same_member(
    servers: tuple[FaultInjectingServer, FaultInjectingServer], mode: str
) -> None:
    primary, secondary = servers
    primary.script(Fault.status(429, retry_after=0.2))
    retry = RetryPolicy(attempts=2, max_delay=1, base_delay=0.01, jitter=0)
    agent = create_agent(
        _openai(primary),
        tools=[],
        middleware=[FallbackMiddleware(_openai(secondary), member_retry=retry)],
    )
    outcome = run_agent(agent, mode, message="hello")
    first, second = primary.requests
    assert second.at - first.at >= 0.2
    assert secondary.requests == []
    if mode in STREAMS:
        texts, events = kept_tokens(outcome)
        assert list(texts.values()) == ["the primary answered"]
        assert [(e["attempt"], e["kind"]) for e in events][-1] == (2, "succeeded")
    else:
        assert outcome["messages"][-1].text == "the primary answered"
