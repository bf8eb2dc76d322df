"""RetryPolicy: what is retried, the schedule, Retry-After, custom tenacity configurations."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import openai
import pytest
import tenacity

from llm_resilience import RetryPolicy
from llm_resilience.errors import (
    BudgetExceededError,
    RateLimitBackendError,
    RateLimitQueueFullError,
    RequestExceedsCapacityError,
)
from llm_resilience.retry import is_retryable, warn_of_multiplied_retries

_REQUEST = httpx.Request("POST", "https://api.openai.com/v1/embeddings")


def openai_error(status: int, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    """A real openai SDK error, as the client raises it for ``status``."""
    response = httpx.Response(status, headers=headers or {}, request=_REQUEST)
    kinds: dict[int, type[openai.APIStatusError]] = {
        400: openai.BadRequestError,
        401: openai.AuthenticationError,
        403: openai.PermissionDeniedError,
        404: openai.NotFoundError,
        422: openai.UnprocessableEntityError,
        429: openai.RateLimitError,
        500: openai.InternalServerError,
        503: openai.InternalServerError,
    }
    return kinds[status](f"Error code: {status}", response=response, body=None)


class Flaky:
    """A call that raises the given errors in turn, then returns ``"ok"``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self, *args: Any) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"

    async def acall(self, *args: Any) -> str:
        return self(*args)


def recording_policy(**options: Any) -> tuple[RetryPolicy, list[float]]:
    slept: list[float] = []

    async def asleep(seconds: float) -> None:
        slept.append(seconds)

    options.setdefault("jitter", 0)
    return RetryPolicy(sleep=slept.append, asleep=asleep, **options), slept


# -- the schedule --------------------------------------------------------------------------


def test_the_default_policy_makes_four_attempts_one_two_and_four_seconds_apart() -> None:
    policy, slept = recording_policy()
    errors = [ConnectionError(f"reset {n}") for n in range(4)]
    flaky = Flaky(*errors)

    with pytest.raises(ConnectionError) as caught:
        policy.call(flaky)

    assert flaky.calls == 4
    assert slept == [1.0, 2.0, 4.0]
    assert caught.value is errors[-1]  # the last attempt's own error, not a RetryError


def test_the_defaults_are_four_attempts_a_one_second_base_and_jitter() -> None:
    policy = RetryPolicy()
    assert (policy.attempts, policy.base_delay, policy.jitter) == (4, 1.0, 1.0)
    assert policy.delays() == (1.0, 2.0, 4.0)


def test_a_call_that_recovers_returns_its_result_after_the_failed_attempts() -> None:
    policy, slept = recording_policy()
    flaky = Flaky(openai_error(503), httpx.ConnectError("refused"))

    assert policy.call(flaky) == "ok"
    assert flaky.calls == 3
    assert slept == [1.0, 2.0]


def test_jitter_adds_at_most_its_amount_to_each_backoff_wait() -> None:
    policy, slept = recording_policy(attempts=6, jitter=0.5)

    with pytest.raises(ConnectionError):
        policy.call(Flaky(*[ConnectionError() for _ in range(6)]))

    for wait, backoff in zip(slept, (1.0, 2.0, 4.0, 8.0, 16.0), strict=True):
        assert backoff <= wait <= backoff + 0.5


def test_no_wait_is_longer_than_max_delay() -> None:
    policy, slept = recording_policy(attempts=6, base_delay=2, max_delay=timedelta(seconds=5))

    with pytest.raises(ConnectionError):
        policy.call(Flaky(*[ConnectionError() for _ in range(6)]))

    assert slept == [2.0, 4.0, 5.0, 5.0, 5.0]


def test_a_zero_base_delay_retries_at_once() -> None:
    policy, slept = recording_policy(base_delay=0)
    flaky = Flaky(ConnectionError("reset"), openai_error(503))

    assert policy.call(flaky) == "ok"
    assert flaky.calls == 3
    assert slept == [0.0, 0.0]
    assert policy.delays() == (0.0, 0.0, 0.0)


