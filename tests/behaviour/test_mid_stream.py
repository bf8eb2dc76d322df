"""``mid_stream=`` through each framework's real clients against the fault server.

What a plain consumer, one that joins the streamed text and listens for nothing, reads
when the primary's stream is cut after three words: under ``"restart"`` (the default)
the failed prefix and then the next member's whole answer, with the restart event for
consumers that listen; under ``"continue"`` exactly one answer, a fallback that takes an
assistant prefill carrying on from the prefix (one that takes none, or rejects it,
restarts with the event, never the rejection); under ``"raise"`` the prefix and then a
clean ``StreamInterruptedError`` carrying it, never a second answer glued on. A content
filter is not an outage: it propagates (a refused prompt) or ends the answer (a filtered
completion), untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from driver import STREAMS, Mode
from fallback_driver import PAIRS, Restart, Servers, serving, wire_pair

from llm_resilience import MemberProfile, StreamInterruptedError, is_transient
from llm_resilience.testing import Fault

PRIMARY_REPLY = "one two three four five six seven eight"
SECONDARY_REPLY = "the secondary answered this request"
DELIVERED = "one two three"
PREFILL = MemberProfile(assistant_prefill=True)


@pytest.fixture
def servers() -> Iterator[Servers]:
    with serving(PRIMARY_REPLY, SECONDARY_REPLY) as started:
        yield started


@pytest.fixture(params=PAIRS)
def pair(request: pytest.FixtureRequest) -> tuple[str, str]:
    return wire_pair(request)


def chain(driver: Any, servers: Servers, pair: tuple[str, str], **options: Any) -> Any:
    (primary, secondary), (first, second) = servers, pair
    return driver.fallback(
        [driver.member(first, primary), driver.member(second, secondary)], **options
    )


def continuing(driver: Any, servers: Servers, **options: Any) -> Any:
    """An OpenAI primary and an OpenAI fallback declared to take a prefill (as vLLM's
    ``continue_final_message`` does), which would give the same answer."""
    primary, secondary = servers
    secondary.reply = PRIMARY_REPLY
    options.setdefault("member_profiles", [None, PREFILL])
    options.setdefault("mid_stream", "continue")
    return driver.fallback(
        [driver.openai_member(primary), driver.openai_member(secondary, "gpt-4.1-mini")],
        **options,
    )


def test_mid_stream_is_validated_naming_the_option_and_the_values(driver: Any) -> None:
    members = [driver.answering(), driver.answering()]
    with pytest.raises(
        ValueError, match=r"mid_stream must be one of 'restart', 'continue', 'raise'"
    ):
        driver.fallback(members, mid_stream="retry")
    assert driver.fallback(members).mid_stream == "restart"


# -- restart (the default) ---------------------------------------------------------------


@pytest.mark.parametrize("mode", STREAMS)
async def test_restart_gives_a_plain_consumer_the_prefix_then_the_next_answer_with_the_event(
    driver: Any, mode: Mode, servers: Servers, pair: tuple[str, str]
) -> None:
    servers[0].script(Fault.drop_mid_stream(after_chunks=3))
    with driver.restarts(chain(driver, servers, pair)) as (watched, restarts):
        reply = await driver.run(watched, mode)
    # What "restart" promises: the restart is announced, and the text after it is whole.
    assert reply.text == DELIVERED + SECONDARY_REPLY
    assert [(r.failed_client, r.next_client, r.chunks, r.continued) for r in restarts] == [
        (0, 1, 3, False)
    ]


# -- raise -------------------------------------------------------------------------------


def check_interrupted(error: StreamInterruptedError) -> None:
    assert (error.client_index, error.chunks, error.delivered_text) == (0, 3, DELIVERED)
    assert DELIVERED not in str(error)
    assert error.__cause__ is not None
    assert is_transient(error.__cause__)


@pytest.mark.parametrize("mode", STREAMS)
async def test_raise_gives_a_plain_consumer_the_prefix_then_a_clean_error_and_no_second_answer(
    driver: Any, mode: Mode, servers: Servers, pair: tuple[str, str]
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    model = chain(driver, servers, pair, mid_stream="raise")
    received: list[str] = []
    with (
        driver.restarts(model) as (watched, restarts),
        pytest.raises(StreamInterruptedError) as caught,
    ):
        await driver.read_stream(watched, mode, received)
    assert "".join(received) == DELIVERED
    check_interrupted(caught.value)
    assert secondary.requests == []
    assert list(restarts) == []
    # The chain is fine afterwards: the next stream is served whole by the primary.
    assert (await driver.run(model, mode)).text == PRIMARY_REPLY


@pytest.mark.parametrize("mode", STREAMS)
@pytest.mark.parametrize("fault", ["drop-before-text", "503"])
async def test_raise_still_falls_back_quietly_when_the_stream_fails_before_any_text(
    driver: Any, mode: Mode, fault: str, servers: Servers, pair: tuple[str, str]
) -> None:
    servers[0].script(
        Fault.drop_mid_stream(after_chunks=0) if fault == "drop-before-text" else Fault.status(503)
    )
    model = chain(driver, servers, pair, mid_stream="raise")
    assert (await driver.run(model, mode)).text == SECONDARY_REPLY


# -- continue ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", STREAMS)
async def test_continue_gives_a_plain_consumer_exactly_one_answer_from_a_prefill_member(
    driver: Any, mode: Mode, servers: Servers
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    with driver.restarts(continuing(driver, servers)) as (watched, restarts):
        reply = await driver.run(watched, mode)
    assert reply.text == PRIMARY_REPLY
    # The framework's own assembly of the chunks is the whole answer too.
    assert driver.whole_text(reply) == PRIMARY_REPLY
    assert [(r.failed_client, r.next_client, r.chunks, r.continued) for r in restarts] == [
        (0, 1, 3, True)
    ]
    # The fallback was asked to continue, not to start over.
    assert [r.prefilled for r in secondary.requests] == [True]


@pytest.mark.parametrize("mode", STREAMS)
async def test_continue_restarts_with_the_event_on_a_fallback_not_known_to_take_prefill(
    driver: Any, mode: Mode, servers: Servers
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    model = continuing(driver, servers, member_profiles=None)
    with driver.restarts(model) as (watched, restarts):
        reply = await driver.run(watched, mode)
    assert reply.text == DELIVERED + PRIMARY_REPLY
    assert [(r.chunks, r.continued) for r in restarts] == [(3, False)]
    assert [r.prefilled for r in secondary.requests] == [False]


@pytest.mark.parametrize("mode", STREAMS)
async def test_a_prefill_rejection_ends_in_a_complete_answer_via_restart_never_the_rejection(
    driver: Any, mode: Mode, servers: Servers
) -> None:
    primary, secondary = servers
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    secondary.default_fault = Fault.prefill_rejected()
    model = continuing(driver, servers)
    with driver.restarts(model) as (watched, restarts):
        reply = await driver.run(watched, mode)
    assert reply.text == DELIVERED + PRIMARY_REPLY
    assert list(restarts) == [
        Restart(0, 1, 3, restarts[0].error_type, True),
        Restart(1, 1, 3, restarts[1].error_type, False),
    ]
    assert [r.prefilled for r in secondary.requests] == [True, False]
    # The chain remembers: the next cut goes straight to a restart on that member.
    primary.script(Fault.drop_mid_stream(after_chunks=3))
    assert (await driver.run(model, mode)).text == DELIVERED + PRIMARY_REPLY
    assert [r.prefilled for r in secondary.requests] == [True, False, False]


# -- content filter ----------------------------------------------------------------------


@pytest.mark.parametrize("mid_stream", ["restart", "continue"])
async def test_a_filtered_prompt_propagates_and_is_never_sent_to_the_fallback(
    driver: Any, mode: Mode, mid_stream: str, servers: Servers
) -> None:
    primary, secondary = servers
    primary.script(Fault.content_filtered(prompt=True))
    model = continuing(driver, servers, mid_stream=mid_stream)
    with pytest.raises(openai.BadRequestError) as caught:
        await driver.run(model, mode)
    assert caught.value.code == "content_filter"
    assert secondary.requests == []


@pytest.mark.parametrize("mode", STREAMS)
async def test_a_filtered_completion_ends_the_stream_as_the_provider_ended_it(
    driver: Any, mode: Mode, servers: Servers
) -> None:
    primary, secondary = servers
    primary.script(Fault.content_filtered(after_chunks=2))
    reply = await driver.run(continuing(driver, servers), mode)
    assert reply.text == "one two"
    assert driver.finish_reason_of(reply) == "content_filter"
    assert driver.served_by(reply) == 0
    assert secondary.requests == []
