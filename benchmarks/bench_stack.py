"""Per-call overhead of the whole stack against the closest LangChain-only equivalent.

Seven contenders answer the same offline request from a fake model that replies at once
with usage (no network), in one process, interleaved:

* ``bare``: the fake model on its own (the floor);
* ``langchain``: LangChain alone, as close as it gets: ``primary.with_fallbacks([secondary])``,
  each model with an ``InMemoryRateLimiter`` (``rate_limiter=``), and a
  ``UsageMetadataCallbackHandler`` passed with every call to add usage up;
* ``langchain_sqlite``: ``langchain`` plus what a LangChain user writes to keep usage
  across restarts: a callback handler that inserts one row per call into a SQLite file
  (``sqlite3``, WAL, ``synchronous=NORMAL``, one commit per call), the anchor for our
  SQLite ledger;
* ``ours_memory``: ``CostTrackedChatModel(RateLimitedChatModel(FallbackChatModel([primary,
  secondary])))`` with an ``InMemoryCostLedger``;
* ``ours_sqlite``: the same with a ``SqlCostLedger`` on a SQLite file (one row per call);
* ``ours_sqlite_behind``: the same with ``SqlCostLedger(write_behind=WRITE_BEHIND)``: the
  entry is queued and committed by the ledger's writer thread (opt-in; a crash may lose
  the last interval's entries);
* ``ours_strict``: ``ours_memory`` with ``strict=True`` (a hold reserved and settled per call).

Ours does strictly more per call: a spend gate read before the call (and a refusal once a
limit is reached), a ledger entry priced for the member that served, a token bucket that
is reconciled with real usage, failover on a classifier that tells transient errors from
permanent ones. The limits are set so high that no contender ever waits or refuses.

Method (as ``bench_fallback.py``): rounds of one batch per contender, the order rotating
every round; a cell is the median over rounds of the per-call batch mean; a ratio is the
median of per-round ratios, with the interquartile range. ``gc`` stays enabled.

    python benchmarks/bench_stack.py            # ~6 s on 2 cores
    python benchmarks/bench_stack.py --quick    # ~2 s, for a smoke run
    python benchmarks/bench_stack.py --profile  # cProfile of ours (memory ledger) instead
    python benchmarks/bench_stack.py --floor    # the SQLite work per call alone
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import logging
import os
import platform
import pstats
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import langchain_core
from _timing import Samples, Settings, run_async, run_sync
from langchain_core.callbacks import BaseCallbackHandler, UsageMetadataCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult, LLMResult
from langchain_core.rate_limiters import InMemoryRateLimiter
from langchain_core.runnables import Runnable, RunnableConfig

from langchain_llm_resilience import CostTrackedChatModel, FallbackChatModel, RateLimitedChatModel
from llm_resilience import CostBudget
from llm_resilience.ledger import InMemoryCostLedger, SqlCostLedger

MESSAGES: list[BaseMessage] = [HumanMessage(content="Say ok.")]
STREAM_TOKENS = ("o", "k", ",", " fine", ".")
CONTENDERS = (
    "bare",
    "langchain",
    "langchain_sqlite",
    "ours_memory",
    "ours_sqlite",
    "ours_sqlite_behind",
    "ours_strict",
)
#: ``SqlCostLedger(write_behind=...)`` of ``ours_sqlite_behind``: committed at least this often.
WRITE_BEHIND = 0.05
#: Far above any rate a benchmark reaches: nobody waits, nobody is refused.
REQUESTS_PER_MINUTE = 600_000_000
DAILY_LIMIT = 10**12


def _usage() -> UsageMetadata:
    return {"input_tokens": 12, "output_tokens": 5, "total_tokens": 17}


class FakeChat(BaseChatModel):
    """Answers a fixed reply with usage and a model name, at once; streams 5 chunks."""

    model_name: str = "gpt-4o-mini"

    @property
    def _llm_type(self) -> str:
        return "bench-fake"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        message = AIMessage(
            content="ok, fine.",
            usage_metadata=_usage(),
            response_metadata={"model_name": self.model_name},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        return self._generate(messages, stop, run_manager, **kw)

    def _chunks(self) -> Iterator[ChatGenerationChunk]:
        last = len(STREAM_TOKENS) - 1
        for position, token in enumerate(STREAM_TOKENS):
            done = position == last
            message = AIMessageChunk(
                content=token,
                usage_metadata=_usage() if done else None,
                response_metadata={"model_name": self.model_name} if done else {},
            )
            yield ChatGenerationChunk(message=message)

    def _stream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> Iterator[ChatGenerationChunk]:
        yield from self._chunks()

    async def _astream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in self._chunks():
            yield chunk


# -- contenders --------------------------------------------------------------------------


class SqliteUsageHandler(BaseCallbackHandler):
    """Keeps each call's model and token counts in a SQLite file, one commit per call."""

    def __init__(self, path: Path) -> None:
        self.connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.connection.execute("PRAGMA journal_mode = WAL")
        self.connection.execute("PRAGMA synchronous = NORMAL")
        self.connection.execute(
            "CREATE TABLE IF NOT EXISTS usage (ts REAL, model TEXT, input INTEGER, output INTEGER)"
        )
        self.lock = threading.Lock()

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        message = getattr(response.generations[0][0], "message", None)
        usage = getattr(message, "usage_metadata", None) or {}
        model = message.response_metadata.get("model_name") if message is not None else None
        with self.lock:
            self.connection.execute(
                "INSERT INTO usage VALUES (?, ?, ?, ?)",
                (time.time(), model, usage.get("input_tokens"), usage.get("output_tokens")),
            )


