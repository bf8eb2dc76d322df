"""The offline outage demo behind ``llm-resilience demo``.

Two local servers stand in for two providers: an OpenAI-compatible primary and an
Anthropic-compatible secondary ([`llm_resilience.testing.FaultInjectingServer`][]).
The real ``ChatOpenAI`` and ``ChatAnthropic`` clients talk HTTP to them through the
stack ``ResilienceBuilder`` builds (fallback chain, rate limiter, spend budget with a
``SqlCostLedger``), in three phases: the primary fails in the ways providers do; a burst
waits at the rate limiter; long requests run until the budget refuses one. The demo
ends with the spend per model read back from the ledger: a SQLite file in a temporary
folder (removed at the end) unless ``--db URL`` names one. Everything runs on 127.0.0.1
in about ten seconds and stops when the demo ends.

The core's ``llm-resilience`` command finds `command` through the ``llm_resilience.cli``
entry point that this package's ``pyproject.toml`` registers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable

from langchain_llm_resilience.builder import ResilienceBuilder
from langchain_llm_resilience.fallback import SERVED_BY_KEY, STREAM_RESTART_EVENT
from llm_resilience.budget import CostBudget, ModelPrice
from llm_resilience.cli import Command
from llm_resilience.errors import BudgetExceededError
from llm_resilience.ratelimit import TokenBucketRateLimiter
from llm_resilience.served import served_path
from llm_resilience.spend import SpendReport, spend_report
from llm_resilience.testing import Fault, FaultInjectingServer

__all__ = ["command", "run_demo"]

_PRIMARY = "gpt-4o-mini"
_SECONDARY = "claude-haiku-4-5"
_PRIMARY_REPLY = "Paris is the capital of France, served by the primary."
_SECONDARY_REPLY = "Paris is the capital of France, served by the secondary."
#: Generous for 127.0.0.1 even on a loaded machine; a hang costs the demo this long once.
_TIMEOUT = 2.0
#: A bucket of 10 permits that gains 1 a second: a burst of 12 makes the last 2 or more wait.
_REQUESTS_PER_MINUTE = 10
_BURST = 12
#: Sized so that one long summary fits after the outage and the burst and a second does not.
_BUDGET = CostBudget(
    daily_limit="0.0008",
    prices={_PRIMARY: ModelPrice("0.15", "0.60"), _SECONDARY: ModelPrice(1, 5)},
)
_MAX_SUMMARIES = 5
_DOCUMENT = "The quarterly report says revenue grew and costs fell. " * 500

_Message = AIMessage | AIMessageChunk


@dataclass
class _Outcome:
    scenario: str
    call: str
    served_by: str
    fallbacks: int
    restarts: int
    millis: float


@dataclass
class _Tally:
    """What the demo asked and what it got, to check against the ledger at the end."""

    answered: int = 0
    refused: int = 0


class _Narrator(logging.Handler):
    """Prints the fallback chain's warnings as they happen, and counts them."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(level=logging.WARNING)
        self.out = out
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        print(f"      ! {record.getMessage()}", file=self.out, flush=True)


