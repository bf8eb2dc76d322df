"""The fallback engine against SPEC section 2, with plain callables as clients.

Clients here are Python functions (sync), coroutine functions (async), generator functions
(sync streams) and async generator functions (async streams); every attempt is simply
``lambda index, client: client()``. Hung clients block on an event that is released when
the test ends, and timeouts are 0.05-0.2 s, so the whole file runs in a few seconds.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from typing import Any

import httpx
import openai
import pytest

from llm_resilience import (
    Cooldown,
    FallbackChain,
    PerClientTimeoutError,
    StreamRestart,
    TransientClassifier,
)
from llm_resilience.self_retry import self_retry_setting, warn_if_self_retrying

LOGGER = "llm_resilience.fallback"
SECRET = "SECRET-PROMPT-OR-ANSWER"


def call(index: int, client: Callable[[], Any]) -> Any:
    """The attempt every test uses: call the client."""
    return client()


class StatusError(Exception):
    """An SDK-like error carrying an HTTP status."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rate_limited(headers: dict[str, str]) -> openai.RateLimitError:
    """A real openai 429 error whose response carries ``headers``."""
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx.Response(429, headers=headers, request=request)
    return openai.RateLimitError("Too many requests", response=response, body=None)


def drain(chunks: Iterator[str], into: list[str]) -> None:
    for chunk in chunks:
        into.append(chunk)


