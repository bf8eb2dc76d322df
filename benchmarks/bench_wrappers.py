"""Per-call overhead of every wrapper against the model it wraps, both frameworks.

Each wrapper is timed, with no failure, against the model it wraps called directly (the
floor), side by side in one run:

* LangChain (`invoke`/`ainvoke`/`stream`/`astream`, 5 chunks consumed to the end):
  ``FallbackChatModel([primary, secondary])``, ``RateLimitedChatModel`` and
  ``CostTrackedChatModel`` (an ``InMemoryCostLedger``) over the fake chat model of
  ``bench_fallback.py``, and LangChain's own ``primary.with_fallbacks([secondary])``;
  a second LangChain table times the failover path (the primary raises a real
  ``openai.RateLimitError`` on an ``httpx.Response(429)``), where the floor is the
  secondary alone;
* LlamaIndex (`chat`/`achat`/`stream_chat`/`astream_chat`): ``FallbackLLM``,
  ``RateLimitedLLM`` and ``CostTrackedLLM`` (an ``InMemoryCostLedger``) over
  ``MockLLM``, which reports no usage (so the cost layer counts both texts with
  tiktoken on every call), and ``CostTrackedLLM`` over `ReportingMockLLM`, which
  reports it as a provider does.

Limits are set so high that nobody waits or is refused. The method is
``bench_fallback.py``'s: interleaved rounds in a rotating order, a cell the median
per-call batch mean, a ratio the median of per-round ratios with its interquartile
range.

    python benchmarks/bench_wrappers.py            # ~70 s on 2 cores, 90 s at most
    python benchmarks/bench_wrappers.py --quick    # ~10 s, for a smoke run
    python benchmarks/bench_wrappers.py --profile fallback invoke  # cProfile one cell
    python benchmarks/bench_wrappers.py --cost-parts  # the cost layers' time, part by part

``--cost-parts`` times where a cost layer's time goes inside the call it wraps, by the
same interleaved method: the layer with nothing to meter (its frame: ``_begin`` and the
end hooks do nothing), the layer that admits each call but settles nothing, and the
whole layer, each beside the direct call (a LangChain stream, a ``ReportingMockLLM``
chat). A part's time in the call can differ from its time alone in a loop
(``bench_instructions.py`` counts its instructions): there its code stays in the CPU's
caches, here it runs between the framework's own.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import platform
import pstats
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import langchain_core
import llama_index.core
from _timing import Samples, Settings, run_async, run_sync
from bench_fallback import FakeChat, RateLimitedChat, configure_logging
from bench_fallback import async_call as langchain_async
from bench_fallback import sync_call as langchain_sync
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable
from llama_index.core.base.llms.types import (
    ChatMessage,
    CompletionResponse,
    CompletionResponseGen,
)
from llama_index.core.llms import LLM
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.llms.mock import MockLLM
from llama_index.resilience import CostTrackedLLM, FallbackLLM, RateLimitedLLM

from langchain_llm_resilience import CostTrackedChatModel, FallbackChatModel, RateLimitedChatModel
from langchain_llm_resilience._delegate import private_state
from llm_resilience import CostBudget
from llm_resilience.ledger import InMemoryCostLedger
from llm_resilience.ledger._protocol import _window_pairs, window_keys
from llm_resilience.money import EXACT, TOKENS_PER_MTOK

#: Far above any rate a benchmark reaches: nobody waits, nobody is refused.
REQUESTS_PER_MINUTE = 600_000_000
DAILY_LIMIT = 10**12
LLAMA_MESSAGES = [ChatMessage(role="user", content="Say ok.")]

#: The wrappers of each table, in column order, after ``direct``.
LANGCHAIN_OK = ("fallback", "with_fallbacks", "rate_limited", "cost_tracked")
LANGCHAIN_FAILOVER = ("fallback", "with_fallbacks")
LLAMA = ("fallback", "rate_limited", "cost_tracked")


def _budget() -> CostBudget:
    return CostBudget(3, 15, daily_limit=DAILY_LIMIT)


# -- LangChain ---------------------------------------------------------------------------


def langchain_contenders(path: str) -> dict[str, Runnable[Any, Any]]:
    """The runnables for ``path`` ("ok" or "failover"), ``direct`` first."""
    secondary = FakeChat()
    primary: BaseChatModel = FakeChat() if path == "ok" else RateLimitedChat()
    runnables: dict[str, Runnable[Any, Any]] = {
        "direct": primary if path == "ok" else secondary,
        "fallback": FallbackChatModel(models=[primary, secondary]),
        "with_fallbacks": primary.with_fallbacks([secondary]),
    }
    if path == "ok":
        runnables["rate_limited"] = RateLimitedChatModel(
            inner=primary, requests_per_minute=REQUESTS_PER_MINUTE
        )
        runnables["cost_tracked"] = CostTrackedChatModel(
            inner=primary, budget=_budget(), ledger=InMemoryCostLedger()
        )
    return runnables


# -- LlamaIndex --------------------------------------------------------------------------


#: The usage `ReportingMockLLM` reports, OpenAI-shaped as llama-index-llms-openai keeps it.
REPORTED_USAGE = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}


class ReportingMockLLM(MockLLM):
    """``MockLLM`` whose answers report their usage in ``raw`` (a stream on its last
    chunk), as a provider's do: a cost layer over it prices the report, where over
    ``MockLLM`` (which reports nothing) it must count both texts with tiktoken."""

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=prompt, raw={"usage": dict(REPORTED_USAGE)})

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        def chunks() -> CompletionResponseGen:
            last = len(prompt) - 1
            for position, character in enumerate(prompt):
                raw = {"usage": dict(REPORTED_USAGE)} if position == last else None
                yield CompletionResponse(text=prompt, delta=character, raw=raw)

        return chunks()


def llama_contenders() -> dict[str, LLM]:
    """``MockLLM`` direct and each LlamaIndex wrapper over it."""
    mock = MockLLM()
    return {
        "direct": mock,
        "fallback": FallbackLLM(llms=[mock, MockLLM()]),
        "rate_limited": RateLimitedLLM(inner=mock, requests_per_minute=REQUESTS_PER_MINUTE),
        "cost_tracked": CostTrackedLLM(inner=mock, budget=_budget(), ledger=InMemoryCostLedger()),
    }


def llama_reporting_contenders() -> dict[str, LLM]:
    """`ReportingMockLLM` direct and ``CostTrackedLLM`` over it."""
    mock = ReportingMockLLM()
    return {
        "direct": mock,
        "cost_tracked": CostTrackedLLM(inner=mock, budget=_budget(), ledger=InMemoryCostLedger()),
    }


def llama_sync(llm: LLM, shape: str) -> Callable[[], object]:
    if shape == "chat":
        return lambda: llm.chat(LLAMA_MESSAGES)
    return lambda: deque(llm.stream_chat(LLAMA_MESSAGES), maxlen=0)


def llama_async(llm: LLM, shape: str) -> Callable[[], Awaitable[object]]:
    if shape == "chat":
        return lambda: llm.achat(LLAMA_MESSAGES)

    async def consume() -> None:
        async for _ in await llm.astream_chat(LLAMA_MESSAGES):
            pass

    return consume


# -- reporting ---------------------------------------------------------------------------


def _ratio(samples: Samples, top: str, bottom: str) -> str:
    """Median over rounds of ``top``'s batch mean over ``bottom``'s, with the IQR."""
    ratios = [a / b for a, b in zip(samples[top], samples[bottom], strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return f"**{median:.2f}** ({q1:.2f}-{q3:.2f})"


def table(title: str, wrappers: tuple[str, ...], results: dict[str, Samples]) -> str:
    """One row per call; µs per contender, then each wrapper over ``direct`` (and
    ``fallback`` over ``with_fallbacks`` when both ran)."""
    anchored = "with_fallbacks" in wrappers
    names = ("direct", *wrappers)
    heads = [f"{name} µs" for name in names]
    heads += [f"{name}/direct" for name in wrappers if name != "with_fallbacks"]
    if anchored:
        heads.append("fallback/with_fallbacks")
    lines = [
        f"### {title}",
        "",
        "| call | rounds | " + " | ".join(heads) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in heads) + " |",
    ]
    for call, samples in results.items():
        cells = [f"{statistics.median(samples[name]) / 1000:.0f}" for name in names]
        cells += [_ratio(samples, name, "direct") for name in wrappers if name != "with_fallbacks"]
        if anchored:
            cells.append(_ratio(samples, "fallback", "with_fallbacks"))
        lines.append(f"| {call} | {len(samples['direct'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def machine() -> str:
    return (
        f"Python {platform.python_version()}, langchain-core {langchain_core.__version__}, "
        f"llama-index-core {llama_index.core.__version__}, {os.cpu_count()} CPU(s), "
        f"{platform.machine()} {platform.system()}; load average {_load()}"
    )


def benchmark(settings: Settings) -> str:
    out = [f"Machine: {machine()}", ""]
    for path, wrappers, title in (
        ("ok", LANGCHAIN_OK, "LangChain, no failure"),
        ("failover", LANGCHAIN_FAILOVER, "LangChain, failover (429)"),
    ):
        runnables = langchain_contenders(path)
        results: dict[str, Samples] = {}
        for shape in ("invoke", "stream"):
            sync = {name: langchain_sync(runnables[name], shape) for name in ("direct", *wrappers)}
            results[shape] = run_sync(sync, settings)
            aio = {name: langchain_async(runnables[name], shape) for name in ("direct", *wrappers)}
            results[f"a{shape}"] = run_async(aio, settings)
        out += [table(title, wrappers, results), ""]
    llms = llama_contenders()
    results = {}
    for shape in ("chat", "stream_chat"):
        results[shape] = run_sync({n: llama_sync(llms[n], shape) for n in llms}, settings)
        results[f"a{shape}"] = run_async({n: llama_async(llms[n], shape) for n in llms}, settings)
    out += [table("LlamaIndex over MockLLM, no failure", LLAMA, results), ""]
    llms = llama_reporting_contenders()
    results = {}
    for shape in ("chat", "stream_chat"):
        results[shape] = run_sync({n: llama_sync(llms[n], shape) for n in llms}, settings)
        results[f"a{shape}"] = run_async({n: llama_async(llms[n], shape) for n in llms}, settings)
    title = "LlamaIndex over a MockLLM that reports its usage, no failure"
    out += [table(title, ("cost_tracked",), results), ""]
    return "\n".join(out)


# -- the cost layers, part by part ------------------------------------------------------


class _FramedChat(CostTrackedChatModel):
    """The LangChain cost layer with nothing to meter: its frame alone."""

    def _begin(self, messages: Any, kwargs: Any) -> Any:
        return None

    def _end_stream(self, context: Any, messages: Any, chunks: Any) -> None:
        return None


class _AdmittingChat(CostTrackedChatModel):
    """The LangChain cost layer that admits each call and settles nothing."""

    def _end_stream(self, context: Any, messages: Any, chunks: Any) -> None:
        return None


class _FramedLLM(CostTrackedLLM):
    """The LlamaIndex cost layer with nothing to meter: its frame alone."""

    def _begin(self, kind: Any, request: Any, kwargs: Any) -> Any:
        return None

    def _end(self, context: Any, response: Any) -> None:
        return None


class _AdmittingLLM(CostTrackedLLM):
    """The LlamaIndex cost layer that admits each call and settles nothing."""

    def _end(self, context: Any, response: Any) -> None:
        return None


class _BareTicket:
    """What a bare meter keeps between a call's start and end."""

    __slots__ = ("ledger", "price")