async def test_a_zero_base_delay_retries_async_calls_at_once() -> None:
    policy, slept = recording_policy(base_delay=timedelta(0))
    flaky = Flaky(ConnectionError("reset"))

    assert await policy.acall(flaky.acall) == "ok"
    assert slept == [0.0]


def test_a_zero_max_delay_never_waits_whatever_the_jitter_or_retry_after() -> None:
    policy, slept = recording_policy(max_delay=0, jitter=1)
    flaky = Flaky(ConnectionError(), openai_error(429, {"retry-after": "5"}))

    assert policy.call(flaky) == "ok"
    assert slept == [0.0, 0.0]


def test_one_attempt_means_the_call_is_never_retried() -> None:
    policy, slept = recording_policy(attempts=1)
    flaky = Flaky(ConnectionError())
    with pytest.raises(ConnectionError):
        policy.call(flaky)
    assert (flaky.calls, slept) == (1, [])


def test_each_retry_is_logged_with_the_error_type_but_never_its_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy, _ = recording_policy(attempts=2)
    caplog.set_level(logging.WARNING, logger="llm_resilience.retry")

    with pytest.raises(ValueError):
        policy.call(Flaky(ValueError("the user's secret prompt"), ValueError("again")))

    assert [r.getMessage() for r in caplog.records] == [
        "Attempt 1 of 2 failed (ValueError); retrying in 1.00 s."
    ]


# -- what is retried -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(BudgetExceededError("day", Decimal(1), Decimal(1)), id="budget"),
        pytest.param(RateLimitQueueFullError(3), id="queue-full"),
        pytest.param(RateLimitBackendError("redis"), id="limiter-backend"),
        pytest.param(
            RequestExceedsCapacityError(9, 5, unit="permits", option="requests_per_minute"),
            id="exceeds-capacity",
        ),
        pytest.param(NotImplementedError(), id="not-implemented"),
        pytest.param(openai_error(400), id="openai-400"),
        pytest.param(openai_error(401), id="openai-401"),
        pytest.param(openai_error(403), id="openai-403"),
        pytest.param(openai_error(404), id="openai-404"),
        pytest.param(openai_error(422), id="openai-422"),
        pytest.param(asyncio.CancelledError(), id="cancelled"),
        pytest.param(KeyboardInterrupt(), id="keyboard-interrupt"),
        pytest.param(SystemExit(1), id="system-exit"),
    ],
)
def test_refusals_permanent_errors_and_cancellation_are_raised_at_once(
    error: BaseException,
) -> None:
    policy, slept = recording_policy()
    flaky = Flaky(error)

    with pytest.raises(type(error)) as caught:
        policy.call(flaky)

    assert caught.value is error
    assert (flaky.calls, slept) == (1, [])


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(openai_error(429), id="openai-429"),
        pytest.param(openai_error(500), id="openai-500"),
        pytest.param(httpx.ConnectError("refused"), id="httpx-connect"),
        pytest.param(ValueError("unexpected payload"), id="value-error"),
        pytest.param(RuntimeError("anything else"), id="runtime-error"),
    ],
)
def test_every_other_exception_is_retried(error: Exception) -> None:
    policy, _ = recording_policy()
    flaky = Flaky(error)
    assert policy.call(flaky) == "ok"
    assert flaky.calls == 2


def test_a_refusal_wrapped_in_another_error_is_still_not_retried() -> None:
    try:
        raise BudgetExceededError("month", Decimal(5), Decimal(6))
    except BudgetExceededError as budget:
        try:
            raise RuntimeError("embedding failed") from budget
        except RuntimeError as wrapped:
            error = wrapped
    assert not is_retryable(error)


def test_the_permanent_statuses_are_configurable() -> None:
    policy, _ = recording_policy(permanent_status_codes={401, 429})
    flaky = Flaky(openai_error(429))
    with pytest.raises(openai.RateLimitError):
        policy.call(flaky)
    assert flaky.calls == 1
    assert policy.call(Flaky(openai_error(400))) == "ok"


