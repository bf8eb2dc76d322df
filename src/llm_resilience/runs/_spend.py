"""One agent run's spend: the call object every adapter's agent layer translates.

[`RunSpend.begin`][] admits one model attempt of the run (a retry, a fallback, a side
call made by a tool or another middleware all count): it passes the budget's gate (day
and month windows, globally and for the tenant scope, in the ledger) and the run's own
account (``limit``, in process), and in strict mode holds the attempt's worst-case cost
in both before it runs. [`RunAttempt.finish`][] records what it cost, once, with the run
and thread on the ledger entry, and settles both holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from decimal import Decimal

from llm_resilience.budget import BudgetGate, BudgetTicket, ServingModel
from llm_resilience.ledger import LedgerEntry
from llm_resilience.ledger._protocol import aread_spends, read_spends
from llm_resilience.runs._account import Account
from llm_resilience.tokens import count_message_tokens
from llm_resilience.usage import Usage

__all__ = ["Choice", "Prompt", "RunAttempt", "RunSpend"]

#: A chat call's ``(role, text)`` pairs, or a function giving them (read when needed).
Prompt = Sequence[tuple[str, str]] | Callable[[], Sequence[tuple[str, str]]]


@dataclasses.dataclass(frozen=True, slots=True)
class Choice:
    """Which model the next attempt of a run uses, and why (`RunSpend.choose`)."""

    #: The model the attempt asked for.
    asked: str | None
    #: The model to call: the one asked for, or the cheaper one the budget names.
    model: str | None
    #: Whether ``model`` is the cheaper one.
    downgraded: bool
    #: ``"below_threshold"`` (what is left is under ``downgrade_below``) or
    #: ``"estimate_does_not_fit"`` (strict: the asked model's worst case exceeds what is
    #: left); None when not downgraded.
    reason: str | None
    #: The asked model's worst-case cost for this call (exact money).
    estimate: Decimal
    #: The chosen model's worst-case cost (equal to ``estimate`` when not downgraded).
    chosen_estimate: Decimal
    #: What was left of the run's (or the tightest window's) budget; None: no limit.
    remaining: Decimal | None

    def payload(self) -> dict[str, object]:
        """A JSON-safe event (money as exact strings, no prompt text)."""
        return {
            "type": "llm_resilience.downgrade",
            "asked_model": self.asked,
            "model": self.model,
            "downgraded": self.downgraded,
            "reason": self.reason,
            "estimate": str(self.estimate),
            "chosen_estimate": str(self.chosen_estimate),
            "remaining": None if self.remaining is None else str(self.remaining),
        }


class RunSpend:
    """The money of one agent run, and the gate each of its model attempts passes.

    Made by [`RunBudget.open`][llm_resilience.runs.RunBudget.open]; the same object for every
    attempt of the run. ``account`` is shared by every run of a thread when the budget
    counts ``per="thread"``.
    """

    __slots__ = (
        "_downgrade_below",
        "_downgrade_to",
        "account",
        "gate",
        "run_id",
        "scope",
        "thread_id",
    )

    def __init__(
        self,
        gate: BudgetGate,
        account: Account,
        *,
        run_id: str,
        thread_id: str | None,
        scope: str | None,
        downgrade_to: str | None = None,
        downgrade_below: Decimal | None = None,
    ) -> None:
        #: The budget's gate (prices, windows, ledger).
        self.gate = gate
        #: The run's (or thread's) account.
        self.account = account
        #: The run every entry names.
        self.run_id = run_id
        #: The thread every entry names, or None.
        self.thread_id = thread_id
        #: The tenant scope the windows are read for, or None.
        self.scope = scope
        self._downgrade_to = downgrade_to
        self._downgrade_below = downgrade_below

    def __repr__(self) -> str:
        return f"RunSpend(account={self.account!r}, scope={self.scope!r})"

    @property
    def limit(self) -> Decimal | None:
        """The run's (thread's) limit, or None."""
        return self.account.limit

    @property
    def spent(self) -> Decimal:
        """What the run (thread) has spent, settled."""
        return self.account.spent

    @property
    def held(self) -> Decimal:
        """Strict holds of attempts in flight."""
        return self.account.held

    def remaining(self) -> Decimal | None:
        """What the run (thread) may still spend, never below 0; None without a limit."""
        return self.account.remaining()

    def exhausted(self) -> bool:
        """Whether the run's (thread's) limit is reached."""
        return self.account.exhausted()

    def window_remaining(self) -> Decimal | None:
        """What is left in the tightest of the budget's day/month windows for this run's
        scope (one ledger read), or None when the budget sets no window limit."""
        limits = self.gate.budget.limits_for(self.scope)
        if not limits:
            return None
        spends = read_spends(self.gate.ledger, [(w, s) for w, s, _ in limits], now=self.gate.now())
        return _tightest(limits, spends)

    async def awindow_remaining(self) -> Decimal | None:
        """Async [`window_remaining`][]."""
        limits = self.gate.budget.limits_for(self.scope)
        if not limits:
            return None
        spends = await aread_spends(
            self.gate.ledger, [(w, s) for w, s, _ in limits], now=self.gate.now()
        )
        return _tightest(limits, spends)

    def estimate(
        self,
        *,
        model: str | None,
        prompt: Prompt | None = None,
        max_output_tokens: int | None = None,
        may_serve: Sequence[str | ServingModel] = (),
    ) -> Decimal:
        """The attempt's worst-case cost: what strict mode holds for it (the budget
        gate's ``worst_case_cost``: the prompt's estimated tokens plus the output cap, at
        the dearest model that may serve)."""
        return self.gate.worst_case_cost(
            "chat",
            estimated_input_tokens=_tokens(prompt),
            max_output_tokens=max_output_tokens,
            model=model,
            may_serve=may_serve,
        )

    def choose(
        self,
        model: str | None,
        *,
        prompt: Prompt | None = None,
        max_output_tokens: int | None = None,
        window_remaining: Decimal | None = None,
        may_serve: Sequence[str | ServingModel] = (),
        cheaper_may_serve: Sequence[str | ServingModel] = (),
    ) -> Choice:
        """Whether the next attempt should use the budget's cheaper model.

        It does when what is left (the run's, or ``window_remaining``, the tightest
        window's, whichever is less) is under ``downgrade_below``, or, in strict mode, when
        the asked model's worst case (over ``may_serve`` too: a chain's members) does not
        fit in it. Without a ``downgrade_to`` the asked model is kept.
        ``cheaper_may_serve`` is what may serve the cheaper model's calls (its own chain).
        """
        tokens = _tokens(prompt)
        estimate = self._worst(tokens, max_output_tokens, model, may_serve)
        left = _least(self.remaining(), window_remaining)
        reason: str | None = None
        if self._downgrade_to is not None and self._downgrade_to != model and left is not None:
            if self._downgrade_below is not None and left < self._downgrade_below:
                reason = "below_threshold"
            elif self.gate.budget.strict and estimate > left:
                reason = "estimate_does_not_fit"
        if reason is None:
            return Choice(model, model, False, None, estimate, estimate, left)
        cheaper = self._worst(tokens, max_output_tokens, self._downgrade_to, cheaper_may_serve)
        return Choice(model, self._downgrade_to, True, reason, estimate, cheaper, left)

    def after_refusal(
        self,
        model: str | None,
        *,
        prompt: Prompt | None = None,
        max_output_tokens: int | None = None,
        may_serve: Sequence[str | ServingModel] = (),
        cheaper_may_serve: Sequence[str | ServingModel] = (),
    ) -> Choice | None:
        """The cheaper model, once the asked model's strict hold was refused at
        [`begin`][] although [`choose`][] kept it (a concurrent attempt took the room, or
        a window refused): a downgrade with reason ``"estimate_does_not_fit"``. None when
        the budget is not strict, names no cheaper model, or ``model`` is the cheaper one:
        the refusal stands."""
        cheaper_name = self._downgrade_to
        if not self.gate.budget.strict or cheaper_name is None or cheaper_name == model:
            return None
        tokens = _tokens(prompt)
        return Choice(
            model,
            cheaper_name,
            True,
            "estimate_does_not_fit",
            self._worst(tokens, max_output_tokens, model, may_serve),
            self._worst(tokens, max_output_tokens, cheaper_name, cheaper_may_serve),
            self.remaining(),
        )

    def _worst(
        self,
        tokens: int,
        max_output_tokens: int | None,
        model: str | None,
        may_serve: Sequence[str | ServingModel],
    ) -> Decimal:
        return self.gate.worst_case_cost(
            "chat",
            estimated_input_tokens=tokens,
            max_output_tokens=max_output_tokens,
            model=model,
            may_serve=may_serve,
        )

    def _hold(
        self,
        model: str | None,
        prompt: Prompt | None,
        max_output_tokens: int | None,
        may_serve: Sequence[str | ServingModel],
    ) -> tuple[Decimal, int]:
        """The run account's part of admitting an attempt: (hold, prompt tokens)."""
        if not self.gate.budget.strict:
            self.account.admit()
            return Decimal(0), 0
        tokens = _tokens(prompt)
        amount = self.gate.worst_case_cost(
            "chat",
            estimated_input_tokens=tokens,
            max_output_tokens=max_output_tokens,
            model=model,
            may_serve=may_serve,
        )
        return self.account.hold(amount), tokens

    def begin(
        self,
        *,
        model: str | None,
        prompt: Prompt | None = None,
        max_output_tokens: int | None = None,
        may_serve: Sequence[str | ServingModel] = (),
    ) -> RunAttempt:
        """Admit one model attempt of the run; raises [`BudgetExceededError`][] (window
        ``"run"``/``"thread"`` for the run's own limit, ``"day"``/``"month"`` for the
        budget's) before anything is sent."""
        hold, tokens = self._hold(model, prompt, max_output_tokens, may_serve)
        try:
            ticket = self.gate.begin(
                "chat",
                scope=self.scope,
                estimated_input_tokens=tokens,
                max_output_tokens=max_output_tokens,
                model=model,
                may_serve=may_serve,
                run_id=self.run_id,
                thread_id=self.thread_id,
            )
        except BaseException:
            self.account.settle(hold, None)
            raise
        return RunAttempt(self, ticket, hold)

    async def abegin(
        self,
        *,
        model: str | None,
        prompt: Prompt | None = None,
        max_output_tokens: int | None = None,
        may_serve: Sequence[str | ServingModel] = (),
    ) -> RunAttempt:
        """Async [`begin`][]."""
        hold, tokens = self._hold(model, prompt, max_output_tokens, may_serve)
        try:
            ticket = await self.gate.abegin(
                "chat",
                scope=self.scope,
                estimated_input_tokens=tokens,
                max_output_tokens=max_output_tokens,
                model=model,
                may_serve=may_serve,
                run_id=self.run_id,
                thread_id=self.thread_id,
            )
        except BaseException:
            self.account.settle(hold, None)
            raise
        return RunAttempt(self, ticket, hold)


