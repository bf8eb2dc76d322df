"""Per-call overhead of ``FallbackChatModel`` against LangChain's ``with_fallbacks``.

Four contenders answer the same offline request, in one process, interleaved:

* ``direct``: the model that answers, called on its own (the floor);
* ``ours``: ``FallbackChatModel(models=[primary, secondary])``;
* ``with_fallbacks``: ``primary.with_fallbacks([secondary])``;
* ``ours_timeout``: ``ours`` with ``per_client_timeout=30``.

Two paths: *no failure* (the primary answers) and *failover* (the primary raises a real
``openai.RateLimitError`` on an ``httpx.Response(429)``, the secondary answers; ``direct``
is then the secondary alone). Each is measured for ``invoke``/``ainvoke`` and, as a
secondary table, for ``stream``/``astream`` (5 chunks, consumed to the end).

Method: the contenders run in rounds, one batch each per round, in an order that rotates
every round so drift (CPU frequency, other load) falls on all of them alike. A batch is
~3 ms of back-to-back calls timed with ``time.perf_counter_ns``; a cell is the median
over rounds of the per-call batch mean, after warm-up rounds that are thrown away; a
ratio is the median of per-round ratios. ``gc`` stays enabled. Logging is configured as a production app would: a handler
with a timestamped format on the root logger, level WARNING, writing to a stream that
discards the text, so the one WARNING ``FallbackChatModel`` emits per failover is
formatted and paid for.

    python benchmarks/bench_fallback.py            # ~30 s on 2 cores, 60 s at most
    python benchmarks/bench_fallback.py --quick    # ~5 s, for a smoke run
    python benchmarks/bench_fallback.py --profile  # cProfile of invoke/ainvoke instead
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import os
import platform
import pstats
import statistics
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import langchain_core
import openai
from _timing import Samples, Settings, run_async, run_sync
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable

from langchain_llm_resilience import FallbackChatModel

MESSAGES: list[BaseMessage] = [HumanMessage(content="Say ok.")]
STREAM_TOKENS = ("o", "k", ",", " fine", ".")


def _usage() -> UsageMetadata:
    return {"input_tokens": 12, "output_tokens": 5, "total_tokens": 17}


_REQUEST = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
_RESPONSE_429 = httpx.Response(
    429,
    request=_REQUEST,
    headers={"x-request-id": "req_bench"},
    json={"error": {"message": "Rate limit reached", "type": "requests"}},
)


def _rate_limit_error() -> openai.RateLimitError:
    # A fresh error per call, as the SDK raises: re-raising one object would grow its
    # traceback without bound.
    return openai.RateLimitError("Rate limit reached", response=_RESPONSE_429, body=None)


class FakeChat(BaseChatModel):
    """Answers a fixed reply with usage, at once; streams it as 5 chunks."""

    @property
    def _llm_type(self) -> str:
        return "bench-fake"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        message = AIMessage(content="ok, fine.", usage_metadata=_usage())
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        return self._generate(messages, stop, run_manager, **kw)

    def _chunks(self) -> Iterator[ChatGenerationChunk]:
        last = len(STREAM_TOKENS) - 1
        for position, token in enumerate(STREAM_TOKENS):
            usage = _usage() if position == last else None
            message = AIMessageChunk(content=token, usage_metadata=usage)
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


class RateLimitedChat(FakeChat):
    """Raises ``openai.RateLimitError`` (HTTP 429) on every call, before any chunk."""

    @property
    def _llm_type(self) -> str:
        return "bench-429"

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        raise _rate_limit_error()

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        raise _rate_limit_error()
        yield  # pragma: no cover - makes this a generator

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        raise _rate_limit_error()
        yield  # pragma: no cover - makes this an async generator


# -- contenders --------------------------------------------------------------------------

#: ``ours_timeout`` is ``ours`` with ``per_client_timeout=30``, the documented setup: it
#: prices the timeout machinery (a worker thread per sync attempt, an ``asyncio.timeout``
#: scope per async one), which ``with_fallbacks`` does not offer at all.
CONTENDERS = ("direct", "ours", "with_fallbacks", "ours_timeout")


def contenders(path: str) -> dict[str, Runnable[Any, Any]]:
    """The runnables for ``path`` ("ok" or "failover"), keyed as :data:`CONTENDERS`."""
    secondary = FakeChat()
    primary: BaseChatModel = FakeChat() if path == "ok" else RateLimitedChat()
    return {
        "direct": primary if path == "ok" else secondary,
        "ours": FallbackChatModel(models=[primary, secondary]),
        "with_fallbacks": primary.with_fallbacks([secondary]),
        "ours_timeout": FallbackChatModel(models=[primary, secondary], per_client_timeout=30),
    }


def sync_call(runnable: Runnable[Any, Any], shape: str) -> Callable[[], object]:
    if shape == "invoke":
        return lambda: runnable.invoke(MESSAGES)
    return lambda: deque(runnable.stream(MESSAGES), maxlen=0)


def async_call(runnable: Runnable[Any, Any], shape: str) -> Callable[[], Awaitable[object]]:
    if shape == "invoke":
        return lambda: runnable.ainvoke(MESSAGES)

    async def consume() -> None:
        async for _ in runnable.astream(MESSAGES):
            pass

    return consume


# -- reporting ---------------------------------------------------------------------------


def _us(values: list[float]) -> float:
    return statistics.median(values) / 1000


def _ratio(samples: Samples, top: str, bottom: str, *, spread: bool = False) -> str:
    """Median over rounds of ``top``'s batch mean over ``bottom``'s, optionally with the
    interquartile range of those ratios.

    Paired by round: both batches of a round ran back to back, so the ratio cancels the
    drift that moves both.
    """
    ratios = [a / b for a, b in zip(samples[top], samples[bottom], strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return f"**{median:.2f}** ({q1:.2f}-{q3:.2f})" if spread else f"{median:.2f}"


def table(title: str, results: dict[str, Samples]) -> str:
    lines = [
        f"### {title}",
        "",
        "| scenario | rounds | direct µs | ours µs | with_fallbacks µs | ours, timeout µs "
        "| ours/direct | with_fallbacks/direct | ours/with_fallbacks "
        "| ours, timeout/with_fallbacks |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for scenario, samples in results.items():
        medians = " | ".join(f"{_us(samples[name]):.0f}" for name in CONTENDERS)
        lines.append(
            f"| {scenario} | {len(samples['ours'])} | {medians} "
            f"| {_ratio(samples, 'ours', 'direct')} "
            f"| {_ratio(samples, 'with_fallbacks', 'direct')} "
            f"| {_ratio(samples, 'ours', 'with_fallbacks', spread=True)} "
            f"| {_ratio(samples, 'ours_timeout', 'with_fallbacks', spread=True)} |"
        )
    return "\n".join(lines)


def configure_logging() -> None:
    """A production-style root handler (timestamped format, WARNING) that discards text."""

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
    return (
        f"Python {platform.python_version()}, langchain-core {langchain_core.__version__}, "
        f"openai {openai.__version__}, {os.cpu_count()} CPU(s), {platform.machine()} "
        f"{platform.system()}; load average {_load()}"
    )


def _load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def benchmark(settings: Settings) -> str:
    out = [f"Machine: {machine()}", ""]
    for shape, title in (("invoke", "invoke / ainvoke"), ("stream", "stream / astream")):
        results: dict[str, Samples] = {}
        for path, label in (("ok", "no failure"), ("failover", "failover (429)")):
            models = contenders(path)
            sync = {name: sync_call(model, shape) for name, model in models.items()}
            results[f"sync, {label}"] = run_sync(sync, settings)
            aio = {name: async_call(model, shape) for name, model in models.items()}
            results[f"async, {label}"] = run_async(aio, settings)
        out += [table(f"Median per-call wall time, {title}", results), ""]
    return "\n".join(out)


def profile(calls: int) -> None:
    """cProfile ``invoke``/``ainvoke`` of ours and with_fallbacks on both paths.

    Prints, per run, the 20 functions with the most own time; cProfile inflates cheap
    calls, so read it for where time goes, not for how much.
    """

    async def repeat(call: Callable[[], Awaitable[object]], n: int) -> None:
        for _ in range(n):
            await call()

    for path in ("ok", "failover"):
        models = contenders(path)
        for name in ("ours", "with_fallbacks"):
            sync = sync_call(models[name], "invoke")
            aio = async_call(models[name], "invoke")
            for label, run in (
                ("sync", lambda n, call=sync: [call() for _ in range(n)]),
                ("async", lambda n, call=aio: asyncio.run(repeat(call, n))),
            ):
                run(200)
                profiler = cProfile.Profile()
                profiler.enable()
                run(calls)
                profiler.disable()
                print(f"\n=== {name}, {label}, path={path}, {calls} calls ===")
                stats = pstats.Stats(profiler, stream=sys.stdout)
                stats.strip_dirs().sort_stats("tottime").print_stats(20)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short run (a few seconds)")
    parser.add_argument("--profile", action="store_true", help="cProfile instead of timing")
    args = parser.parse_args(argv)
    # Offline and deterministic: no LangSmith tracer may attach itself.
    for variable in ("LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING", "LANGSMITH_TRACING"):
        os.environ.pop(variable, None)
    configure_logging()
    if args.profile:
        profile(2_000)
        return 0
    if args.quick:
        settings = Settings(rounds=40, warmup=3, batch_ns=2_000_000, budget_s=1.0)
    else:
        # Many short batches rather than a few long ones: on a shared machine a
        # preemption then spoils single batches, which the median discards. The budget
        # keeps a run under a minute however loaded the machine is.
        settings = Settings(rounds=300, warmup=10, batch_ns=3_000_000, budget_s=5.5)
    started = time.perf_counter()
    print(benchmark(settings))
    print(
        f"Up to {settings.rounds} rounds (+{settings.warmup} warm-up) of ~"
        f"{settings.batch_ns / 1e6:.0f} ms batches per contender, {settings.budget_s:.1f} s "
        f"per scenario at most; "
        f"{time.perf_counter() - started:.1f} s; load average at the end {_load()}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