# -- Retry-After ---------------------------------------------------------------------------


def test_a_retry_after_within_max_delay_replaces_the_backoff_wait() -> None:
    policy, slept = recording_policy(jitter=1)
    flaky = Flaky(
        openai_error(429, {"retry-after": "7"}), openai_error(429, {"retry-after-ms": "250"})
    )
    assert policy.call(flaky) == "ok"
    assert slept == [7.0, 0.25]


def test_a_retry_after_date_is_read_against_the_injected_clock() -> None:
    now = 1_800_000_000.0
    date = email.utils.formatdate(now + 12, usegmt=True)
    policy, slept = recording_policy()
    policy = RetryPolicy(jitter=0, sleep=slept.append, now=lambda: now)

    assert policy.call(Flaky(openai_error(503, {"retry-after": date}))) == "ok"
    assert slept == [12.0]


def test_a_retry_after_beyond_max_delay_is_ignored_for_the_backoff_schedule() -> None:
    policy, slept = recording_policy(max_delay=10)
    assert policy.call(Flaky(openai_error(429, {"retry-after": "3600"}))) == "ok"
    assert slept == [1.0]


# -- async ---------------------------------------------------------------------------------


async def test_async_calls_follow_the_same_schedule_with_the_async_sleep() -> None:
    policy, slept = recording_policy()
    errors = [openai_error(429) for _ in range(4)]
    flaky = Flaky(*errors)

    with pytest.raises(openai.RateLimitError) as caught:
        await policy.acall(flaky.acall)

    assert caught.value is errors[-1]
    assert (flaky.calls, slept) == (4, [1.0, 2.0, 4.0])


async def test_an_async_permanent_error_is_raised_at_once() -> None:
    policy, slept = recording_policy()
    flaky = Flaky(openai_error(401))
    with pytest.raises(openai.AuthenticationError):
        await policy.acall(flaky.acall)
    assert (flaky.calls, slept) == (1, [])


async def test_cancelling_the_caller_while_it_waits_to_retry_stops_the_retries() -> None:
    waiting = asyncio.Event()

    async def asleep(seconds: float) -> None:
        waiting.set()
        await asyncio.Event().wait()  # a wait that only cancellation ends

    policy = RetryPolicy(jitter=0, asleep=asleep)
    flaky = Flaky(ConnectionError(), ConnectionError())
    task = asyncio.ensure_future(policy.acall(flaky.acall))
    await waiting.wait()
    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task
    assert flaky.calls == 1


async def test_cancelling_the_caller_during_an_attempt_cancels_it_and_never_retries() -> None:
    started = asyncio.Event()
    attempts: list[str] = []

    async def hang() -> str:
        attempts.append("started")
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            attempts.append("cancelled")
            raise
        return "never"

    policy, slept = recording_policy()
    task = asyncio.ensure_future(policy.acall(hang))
    await started.wait()
    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task
    assert attempts == ["started", "cancelled"]
    assert slept == []


# -- one-shot inputs -----------------------------------------------------------------------


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_generator_argument_is_read_once_and_every_attempt_sees_all_of_it(
    asynchronous: bool,
) -> None:
    policy, _ = recording_policy()
    produced: list[str] = []
    seen: list[list[str]] = []

    def texts() -> Iterable[str]:
        for text in ("a", "b", "c"):
            produced.append(text)
            yield text

    def embed(batch: Iterable[str], *, label: Iterable[str]) -> str:
        seen.append(list(batch) + list(label))
        if len(seen) < 3:
            raise ConnectionError("reset")
        return "ok"

    async def aembed(batch: Iterable[str], *, label: Iterable[str]) -> str:
        return embed(batch, label=label)

    if asynchronous:
        assert await policy.acall(aembed, texts(), label=iter(["x"])) == "ok"
    else:
        assert policy.call(embed, texts(), label=iter(["x"])) == "ok"
    assert produced == ["a", "b", "c"]
    assert seen == [["a", "b", "c", "x"]] * 3


