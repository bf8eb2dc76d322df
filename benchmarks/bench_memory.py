"""Memory over 100,000 calls through the whole stack, in each framework, with every
fault path on.

Per framework, one process, one stack:

* LangChain: ``CostTrackedChatModel(RateLimitedChatModel(FallbackChatModel([primary,
  secondary], ...)))``;
* LlamaIndex: ``CostTrackedLLM(RateLimitedLLM(FallbackLLM([primary, secondary], ...)))``;

with ``hedge_after=0.002``, ``member_retry=RetryPolicy(attempts=2, base_delay=0)``,
``Cooldown(failures=3, window=1, duration=0.05)``, a token bucket far above the traffic
and a ``CostBudget`` with a daily limit on a ``SqlCostLedger`` over a SQLite file (one
durable row per call: the default ledger's memory, not a list of entries, is what stays
in the process; an ``InMemoryCostLedger`` keeps every entry by design). The primary is an
offline fake that, by its attempt count, fails with a real ``openai`` 503 every 100th
attempt (the member retry answers), fails four attempts in a row every 1,000th (the
retry gives up, the chain fails over, the cooldown opens), and answers 5 ms late every
500th (the hedge starts the secondary, which wins; the primary's attempt is abandoned).

The calls go in rounds of 10,000: 2,500 each of the sync call, the sync stream, the async
call and the async stream (one event loop for the whole run), streams consumed to the
end. After each round, ``gc.collect()``, then the process's resident set (``/proc``) and
``sys.getallocatedblocks()`` (Python's own allocations, blind to the allocator keeping
freed pages). Printed: the table per round, then the growth per call from the end of the
first round (everything a first call caches is built by then) to the last, in bytes of
RSS and in Python blocks, and the threads and tasks left at the end.

    python benchmarks/bench_memory.py            # 100,000 calls each, about 3 min on 2 CPUs
    python benchmarks/bench_memory.py --quick    # 20,000 calls each
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import platform
import resource
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

from langchain_core.outputs import ChatGenerationChunk, ChatResult
from llama_index.core.base.llms.types import ChatMessage
from llama_index.resilience import CostTrackedLLM, FallbackLLM, RateLimitedLLM
from llama_index.resilience.testing import FakeFunctionCallingLLM

from langchain_llm_resilience import CostTrackedChatModel, FallbackChatModel, RateLimitedChatModel
from langchain_llm_resilience.testing import ScriptedChatModel
from llm_resilience import Cooldown, CostBudget, RetryPolicy
from llm_resilience.ledger import SqlCostLedger
from llm_resilience.testing.errors import service_unavailable_error

ROUND = 10_000  # calls per round, a quarter of each kind
HEDGE_AFTER = 0.002
SLOW = 0.005
RPM = 1_000_000_000  # a token bucket no run waits on


def _trouble(attempt: int) -> str | None:
    """What the primary does on its ``attempt``-th attempt: ``"fail"``, ``"slow"`` or None."""
    if attempt % 100 == 0 or attempt % 1000 in (1, 2, 3, 4):
        return "fail"
    if attempt % 500 == 250:
        return "slow"
    return None


class _Attempts:
    """The primary's attempt counter (thread-safe: hedges and abandoned attempts run on
    threads of their own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def next(self) -> str | None:
        with self._lock:
            self.count += 1
            attempt = self.count
        return _trouble(attempt)

    def sync(self) -> None:
        trouble = self.next()
        if trouble == "fail":
            raise service_unavailable_error()
        if trouble == "slow":
            time.sleep(SLOW)

    async def async_(self) -> None:
        trouble = self.next()
        if trouble == "fail":
            raise service_unavailable_error()
        if trouble == "slow":
            await asyncio.sleep(SLOW)


# -- LangChain ----------------------------------------------------------------------


class FlakyChatModel(ScriptedChatModel):
    """``ScriptedChatModel`` that fails or lags by its attempt count (``_trouble``)."""

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        object.__setattr__(self, "_attempts", _Attempts())

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        self._attempts.sync()  # type: ignore[attr-defined]
        return super()._generate(*args, **kwargs)

    async def _agenerate(self, *args: Any, **kwargs: Any) -> ChatResult:
        await self._attempts.async_()  # type: ignore[attr-defined]
        return await super()._agenerate(*args, **kwargs)

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        self._attempts.sync()  # type: ignore[attr-defined]
        yield from super()._stream(*args, **kwargs)

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        await self._attempts.async_()  # type: ignore[attr-defined]
        async for chunk in super()._astream(*args, **kwargs):
            yield chunk


def _langchain(ledger: SqlCostLedger) -> dict[str, Callable[[], Any]]:
    chain = FallbackChatModel(
        models=[FlakyChatModel(model="primary"), ScriptedChatModel(model="secondary")],
        **_chain_options(),
    )
    model = CostTrackedChatModel(
        inner=RateLimitedChatModel(inner=chain, requests_per_minute=RPM), **_cost(ledger)
    )

    def stream() -> None:
        for _ in model.stream("Hello?"):
            pass

    async def astream() -> None:
        async for _ in model.astream("Hello?"):
            pass

    return {
        "call": lambda: model.invoke("Hello?"),
        "stream": stream,
        "acall": lambda: model.ainvoke("Hello?"),
        "astream": astream,
    }


