"""The fault state the adapters' fake models share (``llm_resilience.testing.FakeFaults``)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from llm_resilience.testing import FakeFaults

# Long enough that a hang reaching it means the release or cancellation did nothing.
_FOREVER = 30.0


def test_count_gives_each_request_its_own_turn_and_loses_none_across_threads() -> None:
    faults = FakeFaults()
    turns: list[int] = []

    def count_many() -> None:
        mine = [faults.count() for _ in range(2_000)]
        turns.extend(mine)

    threads = [threading.Thread(target=count_many) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert faults.calls == 16_000
    assert sorted(turns) == list(range(16_000))


def test_each_failure_is_a_fresh_copy_of_the_error_kept_as_the_last_error() -> None:
    faults = FakeFaults()
    configured = ValueError("scripted")
    assert faults.last_error is None
    first = faults.failure(configured)
    second = faults.failure(configured)
    assert first is not configured
    assert second is not first
    assert (type(second), second.args) == (ValueError, ("scripted",))
    assert faults.last_error is second
    with pytest.raises(ValueError, match="scripted"):
        raise second


def test_no_seconds_means_no_hang_sync_or_async() -> None:
    faults = FakeFaults()
    started = time.monotonic()
    faults.hang(None)
    asyncio.run(faults.ahang(None))
    assert time.monotonic() - started < 0.5


def test_a_sync_hang_lasts_its_seconds() -> None:
    faults = FakeFaults()
    started = time.monotonic()
    faults.hang(0.05)
    assert time.monotonic() - started >= 0.05


async def test_an_async_hang_lasts_its_seconds() -> None:
    faults = FakeFaults()
    started = time.monotonic()
    await faults.ahang(0.05)
    assert time.monotonic() - started >= 0.05


def test_a_sync_hang_ends_when_another_thread_releases_it() -> None:
    faults = FakeFaults()
    threading.Timer(0.05, faults.release).start()
    started = time.monotonic()
    faults.hang(_FOREVER)
    assert time.monotonic() - started < 5.0


async def test_an_async_hang_ends_when_another_thread_releases_it() -> None:
    faults = FakeFaults()
    threading.Timer(0.05, faults.release).start()
    started = time.monotonic()
    await faults.ahang(_FOREVER)
    assert time.monotonic() - started < 5.0


async def test_an_async_hang_ends_at_once_when_its_task_is_cancelled() -> None:
    faults = FakeFaults()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(faults.ahang(_FOREVER), timeout=0.05)
    assert time.monotonic() - started < 5.0


async def test_after_a_release_every_later_hang_returns_at_once() -> None:
    faults = FakeFaults()
    faults.release()
    started = time.monotonic()
    faults.hang(_FOREVER)
    await faults.ahang(_FOREVER)
    assert time.monotonic() - started < 5.0


async def test_an_async_hang_is_woken_by_a_release_not_polled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    faults = FakeFaults()

    async def no_polling(delay: float, result: object = None) -> object:
        raise AssertionError(f"the hang polled with asyncio.sleep({delay})")

    hanging = asyncio.ensure_future(faults.ahang(_FOREVER))
    monkeypatch.setattr(asyncio, "sleep", no_polling)
    await asyncio.wait([hanging], timeout=0.05)
    assert not hanging.done()
    await asyncio.to_thread(faults.release)
    await asyncio.wait_for(hanging, timeout=5.0)
