"""How a stack of our layers calls down: LangChain's per-call machinery runs once, outermost.

Each layer is a ``BaseChatModel``, so ``invoke`` on the outermost one runs LangChain's
``generate``/``_generate_with_cache`` (callbacks, cache lookup, stream detection). Inner
layers of ours are then called at their ``_generate`` directly. The provider model at the
bottom is called as its own ``_generate_with_cache`` would call it: through that method
whenever it has a cache (its own or LangChain's global one), is asked to stream or uses
``output_version="v1"`` (and any layer with its own cache or ``rate_limiter`` goes through
it too), else at its ``_generate`` with its ``rate_limiter`` and the run's message id and
metadata applied as that method applies them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.caches import InMemoryCache
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.globals import set_llm_cache
from langchain_core.language_models import BaseChatModel
from langchain_core.outputs import ChatResult
from langchain_core.rate_limiters import InMemoryRateLimiter
from langchain_core.runnables import RunnableLambda
from langchain_core.utils.utils import LC_ID_PREFIX

from langchain_llm_resilience import (
    STREAM_RESTART_EVENT,
    CostTrackedChatModel,
    FallbackChatModel,
    RateLimitedChatModel,
)
from langchain_llm_resilience.testing import FailingChatModel, ScriptedChatModel
from llm_resilience import CostBudget
from llm_resilience.ledger import InMemoryCostLedger

BUDGET = CostBudget(input_price_per_mtok=3, output_price_per_mtok=15, daily_limit=25)


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The class name of every model LangChain's ``_generate_with_cache`` runs for."""
    seen: list[str] = []
    original = BaseChatModel._generate_with_cache
    original_async = BaseChatModel._agenerate_with_cache

    def spy(self: BaseChatModel, *args: Any, **kwargs: Any) -> Any:
        seen.append(type(self).__name__)
        return original(self, *args, **kwargs)

    async def aspy(self: BaseChatModel, *args: Any, **kwargs: Any) -> Any:
        seen.append(type(self).__name__)
        return await original_async(self, *args, **kwargs)

    monkeypatch.setattr(BaseChatModel, "_generate_with_cache", spy)
    monkeypatch.setattr(BaseChatModel, "_agenerate_with_cache", aspy)
    return seen


def _stack(**member: Any) -> tuple[CostTrackedChatModel, InMemoryCostLedger]:
    ledger = InMemoryCostLedger()
    chain = FallbackChatModel(
        models=[ScriptedChatModel(responses=["ok"], **member), ScriptedChatModel(responses=["b"])]
    )
    model = CostTrackedChatModel(
        inner=RateLimitedChatModel(inner=chain, requests_per_minute=6000),
        budget=BUDGET,
        ledger=ledger,
    )
    return model, ledger


class _Starts(BaseCallbackHandler):
    def __init__(self) -> None:
        self.starts = 0

    def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
        self.starts += 1


def test_a_three_layer_stack_runs_langchains_call_machinery_for_outermost_and_provider_only(
    passes: list[str],
) -> None:
    model, ledger = _stack()
    starts = _Starts()

    answer = model.invoke("hi", {"callbacks": [starts]})

    assert answer.text == "ok"
    assert passes == ["CostTrackedChatModel"]  # the provider's call is plain: no cache
    assert starts.starts == 1  # still one LLM run for the whole stack
    assert len(ledger.entries()) == 1


def test_async_calls_skip_the_machinery_of_inner_layers_too(passes: list[str]) -> None:
    model, ledger = _stack()

    answer = asyncio.run(model.ainvoke("hi"))

    assert answer.text == "ok"
    assert passes == ["CostTrackedChatModel"]
    assert len(ledger.entries()) == 1


def test_an_inner_layer_with_its_own_cache_still_answers_from_it(passes: list[str]) -> None:
    provider = ScriptedChatModel(responses=["cached answer", "fresh answer"])
    inner = RateLimitedChatModel(inner=provider, requests_per_minute=6000, cache=InMemoryCache())
    model = CostTrackedChatModel(inner=inner, budget=BUDGET, ledger=InMemoryCostLedger())

    first = model.invoke("same prompt")
    second = model.invoke("same prompt")

    assert (first.text, second.text) == ("cached answer", "cached answer")
    assert provider.calls == 1
    assert passes.count("RateLimitedChatModel") == 2  # its cache lookup ran both times