class _RestartListener(BaseCallbackHandler):
    """Hears the custom event a restarted stream sends, as a consumer would."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.restarts = 0
        self.pending = False

    def take(self) -> bool:
        """Whether a restart happened since the last look (the consumer then drops)."""
        pending, self.pending = self.pending, False
        return pending

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        if name == STREAM_RESTART_EVENT:
            self.restarts += 1
            self.pending = True
            print(
                f"      ~ restart event: dropping {data['chunks']} chunk(s) from client "
                f"{data['failed_client']}, client {data['next_client']} starts over",
                file=self.out,
                flush=True,
            )


def _served(message: AIMessage | AIMessageChunk) -> str:
    path = served_path(message.response_metadata.get(SERVED_BY_KEY))
    name = message.response_metadata.get("model_name", "?")
    role = {0: "primary", 1: "secondary"}.get(path[0], "?") if path else "?"
    return f"{role} ({name})"


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="URL",
        help="record the demo's spend in this ledger (sqlite:///spend.db, "
        "postgresql+psycopg://...); default: a SQLite file in a temporary folder, "
        "removed at the end",
    )


def _run(arguments: argparse.Namespace) -> int:
    try:
        import langchain_anthropic  # noqa: F401
        import langchain_openai  # noqa: F401
    except ImportError as error:
        reason = " ".join(str(error).split())  # one line, whatever the message
        print(
            f"llm-resilience demo needs the provider clients ({reason}): "
            'pip install "langchain-llm-resilience[demo]"',
            file=sys.stderr,
        )
        return 2
    return run_demo(sys.stdout, db_url=arguments.db)


#: ``llm-resilience demo``, registered in the ``llm_resilience.cli`` entry-point group.
command = Command(
    help="run an offline simulated provider outage through fallback, rate limiting and a "
    "spend budget",
    run=_run,
    configure=_configure,
)


def run_demo(out: TextIO, db_url: str | None = None) -> int:
    """Run the demo, printing to ``out``; returns a process exit code.

    Spend goes to ``db_url`` (any [`SqlCostLedger`][llm_resilience.SqlCostLedger] URL) if given,
    else to a SQLite file in a temporary folder that is removed when the demo ends.
    Only entries of this run (its own budget scope) are gated and reported, so a
    ``db_url`` holding earlier spend neither stops nor skews the demo.
    """
    from langchain_anthropic import ChatAnthropic
    from langchain_openai import ChatOpenAI

    started = time.perf_counter()
    run_scope = f"llm-resilience-demo-{uuid.uuid4().hex[:12]}"
    narrator = _Narrator(out)
    fallback_logger = logging.getLogger("llm_resilience.fallback")
    previous_propagate = fallback_logger.propagate
    with contextlib.ExitStack() as cleanup:
        if db_url is None:
            folder = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="llm-resilience-"))
            db_url = f"sqlite:///{Path(folder) / 'spend.db'}"
        primary = cleanup.enter_context(FaultInjectingServer(reply=_PRIMARY_REPLY, name="primary"))
        secondary = cleanup.enter_context(
            FaultInjectingServer(reply=_SECONDARY_REPLY, name="secondary")
        )
        members = [
            ChatOpenAI(
                model=_PRIMARY,
                base_url=primary.openai_base_url,
                api_key="demo-key",  # type: ignore[arg-type]
                max_retries=0,
                timeout=10,
            ),
            ChatAnthropic(
                model_name=_SECONDARY,
                base_url=secondary.anthropic_base_url,
                api_key="demo-key",  # type: ignore[arg-type]
                max_retries=0,
                timeout=10,
                stop=None,
            ),
        ]
        limiter = TokenBucketRateLimiter(requests_per_minute=_REQUESTS_PER_MINUTE)
        try:
            stack = (
                ResilienceBuilder()
                .use_fallback_chain(members, per_client_timeout=_TIMEOUT)
                .use_rate_limiting(chat_limiter=limiter)
                .use_sql_cost_ledger(db_url)
                .use_cost_budgeting(_BUDGET, scope=run_scope)
                .build()
            )
        except Exception as error:  # a bad URL, or whatever the database driver raises
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            print(f"llm-resilience demo: cannot open the ledger: {reason}", file=sys.stderr)
            return 2
        model: Any = stack.chat
        ledger = model.gate.ledger
        cleanup.callback(ledger.close)
        run_started = datetime.now(UTC)
        print(
            "llm-resilience demo: prompt | CostTracked(RateLimited(Fallback([ChatOpenAI -> "
            f"{primary.openai_base_url}, ChatAnthropic -> {secondary.anthropic_base_url}])))\n"
            f"  per_client_timeout={_TIMEOUT}s, {_REQUESTS_PER_MINUTE} requests/minute, "
            f"daily limit {_BUDGET.daily_limit} for this run, ledger {ledger.url}\n",
            file=out,
            flush=True,
        )
        fallback_logger.addHandler(narrator)
        fallback_logger.propagate = False
        cleanup.callback(setattr, fallback_logger, "propagate", previous_propagate)
        cleanup.callback(fallback_logger.removeHandler, narrator)
        tally = _Tally()
        outcomes: list[_Outcome] = []

        async def play() -> None:
            print("Phase 1/3: an outage of the primary", file=out, flush=True)
            await _outage(model, primary, narrator, out, outcomes, tally)
            _print_summary(outcomes, out)
            print("\nPhase 2/3: the primary is back; a burst meets the rate limit", file=out)
            await _burst(model, limiter, out, tally)
            print("\nPhase 3/3: long summaries until the spend budget says no", file=out)
            await _until_refused(model, out, tally)

        try:
            asyncio.run(play())
        except KeyboardInterrupt:
            print("\nInterrupted: stopping the local servers.", file=out)
            return 130
        except Exception as error:  # not expected; say so in one line, servers still stop
            print(f"\nllm-resilience demo failed: {type(error).__name__}: {error}", file=out)
            return 1
        report = spend_report(
            ledger, by="model", since=run_started, scope=run_scope, budget=_BUDGET
        )
        print(f"\nSpend of this run, per model (ledger {ledger.url})", file=out)
        _print_spend_table(report, out)
        print(
            f"\n{tally.answered} calls answered and recorded ({report.total.calls} ledger "
            f"entries), {tally.refused} refused by the budget.",
            file=out,
        )
    print(
        f"Both local servers are stopped. Finished in {time.perf_counter() - started:.1f} s.",
        file=out,
    )
    return 0


async def _outage(
    model: Any,
    primary: FaultInjectingServer,
    narrator: _Narrator,
    out: TextIO,
    outcomes: list[_Outcome],
    tally: _Tally,
) -> None:
    """The primary fails the ways providers do; each call still gets an answer."""
    listener = _RestartListener(out)
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer in one sentence."), ("user", "What is the capital of {country}?")]
    )
    chain: Runnable[dict[str, str], Any] = prompt | model
    config: Any = {"callbacks": [listener]}
    question = {"country": "France"}

    # One event loop for the whole demo: async SDK clients keep connection pools
    # bound to the loop that opened them, so sync calls run on worker threads.
    async def invoke() -> AIMessage:
        return await asyncio.to_thread(chain.invoke, question, config)

    async def ainvoke() -> AIMessage:
        return await chain.ainvoke(question, config)  # type: ignore[no-any-return]

    def merge_sync() -> AIMessageChunk:
        merged: AIMessageChunk | None = None
        for chunk in chain.stream(question, config):
            if listener.take():
                _report_drop(merged, out)
                merged = None
            merged = chunk if merged is None else merged + chunk
        assert merged is not None
        return merged

    async def stream() -> AIMessageChunk:
        return await asyncio.to_thread(merge_sync)

    async def astream() -> AIMessageChunk:
        merged: AIMessageChunk | None = None
        async for chunk in chain.astream(question, config):
            if listener.take():
                _report_drop(merged, out)
                merged = None  # what the failed client said is not part of the answer
            merged = chunk if merged is None else merged + chunk
        assert merged is not None
        return merged

    scenarios: list[tuple[str, Fault, str, Callable[[], Awaitable[_Message]]]] = [
        ("primary healthy", Fault.ok(), "invoke", invoke),
        ("primary answers 429 Too Many Requests", Fault.status(429), "invoke", invoke),
        ("primary answers 503 Service Unavailable", Fault.status(503), "ainvoke", ainvoke),
        (f"primary hangs past {_TIMEOUT}s", Fault.hang(), "stream", stream),
        ("primary drops the stream mid-body", Fault.drop_mid_stream(3), "astream", astream),
    ]
    for number, (title, fault, call, run) in enumerate(scenarios, start=1):
        print(f"[{number}/{len(scenarios)}] {title}  ({call})", file=out, flush=True)
        primary.script(fault)
        warnings_before, restarts_before = narrator.count, listener.restarts
        started = time.perf_counter()
        message = await run()
        millis = (time.perf_counter() - started) * 1000
        tally.answered += 1
        served = _served(message)
        print(f"      = {served}: {message.content!s}\n", file=out, flush=True)
        outcomes.append(
            _Outcome(
                title,
                call,
                served,
                narrator.count - warnings_before,
                listener.restarts - restarts_before,
                millis,
            )
        )


def _report_drop(merged: AIMessageChunk | None, out: TextIO) -> None:
    """Say what the consumer forgets on a restart: the failed client's partial answer."""
    shown = len(str(merged.content).split()) if merged is not None else 0
    print(f"      ~ consumer drops the {shown} word(s) streamed before the restart", file=out)