# -- custom tenacity configurations ------------------------------------------------------


def test_a_custom_tenacity_configuration_replaces_the_policy_whole() -> None:
    slept: list[float] = []
    policy = RetryPolicy.from_tenacity(
        stop=tenacity.stop_after_attempt(3),
        wait=tenacity.wait_fixed(0.5),
        retry=tenacity.retry_if_exception_type(openai.AuthenticationError),
        sleep=slept.append,
        reraise=True,
    )
    flaky = Flaky(openai_error(401), openai_error(401))

    # Its own predicate decides: here it retries a 401 the default policy never would.
    assert policy.call(flaky) == "ok"
    assert (flaky.calls, slept) == (3, [0.5, 0.5])
    assert policy.is_custom
    assert policy.max_attempts is None


def test_a_custom_configuration_without_reraise_raises_tenacitys_retry_error() -> None:
    policy = RetryPolicy.from_tenacity(stop=tenacity.stop_after_attempt(2), sleep=lambda s: None)
    with pytest.raises(tenacity.RetryError):
        policy.call(Flaky(ConnectionError(), ConnectionError()))


async def test_a_custom_configuration_built_on_is_retryable_keeps_the_refusals() -> None:
    async def asleep(seconds: float) -> None:
        pass

    policy = RetryPolicy.from_tenacity(
        stop=tenacity.stop_after_attempt(5),
        retry=tenacity.retry_if_exception(is_retryable),
        sleep=asleep,
        reraise=True,
    )
    flaky = Flaky(ConnectionError(), BudgetExceededError("day", Decimal(1), Decimal(2)))
    with pytest.raises(BudgetExceededError):
        await policy.acall(flaky.acall)
    assert flaky.calls == 2


# -- sleeps and the clock, looked up when used ---------------------------------------------


def test_the_default_sleep_is_looked_up_at_each_wait_so_patching_time_sleep_reaches_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = RetryPolicy(jitter=0)  # built before the patch, as a module-level policy is
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)

    assert policy.call(Flaky(ConnectionError(), ConnectionError())) == "ok"
    assert slept == [1.0, 2.0]  # recorded, not slept for real


