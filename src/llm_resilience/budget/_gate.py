"""The gate every priced call passes through, and the ticket that records what it cost."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from llm_resilience import checks
from llm_resilience.budget._ledger import (
    checked_ledger,
    default_ledger,
    keep,
    ledger_name,
    release,
    shielded,
    unreleased,
    unwritable,
)
from llm_resilience.budget._matching import GUESSED_RULES, PriceMatch, warn_guessed_price
from llm_resilience.budget._models import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    ServingModel,
    first_count,
    serving_models,
)
from llm_resilience.budget._options import CostBudget
from llm_resilience.errors import BudgetExceededError
from llm_resilience.ledger import CostLedger, LedgerEntry, Reservation
from llm_resilience.ledger._protocol import (
    CheckedLimits,
    EntryRow,
    batch_reader,
    check_scope,
    checked_row,
    entry_of_row,
    gate_reader,
    inline_recorder,
    row_recorder,
)
from llm_resilience.money import ModelPrice, cost_of
from llm_resilience.telemetry import record_llm_usage
from llm_resilience.tokens import count_message_tokens, count_tokens
from llm_resilience.usage import Usage

__all__ = ["HEDGE_KIND", "BudgetGate", "BudgetTicket", "Surface"]

# Every part of the budget logs as ``llm_resilience.budget`` (a documented name).
logger = logging.getLogger("llm_resilience.budget")

#: The ``kind`` of a ledger entry recording a hedged attempt that lost
#: (`BudgetTicket.record_hedge`): spend, but not the call's answer.
HEDGE_KIND = "hedge"

Surface = Literal["chat", "embedding"]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class BudgetGate:
    """Refuses calls once spend reaches a limit; records what each admitted call cost.

    ```python
    gate = BudgetGate(budget, ledger)          # share one ledger across wrappers
    ticket = gate.begin("chat", scope="tenant-1", prompt=[("user", "Hi")],
                        max_output_tokens=512, model="gpt-4o")
    ...                                        # the call
    ticket.finish(usage, model="gpt-4o-2024-08-06")   # or ticket.abandon()
    ```

    Default mode: for each configured window, day first then month, the gate reads the
    window's spend (an unconfigured window is not read) and raises
    [`BudgetExceededError`][] once ``spend >= limit``. Every
    window the budget needs (day and month, the scope's and the global) is read at once:
    one round trip on our ledgers (``spends``), one ``spend`` per window on a ledger
    without ``spends`` (stopping at the first refusal). It is a pre-call check, so calls
    admitted concurrently can overshoot a limit by up to the cost of every call in flight.

    Strict mode (``CostBudget(strict=True)``): the gate reserves the call's worst-case cost
    ([`worst_case_cost`][]: ``estimated_input_tokens`` plus each model's output cap,
    at that model's price, the dearest over ``model`` and ``may_serve``; 4096
    (`DEFAULT_MAX_OUTPUT_TOKENS`) output tokens for a chat model with no cap)
    atomically in the ledger, refusing it if any limit would be exceeded; ``finish``
    replaces the hold with the real cost. Concurrent calls cannot overshoot, as long as
    the real cost stays within the hold: pass every model a fallback chain may serve, with
    its output cap, as ``may_serve=[ServingModel(name, max_output_tokens), ...]`` (the
    framework wrappers do this for the chains below them).

    Ledger failures degrade, never break (each logs a WARNING on ``llm_resilience.budget``):
    an unreadable ledger lets the call through ungated (a limit of 0 still refuses, spend
    reported as 0); an unwritable one lets the call succeed unrecorded. With no ``ledger``
    an [`InMemoryCostLedger`][] is used, and one warning per gate
    names ``SqlCostLedger``, since in-memory spend resets when the process restarts (an
    ``InMemoryCostLedger`` passed on purpose is not warned about).

    ``now`` returns the current timezone-aware time (UTC by default); inject it in tests.
    """

    __slots__ = ("_now", "_prices", "_reader", "_unscoped", "budget", "ledger")

    def __init__(
        self,
        budget: CostBudget,
        ledger: CostLedger | None = None,
        *,
        now: Callable[[], datetime] = _utcnow,
    ) -> None:
        if not isinstance(budget, CostBudget):
            raise TypeError(f"budget must be a CostBudget, got {budget!r}")
        #: Prices, limits and mode.
        self.budget = budget
        #: Where spend is recorded and read back.
        # A ledger given by name, in memory or not, was a choice: only the default warns.
        self.ledger: CostLedger = default_ledger() if ledger is None else checked_ledger(ledger)
        self._now = now
        #: The unscoped limits, computed once per budget (the budget is immutable).
        self._unscoped: tuple[CostBudget, CheckedLimits] | None = None
        #: Each served name's price match, per budget (see `priced`).
        self._prices: tuple[CostBudget, dict[str | None, tuple[PriceMatch, ModelPrice]]] | None
        self._prices = None
        #: The ledger's `gate_reader`, `inline_recorder` and `row_recorder`, per ledger
        #: (see `_fast`).
        self._reader: tuple[CostLedger, Callable[..., list[Decimal]] | None, Any, Any] | None = None

    def __repr__(self) -> str:
        return f"BudgetGate(budget={self.budget!r}, ledger={self.ledger!r})"

    def worst_case_cost(
        self,
        surface: Surface,
        *,
        estimated_input_tokens: int = 0,
        max_output_tokens: int | None = None,
        model: str | None = None,
        may_serve: Sequence[str | ServingModel] = (),
    ) -> Decimal:
        """What strict mode holds for a call: its cost if it used every token it may.

        The hold is the dearest, over every model that may serve the call, of
        ``estimated_input_tokens`` plus that model's output cap, at that model's price
        (input at its dearest input rate, cache writes included, output at its dearest
        output rate: [`dearest`][llm_resilience.ModelPrice.dearest]), so whichever
        serves, the real cost stays within it. A model's output cap is the
        call's ``max_output_tokens`` when set (a call's ``max_tokens`` reaches every
        member of a chain), else its own `ServingModel.max_output_tokens`, else
        `DEFAULT_MAX_OUTPUT_TOKENS` (4096). Embeddings have no output.

        The models that may serve are ``model`` and ``may_serve`` (the members of a
        fallback chain, as names or [`ServingModel`][]). A model named both plainly and
        with a cap is held at its cap; a None ``model`` (a chain, which never answers
        itself) counts only when ``may_serve`` is empty.

        Examples:
            >>> from llm_resilience.ledger import InMemoryCostLedger
            >>> gate = BudgetGate(CostBudget(3, 15, daily_limit=1), InMemoryCostLedger())
            >>> gate.worst_case_cost("chat", estimated_input_tokens=1000)  # 4096 output assumed
            Decimal('0.06444')
            >>> gate.worst_case_cost("chat", estimated_input_tokens=1000,
            ...                      may_serve=[ServingModel("gpt-4o", max_output_tokens=8000)])
            Decimal('0.123')
        """
        _check_surface(surface)
        if max_output_tokens is not None:
            checks.count("max_output_tokens", max_output_tokens)
        worst = Decimal(0)
        for candidate in serving_models(model, may_serve):
            output = 0
            if surface == "chat":
                output = first_count(
                    max_output_tokens, candidate.max_output_tokens, DEFAULT_MAX_OUTPUT_TOKENS
                )
            usage = Usage(estimated_input_tokens, output, estimated=True)
            # Any input may turn out to be a (dearer) cache write, any output reasoning.
            price = self.budget.price_for(candidate.name).dearest()
            cost = cost_of(usage, price, surface=surface)
            worst = max(worst, cost)
        return worst

    def begin(
        self,
        surface: Surface,
        *,
        scope: str | None = None,
        estimated_input_tokens: int = 0,
        max_output_tokens: int | None = None,
        model: str | None = None,
        may_serve: Sequence[str | ServingModel] = (),
        prompt: Sequence[tuple[str, str]] | None = None,
        texts: Sequence[str] | None = None,
        run_id: str | None = None,
        thread_id: str | None = None,
    ) -> BudgetTicket:
        """Gate one call; raises ``BudgetExceededError`` if a limit refuses it.

        ``model`` is the model asked for (it prices the strict-mode hold and is recorded
        when ``finish`` is not told which model served). ``may_serve`` lists the models
        that may answer instead (a fallback chain's members), as names or
        [`ServingModel`][] with their own output caps; strict mode holds the worst
        case over all of them ([`worst_case_cost`][]). Returns the ticket to
        ``finish`` or ``abandon``.

        The call's shape: pass a chat call's ``prompt`` as ``(role, text)`` pairs, or an
        embedding call's input ``texts``, and the gate decides what to count: in strict
        mode it estimates their tokens with ``cl100k_base``
        (`count_message_tokens` /
        [`count_tokens`][]), in default mode it counts nothing.
        ``estimated_input_tokens`` is for a caller that counted itself; giving it with
        ``prompt`` or ``texts`` raises ``ValueError``.

        ``run_id`` and ``thread_id`` name the agent run and conversation thread the call
        belongs to (checked like a scope); every entry the ticket records carries them.
        """
        run = _run_tags(run_id, thread_id)
        now, scope, limits, amount = self._prepare(
            surface,
            scope,
            estimated_input_tokens,
            max_output_tokens,
            model,
            may_serve,
            prompt,
            texts,
        )
        reservation: Reservation | None = None
        if self.budget.strict:
            try:
                reservation = self.ledger.reserve(amount, limits=limits, scope=scope, now=now)
            except BudgetExceededError:
                raise
            except Exception as exc:
                self._ungated(exc, surface, limits)
        else:
            read_all = batch_reader(self.ledger, "spends") if len(limits) > 1 else None
            if read_all is not None:
                try:
                    windows = list(limits)
                    spends = read_all(windows, now=now)
                except Exception as exc:
                    self._ungated(exc, surface, limits)
                else:
                    _check_spends(limits, spends)
                return BudgetTicket(self, surface, scope, model, reservation, run)
            for window, spend_scope, limit in limits.triples:
                try:
                    spend = self.ledger.spend(window, scope=spend_scope, now=now)
                except Exception as exc:
                    self._ungated(exc, surface, limits)
                    break
                if spend >= limit:
                    raise BudgetExceededError(window, limit, spend, spend_scope)
        return BudgetTicket(self, surface, scope, model, reservation, run)

    async def abegin(
        self,
        surface: Surface,
        *,
        scope: str | None = None,
        estimated_input_tokens: int = 0,
        max_output_tokens: int | None = None,
        model: str | None = None,
        may_serve: Sequence[str | ServingModel] = (),
        prompt: Sequence[tuple[str, str]] | None = None,
        texts: Sequence[str] | None = None,
        run_id: str | None = None,
        thread_id: str | None = None,
    ) -> BudgetTicket:
        """Async [`begin`][], through the ledger's async methods."""
        run = _run_tags(run_id, thread_id)
        now, scope, limits, amount = self._prepare(
            surface,
            scope,
            estimated_input_tokens,
            max_output_tokens,
            model,
            may_serve,
            prompt,
            texts,
        )
        reservation: Reservation | None = None
        if self.budget.strict:
            try:
                reservation = await self._areserve(amount, limits, scope, now)
            except BudgetExceededError:
                raise
            except Exception as exc:
                self._ungated(exc, surface, limits)
        else:
            read_all = batch_reader(self.ledger, "aspends") if len(limits) > 1 else None
            if read_all is not None:
                try:
                    windows = list(limits)
                    spends = await read_all(windows, now=now)
                except Exception as exc:
                    self._ungated(exc, surface, limits)
                else:
                    _check_spends(limits, spends)
                return BudgetTicket(self, surface, scope, model, reservation, run)
            for window, spend_scope, limit in limits.triples:
                try:
                    spend = await self.ledger.aspend(window, scope=spend_scope, now=now)
                except Exception as exc:
                    self._ungated(exc, surface, limits)
                    break
                if spend >= limit:
                    raise BudgetExceededError(window, limit, spend, spend_scope)
        return BudgetTicket(self, surface, scope, model, reservation, run)

    def _admit(self, scope: str | None, model: str | None) -> BudgetTicket | None:
        """``begin("chat", scope=scope, model=model)`` for a default-mode budget and a
        ``scope`` its caller checked already (a `Meter`'s), in one read of a ledger with
        a `gate_reader` (the in-memory one); None when the budget is strict or the
        ledger has none: then the caller goes through ``begin``.

        Exact: the same clock, limits and spends as ``begin`` reads (``_gate_spends`` is
        ``spends`` without the checks ``begin`` has made), refused by the same rule, and
        the same ticket. A call of ``abegin`` may take it too: the read never waits.
        """
        if self.budget.strict:
            return None
        fast = self._reader
        read = (self._fast() if fast is None or fast[0] is not self.ledger else fast)[1]
        if read is None:
            return None
        now = datetime.now(UTC) if self._now is _utcnow else self.now()
        unscoped = self._unscoped
        if scope is None and unscoped is not None and unscoped[0] is self.budget:
            limits = unscoped[1]  # `_limits_for`, kept
        else:
            limits = self._limits_for(scope)
        triples = limits.triples
        if triples:
            try:
                spends = read(limits, now)
            except Exception as exc:
                self._ungated(exc, "chat", limits)
            else:  # `_check_spends`, written out
                for (window, spend_scope, limit), spend in zip(triples, spends, strict=True):
                    if spend >= limit:
                        raise BudgetExceededError(window, limit, spend, spend_scope)
        return BudgetTicket(self, "chat", scope, model, None)

    def _fast(self) -> tuple[CostLedger, Callable[..., list[Decimal]] | None, Any, Any]:
        """The ledger, its `gate_reader`, its `inline_recorder` and its
        `row_recorder`, looked up once per ledger (again when ``ledger`` is replaced)."""
        fast = self._reader
        if fast is None or fast[0] is not self.ledger:  # the first call, or a new ledger
            ledger = self.ledger
            fast = self._reader = (
                ledger,
                gate_reader(ledger),
                inline_recorder(ledger),
                row_recorder(ledger),
            )
        return fast

    async def _areserve(
        self, amount: Decimal, limits: CheckedLimits, scope: str | None, now: datetime
    ) -> Reservation:
        """``areserve``, releasing the hold if the caller is cancelled while it is taken.

        The write goes on in the ledger's worker when the caller's task is cancelled
        (a thread cannot be stopped mid-transaction), so the hold it may still commit
        is released as soon as it lands, instead of counting as spend until its TTL.
        """
        taking = asyncio.ensure_future(
            self.ledger.areserve(amount, limits=limits, scope=scope, now=now)
        )
        try:
            return await asyncio.shield(taking)
        except asyncio.CancelledError:
            taking.add_done_callback(self._release_orphan)
            raise

    def _release_orphan(self, taking: asyncio.Future[Reservation]) -> None:
        """Release a hold taken for a caller that was cancelled meanwhile (a done callback)."""
        if taking.cancelled() or taking.exception() is not None:
            return
        releasing = functools.partial(release, self.ledger, taking.result())
        keep(asyncio.get_running_loop().run_in_executor(None, releasing))

    def _prepare(
        self,
        surface: Surface,
        scope: str | None,
        estimated_input_tokens: int,
        max_output_tokens: int | None,
        model: str | None,
        may_serve: Sequence[str | ServingModel] = (),
        prompt: Sequence[tuple[str, str]] | None = None,
        texts: Sequence[str] | None = None,
    ) -> tuple[datetime, str | None, CheckedLimits, Decimal]:
        """The call's time, its checked scope, the limits gating it and what strict mode
        holds for it. The scope is checked here, once: the limits carry it to the ledger."""
        _check_surface(surface)
        if scope is not None:
            scope = check_scope(scope)
        # The usual call gives no count: only a given one is checked (a hot path).
        if estimated_input_tokens != 0 or type(estimated_input_tokens) is not int:
            checks.count("estimated_input_tokens", estimated_input_tokens)
        if max_output_tokens is not None:
            checks.count("max_output_tokens", max_output_tokens)
        if prompt is not None or texts is not None:
            _check_shape(surface, estimated_input_tokens, prompt, texts)
        amount = Decimal(0)
        if self.budget.strict:
            # Only a hold needs the prompt's tokens: counting them otherwise is waste.
            if prompt is not None:
                estimated_input_tokens = count_message_tokens(prompt)
            elif texts is not None:
                estimated_input_tokens = sum(count_tokens(text) for text in texts)
            amount = self.worst_case_cost(
                surface,
                estimated_input_tokens=estimated_input_tokens,
                max_output_tokens=max_output_tokens,
                model=model,
                may_serve=may_serve,
            )
        return self.now(), scope, self._limits_for(scope), amount

    def _limits_for(self, scope: str | None) -> CheckedLimits:
        """The budget's limits for the checked ``scope`` (parsed when the budget was
        built, so nothing is checked again); the unscoped ones are kept."""
        budget = self.budget
        if scope is not None:
            return CheckedLimits(budget.limits_for(scope), scope)
        cached = self._unscoped
        if cached is None or cached[0] is not budget:
            cached = self._unscoped = (budget, CheckedLimits(budget.limits_for(None), None))
        return cached[1]

    def priced(self, served: str | None) -> tuple[PriceMatch, ModelPrice]:
        """How ``served`` is priced (`CostBudget.price_match`) and the price it takes,
        matched once per model name: the budget never changes, and a process names few
        models (past 256 names the matches are forgotten and made again)."""
        budget = self.budget
        cached = self._prices
        if cached is None or cached[0] is not budget:  # the budget was replaced
            cached = self._prices = (budget, {})
        known = cached[1].get(served)
        if known is None:
            match = budget.price_match(served)
            known = (match, budget.price_for(None) if match.price is None else match.price)
            if len(cached[1]) >= 256:
                cached[1].clear()
            cached[1][served] = known
        return known

    def now(self) -> datetime:
        """The injected clock's time, in UTC (a naive time raises ``ValueError``)."""
        if self._now is _utcnow:
            return datetime.now(UTC)  # aware and in UTC already
        current = self._now()
        if current.tzinfo is None or current.utcoffset() is None:
            raise ValueError(f"now() must return a timezone-aware datetime, got {current!r}")
        return current.astimezone(UTC)

    def _ungated(self, exc: Exception, surface: str, limits: CheckedLimits) -> None:
        # A kill switch needs no ledger: it refuses even when spend cannot be read.
        for window, spend_scope, limit in limits.triples:
            if limit == 0:
                raise BudgetExceededError(window, limit, Decimal(0), spend_scope) from exc
        # The error's type only: its text may quote the request's scope (a user id, a key).
        logger.warning(
            "Cost ledger %s unreadable (%s); letting this %s call through ungated.",
            ledger_name(self.ledger),
            type(exc).__name__,
            surface,
        )


class BudgetTicket:
    """One admitted call: ``finish`` records its cost, ``abandon`` records nothing.

    The first of ``finish``/``abandon`` (or their async twins) wins; later calls do nothing,
    so ``abandon`` is safe in a ``finally`` after ``finish``. Abandon a call that failed
    or was cancelled before it delivered anything, and a stream that failed. A stream its
    consumer closed or cancelled after chunks arrived is finished with
    `partial_stream_usage`: the provider billed it. In strict
    mode both release the hold. The async twins finish their ledger write even when the
    caller is cancelled meanwhile.
    """

    __slots__ = (
        "_done",
        "_gate",
        "model",
        "reservation",
        "run_id",
        "scope",
        "surface",
        "thread_id",
    )

    def __init__(
        self,
        gate: BudgetGate,
        surface: Surface,
        scope: str | None,
        model: str | None,
        reservation: Reservation | None,
        run: tuple[str | None, str | None] = (None, None),
    ) -> None:
        self._gate = gate
        #: ``"chat"`` or ``"embedding"``.
        self.surface: Surface = surface
        #: The budget scope the call counts toward; None is unscoped.
        self.scope = scope
        #: The model asked for at the gate.
        self.model = model
        #: The strict-mode hold, or None (default mode, or an unreadable ledger).
        self.reservation = reservation
        #: The agent run and the thread the call belongs to (None: none named).
        self.run_id, self.thread_id = run
        self._done = False

    def __repr__(self) -> str:
        return (
            f"BudgetTicket(surface={self.surface!r}, scope={self.scope!r}, "
            f"model={self.model!r}, reservation={self.reservation!r}, done={self._done})"
        )

    def finish(self, usage: Usage, *, model: str | None = None) -> LedgerEntry | None:
        """Record the call: ``usage`` priced at the serving ``model`` (default: the gate's).

        Returns the entry (None if the ticket was already finished or abandoned). A ledger
        that cannot be written logs a WARNING and raises nothing.
        """
        row = self._row(usage, model)
        if row is None:
            return None
        entry = entry_of_row(row)
        ledger = self._gate.ledger
        try:
            if self.reservation is None:
                ledger.record(entry)
            else:
                ledger.settle(self.reservation, entry)
        except Exception as exc:
            unwritable(exc, self.surface, ledger)
        return entry

    async def afinish(self, usage: Usage, *, model: str | None = None) -> LedgerEntry | None:
        """Async `finish`."""
        row = self._row(usage, model)
        if row is None:
            return None
        entry = entry_of_row(row)
        ledger = self._gate.ledger
        surface = self.surface
        if self.reservation is None:
            gate = self._gate
            fast = gate._reader
            record = (gate._fast() if fast is None or fast[0] is not ledger else fast)[2]
            if record is not None:  # ``arecord`` is ``record`` in place: nothing to shield
                try:
                    record(entry)
                except Exception as exc:
                    unwritable(exc, surface, ledger)
                return entry
        # Shielded: a caller cancelled now (a stream closed in a ``finally``) must not lose
        # what was already spent, nor leave its hold behind; a failure is warned about
        # even when nobody is left waiting for the write.
        write = (
            ledger.arecord(entry)
            if self.reservation is None
            else ledger.asettle(self.reservation, entry)
        )
        await shielded(write, lambda exc: unwritable(exc, surface, ledger))
        return entry

    def settle(self, usage: Usage, *, model: str | None = None) -> None:
        """`finish`, for a caller that has no use for the entry (a meter's settle): a
        ledger that records rows in place (`row_recorder`: the in-memory one) is
        handed the entry's fields and never has the entry built."""
        if not self._recorded_as_row(usage, model):
            self.finish(usage, model=model)

    async def asettle(self, usage: Usage, *, model: str | None = None) -> None:
        """Async `settle` (a ledger that records rows does so in place: nothing to shield)."""
        if not self._recorded_as_row(usage, model):
            await self.afinish(usage, model=model)

    def _recorded_as_row(self, usage: Usage, model: str | None) -> bool:
        """Record the call as a row when its ledger takes rows and no hold is to be
        settled (a ledger that cannot be written is warned about, as ``finish`` does);
        False when ``finish`` must record it."""
        if self.reservation is not None:
            return False
        gate = self._gate
        ledger = gate.ledger
        fast = gate._reader
        record_row = (gate._fast() if fast is None or fast[0] is not ledger else fast)[3]
        if record_row is None:
            return False
        row = self._row(usage, model)
        if row is not None:
            try:
                record_row(row)
            except Exception as exc:
                unwritable(exc, self.surface, ledger)
        return True

    def abandon(self) -> None:
        """Record nothing and release the strict-mode hold, if any."""
        if self._done:
            return
        self._done = True
        if self.reservation is not None:
            release(self._gate.ledger, self.reservation)

    async def aabandon(self) -> None:
        """Async `abandon`."""
        if self._done:
            return
        self._done = True
        if self.reservation is not None:
            ledger = self._gate.ledger
            await shielded(
                ledger.asettle(self.reservation, None), lambda exc: unreleased(exc, ledger)
            )

    def record_hedge(self, usage: Usage, *, model: str | None = None) -> LedgerEntry:
        """Record a hedged attempt that lost: its own entry, of kind ``"hedge"``.

        A fallback chain's ``hedge_after`` may send the call to two members at once;
        the one that did not win is cancelled, but its provider may already have billed
        (and reported) tokens. They are spend too, so they are recorded beside the
        call's own entry, with ``kind="hedge"`` (``surface`` stays the call's), priced
        at ``model``'s price (default: the gate's). Neither ends the ticket nor touches
        a strict-mode hold; may be called after ``finish``. A ledger that cannot be
        written logs a WARNING and raises nothing.
        """
        entry = self._hedge_entry(usage, model)
        ledger = self._gate.ledger
        try:
            ledger.record(entry)
        except Exception as exc:
            unwritable(exc, self.surface, ledger)
        return entry

    async def arecord_hedge(self, usage: Usage, *, model: str | None = None) -> LedgerEntry:
        """Async `record_hedge` (the write finishes even if the caller is cancelled)."""
        entry = self._hedge_entry(usage, model)
        ledger = self._gate.ledger
        surface = self.surface
        await shielded(ledger.arecord(entry), lambda exc: unwritable(exc, surface, ledger))
        return entry

    def _price(self, served: str | None) -> ModelPrice:
        """The price an entry of ``served`` is recorded at; a guessed one is counted."""
        match, price = self._gate.priced(served)
        warn_guessed_price(served, match, self.surface)
        return price

    def _hedge_entry(self, usage: Usage, model: str | None) -> LedgerEntry:
        served = model if model is not None else self.model
        cost = cost_of(usage, self._price(served), surface=self.surface)
        record_llm_usage(
            surface=self.surface,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost=cost,
        )
        return LedgerEntry(
            timestamp=self._gate.now(),
            kind=HEDGE_KIND,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost=cost,
            model=served,
            estimated=usage.estimated,
            surface=self.surface,
            scope=self.scope,
            cache_read_tokens=usage.cache_read_tokens or 0,
            cache_write_tokens=usage.cache_write_tokens or 0,
            cache_write_1h_tokens=usage.cache_write_1h_tokens or 0,
            reasoning_tokens=usage.reasoning_tokens or 0,
            run_id=self.run_id,
            thread_id=self.thread_id,
        )

    def _row(self, usage: Usage, model: str | None) -> EntryRow | None:
        """The entry of the call that used ``usage``, priced for ``model`` (default: the
        gate's), as a `checked_row`; None if the ticket was already finished or
        abandoned (it is now finished)."""
        if self._done:
            return None
        self._done = True
        gate, surface = self._gate, self.surface
        served = model if model is not None else self.model
        # `_price` written out: the served name's price as the gate keeps it (`priced`),
        # and a guessed one counted and warned about.
        prices = gate._prices
        known = None
        if prices is not None and prices[0] is gate.budget:
            known = prices[1].get(served)
        match, price = gate.priced(served) if known is None else known
        if match.rule in GUESSED_RULES:
            warn_guessed_price(served, match, surface)
        cost = cost_of(usage, price, surface=surface)
        record_llm_usage(
            surface=surface,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost=cost,
        )
        return checked_row(
            datetime.now(UTC) if gate._now is _utcnow else gate.now(),
            surface,
            usage.input_tokens,
            usage.output_tokens,
            cost,
            served,
            usage.estimated,
            self.scope,
            usage.cache_read_tokens or 0,
            usage.cache_write_tokens or 0,
            usage.cache_write_1h_tokens or 0,
            usage.reasoning_tokens or 0,
            self.run_id,
            self.thread_id,
        )


def _check_shape(
    surface: Surface,
    estimated_input_tokens: int,
    prompt: Sequence[tuple[str, str]] | None,
    texts: Sequence[str] | None,
) -> None:
    """A call's shape is its prompt (chat) or its texts (embedding), or a count, not two."""
    if prompt is not None and surface != "chat":
        raise ValueError("prompt is a chat call's shape; an embedding call gives texts")
    if texts is not None and surface != "embedding":
        raise ValueError("texts is an embedding call's shape; a chat call gives prompt")
    if estimated_input_tokens and (prompt is not None or texts is not None):
        raise ValueError(
            "give estimated_input_tokens or the call's prompt/texts, not both: "
            "the gate counts the prompt itself"
        )


def _run_tags(run_id: object, thread_id: object) -> tuple[str | None, str | None]:
    """A call's ``run_id`` and ``thread_id``, checked like a scope."""
    if run_id is None and thread_id is None:
        return (None, None)
    return checks.scope("run_id", run_id), checks.scope("thread_id", thread_id)


def _check_surface(surface: object) -> None:
    if surface not in ("chat", "embedding"):
        raise ValueError(f"surface must be 'chat' or 'embedding', got {surface!r}")


def _check_spends(limits: CheckedLimits, spends: Sequence[Decimal]) -> None:
    """Refuse at the first limit, day first, whose spend has reached it."""
    for (window, spend_scope, limit), spend in zip(limits.triples, spends, strict=True):
        if spend >= limit:
            raise BudgetExceededError(window, limit, spend, spend_scope)