@dataclass
class Contender:
    runnable: Runnable[Any, Any]
    config: RunnableConfig | None = None


def _ours(ledger: object, *, strict: bool = False) -> CostTrackedChatModel:
    chain = FallbackChatModel(models=[FakeChat(), FakeChat(model_name="gpt-4.1-mini")])
    return CostTrackedChatModel(
        inner=RateLimitedChatModel(inner=chain, requests_per_minute=REQUESTS_PER_MINUTE),
        budget=CostBudget(3, 15, daily_limit=DAILY_LIMIT, strict=strict),
        ledger=ledger,
    )


def contenders(sqlite_path: Path, anchor_path: Path, behind_path: Path) -> dict[str, Contender]:
    limiter = InMemoryRateLimiter(
        requests_per_second=REQUESTS_PER_MINUTE / 60, max_bucket_size=REQUESTS_PER_MINUTE / 60
    )
    primary = FakeChat(rate_limiter=limiter)
    secondary = FakeChat(model_name="gpt-4.1-mini", rate_limiter=limiter)
    usage = UsageMetadataCallbackHandler()
    return {
        "bare": Contender(FakeChat()),
        "langchain": Contender(primary.with_fallbacks([secondary]), {"callbacks": [usage]}),
        "langchain_sqlite": Contender(
            primary.with_fallbacks([secondary]),
            {"callbacks": [usage, SqliteUsageHandler(anchor_path)]},
        ),
        "ours_memory": Contender(_ours(InMemoryCostLedger())),
        "ours_sqlite": Contender(_ours(SqlCostLedger(f"sqlite:///{sqlite_path}"))),
        "ours_sqlite_behind": Contender(
            _ours(SqlCostLedger(f"sqlite:///{behind_path}", write_behind=WRITE_BEHIND))
        ),
        "ours_strict": Contender(_ours(InMemoryCostLedger(), strict=True)),
    }


def sync_call(contender: Contender, shape: str) -> Callable[[], object]:
    runnable, config = contender.runnable, contender.config
    if shape == "invoke":
        return lambda: runnable.invoke(MESSAGES, config)
    return lambda: deque(runnable.stream(MESSAGES, config), maxlen=0)


def async_call(contender: Contender, shape: str) -> Callable[[], Awaitable[object]]:
    runnable, config = contender.runnable, contender.config
    if shape == "invoke":
        return lambda: runnable.ainvoke(MESSAGES, config)

    async def consume() -> None:
        async for _ in runnable.astream(MESSAGES, config):
            pass

    return consume


# -- reporting ---------------------------------------------------------------------------


def _us(values: list[float]) -> float:
    return statistics.median(values) / 1000


