"""Short waits on the same member before the chain moves on (``member_retry=``).

A member that answers 429 with a ``Retry-After`` it is worth waiting for, or a passing
500/502/503/504/529, often answers the same request a moment later, and that member may
be the one the user prefers (cheaper, faster, the model they chose). With
``member_retry=RetryPolicy(...)`` the chain retries such a failure on the same member,
then moves on as it always did:

* a 429 (or 503) with ``Retry-After`` (or ``retry-after-ms``) of at most the policy's
  ``max_delay`` waits exactly what the header asks (never less); a longer one moves on
  at once, since waiting for less than asked only earns another 429;
* any other 429/5xx above waits the policy's backoff (``base_delay * 2**n`` plus
  jitter, at most ``max_delay``);
* everything else (a bad request, a prompt too long, a connection error, a time limit)
  is left to the chain's own rules, untouched;
* at most ``attempts`` tries per member in all, and a retry never starts when its wait
  would use up the attempt's time bound (the smaller of ``per_client_timeout`` and
  ``first_token_timeout``): the waits count toward it;
* a stream is retried only before its first chunk: a chunk delivered is never sent
  again by a retry;
* with a [`RetryBudget`][] (the chain's ``retry_budget``), each retry is granted by it
  first: a refused one gives the member up at once, with no wait.

A cancellation during a wait (``asyncio.CancelledError``, a closed generator) ends the
wait at once; the failed try's response was closed before the wait began, so nothing
is left open.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import TypeVar

from llm_resilience.fallback._sources import AsyncOpened, _aclose, _close, opened
from llm_resilience.retry import RetryPolicy, is_retryable
from llm_resilience.retry_budget import CallAttempts
from llm_resilience.transient import retry_after_of, status_code_of

__all__ = ["RETRIED_STATUS_CODES", "_MemberRetry", "member_retry_option"]

# Every part of the fallback chain logs as ``llm_resilience.fallback`` (a documented name).
logger = logging.getLogger("llm_resilience.fallback")

ClientT = TypeVar("ClientT")
ResultT = TypeVar("ResultT")
ChunkT = TypeVar("ChunkT")

#: The statuses a member is retried on: rate limited, or a server error that passes.
RETRIED_STATUS_CODES: frozenset[int] = frozenset({429, 500, 502, 503, 504, 529})


def member_retry_option(value: object) -> RetryPolicy | None:
    """The ``member_retry=`` option: None (each member once) or a [`RetryPolicy`][]."""
    if value is None:
        return None
    if not isinstance(value, RetryPolicy):
        raise TypeError(
            "member_retry must be None or an llm_resilience.RetryPolicy(...); "
            f"got {type(value).__name__}"
        )
    if value.is_custom:
        raise ValueError(
            "member_retry must be a RetryPolicy(attempts=..., base_delay=..., max_delay=...); "
            "a RetryPolicy.from_tenacity(...) policy cannot honour Retry-After or the "
            "chain's time limits"
        )
    return value


class _MemberRetry:
    """Wraps a chain's attempt so that one member is retried under a policy."""

    __slots__ = ("_budget", "_clock", "_policy")

    def __init__(
        self, policy: RetryPolicy, budget: float | None, clock: Callable[[], float]
    ) -> None:
        #: The policy: attempts, backoff, the longest ``Retry-After`` waited out.
        self._policy = policy
        #: Seconds one attempt may take before its first content, or None (unbounded).
        self._budget = budget
        #: The monotonic clock the budget is read on (the chain's).
        self._clock = clock

    def _wait_before_retry(
        self,
        error: BaseException,
        tries: int,
        began: float,
        index: int = -1,
        calls: CallAttempts | None = None,
    ) -> float | None:
        """Seconds to wait before try ``tries + 1``, or None to give the member up."""
        policy = self._policy
        if tries >= policy.attempts or not isinstance(error, Exception):
            return None
        status = status_code_of(error)
        if status not in RETRIED_STATUS_CODES or not is_retryable(
            error, permanent_status_codes=policy.permanent_status_codes
        ):
            return None
        asked = retry_after_of(error, now=policy.now)
        if asked is not None and asked > policy.max_delay:
            return None  # waiting less than asked would only earn another refusal
        if asked is not None and asked > 0:
            wait = asked
        else:
            wait = policy._backoff(tries)
            if policy.jitter:
                wait += random.uniform(0, policy.jitter)  # spreads retries; not a secret
            wait = min(wait, policy.max_delay)
        if self._budget is not None and self._clock() - began + wait >= self._budget:
            return None  # the wait would spend the attempt's time: move on now
        if calls is not None and not calls.may_retry():
            self._refused(index, error)
            return None
        return wait

    async def _await_wait_before_retry(
        self, error: BaseException, tries: int, began: float, index: int, calls: CallAttempts | None
    ) -> float | None:
        """Async [`_wait_before_retry`][]: awaits the shared budget's grant (if any)."""
        wait = self._wait_before_retry(error, tries, began, index)
        if wait is not None and calls is not None and not await calls.amay_retry():
            self._refused(index, error)
            return None
        return wait

    @staticmethod
    def _refused(index: int, error: BaseException) -> None:
        logger.warning(
            "Client %d failed (%s, status %s); the retry budget refuses a retry of the "
            "same client.",
            index,
            type(error).__name__,
            status_code_of(error),
        )

    def _log(self, index: int, error: BaseException, tries: int, wait: float) -> None:
        logger.warning(
            "Client %d failed (%s, status %s); retrying the same client in %.2f s (try %d of %d).",
            index,
            type(error).__name__,
            status_code_of(error),
            wait,
            tries + 1,
            self._policy.attempts,
        )

    # -- one wrapper per call shape ----------------------------------------------

    def call(
        self, attempt: Callable[[int, ClientT], ResultT], calls: CallAttempts | None = None
    ) -> Callable[[int, ClientT], ResultT]:
        def retried(index: int, client: ClientT) -> ResultT:
            began = self._clock()
            tries = 0
            while True:
                tries += 1
                try:
                    return attempt(index, client)
                except Exception as error:
                    wait = self._wait_before_retry(error, tries, began, index, calls)
                    if wait is None:
                        raise
                    self._log(index, error, tries, wait)
                self._policy.sleep(wait)

        return retried

    def acall(
        self,
        attempt: Callable[[int, ClientT], Awaitable[ResultT]],
        calls: CallAttempts | None = None,
    ) -> Callable[[int, ClientT], Awaitable[ResultT]]:
        async def retried(index: int, client: ClientT) -> ResultT:
            began = self._clock()
            tries = 0
            while True:
                tries += 1
                try:
                    return await attempt(index, client)
                except Exception as error:
                    wait = await self._await_wait_before_retry(error, tries, began, index, calls)
                    if wait is None:
                        raise
                    self._log(index, error, tries, wait)
                await self._policy.asleep(wait)

        return retried

    def stream(
        self, attempt: Callable[[int, ClientT], Iterable[ChunkT]], calls: CallAttempts | None = None
    ) -> Callable[[int, ClientT], Iterable[ChunkT]]:
        def retried(index: int, client: ClientT) -> Iterator[ChunkT]:
            began = self._clock()
            tries = 0
            while True:
                tries += 1
                iterator: Iterator[ChunkT] | None = None
                try:
                    iterator = iter(attempt(index, client))
                    first = next(iterator)
                except StopIteration:
                    return
                except BaseException as error:
                    if iterator is not None:
                        _close(iterator)
                    wait = self._wait_before_retry(error, tries, began, index, calls)
                    if wait is None:
                        raise
                    self._log(index, error, tries, wait)
                    self._policy.sleep(wait)
                    continue
                break
            # Content is flowing: from here on the chain's own rules apply, unchanged.
            try:
                yield first
                yield from iterator
            finally:
                _close(iterator)

        return retried

    def astream(
        self,
        attempt: Callable[[int, ClientT], AsyncOpened[ChunkT]],
        calls: CallAttempts | None = None,
    ) -> Callable[[int, ClientT], AsyncIterable[ChunkT]]:
        async def retried(index: int, client: ClientT) -> AsyncIterator[ChunkT]:
            began = self._clock()
            tries = 0
            while True:
                tries += 1
                iterator: AsyncIterator[ChunkT] | None = None
                try:
                    iterator = await opened(attempt(index, client))
                    first = await anext(iterator)
                except StopAsyncIteration:
                    return
                except BaseException as error:
                    if iterator is not None:
                        await _aclose(iterator)
                    wait = await self._await_wait_before_retry(error, tries, began, index, calls)
                    if wait is None:
                        raise
                    self._log(index, error, tries, wait)
                    await self._policy.asleep(wait)
                    continue
                break
            try:
                yield first
                async for chunk in iterator:
                    yield chunk
            finally:
                await _aclose(iterator)

        return retried