async def adrain(chunks: AsyncIterator[str], into: list[str]) -> None:
    async for chunk in chunks:
        into.append(chunk)


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event hung sync clients wait on; released at teardown so their threads end."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """The WARNING messages of the fallback logger, in order."""
    caplog.set_level(logging.DEBUG, logger="llm_resilience")

    def messages() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.WARNING
        ]

    return messages


# -- construction ---------------------------------------------------------------------


@pytest.mark.parametrize("clients", [[], ["only"]])
def test_a_chain_needs_at_least_two_clients(clients: list[str]) -> None:
    with pytest.raises(ValueError, match=r"clients must hold at least 2 clients"):
        FallbackChain(clients)


@pytest.mark.parametrize("clients", [iter(["a", "b"]), "ab", {"a", "b"}, 42])
def test_clients_must_be_a_sequence(clients: Any) -> None:
    with pytest.raises(TypeError, match=r"clients must be a list of at least 2 clients"):
        FallbackChain(clients)


@pytest.mark.parametrize(
    ("timeout", "allowed"),
    [
        (0, "greater than 0"),
        (-1, "greater than 0"),
        (math.nan, "greater than 0"),
        (math.inf, "at most 31536000 seconds"),
        (1e10, "at most 31536000 seconds"),
        (1e300, "at most 31536000 seconds"),
        (timedelta.max, "at most 31536000 seconds"),
        (timedelta(0), "greater than 0"),
        (timedelta(seconds=-5), "greater than 0"),
        ("30", "number of seconds"),
        (True, "number of seconds"),
        ([30], "number of seconds"),
    ],
)
def test_a_bad_per_client_timeout_is_refused_naming_the_option_and_what_is_allowed(
    timeout: Any, allowed: str
) -> None:
    # SPEC: "anything else raises ValueError naming the option"; wrong types are also
    # TypeErrors, as Python code expects.
    with pytest.raises(ValueError, match="per_client_timeout") as caught:
        FallbackChain(["a", "b"], per_client_timeout=timeout)
    assert allowed in str(caught.value)


def test_a_wrongly_typed_per_client_timeout_is_also_a_type_error() -> None:
    with pytest.raises(TypeError, match="per_client_timeout"):
        FallbackChain(["a", "b"], per_client_timeout="30")


@pytest.mark.parametrize(
    ("timeout", "seconds"),
    [(None, None), (30, 30.0), (0.5, 0.5), (timedelta(seconds=30), 30.0)],
)
def test_per_client_timeout_accepts_none_seconds_and_timedelta(
    timeout: Any, seconds: float | None
) -> None:
    assert FallbackChain(["a", "b"], per_client_timeout=timeout).per_client_timeout == seconds


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"failures": 0}, "Cooldown.failures"),
        ({"failures": -1}, "Cooldown.failures"),
        ({"failures": 1.5}, "Cooldown.failures"),
        ({"window": -1}, "Cooldown.window"),
        ({"window": 0}, "Cooldown.window"),
        ({"duration": "30"}, "Cooldown.duration"),
        ({"duration": math.inf}, "Cooldown.duration"),
        ({"max_retry_after": 0}, "Cooldown.max_retry_after"),
        ({"honor_retry_after": "yes"}, "Cooldown.honor_retry_after"),
    ],
)
def test_a_bad_cooldown_is_refused_naming_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises((TypeError, ValueError), match=field):
        Cooldown(**options)


def test_cooldown_accepts_timedelta_durations_as_seconds() -> None:
    cooldown = Cooldown(failures=2, window=timedelta(minutes=1), duration=timedelta(seconds=5))
    assert (cooldown.window, cooldown.duration) == (60.0, 5.0)


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"classifier": "transient"}, "classifier"),
        ({"on_restart": 42}, "on_restart"),
        ({"cooldown": {"failures": 3}}, "cooldown"),
    ],
)
def test_bad_hooks_are_refused_naming_the_option(options: dict[str, Any], option: str) -> None:
    with pytest.raises(TypeError, match=option):
        FallbackChain(["a", "b"], **options)


# -- order, once each, what propagates -------------------------------------------------


def test_clients_are_tried_in_order_each_once_until_one_succeeds() -> None:
    calls: list[int] = []

    def client(index: int, fail: bool) -> Callable[[], str]:
        def run() -> str:
            calls.append(index)
            if fail:
                raise ConnectionError("refused")
            return f"answer {index}"

        return run

    chain = FallbackChain([client(0, True), client(1, True), client(2, False), client(3, False)])
    assert chain.invoke(call) == "answer 2"
    assert calls == [0, 1, 2]


def test_a_transient_failure_moves_on_at_once_with_no_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_sleeping(seconds: float) -> None:
        raise AssertionError(f"the chain slept {seconds}s")

    monkeypatch.setattr(time, "sleep", no_sleeping)

    def failing() -> str:
        raise StatusError(429)

    started = time.perf_counter()
    assert FallbackChain([failing, failing, lambda: "ok"]).invoke(call) == "ok"
    assert time.perf_counter() - started < 0.25  # a backoff would take seconds


async def test_an_async_transient_failure_moves_on_at_once_with_no_delay() -> None:
    async def failing() -> str:
        raise StatusError(503)

    async def answering() -> str:
        return "ok"

    started = time.perf_counter()
    assert await FallbackChain([failing, failing, answering]).ainvoke(call) == "ok"
    assert time.perf_counter() - started < 0.25  # a backoff would take seconds


def test_a_non_transient_error_propagates_at_once_and_later_clients_are_never_called() -> None:
    error = ValueError("bad request")
    called: list[str] = []

    def broken() -> str:
        raise error

    def later() -> str:
        called.append("later")
        return "never"

    with pytest.raises(ValueError) as caught:
        FallbackChain([broken, later]).invoke(call)
    assert caught.value is error
    assert called == []


async def test_an_async_non_transient_error_propagates_and_later_clients_are_never_called() -> None:
    error = StatusError(400)
    called: list[str] = []

    async def broken() -> str:
        raise error

    async def later() -> str:
        called.append("later")
        return "never"

    with pytest.raises(StatusError) as caught:
        await FallbackChain([broken, later], per_client_timeout=1).ainvoke(call)
    assert caught.value is error
    assert called == []


@pytest.mark.parametrize("per_client_timeout", [None, 1.0])
def test_when_every_client_fails_the_last_exception_object_is_raised(
    per_client_timeout: float | None,
) -> None:
    errors = [ConnectionError("refused"), StatusError(429), StatusError(503)]

    def failing(error: Exception) -> Callable[[], str]:
        def run() -> str:
            raise error

        return run

    chain = FallbackChain([failing(e) for e in errors], per_client_timeout=per_client_timeout)
    with pytest.raises(StatusError) as caught:
        chain.invoke(call)
    assert caught.value is errors[-1]


@pytest.mark.parametrize("per_client_timeout", [None, 1.0])
async def test_when_every_async_client_fails_the_last_exception_object_is_raised(
    per_client_timeout: float | None,
) -> None:
    errors = [StatusError(429), TimeoutError("read timed out")]

    def failing(error: Exception) -> Callable[[], Any]:
        async def run() -> str:
            raise error

        return run

    chain = FallbackChain([failing(e) for e in errors], per_client_timeout=per_client_timeout)
    with pytest.raises(TimeoutError) as caught:
        await chain.ainvoke(call)
    assert caught.value is errors[-1]
    assert not isinstance(caught.value, PerClientTimeoutError)


def test_the_default_classifier_treats_a_500_as_final() -> None:
    def server_error() -> str:
        raise StatusError(500)

    with pytest.raises(StatusError):
        FallbackChain([server_error, lambda: "ok"]).invoke(call)


def test_a_custom_classifier_decides_what_is_transient() -> None:
    def server_error() -> str:
        raise StatusError(500)

    chain = FallbackChain(
        [server_error, lambda: "ok"], classifier=TransientClassifier.with_server_errors()
    )
    assert chain.invoke(call) == "ok"
    picky = FallbackChain([server_error, lambda: "ok"], classifier=lambda error: False)
    with pytest.raises(StatusError):
        picky.invoke(call)


# -- per-client timeout ----------------------------------------------------------------


def test_a_hung_sync_client_is_abandoned_and_the_call_returns_while_it_is_still_blocked(
    gate: threading.Event,
) -> None:
    finished = threading.Event()

    def hung() -> str:
        gate.wait(5)
        finished.set()
        return "late answer"

    started = time.perf_counter()
    assert FallbackChain([hung, lambda: "backup"], per_client_timeout=0.05).invoke(call) == (
        "backup"
    )
    assert time.perf_counter() - started < 0.5
    assert not finished.is_set(), "the abandoned attempt should still be blocked"
    gate.set()
    assert finished.wait(2), "the abandoned attempt should finish once released"


def test_the_late_result_of_an_abandoned_attempt_is_discarded(
    gate: threading.Event, warnings: Callable[[], list[str]]
) -> None:
    finished = threading.Event()
    backup_calls: list[int] = []

    def hung() -> str:
        gate.wait(5)
        finished.set()
        return "late answer"

    def backup() -> str:
        backup_calls.append(1)
        return "backup"

    chain = FallbackChain([hung, backup], per_client_timeout=0.05)
    assert chain.invoke(call) == "backup"
    gate.set()
    assert finished.wait(2)
    assert backup_calls == [1]
    assert warnings() == ["Client 0 timed out after 0:00:00.050000; trying next client."]


def test_the_last_sync_client_timing_out_raises_per_client_timeout_error_with_a_cause(
    gate: threading.Event,
) -> None:
    def hung() -> str:
        gate.wait(5)
        return "late"

    with pytest.raises(PerClientTimeoutError) as caught:
        FallbackChain([hung, hung], per_client_timeout=0.05).invoke(call)
    error = caught.value
    assert isinstance(error, TimeoutError)
    assert not isinstance(error, asyncio.CancelledError)
    assert error.__cause__ is not None
    assert error.__cause__ is not error
    assert (error.client_index, error.timeout) == (1, timedelta(seconds=0.05))


async def test_a_hung_async_client_is_cancelled_at_its_timeout_and_the_next_answers() -> None:
    cancelled = asyncio.Event()

    async def hung() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    async def backup() -> str:
        return "backup"

    assert await FallbackChain([hung, backup], per_client_timeout=0.05).ainvoke(call) == "backup"
    assert cancelled.is_set()


async def test_the_last_async_client_timing_out_raises_per_client_timeout_error_with_a_cause() -> (
    None
):
    async def hung() -> str:
        await asyncio.Event().wait()
        return "never"

    with pytest.raises(PerClientTimeoutError) as caught:
        await FallbackChain([hung, hung], per_client_timeout=0.05).ainvoke(call)
    error = caught.value
    assert isinstance(error, TimeoutError)
    assert not isinstance(error, asyncio.CancelledError)
    assert error.__cause__ is not None
    assert error.__cause__ is not error
    assert error.client_index == 1


def test_a_sync_attempt_on_its_worker_thread_sees_the_callers_context_variables() -> None:
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    request_id.set("req-42")
    seen: list[tuple[str, bool]] = []

    def client() -> str:
        seen.append((request_id.get("missing"), threading.current_thread() is main))
        return "ok"

    main = threading.current_thread()
    assert FallbackChain([client, client], per_client_timeout=1).invoke(call) == "ok"

    def streaming() -> Iterator[str]:
        seen.append((request_id.get("missing"), threading.current_thread() is main))
        yield "chunk"

    assert list(FallbackChain([streaming, streaming], per_client_timeout=1).stream(call)) == [
        "chunk"
    ]
    assert seen == [("req-42", False), ("req-42", False)]


# -- cancellation ----------------------------------------------------------------------


@pytest.mark.parametrize("per_client_timeout", [None, 5.0])
async def test_caller_cancellation_of_ainvoke_is_never_rerouted(
    per_client_timeout: float | None,
) -> None:
    started = asyncio.Event()
    later: list[str] = []

    async def slow() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    async def backup() -> str:
        later.append("backup")
        return "backup"

    chain = FallbackChain([slow, backup], per_client_timeout=per_client_timeout)
    task = asyncio.create_task(chain.ainvoke(call))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert later == []


@pytest.mark.parametrize("per_client_timeout", [None, 5.0])
async def test_caller_cancellation_of_astream_is_never_rerouted(
    per_client_timeout: float | None,
) -> None:
    streaming = asyncio.Event()
    later: list[str] = []

    async def slow() -> AsyncIterator[str]:
        yield "first"
        streaming.set()
        await asyncio.Event().wait()
        yield "never"

    async def backup() -> AsyncIterator[str]:
        later.append("backup")
        yield "backup"

    chain = FallbackChain([slow, backup], per_client_timeout=per_client_timeout)
    received: list[str] = []

    task = asyncio.create_task(adrain(chain.astream(call), received))
    await streaming.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert received == ["first"]
    assert later == []


@pytest.mark.parametrize("per_client_timeout", [None, 5.0])
async def test_a_client_raising_its_own_cancellation_is_not_rerouted(
    per_client_timeout: float | None,
) -> None:
    later: list[str] = []

    async def cancelling() -> str:
        raise asyncio.CancelledError

    async def backup() -> str:
        later.append("backup")
        return "backup"

    async def cancelling_stream() -> AsyncIterator[str]:
        yield "first"
        raise asyncio.CancelledError

    async def backup_stream() -> AsyncIterator[str]:
        later.append("backup stream")
        yield "backup"

    with pytest.raises(asyncio.CancelledError):
        await FallbackChain([cancelling, backup], per_client_timeout=per_client_timeout).ainvoke(
            call
        )
    chain = FallbackChain([cancelling_stream, backup_stream], per_client_timeout=per_client_timeout)
    with pytest.raises(asyncio.CancelledError):
        await adrain(chain.astream(call), [])
    assert later == []


# -- logging ---------------------------------------------------------------------------


def test_one_warning_per_fallback_attempt_and_none_after_the_last_client(
    warnings: Callable[[], list[str]],
) -> None:
    def failing() -> str:
        raise ConnectionError("refused")

    with pytest.raises(ConnectionError):
        FallbackChain([failing, failing, failing]).invoke(call)
    assert warnings() == [
        "Client 0 failed transiently; trying next client.",
        "Client 1 failed transiently; trying next client.",
    ]


async def test_an_async_timeout_is_logged_with_the_timeout_as_a_timedelta(
    warnings: Callable[[], list[str]],
) -> None:
    async def hung() -> str:
        await asyncio.Event().wait()
        return "never"

    async def backup() -> str:
        return "ok"

    assert await FallbackChain([hung, backup], per_client_timeout=0.1).ainvoke(call) == "ok"
    assert warnings() == ["Client 0 timed out after 0:00:00.100000; trying next client."]


def test_a_mid_stream_failure_is_logged_with_the_token_count(
    warnings: Callable[[], list[str]],
) -> None:
    def breaking() -> Iterator[str]:
        yield from ("a", "b", "c")
        raise ConnectionError("reset")

    def backup() -> Iterator[str]:
        yield "x"

    assert list(FallbackChain([breaking, backup]).stream(call)) == ["a", "b", "c", "x"]
    assert warnings() == [
        "Streaming client 0 failed mid-stream after 3 token(s); restarting with next client."
    ]


async def test_failures_before_the_first_chunk_are_logged_as_before_streaming(
    warnings: Callable[[], list[str]],
) -> None:
    async def refused() -> AsyncIterator[str]:
        raise ConnectionError("refused")
        yield "never"

    async def hung() -> AsyncIterator[str]:
        await asyncio.Event().wait()
        yield "never"

    async def backup() -> AsyncIterator[str]:
        yield "x"

    chain = FallbackChain([refused, hung, backup], per_client_timeout=0.1)
    assert [chunk async for chunk in chain.astream(call)] == ["x"]
    assert warnings() == [
        "Streaming client 0 failed transiently before streaming; trying next client.",
        "Streaming client 1 timed out after 0:00:00.100000 before streaming; trying next client.",
    ]


async def test_no_log_record_carries_prompt_or_response_text(
    caplog: pytest.LogCaptureFixture, gate: threading.Event
) -> None:
    caplog.set_level(logging.DEBUG, logger="llm_resilience")
    prompt = f"{SECRET} prompt"

    def failing() -> str:
        raise ConnectionError(f"refused while sending {prompt}")

    def hung() -> str:
        gate.wait(5)
        return SECRET

    def breaking() -> Iterator[str]:
        yield SECRET
        raise ConnectionError(SECRET)

    async def abreaking() -> AsyncIterator[str]:
        yield SECRET
        raise ConnectionError(SECRET)

    async def aanswer() -> AsyncIterator[str]:
        yield SECRET

    with pytest.raises(ConnectionError):
        FallbackChain([failing, hung, failing], per_client_timeout=0.05).invoke(call)
    assert list(FallbackChain([breaking, lambda: iter([SECRET])]).stream(call)) == [SECRET] * 2
    chain = FallbackChain([abreaking, aanswer], per_client_timeout=1)
    assert [chunk async for chunk in chain.astream(call)] == [SECRET] * 2
    assert len(caplog.records) >= 3
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        assert SECRET not in (record.exc_text or "")


# -- streaming -------------------------------------------------------------------------


@pytest.mark.parametrize("per_client_timeout", [None, 1.0])
def test_a_stream_failing_before_its_first_chunk_tries_the_next_client_without_a_restart(
    per_client_timeout: float | None,
) -> None:
    restarts: list[StreamRestart] = []

    def refused() -> Iterator[str]:
        raise StatusError(429)
        yield "never"

    def backup() -> Iterator[str]:
        yield from ("x", "y")

    chain = FallbackChain(
        [refused, backup], per_client_timeout=per_client_timeout, on_restart=restarts.append
    )
    assert list(chain.stream(call, on_restart=restarts.append)) == ["x", "y"]
    assert restarts == []


@pytest.mark.parametrize("per_client_timeout", [None, 1.0])
def test_a_stream_failing_mid_way_yields_the_prefix_then_restarts_on_the_next_client(
    per_client_timeout: float | None,
) -> None:
    error = ConnectionError("reset")
    from_chain: list[StreamRestart] = []
    from_call: list[StreamRestart] = []

    def breaking() -> Iterator[str]:
        yield from ("a", "b")
        raise error

    def backup() -> Iterator[str]:
        yield from ("x", "y", "z")

    chain = FallbackChain(
        [breaking, backup], per_client_timeout=per_client_timeout, on_restart=from_chain.append
    )
    assert list(chain.stream(call, on_restart=from_call.append)) == ["a", "b", "x", "y", "z"]
    assert from_chain == from_call == [StreamRestart(0, 1, 2, error)]
    assert from_call[0].error is error


def test_a_sync_stream_refuses_an_async_restart_hook() -> None:
    async def hook(restart: StreamRestart) -> None:
        return None

    def breaking() -> Iterator[str]:
        yield "a"
        raise ConnectionError("reset")

    chain = FallbackChain([breaking, lambda: iter(["x"])])
    with pytest.raises(TypeError, match="async on_restart hook"):
        list(chain.stream(call, on_restart=hook))


async def test_astream_restarts_mid_way_and_awaits_async_restart_hooks() -> None:
    error = StatusError(503)
    from_chain: list[StreamRestart] = []
    from_call: list[StreamRestart] = []

    async def async_hook(restart: StreamRestart) -> None:
        await asyncio.sleep(0)
        from_call.append(restart)

    async def breaking() -> AsyncIterator[str]:
        yield "a"
        raise error

    async def backup() -> AsyncIterator[str]:
        yield "x"
        yield "y"

    chain = FallbackChain([breaking, backup], on_restart=from_chain.append)
    assert [c async for c in chain.astream(call, on_restart=async_hook)] == ["a", "x", "y"]
    assert from_chain == from_call == [StreamRestart(0, 1, 1, error)]


def test_is_content_keeps_empty_chunks_out_of_the_token_count(
    warnings: Callable[[], list[str]],
) -> None:
    restarts: list[StreamRestart] = []

    def breaking() -> Iterator[str]:
        yield from ("", "a", "", "b", "c")
        raise ConnectionError("reset")

    chain = FallbackChain([breaking, lambda: iter(["x"])], on_restart=restarts.append)
    assert list(chain.stream(call, is_content=bool)) == ["", "a", "", "b", "c", "x"]
    assert restarts[0].chunks == 3
    assert warnings() == [
        "Streaming client 0 failed mid-stream after 3 token(s); restarting with next client."
    ]


def test_a_sync_stream_timeout_never_counts_the_consumers_time() -> None:
    restarts: list[StreamRestart] = []

    def fast() -> Iterator[str]:
        yield from ("a0", "a1", "a2")

    def backup() -> Iterator[str]:
        yield from ("b0", "b1")

    chain = FallbackChain([fast, backup], per_client_timeout=0.1, on_restart=restarts.append)
    received = []
    for chunk in chain.stream(call):
        received.append(chunk)
        if chunk == "a1":
            time.sleep(0.15)  # the consumer, not the client, is slow
    assert received == ["a0", "a1", "a2"]
    assert restarts == []


async def test_an_async_stream_timeout_never_counts_the_consumers_time() -> None:
    restarts: list[StreamRestart] = []

    async def fast() -> AsyncIterator[str]:
        for chunk in ("a0", "a1", "a2"):
            await asyncio.sleep(0.01)
            yield chunk

    async def backup() -> AsyncIterator[str]:
        yield "b0"
        yield "b1"

    chain = FallbackChain([fast, backup], per_client_timeout=0.1, on_restart=restarts.append)
    received = []
    async for chunk in chain.astream(call):
        received.append(chunk)
        if chunk == "a1":
            await asyncio.sleep(0.15)  # the consumer, not the client, is slow
    assert received == ["a0", "a1", "a2"]
    assert restarts == []


def test_the_last_stream_timing_out_raises_per_client_timeout_error(
    gate: threading.Event,
) -> None:
    def hung() -> Iterator[str]:
        yield "a"
        gate.wait(5)
        yield "late"

    received = []
    with pytest.raises(PerClientTimeoutError) as caught:
        drain(FallbackChain([hung, hung], per_client_timeout=0.05).stream(call), received)
    assert received == ["a", "a"]
    assert caught.value.__cause__ is not None
    assert caught.value.__cause__ is not caught.value


async def test_the_last_async_stream_timing_out_raises_per_client_timeout_error() -> None:
    async def hung() -> AsyncIterator[str]:
        yield "a"
        await asyncio.Event().wait()
        yield "late"

    received = []
    with pytest.raises(PerClientTimeoutError) as caught:
        await adrain(FallbackChain([hung, hung], per_client_timeout=0.05).astream(call), received)
    assert received == ["a", "a"]
    assert not isinstance(caught.value, asyncio.CancelledError)
    assert caught.value.__cause__ is not None
    assert caught.value.__cause__ is not caught.value


@pytest.mark.parametrize("per_client_timeout", [None, 1.0])
async def test_a_stream_attempt_is_created_only_when_iteration_starts(
    per_client_timeout: float | None,
) -> None:
    created: list[str] = []

    def client() -> Iterator[str]:
        created.append("sync")
        return iter(["x"])

    async def aclient() -> AsyncIterator[str]:
        yield "x"

    def acall(index: int, client: Callable[[], AsyncIterator[str]]) -> AsyncIterator[str]:
        created.append("async")
        return client()

    stream = FallbackChain([client, client], per_client_timeout=per_client_timeout).stream(call)
    astream = FallbackChain([aclient, aclient], per_client_timeout=per_client_timeout).astream(
        acall
    )
    assert created == []
    assert next(stream) == "x"
    assert await anext(astream) == "x"
    assert created == ["sync", "async"]


def test_closing_a_sync_stream_early_closes_the_inner_iterator() -> None:
    closed = threading.Event()

    def client() -> Iterator[str]:
        try:
            yield from ("a", "b", "c")
        finally:
            closed.set()

    stream = FallbackChain([client, client]).stream(call)
    assert next(stream) == "a"
    stream.close()
    assert closed.is_set()


def test_closing_a_timed_sync_stream_early_closes_the_inner_iterator_at_its_next_chunk(
    gate: threading.Event,
) -> None:
    closed = threading.Event()

    def client() -> Iterator[str]:
        try:
            yield "a"
            gate.wait(5)  # the worker thread cannot close a generator that is running
            yield from ("b", "c")
        finally:
            closed.set()

    stream = FallbackChain([client, client], per_client_timeout=1).stream(call)
    assert next(stream) == "a"
    stream.close()
    gate.set()
    assert closed.wait(2)


async def test_closing_an_async_stream_early_closes_the_inner_iterator() -> None:
    closed: list[bool] = []

    async def client() -> AsyncIterator[str]:
        try:
            yield "a"
            yield "b"
        finally:
            closed.append(True)

    for per_client_timeout in (None, 1.0):
        stream = FallbackChain([client, client], per_client_timeout=per_client_timeout).astream(
            call
        )
        assert await anext(stream) == "a"
        await stream.aclose()
    assert closed == [True, True]


class _FailingIterator:
    """A non-generator stream (like an SDK's) that fails after one chunk and can be closed."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.sent = False

    def __iter__(self) -> _FailingIterator:
        return self

    def __next__(self) -> str:
        if self.sent:
            raise ConnectionError("reset")
        self.sent = True
        return "a"

    def close(self) -> None:
        self.events.append("closed 0")

    def __aiter__(self) -> _FailingIterator:
        return self

    async def __anext__(self) -> str:
        return self.__next__()

    async def aclose(self) -> None:
        self.close()


@pytest.mark.parametrize("per_client_timeout", [None, 1.0])
def test_a_failing_sync_stream_is_closed_before_the_next_client_starts(
    per_client_timeout: float | None,
) -> None:
    events: list[str] = []

    def backup() -> Iterator[str]:
        events.append("started 1")
        yield "x"

    chain = FallbackChain(
        [lambda: _FailingIterator(events), backup], per_client_timeout=per_client_timeout
    )
    assert list(chain.stream(call)) == ["a", "x"]
    assert events == ["closed 0", "started 1"]


@pytest.mark.parametrize("per_client_timeout", [None, 1.0])
async def test_a_failing_async_stream_is_closed_before_the_next_client_starts(
    per_client_timeout: float | None,
) -> None:
    events: list[str] = []

    async def backup() -> AsyncIterator[str]:
        events.append("started 1")
        yield "x"

    chain = FallbackChain(
        [lambda: _FailingIterator(events), backup], per_client_timeout=per_client_timeout
    )
    assert [chunk async for chunk in chain.astream(call)] == ["a", "x"]
    assert events == ["closed 0", "started 1"]


def test_a_non_transient_stream_error_propagates_and_later_clients_are_never_called() -> None:
    error = StatusError(401)
    later: list[str] = []

    def broken() -> Iterator[str]:
        yield "a"
        raise error

    def backup() -> Iterator[str]:
        later.append("backup")
        yield "x"

    received = []
    with pytest.raises(StatusError) as caught:
        drain(FallbackChain([broken, backup]).stream(call), received)
    assert caught.value is error
    assert (received, later) == (["a"], [])


async def test_when_every_async_stream_fails_the_last_exception_object_is_raised() -> None:
    errors = [ConnectionError("reset"), StatusError(429)]

    def failing(error: Exception) -> Callable[[], AsyncIterator[str]]:
        async def run() -> AsyncIterator[str]:
            yield "a"
            raise error

        return run

    chain = FallbackChain([failing(e) for e in errors], per_client_timeout=1)
    with pytest.raises(StatusError) as caught:
        await adrain(chain.astream(call), [])
    assert caught.value is errors[-1]


# -- cooldown --------------------------------------------------------------------------


def _recording(calls: list[int], index: int, error: BaseException | None) -> Callable[[], str]:
    def run() -> str:
        calls.append(index)
        if error is not None:
            raise error
        return f"answer {index}"

    return run


def test_a_client_failing_n_times_in_the_window_is_skipped_until_its_cooldown_ends() -> None:
    clock = FakeClock()
    calls: list[int] = []
    chain = FallbackChain(
        [_recording(calls, 0, ConnectionError("refused")), _recording(calls, 1, None)],
        cooldown=Cooldown(failures=2, window=60, duration=30),
        clock=clock,
    )
    assert [chain.invoke(call), chain.invoke(call)] == ["answer 1", "answer 1"]
    assert calls == [0, 1, 0, 1]
    calls.clear()
    clock.now += 29.9
    chain.invoke(call)
    assert calls == [1]
    calls.clear()
    clock.now += 0.1
    chain.invoke(call)
    assert calls == [0, 1]


def test_failures_outside_the_window_do_not_open_the_breaker() -> None:
    clock = FakeClock()
    calls: list[int] = []
    chain = FallbackChain(
        [_recording(calls, 0, ConnectionError("refused")), _recording(calls, 1, None)],
        cooldown=Cooldown(failures=2, window=60, duration=30),
        clock=clock,
    )
    chain.invoke(call)
    clock.now += 61
    chain.invoke(call)
    calls.clear()
    chain.invoke(call)
    assert calls == [0, 1]


def test_a_success_resets_the_failure_count() -> None:
    clock = FakeClock()
    outcomes: list[BaseException | None] = [ConnectionError("refused"), None]
    outcomes += [ConnectionError("refused"), ConnectionError("refused")]
    calls: list[int] = []

    def flaky() -> str:
        calls.append(0)
        error = outcomes.pop(0)
        if error is not None:
            raise error
        return "answer 0"

    chain = FallbackChain(
        [flaky, _recording(calls, 1, None)],
        cooldown=Cooldown(failures=2, window=60, duration=30),
        clock=clock,
    )
    answers = [chain.invoke(call) for _ in range(3)]
    assert answers == ["answer 1", "answer 0", "answer 1"]
    # fail, succeed (count reset), fail: one failure since the reset, so still tried
    calls.clear()
    chain.invoke(call)
    assert calls == [0, 1]
    # that was the second failure in a row: now it is skipped
    calls.clear()
    chain.invoke(call)
    assert calls == [1]


@pytest.mark.parametrize(
    ("headers", "skipped_for"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after-ms": "1500", "retry-after": "60"}, 1.5),
        ({"retry-after": "3600"}, 10.0),
    ],
)
def test_a_429_with_retry_after_sets_the_cooldown_capped_by_max_retry_after(
    headers: dict[str, str], skipped_for: float
) -> None:
    clock = FakeClock()
    calls: list[int] = []
    chain = FallbackChain(
        [_recording(calls, 0, rate_limited(headers)), _recording(calls, 1, None)],
        cooldown=Cooldown(failures=100, max_retry_after=10),
        clock=clock,
    )
    assert chain.invoke(call) == "answer 1"
    calls.clear()
    clock.now += skipped_for - 0.01
    chain.invoke(call)
    assert calls == [1]
    calls.clear()
    clock.now += 0.01
    chain.invoke(call)
    assert calls == [0, 1]


def test_retry_after_is_ignored_when_not_honoured() -> None:
    calls: list[int] = []
    chain = FallbackChain(
        [_recording(calls, 0, rate_limited({"retry-after": "7"})), _recording(calls, 1, None)],
        cooldown=Cooldown(failures=100, honor_retry_after=False),
        clock=FakeClock(),
    )
    chain.invoke(call)
    chain.invoke(call)
    assert calls == [0, 1, 0, 1]


def test_when_every_client_is_cooling_down_the_soonest_one_is_still_tried() -> None:
    calls: list[int] = []
    outcomes: list[BaseException | None] = [rate_limited({"retry-after": "3"}), None]

    def second() -> str:
        calls.append(1)
        error = outcomes.pop(0)
        if error is not None:
            raise error
        return "answer 1"

    chain = FallbackChain(
        [_recording(calls, 0, rate_limited({"retry-after": "5"})), second],
        cooldown=Cooldown(failures=100),
        clock=FakeClock(),
    )
    with pytest.raises(openai.RateLimitError):
        chain.invoke(call)
    calls.clear()
    assert chain.invoke(call) == "answer 1"
    assert calls == [1]


async def test_the_breaker_counts_async_timeouts_as_failures() -> None:
    clock = FakeClock()
    calls: list[int] = []

    async def hung() -> str:
        calls.append(0)
        await asyncio.Event().wait()
        return "never"

    async def backup() -> str:
        calls.append(1)
        return "backup"

    chain = FallbackChain(
        [hung, backup],
        per_client_timeout=0.05,
        cooldown=Cooldown(failures=1, duration=30),
        clock=clock,
    )
    assert await chain.ainvoke(call) == "backup"
    assert await chain.ainvoke(call) == "backup"
    assert calls == [0, 1, 1]


# -- inner models that retry by themselves ---------------------------------------------


class _Model:
    """A model-like object with a ``max_retries`` setting and optionally an SDK client."""

    def __init__(self, max_retries: int | None, root_client: object = None) -> None:
        self.max_retries = max_retries
        self.model_name = "gpt-test"
        self.root_client = root_client


class _SdkClient:
    def __init__(self, max_retries: int) -> None:
        self.max_retries = max_retries


def test_a_self_retrying_model_is_warned_about_once_naming_it_and_the_setting(
    warnings: Callable[[], list[str]],
) -> None:
    model = _Model(max_retries=2)
    assert self_retry_setting(model) == ("max_retries", 2)
    warn_if_self_retrying(model, position=0)
    warn_if_self_retrying(model, position=0)
    assert len(warnings()) == 1
    message = warnings()[0]
    assert "Client 0" in message
    assert "_Model(gpt-test)" in message
    assert "max_retries=2" in message


def test_a_model_with_max_retries_zero_is_not_warned_about(
    warnings: Callable[[], list[str]],
) -> None:
    model = _Model(max_retries=0, root_client=_SdkClient(2))
    assert self_retry_setting(model) is None
    warn_if_self_retrying(model, position=1)
    assert warnings() == []


def test_an_unset_max_retries_falls_back_to_the_sdk_clients_setting(
    warnings: Callable[[], list[str]],
) -> None:
    model = _Model(max_retries=None, root_client=_SdkClient(2))
    assert self_retry_setting(model) == ("root_client.max_retries", 2)
    warn_if_self_retrying(model, position=1)
    assert len(warnings()) == 1
    assert "root_client.max_retries=2" in warnings()[0]
    assert self_retry_setting(_Model(max_retries=None, root_client=_SdkClient(0))) is None


def test_a_sync_clients_own_timeout_error_is_a_transient_failure_not_the_chains_timeout(
    warnings: Callable[[], list[str]],
) -> None:
    own = TimeoutError("read timed out")

    def timing_out() -> str:
        raise own

    with pytest.raises(TimeoutError) as caught:
        FallbackChain([timing_out, timing_out], per_client_timeout=1).invoke(call)
    assert caught.value is own
    assert warnings() == ["Client 0 failed transiently; trying next client."]
