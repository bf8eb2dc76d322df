"""The gate's side of a ledger: checking what was given as one, writes that outlive a
cancelled caller, and the warnings a ledger failure logs (on ``llm_resilience.budget``)."""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any

from llm_resilience.ledger import CostLedger, InMemoryCostLedger, Reservation
from llm_resilience.redact import scrubbed

__all__ = [
    "checked_ledger",
    "default_ledger",
    "keep",
    "ledger_name",
    "release",
    "shielded",
    "unreleased",
    "unwritable",
]

# Every part of the budget logs as ``llm_resilience.budget`` (a documented name).
logger = logging.getLogger("llm_resilience.budget")

#: The methods the gate calls on a ledger (the rest of the protocol is for people).
_LEDGER_METHODS = (
    "spend",
    "aspend",
    "reserve",
    "areserve",
    "record",
    "arecord",
    "settle",
    "asettle",
)

#: Ledger writes that outlive a cancelled caller, kept referenced until they end.
_background: set[asyncio.Future[Any]] = set()


_IN_MEMORY_WARNING = (
    "No persistent cost ledger: spend is kept in memory by InMemoryCostLedger and resets "
    "when the process restarts. Pass SqlCostLedger(url) to keep it across restarts and workers."
)


def default_ledger() -> InMemoryCostLedger:
    """The ledger of a budget given none: a new ``InMemoryCostLedger``, and one WARNING
    naming ``SqlCostLedger`` (in-memory spend resets when the process restarts).

    Each caller that makes a default asks once: a gate given no ledger, or a builder
    whose ``use_cost_budgeting`` got none (one ledger, so one warning, for all its
    surfaces). An ``InMemoryCostLedger`` passed on purpose is never warned about.
    """
    logger.warning(_IN_MEMORY_WARNING)
    return InMemoryCostLedger()


def checked_ledger(ledger: object) -> CostLedger:
    """``ledger`` if it is one; anything else would leave every call ungated and unrecorded."""
    if isinstance(ledger, str):
        url = scrubbed(ledger)  # a database URL may carry a password
        raise TypeError(
            f"ledger must be a ledger object, not the string {url!r}: "
            f"use ledger=SqlCostLedger({url!r}) (from llm_resilience import SqlCostLedger)"
        )
    missing = [name for name in _LEDGER_METHODS if not callable(getattr(ledger, name, None))]
    if missing:
        raise TypeError(
            f"ledger must be a cost ledger (SqlCostLedger, InMemoryCostLedger or an object "
            f"with the CostLedger methods), got {type(ledger).__name__}: it lacks "
            f"{', '.join(missing)}"
        )
    return ledger  # type: ignore[return-value]


def ledger_name(ledger: object) -> str:
    """How warnings name a ledger: its type, and its URL (password hidden) if it has one."""
    url = getattr(ledger, "url", None)
    return f"{type(ledger).__name__}({url!r})" if isinstance(url, str) else type(ledger).__name__


def keep(future: asyncio.Future[Any]) -> None:
    _background.add(future)
    future.add_done_callback(_background.discard)


async def shielded(write: Awaitable[None], on_error: Callable[[Exception], None]) -> None:
    """Await ``write`` to its end even if the caller is cancelled meanwhile; a write that
    fails calls ``on_error`` (also when the caller has gone, so nothing fails unseen).

    The write starts here, as an eager task would: one that needs no wait (an in-memory
    ledger, a write-behind queue with room) ends before anything could cancel it, with
    no task made or scheduled (tens of µs per call on an async hot path). One that does
    wait is handed, suspended where it is, to a task of its own, which the caller awaits
    through ``asyncio.shield``.
    """

    async def guarded() -> None:
        try:
            await write
        except Exception as exc:
            on_error(exc)

    steps = guarded()
    try:
        waiting = steps.send(None)
    except StopIteration:
        return
    task = asyncio.ensure_future(_resume(steps, waiting))
    keep(task)
    await asyncio.shield(task)


async def _resume(steps: Coroutine[Any, Any, None], waiting: object) -> None:
    """Run ``steps``, a coroutine suspended on ``waiting``, to its end in this task."""
    await _suspended(steps, waiting)


@types.coroutine
def _suspended(steps: Coroutine[Any, Any, None], waiting: object) -> Generator[Any, None, None]:
    """``steps`` carried on from its suspension on ``waiting``: the task driving this
    sees ``waiting`` as if ``steps`` had just yielded it, and a cancellation thrown in
    meanwhile reaches ``steps`` where it waits; then ``steps`` runs on as awaited."""
    while True:
        try:
            yield waiting
        except BaseException as error:
            try:
                waiting = steps.throw(error)
            except StopIteration:
                return
            continue
        break
    yield from steps  # type: ignore[misc]


def release(ledger: CostLedger, reservation: Reservation) -> None:
    try:
        ledger.settle(reservation, None)
    except Exception as exc:
        unreleased(exc, ledger)


def unwritable(exc: Exception, surface: str, ledger: CostLedger) -> None:
    logger.warning(
        "Cost ledger %s unwritable (%s); the %s call succeeded but its cost was not recorded.",
        ledger_name(ledger),
        type(exc).__name__,
        surface,
    )


def unreleased(exc: Exception, ledger: CostLedger) -> None:
    logger.warning(
        "Cost ledger %s could not release a strict-mode reservation (%s); it stops counting "
        "once the ledger's reservation TTL (15 minutes by default) passes.",
        ledger_name(ledger),
        type(exc).__name__,
    )
