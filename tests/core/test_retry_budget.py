"""The retry budget's arithmetic on an injected clock, and each retry layer drawing from it."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from llm_resilience import RetryBudget, RetryPolicy
from llm_resilience.fallback import FallbackChain


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def budget(clock: Clock, **options: Any) -> RetryBudget:
    options.setdefault("min_per_second", 0)
    return RetryBudget(clock=clock, **options)


class Busy(Exception):
    status_code = 503


def test_a_ratio_of_a_fifth_allows_one_retry_per_five_calls() -> None:
    clock = Clock()
    spent = budget(clock, ratio=0.2)
    for _ in range(10):
        spent.call_started()
    assert [spent.try_retry() for _ in range(3)] == [True, True, False]
    assert spent.counts().calls == 10
    assert spent.counts().retries == 2


def test_the_floor_allows_retries_with_no_traffic_at_all() -> None:
    clock = Clock()
    quiet = budget(clock, ratio=0.2, min_per_second=0.1, window=60)
    assert quiet.floor == pytest.approx(6.0)
    assert sum(quiet.try_retry() for _ in range(10)) == 6


def test_a_thousand_calls_a_minute_allow_two_hundred_retries_plus_the_floor() -> None:
    clock = Clock()
    fleet = budget(clock, ratio=0.2, min_per_second=0.1, window=60)
    for second in range(60):
        clock.now = float(second)
        for _ in range(1000 // 60 + (1 if second < 1000 % 60 else 0)):
            fleet.call_started()
    assert fleet.counts().calls == 1000
    assert sum(fleet.try_retry() for _ in range(400)) == 206


def test_calls_and_retries_leave_the_sliding_window() -> None:
    clock = Clock()
    window = budget(clock, ratio=1, window=10)
    window.call_started()
    clock.now = 5.0
    window.call_started()
    assert window.try_retry()
    clock.now = 10.5  # the first call has left the window, the second has not
    assert window.counts().calls == 1
    assert not window.try_retry()  # one call in the window, one retry already granted
    clock.now = 15.5  # the retry at 5.0 has left too
    window.call_started()
    assert window.counts().retries == 0
    assert window.try_retry()


def test_grants_from_many_threads_never_exceed_the_budget() -> None:
    shared = RetryBudget(ratio=0.5, min_per_second=0)
    for _ in range(100):
        shared.call_started()
    granted: list[bool] = []
    lock = threading.Lock()

    def ask() -> None:
        for _ in range(50):
            answer = shared.try_retry()
            with lock:
                granted.append(answer)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(granted) == 50


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ratio": 1.5}, "RetryBudget.ratio must be a number from 0 to 1"),
        ({"ratio": "0.2"}, "RetryBudget.ratio must be a number from 0 to 1"),
        ({"min_per_second": -1}, "RetryBudget.min_per_second must be a finite number >= 0"),
        ({"window": 0}, "RetryBudget.window"),
        ({"max_attempts_per_call": 0}, "RetryBudget.max_attempts_per_call"),
    ],
)
def test_a_bad_option_is_refused_naming_it(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryBudget(**options)


def test_an_unknown_keyword_is_refused() -> None:
    with pytest.raises(TypeError, match="ratoi"):
        RetryBudget(ratoi=0.2)  # type: ignore[call-arg]


# -- RetryPolicy -------------------------------------------------------------------------


def _policy(spent: RetryBudget, attempts: int = 4) -> tuple[RetryPolicy, list[float]]:
    waits: list[float] = []
    policy = RetryPolicy(
        attempts=attempts, base_delay=1, jitter=0, sleep=waits.append, budget=spent
    )
    return policy, waits


def test_a_retry_policy_with_an_exhausted_budget_raises_the_error_at_once_without_waiting() -> None:
    policy, waits = _policy(budget(Clock(), ratio=0))
    calls: list[int] = []

    def failing() -> None:
        calls.append(1)
        raise ConnectionError("reset")

    with pytest.raises(ConnectionError, match="reset"):
        policy.call(failing)
    assert calls == [1]
    assert waits == []


def test_a_retry_policy_draws_one_grant_per_retry_and_none_for_the_last_failure() -> None:
    spent = budget(Clock(), ratio=0, min_per_second=0.05, window=60)  # 3 retries in all
    policy, waits = _policy(spent, attempts=3)
    with pytest.raises(ConnectionError):
        policy.call(lambda: (_ for _ in ()).throw(ConnectionError("reset")))
    assert waits == [1.0, 2.0]
    assert spent.counts().retries == 2  # the third failure asked for nothing


def test_a_retry_policy_stops_at_the_per_call_attempt_cap() -> None:
    policy, _ = _policy(RetryBudget(ratio=1, max_attempts_per_call=2), attempts=5)
    calls: list[int] = []

    async def failing() -> None:
        calls.append(1)
        raise ConnectionError("reset")

    with pytest.raises(ConnectionError):
        asyncio.run(policy.acall(failing))
    assert calls == [1, 1]


def test_a_retry_policy_shows_its_budget() -> None:
    policy = RetryPolicy(budget=RetryBudget(ratio=0.1))
    assert "budget=RetryBudget(ratio=0.1" in repr(policy)
    with pytest.raises(TypeError, match=r"RetryPolicy\.budget"):
        RetryPolicy(budget=0.1)  # type: ignore[arg-type]


# -- the fallback chain --------------------------------------------------------------------


def _member_retry(waits: list[float]) -> RetryPolicy:
    return RetryPolicy(attempts=3, base_delay=1, jitter=0, sleep=waits.append)


def test_member_retry_with_an_exhausted_budget_moves_on_at_once() -> None:
    waits: list[float] = []
    tried: list[int] = []
    chain = FallbackChain(
        ["a", "b"], member_retry=_member_retry(waits), retry_budget=budget(Clock(), ratio=0)
    )

    def attempt(index: int, client: str) -> str:
        tried.append(index)
        if index == 0:
            raise Busy()
        return client

    assert chain.invoke(attempt) == "b"
    assert tried == [0, 1]
    assert waits == []


def test_member_retry_draws_from_the_budget_of_its_policy_when_the_chain_has_none() -> None:
    waits: list[float] = []
    spent = budget(Clock(), ratio=1)
    policy = RetryPolicy(attempts=3, base_delay=1, jitter=0, sleep=waits.append, budget=spent)
    tried: list[int] = []

    def attempt(index: int, client: str) -> str:
        tried.append(index)
        if len(tried) == 1:
            raise Busy()
        return client

    assert FallbackChain(["a", "b"], member_retry=policy).invoke(attempt) == "a"
    assert tried == [0, 0]
    assert spent.counts().calls == 1
    assert spent.counts().retries == 1


async def test_a_chains_attempt_cap_counts_fallbacks_too() -> None:
    tried: list[int] = []
    chain = FallbackChain(["a", "b", "c"], retry_budget=RetryBudget(max_attempts_per_call=2))

    async def attempt(index: int, client: str) -> str:
        tried.append(index)
        raise Busy(f"member {index}")

    with pytest.raises(Busy, match="member 1"):
        await chain.ainvoke(attempt)
    assert tried == [0, 1]


def test_a_streams_attempt_cap_counts_fallbacks_too() -> None:
    tried: list[int] = []
    chain = FallbackChain(["a", "b", "c"], retry_budget=RetryBudget(max_attempts_per_call=2))

    def attempt(index: int, client: str) -> Any:
        tried.append(index)
        raise Busy(f"member {index}")
        yield client

    with pytest.raises(Busy, match="member 1"):
        list(chain.stream(attempt))
    assert tried == [0, 1]


def test_a_hedge_the_budget_refuses_is_not_started_and_the_first_attempt_goes_on() -> None:
    tried: list[int] = []
    chain = FallbackChain(["a", "b"], hedge_after=0.02, retry_budget=budget(Clock(), ratio=0))

    def attempt(index: int, client: str) -> str:
        tried.append(index)
        time.sleep(0.08)
        return client

    assert chain.invoke(attempt) == "a"
    assert tried == [0]


async def test_an_async_hedge_the_budget_grants_is_started() -> None:
    tried: list[int] = []
    spent = budget(Clock(), ratio=1)
    chain = FallbackChain(["a", "b"], hedge_after=0.02, retry_budget=spent)

    async def attempt(index: int, client: str) -> str:
        tried.append(index)
        await asyncio.sleep(0.08 if index == 0 else 0)
        return client

    assert await chain.ainvoke(attempt) == "b"
    assert tried == [0, 1]
    assert spent.counts().retries == 1


async def test_an_async_stream_hedge_the_budget_refuses_is_not_started() -> None:
    tried: list[int] = []
    chain = FallbackChain(["a", "b"], hedge_after=0.02, retry_budget=budget(Clock(), ratio=0))

    async def attempt(index: int, client: str) -> Any:
        tried.append(index)
        await asyncio.sleep(0.08)
        yield client

    assert [chunk async for chunk in chain.astream(attempt)] == ["a"]
    assert tried == [0]
