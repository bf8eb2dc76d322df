"""Spend ledgers: where the budget gate records each call's cost and reads spend back.

* [`InMemoryCostLedger`][]: the default; exact and thread-safe, lost on restart.
* [`SqlCostLedger`][]: SQLite (``sqlite:///spend.db``) or PostgreSQL
  (``postgresql+psycopg://...``) through SQLAlchemy; survives restarts and is shared by
  every process and worker opening the same database. Every operation is bounded by its
  ``operation_timeout`` ([`LedgerTimeoutError`][] past it), and writes the database
  does not take wait in memory until it does.

Any object with the `CostLedger` methods can replace both. `stored_run_spend` (and
`astored_run_spend`) reads what one agent run or thread cost from any ledger: through its
``run_spend`` when it has one (both of ours), else by summing its entries.

Examples:
    >>> from datetime import UTC, datetime
    >>> from decimal import Decimal
    >>> from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry
    >>> ledger = InMemoryCostLedger()
    >>> ledger.record(LedgerEntry(datetime.now(UTC), "chat", 1000, 200, Decimal("0.006")))
    >>> ledger.spend("day")
    Decimal('0.006')

[`SqlCostLedger`][] loads on first use, so importing this package never imports
SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llm_resilience.errors import LedgerTimeoutError
from llm_resilience.ledger._memory import InMemoryCostLedger
from llm_resilience.ledger._protocol import (
    DEFAULT_RESERVATION_TTL,
    CostLedger,
    LedgerEntry,
    Reservation,
    Window,
    astored_run_spend,
    stored_run_spend,
)

if TYPE_CHECKING:
    from llm_resilience.ledger._sql import SqlCostLedger

__all__ = [
    "DEFAULT_RESERVATION_TTL",
    "CostLedger",
    "InMemoryCostLedger",
    "LedgerEntry",
    "LedgerTimeoutError",
    "Reservation",
    "SqlCostLedger",
    "Window",
    "astored_run_spend",
    "stored_run_spend",
]


def __getattr__(name: str) -> Any:
    if name == "SqlCostLedger":
        from llm_resilience.ledger._sql import SqlCostLedger

        globals()[name] = SqlCostLedger
        return SqlCostLedger
    raise AttributeError(f"module 'llm_resilience.ledger' has no attribute {name!r}")