async def _burst(model: Any, limiter: TokenBucketRateLimiter, out: TextIO, tally: _Tally) -> None:
    """More calls at once than the bucket holds: the rest wait their turn, none fail."""
    print(
        f"      {_BURST} calls at once; the bucket holds {limiter.capacity} permits and "
        f"gains {limiter.permits_per_period} a second",
        file=out,
        flush=True,
    )
    peak_queue = 0
    done = asyncio.Event()

    async def watch_queue() -> None:
        nonlocal peak_queue
        while not done.is_set():
            peak_queue = max(peak_queue, limiter.queued)
            await asyncio.sleep(0.02)

    started = time.perf_counter()
    answered = 0

    async def call(number: int) -> None:
        nonlocal answered
        message = await model.ainvoke("What is the capital of France?")
        answered += 1
        tally.answered += 1
        seconds = time.perf_counter() - started
        print(
            f"      call {number:>2} answered at +{seconds:.1f} s by {_served(message)} "
            f"({answered}/{_BURST})",
            file=out,
            flush=True,
        )

    watcher = asyncio.create_task(watch_queue())
    try:
        await asyncio.gather(*(call(number) for number in range(1, _BURST + 1)))
    finally:
        done.set()
        await watcher
    print(
        f"      = {answered} answered in {time.perf_counter() - started:.1f} s; at most "
        f"{peak_queue} waited for a permit at once",
        file=out,
        flush=True,
    )


