"""A fallback chain in either framework: what fails over, what is raised, what the answer
says about who served it, stream restarts, time limits per member, options."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import pytest
from driver import STREAMS, Mode
from fallback_driver import CountingLimiter, status_error

from llm_resilience import Cooldown, PerClientTimeoutError, TransientClassifier

# -- failover and its answer ---------------------------------------------------------------


async def test_the_primary_answers_when_it_is_healthy(driver: Any, mode: Mode) -> None:
    secondary = driver.answering("from the secondary")
    chain = driver.fallback([driver.answering("from the primary"), secondary])

    reply = await driver.run(chain, mode)

    assert reply.text == "from the primary"
    assert driver.served_by(reply) == 0
    assert driver.calls(secondary) == 0


async def test_the_answer_names_the_member_that_served_with_its_model_and_usage(
    driver: Any, mode: Mode
) -> None:
    primary = driver.failing()
    chain = driver.fallback([primary, driver.answering("Paris.", model="served-by-secondary")])

    reply = await driver.run(chain, mode)

    assert reply.text == "Paris."
    assert driver.served_by(reply) == 1
    assert driver.model_name_of(reply) == "served-by-secondary"
    assert driver.output_tokens_of(reply) > 0
    assert driver.calls(primary) == 1


async def test_a_non_transient_error_propagates_without_trying_the_next_member(
    driver: Any, mode: Mode
) -> None:
    bad_request = status_error(400, "Error code: 400 - invalid model")
    primary, secondary = driver.failing(bad_request), driver.answering()

    with pytest.raises(type(bad_request)) as raised:
        await driver.run(driver.fallback([primary, secondary]), mode)

    assert raised.value is primary.last_error
    assert str(raised.value) == str(bad_request)
    assert driver.calls(secondary) == 0


async def test_when_every_member_fails_the_last_members_own_error_is_raised(
    driver: Any, mode: Mode
) -> None:
    last = driver.failing(status_error(429, "Error code: 429 - secondary exhausted"))

    with pytest.raises(type(last.last_error or status_error(429))) as raised:
        await driver.run(driver.fallback([driver.failing(), last]), mode)

    assert raised.value is last.last_error
    assert str(raised.value) == "Error code: 429 - secondary exhausted"


async def test_a_server_error_fails_over_only_under_the_server_error_preset(driver: Any) -> None:
    def chain(**options: Any) -> Any:
        return driver.fallback([driver.failing(status_error(500)), driver.answering()], **options)

    with pytest.raises(type(status_error(500))):
        await driver.run(chain(), "call")
    reply = await driver.run(chain(classifier=TransientClassifier.with_server_errors()), "call")
    assert driver.served_by(reply) == 1


async def test_a_custom_classifier_decides_what_fails_over(driver: Any, mode: Mode) -> None:
    primary = driver.failing(status_error(400))
    chain = driver.fallback([primary, driver.answering("Paris")], classifier=lambda error: True)

    assert (await driver.run(chain, mode)).text == "Paris"


async def test_a_cooldown_skips_a_primary_that_keeps_failing_and_health_shows_it_open(
    driver: Any, mode: Mode
) -> None:
    with pytest.raises(ValueError, match=r"Cooldown\.failures"):
        Cooldown(failures=0)
    primary, secondary = driver.failing(), driver.answering()
    chain = driver.fallback([primary, secondary], cooldown=Cooldown(failures=1, duration=60))
    assert [member.state for member in chain.health()] == ["closed", "closed"]

    await driver.run(chain, mode)
    await driver.run(chain, mode)

    assert (driver.calls(primary), driver.calls(secondary)) == (1, 2)
    first, second = chain.health()
    assert first.state == "open"
    assert 59 < first.retry_in <= 60
    assert second.state == "closed"


async def test_a_members_own_rate_limiter_applies_to_its_own_attempt(
    driver: Any, mode: Mode
) -> None:
    limiter = CountingLimiter()
    primary = driver.limited(driver.failing(), limiter)
    secondary = driver.limited(driver.answering(), limiter)

    await driver.run(driver.fallback([primary, secondary]), mode)

    assert limiter.taken == 2


# -- time limits per member -------------------------------------------------------------------


async def test_a_hanging_primary_times_out_and_the_secondary_answers(
    driver: Any, mode: Mode
) -> None:
    primary = driver.failing(hang_seconds=5)
    chain = driver.fallback([primary, driver.answering("Paris")], per_client_timeout=0.1)
    started = time.monotonic()
    try:
        reply = await driver.run(chain, mode)
    finally:
        primary.release()

    assert reply.text == "Paris"
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("mode", ["call", "astream"])
async def test_a_hanging_last_member_raises_a_timeout_error(driver: Any, mode: Mode) -> None:
    last = driver.failing(hang_seconds=5)
    chain = driver.fallback([driver.failing(), last], per_client_timeout=timedelta(seconds=0.1))
    try:
        with pytest.raises(PerClientTimeoutError) as raised:
            await driver.run(chain, mode)
    finally:
        last.release()

    assert isinstance(raised.value, TimeoutError)


# -- streams ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", STREAMS)
async def test_a_stream_starts_no_request_until_it_is_read(driver: Any, mode: Mode) -> None:
    primary = driver.answering()
    stream = await driver.opened(driver.fallback([primary, driver.answering()]), mode)
    assert driver.calls(primary) == 0

    if mode == "stream":
        next(stream)
    else:
        await anext(stream)

    assert driver.calls(primary) == 1


@pytest.mark.parametrize("mode", STREAMS)
async def test_a_stream_cut_mid_way_restarts_on_the_next_member_with_a_restart_event(
    driver: Any, mode: Mode, caplog: pytest.LogCaptureFixture
) -> None:
    primary = driver.cut_stream("from the primary", after=2)
    chain = driver.fallback([primary, driver.answering("Paris is the capital")])

    with (
        driver.restarts(chain) as (watched, restarts),
        caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"),
    ):
        reply = await driver.run(watched, mode)

    # The primary's two chunks stay delivered; the secondary starts from the beginning.
    assert reply.text.endswith("Paris is the capital")
    assert reply.text != "Paris is the capital"
    assert list(restarts) == [(0, 1, 2, "RateLimitError", False)]
    assert "Streaming client 0 failed mid-stream after 2 token(s)" in caplog.text
    assert driver.served_by(reply) == 1


@pytest.mark.parametrize("mode", STREAMS)
async def test_a_stream_failing_before_its_first_chunk_restarts_without_an_event(
    driver: Any, mode: Mode
) -> None:
    chain = driver.fallback([driver.failing(), driver.answering("Paris is the capital")])

    with driver.restarts(chain) as (watched, restarts):
        reply = await driver.run(watched, mode)

    assert reply.text == "Paris is the capital"
    assert list(restarts) == []


@pytest.mark.parametrize("mode", STREAMS)
async def test_a_stream_that_hangs_mid_way_restarts_after_the_timeout(
    driver: Any, mode: Mode
) -> None:
    primary = driver.cut_stream("from the primary", after=1, hang_seconds=5)
    chain = driver.fallback([primary, driver.answering("Paris")], per_client_timeout=0.1)
    try:
        with driver.restarts(chain) as (watched, restarts):
            reply = await driver.run(watched, mode)
    finally:
        primary.release()

    assert reply.text.endswith("Paris")
    assert [(r.chunks, r.error_type) for r in restarts] == [(1, "TimeoutError")]


# -- options ----------------------------------------------------------------------------------

DURATIONS = ("per_client_timeout", "first_token_timeout", "idle_timeout", "hedge_after")


@pytest.mark.parametrize("option", DURATIONS)
def test_every_duration_option_reads_back_as_float_seconds_however_it_was_spelled(
    driver: Any, option: str
) -> None:
    spellings = (30, 30.0, timedelta(seconds=30))
    chains = [
        driver.fallback([driver.answering(), driver.answering()], **{option: value})
        for value in spellings
    ]

    read_back = [getattr(chain, option) for chain in chains]

    assert read_back == [30.0, 30.0, 30.0]
    assert all(type(value) is float for value in read_back), read_back
    # LangChain keys its cache on these: one chain, however its options were spelled.
    params = [driver.identifying_params(chain) for chain in chains]
    assert params[0] == params[1] == params[2]


def test_options_cannot_be_changed_after_construction(driver: Any) -> None:
    chain = driver.fallback([driver.answering(), driver.answering()], per_client_timeout=5)

    with pytest.raises(ValueError, match="frozen"):
        chain.per_client_timeout = 1

    assert chain.per_client_timeout == 5


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"per_client_timeout": 0}, ValueError, "per_client_timeout must be greater than 0"),
        ({"per_client_timeout": -1.5}, ValueError, "per_client_timeout must be greater than 0"),
        ({"per_client_timeout": "30s"}, TypeError, "per_client_timeout must be None, a number"),
        ({"cooldown": {"failures": 3}}, TypeError, "cooldown must be None or a Cooldown"),
        ({"cooldown": 30}, TypeError, "cooldown must be None or a Cooldown"),
        ({"classifier": "transient"}, TypeError, "classifier must be a callable"),
    ],
)
def test_bad_options_fail_at_construction_naming_the_option(
    driver: Any, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        driver.fallback([driver.answering(), driver.answering()], **options)


@pytest.mark.parametrize(
    ("members", "error", "words"),
    [
        (1, ValueError, ["{option} must hold at least 2"]),
        (0, ValueError, ["{option} must hold at least 2"]),
        ("gpt-4o", TypeError, ["{option} must be a list"]),
        ("mixed", TypeError, ["{option}[1] must be a {type}; got", "str"]),
    ],
)
def test_bad_members_fail_at_construction_naming_the_option_and_the_position(
    driver: Any, members: Any, error: type[Exception], words: list[str]
) -> None:
    given: Any = {
        1: [driver.answering()],
        0: [],
        "gpt-4o": "gpt-4o",
        "mixed": [driver.answering(), "gpt-4o"],
    }[members]

    with pytest.raises(error) as raised:
        driver.fallback_type(**{driver.members_option: given})

    for word in words:
        assert word.format(option=driver.members_option, type=driver.member_type) in str(
            raised.value
        )


def test_the_members_are_kept_as_given_in_order(driver: Any) -> None:
    primary, secondary = driver.answering(), driver.answering()

    chain = driver.fallback([primary, secondary])

    kept = driver.members_of(chain)
    assert kept[0] is primary
    assert kept[1] is secondary
    assert chain.inner == tuple(kept)


def test_find_layer_looks_at_itself_then_at_each_member_in_order(driver: Any) -> None:
    failing, answering = driver.failing(), driver.answering()
    inner = driver.fallback([answering, driver.answering()])
    outer = driver.fallback([failing, inner])

    assert outer.find_layer(driver.fallback_type) is outer
    assert outer.find_layer(type(failing)) is failing
    assert outer.find_layer(type(answering)) in (failing, answering)
    assert inner.find_layer(type(answering)) is answering
    assert outer.find_layer(Cooldown) is None


@pytest.mark.parametrize("nested", [False, True])
def test_a_member_that_retries_by_itself_is_warned_about_once_by_name(
    driver: Any, nested: bool, caplog: pytest.LogCaptureFixture
) -> None:
    retrying = driver.self_retrying("retrying-model", retries=3)
    member = driver.fallback([retrying, driver.answering()]) if nested else retrying

    with caplog.at_level(logging.WARNING, logger="llm_resilience.fallback"):
        driver.fallback([member, driver.answering()])
        driver.fallback([member, driver.answering()])
        driver.fallback([driver.rate_limited(member, requests_per_minute=60), driver.answering()])

    warnings = [r.getMessage() for r in caplog.records if "retries by itself" in r.getMessage()]
    assert len(warnings) == 1
    assert "retrying-model" in warnings[0]
    assert "max_retries=3" in warnings[0]
