"""The cooldown breaker: readable state, the circuit gauges, and half-open recovery."""

from __future__ import annotations

import threading
from typing import Any

import openai
import pytest

from llm_resilience.fallback import Cooldown, FallbackChain, MemberHealth
from llm_resilience.telemetry import CIRCUIT_FAILURES, CIRCUIT_STATE
from llm_resilience.testing import Fault, FaultInjectingServer

pytest_plugins = ["llm_resilience.testing.fixtures"]

MESSAGES: Any = [{"role": "user", "content": "Hello?"}]


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def call(index: int, client: Any) -> Any:
    return client()


def answering(calls: list[int], index: int, outcomes: list[BaseException | None]) -> Any:
    """A client that records each call and raises the next scripted outcome (None answers)."""

    def run() -> str:
        calls.append(index)
        error = outcomes.pop(0) if outcomes else None
        if error is not None:
            raise error
        return f"answer {index}"

    return run


def test_health_reports_each_member_closed_without_a_cooldown() -> None:
    chain = FallbackChain([lambda: "a", lambda: "b"])
    assert chain.health() == (
        MemberHealth(client=0, state="closed", failures=0, open_until=None, retry_in=0.0),
        MemberHealth(client=1, state="closed", failures=0, open_until=None, retry_in=0.0),
    )


def test_health_counts_failures_in_the_window_then_shows_the_open_deadline() -> None:
    clock = FakeClock()
    calls: list[int] = []
    chain = FallbackChain(
        [answering(calls, 0, [ConnectionError()] * 9), answering(calls, 1, [])],
        cooldown=Cooldown(failures=2, window=60, duration=30),
        clock=clock,
    )
    chain.invoke(call)
    assert chain.health()[0] == MemberHealth(
        client=0, state="closed", failures=1, open_until=None, retry_in=0.0
    )
    clock.now += 61
    assert chain.health()[0].failures == 0  # the failure left the window
    chain.invoke(call)
    clock.now += 1
    chain.invoke(call)
    clock.now += 1
    assert chain.health()[0] == MemberHealth(
        client=0,
        state="open",
        failures=0,
        open_until=1092.0,
        retry_in=29.0,
        reason="failures",
    )
    assert chain.health()[1].state == "closed"
    clock.now += 28.9
    assert chain.health()[0].state == "open"
    clock.now += 0.1
    assert chain.health()[0].state == "half_open"


def test_a_variant_of_the_chain_shares_its_circuit_both_ways_and_keeps_its_options() -> None:
    clock = FakeClock()
    calls: list[int] = []
    chain = FallbackChain(
        [answering(calls, 0, [ConnectionError()] * 9), answering(calls, 1, [])],
        cooldown=Cooldown(failures=2, window=60, duration=30),
        per_client_timeout=30,
        clock=clock,
    )
    bound = chain.variant([answering(calls, 0, [ConnectionError()] * 9), answering(calls, 1, [])])
    assert bound.durations == chain.durations
    assert bound.cooldown is chain.cooldown

    chain.invoke(call)  # one failure through the chain, one through the variant: open
    bound.invoke(call)

    assert calls == [0, 1, 0, 1]
    assert chain.health() == bound.health()
    assert chain.health()[0].state == "open"
    calls.clear()
    assert (chain.invoke(call), bound.invoke(call)) == ("answer 1", "answer 1")
    assert calls == [1, 1]


def test_a_variant_holds_one_client_per_member() -> None:
    chain = FallbackChain(["a", "b"], cooldown=Cooldown())
    with pytest.raises(ValueError, match=r"one client per member \(2\); got 3"):
        chain.variant(["a", "b", "c"])


def test_after_the_cooldown_one_failed_trial_reopens_the_member_for_a_full_duration() -> None:
    clock = FakeClock()
    calls: list[int] = []
    chain = FallbackChain(
        [answering(calls, 0, [ConnectionError()] * 9), answering(calls, 1, [])],
        cooldown=Cooldown(failures=3, window=60, duration=30),
        clock=clock,
    )
    for _ in range(3):
        chain.invoke(call)
    clock.now += 30
    calls.clear()
    chain.invoke(call)
    assert calls == [0, 1]  # the trial, then the fallback
    assert chain.health()[0].state == "open"
    assert chain.health()[0].retry_in == 30.0
    calls.clear()
    chain.invoke(call)
    assert calls == [1]


def test_a_member_whose_trial_succeeds_serves_again_at_once() -> None:
    clock = FakeClock()
    calls: list[int] = []
    chain = FallbackChain(
        [answering(calls, 0, [ConnectionError()] * 3), answering(calls, 1, [])],
        cooldown=Cooldown(failures=3, window=60, duration=30),
        clock=clock,
    )
    for _ in range(3):
        chain.invoke(call)
    clock.now += 30
    assert chain.invoke(call) == "answer 0"
    assert chain.health()[0].state == "closed"
    calls.clear()
    assert [chain.invoke(call), chain.invoke(call)] == ["answer 0", "answer 0"]
    assert calls == [0, 0]