def _bare_admit(meter: Any) -> _BareTicket:
    """A bare meter's admission: the clock, and the day's and month's totals read under
    the in-memory ledger's lock and compared with the limit."""
    gate = meter.gate
    ledger = gate.ledger
    now = datetime.now(UTC)
    day, month = _window_pairs.get(now.toordinal()) or window_keys(now)
    with ledger._lock:
        spent_day = ledger._totals.get((day, None), _ZERO)
        spent_month = ledger._totals.get((month, None), _ZERO)
    if spent_day >= DAILY_LIMIT or spent_month >= DAILY_LIMIT:
        raise RuntimeError("the bench's limit was reached")
    ticket = _BareTicket()
    ticket.ledger, ticket.price = ledger, gate.budget.price_for(None)
    return ticket


def _bare_record(ticket: _BareTicket, input_tokens: int, output_tokens: int) -> None:
    """A bare meter's settle: the counts priced at the surface prices, the entry's row
    appended to the in-memory ledger and its cost added to the day's and month's totals."""
    ledger, price = ticket.ledger, ticket.price
    total = EXACT.add(
        EXACT.multiply(input_tokens, price.input_per_mtok),
        EXACT.multiply(output_tokens, price.output_per_mtok),
    )
    cost = EXACT.divide(total, TOKENS_PER_MTOK)
    now = datetime.now(UTC)
    entry_id = ((time.time_ns() << 64) | random.getrandbits(64)).to_bytes(16, "big").hex()
    row = (now, "chat", input_tokens, output_tokens, cost, 0, None, False)
    row += ("chat", None, entry_id, 0, 0, 0, 0, None, None)
    day, month = _window_pairs.get(now.toordinal()) or window_keys(now)
    with ledger._lock:
        ledger._entries.append(row)
        ledger._rows = True
        totals = ledger._totals
        totals[(day, None)] = EXACT.add(totals.get((day, None), _ZERO), cost)
        totals[(month, None)] = EXACT.add(totals.get((month, None), _ZERO), cost)


