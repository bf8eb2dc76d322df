"""Sync stream sources: an attempt's chunks, pulled from a worker thread by a deadline.

Without a time limit the engine pulls an attempt's iterator itself (no source).
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import queue
import threading
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, Generic, TypeAlias, TypeVar

from llm_resilience.fallback._workers import _WORKERS

# Every part of the fallback chain logs as ``llm_resilience.fallback`` (a documented name).
logger = logging.getLogger("llm_resilience.fallback")

ChunkT = TypeVar("ChunkT")

#: An adapter's per-chunk translation: ``mark(chunk, index)`` is the chunk of the member
#: at ``index`` as the chain's caller sees it.
Mark: TypeAlias = Callable[[Any, int], Any]
#: What an async stream attempt returns: the stream, or an awaitable of it (a coroutine
#: method that returns a stream, as LlamaIndex's ``astream_chat``).
AsyncOpened: TypeAlias = AsyncIterable[ChunkT] | Awaitable[AsyncIterable[ChunkT]]


class _AttemptTimedOut(Exception):
    """Internal: a time limit of the chain fired on an attempt."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("attempt time limit")
        self.cause = cause


class _ThreadedSource(Generic[ChunkT]):
    """With time limits: a worker thread pulls the attempt; the caller waits on a queue.

    The worker runs ahead of the caller, so a chunk (or the end of the stream) that
    arrived while the caller was busy elsewhere is taken at once: only the caller's
    waits can run out. An abandoned worker stops at its next chunk; one blocked inside
    the provider's read stays there until that read returns or fails.
    """

    __slots__ = ("_queue", "_stop", "finished")

    def __init__(
        self,
        attempt: Callable[[int, Any], Iterable[ChunkT]],
        index: int,
        client: Any,
    ) -> None:
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self.finished = False
        context = contextvars.copy_context()

        def produce() -> None:
            iterator: Iterator[ChunkT] | None = None
            try:
                iterator = iter(attempt(index, client))
                for chunk in iterator:
                    self._queue.put(("chunk", chunk))
                    if self._stop.is_set():
                        return
                self._queue.put(("end", None))
            except BaseException as error:
                # Close a failed iterator before the consumer hears of the failure, so it
                # is released before the next client starts.
                if iterator is not None:
                    _close(iterator)
                    iterator = None
                self._queue.put(("error", error))
                if self._stop.is_set():
                    # Abandoned: an error nobody reads ties this frame into a cycle
                    # through ``self`` (see `next`). Put before the check, and `close`
                    # drains after setting ``_stop``, so one of the two drains it.
                    self._drain()
            finally:
                if iterator is not None and self._stop.is_set():
                    _close(iterator)

        _WORKERS.submit(lambda: context.run(produce))

    def next(self, timeout: float | None) -> ChunkT:
        """The next chunk, waiting at most ``timeout`` seconds (None: no limit).

        Raises ``StopIteration`` at the end, and `_AttemptTimedOut` when the wait
        ran out.
        """
        try:
            kind, value = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise _AttemptTimedOut(TimeoutError("the wait for the next chunk ran out")) from None
        if kind == "chunk":
            return value  # type: ignore[no-any-return]
        if kind == "end":
            self.finished = True
            raise StopIteration
        try:
            raise value
        finally:
            # The error's traceback holds this frame: without the local dropped, error,
            # frame and the worker's frames (the provider's stream among their locals)
            # form a cycle only the cyclic GC frees, on whatever thread it next runs.
            del value

    def close(self) -> None:
        self._stop.set()
        self._drain()

    def _drain(self) -> None:
        """Drop what is queued (an abandoned source's chunks, or its late error)."""
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass


def _close(iterator: object) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            logger.debug("Closing an abandoned stream failed.", exc_info=True)


async def _aclose(iterator: object) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:
            logger.debug("Closing an abandoned stream failed.", exc_info=True)


def marked(
    attempt: Callable[[int, Any], Iterable[ChunkT]], mark: Mark
) -> Callable[[int, Any], Iterator[ChunkT]]:
    """``attempt`` whose chunks come out marked, for the paths that pull an attempt
    themselves (hedged streams); the plain loop marks each chunk where it pulls it."""

    def marking(index: int, client: Any) -> Iterator[ChunkT]:
        # A generator: the attempt starts when the first chunk is pulled.
        stream = attempt(index, client)
        try:
            for chunk in stream:
                yield mark(chunk, index)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    return marking


async def opened(stream: AsyncOpened[ChunkT]) -> AsyncIterator[ChunkT]:
    """The async iterator of what an async stream attempt returned: its async iterable,
    or the one an awaitable of it gives."""
    if not hasattr(stream, "__aiter__") and inspect.isawaitable(stream):
        stream = await stream
    return aiter(stream)  # type: ignore[arg-type]


def amarked(
    attempt: Callable[[int, Any], AsyncOpened[ChunkT]], mark: Mark
) -> Callable[[int, Any], AsyncIterator[ChunkT]]:
    """Async [`marked`][]."""

    async def marking(index: int, client: Any) -> AsyncIterator[ChunkT]:
        stream = await opened(attempt(index, client))
        try:
            async for chunk in stream:
                yield mark(chunk, index)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    return marking
