"""Time to a complete answer, per failure kind: ``FallbackChatModel`` against ``with_fallbacks``.

Unlike ``bench_fallback.py`` (per-call overhead on offline fakes), this one goes over
HTTP: a real ``ChatOpenAI`` (the primary) and a real ``ChatAnthropic`` (the secondary),
both with ``max_retries=0``, talk to two local ``FaultInjectingServer`` instances on
127.0.0.1. Before each call the primary's server is scripted with one failure kind; the
secondary always answers. Two contenders:

* ``ours``: ``FallbackChatModel(models=[primary, secondary], ...)`` with the recommended
  settings scaled down to the benchmark's fault delays: ``first_token_timeout`` and
  ``idle_timeout`` of ``LIMIT`` seconds, ``per_client_timeout`` of ``LONGEST`` seconds
  (the longest answer one is willing to wait for), and ``member_profiles`` declaring the
  secondary's larger context window. The members keep an SDK ``timeout=`` of ``LONGEST``
  as a backstop, as the docs advise.
* ``with_fallbacks``: ``primary.with_fallbacks([secondary])``, each member built with the
  SDK's own ``timeout=LIMIT``, the closest LangChain-only bound on one attempt (httpx
  applies it to the connect and to each read, so it also fires on a silent stream).

What is timed is the wall time from the call until the consumer holds a complete answer
(``invoke``/``ainvoke`` returned; ``stream``/``astream`` consumed to the end), or until
the call raised. Each cell is the median of ``--reps`` calls, the contenders alternating.
For each call the script also records what the consumer got: the answer of one member
(``primary``/``secondary``), an error (its type, and how many characters a stream had
delivered before it), or, for a stream, the plain concatenation of every chunk's text:
``one answer`` when it is exactly one member's reply, ``prefix+answer`` when a failed
prefix was followed by the whole new answer (ours restarts a stream mid-way and sends
the restart event; a plain ``"".join(...)`` consumer does not listen for it, while a
consumer that empties its buffer on the event, the "restart listener", is checked too).

A third table runs ours again with opt-in settings on the failure kinds they are for:
``member_retry=RetryPolicy(...)`` (a 429 or 5xx retried on the same member, a short
``Retry-After`` waited out), ``mid_stream="raise"`` / ``"continue"`` (under
``"continue"`` the secondary's server gives the primary's reply, as a model continuing
the same answer would) and ``cooldown=`` on a flapping primary.

Failure kinds beyond the outages: a content filter (a refused prompt, and an answer cut
with ``finish_reason: "content_filter"``), a secondary that rejects an assistant prefill
(it matters only under ``"continue"``), and a flapping primary that fails every other
request it gets: its cell is the total time of ``FLAPS`` calls in a row.

Faults, options and option values that are not (yet) in this checkout are skipped with a
printed ``pending`` line, so the script runs on any revision.

    python benchmarks/bench_failover.py            # ~2.5 min on 2 cores
    python benchmarks/bench_failover.py --quick    # one call per cell, ~1 min
    python benchmarks/bench_failover.py --reps 5   # more calls per cell

Progress lines (one per cell) go to stderr; the tables to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import langchain_core
import openai
from langchain_anthropic import ChatAnthropic
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from langchain_llm_resilience import FallbackChatModel
from llm_resilience.testing import Fault, FaultInjectingServer

try:
    from langchain_llm_resilience import STREAM_RESTART_EVENT
except ImportError:  # pragma: no cover - older revisions
    STREAM_RESTART_EVENT = "fallback_stream_restart"

try:
    from llm_resilience import MemberProfile
except ImportError:  # pragma: no cover - pending
    MemberProfile = None  # type: ignore[assignment,misc]

MESSAGES: list[BaseMessage] = [HumanMessage(content="Say something.")]
PRIMARY_REPLY = "one two three four five six seven eight"
SECONDARY_REPLY = "the secondary answered this request"
REPLIES = {PRIMARY_REPLY.replace(" ", ""): "primary", SECONDARY_REPLY.replace(" ", ""): "secondary"}

#: How long a fault keeps the primary silent (a hang, a slow first token, a stall).
DELAY = 2.0
#: The per-attempt limit of both contenders: ours' first_token_timeout and idle_timeout,
#: with_fallbacks' SDK timeout. Scaled from the recommended 15 s / 10 s to the delays above.
LIMIT = 1.0
#: Ours' per_client_timeout (the longest answer one will wait for; recommended 300 s) and
#: the SDK backstop of our members.
LONGEST = 10.0
#: Chunks of content the primary streams before a mid-stream fault.
AFTER = 3
#: Calls in a row against a flapping primary (it fails every other request it gets).
FLAPS = 4
#: Gap before each of the primary reply's 8 chunks in the "healthy but slow" row: under
#: LIMIT, so a stream must not be cut; a non-streamed answer takes 8 gaps, over LIMIT.
SLOW_GAP = 0.25

#: Options issue 10 asks for beyond the time limits; listed as pending when absent.
LATER_OPTIONS = {
    "mid_stream": "a restarted stream a plain consumer can use (mid_stream=)",
    "member_retry": "short waits on the same member (member_retry=, e.g. a 500 retried once)",
    "hedge_after": "hedged requests (hedge_after=)",
}

SHAPES = ("invoke", "ainvoke", "stream", "astream")
CONTENDERS = ("ours", "with_fallbacks")

OPTIONS = set(FallbackChatModel.model_fields)


@dataclass(frozen=True)
class Kind:
    label: str
    #: Fault factory name on ``Fault`` (checked with hasattr), or None for "ok".
    factory: str | None
    build: Callable[[], Fault] | None
    #: FallbackChatModel options the scenario relies on.
    needs: tuple[str, ...] = ()
    #: Shapes it applies to (faults that only exist in a stream skip invoke).
    shapes: tuple[str, ...] = SHAPES
    #: Every request to the primary fails (``default_fault``), not only the first.
    persistent: bool = False
    #: What the secondary answers every request with (``default_fault``), or None (ok).
    secondary: Callable[[], Fault] | None = None
    #: A flapping primary: the primary's script for ``calls`` calls in a row, timed and
    #: reported together (the cell's seconds are the total of the ``calls`` calls).
    sequence: Callable[[], list[Fault]] | None = None
    calls: int = 1


STREAMS = ("stream", "astream")

KINDS = (
    Kind("healthy (floor)", "ok", lambda: Fault.ok()),
    Kind(
        f"healthy but slow ({SLOW_GAP} s a chunk, {SLOW_GAP * 8:.0f} s in all)",
        "slow",
        lambda: Fault.slow(delay_per_chunk=SLOW_GAP),
    ),
    Kind("429, no Retry-After", "status", lambda: Fault.status(429)),
    Kind("429, retry-after-ms: 500", "status", lambda: Fault.status(429, retry_after_ms=500)),
    Kind("500 once", "status", lambda: Fault.status(500)),
    Kind("503 persistent", "status", lambda: Fault.status(503), persistent=True),
    Kind("reset before headers", "refuse", lambda: Fault.refuse()),
    Kind(f"no response ({DELAY:.0f} s hang)", "hang", lambda: Fault.hang(DELAY)),
    Kind(
        f"slow first token ({DELAY:.0f} s)",
        "slow_first_token",
        lambda: Fault.slow_first_token(DELAY),
        needs=("first_token_timeout",),
    ),
    Kind(
        f"stream cut after {AFTER} chunks",
        "drop_mid_stream",
        lambda: Fault.drop_mid_stream(after_chunks=AFTER),
        shapes=STREAMS,
    ),
    Kind(
        f"stream stall after {AFTER} chunks ({DELAY:.0f} s)",
        "stall_mid_stream",
        lambda: Fault.stall_mid_stream(after_chunks=AFTER, seconds=DELAY),
        needs=("idle_timeout",),
        shapes=STREAMS,
    ),
    Kind(
        f"malformed chunk after {AFTER} chunks",
        "malformed_chunk",
        lambda: Fault.malformed_chunk(after_chunks=AFTER),
        shapes=STREAMS,
    ),
    Kind("missing [DONE]", "missing_done", lambda: Fault.missing_done(), shapes=STREAMS),
    Kind(
        f"stream cut after {AFTER} chunks, secondary rejects prefill",
        "prefill_rejected",
        lambda: Fault.drop_mid_stream(after_chunks=AFTER),
        shapes=STREAMS,
        secondary=lambda: Fault.prefill_rejected(),
    ),
    Kind(
        "content filter: prompt refused (400 content_filter)",
        "content_filtered",
        lambda: Fault.content_filtered(prompt=True),
    ),
    Kind(
        f"content filter: answer cut after {AFTER} chunks",
        "content_filtered",
        lambda: Fault.content_filtered(after_chunks=AFTER),
    ),
    Kind(
        f"flapping primary (503, ok, 503, ok): {FLAPS} calls",
        "status",
        None,
        shapes=("invoke", "stream"),
        sequence=lambda: [Fault.status(503), Fault.ok()] * (FLAPS // 2),
        calls=FLAPS,
    ),
    Kind(
        f"flapping primary (hang, ok, hang, ok): {FLAPS} calls",
        "hang",
        None,
        needs=("first_token_timeout",),
        shapes=("invoke", "stream"),
        sequence=lambda: [Fault.hang(DELAY), Fault.ok()] * (FLAPS // 2),
        calls=FLAPS,
    ),
    Kind(
        "context too long (secondary larger)",
        "context_length_exceeded",
        lambda: Fault.context_length_exceeded("openai", tokens=130_000, maximum=128_000),
        needs=("member_profiles",),
    ),
)


@dataclass(frozen=True)
class Variant:
    """An opt-in setting of ours, run on the failure kinds it is for."""

    label: str
    option: str
    settings: Callable[[], dict[str, Any]]
    kinds: tuple[str, ...]
    #: A value the option must accept (checked before running), or None.
    requires_value: str | None = None
    #: The secondary gives the primary's answer, as a model continuing it would.
    same_reply: bool = False


def _member_retry() -> dict[str, Any]:
    from llm_resilience import RetryPolicy

    return {"member_retry": RetryPolicy(attempts=2, base_delay=0.1, max_delay=0.8, jitter=0)}


def _cooldown() -> dict[str, Any]:
    from llm_resilience import Cooldown

    return {"cooldown": Cooldown(failures=1, window=60, duration=30)}


RETRIED = ("429, no Retry-After", "429, retry-after-ms: 500", "500 once", "503 persistent")
MID_STREAM = tuple(
    k.label
    for k in KINDS
    if k.factory in ("drop_mid_stream", "stall_mid_stream", "malformed_chunk", "prefill_rejected")
)
FLAPPING = tuple(k.label for k in KINDS if k.sequence is not None)
CONTENT_FILTER = tuple(k.label for k in KINDS if k.factory == "content_filtered")

VARIANTS = (
    Variant(
        "member_retry=RetryPolicy(attempts=2, base_delay=0.1, max_delay=0.8, jitter=0)",
        "member_retry",
        _member_retry,
        RETRIED,
    ),
    Variant(
        'mid_stream="raise"', "mid_stream", lambda: {"mid_stream": "raise"}, MID_STREAM, "raise"
    ),
    Variant(
        'mid_stream="continue"',
        "mid_stream",
        lambda: {"mid_stream": "continue"},
        MID_STREAM + CONTENT_FILTER,
        "continue",
        same_reply=True,
    ),
    Variant(
        "cooldown=Cooldown(failures=1, window=60, duration=30)",
        "cooldown",
        _cooldown,
        FLAPPING,
    ),
)


def variant_pending(variant: Variant) -> str | None:
    if variant.option not in OPTIONS:
        return f"FallbackChatModel option {variant.option} not in this checkout"
    try:
        probe = [ChatOpenAI(api_key=SecretStr("x"), max_retries=0) for _ in range(2)]
        FallbackChatModel(models=probe, **variant.settings())
    except (TypeError, ValueError, ImportError) as exc:
        return f"{variant.label} not accepted in this checkout: {str(exc).splitlines()[0]}"
    return None


def pending(kind: Kind) -> str | None:
    """Why ``kind`` cannot run on this checkout, or None."""
    if kind.factory is not None and not hasattr(Fault, kind.factory):
        return f"fault `Fault.{kind.factory}` not in this checkout"
    if kind.build is not None:
        try:
            kind.build()
        except (TypeError, ValueError) as exc:  # a factory whose signature changed
            return f"`Fault.{kind.factory}` does not take these arguments here: {exc}"
    missing = [option for option in kind.needs if option not in OPTIONS]
    if missing:
        return f"FallbackChatModel option(s) {', '.join(missing)} not in this checkout"
    if "member_profiles" in kind.needs and MemberProfile is None:
        return "`llm_resilience.MemberProfile` not in this checkout"
    return None


# -- contenders --------------------------------------------------------------------------


def _openai(server: FaultInjectingServer, timeout: float) -> ChatOpenAI:
    return ChatOpenAI(
        model="gpt-4o-mini",
        base_url=server.openai_base_url,
        api_key="sk-FAKE-openai",  # type: ignore[arg-type]
        max_retries=0,
        timeout=timeout,
    )


def _anthropic(server: FaultInjectingServer, timeout: float) -> ChatAnthropic:
    return ChatAnthropic(  # type: ignore[call-arg]
        model_name="claude-haiku-4-5",
        base_url=server.anthropic_base_url,
        api_key="sk-FAKE-anthropic",  # type: ignore[arg-type]
        max_retries=0,
        timeout=timeout,
        stop=None,
    )


def ours_settings() -> dict[str, Any]:
    """The recommended settings, scaled; only the options this checkout has."""
    settings: dict[str, Any] = {}
    if "first_token_timeout" in OPTIONS and "idle_timeout" in OPTIONS:
        settings.update(per_client_timeout=LONGEST, first_token_timeout=LIMIT, idle_timeout=LIMIT)
    else:  # the older recommendation: one bound per attempt
        settings.update(per_client_timeout=LIMIT)
    if "member_profiles" in OPTIONS and MemberProfile is not None:
        settings["member_profiles"] = [
            MemberProfile(context_window=128_000),
            MemberProfile(context_window=200_000),
        ]
    return settings


def contenders(primary: FaultInjectingServer, secondary: FaultInjectingServer) -> dict[str, Any]:
    ours = FallbackChatModel(
        models=[_openai(primary, LONGEST), _anthropic(secondary, LONGEST)], **ours_settings()
    )
    langchain = _openai(primary, LIMIT).with_fallbacks([_anthropic(secondary, LIMIT)])
    return {"ours": ours, "with_fallbacks": langchain}


# -- one call ----------------------------------------------------------------------------


class Restarts(BaseCallbackHandler):
    def __init__(self) -> None:
        self.count = 0  # restarts from the beginning (the consumer should discard)
        self.continued = 0  # continuations (the consumer keeps what it holds)

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        if name == STREAM_RESTART_EVENT:
            if isinstance(data, dict) and data.get("continued"):
                self.continued += 1
            else:
                self.count += 1


@dataclass
class Outcome:
    seconds: float
    got: str  # short description of what the consumer held at the end


def _who(text: str) -> str | None:
    return REPLIES.get(text.replace(" ", ""))


def _describe_text(text: str, restarts: Restarts, after_restart: str) -> str:
    who = _who(text)
    if who is not None:
        if restarts.continued and not restarts.count:
            return f"one answer ({who}'s text, continued by the secondary)"
        return f"one answer ({who})"
    squeezed = text.replace(" ", "")
    if squeezed and any(reply.startswith(squeezed) for reply in REPLIES):
        return f"answer cut short ({len(text)} chars)"
    restarts_count = restarts.count
    for reply, who in REPLIES.items():
        if squeezed.endswith(reply) and len(squeezed) > len(reply):
            if not restarts_count:
                return f"prefix+answer ({who}), no restart event"
            listener = "one answer" if _who(after_restart) else "not one answer"
            return f"prefix+answer ({who}); a restart listener: {listener}"
    return f"corrupted ({len(text)} chars)"


def _describe_call(text: str) -> str:
    who = _who(text)
    if who is not None:
        return who
    squeezed = text.replace(" ", "")
    if squeezed and any(reply.startswith(squeezed) for reply in REPLIES):
        return f"answer cut short ({len(text)} chars)"
    return f"wrong answer {text!r}"


def _text(message: Any) -> str:
    # ``.text`` is a property (str subclass) in langchain-core 1.x: content blocks joined.
    return str(message.text)


def call_sync(runnable: Runnable[Any, Any], shape: str) -> Outcome:
    restarts = Restarts()
    config: RunnableConfig = {"callbacks": [restarts]}
    text = after_restart = ""
    seen = 0
    start = time.perf_counter()
    try:
        if shape == "invoke":
            message = runnable.invoke(MESSAGES, config=config)
            got = _describe_call(_text(message))
        else:
            for chunk in runnable.stream(MESSAGES, config=config):
                if restarts.count != seen:  # the event came before this chunk
                    seen, after_restart = restarts.count, ""
                text += _text(chunk)
                after_restart += _text(chunk)
            got = _describe_text(text, restarts, after_restart)
    except Exception as exc:
        got = _error(exc, text, shape)
    return Outcome(time.perf_counter() - start, got)


async def call_async(runnable: Runnable[Any, Any], shape: str) -> Outcome:
    restarts = Restarts()
    config: RunnableConfig = {"callbacks": [restarts]}
    text = after_restart = ""
    seen = 0
    start = time.perf_counter()
    try:
        if shape == "ainvoke":
            message = await runnable.ainvoke(MESSAGES, config=config)
            got = _describe_call(_text(message))
        else:
            async for chunk in runnable.astream(MESSAGES, config=config):
                if restarts.count != seen:  # the event came before this chunk
                    seen, after_restart = restarts.count, ""
                text += _text(chunk)
                after_restart += _text(chunk)
            got = _describe_text(text, restarts, after_restart)
    except Exception as exc:
        got = _error(exc, text, shape)
    return Outcome(time.perf_counter() - start, got)


def _error(exc: BaseException, text: str, shape: str) -> str:
    name = type(exc).__name__
    if shape in STREAMS:
        return f"error {name} after {len(text)} chars"
    return f"error {name}"


# -- running -----------------------------------------------------------------------------


@dataclass
class Cell:
    seconds: float
    got: str


def _summary(outcomes: list[Outcome]) -> Cell:
    counts = collections.Counter(o.got for o in outcomes)
    got, n = counts.most_common(1)[0]
    if n < len(outcomes):
        got = f"{got} ({n}/{len(outcomes)}; also {', '.join(g for g in counts if g != got)})"
    return Cell(statistics.median(o.seconds for o in outcomes), got)


def run(
    reps: int, loop: asyncio.AbstractEventLoop
) -> tuple[dict[tuple[str, str], dict[str, Cell]], list[str]]:
    results: dict[tuple[str, str], dict[str, Cell]] = {}
    skipped: list[str] = []
    variants.clear()
    with (
        FaultInjectingServer(reply=PRIMARY_REPLY, name="primary") as primary,
        FaultInjectingServer(reply=SECONDARY_REPLY, name="secondary") as secondary,
    ):
        servers = (primary, secondary)
        models = contenders(primary, secondary)
        # Warm-up: the first call of each client builds its SDK client and connection pool.
        for shape in SHAPES:
            for model in models.values():
                _one(model, shape, loop)
        for kind in KINDS:
            why = pending(kind)
            if why is not None:
                skipped.append(f"pending: {kind.label}: {why}")
                print(skipped[-1], file=sys.stderr)
                continue
            for shape in kind.shapes:
                outcomes: dict[str, list[Outcome]] = {name: [] for name in CONTENDERS}
                for rep in range(reps):
                    order = CONTENDERS if rep % 2 == 0 else CONTENDERS[::-1]
                    for name in order:
                        trial = _trial(kind, lambda name=name: models[name], shape, loop, servers)
                        outcomes[name].append(trial)
                results[(kind.label, shape)] = {n: _summary(o) for n, o in outcomes.items()}
                cells = results[(kind.label, shape)]
                print(
                    f"  {kind.label:<40} {shape:<8} "
                    + "  ".join(f"{n}={c.seconds:.2f}s {c.got}" for n, c in cells.items()),
                    file=sys.stderr,
                )
        for variant in VARIANTS:
            why = variant_pending(variant)
            if why is not None:
                skipped.append(f"pending: {variant.label}: {why}")
                print(skipped[-1], file=sys.stderr)
                continue
            members = [_openai(primary, LONGEST), _anthropic(secondary, LONGEST)]
            settings = {**ours_settings(), **variant.settings()}
            model = FallbackChatModel(models=members, **settings)

            def fresh(
                model: FallbackChatModel = model,
                members: list[Any] = members,
                settings: dict[str, Any] = settings,
            ) -> FallbackChatModel:
                # A chain with a breaker starts each flapping trial closed; the members
                # (and their warm connection pools) are the same.
                if "cooldown" not in settings:
                    return model
                return FallbackChatModel(models=members, **settings)

            secondary.reply = PRIMARY_REPLY if variant.same_reply else SECONDARY_REPLY
            for shape in SHAPES:
                _one(model, shape, loop)  # warm-up
            for kind in KINDS:
                if kind.label not in variant.kinds or pending(kind) is not None:
                    continue
                for shape in kind.shapes:
                    runs: list[Outcome] = []
                    for _ in range(reps):
                        runs.append(_trial(kind, fresh, shape, loop, servers))
                    cell = _summary(runs)
                    variants[(kind.label, shape, variant.label)] = cell
                    print(
                        f"  {variant.label[:30]:<30} {kind.label:<40} {shape:<8} "
                        f"{cell.seconds:.2f}s {cell.got}",
                        file=sys.stderr,
                    )
    return results, skipped


def _trial(
    kind: Kind,
    model: Callable[[], Runnable[Any, Any]],
    shape: str,
    loop: asyncio.AbstractEventLoop,
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> Outcome:
    """One timed trial of ``kind``: one call, or a flapping primary's ``calls`` calls."""
    primary, secondary = servers
    primary.reset()
    secondary.reset()
    secondary.default_fault = kind.secondary() if kind.secondary else Fault.ok()
    try:
        if kind.sequence is None:
            fault = kind.build() if kind.build else Fault.ok()
            primary.default_fault = fault if kind.persistent else Fault.ok()
            if not kind.persistent:
                primary.script(fault)
            return _one(model(), shape, loop)
        primary.script(*kind.sequence())
        runnable = model()
        outcomes = [_one(runnable, shape, loop) for _ in range(kind.calls)]
        served = collections.Counter(o.got for o in outcomes)
        got = ", ".join(f"{n} x {what}" for what, n in sorted(served.items()))
        return Outcome(sum(o.seconds for o in outcomes), got)
    finally:
        primary.default_fault = Fault.ok()
        secondary.default_fault = Fault.ok()


