"""The side channel from a hedged fallback chain to the cost layer above it.

A hedged chain (``hedge_after``) may leave a losing attempt whose provider reported
usage: spend, but not the call's answer. The cost layer opens a `HedgeInbox` for
each call (`hedge_inbox`, or `hedge_inbox_stream` for a stream), binds its
budget ticket once the gate admitted the call (`bind_hedge_ticket`); the engine
captures the inbox when the call starts (`current_hedge_inbox`) and reports each
loser to it, which records it as a ledger entry of kind ``"hedge"``
(`record_hedge`). A context variable carries
it, so no layer between the two has to pass anything on.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from llm_resilience.fallback._sources import _aclose, _close
from llm_resilience.layers import layers_below
from llm_resilience.usage import Usage

if TYPE_CHECKING:
    from llm_resilience.ledger import LedgerEntry

__all__ = [
    "HedgeInbox",
    "HedgeLoser",
    "ahedge_inbox_stream",
    "bind_hedge_ticket",
    "current_hedge_inbox",
    "hedge_inbox",
    "hedge_inbox_stream",
    "hedges_below",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class HedgeLoser:
    """A hedged attempt that lost, and what its provider reported it used."""

    #: Index of the member that lost.
    client: int
    #: The tokens its provider reported (never an estimate).
    usage: Usage
    #: The model that ran it, if known.
    model: str | None = None


class _HedgeTicket(Protocol):
    def record_hedge(self, usage: Usage, *, model: str | None = None) -> LedgerEntry: ...

    async def arecord_hedge(self, usage: Usage, *, model: str | None = None) -> LedgerEntry: ...


class HedgeInbox:
    """Where one call's hedge losers are reported: the cost layer's budget ticket.

    A cost layer opens one around each call (`hedge_inbox`), binds its ticket once
    the gate admitted the call (`bind_hedge_ticket`); a hedged chain below captures
    it when the call starts and reports each loser that has reported usage.
    """

    __slots__ = ("_ticket",)

    def __init__(self) -> None:
        self._ticket: _HedgeTicket | None = None

    def bind(self, ticket: _HedgeTicket) -> None:
        """Record losers through ``ticket`` (a `BudgetTicket`)."""
        self._ticket = ticket

    def report(self, loser: HedgeLoser) -> None:
        """Record ``loser`` as a ``"hedge"`` entry (nothing when no ticket is bound)."""
        if self._ticket is not None:
            self._ticket.record_hedge(loser.usage, model=loser.model)

    async def areport(self, loser: HedgeLoser) -> None:
        """Async `report`."""
        if self._ticket is not None:
            await self._ticket.arecord_hedge(loser.usage, model=loser.model)


_INBOX: contextvars.ContextVar[HedgeInbox | None] = contextvars.ContextVar(
    "llm_resilience_hedge_inbox", default=None
)


@contextmanager
def hedge_inbox() -> Iterator[HedgeInbox]:
    """Open a fresh `HedgeInbox` for the calls made inside the block.

    What a cost layer does around each call (the engine does the reporting):

    Examples:
        >>> from llm_resilience import CostBudget, InMemoryCostLedger
        >>> from llm_resilience.budget import BudgetGate
        >>> gate = BudgetGate(CostBudget(3, 15, daily_limit=1), InMemoryCostLedger())
        >>> with hedge_inbox() as inbox:
        ...     ticket = gate.begin("chat", model="gpt-4o")
        ...     bind_hedge_ticket(ticket)  # once the gate admitted the call
        ...     inbox.report(HedgeLoser(0, Usage(40, 2, estimated=False), "gpt-4o-mini"))
        >>> [(entry.kind, entry.model) for entry in gate.ledger.entries()]
        [('hedge', 'gpt-4o-mini')]
    """
    inbox = HedgeInbox()
    token = _INBOX.set(inbox)
    try:
        yield inbox
    finally:
        _INBOX.reset(token)


def current_hedge_inbox() -> HedgeInbox | None:
    """The inbox the innermost cost layer opened for the current call, if any."""
    return _INBOX.get()


def bind_hedge_ticket(ticket: _HedgeTicket) -> None:
    """Bind ``ticket`` to the inbox open for the current call (nothing if none is open)."""
    inbox = _INBOX.get()
    if inbox is not None:
        inbox.bind(ticket)


def hedge_inbox_stream(stream: Iterator[T]) -> Generator[T, None, None]:
    """``stream``, whose first step runs with a fresh inbox open.

    A stream's call starts (its gate admits it, a chain below captures the inbox) on its
    first step; the inbox is closed again before that step returns, so nothing of it
    stays in the consumer's context between chunks.
    """
    with hedge_inbox():
        try:
            first = next(stream)
        except StopIteration:
            return
    try:
        yield first
        yield from stream
    finally:
        _close(stream)


async def ahedge_inbox_stream(stream: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    """Async `hedge_inbox_stream`."""
    with hedge_inbox():
        try:
            first = await anext(stream)
        except StopAsyncIteration:
            return
    try:
        yield first
        async for chunk in stream:
            yield chunk
    finally:
        await _aclose(stream)


def hedges_below(layer: object) -> bool:
    """Whether ``layer``, or any layer below it, is a chain with ``hedge_after`` set.

    A cost layer asks once, at construction: with no hedged chain below, it opens no
    inbox and its calls cost nothing more.
    """
    pending = [layer]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        hedge_after = getattr(current, "hedge_after", None)
        if isinstance(hedge_after, int | float) and not isinstance(hedge_after, bool):
            return True
        pending.extend(layers_below(current))
    return False