def test_an_inner_layer_with_its_own_rate_limiter_still_waits_on_it(passes: list[str]) -> None:
    acquired: list[bool] = []

    class CountingLimiter(InMemoryRateLimiter):
        def acquire(self, *, blocking: bool = True) -> bool:
            acquired.append(blocking)
            return super().acquire(blocking=blocking)

    limiter = CountingLimiter(requests_per_second=1000, max_bucket_size=10)
    inner = RateLimitedChatModel(
        inner=ScriptedChatModel(responses=["ok"]), requests_per_minute=6000, rate_limiter=limiter
    )
    model = CostTrackedChatModel(inner=inner, budget=BUDGET, ledger=InMemoryCostLedger())

    model.invoke("hi")

    assert acquired == [True]
    assert passes == ["CostTrackedChatModel", "RateLimitedChatModel"]


def test_a_provider_models_own_rate_limiter_still_waits_below_our_layers() -> None:
    acquired: list[bool] = []

    class CountingLimiter(InMemoryRateLimiter):
        def acquire(self, *, blocking: bool = True) -> bool:
            acquired.append(blocking)
            return super().acquire(blocking=blocking)

        async def aacquire(self, *, blocking: bool = True) -> bool:
            acquired.append(blocking)
            return await super().aacquire(blocking=blocking)

    limiter = CountingLimiter(requests_per_second=1000, max_bucket_size=10)
    provider = ScriptedChatModel(responses=["ok"], rate_limiter=limiter)
    model = FallbackChatModel(models=[provider, ScriptedChatModel(responses=["b"])])

    model.invoke("hi")
    asyncio.run(model.ainvoke("hi"))

    assert acquired == [True, True]


class _RunIds(BaseCallbackHandler):
    def __init__(self) -> None:
        self.run_ids: list[Any] = []

    def on_chat_model_start(self, *args: Any, run_id: Any, **kwargs: Any) -> None:
        self.run_ids.append(run_id)


def test_a_plain_provider_call_leaves_the_message_as_langchain_would() -> None:
    class Informed(ScriptedChatModel):
        def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
            result = super()._generate(*args, **kwargs)
            result.generations[0].generation_info = {"finish_reason": "stop"}
            result.llm_output = {"system_fingerprint": "fp_1"}
            return result

    runs = _RunIds()
    direct = Informed(responses=["ok"]).invoke("hi")
    chain = FallbackChatModel(models=[Informed(responses=["ok"]), ScriptedChatModel()])

    answer = chain.invoke("hi", {"callbacks": [runs]})

    assert answer.id == f"{LC_ID_PREFIX}-{runs.run_ids[0]}-0"  # as LangChain spells it
    served = {k: v for k, v in answer.response_metadata.items() if k != "fallback_served_by"}
    assert served == direct.response_metadata
    assert served["finish_reason"] == "stop"
    assert served["system_fingerprint"] == "fp_1"


def test_a_provider_under_langchains_global_cache_answers_from_it(passes: list[str]) -> None:
    provider = ScriptedChatModel(responses=["first", "second"])
    model = FallbackChatModel(models=[provider, ScriptedChatModel(responses=["b"])])
    set_llm_cache(InMemoryCache())
    try:
        texts = [model.invoke("same prompt").text for _ in range(2)]
    finally:
        set_llm_cache(None)

    assert texts == ["first", "first"]
    assert provider.calls == 1
    assert "ScriptedChatModel" in passes  # a cache: the provider's own machinery ran


def test_a_provider_set_to_stream_streams_an_invoke_below_our_layers(passes: list[str]) -> None:
    class Streaming(ScriptedChatModel):
        streaming: bool = False

    tokens: list[str] = []

    class Tokens(BaseCallbackHandler):
        def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
            tokens.append(token)

    provider = Streaming(responses=["a b"], streaming=True)
    model = FallbackChatModel(models=[provider, ScriptedChatModel(responses=["b"])])

    answer = model.invoke("hi", {"callbacks": [Tokens()]})

    assert answer.text == "a b"
    assert passes == ["FallbackChatModel", "Streaming"]
    assert "".join(tokens) == "a b"


