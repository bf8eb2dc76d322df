"""A hedged fallback chain's losing attempts, charged to the run whose attempt they hedged.

A chain with ``hedge_after`` may send one attempt to two members; the one that lost may
have been billed. Under a cost layer its usage is recorded as a ``"hedge"`` entry
through the inbox the layer opens around each call (`llm_resilience.metering`). An agent
layer does the same for a run's attempt with
[`charge_hedges`][llm_resilience.runs.hedges.charge_hedges]: the entry names the run and
thread (it is the attempt's ticket that records it), and its cost is added to the run's
(thread's) account, so the run's next attempts see it.
"""

from __future__ import annotations

from decimal import Decimal

from llm_resilience.fallback._hedge_inbox import bind_hedge_ticket
from llm_resilience.ledger import LedgerEntry
from llm_resilience.runs._spend import RunAttempt
from llm_resilience.usage import Usage

__all__ = ["charge_hedges"]


class _RunHedges:
    """Where a hedged chain reports a loser of one run attempt: its ticket, then its run."""

    __slots__ = ("_attempt",)

    def __init__(self, attempt: RunAttempt) -> None:
        self._attempt = attempt

    def record_hedge(self, usage: Usage, *, model: str | None = None) -> LedgerEntry:
        entry = self._attempt.ticket.record_hedge(usage, model=model)
        self._attempt.run.account.settle(Decimal(0), entry.cost)
        return entry

    async def arecord_hedge(self, usage: Usage, *, model: str | None = None) -> LedgerEntry:
        entry = await self._attempt.ticket.arecord_hedge(usage, model=model)
        self._attempt.run.account.settle(Decimal(0), entry.cost)
        return entry


def charge_hedges(attempt: RunAttempt) -> None:
    """Have the hedged chain below report the losers of ``attempt`` to its run.

    Call it once the attempt is admitted, inside the hedge inbox the layer opened for the
    call ([`Meter.inbox`][llm_resilience.metering.Meter.inbox]); with no inbox open (no
    hedged chain below) it does nothing. A loser's cost comes on top of the attempt's
    strict hold: a hedged run may pass its limit by what its losers were billed.
    """
    bind_hedge_ticket(_RunHedges(attempt))
