"""The fault state a fake model keeps: requests counted, hangs that end on cue, fresh errors."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import TYPE_CHECKING, TypeVar

from llm_resilience.testing.errors import fresh_error

__all__ = ["FakeFaults", "HasFakeFaults"]

E = TypeVar("E", bound=BaseException)


class FakeFaults:
    """What a fake model does wrong, written once for the LangChain and LlamaIndex fakes.

    Examples:
        >>> faults = FakeFaults()
        >>> faults.count(), faults.calls  # the first request's turn, and the count
        (0, 1)
        >>> faults.release()
        >>> faults.hang(60.0)  # released: returns at once (so would `await faults.ahang(60.0)`)
        >>> copied = faults.failure(ValueError("scripted"))
        >>> copied is faults.last_error, copied.args
        (True, ('scripted',))

    A fake holds one as a private attribute and calls it from each of its methods:
    `count()` first (under a lock, so threads never lose a request), then `hang()` or
    `ahang()` for its `hang_seconds`, then raises `failure()` of its `error`. A hang of
    `None` seconds returns at once.

    One rule ends a hang, sync or async: it lasts `seconds`, or until `release()`
    (called from any thread, it ends every current hang and every later one at once).
    An async hang also ends at once when its task is cancelled (a timeout's doing), with
    the `CancelledError` raised as usual; it is woken, never polled.
    """

    __slots__ = ("_lock", "_released", "_waiters", "calls", "last_error")

    #: Requests counted so far by `count()`.
    calls: int
    #: The copy of the error the latest `failure()` made (None before one).
    last_error: BaseException | None
    #: Guards `calls` and `_waiters`; never held across a wait.
    _lock: threading.Lock
    #: Set by `release()`: every sync hang waits on it.
    _released: threading.Event
    #: The async hangs under way, each as its loop and the future that wakes it.
    _waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]

    def __init__(self) -> None:
        self.calls = 0
        self.last_error = None
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._waiters = []

    def count(self) -> int:
        """Count one request; returns its turn (how many were counted before it)."""
        with self._lock:
            turn = self.calls
            self.calls += 1
        return turn

    def failure(self, error: E) -> E:
        """A fresh copy of `error` to raise (see `fresh_error`), kept as `last_error`.

        Never raise `error` itself: each raise would prepend its frames to that one
        object's traceback, keeping every failed call's frames alive.
        """
        copied = fresh_error(error)
        self.last_error = copied
        return copied

    def hang(self, seconds: float | None) -> None:
        """Block for `seconds` (None: not at all), or until `release()`."""
        if seconds is not None:
            self._released.wait(seconds)

    async def ahang(self, seconds: float | None) -> None:
        """Wait for `seconds` (None: not at all), until `release()`, or cancellation."""
        if seconds is None:
            return
        loop = asyncio.get_running_loop()
        waiter = (loop, loop.create_future())
        with self._lock:
            if self._released.is_set():
                return
            self._waiters.append(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await waiter[1]
        finally:
            with self._lock, contextlib.suppress(ValueError):  # release() took it already
                self._waiters.remove(waiter)

    def release(self) -> None:
        """End every current and future hang at once, sync and async, from any thread."""
        with self._lock:
            self._released.set()
            waiters, self._waiters = self._waiters, []
        for loop, woken in waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nothing waits
                loop.call_soon_threadsafe(_wake, woken)


class HasFakeFaults:
    """The face a fake model shows of the `FakeFaults` it keeps as `_faults`.

    A mixin: the fake declares `_faults` (a pydantic `PrivateAttr(default_factory=
    FakeFaults)`, say) and gains `calls`, `last_error` and `release()`.

    Examples:
        >>> class Fake(HasFakeFaults):
        ...     def __init__(self) -> None:
        ...         self._faults = FakeFaults()
        >>> fake = Fake()
        >>> fake._faults.count()
        0
        >>> fake.calls, fake.last_error
        (1, None)
    """

    __slots__ = ()

    if TYPE_CHECKING:
        _faults: FakeFaults

    @property
    def calls(self) -> int:
        """Requests this fake received so far (every call and every stream counts)."""
        return self._faults.calls

    @property
    def last_error(self) -> BaseException | None:
        """The copy of `error` the latest failing request raised (None before one)."""
        return self._faults.last_error

    def release(self) -> None:
        """End every current and future hang at once, sync or async, from any thread.

        Call it when a test is done with a hung fake, so the worker threads and tasks a
        timed-out chain left behind finish.
        """
        self._faults.release()


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)
