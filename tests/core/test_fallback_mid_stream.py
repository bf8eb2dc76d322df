"""``mid_stream=``: what a stream that fails after it delivered content does.

``"restart"`` (the default) restarts the request on the next client and tells the
``on_restart`` hooks; ``"raise"`` raises ``StreamInterruptedError`` carrying what was
delivered. A failure before any content falls through quietly under either policy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from llm_resilience import LLMResilienceError, StreamInterruptedError, is_transient
from llm_resilience.fallback import FallbackChain, StreamRestart


class Dropped(ConnectionError):
    """A connection cut mid-body (transient)."""


def words_then_drop(words: list[str]) -> Iterator[str]:
    yield from words
    raise Dropped("peer closed connection")


def test_mid_stream_defaults_to_restart() -> None:
    assert FallbackChain(["a", "b"]).mid_stream == "restart"


@pytest.mark.parametrize("value", ["continue", "Raise", "", None, 1])
def test_an_unknown_mid_stream_policy_is_refused_naming_the_option_and_the_values(
    value: object,
) -> None:
    with pytest.raises(ValueError, match=r"mid_stream must be one of 'restart', 'raise'"):
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
