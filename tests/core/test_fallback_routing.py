"""Routing rules of the fallback engine: prompts too long, and what a member can take.

Clients are plain callables that answer or raise; every test runs the same rule through
``invoke``, ``ainvoke``, ``stream`` and ``astream``. The provider errors are the real
``openai``/``anthropic`` SDK exception types, built the way the SDKs build them from a 400.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import anthropic
import httpx
import openai
import pytest

from llm_resilience import Cooldown, FallbackChain, TransientClassifier, is_transient
from llm_resilience.errors import NoCapableMemberError
from llm_resilience.fallback import (
    MemberProfile,
    RequestNeeds,
    context_limit_of,
    is_context_overflow,
)

LOGGER = "llm_resilience.fallback"
SHAPES = ("invoke", "ainvoke", "stream", "astream")


# -- provider errors, as the SDKs raise them ------------------------------------------


def _response(status: int, url: str) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("POST", url))


def openai_too_long(maximum: int = 128_000, tokens: int = 130_000) -> openai.BadRequestError:
    message = (
        f"This model's maximum context length is {maximum} tokens. However, your messages "
        f"resulted in {tokens} tokens. Please reduce the length of the messages."
    )
    body = {
        "message": message,
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    return openai.BadRequestError(
        f"Error code: 400 - {{'error': {body}}}",
        response=_response(400, "https://api.openai.com/v1/chat/completions"),
        body=body,
    )


def anthropic_too_long(maximum: int = 200_000, tokens: int = 210_000) -> anthropic.BadRequestError:
    body = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {tokens} tokens > {maximum} maximum",
        },
    }
    return anthropic.BadRequestError(
        f"Error code: 400 - {body}",
        response=_response(400, "https://api.anthropic.com/v1/messages"),
        body=body,
    )


def openai_bad_request() -> openai.BadRequestError:
    body = {"message": "Invalid request.", "type": "invalid_request_error", "code": None}
    return openai.BadRequestError(
        "Error code: 400 - Invalid request.",
        response=_response(400, "https://api.openai.com/v1/chat/completions"),
        body=body,
    )


class ContextOverflowError(Exception):
    """Stands in for LangChain's type, which the rule recognises by name and package."""


ContextOverflowError.__module__ = "langchain_core.exceptions"


# -- running one chain in each call shape ---------------------------------------------


class Member:
    """A client that answers ``name`` or raises ``error``, and counts its calls."""

    def __init__(self, name: str, error: BaseException | None = None) -> None:
        self.name = name
        self.error = error
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.name


def run(shape: str, chain: FallbackChain[Member], **options: Any) -> str:
    """The answer of one call of ``shape``, joined from chunks for the streams."""
    if shape == "invoke":
        return chain.invoke(lambda index, member: member(), **options)
    if shape == "ainvoke":

        async def attempt(index: int, member: Member) -> str:
            return member()

        return asyncio.run(chain.ainvoke(attempt, **options))
    if shape == "stream":

        def chunks(index: int, member: Member) -> Iterator[str]:
            yield member()

        return "".join(chain.stream(chunks, **options))

    async def achunks(index: int, member: Member) -> AsyncIterator[str]:
        yield member()

    async def collect() -> str:
        return "".join([chunk async for chunk in chain.astream(achunks, **options)])

    return asyncio.run(collect())


def chain_of(
    members: Sequence[Member], windows: Sequence[int | None], **options: Any
) -> FallbackChain[Member]:
    profiles = [MemberProfile(context_window=window) for window in windows]
    return FallbackChain(list(members), member_profiles=profiles, **options)


# -- which error means "prompt too long" ----------------------------------------------


def test_openai_context_length_exceeded_is_a_prompt_too_long() -> None:
    assert is_context_overflow(openai_too_long())
    assert context_limit_of(openai_too_long(maximum=16_385)) == 16_385


def test_anthropic_prompt_is_too_long_is_a_prompt_too_long() -> None:
    assert is_context_overflow(anthropic_too_long())
    assert context_limit_of(anthropic_too_long(maximum=200_000)) == 200_000


def test_anthropic_input_and_max_tokens_over_the_limit_is_a_prompt_too_long() -> None:
    error = ValueError(
        "input length and `max_tokens` exceed context limit: 198000 + 21333 > 200000, "
        "decrease input length or `max_tokens` and try again"
    )
    assert is_context_overflow(error)
    assert context_limit_of(error) == 200_000


def test_langchains_context_overflow_type_is_a_prompt_too_long_whatever_it_says() -> None:
    assert is_context_overflow(ContextOverflowError("no words to go on"))


