"""Hedged requests (``hedge_after=``) in the fallback engine, with plain callables.

A slow primary blocks on an event (released when the test ends, or when the test says
so); the secondary answers at once. The hedge starts after ``hedge_after`` (0.05 s
here), so the tests wait on events, never on timed assertions.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from llm_resilience import (
    CostBudget,
    FallbackChain,
    InMemoryCostLedger,
    MemberProfile,
    RequestNeeds,
)
from llm_resilience.budget import HEDGE_KIND, BudgetGate
from llm_resilience.fallback._hedge_inbox import (
    bind_hedge_ticket,
    current_hedge_inbox,
    hedge_inbox,
    hedge_inbox_stream,
    hedges_below,
)
from llm_resilience.fallback._workers import _WORKERS
from llm_resilience.usage import Usage

LOGGER = "llm_resilience.fallback"
HEDGE = 0.05
WAIT = 10.0  # how long an event may take on a loaded machine before the test fails
#: The ``held_stream`` fixture: a provider's stream for a failing attempt to hold.
HeldStream = Callable[[threading.Event], Iterator[str]]


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    return lambda: [r.getMessage() for r in caplog.records if r.name == LOGGER]


def call(index: int, client: Callable[[], Any]) -> Any:
    return client()


def _settled(within: float = WAIT) -> bool:
    """Every pooled worker went back to waiting for work."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        busy = [t for t in threading.enumerate() if t.name == "llm-resilience-attempt"]
        if len(busy) == len(_WORKERS._idle):
            return True
        time.sleep(0.01)
    return False


def _gate() -> BudgetGate:
    budget = CostBudget(input_price_per_mtok=1, output_price_per_mtok=2, daily_limit=100)
    return BudgetGate(budget, InMemoryCostLedger())


def _usage_of(index: int, outcome: Any) -> tuple[Usage, str | None] | None:
    """Reads ``(input, output)`` from a call's tuple result or a stream's usage chunks."""
    if isinstance(outcome, tuple):  # a call's result
        return Usage(outcome[0], outcome[1], estimated=False), f"model-{index}"
    for chunk in outcome:
        if isinstance(chunk, tuple):
            return Usage(chunk[0], chunk[1], estimated=False), f"model-{index}"
    return None


# -- options ---------------------------------------------------------------------------


