"""Instructions per call of the wrappers and of their parts, counted by valgrind.

Timing ratios on a shared 2-core machine drift by a few percent between runs; the
number of machine instructions a call executes does not. For each cell this runs the
contender of ``bench_wrappers.py`` under ``valgrind --tool=callgrind``: 200 warm-up
calls, then ``--calls`` measured ones between two marks (``os.getppid()``, where
callgrind dumps its counts), and prints the measured part's instructions per call beside
the model called directly.

It also counts, in isolation, the parts of the cost layer's work on a LangChain stream
(the gate's admission, the usage read from the finished stream's chunks, and the
settle: price, entry and record), each over the bench's in-memory ledger; and the
estimate a ``CostTrackedLLM`` over ``MockLLM`` makes on every call, because MockLLM
reports no usage (the prompt's and the answer's tokens counted with ``cl100k_base``).

Instructions are not time: a dict lookup and a cache miss both count as a handful. Read
a ratio here beside ``bench_wrappers.py``'s, for where a wrapper's work goes.

    python benchmarks/bench_instructions.py              # ~40 min on 2 cores
    python benchmarks/bench_instructions.py --quick      # 50 calls a cell (most of the
                                                         # time is each run's imports)

Needs valgrind (``apt-get install valgrind``); without it, says so and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

WARMUP = 200

#: (table, framework, shape, contenders): each contender beside ``direct``.
CELLS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("LangChain", "langchain", "invoke", ("fallback", "rate_limited", "cost_tracked")),
    ("LangChain", "langchain", "stream", ("fallback", "rate_limited", "cost_tracked")),
    ("LangChain", "langchain", "astream", ("fallback", "cost_tracked")),
    ("LlamaIndex over MockLLM", "llama", "chat", ("fallback", "cost_tracked")),
    ("LlamaIndex over MockLLM", "llama", "stream_chat", ("fallback", "cost_tracked")),
    ("LlamaIndex over ReportingMockLLM", "llama-reporting", "chat", ("cost_tracked",)),
    ("LlamaIndex over ReportingMockLLM", "llama-reporting", "achat", ("cost_tracked",)),
)

#: The parts of a LangChain cost stream's work, each counted alone (``part:<name>``), and
#: the estimate of a MockLLM chat call's usage.
PARTS = ("none", "begin", "usage", "begin+settle", "estimate")

_ASYNC = {"ainvoke": "invoke", "astream": "stream", "achat": "chat", "astream_chat": "stream_chat"}


# -- the child: runs the calls under valgrind ------------------------------------------


def _call(framework: str, contender: str, shape: str) -> tuple[Callable[[], Any], bool]:
    """One call of ``contender`` in ``shape``, and whether it is a coroutine function."""
    import bench_wrappers as bw

    base = _ASYNC.get(shape, shape)
    aio = shape in _ASYNC
    if framework.startswith("llama"):
        models = bw.llama_contenders() if framework == "llama" else bw.llama_reporting_contenders()
        llm = models[contender]
        return (bw.llama_async(llm, base) if aio else bw.llama_sync(llm, base)), aio
    runnable = bw.langchain_contenders("ok")[contender]
    return (bw.langchain_async(runnable, base) if aio else bw.langchain_sync(runnable, base)), aio


def _part(name: str) -> Callable[[], Any]:
    """One part of ``CostTrackedChatModel``'s work on a finished 5-chunk stream, or the
    usage estimate of one MockLLM chat call (``estimate``)."""
    import bench_wrappers as bw

    if name == "estimate":
        from llama_index.resilience._usage import prompt_pairs, response_text

        from llm_resilience.usage import estimated_usage

        # What `CostTrackedLLM` reads when the answer reports nothing.
        pairs = prompt_pairs(bw.LLAMA_MESSAGES)
        text = response_text(bw.llama_contenders()["direct"].chat(bw.LLAMA_MESSAGES))
        return lambda: estimated_usage(pairs, text)

    from bench_fallback import MESSAGES

    from langchain_llm_resilience._delegate import private_state

    layer = bw.langchain_contenders("ok")["cost_tracked"]
    meter = private_state(layer)["_meter"]
    messages = layer._convert_input(MESSAGES).to_messages()
    chunks = list(layer.inner._stream(messages))
    read = layer._streamed(messages, chunks)
    assert read is not None, "the bench's stream reports its usage"
    usage = read[0]

    def begin_and_settle() -> None:
        meter.begin({}).settle(usage)

    return {
        "none": lambda: None,
        "begin": lambda: meter.begin({}),
        "usage": lambda: layer._streamed(messages, chunks),
        "begin+settle": begin_and_settle,
    }[name]


def child(framework: str, contender: str, shape: str, calls: int) -> None:
    if framework == "part":
        call, aio = _part(contender), False
    else:
        call, aio = _call(framework, contender, shape)
    # ``os.getppid()`` marks where the measured calls begin and end: the parent has
    # callgrind dump its counts there (``--dump-before``).
    if not aio:
        for _ in range(WARMUP):
            call()
        os.getppid()
        for _ in range(calls):
            call()
        os.getppid()
        return

    async def repeat() -> None:
        for _ in range(WARMUP):
            await call()
        os.getppid()
        for _ in range(calls):
            await call()
        os.getppid()

    asyncio.run(repeat())


# -- the parent: counts ----------------------------------------------------------------


def per_call(args: list[str], calls: int) -> float:
    """Instructions one call of ``args`` executes: the counts callgrind dumped between
    the child's two marks, over ``calls``."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            "--dump-before=os_getppid*",
            sys.executable,
            __file__,
            "--child",
            *args,
            str(calls),
        ]
        # One hash seed for every run: string hashing then takes the same paths.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        measured = Path(f"{out}.2")  # .1: up to the first mark; .2: between the two
        found = (
            re.search(r"^totals: (\d+)", measured.read_text(), re.M) if measured.exists() else None
        )
        if done.returncode != 0 or found is None:
            raise RuntimeError(f"no count from valgrind for {args}:\n{done.stderr[-2000:]}")
        return int(found.group(1)) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=300, help="measured calls per cell")
    parser.add_argument("--quick", action="store_true", help="50 calls per cell")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    for variable in ("LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING", "LANGSMITH_TRACING"):
        os.environ.pop(variable, None)
    if args.child:
        framework, contender, shape, calls = args.child
        from bench_fallback import configure_logging

        configure_logging()
        child(framework, contender, shape, int(calls))
        return 0
    if args.quick:
        args.calls = 50
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing counted (apt-get install valgrind)")
        return 0
    jobs: list[list[str]] = []
    for _, framework, shape, contenders in CELLS:
        for contender in ("direct", *contenders):
            jobs.append([framework, contender, shape])
    jobs += [["part", name, "-"] for name in PARTS]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        counts = dict(
            zip(
                (tuple(job) for job in jobs),
                pool.map(lambda job: per_call(job, args.calls), jobs),
                strict=True,
            )
        )
    print(
        f"Python {platform.python_version()}, {platform.machine()}; instructions per call "
        f"(valgrind callgrind), {args.calls} calls after {WARMUP} warm-up calls\n"
    )
    print("| table | call | contender | direct | contender | contender / direct |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for table, framework, shape, contenders in CELLS:
        direct = counts[(framework, "direct", shape)]
        for contender in contenders:
            mine = counts[(framework, contender, shape)]
            print(
                f"| {table} | {shape} | {contender} | {direct:,.0f} | {mine:,.0f} "
                f"| {mine / direct:.3f} |"
            )
    none = counts[("part", "none", "-")]
    direct_stream = counts[("langchain", "direct", "stream")]
    print("\nThe parts of `CostTrackedChatModel`'s work on one stream, each alone:\n")
    print("| part | instructions | share of the direct stream |")
    print("| --- | ---: | ---: |")
    for name in PARTS[1:-1]:
        alone = counts[("part", name, "-")] - none
        print(f"| {name} | {alone:,.0f} | {alone / direct_stream:.1%} |")
    direct_chat = counts[("llama", "direct", "chat")]
    estimate = counts[("part", "estimate", "-")] - none
    print(
        f"\nThe usage estimate of one MockLLM chat call (`estimated_usage`): {estimate:,.0f} "
        f"instructions, {estimate / direct_chat:.1%} of the direct call."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