def test_a_prompt_too_long_is_found_along_the_cause_chain() -> None:
    wrapper = RuntimeError("the call failed")
    wrapper.__cause__ = anthropic_too_long()
    assert is_context_overflow(wrapper)
    assert context_limit_of(wrapper) == 200_000


def test_a_plain_bad_request_is_not_a_prompt_too_long() -> None:
    assert not is_context_overflow(openai_bad_request())
    assert not is_context_overflow(None)


def test_a_rate_limit_that_mentions_the_context_length_is_not_a_prompt_too_long() -> None:
    error = openai.RateLimitError(
        "Rate limit reached; maximum context length is 128000 tokens",
        response=_response(429, "https://api.openai.com/v1/chat/completions"),
        body=None,
    )
    assert not is_context_overflow(error)


def test_a_prompt_too_long_is_not_transient() -> None:
    assert not is_transient(openai_too_long())
    assert not is_transient(anthropic_too_long())


# -- where a prompt too long goes -----------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_a_prompt_too_long_moves_to_the_next_larger_member_skipping_others(shape: str) -> None:
    small = Member("small", openai_too_long(maximum=128_000))
    equal = Member("equal")
    unknown = Member("unknown")
    smaller = Member("smaller")
    large = Member("large")
    chain = chain_of(
        [small, equal, unknown, smaller, large], [128_000, 128_000, None, 16_000, 200_000]
    )

    assert run(shape, chain) == "large"
    assert (small.calls, equal.calls, unknown.calls, smaller.calls, large.calls) == (
        1,
        0,
        0,
        0,
        1,
    )


@pytest.mark.parametrize("shape", SHAPES)
def test_a_prompt_too_long_with_no_larger_member_propagates_at_once(shape: str) -> None:
    error = anthropic_too_long()
    big = Member("big", error)
    smaller = Member("smaller")
    chain = chain_of([big, smaller], [200_000, 128_000])

    with pytest.raises(anthropic.BadRequestError) as raised:
        run(shape, chain)

    assert raised.value is error
    assert smaller.calls == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_a_prompt_too_long_on_the_last_member_propagates(shape: str) -> None:
    error = openai_too_long()
    first = Member(
        "first", openai.RateLimitError("slow down", response=_response(429, "https://x"), body=None)
    )
    last = Member("last", error)
    chain = chain_of([first, last], [None, 128_000])

    with pytest.raises(openai.BadRequestError) as raised:
        run(shape, chain)

    assert raised.value is error


@pytest.mark.parametrize("shape", SHAPES)
def test_an_unknown_window_is_read_from_the_error_that_states_it(shape: str) -> None:
    first = Member("first", openai_too_long(maximum=128_000))
    same = Member("same")
    larger = Member("larger")
    chain = chain_of([first, same, larger], [None, 128_000, 1_000_000])

    assert run(shape, chain) == "larger"
    assert same.calls == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_an_unknown_window_and_a_silent_error_propagate(shape: str) -> None:
    error = ContextOverflowError("too long")
    first = Member("first", error)
    larger = Member("larger")
    chain = chain_of([first, larger], [None, 1_000_000])

    with pytest.raises(ContextOverflowError) as raised:
        run(shape, chain)

    assert raised.value is error
    assert larger.calls == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_a_second_prompt_too_long_climbs_to_a_still_larger_member(shape: str) -> None:
    first = Member("first", openai_too_long(maximum=16_000))
    second = Member("second", openai_too_long(maximum=128_000))
    between = Member("between")
    third = Member("third")
    chain = chain_of([first, second, between, third], [16_000, 128_000, 100_000, 1_000_000])

    assert run(shape, chain) == "third"
    assert between.calls == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_a_transient_failure_after_a_prompt_too_long_stays_among_the_larger(shape: str) -> None:
    busy = openai.RateLimitError("slow down", response=_response(429, "https://x"), body=None)
    first = Member("first", anthropic_too_long(maximum=200_000))
    large_busy = Member("large-busy", busy)
    small = Member("small")
    larger = Member("larger")
    chain = chain_of([first, large_busy, small, larger], [200_000, 1_000_000, 128_000, 400_000])

    assert run(shape, chain) == "larger"
    assert small.calls == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_a_plain_bad_request_still_propagates_at_once(shape: str) -> None:
    error = openai_bad_request()
    first = Member("first", error)
    larger = Member("larger")
    chain = chain_of([first, larger], [8_000, 1_000_000])

    with pytest.raises(openai.BadRequestError) as raised:
        run(shape, chain)

    assert raised.value is error
    assert larger.calls == 0


def test_a_prompt_too_long_moves_on_even_under_a_wider_classifier() -> None:
    first = Member("first", openai_too_long(maximum=128_000))
    same = Member("same")
    larger = Member("larger")
    chain = chain_of(
        [first, same, larger],
        [128_000, 128_000, 200_000],
        classifier=TransientClassifier(also=lambda error: True),
    )

    assert run("invoke", chain) == "larger"
    assert same.calls == 0