class _BareChat(CostTrackedChatModel):
    """A floor for metering inside the call: the LangChain cost layer stripped to its
    arithmetic (`_bare_admit`, then the usage read from the chunks in one pass and
    `_bare_record`). Nothing else: no served-model name, scope, hold, telemetry,
    guessed-price count, hedge binding or check (the in-memory ledger's internals, read
    directly)."""

    def _begin(self, messages: Any, kwargs: Any) -> Any:
        return _bare_admit(private_state(self)["_meter"])

    def _end_stream(self, context: Any, messages: Any, chunks: Any) -> None:
        read = self._streamed(messages, chunks)
        assert read is not None, "the bench's stream reports its usage"
        _bare_record(context, read[0].input_tokens, read[0].output_tokens)


class _BareLLM(CostTrackedLLM):
    """`_BareChat` for LlamaIndex: the counts read from the answer's OpenAI-shaped
    ``raw["usage"]`` directly."""

    def _begin(self, kind: Any, request: Any, kwargs: Any) -> Any:
        return _bare_admit(private_state(self)["_meter"])

    def _end(self, context: Any, response: Any) -> None:
        if response is not None:
            usage = response.raw["usage"]
            _bare_record(context, usage["prompt_tokens"], usage["completion_tokens"])


_ZERO = Decimal(0)