def test_a_provider_models_own_cache_still_applies_below_our_layers(passes: list[str]) -> None:
    provider = ScriptedChatModel(responses=["first", "second"], cache=InMemoryCache())
    model, ledger = _stack()
    model = CostTrackedChatModel(
        inner=FallbackChatModel(models=[provider, ScriptedChatModel(responses=["b"])]),
        budget=BUDGET,
        ledger=ledger,
    )

    texts = [model.invoke("same prompt").text for _ in range(2)]

    assert texts == ["first", "first"]
    assert provider.calls == 1


class _Restarts(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.events.append((name, data))


def _restarting_stack() -> CostTrackedChatModel:
    chain = FallbackChatModel(
        models=[FailingChatModel(chunks_before_error=2), ScriptedChatModel(responses=["a b c"])]
    )
    return CostTrackedChatModel(
        inner=RateLimitedChatModel(inner=chain, requests_per_minute=6000),
        budget=BUDGET,
        ledger=InMemoryCostLedger(),
    )


def test_a_stream_restart_below_two_wrappers_reaches_the_callers_callbacks() -> None:
    restarts = _Restarts()

    chunks = list(_restarting_stack().stream("hi", {"callbacks": [restarts]}))

    assert "".join(str(chunk.content) for chunk in chunks).endswith("a b c")
    assert [name for name, _ in restarts.events] == [STREAM_RESTART_EVENT]
    assert restarts.events[0][1]["failed_client"] == 0


@pytest.mark.parametrize("stacked", [False, True], ids=["chain", "stack"])
def test_a_restart_streamed_inside_a_runnable_reaches_the_parent_runs_callbacks(
    stacked: bool,
) -> None:
    # The model is streamed without a config: its callbacks come from the parent run's
    # context, which the event must reach too (it is completed there when sent).
    restarts = _Restarts()
    model: BaseChatModel = (
        _restarting_stack()
        if stacked
        else FallbackChatModel(
            models=[
                FailingChatModel(chunks_before_error=2),
                ScriptedChatModel(responses=["a b c"]),
            ]
        )
    )

    def inner(text: str) -> str:
        return "".join(str(chunk.content) for chunk in model.stream(text))

    answer = RunnableLambda(inner).invoke("hi", {"callbacks": [restarts]})

    assert answer.endswith("a b c")
    assert [name for name, _ in restarts.events] == [STREAM_RESTART_EVENT]


async def test_an_async_stream_restart_below_two_wrappers_reaches_callbacks_and_events() -> None:
    model = _restarting_stack()
    restarts = _Restarts()

    chunks = [chunk async for chunk in model.astream("hi", {"callbacks": [restarts]})]
    events = [event async for event in model.astream_events("hi", version="v2")]

    assert "".join(str(chunk.content) for chunk in chunks).endswith("a b c")
    assert [name for name, _ in restarts.events] == [STREAM_RESTART_EVENT]
    custom = [event for event in events if event["event"] == "on_custom_event"]
    assert [event["name"] for event in custom] == [STREAM_RESTART_EVENT]
    start = next(event for event in events if event["event"] == "on_chat_model_start")
    assert custom[0]["run_id"] == start["run_id"]  # the event belongs to the stack's one run


def test_the_restart_sink_reaches_neither_traced_parameters_nor_the_provider() -> None:
    seen: list[dict[str, Any]] = []

    class Params(BaseCallbackHandler):
        def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
            seen.append(kwargs.get("invocation_params") or {})

    provider = ScriptedChatModel(responses=["fine"])
    model = CostTrackedChatModel(
        inner=FallbackChatModel(models=[provider, ScriptedChatModel()]),
        budget=BUDGET,
        ledger=InMemoryCostLedger(),
    )

    assert "".join(str(c.content) for c in model.stream("hi", {"callbacks": [Params()]})) == "fine"
    assert seen
    assert not any("restart_sink" in key for params in seen for key in params)
