"""Time to a complete answer when the primary is slow to start: ``hedge_after`` against the rest.

Over HTTP, like ``bench_failover.py``: a real ``ChatOpenAI`` (the primary) and a real
``ChatAnthropic`` (the secondary), both ``max_retries=0``, talk to two local
``FaultInjectingServer`` instances. Before each call the primary's server is scripted
with ``Fault.slow_first_token(SLOW)`` (headers at once, the first token after ``SLOW``
seconds: a loaded provider), or with nothing for the ``healthy`` rows. Contenders:

* ``hedge``: ``FallbackChatModel(models=[primary, secondary], hedge_after=HEDGE)``;
* ``first_token_timeout``: ours with the recommended limit instead, scaled down to
  ``LIMIT`` seconds (the slow primary is given up on, then the secondary asked);
* ``with_fallbacks``: ``primary.with_fallbacks([secondary])`` with the SDK's own
  ``timeout=LIMIT`` on each member (httpx applies it to each read, so it fires on the
  silent first token too).

A cell is the median wall time, over ``--reps`` calls, from the call until the consumer
holds the complete answer (``invoke``/``ainvoke`` returned, ``stream``/``astream`` read to
the end) or the call raised, then who answered (or the error) and how many requests the
call sent (the hedge's cost: two on a slow call).

    python benchmarks/bench_hedge.py            # ~1 min on 2 cores
    python benchmarks/bench_hedge.py --quick    # one call per cell

Progress lines go to stderr; the table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import statistics
import sys
import time
from typing import Any

from langchain_anthropic import ChatAnthropic
from langchain_core.runnables import Runnable
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from langchain_llm_resilience import FallbackChatModel
from llm_resilience.testing import Fault, FaultInjectingServer

PRIMARY_REPLY = "the primary answered after a long wait"
SECONDARY_REPLY = "the secondary answered this request"
#: How long the slow primary holds its first token back.
SLOW = 3.0
#: ``hedge_after``.
HEDGE = 0.3
#: ``first_token_timeout`` of the second contender, and with_fallbacks' SDK timeout.
LIMIT = 1.0
#: The members' SDK timeout for our contenders (a backstop, as the docs advise).
LONGEST = 30.0
SHAPES = ("invoke", "ainvoke", "stream", "astream")
CONTENDERS = ("hedge", "first_token_timeout", "with_fallbacks")


def _openai(server: FaultInjectingServer, timeout: float) -> ChatOpenAI:
    return ChatOpenAI(
        model="gpt-4o-mini",
        base_url=server.openai_base_url,
        api_key=SecretStr("sk-FAKE-bench"),
        max_retries=0,
        timeout=timeout,
    )


def _anthropic(server: FaultInjectingServer, timeout: float) -> ChatAnthropic:
    return ChatAnthropic(
        model_name="claude-haiku-4-5",
        base_url=server.anthropic_base_url,
        api_key=SecretStr("sk-FAKE-bench"),
        max_retries=0,
        default_request_timeout=timeout,
        stop=None,
    )


def contenders(
    primary: FaultInjectingServer, secondary: FaultInjectingServer
) -> dict[str, Runnable[Any, Any]]:
    return {
        "hedge": FallbackChatModel(
            models=[_openai(primary, LONGEST), _anthropic(secondary, LONGEST)],
            hedge_after=HEDGE,
        ),
        "first_token_timeout": FallbackChatModel(
            models=[_openai(primary, LONGEST), _anthropic(secondary, LONGEST)],
            first_token_timeout=LIMIT,
        ),
        "with_fallbacks": _openai(primary, LIMIT).with_fallbacks([_anthropic(secondary, LIMIT)]),
    }


def _text(message: Any) -> str:
    content = message.content
    return content if isinstance(content, str) else str(content)


def call(model: Runnable[Any, Any], shape: str, loop: asyncio.AbstractEventLoop) -> str:
    question = "Capital of France?"
    if shape == "invoke":
        return _text(model.invoke(question))
    if shape == "stream":
        return "".join(_text(chunk) for chunk in model.stream(question))

    async def run() -> str:
        if shape == "ainvoke":
            return _text(await model.ainvoke(question))
        return "".join([_text(chunk) async for chunk in model.astream(question)])

    return loop.run_until_complete(run())


def _who(text: str) -> str:
    if text == SECONDARY_REPLY:
        return "secondary"
    if text == PRIMARY_REPLY:
        return "primary"
    return f"other ({len(text)} chars)"


def measure(reps: int) -> list[tuple[str, str, str, float, str, float]]:
    rows = []
    loop = asyncio.new_event_loop()
    with (
        FaultInjectingServer(reply=PRIMARY_REPLY, name="primary") as primary,
        FaultInjectingServer(reply=SECONDARY_REPLY, name="secondary") as secondary,
    ):
        models = contenders(primary, secondary)
        for model in models.values():  # build the SDK clients outside the timing
            call(model, "invoke", loop)
            call(model, "ainvoke", loop)
        for case in ("slow first token", "healthy"):
            for shape in SHAPES:
                for name in CONTENDERS:
                    times: list[float] = []
                    who: list[str] = []
                    sent: list[int] = []
                    for _ in range(reps):
                        primary.reset()
                        secondary.reset()
                        if case != "healthy":
                            primary.script(Fault.slow_first_token(SLOW))
                        began = time.perf_counter()
                        try:
                            answer = _who(call(models[name], shape, loop))
                        except Exception as error:  # the consumer got an error, not an answer
                            answer = f"error: {type(error).__name__}"
                        times.append(time.perf_counter() - began)
                        who.append(answer)
                        sent.append(len(primary.requests) + len(secondary.requests))
                    median = statistics.median(times)
                    answered = max(set(who), key=who.count)
                    requests = statistics.mean(sent)
                    rows.append((case, shape, name, median, answered, requests))
                    print(f"{case:17} {shape:8} {name:20} {median:6.3f} s", file=sys.stderr)
        # Abandoned sync attempts end when the servers stop.
    loop.close()
    return rows


def table(rows: list[tuple[str, str, str, float, str, float]]) -> str:
    lines = [
        "| primary | call | contender | time to complete answer (ms) | answered by | requests |",
        "| --- | --- | --- | ---: | --- | ---: |",
    ]
    for case, shape, name, median, answered, requests in rows:
        lines.append(
            f"| {case} | {shape} | {name} | {median * 1000:.1f} | {answered} | {requests:g} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=3, help="calls per cell (median)")
    parser.add_argument("--quick", action="store_true", help="one call per cell")
    args = parser.parse_args(argv)
    logging.getLogger("llm_resilience").setLevel(logging.ERROR)
    reps = 1 if args.quick else args.reps
    rows = measure(reps)
    print(
        f"Python {platform.python_version()}, {os.cpu_count()} cores; slow first token "
        f"{SLOW} s; hedge_after={HEDGE}; first_token_timeout and with_fallbacks' SDK "
        f"timeout={LIMIT}; median of {reps} call(s) per cell.\n"
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