def _ratio(samples: Samples, top: str, bottom: str) -> str:
    """Median over rounds of ``top``'s batch mean over ``bottom``'s, with the IQR."""
    ratios = [a / b for a, b in zip(samples[top], samples[bottom], strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return f"**{median:.2f}** ({q1:.2f}-{q3:.2f})"


def _overhead(samples: Samples, name: str) -> float:
    """Median over rounds of ``name``'s per-call time minus the bare model's, in µs."""
    return (
        statistics.median(a - b for a, b in zip(samples[name], samples["bare"], strict=True)) / 1000
    )


def table(title: str, results: dict[str, Samples]) -> str:
    lines = [
        f"### {title}",
        "",
        "| path | rounds | bare µs | LangChain-only µs | LangChain-only + SQLite µs "
        "| ours, memory µs | ours, SQLite µs | ours, SQLite write-behind µs | ours, strict µs "
        "| memory / LangChain | strict / LangChain | SQLite / LangChain + SQLite "
        "| SQLite write-behind / LangChain | SQLite write-behind / LangChain + SQLite |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for path, samples in results.items():
        medians = " | ".join(f"{_us(samples[name]):.0f}" for name in CONTENDERS)
        ratios = " | ".join(
            (
                _ratio(samples, "ours_memory", "langchain"),
                _ratio(samples, "ours_strict", "langchain"),
                _ratio(samples, "ours_sqlite", "langchain_sqlite"),
                _ratio(samples, "ours_sqlite_behind", "langchain"),
                _ratio(samples, "ours_sqlite_behind", "langchain_sqlite"),
            )
        )
        lines.append(f"| {path} | {len(samples['bare'])} | {medians} | {ratios} |")
    lines += [
        "",
        "Overhead over the bare model (µs per call): "
        + "; ".join(
            f"{path}: LangChain-only {_overhead(s, 'langchain'):.0f}, "
            f"LangChain-only + SQLite {_overhead(s, 'langchain_sqlite'):.0f}, "
            f"ours memory {_overhead(s, 'ours_memory'):.0f}, "
            f"SQLite {_overhead(s, 'ours_sqlite'):.0f}, "
            f"SQLite write-behind {_overhead(s, 'ours_sqlite_behind'):.0f}, "
            f"strict {_overhead(s, 'ours_strict'):.0f}"
            for path, s in results.items()
        ),
    ]
    return "\n".join(lines)


def configure_logging() -> None:
    """A production-style root handler (WARNING) that discards text."""

    class NullStream:
        def write(self, text: str) -> int:
            return len(text)

        def flush(self) -> None:
            pass

    handler = logging.StreamHandler(NullStream())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)


def machine() -> str:
    load = " ".join(f"{value:.1f}" for value in os.getloadavg())
    return (
        f"Python {platform.python_version()}, langchain-core {langchain_core.__version__}, "
        f"{os.cpu_count()} CPU(s), {platform.machine()} {platform.system()}; load average {load}"
    )


def benchmark(settings: Settings, shapes: tuple[str, ...]) -> str:
    out = [f"Machine: {machine()}", ""]
    with tempfile.TemporaryDirectory() as folder:
        for shape in shapes:
            models = contenders(
                Path(folder) / f"{shape}.db",
                Path(folder) / f"{shape}-lc.db",
                Path(folder) / f"{shape}-behind.db",
            )
            results: dict[str, Samples] = {}
            sync = {name: sync_call(model, shape) for name, model in models.items()}
            results["sync"] = run_sync(sync, settings)
            aio = {name: async_call(model, shape) for name, model in models.items()}
            results["async"] = run_async(aio, settings)
            title = "invoke / ainvoke" if shape == "invoke" else "stream / astream (5 chunks)"
            out += [table(f"Median per-call wall time, {title}", results), ""]
            for name in ("ours_sqlite", "ours_sqlite_behind"):
                models[name].runnable.ledger.close()  # type: ignore[attr-defined]
    return "\n".join(out)


def profile(shape: str, calls: int) -> str:
    """cProfile of ``calls`` sync and ``calls`` async calls of ours (memory ledger)."""
    with tempfile.TemporaryDirectory() as folder:
        models = contenders(
            Path(folder) / "profile.db",
            Path(folder) / "profile-lc.db",
            Path(folder) / "profile-behind.db",
        )
        sync = sync_call(models["ours_memory"], shape)
        aio = async_call(models["ours_memory"], shape)

        async def many() -> None:
            for _ in range(calls):
                await aio()

        for _ in range(50):  # warm caches before profiling
            sync()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            sync()
        asyncio.run(many())
        profiler.disable()
        for name in ("ours_sqlite", "ours_sqlite_behind"):
            models[name].runnable.ledger.close()  # type: ignore[attr-defined]
    lines: list[str] = []

    class Sink:
        def write(self, text: str) -> int:
            lines.append(text)
            return len(text)

    stats = pstats.Stats(profiler, stream=Sink())  # type: ignore[arg-type]
    stats.strip_dirs().sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)
    return "".join(lines)


def floor(settings: Settings) -> str:
    """The SQLite work per call alone, no model and no LangChain: the anchor's callback
    (one ``INSERT``, autocommit) against our least per call (the gate's read, then the
    entry and its totals in one transaction) as raw ``sqlite3`` statements on our schema,
    piece by piece, and as our ledger runs it (``spend`` + ``record``, each a bounded
    operation). The anchor's row is also stored with the two indexes our entry table
    keeps (its timestamp, for every window and report query, and its unique id, which
    makes a retried write land once), to show what of the gap is SQLite's own work."""
    from datetime import UTC, datetime
    from decimal import Decimal

    from llm_resilience.ledger import LedgerEntry
    from llm_resilience.ledger._protocol import _ordered_id
    from llm_resilience.ledger._schema import (
        driver_run,
        prepare_sqlite,
        sqlite_insert,
        sqlite_spend,
    )

    with tempfile.TemporaryDirectory() as folder:
        anchor = SqliteUsageHandler(Path(folder) / "anchor.db")
        indexed = SqliteUsageHandler(Path(folder) / "indexed.db")
        indexed.connection.execute("ALTER TABLE usage ADD COLUMN entry_id TEXT")
        indexed.connection.execute("CREATE INDEX usage_ts ON usage (ts)")
        indexed.connection.execute("CREATE UNIQUE INDEX usage_id ON usage (entry_id)")
        ledger = SqlCostLedger(f"sqlite:///{Path(folder) / 'ours.db'}")
        raw = sqlite3.connect(Path(folder) / "ours.db", isolation_level=None)
        raw.execute("PRAGMA synchronous = NORMAL")
        prepare_sqlite(raw)
        run = functools.partial(driver_run, raw)

        def entry() -> LedgerEntry:
            return LedgerEntry(datetime.now(UTC), "chat", 12, 5, Decimal("0.000111"))

        def insert_row() -> None:
            with anchor.lock:
                anchor.connection.execute(
                    "INSERT INTO usage VALUES (?, ?, ?, ?)", (time.time(), "gpt-4o-mini", 12, 5)
                )

        def insert_indexed_row() -> None:
            with indexed.lock:
                indexed.connection.execute(
                    "INSERT INTO usage VALUES (?, ?, ?, ?, ?)",
                    (time.time(), "gpt-4o-mini", 12, 5, _ordered_id()),
                )

        def raw_read() -> None:
            sqlite_spend(run, "day", None, datetime.now(UTC))

        def raw_write() -> None:
            run("BEGIN IMMEDIATE", ())
            sqlite_insert(run, entry())
            run("COMMIT", ())

        def raw_minimum() -> None:
            raw_read()
            raw_write()

        def ours() -> None:
            ledger.spend("day")
            ledger.record(entry())

        calls = {
            "anchor INSERT": insert_row,
            "anchor INSERT, indexed": insert_indexed_row,
            "raw read": raw_read,
            "raw write": raw_write,
            "raw read + write": raw_minimum,
            "ledger": ours,
        }
        samples = run_sync(calls, settings)
        raw.close()
        ledger.close()
        anchor.connection.close()
        indexed.connection.close()
    lines = [
        "### SQLite work per call, no model (µs)",
        "",
        "| anchor: one `INSERT` (autocommit) | the same row with our two indexes "
        "(timestamp, unique id) | ours, raw `sqlite3`: gate read | ours, raw: `BEGIN "
        "IMMEDIATE`, entry `INSERT`, totals upsert, `COMMIT` | ours, raw: read + write "
        "| ours: `spend()` + `record()` |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
        "| " + " | ".join(f"{_us(samples[name]):.0f}" for name in calls) + " |",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--profile", action="store_true", help="cProfile of ours instead")
    parser.add_argument("--no-stream", action="store_true", help="invoke / ainvoke only")
    parser.add_argument("--floor", action="store_true", help="SQLite work per call alone")
    args = parser.parse_args(argv)
    configure_logging()
    if args.profile:
        print(profile("invoke", 2_000))
        return 0
    if args.floor:
        print(f"Machine: {machine()}\n")
        print(floor(Settings(rounds=100, warmup=5, batch_ns=5_000_000, budget_s=8.0)))
        return 0
    settings = (
        Settings(rounds=10, warmup=2, batch_ns=3_000_000, budget_s=1.5, min_rounds=6, probe=20)
        if args.quick
        else Settings(
            rounds=150, warmup=5, batch_ns=5_000_000, budget_s=8.0, min_rounds=20, probe=20
        )
    )
    shapes = ("invoke",) if args.no_stream else ("invoke", "stream")
    print(benchmark(settings, shapes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