# -- LlamaIndex ---------------------------------------------------------------------


class FlakyLLM(FakeFunctionCallingLLM):
    """``FakeFunctionCallingLLM`` that fails or lags by its attempt count (``_trouble``)."""

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        object.__setattr__(self, "_attempts", _Attempts())

    def _disrupt(self) -> None:
        self._attempts.sync()  # type: ignore[attr-defined]

    async def _adisrupt(self) -> None:
        await self._attempts.async_()  # type: ignore[attr-defined]


def _llama_index(ledger: SqlCostLedger) -> dict[str, Callable[[], Any]]:
    chain = FallbackLLM(
        llms=[FlakyLLM(model_name="primary"), FakeFunctionCallingLLM(model_name="secondary")],
        **_chain_options(),
    )
    llm = CostTrackedLLM(
        inner=RateLimitedLLM(inner=chain, requests_per_minute=RPM), **_cost(ledger)
    )
    messages = [ChatMessage(role="user", content="Hello?")]

    def stream() -> None:
        for _ in llm.stream_chat(messages):
            pass

    async def astream() -> None:
        async for _ in await llm.astream_chat(messages):
            pass

    return {
        "call": lambda: llm.chat(messages),
        "stream": stream,
        "acall": lambda: llm.achat(messages),
        "astream": astream,
    }


# -- the run ------------------------------------------------------------------------


def _chain_options() -> dict[str, Any]:
    """Every fault path of the chain on: hedges, same-member retries, the breaker."""
    return {
        "hedge_after": HEDGE_AFTER,
        "member_retry": RetryPolicy(attempts=2, base_delay=0, jitter=0),
        "cooldown": Cooldown(failures=3, window=1, duration=0.05),
    }


def _cost(ledger: SqlCostLedger) -> dict[str, Any]:
    """A daily budget no run reaches, on ``ledger``."""
    budget = CostBudget(
        input_price_per_mtok=Decimal(3),
        output_price_per_mtok=Decimal(15),
        daily_limit=Decimal(1_000_000),
    )
    return {"budget": budget, "ledger": ledger}


def _rss() -> int:
    """Resident set size in bytes (Linux ``/proc``; the peak from ``getrusage`` elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _run(
    name: str, build: Callable[[SqlCostLedger], dict[str, Callable[[], Any]]], rounds: int
) -> None:
    threads_before = Counter(thread.name.rstrip("0123456789_") for thread in threading.enumerate())
    with tempfile.TemporaryDirectory() as folder:
        ledger = SqlCostLedger(f"sqlite:///{folder}/spend.db")
        calls = build(ledger)
        loop = asyncio.new_event_loop()
        quarter = ROUND // 4

        async def async_part() -> None:
            for _ in range(quarter):
                await calls["acall"]()
            for _ in range(quarter):
                await calls["astream"]()

        print(f"\n### {name}: {rounds} rounds of {ROUND:,} calls\n")
        print("| calls | RSS MiB | Python blocks | seconds |")
        print("| ---: | ---: | ---: | ---: |")
        points: list[tuple[int, int, int]] = []
        started = time.perf_counter()
        for number in range(1, rounds + 1):
            for _ in range(quarter):
                calls["call"]()
            for _ in range(quarter):
                calls["stream"]()
            loop.run_until_complete(async_part())
            gc.collect()
            rss, blocks = _rss(), sys.getallocatedblocks()
            points.append((number * ROUND, rss, blocks))
            print(
                f"| {number * ROUND:,} | {rss / 2**20:.1f} | {blocks:,} | "
                f"{time.perf_counter() - started:.1f} |",
                flush=True,
            )
        tasks = len(asyncio.all_tasks(loop))
        loop.close()
        kinds = Counter(entry.kind for entry in ledger.entries())
        ledger.close()
    first, last = points[0], points[-1]
    span = last[0] - first[0]
    time.sleep(0.05)  # an abandoned hedge's thread ends SLOW seconds after its call
    left = (
        Counter(thread.name.rstrip("0123456789_") for thread in threading.enumerate())
        - threads_before
    )
    print(
        f"\n{name}: growth from {first[0]:,} to {last[0]:,} calls: "
        f"{(last[1] - first[1]) / span:+.1f} bytes of RSS per call, "
        f"{(last[2] - first[2]) / span:+.3f} Python blocks per call; "
        f"ledger entries {dict(kinds)} (one call entry per call: "
        f"{sum(n for kind, n in kinds.items() if kind != 'hedge') == last[0]}); "
        f"tasks left {tasks}; threads left {sorted(left.elements())} (idle attempt workers "
        f"exit after 60 s idle)"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args(argv).quick
    # The chain's one WARNING per failover, formatted and dropped as an app would.
    logging.basicConfig(level=logging.WARNING, stream=open(os.devnull, "w"))  # noqa: SIM115
    rounds = 2 if quick else 10
    print(f"Python {platform.python_version()} on {platform.platform()}, {os.cpu_count()} CPUs")
    _run("LangChain", _langchain, rounds)
    _run("LlamaIndex", _llama_index, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