#: Cells of the opt-in variants, by (failure kind, call, variant label).
variants: dict[tuple[str, str, str], Cell] = {}


def _one(model: Runnable[Any, Any], shape: str, loop: asyncio.AbstractEventLoop) -> Outcome:
    if shape in ("invoke", "stream"):
        return call_sync(model, shape)
    return loop.run_until_complete(call_async(model, shape))


# -- reporting ---------------------------------------------------------------------------


def table(results: dict[tuple[str, str], dict[str, Cell]], shapes: tuple[str, ...]) -> str:
    lines = [
        "| failure of the primary | call | ours s | ours: consumer gets "
        "| with_fallbacks s | with_fallbacks: consumer gets |",
        "| --- | --- | ---: | --- | ---: | --- |",
    ]
    for (label, shape), cells in results.items():
        if shape not in shapes:
            continue
        ours, theirs = cells["ours"], cells["with_fallbacks"]
        lines.append(
            f"| {label} | {shape} | {ours.seconds:.3f} | {ours.got} "
            f"| {theirs.seconds:.3f} | {theirs.got} |"
        )
    return "\n".join(lines)


def variant_table(results: dict[tuple[str, str], dict[str, Cell]]) -> str:
    lines = [
        "| failure of the primary | call | ours, opt-in setting | s | consumer gets "
        "| ours (recommended only) s | ours (recommended only) gets |",
        "| --- | --- | --- | ---: | --- | ---: | --- |",
    ]
    for (label, shape, variant), cell in variants.items():
        base = results[(label, shape)]["ours"]
        lines.append(
            f"| {label} | {shape} | `{variant.split('(')[0]}` | {cell.seconds:.3f} | {cell.got} "
            f"| {base.seconds:.3f} | {base.got} |"
        )
    return "\n".join(lines)


