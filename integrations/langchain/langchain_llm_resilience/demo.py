"""The offline outage demo behind ``llm-resilience demo``.

Two local servers stand in for two providers: an OpenAI-compatible primary and an
Anthropic-compatible secondary (:class:`llm_resilience.testing.FaultInjectingServer`).
The real ``ChatOpenAI`` and ``ChatAnthropic`` clients talk HTTP to them through a
LangChain chain (``prompt | FallbackChatModel | parser``) while the primary fails in
the ways providers do. Everything runs on 127.0.0.1 and stops when the demo ends.

The core's ``llm-resilience`` command finds :data:`command` through the ``llm_resilience.cli``
entry point that this package's ``pyproject.toml`` registers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TextIO

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable

from langchain_llm_resilience.fallback import SERVED_BY_KEY, STREAM_RESTART_EVENT, FallbackChatModel
from llm_resilience.cli import Command
from llm_resilience.testing import Fault, FaultInjectingServer

__all__ = ["command", "run_demo"]

_PRIMARY_REPLY = "Paris is the capital of France, served by the primary."
_SECONDARY_REPLY = "Paris is the capital of France, served by the secondary."
_TIMEOUT = 0.5


_Message = AIMessage | AIMessageChunk


@dataclass
class _Outcome:
    scenario: str
    call: str
    served_by: str
    fallbacks: int
    restarts: int
    millis: float


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
    index = message.response_metadata.get(SERVED_BY_KEY)
    name = message.response_metadata.get("model_name", "?")
    role = {0: "primary", 1: "secondary"}.get(index, "?") if isinstance(index, int) else "?"
    return f"{role} ({name})"


def _run(_: argparse.Namespace) -> int:
    try:
        import langchain_anthropic  # noqa: F401
        import langchain_openai  # noqa: F401
    except ImportError as error:
        print(
            f"llm-resilience demo needs the provider clients ({error}): "
            "pip install langchain-openai langchain-anthropic",
            file=sys.stderr,
        )
        return 2
    return run_demo(sys.stdout)


#: ``llm-resilience demo``, registered in the ``llm_resilience.cli`` entry-point group.
command = Command(
    help="run an offline simulated provider outage through a fallback chain", run=_run
)


def run_demo(out: TextIO) -> int:
    """Run the demo, printing to ``out``; returns a process exit code."""
    from langchain_anthropic import ChatAnthropic
    from langchain_openai import ChatOpenAI

    narrator = _Narrator(out)
    fallback_logger = logging.getLogger("llm_resilience.fallback")
    fallback_logger.addHandler(narrator)
    previous_propagate = fallback_logger.propagate
    fallback_logger.propagate = False
    outcomes: list[_Outcome] = []
    listener = _RestartListener(out)
    with (
        FaultInjectingServer(reply=_PRIMARY_REPLY, name="primary") as primary,
        FaultInjectingServer(reply=_SECONDARY_REPLY, name="secondary") as secondary,
    ):
        model = FallbackChatModel(
            models=[
                ChatOpenAI(
                    model="gpt-4o-mini",
                    base_url=primary.openai_base_url,
                    api_key="demo-key",  # type: ignore[arg-type]
                    max_retries=0,
                    timeout=10,
                ),
                ChatAnthropic(
                    model_name="claude-haiku-4-5",
                    base_url=secondary.anthropic_base_url,
                    api_key="demo-key",  # type: ignore[arg-type]
                    max_retries=0,
                    timeout=10,
                    stop=None,
                ),
            ],
            per_client_timeout=_TIMEOUT,
        )
        prompt = ChatPromptTemplate.from_messages(
            [("system", "Answer in one sentence."), ("user", "What is the capital of {country}?")]
        )
        chain: Runnable[dict[str, str], Any] = prompt | model
        config: Any = {"callbacks": [listener]}
        question = {"country": "France"}

        print(
            "llm-resilience demo: prompt | FallbackChatModel([ChatOpenAI -> "
            f"{primary.openai_base_url}, ChatAnthropic -> {secondary.anthropic_base_url}]), "
            f"per_client_timeout={_TIMEOUT}s\n",
            file=out,
        )

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
                    merged = None  # what the failed client said is not part of the answer
                merged = chunk if merged is None else merged + chunk
            assert merged is not None
            return merged

        scenarios: list[
            tuple[str, Fault, str, Callable[[], Awaitable[AIMessage | AIMessageChunk]]]
        ] = [
            ("primary healthy", Fault.ok(), "invoke", invoke),
            ("primary answers 429 Too Many Requests", Fault.status(429), "invoke", invoke),
            ("primary answers 503 Service Unavailable", Fault.status(503), "ainvoke", ainvoke),
            (f"primary hangs past {_TIMEOUT}s", Fault.hang(), "stream", stream),
            ("primary drops the stream mid-body", Fault.drop_mid_stream(3), "astream", astream),
        ]

        async def play() -> None:
            for number, (title, fault, call, run) in enumerate(scenarios, start=1):
                print(f"[{number}/{len(scenarios)}] {title}  ({call})", file=out, flush=True)
                primary.script(fault)
                warnings_before, restarts_before = narrator.count, listener.restarts
                started = time.perf_counter()
                message = await run()
                millis = (time.perf_counter() - started) * 1000
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

        asyncio.run(play())
    fallback_logger.removeHandler(narrator)
    fallback_logger.propagate = previous_propagate
    _print_summary(outcomes, out)
    return 0


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
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    line = "  ".join(header.ljust(width) for header, width in zip(headers, widths, strict=True))
    print("Summary", file=out)
    print(line, file=out)
    print("  ".join("-" * width for width in widths), file=out)
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)), file=out
        )
    served = sum(1 for outcome in outcomes if outcome.served_by.startswith("secondary"))
    print(
        f"\n{len(outcomes)} calls, {len(outcomes)} answered; {served} served by the secondary "
        f"after the primary failed. Both local servers are stopped.",
        file=out,
    )