COST_PARTS = ("frame", "admission", "bare", "cost_tracked")


def _parts(inner: Any, kinds: tuple[type[Any], ...], call: Callable[[Any], Any]) -> dict[str, Any]:
    """``inner`` called directly, and each of `COST_PARTS` (one layer class each, in
    order) over it, each with its own in-memory ledger."""
    calls = {"direct": call(inner)}
    for name, kind in zip(COST_PARTS, kinds, strict=True):
        calls[name] = call(kind(inner=inner, budget=_budget(), ledger=InMemoryCostLedger()))
    return calls


def cost_parts(settings: Settings) -> str:
    """The cost layers' time inside the calls they wrap, part by part."""
    streams = _parts(
        FakeChat(),
        (_FramedChat, _AdmittingChat, _BareChat, CostTrackedChatModel),
        lambda model: langchain_sync(model, "stream"),
    )
    chats = _parts(
        ReportingMockLLM(),
        (_FramedLLM, _AdmittingLLM, _BareLLM, CostTrackedLLM),
        lambda llm: llama_sync(llm, "chat"),
    )
    out = [f"Machine: {machine()}", ""]
    title = "CostTrackedChatModel, part by part"
    out += [table(title, COST_PARTS, {"stream": run_sync(streams, settings)}), ""]
    title = "CostTrackedLLM over ReportingMockLLM, part by part"
    out += [table(title, COST_PARTS, {"chat": run_sync(chats, settings)}), ""]
    return "\n".join(out)


# -- profiling ---------------------------------------------------------------------------


def profile(framework: str, name: str, shape: str, calls: int) -> None:
    """cProfile ``calls`` sync and async calls of one contender; the 25 costliest
    functions by own time. cProfile inflates cheap calls: read it for where, not how much."""
    if framework in ("llama", "llama-reporting"):
        contenders = llama_contenders() if framework == "llama" else llama_reporting_contenders()
        target: Any = contenders[name]
        sync, aio = llama_sync(target, shape), llama_async(target, shape)
    else:
        target = langchain_contenders("ok" if framework == "langchain" else "failover")[name]
        sync, aio = langchain_sync(target, shape), langchain_async(target, shape)

    async def repeat(n: int) -> None:
        for _ in range(n):
            await aio()

    for label, run in (
        ("sync", lambda n: [sync() for _ in range(n)]),
        ("async", lambda n: asyncio.run(repeat(n))),
    ):
        run(200)
        profiler = cProfile.Profile()
        profiler.enable()
        run(calls)
        profiler.disable()
        print(f"\n=== {framework} {name} {shape}, {label}, {calls} calls ===")
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(25)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short run (a few seconds)")
    parser.add_argument(
        "--profile",
        nargs=3,
        metavar=("FRAMEWORK", "CONTENDER", "SHAPE"),
        help="cProfile one cell: langchain|failover|llama|llama-reporting, a contender, invoke|stream|chat|"
        "stream_chat",
    )
    parser.add_argument(
        "--cost-parts", action="store_true", help="the cost layers' time, part by part"
    )
    args = parser.parse_args(argv)
    # Offline and deterministic: no LangSmith tracer may attach itself.
    for variable in ("LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING", "LANGSMITH_TRACING"):
        os.environ.pop(variable, None)
    configure_logging()
    if args.profile:
        framework, name, shape = args.profile
        profile(framework, name, shape, calls=3_000)
        return 0
    if args.quick:
        settings = Settings(rounds=40, warmup=3, batch_ns=2_000_000, budget_s=1.0)
    else:
        settings = Settings(rounds=300, warmup=10, batch_ns=3_000_000, budget_s=6.0)
    started = time.perf_counter()
    print(cost_parts(settings) if args.cost_parts else benchmark(settings))
    print(
        f"Up to {settings.rounds} rounds (+{settings.warmup} warm-up) of ~"
        f"{settings.batch_ns / 1e6:.0f} ms batches per contender, {settings.budget_s:.1f} s "
        f"per call shape at most; {time.perf_counter() - started:.1f} s; load average at "
        f"the end {_load()}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