def machine() -> str:
    return (
        f"Python {platform.python_version()}, langchain-core {langchain_core.__version__}, "
        f"openai {openai.__version__}, {os.cpu_count()} CPU(s), {platform.machine()} "
        f"{platform.system()}; load average {_load()}"
    )


def _load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one call per cell")
    parser.add_argument("--reps", type=int, default=3, help="calls per cell (median)")
    args = parser.parse_args(argv)
    for variable in ("LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING", "LANGSMITH_TRACING"):
        os.environ.pop(variable, None)
    # Production-style logging: WARNINGs are formatted, then discarded.
    logging.basicConfig(level=logging.WARNING, stream=open(os.devnull, "w"))  # noqa: SIM115
    reps = 1 if args.quick else max(1, args.reps)
    loop = asyncio.new_event_loop()
    started = time.perf_counter()
    try:
        results, skipped = run(reps, loop)
    finally:
        loop.close()
    settings = ", ".join(
        f"{k}={v!r}" if k != "member_profiles" else "member_profiles=[128k, 200k]"
        for k, v in ours_settings().items()
    )
    print(f"Machine: {machine()}")
    print()
    print(
        f"ours: FallbackChatModel({settings}); members' SDK timeout={LONGEST}. "
        f"with_fallbacks: members' SDK timeout={LIMIT}. Both max_retries=0. "
        f"Fault delays {DELAY} s; median of {reps} call(s) per cell."
    )
    print()
    print("### invoke / ainvoke")
    print()
    print(table(results, ("invoke", "ainvoke")))
    print()
    print("### stream / astream (text concatenated by a plain consumer)")
    print()
    print(table(results, STREAMS))
    print()
    if variants:
        print("### ours with opt-in settings (on top of the above)")
        print()
        print("; ".join(f"`{v.label}`" for v in VARIANTS if variant_pending(v) is None) + ".")
        print()
        print(variant_table(results))
        print()
    for line in skipped:
        print(line)
    for option, what in LATER_OPTIONS.items():
        if option not in OPTIONS:
            print(f"pending: FallbackChatModel option {option} not in this checkout: {what}")
    print(f"{time.perf_counter() - started:.1f} s; load average at the end {_load()}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