def test_while_a_trial_call_is_out_other_requests_keep_going_to_the_other_members() -> None:
    clock = FakeClock()
    calls: list[int] = []
    trial_started = threading.Event()
    release_trial = threading.Event()
    failures = [ConnectionError()] * 3

    def primary() -> str:
        calls.append(0)
        if failures:
            raise failures.pop()
        trial_started.set()
        assert release_trial.wait(5)
        return "answer 0"

    chain = FallbackChain(
        [primary, answering(calls, 1, [])],
        cooldown=Cooldown(failures=3, window=60, duration=30),
        clock=clock,
    )
    for _ in range(3):
        chain.invoke(call)
    clock.now += 30
    calls.clear()
    answers: list[str] = []
    trial = threading.Thread(target=lambda: answers.append(chain.invoke(call)))
    trial.start()
    try:
        assert trial_started.wait(5)
        assert [chain.invoke(call) for _ in range(3)] == ["answer 1"] * 3
        assert calls == [0, 1, 1, 1]
    finally:
        release_trial.set()
        trial.join(5)
    assert answers == ["answer 0"]
    assert chain.health()[0].state == "closed"


def test_a_trial_call_that_never_reports_back_frees_its_slot_after_one_duration() -> None:
    clock = FakeClock()
    calls: list[int] = []
    outcomes: list[BaseException | None] = [ConnectionError()] * 3 + [KeyboardInterrupt()]
    chain = FallbackChain(
        [answering(calls, 0, outcomes), answering(calls, 1, [])],
        cooldown=Cooldown(failures=3, window=60, duration=30),
        clock=clock,
    )
    for _ in range(3):
        chain.invoke(call)
    clock.now += 30
    with pytest.raises(KeyboardInterrupt):  # not rerouted, so the breaker never hears back
        chain.invoke(call)
    calls.clear()
    chain.invoke(call)
    assert calls == [1]
    clock.now += 30
    calls.clear()
    assert chain.invoke(call) == "answer 0"
    assert calls == [0]


def test_the_documented_flapping_primary_example_serves_every_request_and_recovers(
    fault_server_factory: Any,
) -> None:
    """Primary answers 503 for 60 s then recovers; 20 requests 4 s apart, docs' settings."""
    primary: FaultInjectingServer = fault_server_factory(reply="from primary", name="primary")
    secondary: FaultInjectingServer = fault_server_factory(reply="from secondary", name="backup")
    clients = [
        openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0, timeout=5)
        for server in (primary, secondary)
    ]
    clock = FakeClock()
    started = clock.now
    chain = FallbackChain(
        clients, cooldown=Cooldown(failures=3, window=60, duration=30), clock=clock
    )

    def ask(index: int, client: openai.OpenAI) -> tuple[int, str]:
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
        return index, reply.choices[0].message.content or ""

    served: list[tuple[float, int]] = []
    for request in range(20):
        clock.now = started + 4 * request
        primary_down = clock.now - started < 60
        primary.default_fault = Fault.status(503) if primary_down else Fault.ok()
        index, text = chain.invoke(ask)
        assert text == ("from primary" if index == 0 else "from secondary")
        served.append((clock.now - started, index))

    assert len(served) == 20
    back = [at for at, index in served if index == 0 and at >= 60]
    assert back
    assert back[0] < 60 + 30
    assert all(index == 0 for at, index in served if at >= back[0])
    # Three failures open it (t = 0-8 s); the trial at 40 s fails and reopens it; the
    # trial at 72 s succeeds and the primary keeps serving.
    assert [at for at, index in served if index == 0] == [72, 76]
    assert len(primary.requests) == 3 + 1 + 2


def test_circuit_gauges_report_each_members_state_and_failures(metric_reader: Any) -> None:
    clock = FakeClock()
    calls: list[int] = []
    chain = FallbackChain(
        [answering(calls, 0, [ConnectionError()] * 9), answering(calls, 1, [])],
        cooldown=Cooldown(failures=2, window=60, duration=30),
        clock=clock,
    )
    chain_id = chain._breaker.chain_id  # type: ignore[union-attr]

    def points(name: str) -> dict[int, float]:
        found: dict[int, float] = {}
        data = metric_reader.get_metrics_data()
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        if point.attributes["chain"] == chain_id:
                            found[point.attributes["client"]] = point.value
        return found

    chain.invoke(call)
    assert points(CIRCUIT_STATE) == {0: 0, 1: 0}
    assert points(CIRCUIT_FAILURES) == {0: 1, 1: 0}
    chain.invoke(call)
    assert points(CIRCUIT_STATE) == {0: 2, 1: 0}
    clock.now += 30
    assert points(CIRCUIT_STATE) == {0: 1, 1: 0}
