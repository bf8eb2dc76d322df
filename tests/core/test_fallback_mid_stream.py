"""``mid_stream=``: what a stream that fails after it delivered content does.

``"restart"`` (the default) restarts the request on the next client and tells the
``on_restart`` hooks; ``"continue"`` sends the next client that accepts an assistant
prefill the text delivered, so a plain consumer's concatenation is one answer;
``"raise"`` raises ``StreamInterruptedError`` carrying what was delivered. A failure
before any content falls through quietly under every policy.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from llm_resilience import LLMResilienceError, StreamInterruptedError, is_transient
from llm_resilience.fallback import Cooldown, FallbackChain, MemberProfile, StreamRestart
from llm_resilience.fallback._continuation import is_prefill_rejection


class Dropped(ConnectionError):
    """A connection cut mid-body (transient)."""


def words_then_drop(words: list[str]) -> Iterator[str]:
    yield from words
    raise Dropped("peer closed connection")


def test_mid_stream_defaults_to_restart() -> None:
    assert FallbackChain(["a", "b"]).mid_stream == "restart"


@pytest.mark.parametrize("value", ["Continue", "Raise", "", None, 1])
def test_an_unknown_mid_stream_policy_is_refused_naming_the_option_and_the_values(
    value: object,
) -> None:
    with pytest.raises(
        ValueError, match=r"mid_stream must be one of 'restart', 'continue', 'raise'"
    ):
        FallbackChain(["a", "b"], mid_stream=value)  # type: ignore[arg-type]


def test_restart_restarts_on_the_next_client_and_tells_the_hooks() -> None:
    restarts: list[StreamRestart] = []
    chain = FallbackChain(["a", "b"], on_restart=restarts.append)

    def attempt(index: int, client: str) -> Iterator[str]:
        return words_then_drop(["one ", "two "]) if index == 0 else iter(["fresh"])

    assert "".join(chain.stream(attempt)) == "one two fresh"
    assert [(r.failed_client, r.next_client, r.chunks) for r in restarts] == [(0, 1, 2)]


def test_raise_stops_a_stream_that_failed_after_content_with_what_was_delivered() -> None:
    restarts: list[StreamRestart] = []
    chain = FallbackChain(["a", "b"], mid_stream="raise", on_restart=restarts.append)
    called: list[int] = []

    def attempt(index: int, client: str) -> Iterator[str]:
        called.append(index)
        return words_then_drop(["secret ", "answer "]) if index == 0 else iter(["fresh"])

    received: list[str] = []
    with pytest.raises(StreamInterruptedError) as caught:
        received.extend(chain.stream(attempt, text_of=str))
    error = caught.value
    assert received == ["secret ", "answer "]
    assert (error.client_index, error.chunks, error.delivered_text) == (0, 2, "secret answer ")
    assert isinstance(error.__cause__, Dropped)
    assert "secret" not in str(error)
    assert "answer" not in str(error)
    assert isinstance(error, LLMResilienceError)
    assert called == [0]
    assert restarts == []


def test_raise_still_falls_through_quietly_before_any_content() -> None:
    chain = FallbackChain(["a", "b"], mid_stream="raise")

    def attempt(index: int, client: str) -> Iterator[str]:
        if index == 0:
            raise Dropped("connection reset before any byte")
        return iter(["fresh ", "answer"])

    assert "".join(chain.stream(attempt, text_of=str)) == "fresh answer"


def test_raise_counts_only_content_chunks_as_delivered() -> None:
    chain = FallbackChain(["a", "b"], mid_stream="raise")

    def attempt(index: int, client: str) -> Iterator[str]:
        return words_then_drop(["", ""]) if index == 0 else iter(["fresh"])

    # Empty (non-content) chunks alone are not an answer: the next client restarts it.
    assert "".join(chain.stream(attempt, is_content=bool, text_of=str)) == "fresh"


def test_raise_also_replaces_the_last_clients_own_mid_stream_failure() -> None:
    chain = FallbackChain(["a", "b"], mid_stream="raise")

    def attempt(index: int, client: str) -> Iterator[str]:
        if index == 0:
            raise Dropped("connection reset before any byte")
        return words_then_drop(["half "])

    with pytest.raises(StreamInterruptedError) as caught:
        list(chain.stream(attempt, text_of=str))
    assert (caught.value.client_index, caught.value.delivered_text) == (1, "half ")


def test_raise_leaves_a_non_transient_failure_as_it_is() -> None:
    chain = FallbackChain(["a", "b"], mid_stream="raise")

    def attempt(index: int, client: str) -> Iterator[str]:
        yield "half "
        raise KeyError("a bug, not an outage")

    with pytest.raises(KeyError):
        list(chain.stream(attempt, text_of=str))


def test_raise_without_text_of_carries_the_count_and_no_text() -> None:
    chain = FallbackChain(["a", "b"], mid_stream="raise")

    def attempt(index: int, client: str) -> Iterator[str]:
        return words_then_drop(["one", "two", "three"])

    with pytest.raises(StreamInterruptedError) as caught:
        list(chain.stream(attempt))
    assert (caught.value.chunks, caught.value.delivered_text) == (3, "")


def test_a_stall_past_idle_timeout_raises_with_the_timeout_as_cause() -> None:
    chain = FallbackChain(["a", "b"], idle_timeout=0.05, mid_stream="raise")

    def attempt(index: int, client: str) -> Iterator[str]:
        yield "first "
        time.sleep(0.5)
        yield "late"

    with pytest.raises(StreamInterruptedError) as caught:
        list(chain.stream(attempt, text_of=str))
    assert caught.value.delivered_text == "first "
    assert isinstance(caught.value.__cause__, TimeoutError)


def test_stream_interrupted_error_is_never_transient() -> None:
    assert not is_transient(StreamInterruptedError(0, 3, "x"))


# -- async -----------------------------------------------------------------------------


async def awords_then_drop(words: list[str]) -> AsyncIterator[str]:
    for word in words:
        yield word
    raise Dropped("peer closed connection")


async def aonly(words: list[str]) -> AsyncIterator[str]:
    for word in words:
        yield word


async def drain(stream: AsyncIterator[str], into: list[str]) -> None:
    async for chunk in stream:
        into.append(chunk)


async def test_async_raise_stops_a_stream_that_failed_after_content() -> None:
    chain = FallbackChain(["a", "b"], mid_stream="raise")

    def attempt(index: int, client: str) -> AsyncIterator[str]:
        return awords_then_drop(["secret ", "answer "]) if index == 0 else aonly(["fresh"])

    received: list[str] = []
    with pytest.raises(StreamInterruptedError) as caught:
        await drain(chain.astream(attempt, text_of=str), received)
    assert received == ["secret ", "answer "]
    assert (caught.value.client_index, caught.value.delivered_text) == (0, "secret answer ")
    assert isinstance(caught.value.__cause__, Dropped)


async def test_async_raise_still_falls_through_quietly_before_any_content() -> None:
    chain = FallbackChain(["a", "b"], mid_stream="raise")

    def attempt(index: int, client: str) -> AsyncIterator[str]:
        return awords_then_drop([]) if index == 0 else aonly(["fresh"])

    assert [chunk async for chunk in chain.astream(attempt, text_of=str)] == ["fresh"]


async def test_async_restart_is_the_default() -> None:
    chain = FallbackChain(["a", "b"])

    def attempt(index: int, client: str) -> AsyncIterator[str]:
        return awords_then_drop(["one "]) if index == 0 else aonly(["fresh"])

    assert "".join([chunk async for chunk in chain.astream(attempt)]) == "one fresh"


async def test_async_a_stall_past_idle_timeout_raises_with_the_timeout_as_cause() -> None:
    chain = FallbackChain(["a", "b"], idle_timeout=0.05, mid_stream="raise")

    async def attempt(index: int, client: str) -> AsyncIterator[str]:
        yield "first "
        await asyncio.sleep(0.5)
        yield "late"

    with pytest.raises(StreamInterruptedError) as caught:
        await drain(chain.astream(attempt, text_of=str), [])
    assert caught.value.delivered_text == "first "
    assert isinstance(caught.value.__cause__, TimeoutError)


# -- continue ------------------------------------------------------------------------------

ANSWER = "Paris is the capital of France."
PREFILL_ONLY = MemberProfile(assistant_prefill=True)


class PrefillRejected(Exception):
    """What a provider SDK raises for a 400 refusing an assistant prefill."""

    status_code = 400

    def __init__(self) -> None:
        super().__init__(
            "Error code: 400 - This model does not support assistant message prefill. "
            "The conversation must end with a user message."
        )


def remainder(prefill: str) -> Iterator[str]:
    """What a member that honours a prefill streams: the rest of ``ANSWER``, by words."""
    assert ANSWER.startswith(prefill)
    yield from re.findall(r"\s*\S+", ANSWER[len(prefill) :])


def drop(chunk: str, n: int) -> str:
    return chunk[n:]


def continuing_chain(profiles: list[MemberProfile | None], **options: object) -> FallbackChain[str]:
    return FallbackChain(
        ["a", "b", "c"][: len(profiles)],
        mid_stream="continue",
        member_profiles=profiles,
        **options,  # type: ignore[arg-type]
    )


def test_continue_gives_a_plain_consumer_exactly_one_answer_from_a_prefill_member() -> None:
    restarts: list[StreamRestart] = []
    chain = continuing_chain([None, PREFILL_ONLY], on_restart=restarts.append)
    prefills: list[str] = []

    def attempt(index: int, client: str) -> Iterator[str]:
        assert index == 0, "the continuing member is never asked from the beginning"
        return words_then_drop(["Paris ", "is ", "the"])

    def continue_attempt(index: int, client: str, prefill: str) -> Iterator[str]:
        prefills.append(prefill)
        return remainder(prefill)

    received = list(
        chain.stream(attempt, text_of=str, continue_attempt=continue_attempt, drop_text=drop)
    )
    assert "".join(received) == ANSWER
    assert prefills == ["Paris is the"]
    assert [(r.failed_client, r.next_client, r.chunks, r.continued) for r in restarts] == [
        (0, 1, 3, True)
    ]
    assert isinstance(restarts[0].error, Dropped)


def test_continue_sends_the_prefix_without_trailing_whitespace_and_never_repeats_it() -> None:
    chain = continuing_chain([None, PREFILL_ONLY])
    prefills: list[str] = []

    def attempt(index: int, client: str) -> Iterator[str]:
        # The cut falls right after a space the consumer already holds.
        return words_then_drop(["Paris ", "is "])

    def continue_attempt(index: int, client: str, prefill: str) -> Iterator[str]:
        prefills.append(prefill)
        return remainder(prefill)  # starts " the": the member sends the space again

    received = list(
        chain.stream(attempt, text_of=str, continue_attempt=continue_attempt, drop_text=drop)
    )
    assert prefills == ["Paris is"]
    assert "".join(received) == ANSWER
    assert received[2] == "the"


def test_continue_drops_resent_whitespace_split_across_the_continuations_chunks() -> None:
    chain = continuing_chain([None, PREFILL_ONLY])

    def attempt(index: int, client: str) -> Iterator[str]:
        return words_then_drop(["Line one.\n", "\n"])

    def continue_attempt(index: int, client: str, prefill: str) -> Iterator[str]:
        assert prefill == "Line one."
        return iter(["\n", "\n", "Line two."])

    joined = "".join(
        chain.stream(attempt, text_of=str, continue_attempt=continue_attempt, drop_text=drop)
    )
    assert joined == "Line one.\n\nLine two."


def test_continue_keeps_the_continuations_own_different_whitespace() -> None:
    chain = continuing_chain([None, PREFILL_ONLY])

    def attempt(index: int, client: str) -> Iterator[str]:
        return words_then_drop(["Done: "])

    def continue_attempt(index: int, client: str, prefill: str) -> Iterator[str]:
        return iter(["\nyes"])

    joined = "".join(
        chain.stream(attempt, text_of=str, continue_attempt=continue_attempt, drop_text=drop)
    )
    assert joined == "Done: \nyes"


@pytest.mark.parametrize("profile", [None, MemberProfile(assistant_prefill=False)])
def test_continue_restarts_with_the_event_on_a_member_not_known_to_take_a_prefill(
    profile: MemberProfile | None,
) -> None:
    restarts: list[StreamRestart] = []
    chain = continuing_chain([PREFILL_ONLY, profile], on_restart=restarts.append)

    def attempt(index: int, client: str) -> Iterator[str]:
        return words_then_drop(["Paris ", "is "]) if index == 0 else iter([ANSWER])

    def continue_attempt(index: int, client: str, prefill: str) -> Iterator[str]:
        raise AssertionError("never continued")

    received = chain.stream(attempt, text_of=str, continue_attempt=continue_attempt, drop_text=drop)
    assert "".join(received) == "Paris is " + ANSWER
    assert [(r.next_client, r.chunks, r.continued) for r in restarts] == [(1, 2, False)]


def test_continue_restarts_when_the_delivered_content_is_not_all_text() -> None:
    restarts: list[StreamRestart] = []
    chain = continuing_chain([None, PREFILL_ONLY], on_restart=restarts.append)

    def attempt(index: int, client: str) -> Iterator[str]:
        # A content chunk without text (a tool call's arguments, say) cannot be prefilled.
        return words_then_drop(["Paris ", "<tool-call>"]) if index == 0 else iter([ANSWER])

    def text_of(chunk: str) -> str:
        return "" if chunk.startswith("<") else chunk

    joined = "".join(chain.stream(attempt, text_of=text_of, continue_attempt=remainder_attempt))
    assert joined == "Paris <tool-call>" + ANSWER
    assert [r.continued for r in restarts] == [False]


def remainder_attempt(index: int, client: str, prefill: str) -> Iterator[str]:
    raise AssertionError("never continued")


def test_a_prefill_rejection_gets_a_plain_restart_on_the_same_member_never_the_error() -> None:
    restarts: list[StreamRestart] = []
    chain = continuing_chain(
        [None, PREFILL_ONLY, PREFILL_ONLY],
        on_restart=restarts.append,
        cooldown=Cooldown(failures=1),
    )
    calls: list[tuple[int, str | None]] = []

    def attempt(index: int, client: str) -> Iterator[str]:
        calls.append((index, None))
        return words_then_drop(["Paris ", "is "]) if index == 0 else iter([ANSWER])

    def continue_attempt(index: int, client: str, prefill: str) -> Iterator[str]:
        calls.append((index, prefill))
        raise PrefillRejected()

    received = list(
        chain.stream(attempt, text_of=str, continue_attempt=continue_attempt, drop_text=drop)
    )
    assert "".join(received) == "Paris is " + ANSWER
    assert calls == [(0, None), (1, "Paris is"), (1, None)]
    assert [(r.failed_client, r.next_client, r.chunks, r.continued) for r in restarts] == [
        (0, 1, 2, True),
        (1, 1, 2, False),
    ]
    # The member that refused the prefill answered: its circuit stays closed.
    assert chain.health()[1].state == "closed"


def test_a_member_that_rejected_a_prefill_is_never_sent_one_again_by_the_chain() -> None:
    restarts: list[StreamRestart] = []
    chain = continuing_chain([None, PREFILL_ONLY], on_restart=restarts.append)
    calls: list[tuple[int, str | None]] = []

    def attempt(index: int, client: str) -> Iterator[str]:
        calls.append((index, None))
        return words_then_drop(["Paris "]) if index == 0 else iter([ANSWER])

    def continue_attempt(index: int, client: str, prefill: str) -> Iterator[str]:
        calls.append((index, prefill))
        raise PrefillRejected()

    for _ in range(2):
        joined = "".join(chain.stream(attempt, text_of=str, continue_attempt=continue_attempt))
        assert joined == "Paris " + ANSWER
    assert calls == [(0, None), (1, "Paris"), (1, None), (0, None), (1, None)]
    assert [r.continued for r in restarts] == [True, False, False]


def test_prefill_rejections_are_told_apart_from_other_bad_requests() -> None:
    assert is_prefill_rejection(PrefillRejected())
    wrapped = RuntimeError("the framework's wrapper")
    wrapped.__cause__ = PrefillRejected()
    assert is_prefill_rejection(wrapped)
    assert not is_prefill_rejection(ValueError("Error code: 400 - Invalid request."))
    assert not is_prefill_rejection(None)


def test_a_prefill_rejection_on_the_last_member_still_ends_in_its_answer() -> None:
    chain = continuing_chain([None, PREFILL_ONLY])

    def attempt(index: int, client: str) -> Iterator[str]:
        return words_then_drop(["Paris "]) if index == 0 else iter([ANSWER])

    def continue_attempt(index: int, client: str, prefill: str) -> Iterator[str]:
        raise PrefillRejected()

    assert "".join(chain.stream(attempt, text_of=str, continue_attempt=continue_attempt)) == (
        "Paris " + ANSWER
    )


def test_continue_carries_on_across_two_members_that_each_fail_mid_way() -> None:
    restarts: list[StreamRestart] = []
    chain = continuing_chain([None, PREFILL_ONLY, PREFILL_ONLY], on_restart=restarts.append)

    def attempt(index: int, client: str) -> Iterator[str]:
        return words_then_drop(["Paris "])

    def continue_attempt(index: int, client: str, prefill: str) -> Iterator[str]:
        if index == 1:
            return words_then_drop(list(remainder(prefill))[:2])
        return remainder(prefill)

    received = chain.stream(attempt, text_of=str, continue_attempt=continue_attempt, drop_text=drop)
    assert "".join(received) == ANSWER
    assert [(r.failed_client, r.next_client, r.chunks, r.continued) for r in restarts] == [
        (0, 1, 1, True),
        (1, 2, 3, True),
    ]


def test_continue_without_a_continue_attempt_restarts_as_before() -> None:
    chain = continuing_chain([None, PREFILL_ONLY])

    def attempt(index: int, client: str) -> Iterator[str]:
        return words_then_drop(["Paris "]) if index == 0 else iter([ANSWER])

    assert "".join(chain.stream(attempt, text_of=str)) == "Paris " + ANSWER


def test_continue_still_raises_the_last_members_own_failure() -> None:
    chain = continuing_chain([None, PREFILL_ONLY])

    def continue_attempt(index: int, client: str, prefill: str) -> Iterator[str]:
        raise Dropped("the fallback is down too")

    with pytest.raises(Dropped, match="down too"):
        list(
            chain.stream(
                lambda index, client: words_then_drop(["Paris "]),
                text_of=str,
                continue_attempt=continue_attempt,
            )
        )


async def aremainder(prefill: str) -> AsyncIterator[str]:
    for word in remainder(prefill):
        yield word


async def test_async_continue_gives_a_plain_consumer_exactly_one_answer() -> None:
    restarts: list[StreamRestart] = []
    chain = continuing_chain([None, PREFILL_ONLY], on_restart=restarts.append)

    def attempt(index: int, client: str) -> AsyncIterator[str]:
        return awords_then_drop(["Paris ", "is "])

    def continue_attempt(index: int, client: str, prefill: str) -> AsyncIterator[str]:
        return aremainder(prefill)

    received = [
        chunk
        async for chunk in chain.astream(
            attempt, text_of=str, continue_attempt=continue_attempt, drop_text=drop
        )
    ]
    assert "".join(received) == ANSWER
    assert [(r.chunks, r.continued) for r in restarts] == [(2, True)]


async def test_async_a_prefill_rejection_restarts_on_the_same_member_with_the_event() -> None:
    restarts: list[StreamRestart] = []
    chain = continuing_chain([None, PREFILL_ONLY], on_restart=restarts.append)

    def attempt(index: int, client: str) -> AsyncIterator[str]:
        return awords_then_drop(["Paris "]) if index == 0 else aonly([ANSWER])

    async def continue_attempt(index: int, client: str, prefill: str) -> AsyncIterator[str]:
        raise PrefillRejected()
        yield  # pragma: no cover - an async generator that fails at once

    received = [
        chunk
        async for chunk in chain.astream(attempt, text_of=str, continue_attempt=continue_attempt)
    ]
    assert "".join(received) == "Paris " + ANSWER
    assert [(r.failed_client, r.next_client, r.continued) for r in restarts] == [
        (0, 1, True),
        (1, 1, False),
    ]


async def test_async_continue_under_an_idle_timeout_continues_a_stalled_stream() -> None:
    chain = continuing_chain([None, PREFILL_ONLY], idle_timeout=0.05)

    async def attempt(index: int, client: str) -> AsyncIterator[str]:
        yield "Paris "
        await asyncio.sleep(5)

    def continue_attempt(index: int, client: str, prefill: str) -> AsyncIterator[str]:
        return aremainder(prefill)

    received = [
        chunk
        async for chunk in chain.astream(
            attempt, text_of=str, continue_attempt=continue_attempt, drop_text=drop
        )
    ]
    assert "".join(received) == ANSWER