async def _until_refused(model: Any, out: TextIO, tally: _Tally) -> None:
    """Expensive calls until the budget gate refuses one, before it reaches a provider."""
    request = f"Summarize this report in one sentence:\n{_DOCUMENT}"
    for number in range(1, _MAX_SUMMARIES + 1):
        print(f"[{number}] a long summary ({len(_DOCUMENT.split())} words in)", file=out)
        try:
            message = await model.ainvoke(request)
        except BudgetExceededError as refusal:
            tally.refused += 1
            print(f"      x refused, no provider called: {refusal}", file=out, flush=True)
            return
        tally.answered += 1
        print(f"      = {_served(message)}", file=out, flush=True)
    print(f"      (no refusal after {_MAX_SUMMARIES} calls)", file=out, flush=True)


def _print_table(headers: tuple[str, ...], rows: Sequence[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    for row in [headers, tuple("-" * width for width in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def _print_spend_table(report: SpendReport, out: TextIO) -> None:
    """The report's rows, one per model, and its total; costs exact, as stored."""
    cells = [
        (
            "total" if row is report.total else row.key or "(unknown)",
            str(row.calls),
            str(row.input_tokens),
            str(row.output_tokens),
            str(row.estimated_calls),
            str(row.cost),
        )
        for row in (*report.rows, report.total)
    ]
    headers = ("model", "calls", "input tokens", "output tokens", "estimated", "cost")
    _print_table(headers, cells, out)
    for window, left in report.remaining.items():
        print(f"left of this run's {window} budget: {left}", file=out)


def _print_summary(outcomes: list[_Outcome], out: TextIO) -> None:
    headers = ("#", "scenario", "call", "served by", "fallbacks", "restarts", "ms")
    rows = [
        (
            str(number),
            outcome.scenario,
            outcome.call,
            outcome.served_by,
            str(outcome.fallbacks),
            str(outcome.restarts),
            f"{outcome.millis:.0f}",
        )
        for number, outcome in enumerate(outcomes, start=1)
    ]
    print("Outage summary", file=out)
    _print_table(headers, rows, out)
    served = sum(1 for outcome in outcomes if outcome.served_by.startswith("secondary"))
    print(
        f"{len(outcomes)} calls, {len(outcomes)} answered; {served} served by the secondary "
        f"after the primary failed.",
        file=out,
    )