def test_a_prompt_too_long_never_cools_a_member_down() -> None:
    first = Member("first", openai_too_long(maximum=8_000))
    second = Member("second")
    chain = chain_of([first, second], [8_000, 128_000], cooldown=Cooldown(failures=1))

    for _ in range(3):
        assert run("invoke", chain) == "second"

    assert first.calls == 3


def test_the_move_is_logged_with_both_windows(caplog: pytest.LogCaptureFixture) -> None:
    chain = chain_of([Member("a", openai_too_long()), Member("b")], [128_000, 200_000])

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run("invoke", chain)

    assert "client 1, whose window is 200000 tokens" in caplog.text
    assert "(context window 128000 tokens)" in caplog.text
    assert "transiently" not in caplog.text  # a prompt too long is not a transient failure


@pytest.mark.parametrize("shape", ["stream", "astream", "ainvoke"])
def test_no_shape_calls_a_prompt_too_long_a_transient_failure(
    shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    chain = chain_of([Member("a", openai_too_long()), Member("b")], [128_000, 200_000])

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(shape, chain)

    assert "whose window is 200000 tokens" in caplog.text
    assert "transiently" not in caplog.text


# -- what a member can take -----------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_a_request_with_tools_skips_members_known_not_to_call_tools(shape: str) -> None:
    no_tools = Member("no-tools")
    unknown = Member("unknown")
    chain = FallbackChain(
        [no_tools, unknown], member_profiles=[MemberProfile(tool_calling=False), None]
    )

    assert run(shape, chain, needs=RequestNeeds(tool_calling=True)) == "unknown"
    assert no_tools.calls == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_a_request_without_those_needs_is_tried_on_every_member(shape: str) -> None:
    no_tools = Member("no-tools")
    chain = FallbackChain(
        [no_tools, Member("other")], member_profiles=[MemberProfile(tool_calling=False), None]
    )

    assert run(shape, chain, needs=RequestNeeds()) == "no-tools"


@pytest.mark.parametrize("shape", SHAPES)
def test_a_request_no_member_can_take_raises_naming_what_it_needs(shape: str) -> None:
    first = Member("first")
    second = Member("second")
    chain = FallbackChain(
        [first, second],
        member_profiles=[
            MemberProfile(image_inputs=False),
            MemberProfile(tool_calling=True, image_inputs=False, structured_output=False),
        ],
    )
    needs = RequestNeeds(tool_calling=True, image_inputs=True, structured_output=True)

    with pytest.raises(NoCapableMemberError) as raised:
        run(shape, chain, needs=needs)

    assert raised.value.missing == {
        0: ("image_inputs",),
        1: ("image_inputs", "structured_output"),
    }
    assert "member 1 lacks image_inputs, structured_output" in str(raised.value)
    assert (first.calls, second.calls) == (0, 0)
    assert not is_transient(raised.value)


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


NO_TOOLS = MemberProfile(tool_calling=False)
TOOLS = RequestNeeds(tool_calling=True)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_tool_request_goes_to_the_one_capable_member_while_it_cools_down(shape: str) -> None:
    no_tools = Member("no-tools")
    capable = Member("capable", ConnectionError("connection reset"))
    chain = FallbackChain(
        [no_tools, capable],
        member_profiles=[NO_TOOLS, None],
        cooldown=Cooldown(failures=2, window=60, duration=30),
        clock=FakeClock(),
    )
    for _ in range(2):
        with pytest.raises(ConnectionError):
            run(shape, chain, needs=TOOLS)
    assert [member.state for member in chain.health()] == ["closed", "open"]
    capable.error = None

    assert run(shape, chain, needs=TOOLS) == "capable"
    assert (no_tools.calls, capable.calls) == (0, 3)
    assert chain.health()[1].state == "closed"


@pytest.mark.parametrize("shape", SHAPES)
def test_when_every_member_cools_down_the_capable_one_whose_cooldown_ends_first_is_tried(
    shape: str,
) -> None:
    clock = FakeClock()
    no_tools = Member("no-tools", ConnectionError("connection reset"))
    first = Member("first")
    second = Member("second")
    chain = FallbackChain(
        [no_tools, first, second],
        member_profiles=[NO_TOOLS, None, None],
        cooldown=Cooldown(failures=1, window=60, duration=30),
        clock=clock,
    )
    assert run(shape, chain) == "first"  # the member without tools opens first (until 1030)
    clock.now += 1
    first.error = ConnectionError("connection reset")
    assert run(shape, chain) == "second"  # then ``first`` (until 1031)
    clock.now += 1
    second.error = ConnectionError("connection reset")
    with pytest.raises(ConnectionError):
        run(shape, chain)  # then ``second`` (until 1032): every member cools down
    assert [member.state for member in chain.health()] == ["open", "open", "open"]
    first.error = second.error = None

    assert run(shape, chain, needs=TOOLS) == "first"
    assert (no_tools.calls, first.calls, second.calls) == (1, 3, 2)


@pytest.mark.parametrize("shape", SHAPES)
def test_no_capable_member_names_every_member_even_one_cooling_down(shape: str) -> None:
    cooling = Member("cooling", ConnectionError("connection reset"))
    other = Member("other")
    chain = FallbackChain(
        [cooling, other],
        member_profiles=[NO_TOOLS, NO_TOOLS],
        cooldown=Cooldown(failures=1, window=60, duration=30),
        clock=FakeClock(),
    )
    assert run(shape, chain) == "other"
    assert chain.health()[0].state == "open"

    with pytest.raises(NoCapableMemberError) as raised:
        run(shape, chain, needs=TOOLS)

    assert raised.value.missing == {0: ("tool_calling",), 1: ("tool_calling",)}
    assert "member 0 lacks tool_calling; member 1 lacks tool_calling" in str(raised.value)
    assert (cooling.calls, other.calls) == (1, 1)


def test_needs_may_differ_per_member() -> None:
    # One member answers structured output natively, the other through a tool call.
    native = Member("native")
    via_tools = Member("via-tools")
    chain = FallbackChain(
        [native, via_tools],
        member_profiles=[
            MemberProfile(structured_output=False, tool_calling=True),
            MemberProfile(structured_output=False, tool_calling=True),
        ],
    )
    needs = [RequestNeeds(structured_output=True), RequestNeeds(tool_calling=True)]

    assert run("invoke", chain, needs=needs) == "via-tools"
    assert native.calls == 0


def test_a_declared_capability_overrides_a_known_one_field_by_field() -> None:
    known = MemberProfile(context_window=128_000, tool_calling=True, image_inputs=True)
    declared = MemberProfile(tool_calling=False)

    assert declared.over(known) == MemberProfile(
        context_window=128_000, tool_calling=False, image_inputs=True
    )
    assert declared.over(None) is declared


# -- options ----------------------------------------------------------------------------


def test_member_profiles_must_hold_one_entry_per_client() -> None:
    with pytest.raises(ValueError, match=r"profiles must hold one MemberProfile .* \(2\); got 1"):
        FallbackChain([Member("a"), Member("b")], member_profiles=[MemberProfile()])


def test_member_profiles_entries_must_be_member_profiles() -> None:
    with pytest.raises(TypeError, match=r"profiles\[1\] must be a MemberProfile or None"):
        FallbackChain([Member("a"), Member("b")], member_profiles=[None, {"context_window": 8}])


@pytest.mark.parametrize("window", [0, -1, True, 1.5, 2_000_000_000])
def test_a_context_window_must_be_a_positive_whole_number_of_tokens(window: Any) -> None:
    with pytest.raises((TypeError, ValueError), match=r"MemberProfile\.context_window"):
        MemberProfile(context_window=window)


def test_a_capability_must_be_true_false_or_none() -> None:
    with pytest.raises(TypeError, match=r"MemberProfile\.tool_calling must be True, False or None"):
        MemberProfile(tool_calling="yes")  # type: ignore[arg-type]


def test_needs_for_the_wrong_number_of_members_is_refused() -> None:
    chain = FallbackChain([Member("a"), Member("b")])
    with pytest.raises(TypeError, match=r"needs must be a RequestNeeds, or one per member \(2\)"):
        run("invoke", chain, needs=[RequestNeeds()])


@pytest.mark.parametrize("shape", SHAPES)
def test_a_prompt_too_long_moves_on_the_same_way_under_a_per_client_timeout(shape: str) -> None:
    # With a timeout, sync attempts run on worker threads and async ones under a scope.
    small = Member("small", openai_too_long(maximum=128_000))
    equal = Member("equal")
    large = Member("large")
    chain = chain_of([small, equal, large], [128_000, 128_000, 200_000], per_client_timeout=5)

    assert run(shape, chain) == "large"
    assert equal.calls == 0


def test_routed_needs_are_the_capabilities_some_member_is_known_to_lack() -> None:
    profiles = [MemberProfile(image_inputs=False, tool_calling=True), MemberProfile(), None]
    assert FallbackChain(["a", "b", "c"], member_profiles=profiles).routed_needs == {"image_inputs"}
    assert FallbackChain(["a", "b"]).routed_needs == frozenset()
