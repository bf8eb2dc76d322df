"""One run's or one thread's money, kept in process: its limit, what it spent, what it holds.

An agent run lives in one process, so its account is exact there: a strict hold is taken
under a lock, and concurrent attempts of one run cannot together overshoot its limit. A
thread's account starts from what the ledger already holds for the thread (its earlier
runs, in this process or another), then counts on in process.
"""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Literal

from llm_resilience.errors import BudgetExceededError
from llm_resilience.money import exact_sum

__all__ = ["Account", "Per"]

#: What a run limit counts: one agent run, or one conversation thread across its runs.
Per = Literal["run", "thread"]


class Account:
    """The money of one run (``per="run"``) or thread (``per="thread"``).

    ``limit`` None counts without refusing (the budget's day and month windows still
    apply at the gate). ``spent`` starts at what was stored before (a thread's earlier runs).
    """

    __slots__ = ("_lock", "held", "key", "limit", "per", "spent")

    def __init__(self, per: Per, key: str, limit: Decimal | None, spent: Decimal) -> None:
        #: ``"run"`` or ``"thread"``: the window a refusal names.
        self.per: Per = per
        #: The run id or thread id this account counts.
        self.key = key
        #: The money it may spend, or None.
        self.limit = limit
        #: Settled cost, exact.
        self.spent = spent
        #: Strict holds of attempts in flight, exact.
        self.held = Decimal(0)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"Account(per={self.per!r}, limit={self.limit}, spent={self.spent}, held={self.held})"
        )

    def remaining(self) -> Decimal | None:
        """``limit - spent - held``, never below 0; None without a limit."""
        if self.limit is None:
            return None
        left = self.limit - exact_sum((self.spent, self.held))
        return left if left > 0 else Decimal(0)

    def exhausted(self) -> bool:
        """Whether spend and holds have reached the limit (never, without one)."""
        return self.limit is not None and exact_sum((self.spent, self.held)) >= self.limit

    def refusal(self) -> BudgetExceededError:
        """The error a call refused by this account raises."""
        assert self.limit is not None
        return BudgetExceededError(
            self.per, self.limit, exact_sum((self.spent, self.held)), self.key
        )

    def admit(self) -> None:
        """Default mode's pre-call check: refuse once the limit is reached."""
        if self.exhausted():
            raise self.refusal()

    def hold(self, amount: Decimal) -> Decimal:
        """Strict mode: hold ``amount`` if it fits (``spent + held + amount <= limit``, the
        limit not yet reached), else raise [`BudgetExceededError`][]. Returns the hold."""
        with self._lock:
            if self.limit is not None:
                used = exact_sum((self.spent, self.held))
                if used >= self.limit or exact_sum((used, amount)) > self.limit:
                    raise BudgetExceededError(self.per, self.limit, used, self.key)
            self.held = exact_sum((self.held, amount))
        return amount

    def settle(self, hold: Decimal, cost: Decimal | None) -> None:
        """Replace ``hold`` (0 for none) with the real ``cost`` (None: nothing was billed)."""
        with self._lock:
            if hold:
                self.held = self.held - hold
            if cost:
                self.spent = exact_sum((self.spent, cost))