async def test_the_default_async_sleep_is_looked_up_at_each_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = RetryPolicy(jitter=0)
    slept: list[float] = []

    async def recorded(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", recorded)

    assert await policy.acall(Flaky(ConnectionError(), ConnectionError()).acall) == "ok"
    assert slept == [1.0, 2.0]


def test_a_patched_wall_clock_reaches_the_default_policy_reading_a_retry_after_date(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = RetryPolicy(jitter=0)
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    frozen = datetime(2031, 3, 4, 12, 0, tzinfo=UTC).timestamp()
    date = email.utils.formatdate(frozen + 7, usegmt=True)
    monkeypatch.setattr(time, "time", lambda: frozen)  # as freezegun's freeze_time does

    assert policy.call(Flaky(openai_error(429, {"retry-after": date}))) == "ok"
    assert slept == [7.0]  # against the real clock the date is years away: backoff's 1.0


def test_a_sleep_passed_in_still_wins_over_a_patched_time_sleep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mine: list[float] = []
    patched: list[float] = []
    policy = RetryPolicy(jitter=0, sleep=mine.append)
    monkeypatch.setattr(time, "sleep", patched.append)

    assert policy.call(Flaky(ConnectionError())) == "ok"
    assert (mine, patched) == ([1.0], [])


# -- construction --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: RetryPolicy(attempts=0), "RetryPolicy.attempts must be an integer from 1 to 100"),
        (lambda: RetryPolicy(attempts=101), "RetryPolicy.attempts"),
        (lambda: RetryPolicy(attempts=True), "RetryPolicy.attempts"),
        (lambda: RetryPolicy(attempts="4"), "RetryPolicy.attempts"),
        (
            lambda: RetryPolicy(base_delay=-1),
            r"RetryPolicy.base_delay must be 0 \(no wait\) or more seconds; got -1",
        ),
        (lambda: RetryPolicy(base_delay="1"), "RetryPolicy.base_delay must be"),
        (
            lambda: RetryPolicy(max_delay=timedelta(seconds=-1)),
            r"RetryPolicy.max_delay must be 0 \(no wait\) or more seconds",
        ),
        (lambda: RetryPolicy(max_delay=float("nan")), "RetryPolicy.max_delay"),
        (lambda: RetryPolicy(jitter=-0.5), r"RetryPolicy.jitter must be 0 \(no jitter\) or more"),
        (lambda: RetryPolicy(permanent_status_codes={200}), "between 400 and 599"),
        (lambda: RetryPolicy(permanent_status_codes="401"), "permanent_status_codes"),
        (lambda: RetryPolicy(sleep="later"), "RetryPolicy.sleep must be callable"),
        (lambda: RetryPolicy.from_tenacity(tries=3), "tenacity.Retrying's keywords"),
    ],
)
def test_bad_options_are_refused_at_construction_naming_the_option(
    build: Callable[[], RetryPolicy], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_durations_may_be_timedeltas() -> None:
    policy = RetryPolicy(
        base_delay=timedelta(milliseconds=500), max_delay=timedelta(minutes=1), jitter=timedelta(0)
    )
    assert (policy.base_delay, policy.max_delay, policy.jitter) == (0.5, 60.0, 0.0)


# -- objects that retry by themselves -----------------------------------------------------


class _SelfRetrying:
    def __init__(self, max_retries: int) -> None:
        self.max_retries = max_retries


def test_a_self_retrying_object_is_warned_about_once_with_the_worst_case(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_resilience.retry")
    inner = _SelfRetrying(max_retries=2)

    warn_of_multiplied_retries(inner, RetryPolicy(), wrapper="RetryingThing")
    warn_of_multiplied_retries(inner, RetryPolicy(), wrapper="RetryingThing")

    assert len(caplog.records) == 1
    assert "4 x (1 + 2) = 12 times" in caplog.records[0].getMessage()
    assert "max_retries=2" in caplog.records[0].getMessage()


def test_an_object_that_does_not_retry_by_itself_is_not_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_resilience.retry")
    warn_of_multiplied_retries(_SelfRetrying(max_retries=0), RetryPolicy(), wrapper="RetryingThing")
    assert [r for r in caplog.records if r.name.startswith("llm_resilience")] == []


def test_a_store_whose_embeddings_retry_by_themselves_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_resilience.retry")

    class Store:
        embeddings = _SelfRetrying(max_retries=5)

    warn_of_multiplied_retries(Store(), RetryPolicy(attempts=3), wrapper="RetryingVectorStore")

    (record,) = caplog.records
    assert "(under the wrapped Store)" in record.getMessage()
    assert "3 x (1 + 5) = 18 times" in record.getMessage()


def test_a_self_retrying_object_deep_in_a_stack_of_layers_is_found(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_resilience.retry")

    class Layer:
        def __init__(self, inner: object) -> None:
            self.inner = inner

    warn_of_multiplied_retries(
        Layer(Layer(_SelfRetrying(max_retries=1))), RetryPolicy(attempts=2), wrapper="Retrying"
    )

    (record,) = caplog.records
    assert "2 x (1 + 1) = 4 times" in record.getMessage()


def test_a_custom_policy_reads_as_the_configuration_it_was_given() -> None:
    stop = tenacity.stop_after_attempt(2)
    policy = RetryPolicy.from_tenacity(stop=stop)
    assert repr(policy) == f"RetryPolicy.from_tenacity(stop={stop!r})"
    assert policy != RetryPolicy()


def test_an_object_warned_about_is_forgotten_once_it_is_gone() -> None:
    import gc

    from llm_resilience import self_retry

    inner = _SelfRetrying(max_retries=2)
    key = id(inner)
    warn_of_multiplied_retries(inner, RetryPolicy(), wrapper="RetryingThing")
    assert key in self_retry._warned

    del inner
    gc.collect()

    assert key not in self_retry._warned
