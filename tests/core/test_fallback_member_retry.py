"""``member_retry=``: short waits on the same member before the chain moves on.

Members are scripted: each try takes the next outcome (an answer, or an error carrying an
HTTP status and maybe a ``Retry-After``). The policy's sleep and the chain's clock are a
fake that only records waits, so the schedules are exact and nothing sleeps for real.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest

from llm_resilience import FallbackChain, RetryPolicy

LOGGER = "llm_resilience.fallback"
SHAPES = ["invoke", "ainvoke", "stream", "astream"]


def status_error(status: int, retry_after: float | None = None) -> openai.APIStatusError:
    headers = {} if retry_after is None else {"retry-after": str(retry_after)}
    request = httpx.Request("POST", "https://provider.test/v1/chat/completions")
    response = httpx.Response(status, headers=headers, request=request)
    return openai.APIStatusError(f"status {status}", response=response, body=None)


class Member:
    """A scripted client: each try takes the next outcome; the last one repeats."""

    def __init__(self, name: str, *outcomes: BaseException | str) -> None:
        self.name = name
        self.outcomes = list(outcomes) or [f"{name} answered"]
        self.tries = 0
        self.closed = 0

    def _next(self) -> str:
        outcome = self.outcomes[min(self.tries, len(self.outcomes) - 1)]
        self.tries += 1
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def stream(self) -> Iterator[str]:
        try:
            yield from self._next().split()
        finally:
            self.closed += 1

    async def astream(self) -> AsyncIterator[str]:
        try:
            for word in self._next().split():
                yield word
        finally:
            self.closed += 1


class FakeTime:
    """A monotonic clock that moves only when the policy sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


def policy(time: FakeTime, **options: Any) -> RetryPolicy:
    options = {"attempts": 3, "base_delay": 0.5, "max_delay": 10, "jitter": 0, **options}
    return RetryPolicy(sleep=time.sleep, asleep=time.asleep, **options)


def run(chain: FallbackChain[Member], shape: str) -> str:
    """The answer of one call through ``shape``, as one string."""
    if shape == "invoke":
        return chain.invoke(lambda index, member: member._next())

    async def call() -> str:
        return await chain.ainvoke(_acall)

    async def astream() -> str:
        return " ".join([w async for w in chain.astream(lambda i, m: m.astream())])

    if shape == "ainvoke":
        return asyncio.run(call())
    if shape == "stream":
        return " ".join(chain.stream(lambda index, member: member.stream()))
    return asyncio.run(astream())


async def _acall(index: int, member: Member) -> str:
    await asyncio.sleep(0)
    return member._next()


@pytest.mark.parametrize("shape", SHAPES)
def test_without_member_retry_each_member_is_tried_once_without_delay(shape: str) -> None:
    time = FakeTime()
    primary = Member("primary", status_error(429, retry_after=1), "primary answered")
    secondary = Member("secondary")
    chain = FallbackChain([primary, secondary], clock=time.clock)
    assert chain.member_retry is None
    assert run(chain, shape) == "secondary answered"
    assert (primary.tries, secondary.tries, time.sleeps) == (1, 1, [])


