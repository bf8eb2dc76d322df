"""LlamaIndex's real ``Anthropic`` LLM in a ``FallbackLLM`` and under ``CostTrackedLLM``.

Every call goes over HTTP to the fault server's Anthropic Messages route through the
``anthropic`` SDK (``max_retries=0``); the other member is LlamaIndex's real ``OpenAI`` on
the OpenAI route of a second server. ``llama-index-llms-anthropic`` 0.12 only works with
``anthropic`` 0.x (the dev pin ``anthropic>=0.120,<1``): on 2.x every call fails with
``TypeError: Cannot instantiate typing.Union``, on 1.x with an unexpected ``temperature``.

The adapter marks LlamaIndex's ``Anthropic`` as taking an assistant prefill with no
``member_profiles`` declaration, so under ``mid_stream="continue"`` a primary cut
mid-stream continues on it from the delivered words.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.resilience import CostTrackedLLM, FallbackLLM
from llama_index.resilience.testing import RestartEvents, restart_events

from llm_resilience import CostBudget, TransientClassifier
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.testing import Fault, FaultInjectingServer

anthropic_llms = pytest.importorskip("llama_index.llms.anthropic")
openai_llms = pytest.importorskip("llama_index.llms.openai")

OPENAI_REPLY = "one two three four five six seven eight"
ANTHROPIC_REPLY = "the anthropic member answered this request"
DELIVERED = "one two three"
QUESTION = "What is the capital of France?"
MESSAGES = [ChatMessage(role=MessageRole.USER, content=QUESTION)]
CLAUDE = "claude-haiku-4-5"
CALLS = ["chat", "achat", "stream_chat", "astream_chat"]
STREAMS = ["stream_chat", "astream_chat"]
# One token in and out costs 1 and 2 millionths.
BUDGET = CostBudget(input_price_per_mtok=1, output_price_per_mtok=2, daily_limit=10)


@pytest.fixture
def restarts() -> Iterator[RestartEvents]:
    with restart_events() as handler:
        yield handler


@pytest.fixture
def gpt() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply=OPENAI_REPLY, name="openai") as server:
        yield server


@pytest.fixture
def claude() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply=ANTHROPIC_REPLY, name="anthropic") as server:
        yield server


def openai_llm(server: FaultInjectingServer) -> Any:
    return openai_llms.OpenAI(
        model="gpt-4o-mini",
        api_base=server.openai_base_url,
        api_key="sk-FAKE-openai",
        max_retries=0,
        timeout=10,
    )


def anthropic_llm(server: FaultInjectingServer) -> Any:
    return anthropic_llms.Anthropic(
        model=CLAUDE,
        base_url=server.anthropic_base_url,
        api_key="sk-FAKE-anthropic",
        max_retries=0,
        timeout=10,
    )


async def answer(llm: Any, method: str) -> str:
    """Run one call shape to its end as a plain consumer: the text it was given."""
    if method == "chat":
        return str(llm.chat(MESSAGES).message.content)
    if method == "achat":
        return str((await llm.achat(MESSAGES)).message.content)
    if method == "stream_chat":
        return "".join(response.delta or "" for response in llm.stream_chat(MESSAGES))
    stream = await llm.astream_chat(MESSAGES)
    return "".join([response.delta or "" async for response in stream])


def routes(server: FaultInjectingServer) -> list[tuple[str, bool]]:
    return [(request.provider, request.prefilled) for request in server.requests]


# -- fallback between the two real LLMs ---------------------------------------------------


@pytest.mark.parametrize("method", CALLS)
async def test_an_openai_primary_answering_503_falls_back_to_the_real_anthropic_llm(
    method: str, gpt: FaultInjectingServer, claude: FaultInjectingServer
) -> None:
    gpt.script(Fault.status(503))
    llm = FallbackLLM(llms=[openai_llm(gpt), anthropic_llm(claude)])
    assert await answer(llm, method) == ANTHROPIC_REPLY
    assert [request.fault for request in gpt.requests] == [Fault.status(503)]
    assert routes(claude) == [("anthropic", False)]


@pytest.mark.parametrize("method", STREAMS)
async def test_an_openai_stream_cut_mid_body_restarts_on_the_real_anthropic_llm(
    method: str, gpt: FaultInjectingServer, claude: FaultInjectingServer, restarts: RestartEvents
) -> None:
    gpt.script(Fault.drop_mid_stream(after_chunks=3))
    llm = FallbackLLM(llms=[openai_llm(gpt), anthropic_llm(claude)])
    assert await answer(llm, method) == DELIVERED + ANTHROPIC_REPLY
    assert [(e.failed_client, e.next_client, e.chunks) for e in restarts.events] == [(0, 1, 3)]
    assert routes(claude) == [("anthropic", False)]


@pytest.mark.parametrize("method", CALLS)
@pytest.mark.parametrize(
    ("status", "classifier"),
    [
        pytest.param(529, TransientClassifier.with_server_errors(), id="overloaded-529-preset"),
        pytest.param(503, None, id="unavailable-503-default"),
    ],
)
async def test_a_failing_real_anthropic_primary_falls_back_to_openai(
    method: str,
    status: int,
    classifier: Any,
    gpt: FaultInjectingServer,
    claude: FaultInjectingServer,
) -> None:
    claude.script(Fault.status(status))
    llm = FallbackLLM(llms=[anthropic_llm(claude), openai_llm(gpt)], classifier=classifier)
    assert await answer(llm, method) == OPENAI_REPLY
    assert [request.fault for request in claude.requests] == [Fault.status(status)]
    assert routes(gpt) == [("openai", False)]


async def test_an_anthropic_overload_is_not_transient_under_the_default_rule(
    gpt: FaultInjectingServer, claude: FaultInjectingServer
) -> None:
    # 529 is a server-error status: only the preset falls back on it (SPEC section 1).
    claude.script(Fault.status(529))
    llm = FallbackLLM(llms=[anthropic_llm(claude), openai_llm(gpt)])
    with pytest.raises(anthropic.APIStatusError) as caught:
        await answer(llm, "achat")
    assert caught.value.status_code == 529
    assert gpt.requests == []


@pytest.mark.parametrize("method", STREAMS)
async def test_a_real_anthropic_stream_cut_mid_body_restarts_on_openai(
    method: str, gpt: FaultInjectingServer, claude: FaultInjectingServer, restarts: RestartEvents
) -> None:
    claude.script(Fault.drop_mid_stream(after_chunks=2))
    llm = FallbackLLM(llms=[anthropic_llm(claude), openai_llm(gpt)])
    assert await answer(llm, method) == "the anthropic" + OPENAI_REPLY
    assert [(e.failed_client, e.next_client, e.chunks) for e in restarts.events] == [(0, 1, 2)]


# -- mid_stream="continue" onto the real Anthropic LLM ------------------------------------


@pytest.mark.parametrize("method", STREAMS)
async def test_continue_finishes_a_cut_answer_on_the_real_anthropic_llm_exactly_once(
    method: str, gpt: FaultInjectingServer, claude: FaultInjectingServer, restarts: RestartEvents
) -> None:
    gpt.script(Fault.drop_mid_stream(after_chunks=3))
    claude.reply = OPENAI_REPLY  # the fallback would give the same answer
    # No member_profiles: the adapter knows LlamaIndex's Anthropic takes a prefill.
    llm = FallbackLLM(llms=[openai_llm(gpt), anthropic_llm(claude)], mid_stream="continue")
    assert await answer(llm, method) == OPENAI_REPLY
    assert [(e.failed_client, e.next_client, e.chunks, e.continued) for e in restarts.events] == [
        (0, 1, 3, True)
    ]
    assert routes(claude) == [("anthropic", True)]


def test_continue_on_the_real_anthropic_llm_accumulates_the_whole_answer_in_the_message(
    gpt: FaultInjectingServer, claude: FaultInjectingServer
) -> None:
    gpt.script(Fault.drop_mid_stream(after_chunks=3))
    claude.reply = OPENAI_REPLY
    llm = FallbackLLM(llms=[openai_llm(gpt), anthropic_llm(claude)], mid_stream="continue")
    responses = list(llm.stream_chat(MESSAGES))
    assert routes(claude) == [("anthropic", True)]  # continued, not restarted
    # The delivered words are not sent twice, yet the last message holds the whole answer.
    assert "".join(response.delta or "" for response in responses) == OPENAI_REPLY
    assert responses[-1].message.content == OPENAI_REPLY


@pytest.mark.parametrize("method", STREAMS)
async def test_an_anthropic_prefill_rejection_ends_in_a_complete_answer_via_restart(
    method: str, gpt: FaultInjectingServer, claude: FaultInjectingServer, restarts: RestartEvents
) -> None:
    gpt.script(Fault.drop_mid_stream(after_chunks=3))
    claude.reply = OPENAI_REPLY
    claude.default_fault = Fault.prefill_rejected()
    llm = FallbackLLM(llms=[openai_llm(gpt), anthropic_llm(claude)], mid_stream="continue")
    assert await answer(llm, method) == DELIVERED + OPENAI_REPLY
    assert [(e.failed_client, e.next_client, e.continued) for e in restarts.events] == [
        (0, 1, True),
        (1, 1, False),
    ]
    assert routes(claude) == [("anthropic", True), ("anthropic", False)]


# -- usage the provider reported ----------------------------------------------------------


@pytest.mark.parametrize("method", CALLS)
async def test_cost_tracking_records_the_usage_anthropic_reported_not_an_estimate(
    method: str, claude: FaultInjectingServer
) -> None:
    llm = CostTrackedLLM(inner=anthropic_llm(claude), budget=BUDGET, ledger=InMemoryCostLedger())
    assert await answer(llm, method) == ANTHROPIC_REPLY
    [entry] = list(llm.ledger.entries())
    # The server's own counts: the question's words in, one token per reply word out.
    reported = (len(QUESTION.split()), len(ANTHROPIC_REPLY.split()))
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == (*reported, False)
    assert entry.model == CLAUDE
    assert entry.cost > 0


async def test_cost_tracking_over_a_chain_records_the_anthropic_fallbacks_reported_usage(
    gpt: FaultInjectingServer, claude: FaultInjectingServer
) -> None:
    gpt.script(Fault.status(503))
    chain = FallbackLLM(llms=[openai_llm(gpt), anthropic_llm(claude)])
    llm = CostTrackedLLM(inner=chain, budget=BUDGET, ledger=InMemoryCostLedger())
    assert await answer(llm, "astream_chat") == ANTHROPIC_REPLY
    [entry] = list(llm.ledger.entries())
    reported = (len(QUESTION.split()), len(ANTHROPIC_REPLY.split()))
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == (*reported, False)
    assert entry.model == CLAUDE