def test_hedge_after_is_off_by_default_and_read_back_in_seconds() -> None:
    assert FallbackChain(["a", "b"]).hedge_after is None
    chain = FallbackChain(["a", "b"], hedge_after=timedelta(milliseconds=1500))
    assert chain.hedge_after == 1.5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"hedge_after": 0}, "hedge_after must be greater than 0 seconds; got 0"),
        ({"hedge_after": "soon"}, "hedge_after must be None, a number of seconds"),
        (
            {"hedge_after": 2, "first_token_timeout": 2},
            r"hedge_after must be shorter than first_token_timeout \(2 s\)",
        ),
        (
            {"hedge_after": 5, "per_client_timeout": 3},
            r"hedge_after must be shorter than per_client_timeout \(3 s\)",
        ),
    ],
)
def test_a_bad_hedge_after_is_refused_at_construction_naming_the_option(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        FallbackChain(["a", "b"], **options)


# -- invoke ----------------------------------------------------------------------------


def test_a_call_whose_primary_is_slow_is_answered_by_the_hedge(
    release: threading.Event, warnings: Callable[[], list[str]]
) -> None:
    def slow() -> str:
        release.wait(WAIT)
        return "primary"

    chain = FallbackChain([slow, lambda: "secondary"], hedge_after=HEDGE)
    assert chain.invoke(call) == "secondary"
    assert warnings() == [
        "Client 0 sent nothing within 0:00:00.050000 (hedge_after); also trying client 1."
    ]


def test_without_hedge_after_a_slow_primary_is_simply_waited_for() -> None:
    asked: list[str] = []

    def slow() -> str:
        time.sleep(HEDGE * 4)
        return "primary"

    chain = FallbackChain([slow, lambda: asked.append("secondary")])
    assert chain.invoke(call) == "primary"
    assert asked == []


def test_a_primary_that_fails_before_the_hedge_moves_on_at_once() -> None:
    def broken() -> str:
        raise ConnectionError("reset")

    # A hedge of 60 s: the test would hang if the chain waited for it.
    chain = FallbackChain([broken, lambda: "secondary"], hedge_after=60)
    assert chain.invoke(call) == "secondary"


def test_when_the_hedge_fails_the_primary_goes_on_and_answers() -> None:
    hedge_failed = threading.Event()

    def slow() -> str:
        assert hedge_failed.wait(WAIT)
        return "primary"

    def failing() -> str:
        hedge_failed.set()
        raise ConnectionError("reset")

    chain = FallbackChain([slow, failing], hedge_after=HEDGE)
    assert chain.invoke(call) == "primary"


def test_a_non_transient_error_of_the_hedge_propagates(release: threading.Event) -> None:
    def slow() -> str:
        release.wait(WAIT)
        return "primary"

    def refused() -> str:
        raise ValueError("bad request")

    chain = FallbackChain([slow, refused], hedge_after=HEDGE)
    with pytest.raises(ValueError, match="bad request"):
        chain.invoke(call)


def test_a_call_losers_late_usage_is_recorded_as_a_hedge_entry() -> None:
    """The abandoned primary runs to its end in its worker; what it used is spend."""
    release = threading.Event()
    gate = _gate()

    def slow() -> tuple[int, int]:
        release.wait(WAIT)
        return (100, 10)

    chain = FallbackChain([slow, lambda: (7, 3)], hedge_after=HEDGE)
    with hedge_inbox():
        ticket = gate.begin("chat", model="model-0")
        bind_hedge_ticket(ticket)
        result = chain.invoke(call, hedge_usage=_usage_of)
        ticket.finish(Usage(*result, estimated=False), model="model-1")
    assert result == (7, 3)
    assert [e.kind for e in gate.ledger.entries()] == ["chat"]
    release.set()
    assert _settled()
    entries = gate.ledger.entries()
    assert [(e.kind, e.model, e.input_tokens, e.output_tokens) for e in entries] == [
        ("chat", "model-1", 7, 3),
        (HEDGE_KIND, "model-0", 100, 10),
    ]
    assert entries[1].surface == "chat"
    assert entries[1].cost == Decimal("0.00012")


def test_a_call_leaves_no_busy_worker_once_the_loser_returns(release: threading.Event) -> None:
    chain = FallbackChain(
        [lambda: release.wait(WAIT) and "primary", lambda: "b"], hedge_after=HEDGE
    )
    assert chain.invoke(call) == "b"
    release.set()
    assert _settled()


def test_the_hedge_goes_to_the_next_member_routing_allows(release: threading.Event) -> None:
    asked: list[str] = []

    def slow() -> str:
        release.wait(WAIT)
        return "primary"

    def member(name: str) -> Callable[[], str]:
        def answer() -> str:
            asked.append(name)
            return name

        return answer

    chain = FallbackChain(
        [slow, member("no tools"), member("tools")],
        hedge_after=HEDGE,
        member_profiles=[None, MemberProfile(tool_calling=False), None],
    )
    assert chain.invoke(call, needs=RequestNeeds(tool_calling=True)) == "tools"
    assert asked == ["tools"]


def test_a_call_times_out_each_hedged_attempt_under_its_own_limit(
    release: threading.Event,
) -> None:
    def hang() -> str:
        release.wait(WAIT)
        return "late"

    chain = FallbackChain([hang, hang], hedge_after=HEDGE, first_token_timeout=0.2)
    with pytest.raises(TimeoutError, match="Client 1 timed out") as raised:
        chain.invoke(call)
    assert raised.value.option == "first_token_timeout"  # type: ignore[attr-defined]


async def test_an_async_call_cancels_the_slow_primary_when_the_hedge_answers() -> None:
    cancelled = asyncio.Event()

    async def slow() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "primary"

    async def fast() -> str:
        return "secondary"

    chain = FallbackChain([slow, fast], hedge_after=HEDGE)
    assert await chain.ainvoke(call) == "secondary"
    assert cancelled.is_set()
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_an_async_caller_cancelled_mid_hedge_leaves_no_task_behind() -> None:
    started = asyncio.Event()

    async def hang() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    chain = FallbackChain([hang, hang], hedge_after=HEDGE)
    task = asyncio.ensure_future(chain.ainvoke(call))
    await started.wait()
    await asyncio.sleep(HEDGE * 3)  # both are in flight now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_an_async_hedge_that_fails_lets_the_primary_answer() -> None:
    hedge_failed = asyncio.Event()

    async def slow() -> str:
        await hedge_failed.wait()
        return "primary"

    async def failing() -> str:
        hedge_failed.set()
        raise ConnectionError("reset")

    chain = FallbackChain([slow, failing], hedge_after=HEDGE)
    assert await chain.ainvoke(call) == "primary"


async def test_an_async_call_times_out_each_attempt_under_its_own_limit() -> None:
    async def hang() -> str:
        await asyncio.Event().wait()
        return "never"

    chain = FallbackChain([hang, hang], hedge_after=HEDGE, per_client_timeout=0.2)
    with pytest.raises(TimeoutError, match="Client 1 timed out") as raised:
        await chain.ainvoke(call)
    assert raised.value.option == "per_client_timeout"  # type: ignore[attr-defined]
    assert asyncio.all_tasks() == {asyncio.current_task()}


# -- streams ---------------------------------------------------------------------------


def test_a_stream_whose_primary_is_slow_streams_the_hedge_and_closes_the_primary() -> None:
    release = threading.Event()
    closed = threading.Event()

    def slow() -> Iterator[str]:
        try:
            release.wait(WAIT)
            yield "p0"
            yield "p1"
        finally:
            closed.set()

    def fast() -> Iterator[str]:
        yield from ("s0", "s1", "s2")

    chain = FallbackChain([slow, fast], hedge_after=HEDGE)
    assert list(chain.stream(call)) == ["s0", "s1", "s2"]
    # The primary's worker is blocked in its read: it closes at its next chunk.
    release.set()
    assert closed.wait(WAIT)
    assert _settled()


def test_a_streams_opening_chunks_wait_for_content_and_only_the_winners_are_delivered(
    release: threading.Event,
) -> None:
    def slow() -> Iterator[str]:
        yield ""  # an opening event without content
        release.wait(WAIT)
        yield "p0"

    def fast() -> Iterator[str]:
        yield from ("", "s0", "s1")

    chain = FallbackChain([slow, fast], hedge_after=HEDGE)
    assert list(chain.stream(call, is_content=bool)) == ["", "s0", "s1"]


def test_a_stream_losers_reported_opening_usage_is_recorded_as_a_hedge_entry(
    release: threading.Event,
) -> None:
    gate = _gate()

    def slow() -> Iterator[Any]:
        yield (40, 1)  # an opening usage event (Anthropic's message_start), no content
        release.wait(WAIT)
        yield "p0"

    def fast() -> Iterator[Any]:
        yield from ("s0", "s1")

    chain = FallbackChain([slow, fast], hedge_after=HEDGE)

    def chunks() -> Iterator[Any]:
        ticket = gate.begin("chat", model="model-0")
        bind_hedge_ticket(ticket)
        yield from chain.stream(
            call, is_content=lambda c: isinstance(c, str), hedge_usage=_usage_of
        )

    assert list(hedge_inbox_stream(chunks())) == ["s0", "s1"]
    assert current_hedge_inbox() is None  # nothing of the call stays in the caller's context
    assert [(e.kind, e.model, e.input_tokens) for e in gate.ledger.entries()] == [
        (HEDGE_KIND, "model-0", 40)
    ]


def test_a_stream_without_hedge_after_waits_for_the_slow_primary() -> None:
    asked: list[str] = []

    def slow() -> Iterator[str]:
        time.sleep(HEDGE * 4)
        yield "p0"

    def backup() -> Iterator[str]:
        asked.append("secondary")
        yield "s0"

    chain = FallbackChain([slow, backup], first_token_timeout=5)
    assert list(chain.stream(call)) == ["p0"]
    assert asked == []


def test_a_stream_that_fails_mid_way_after_winning_restarts_on_the_next_member(
    release: threading.Event,
) -> None:
    restarts: list[Any] = []

    def slow() -> Iterator[str]:
        release.wait(WAIT)
        yield "p0"

    def breaks() -> Iterator[str]:
        yield "s0"
        raise ConnectionError("cut")

    def third() -> Iterator[str]:
        yield from ("t0", "t1")

    chain = FallbackChain([slow, breaks, third], hedge_after=HEDGE, on_restart=restarts.append)
    assert list(chain.stream(call)) == ["s0", "t0", "t1"]
    assert [(r.failed_client, r.next_client, r.chunks) for r in restarts] == [(1, 2, 1)]


async def test_an_async_stream_closes_the_slow_primary_as_soon_as_the_hedge_has_content() -> None:
    closed = asyncio.Event()

    async def slow() -> AsyncIterator[str]:
        try:
            await asyncio.Event().wait()
            yield "p0"
        finally:
            closed.set()

    async def fast() -> AsyncIterator[str]:
        yield "s0"
        yield "s1"

    chain = FallbackChain([slow, fast], hedge_after=HEDGE)
    chunks = []
    async for chunk in chain.astream(call):
        assert closed.is_set()  # the loser is closed before the winner's first chunk
        chunks.append(chunk)
    assert chunks == ["s0", "s1"]
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_an_async_stream_closed_by_its_consumer_leaves_no_task_behind() -> None:
    async def slow() -> AsyncIterator[str]:
        await asyncio.Event().wait()
        yield "p0"

    async def endless() -> AsyncIterator[str]:
        while True:
            yield "s"
            await asyncio.sleep(0)

    chain = FallbackChain([slow, endless], hedge_after=HEDGE)
    stream = chain.astream(call)
    assert await anext(stream) == "s"
    await stream.aclose()
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_an_async_streams_first_token_timeout_still_bounds_each_attempt() -> None:
    async def hang() -> AsyncIterator[str]:
        await asyncio.Event().wait()
        yield "never"

    chain = FallbackChain([hang, hang], hedge_after=HEDGE, first_token_timeout=0.2)
    with pytest.raises(TimeoutError, match="first_token_timeout"):
        [chunk async for chunk in chain.astream(call)]
    assert asyncio.all_tasks() == {asyncio.current_task()}


# -- the ledger side -------------------------------------------------------------------


class _Unwritable(InMemoryCostLedger):
    def record(self, entry: Any) -> None:
        raise OSError("disk full")

    async def arecord(self, entry: Any) -> None:
        raise OSError("disk full")


async def test_a_hedge_entry_that_cannot_be_written_is_warned_about_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = CostBudget(input_price_per_mtok=1, output_price_per_mtok=2, daily_limit=100)
    gate = BudgetGate(budget, _Unwritable())
    ticket = gate.begin("chat", model="model-1")
    usage = Usage(40, 2, estimated=False)
    with caplog.at_level(logging.WARNING, logger="llm_resilience.budget"):
        entry = ticket.record_hedge(usage, model="model-0")
        again = await ticket.arecord_hedge(usage)
    assert (entry.kind, entry.model, entry.surface) == (HEDGE_KIND, "model-0", "chat")
    assert again.model == "model-1"  # the gate's model when none is named
    assert sum("unwritable (OSError)" in r.getMessage() for r in caplog.records) == 2
    # Recording a loser never ends the call's own ticket.
    assert ticket.finish(usage) is not None


def test_a_cost_layer_knows_whether_a_hedged_chain_is_anywhere_below_it() -> None:
    class Wrapper:
        def __init__(self, inner: object) -> None:
            self.inner = inner

    plain = FallbackChain(["a", "b"])
    hedged = FallbackChain(["c", FallbackChain(["d", "e"], hedge_after=1)])
    assert not hedges_below(Wrapper(plain))
    assert hedges_below(Wrapper(Wrapper(hedged)))


# -- what a failed attempt held, freed without the cyclic GC ---------------------------

#: The failing attempt's error: one that propagates at once, or a transient one of the
#: last member left.
FAILURES = pytest.mark.parametrize(
    "error", [ValueError, ConnectionError], ids=["non-transient", "transient-last"]
)
#: Whether the failing attempt failed before its first content or after it (it won).
CONTENT = pytest.mark.parametrize("content", [0, 1], ids=["before-content", "after-content"])


def _reset() -> str:
    raise ConnectionError("reset")


async def _areset() -> str:
    raise ConnectionError("reset")


def _reset_stream() -> Iterator[str]:
    raise ConnectionError("reset")
    yield "never"


async def _areset_stream() -> AsyncIterator[str]:
    raise ConnectionError("reset")
    yield "never"


@pytest.mark.usefixtures("without_cyclic_gc")
@FAILURES
def test_a_failed_hedged_call_frees_the_provider_stream_its_attempt_held(
    held_stream: HeldStream, error: type[Exception]
) -> None:
    closed = threading.Event()

    def failing() -> str:
        held = held_stream(closed)
        raise error(f"failed with {held} open")

    chain = FallbackChain([_reset, failing], hedge_after=HEDGE)
    with pytest.raises(error):
        chain.invoke(call)
    assert closed.is_set(), "the failed attempt's stream waits for the cyclic GC"


@pytest.mark.usefixtures("without_cyclic_gc")
@FAILURES
async def test_a_failed_async_hedged_call_frees_the_provider_stream_its_attempt_held(
    held_stream: HeldStream, error: type[Exception]
) -> None:
    closed = threading.Event()

    async def failing() -> str:
        held = held_stream(closed)
        raise error(f"failed with {held} open")

    chain = FallbackChain([_areset, failing], hedge_after=HEDGE)
    with pytest.raises(error):
        await chain.ainvoke(call)
    assert closed.is_set(), "the failed attempt's stream waits for the cyclic GC"


@pytest.mark.usefixtures("without_cyclic_gc")
@FAILURES
@CONTENT
def test_a_failed_hedged_stream_frees_the_provider_stream_its_attempt_held(
    held_stream: HeldStream, error: type[Exception], content: int
) -> None:
    closed = threading.Event()

    def failing() -> Iterator[str]:
        held = held_stream(closed)
        yield from ["s0"][:content]
        raise error(f"failed with {held} open")

    chain = FallbackChain([_reset_stream, failing], hedge_after=HEDGE)
    chunks: list[str] = []
    with pytest.raises(error):
        chunks.extend(chain.stream(call))
    assert chunks == ["s0"][:content]
    assert closed.is_set(), "the failed attempt's stream waits for the cyclic GC"


@pytest.mark.usefixtures("without_cyclic_gc")
@FAILURES
@CONTENT
async def test_a_failed_async_hedged_stream_frees_the_provider_stream_its_attempt_held(
    held_stream: HeldStream, error: type[Exception], content: int
) -> None:
    closed = threading.Event()

    async def failing() -> AsyncIterator[str]:
        held = held_stream(closed)
        for chunk in ["s0"][:content]:
            yield chunk
        raise error(f"failed with {held} open")

    chain = FallbackChain([_areset_stream, failing], hedge_after=HEDGE)
    chunks: list[str] = []

    async def consume() -> None:
        async for chunk in chain.astream(call):
            chunks.append(chunk)

    with pytest.raises(error):
        await consume()
    assert chunks == ["s0"][:content]
    assert closed.is_set(), "the failed attempt's stream waits for the cyclic GC"


@pytest.mark.usefixtures("without_cyclic_gc")
def test_a_hedged_streams_loser_that_fails_late_frees_the_provider_stream_it_held(
    held_stream: HeldStream, release: threading.Event
) -> None:
    closed = threading.Event()

    def slow() -> Iterator[str]:
        held = held_stream(closed)
        release.wait(WAIT)
        raise ConnectionError(f"failed with {held} open")
        yield "never"

    def fast() -> Iterator[str]:
        yield from ("s0", "s1")

    chain = FallbackChain([slow, fast], hedge_after=HEDGE)
    assert list(chain.stream(call)) == ["s0", "s1"]
    release.set()  # the abandoned primary's read fails after the stream ended
    assert _settled()
    assert closed.is_set(), "the losing attempt's stream waits for the cyclic GC"


@pytest.mark.usefixtures("without_cyclic_gc")
def test_a_hedged_stream_left_early_frees_the_provider_stream_its_failed_attempt_held(
    held_stream: HeldStream,
) -> None:
    closed = threading.Event()

    def failing() -> Iterator[str]:
        held = held_stream(closed)
        yield "s0"
        raise ConnectionError(f"failed with {held} open")

    chain = FallbackChain([failing, _reset_stream], hedge_after=60)
    stream = chain.stream(call)
    assert next(stream) == "s0"
    assert _settled()  # its worker ran ahead and queued its error, never read
    stream.close()
    assert closed.is_set(), "the failed attempt's stream waits for the cyclic GC"


@pytest.mark.usefixtures("without_cyclic_gc")
async def test_an_async_hedged_stream_left_early_frees_the_provider_stream_its_failed_attempt_held(
    held_stream: HeldStream,
) -> None:
    closed = threading.Event()
    failed = asyncio.Event()

    async def failing() -> AsyncIterator[str]:
        held = held_stream(closed)
        yield "s0"
        failed.set()
        raise ConnectionError(f"failed with {held} open")

    chain = FallbackChain([failing, _areset_stream], hedge_after=60)
    stream = chain.astream(call)
    assert await anext(stream) == "s0"
    await failed.wait()  # its task ran ahead and queued its error, never read
    await stream.aclose()
    assert closed.is_set(), "the failed attempt's stream waits for the cyclic GC"
