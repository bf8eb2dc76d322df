"""The run budget: one per agent layer, opening each run's [`RunSpend`][]."""

from __future__ import annotations

import threading
from collections import OrderedDict
from decimal import Decimal
from typing import Any

from llm_resilience import checks
from llm_resilience.budget import BudgetGate, CostBudget
from llm_resilience.ledger import CostLedger, astored_run_spend, stored_run_spend
from llm_resilience.money import optional_money
from llm_resilience.runs._account import Account, Per
from llm_resilience.runs._spend import RunSpend

__all__ = ["RunBudget"]

_PER = ("run", "thread")


class RunBudget(checks.KnownKeywords):
    """Spend limits for agent runs: per run or per thread, on a [`CostBudget`][] and a ledger.

    ```python
    runs = RunBudget(CostBudget(3, 15, daily_limit=50, strict=True),
                     SqlCostLedger("sqlite:///spend.db"), per="run", limit="0.25")
    spend = runs.open(run_id, thread_id=thread_id, scope="tenant-1")
    attempt = spend.begin(model="gpt-4o", prompt=pairs, max_output_tokens=1024)
    ...                                      # the model call
    attempt.finish(usage, model="gpt-4o-2024-08-06")   # or attempt.abandon()
    ```

    ``per="run"``: ``limit`` is what one run may spend. ``per="thread"``: what a
    conversation thread may spend over all its runs; a thread's account starts from
    what the ledger already holds for it (entries carry ``thread_id``), so the total
    survives a restart and a checkpointer resuming the thread elsewhere. The budget's day
    and month limits apply as well, at the gate, for the run's ``scope``.

    Exactness: strict mode (``CostBudget(strict=True)``) holds each attempt's worst case in
    the run's account before it is sent, under a lock, so one run never spends past its
    limit; the day/month windows are held in the ledger as for any call. A thread's runs
    are exact when they run one after another (as a checkpointer runs them); two runs of
    one thread at once in two processes each count from the total stored when they
    started. Default mode refuses once the limit is reached, so a run may pass it by the
    attempts already in flight.

    ``downgrade_to`` names a cheaper model (priced by the budget) that
    [`RunSpend.choose`][llm_resilience.runs.RunSpend.choose] switches to when what is left
    is under ``downgrade_below``, or, strict, when the asked model's worst case no longer
    fits. ``max_runs`` bounds the runs kept open (the oldest are forgotten first).
    """

    def __init__(
        self,
        budget: CostBudget,
        ledger: CostLedger | None = None,
        *,
        per: Per = "run",
        limit: object = None,
        downgrade_to: str | None = None,
        downgrade_below: object = None,
        max_runs: int = 10_000,
    ) -> None:
        if not isinstance(budget, CostBudget):
            raise TypeError(f"budget must be a CostBudget(...); got {type(budget).__name__}")
        if per not in _PER:
            raise ValueError(f"per must be 'run' or 'thread', got {per!r}")
        if downgrade_to is not None and (not isinstance(downgrade_to, str) or not downgrade_to):
            raise TypeError(f"downgrade_to must be a model name or None, got {downgrade_to!r}")
        #: The gate every attempt passes (prices, day/month windows, ledger).
        self.gate = BudgetGate(budget, ledger)
        #: ``"run"`` or ``"thread"``.
        self.per: Per = per
        #: What a run (thread) may spend, or None (the windows only).
        self.limit: Decimal | None = optional_money("limit", limit)
        #: The cheaper model's name, or None.
        self.downgrade_to = downgrade_to
        #: Remaining money under which to downgrade, or None.
        self.downgrade_below: Decimal | None = optional_money("downgrade_below", downgrade_below)
        self._max_runs = checks.whole("max_runs", max_runs, minimum=1)
        self._runs: OrderedDict[str, RunSpend] = OrderedDict()
        self._threads: OrderedDict[str, Account] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RunBudget(per={self.per!r}, limit={self.limit}, gate={self.gate!r})"

    @property
    def budget(self) -> CostBudget:
        """Prices, windows and mode."""
        return self.gate.budget

    @property
    def ledger(self) -> CostLedger:
        """Where every attempt is recorded."""
        return self.gate.ledger

    def _checked(
        self, run_id: object, thread_id: object, scope: object
    ) -> tuple[str, str | None, str | None]:
        run = checks.scope("run_id", run_id)
        if run is None:
            raise ValueError("run_id must name the run (non-empty text), got None")
        thread = checks.scope("thread_id", thread_id)
        if self.per == "thread" and thread is None:
            raise ValueError(
                "per='thread' counts a conversation thread, but this run has no thread_id "
                "(LangGraph: compile with a checkpointer and pass "
                "config={'configurable': {'thread_id': ...}})"
            )
        return run, thread, checks.scope("scope", scope)

    def _known(self, run: str) -> RunSpend | None:
        with self._lock:
            spend = self._runs.get(run)
            if spend is not None:
                self._runs.move_to_end(run)
            return spend

    def _new(self, run: str, thread: str | None, scope: str | None, stored: Decimal) -> RunSpend:
        with self._lock:
            spend = self._runs.get(run)
            if spend is not None:
                return spend
            if self.per == "thread":
                assert thread is not None
                account = self._threads.get(thread)
                if account is None:
                    account = self._threads[thread] = Account("thread", thread, self.limit, stored)
                    _trim(self._threads, self._max_runs)
                self._threads.move_to_end(thread)
            else:
                account = Account("run", run, self.limit, Decimal(0))
            spend = self._runs[run] = RunSpend(
                self.gate,
                account,
                run_id=run,
                thread_id=thread,
                scope=scope,
                downgrade_to=self.downgrade_to,
                downgrade_below=self.downgrade_below,
            )
            _trim(self._runs, self._max_runs)
            return spend

    def _needs_stored(self, thread: str | None) -> bool:
        return self.per == "thread" and thread is not None and thread not in self._threads

    def open(
        self, run_id: str, *, thread_id: str | None = None, scope: str | None = None
    ) -> RunSpend:
        """The run's spend: the same object for every call with this ``run_id`` until
        [`close`][]. ``per="thread"`` reads the thread's stored spend once per process."""
        run, thread, checked_scope = self._checked(run_id, thread_id, scope)
        known = self._known(run)
        if known is not None:
            return known
        stored = Decimal(0)
        if self._needs_stored(thread):
            assert thread is not None
            stored = stored_run_spend(self.ledger, thread=thread)
        return self._new(run, thread, checked_scope, stored)

    async def aopen(
        self, run_id: str, *, thread_id: str | None = None, scope: str | None = None
    ) -> RunSpend:
        """Async [`open`][] (the thread's stored spend read off the event loop)."""
        run, thread, checked_scope = self._checked(run_id, thread_id, scope)
        known = self._known(run)
        if known is not None:
            return known
        stored = Decimal(0)
        if self._needs_stored(thread):
            assert thread is not None
            stored = await astored_run_spend(self.ledger, thread=thread)
        return self._new(run, thread, checked_scope, stored)

    def get(self, run_id: str) -> RunSpend | None:
        """The open run ``run_id``, or None."""
        return self._known(run_id)

    def close(self, run_id: str) -> None:
        """Forget the finished run ``run_id`` (a thread's total is kept)."""
        with self._lock:
            self._runs.pop(run_id, None)


def _trim(kept: OrderedDict[str, Any], cap: int) -> None:
    while len(kept) > cap:
        kept.popitem(last=False)
