"""The in-process token bucket (SPEC section 3).

The derivation and refill arithmetic run on a frozen clock the test moves by hand. The
concurrency tests use real threads and event loops: either on a frozen clock, moving it
one step at a time and letting a non-blocking caller's look at the bucket do the granting
(so one waiter at a time is granted and the order is exact), or on a running clock whose
next refill step the test places a fraction of a second ahead.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from llm_resilience import telemetry
from llm_resilience.errors import RateLimitQueueFullError, RequestExceedsCapacityError
from llm_resilience.ratelimit import RateLimiter, TokenBucketRateLimiter
from llm_resilience.transient import is_transient

KEYWORDS = ("rate limit", "throttl", "timeout", "unavailable")


class TestClock:
    """A monotonic clock for the limiter: frozen (moved by hand) or running in real time
    from a chosen reading. Counts how often it is read."""

    __test__ = False

    def __init__(self) -> None:
        self.value = 0.0
        self.running_since: float | None = None
        self.calls = 0
        self.fail_next: Exception | None = None

    def __call__(self) -> float:
        self.calls += 1
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        if self.running_since is None:
            return self.value
        return self.value + (time.monotonic() - self.running_since)

    def advance(self, seconds: float) -> None:
        assert self.running_since is None
        self.value += seconds

    def run_from(self, reading: float) -> float:
        """Start running in real time from ``reading``; returns the real start time."""
        self.value = reading
        self.running_since = time.monotonic()
        return self.running_since


def drain(limiter: TokenBucketRateLimiter, num_tokens: int = 0) -> int:
    taken = 0
    while limiter.acquire(num_tokens, blocking=False):
        taken += 1
    return taken


def wait_until(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.001)


async def await_until(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.001)


@contextmanager
def loops_in_threads(count: int) -> Iterator[list[asyncio.AbstractEventLoop]]:
    loops = [asyncio.new_event_loop() for _ in range(count)]
    threads = [threading.Thread(target=loop.run_forever, daemon=True) for loop in loops]
    for thread in threads:
        thread.start()
    try:
        yield loops
    finally:
        for loop, thread in zip(loops, threads, strict=True):
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            loop.close()


def start_waiters(
    limiter: TokenBucketRateLimiter,
    kinds: list[int | None],
    loops: list[asyncio.AbstractEventLoop],
    on_grant: Callable[[int], None],
) -> list[threading.Thread]:
    """Start one waiter per kind (None: a thread; n: a task on loops[n]), each only once
    the previous one is queued, so arrival order is the list order."""
    threads: list[threading.Thread] = []
    for index, kind in enumerate(kinds):
        if kind is None:

            def wait_in_thread(index: int = index) -> None:
                limiter.acquire()
                on_grant(index)

            thread = threading.Thread(target=wait_in_thread, daemon=True)
            thread.start()
            threads.append(thread)
        else:

            async def wait_in_task(index: int = index) -> None:
                await limiter.aacquire()
                on_grant(index)

            asyncio.run_coroutine_threadsafe(wait_in_task(), loops[kind])
        wait_until(lambda index=index: limiter.queued == index + 1)
    return threads


# -- the derivation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rpm", "per_period", "sustained_per_minute"),
    [(30, 1, 60), (60, 1, 60), (90, 1, 60), (300, 5, 300), (600, 10, 600), (6000, 100, 6000)],
)
def test_the_bucket_derivation_is_visible_on_the_limiter(
    rpm: int, per_period: int, sustained_per_minute: int
) -> None:
    limiter = TokenBucketRateLimiter(rpm)
    assert limiter.requests_per_minute == rpm
    assert limiter.period == 1.0
    assert limiter.permits_per_period == per_period
    assert limiter.capacity == rpm
    assert limiter.permits_per_period * 60 == sustained_per_minute
    assert limiter.max_queued_requests is None
    assert limiter.tokens_per_minute is None
    assert limiter.token_capacity is None
    assert limiter.tokens_per_period is None
    assert limiter.queued == 0
    assert isinstance(limiter, RateLimiter)


def test_the_token_bucket_follows_the_same_derivation() -> None:
    limiter = TokenBucketRateLimiter(60, max_queued_requests=10, tokens_per_minute=90_000)
    assert limiter.max_queued_requests == 10
    assert limiter.tokens_per_minute == 90_000
    assert limiter.token_capacity == 90_000
    assert limiter.tokens_per_period == 1500
    assert TokenBucketRateLimiter(60, tokens_per_minute=30).tokens_per_period == 1


def test_a_full_bucket_bursts_its_capacity_then_refills_permits_per_period_each_second() -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(300, clock=clock)
    assert drain(limiter) == 300
    clock.advance(0.999)
    assert drain(limiter) == 0
    clock.advance(0.001)
    assert drain(limiter) == 5
    clock.advance(2.5)  # two more steps end; half of the next one does not count
    assert drain(limiter) == 10
    clock.advance(0.5)
    assert drain(limiter) == 5
    clock.advance(3600)  # an idle hour refills to the capacity, no further
    assert drain(limiter) == 300


@pytest.mark.parametrize(("rpm", "admitted"), [(30, 60), (59, 60), (90, 60), (150, 120)])
def test_budgets_under_60_over_admit_and_others_floor_to_whole_permits_per_second(
    rpm: int, admitted: int
) -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(rpm, clock=clock)
    assert drain(limiter) == rpm  # the burst is bounded by the capacity
    in_the_next_minute = 0
    for _ in range(60):
        clock.advance(1.0)
        in_the_next_minute += drain(limiter)
    assert in_the_next_minute == admitted


# -- first come, first served --------------------------------------------------------------


def test_threads_and_tasks_on_three_event_loops_are_granted_in_arrival_order() -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(60, clock=clock)  # one permit per step
    assert drain(limiter) == 60
    kinds: list[int | None] = [None] * 20 + [0, 1, 2] * 4
    random.Random(7).shuffle(kinds)
    granted: list[int] = []
    with loops_in_threads(3) as loops:
        threads = start_waiters(limiter, kinds, loops, granted.append)
        for step in range(len(kinds)):
            clock.advance(1.0)
            # The newcomer's look at the bucket grants the head; it never overtakes it.
            assert limiter.acquire(blocking=False) is False
            wait_until(lambda step=step: len(granted) == step + 1)
        for thread in threads:
            thread.join(5)
    assert granted == list(range(len(kinds)))
    assert limiter.queued == 0


def test_a_shared_bucket_grants_the_earliest_arrivals_at_each_real_refill_step() -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(2400, clock=clock)  # 40 permits per step
    assert drain(limiter) == 2400
    kinds: list[int | None] = [None] * 20 + [0, 1, 2] * 10
    random.Random(3).shuffle(kinds)
    granted_at: dict[int, float] = {}

    def on_grant(index: int) -> None:
        granted_at[index] = time.monotonic()

    started = clock.run_from(0.5)  # the next step ends 0.5 s from now
    with loops_in_threads(3) as loops:
        threads = start_waiters(limiter, kinds, loops, on_grant)
        wait_until(lambda: len(granted_at) == len(kinds), within=3.0)
        for thread in threads:
            thread.join(5)
    first = {index for index, when in granted_at.items() if when < started + 1.0}
    assert first == set(range(40))
    assert min(granted_at.values()) >= started + 0.5
    assert min(granted_at[index] for index in range(40, 50)) >= started + 1.5


async def test_two_hundred_waiting_tasks_and_twenty_threads_sleep_without_polling() -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(220 * 60, clock=clock)  # 220 permits per step
    drain(limiter)
    started = clock.run_from(0.6)
    tasks = [asyncio.create_task(limiter.aacquire()) for _ in range(200)]
    await await_until(lambda: limiter.queued == 200)
    threads = [threading.Thread(target=limiter.acquire, daemon=True) for _ in range(20)]
    for thread in threads:
        thread.start()
    await await_until(lambda: limiter.queued == 220)

    calls, cpu, wall = clock.calls, time.process_time(), time.monotonic()
    assert all(await asyncio.gather(*tasks))
    await asyncio.to_thread(lambda: [thread.join(5) for thread in threads])
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall

    assert time.monotonic() - started >= 0.4 - 0.01  # they really waited for the step
    assert wall > 0.15
    assert cpu < 0.2 * wall
    # One look per waiter once granted (a head's timer firing a hair early adds one more),
    # however long the wait: nobody polls.
    assert clock.calls - calls <= 220 + 10


# -- refusals ------------------------------------------------------------------------------


async def test_a_caller_finding_the_queue_full_is_refused_at_once_and_not_as_transient() -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(60, max_queued_requests=2, clock=clock)
    drain(limiter)
    threads = [threading.Thread(target=limiter.acquire, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    await await_until(lambda: limiter.queued == 2)

    began = time.monotonic()
    with pytest.raises(RateLimitQueueFullError) as sync_refusal:
        limiter.acquire()
    with pytest.raises(RateLimitQueueFullError) as async_refusal:
        await limiter.aacquire()
    assert time.monotonic() - began < 0.1
    for refusal in (sync_refusal.value, async_refusal.value):
        assert refusal.max_queued_requests == 2
        assert not is_transient(refusal)
        assert not any(word in str(refusal).lower() for word in KEYWORDS)
    assert limiter.queued == 2  # the refused callers never joined

    clock.advance(2.0)
    limiter.acquire(blocking=False)  # looks at the bucket: both waiters are granted
    await asyncio.to_thread(lambda: [thread.join(5) for thread in threads])
    assert not any(thread.is_alive() for thread in threads)


async def test_a_request_heavier_than_the_token_bucket_fails_at_once_naming_both_numbers() -> None:
    limiter = TokenBucketRateLimiter(60, tokens_per_minute=4000)
    with pytest.raises(RequestExceedsCapacityError) as sync_refusal:
        limiter.acquire(4001)
    with pytest.raises(RequestExceedsCapacityError) as async_refusal:
        await limiter.aacquire(4001, blocking=False)
    for refusal in (sync_refusal.value, async_refusal.value):
        assert (refusal.requested, refusal.capacity) == (4001, 4000)
        assert "4001" in str(refusal)
        assert "4000" in str(refusal)
        assert isinstance(refusal, ValueError)
        assert not is_transient(refusal)
        assert not any(word in str(refusal).lower() for word in KEYWORDS)
    assert limiter.queued == 0
    assert limiter.acquire(4000, blocking=False) is True  # exactly the capacity fits


async def test_blocking_false_answers_at_once_and_never_overtakes_a_queued_caller() -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(60, tokens_per_minute=600, clock=clock)
    assert limiter.acquire(600, blocking=False) is True  # request permits left, tokens gone
    assert limiter.acquire(1, blocking=False) is False
    assert await limiter.aacquire(1, blocking=False) is False
    head = asyncio.create_task(limiter.aacquire(100))
    await await_until(lambda: limiter.queued == 1)
    # A weightless call would fit, but someone is waiting ahead of it.
    assert limiter.acquire(0, blocking=False) is False
    assert await limiter.aacquire(0, blocking=False) is False
    clock.advance(10.0)
    assert limiter.acquire(0, blocking=False) is True  # the head goes first, then the newcomer
    assert await asyncio.wait_for(head, 1.0) is True


# -- cancellation --------------------------------------------------------------------------


async def test_a_cancelled_waiter_consumes_nothing_and_the_next_is_granted_on_time() -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(60, clock=clock)  # one permit per step
    drain(limiter)
    step = clock.run_from(0.7) + 0.3  # when the next step ends, in real time
    first = asyncio.create_task(limiter.aacquire())
    await await_until(lambda: limiter.queued == 1)
    second_granted_at: list[float] = []

    def second() -> None:
        limiter.acquire()
        second_granted_at.append(time.monotonic())

    thread = threading.Thread(target=second, daemon=True)
    thread.start()
    await await_until(lambda: limiter.queued == 2)
    await asyncio.sleep(0.1)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert limiter.queued == 1
    await asyncio.to_thread(thread.join, 2)

    # The step's only permit went to the second caller, at the step: not a second later
    # (had the first consumed it) and not never (had nobody woken the new head).
    assert second_granted_at, "the second waiter was never granted"
    assert step - 0.01 <= second_granted_at[0] < step + 0.3
    assert limiter.acquire(blocking=False) is False


async def test_cancelling_the_head_grants_the_next_waiter_at_once_when_it_fits() -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(60, tokens_per_minute=600, clock=clock)
    limiter.acquire(600)
    heavy = asyncio.create_task(limiter.aacquire(100))  # needs 10 more steps of tokens
    await await_until(lambda: limiter.queued == 1)
    light = asyncio.create_task(limiter.aacquire(0))
    await await_until(lambda: limiter.queued == 2)
    await asyncio.sleep(0.01)
    assert not light.done()
    heavy.cancel()
    assert await asyncio.wait_for(light, 1.0) is True  # no clock movement needed
    assert heavy.cancelled()


def test_a_task_cancelled_right_after_its_grant_gives_the_permit_back() -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(60, clock=clock)
    drain(limiter)
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(limiter.aacquire())
        loop.run_until_complete(asyncio.sleep(0))
        assert limiter.queued == 1
        clock.advance(1.0)
        assert limiter.acquire(blocking=False) is False  # grants the task, refuses itself
        assert limiter.queued == 0
        task.cancel()  # before the task could resume and use its permit
        with pytest.raises(asyncio.CancelledError):
            loop.run_until_complete(task)
    finally:
        loop.close()
    assert limiter.acquire(blocking=False) is True
    assert limiter.acquire(blocking=False) is False


async def test_a_waiter_whose_loop_closed_is_dropped_from_the_queue() -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(60, clock=clock)
    drain(limiter)
    with loops_in_threads(1) as (loop,):
        asyncio.run_coroutine_threadsafe(limiter.aacquire(), loop)
        await await_until(lambda: limiter.queued == 1)
    # Its loop stopped and closed with the task still waiting: it can never take a permit.
    clock.advance(1.0)
    assert limiter.acquire(blocking=False) is True
    assert limiter.queued == 0


# -- token weights -------------------------------------------------------------------------


def test_token_weighted_calls_need_a_request_permit_and_their_tokens() -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(600, tokens_per_minute=6000, clock=clock)
    assert limiter.acquire(4000, blocking=False) is True
    assert limiter.acquire(2000, blocking=False) is True
    assert limiter.acquire(1, blocking=False) is False
    assert limiter.acquire(0, blocking=False) is True  # a weightless call needs only a request
    clock.advance(1.0)
    assert limiter.acquire(100, blocking=False) is True
    assert limiter.acquire(1, blocking=False) is False
    clock.advance(1.0)
    assert drain(limiter, num_tokens=10) == 10  # now the tokens run out first


def test_without_a_token_budget_the_weight_is_ignored() -> None:
    limiter = TokenBucketRateLimiter(60)
    assert limiter.acquire(10**9, blocking=False) is True
    limiter.reconcile(10, 10**9)  # nothing to settle
    assert drain(limiter) == 59


def test_reconcile_gives_unused_tokens_back_and_charges_extra_usage_into_debt() -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(600, tokens_per_minute=600, clock=clock)  # 10 a step
    assert limiter.acquire(600, blocking=False) is True
    limiter.reconcile(estimated_tokens=600, actual_tokens=100)
    assert limiter.acquire(500, blocking=False) is True
    assert limiter.acquire(1, blocking=False) is False

    limiter.reconcile(estimated_tokens=0, actual_tokens=50)  # 50 tokens of debt
    clock.advance(4.0)
    assert limiter.acquire(0, blocking=False) is False  # still 10 tokens in debt
    clock.advance(1.0)
    assert limiter.acquire(0, blocking=False) is True
    assert limiter.acquire(1, blocking=False) is False

    limiter.reconcile(estimated_tokens=10**6, actual_tokens=0)  # capped at the capacity
    assert limiter.acquire(600, blocking=False) is True
    assert limiter.acquire(1, blocking=False) is False


async def test_a_refund_lets_a_waiting_caller_through_without_waiting_for_a_step() -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(60, tokens_per_minute=600, clock=clock)
    limiter.acquire(600)
    waiter = asyncio.create_task(limiter.aacquire(300))
    await await_until(lambda: limiter.queued == 1)
    limiter.reconcile(estimated_tokens=600, actual_tokens=200)
    assert await asyncio.wait_for(waiter, 1.0) is True


# -- options and ergonomics ----------------------------------------------------------------


@pytest.mark.parametrize(
    "option", ["requests_per_minute", "max_queued_requests", "tokens_per_minute"]
)
@pytest.mark.parametrize(
    ("value", "error"),
    [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError), ("60", TypeError)],
)
def test_budgets_must_be_whole_numbers_of_at_least_one(
    option: str, value: object, error: type[Exception]
) -> None:
    options: dict[str, Any] = {"requests_per_minute": 60, option: value}
    with pytest.raises(error, match=rf"{option} must be an integer >= 1"):
        TokenBucketRateLimiter(**options)


def test_a_request_or_token_budget_is_required_while_the_others_may_be_left_unset() -> None:
    with pytest.raises(ValueError, match="give requests_per_minute, tokens_per_minute or both"):
        TokenBucketRateLimiter(None)
    limiter = TokenBucketRateLimiter(60, max_queued_requests=None, tokens_per_minute=None)
    assert (limiter.max_queued_requests, limiter.tokens_per_minute) == (None, None)


@pytest.mark.parametrize(
    ("value", "error"), [(-1, ValueError), ("5", TypeError), (False, TypeError)]
)
async def test_a_token_weight_must_be_a_whole_number_of_at_least_zero(
    value: object, error: type[Exception]
) -> None:
    limiter = TokenBucketRateLimiter(60, tokens_per_minute=600)
    with pytest.raises(error, match="num_tokens must be an integer >= 0"):
        limiter.acquire(value)  # type: ignore[arg-type]
    with pytest.raises(error, match="num_tokens must be an integer >= 0"):
        await limiter.aacquire(value)  # type: ignore[arg-type]
    with pytest.raises(error, match="actual_tokens must be an integer >= 0"):
        limiter.reconcile(0, value)  # type: ignore[arg-type]


async def test_with_and_async_with_take_one_permit_each() -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(60, clock=clock)
    with limiter as entered:
        assert entered is limiter
    async with limiter as entered:
        assert entered is limiter
    await limiter.async_acquire()  # LlamaIndex's name
    assert drain(limiter) == 57


def test_importing_the_limiters_never_imports_redis_or_the_frameworks() -> None:
    code = (
        "import sys, llm_resilience.ratelimit as r; r.TokenBucketRateLimiter(60); "
        "print(sorted(m for m in ('redis', 'langchain_core', 'llama_index') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


# -- telemetry -----------------------------------------------------------------------------


# ``metric_reader`` (tests/core/conftest.py): an in-memory reader of this test's points.


def wait_points(reader: Any) -> dict[tuple[str, str], Any]:
    points: dict[tuple[str, str], Any] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == telemetry.RATELIMIT_WAIT:
                    assert metric.unit == "ms"
                    for point in metric.data.data_points:
                        key = (point.attributes["surface"], point.attributes["outcome"])
                        points[key] = point
    return points


async def test_every_acquire_records_its_wait_with_surface_and_outcome(metric_reader: Any) -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(60, max_queued_requests=1, clock=clock)
    drain(limiter)  # 60 granted at once, then one rejected: all surface "chat"

    waiter = asyncio.create_task(limiter.aacquire(surface="embedding"))
    await await_until(lambda: limiter.queued == 1)
    with pytest.raises(RateLimitQueueFullError):
        await limiter.aacquire(surface="embedding")
    clock.advance(1.25)
    assert limiter.acquire(blocking=False, surface="embedding") is False  # grants the waiter
    assert await waiter is True  # it waited exactly 1.25 s on the limiter's clock

    cancelled = asyncio.create_task(limiter.aacquire())
    await await_until(lambda: limiter.queued == 1)
    clock.advance(0.5)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled

    clock.fail_next = OSError("clock broke")
    with pytest.raises(OSError, match="clock broke"):
        limiter.acquire()

    points = wait_points(metric_reader)
    assert set(points) == {
        ("chat", "granted"),
        ("chat", "rejected"),
        ("embedding", "granted"),
        ("embedding", "rejected"),
        ("chat", "cancelled"),
        ("chat", "faulted"),
    }
    assert (points["chat", "granted"].count, points["chat", "granted"].max) == (60, 0.0)
    assert points["chat", "rejected"].count == 1
    assert (points["embedding", "granted"].count, points["embedding", "granted"].sum) == (1, 1250.0)
    assert points["embedding", "rejected"].count == 2  # the full queue and the non-blocking look
    assert (points["chat", "cancelled"].count, points["chat", "cancelled"].sum) == (1, 500.0)
    assert points["chat", "faulted"].count == 1
    assert limiter.queued == 0


def test_a_clock_failing_mid_wait_faults_that_caller_and_the_queue_moves_on(
    metric_reader: Any,
) -> None:
    clock = TestClock()
    limiter = TokenBucketRateLimiter(60, clock=clock)
    drain(limiter)
    clock.run_from(0.9)  # the next step ends 0.1 s from now
    outcomes: dict[str, object] = {}

    def caller(name: str) -> None:
        try:
            outcomes[name] = limiter.acquire()
        except OSError as error:
            outcomes[name] = error

    first = threading.Thread(target=caller, args=("first",), daemon=True)
    first.start()
    wait_until(lambda: limiter.queued == 1)
    second = threading.Thread(target=caller, args=("second",), daemon=True)
    second.start()
    wait_until(lambda: limiter.queued == 2)
    clock.fail_next = OSError("clock broke")  # the head's next look fails
    first.join(2)
    second.join(2)
    assert isinstance(outcomes["first"], OSError)
    assert outcomes["second"] is True  # the permit the first could not take went to the second
    points = wait_points(metric_reader)
    assert points["chat", "faulted"].count == 1
    assert points["chat", "granted"].count == 61