@pytest.mark.parametrize("shape", SHAPES)
def test_a_429_with_retry_after_within_the_limit_is_waited_out_on_the_same_member(
    shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    time = FakeTime()
    primary = Member("primary", status_error(429, retry_after=2.5), "primary answered")
    secondary = Member("secondary")
    chain = FallbackChain([primary, secondary], clock=time.clock, member_retry=policy(time))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert run(chain, shape) == "primary answered"
    # Exactly what the header asked: never sooner, and not the backoff's 0.5 s.
    assert time.sleeps == [2.5]
    assert (primary.tries, secondary.tries) == (2, 0)
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [
        "Client 0 failed (APIStatusError, status 429); retrying the same client in 2.50 s "
        "(try 2 of 3)."
    ]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_retry_after_longer_than_the_policy_allows_moves_on_at_once(shape: str) -> None:
    time = FakeTime()
    primary = Member("primary", status_error(429, retry_after=60), "primary answered")
    secondary = Member("secondary")
    chain = FallbackChain([primary, secondary], clock=time.clock, member_retry=policy(time))
    assert run(chain, shape) == "secondary answered"
    assert (primary.tries, time.sleeps) == (1, [])


@pytest.mark.parametrize("shape", SHAPES)
def test_a_persistent_503_is_retried_with_backoff_then_the_next_member_answers(
    shape: str,
) -> None:
    time = FakeTime()
    primary = Member("primary", status_error(503))
    secondary = Member("secondary")
    chain = FallbackChain([primary, secondary], clock=time.clock, member_retry=policy(time))
    assert run(chain, shape) == "secondary answered"
    assert time.sleeps == [0.5, 1.0]  # the policy's backoff, 3 tries in all
    assert (primary.tries, secondary.tries) == (3, 1)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_zero_delay_policy_asks_the_same_member_again_at_once(shape: str) -> None:
    time = FakeTime()
    primary = Member("primary", status_error(503), status_error(503), "primary answered")
    chain = FallbackChain(
        [primary, Member("secondary")],
        clock=time.clock,
        member_retry=policy(time, base_delay=0, max_delay=0),
    )
    assert run(chain, shape) == "primary answered"
    assert (primary.tries, time.sleeps) == (3, [0.0, 0.0])


@pytest.mark.parametrize("status", [500, 502, 504])
def test_a_passing_server_error_is_retried_on_the_same_member(status: int) -> None:
    time = FakeTime()
    primary = Member("primary", status_error(status), "primary answered")
    chain = FallbackChain(
        [primary, Member("secondary")], clock=time.clock, member_retry=policy(time)
    )
    assert run(chain, "invoke") == "primary answered"
    assert time.sleeps == [0.5]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_non_transient_error_is_never_retried(shape: str) -> None:
    time = FakeTime()
    primary = Member("primary", status_error(400), "primary answered")
    secondary = Member("secondary")
    chain = FallbackChain([primary, secondary], clock=time.clock, member_retry=policy(time))
    with pytest.raises(openai.APIStatusError, match="status 400"):
        run(chain, shape)
    assert (primary.tries, secondary.tries, time.sleeps) == (1, 0, [])


def test_a_connection_error_is_left_to_the_chain() -> None:
    time = FakeTime()
    primary = Member("primary", ConnectionError("reset"), "primary answered")
    secondary = Member("secondary")
    chain = FallbackChain([primary, secondary], clock=time.clock, member_retry=policy(time))
    assert run(chain, "invoke") == "secondary answered"
    assert (primary.tries, time.sleeps) == (1, [])


@pytest.mark.parametrize("shape", SHAPES)
def test_the_waits_count_toward_per_client_timeout(shape: str) -> None:
    # 3 s per attempt: the first 2 s wait fits, a second one would spend the attempt.
    time = FakeTime()
    primary = Member("primary", status_error(429, retry_after=2), status_error(429, 2), "late")
    secondary = Member("secondary")
    chain = FallbackChain(
        [primary, secondary],
        clock=time.clock,
        per_client_timeout=3,
        member_retry=policy(time),
    )
    assert run(chain, shape) == "secondary answered"
    assert time.sleeps == [2.0]
    assert (primary.tries, secondary.tries) == (2, 1)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_wait_longer_than_the_first_token_timeout_is_not_started(shape: str) -> None:
    time = FakeTime()
    primary = Member("primary", status_error(429, retry_after=5), "primary answered")
    secondary = Member("secondary")
    chain = FallbackChain(
        [primary, secondary],
        clock=time.clock,
        first_token_timeout=4,
        member_retry=policy(time),
    )
    assert run(chain, shape) == "secondary answered"
    assert (primary.tries, time.sleeps) == (1, [])


@pytest.mark.parametrize("shape", ["stream", "astream"])
def test_a_stream_is_never_retried_after_its_first_chunk(shape: str) -> None:
    time = FakeTime()

    class Breaking(Member):
        def stream(self) -> Iterator[str]:
            self.tries += 1
            yield "partial"
            raise status_error(503)

        async def astream(self) -> AsyncIterator[str]:
            self.tries += 1
            yield "partial"
            raise status_error(503)

    primary = Breaking("primary")
    secondary = Member("secondary")
    chain = FallbackChain([primary, secondary], clock=time.clock, member_retry=policy(time))
    # The chain's own mid-stream rule applies (restart on the next member), untouched.
    assert run(chain, shape) == "partial secondary answered"
    assert (primary.tries, time.sleeps) == (1, [])


def test_a_failed_stream_is_closed_before_the_wait() -> None:
    time = FakeTime()
    primary = Member("primary", status_error(429, retry_after=1), "primary answered")
    closed_at_wait: list[int] = []

    def sleep(seconds: float) -> None:
        closed_at_wait.append(primary.closed)

    chain = FallbackChain(
        [primary, Member("secondary")],
        clock=time.clock,
        member_retry=RetryPolicy(attempts=2, jitter=0, sleep=sleep),
    )
    assert list(chain.stream(lambda index, member: member.stream())) == ["primary", "answered"]
    assert closed_at_wait == [1]
    assert primary.closed == 2


@pytest.mark.parametrize("shape", ["ainvoke", "astream"])
async def test_cancelling_during_a_wait_leaves_nothing_behind(shape: str) -> None:
    primary = Member("primary", status_error(429, retry_after=5), "primary answered")
    secondary = Member("secondary")
    # The real asyncio.sleep: the test cancels it long before its 5 s are up.
    chain = FallbackChain([primary, secondary], member_retry=RetryPolicy(attempts=2, max_delay=10))

    async def consume() -> object:
        if shape == "ainvoke":
            return await chain.ainvoke(_acall)
        return [chunk async for chunk in chain.astream(lambda i, member: member.astream())]

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.1)  # the first try failed; the 5 s wait has begun
    assert primary.tries == 1
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (primary.tries, secondary.tries) == (1, 0)
    if shape == "astream":
        assert primary.closed == 1
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


def test_member_retry_rejects_what_is_not_a_retry_policy() -> None:
    with pytest.raises(TypeError, match="member_retry must be None or an llm_resilience"):
        FallbackChain(["a", "b"], member_retry=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="member_retry must be a RetryPolicy"):
        FallbackChain(["a", "b"], member_retry=RetryPolicy.from_tenacity(reraise=True))


@pytest.mark.parametrize("shape", ["invoke", "stream"])
def test_interrupting_a_sync_wait_leaves_nothing_behind(shape: str) -> None:
    primary = Member("primary", status_error(429, retry_after=5), "primary answered")
    secondary = Member("secondary")

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt  # Ctrl-C while the chain waits

    chain = FallbackChain(
        [primary, secondary],
        member_retry=RetryPolicy(attempts=2, max_delay=10, sleep=interrupted),
    )
    with pytest.raises(KeyboardInterrupt):
        run(chain, shape)
    assert (primary.tries, secondary.tries) == (1, 0)
    if shape == "stream":
        assert primary.closed == 1