class RunAttempt:
    """One admitted attempt: ``finish`` records it once, ``abandon`` records nothing.

    The first of ``finish``/``abandon``/``end_early`` (or their async twins) wins.
    """

    __slots__ = ("_done", "_hold", "run", "ticket")

    def __init__(self, run: RunSpend, ticket: BudgetTicket, hold: Decimal) -> None:
        #: The run the attempt belongs to.
        self.run = run
        #: The gate's ticket (its ledger entry carries the run and thread).
        self.ticket = ticket
        self._hold = hold
        self._done = False

    def __repr__(self) -> str:
        return f"RunAttempt(hold={self._hold}, done={self._done})"

    def _settle(self, entry: LedgerEntry | None) -> None:
        self._done = True
        self.run.account.settle(self._hold, None if entry is None else entry.cost)

    def finish(self, usage: Usage, *, model: str | None = None) -> LedgerEntry | None:
        """Record what the attempt used, priced at the ``model`` that served."""
        if self._done:
            return None
        entry = self.ticket.finish(usage, model=model)
        self._settle(entry)
        return entry

    async def afinish(self, usage: Usage, *, model: str | None = None) -> LedgerEntry | None:
        """Async [`finish`][]."""
        if self._done:
            return None
        self._done = True  # before the await: a second finish meanwhile records nothing
        entry = None
        try:
            entry = await self.ticket.afinish(usage, model=model)
        finally:
            self.run.account.settle(self._hold, None if entry is None else entry.cost)
        return entry

    def abandon(self) -> None:
        """Record nothing (the attempt failed before it was billed); release the holds."""
        if self._done:
            return
        self.ticket.abandon()
        self._settle(None)

    async def aabandon(self) -> None:
        """Async [`abandon`][]."""
        if self._done:
            return
        self._settle(None)
        await self.ticket.aabandon()

    def end_early(self, usage: Usage | None, *, model: str | None = None) -> None:
        """An attempt cut short: billed ``usage`` (a stream's partial estimate) is
        recorded; None records nothing."""
        if usage is None:
            self.abandon()
        else:
            self.finish(usage, model=model)

    async def aend_early(self, usage: Usage | None, *, model: str | None = None) -> None:
        """Async [`end_early`][]."""
        if usage is None:
            await self.aabandon()
        else:
            await self.afinish(usage, model=model)


def _tokens(prompt: Prompt | None) -> int:
    if prompt is None:
        return 0
    pairs = prompt() if callable(prompt) else prompt
    return count_message_tokens(pairs)


def _least(*amounts: Decimal | None) -> Decimal | None:
    present = [amount for amount in amounts if amount is not None]
    return min(present) if present else None


def _tightest(
    limits: Sequence[tuple[str, str | None, Decimal]], spends: Sequence[Decimal]
) -> Decimal:
    left = [limit - spend for (_, _, limit), spend in zip(limits, spends, strict=True)]
    least = min(left)
    return least if least > 0 else Decimal(0)
