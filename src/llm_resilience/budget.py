"""The spend budget: prices, limits, and the gate every priced call passes through.

::

    gate = BudgetGate(CostBudget(input_price_per_mtok=3, output_price_per_mtok=15,
                                 daily_limit=25), ledger=SqlCostLedger("sqlite:///spend.db"))
    ticket = gate.begin("chat", prompt=pairs, max_output_tokens=1024)  # BudgetExceededError?
    try:
        response = call_the_model()
    except BaseException:
        ticket.abandon()                                   # a failed call costs nothing
        raise
    ticket.finish(chat_usage(in_tokens, out_tokens, prompt=pairs, response_text=text),
                  model=served_model)

Adapters only translate framework types into these calls; every rule lives here and in
:mod:`llm_resilience.usage`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

from llm_resilience import checks
from llm_resilience.errors import BudgetExceededError
from llm_resilience.ledger import CostLedger, InMemoryCostLedger, LedgerEntry, Reservation, Window
from llm_resilience.ledger._protocol import batch_reader, checked_entry
from llm_resilience.money import ModelPrice, Money, cost_of, money, optional_money
from llm_resilience.redact import scrubbed
from llm_resilience.telemetry import record_llm_usage
from llm_resilience.tokens import count_message_tokens, count_tokens
from llm_resilience.usage import Usage

__all__ = [
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "HEDGE_KIND",
    "BudgetGate",
    "BudgetTicket",
    "CostBudget",
    "ModelPrice",
    "ServingModel",
    "dearest_model",
    "served_model",
]

logger = logging.getLogger(__name__)

#: Output tokens a strict-mode hold assumes for a model that may serve a chat call when
#: neither the call nor the model caps its output (no ``max_output_tokens``, no
#: :attr:`ServingModel.max_output_tokens`).
DEFAULT_MAX_OUTPUT_TOKENS = 4096

#: The ``kind`` of a ledger entry recording a hedged attempt that lost
#: (:meth:`BudgetTicket.record_hedge`): spend, but not the call's answer.
HEDGE_KIND = "hedge"

Surface = Literal["chat", "embedding"]
#: One limit the gate applies: the window, whose spend it reads (None: the global total),
#: and the limit.
_Limit: TypeAlias = tuple[Window, str | None, Decimal]

_IN_MEMORY_WARNING = (
    "No persistent cost ledger: spend is kept in memory by InMemoryCostLedger and resets "
    "when the process restarts. Pass SqlCostLedger(url) to keep it across restarts and workers."
)


@dataclass(frozen=True, slots=True)
class ServingModel:
    """A model that may serve a call, and the most output tokens it writes per call.

    >>> ServingModel("gpt-4o", max_output_tokens=16384)
    ServingModel(name='gpt-4o', max_output_tokens=16384)

    Strict mode holds each call's worst case over every model that may serve it (see
    :meth:`BudgetGate.worst_case_cost`); pass the members of a fallback chain as
    ``may_serve=[ServingModel(...), ...]``. A ``name`` of None is priced at the surface
    prices. ``TypeError``/``ValueError`` name the field that is wrong.
    """

    #: The model's name, priced by :meth:`CostBudget.price_for`; None: the surface prices.
    name: str | None
    #: Its own output cap (its ``max_tokens``, else its provider's documented maximum);
    #: None: unknown, so :data:`DEFAULT_MAX_OUTPUT_TOKENS` unless the call sets one. >= 0.
    max_output_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise TypeError(f"ServingModel.name must be a non-empty str or None, got {self.name!r}")
        if self.max_output_tokens is not None:
            checks.count("ServingModel.max_output_tokens", self.max_output_tokens)


@dataclass(frozen=True, init=False)
class CostBudget:
    """Prices and spend limits, exact to the last digit (``Decimal``).

    >>> budget = CostBudget(input_price_per_mtok=3, output_price_per_mtok=15,
    ...                     embedding_price_per_mtok="0.02", daily_limit=25, monthly_limit=400)

    Money is ``Decimal``, ``int`` or ``str`` in whatever currency the prices are quoted in;
    a float raises ``TypeError`` ("use Decimal('0.15') or a string"). Validated here:
    no negative values (``ValueError`` naming the option), and at least one of
    ``daily_limit``, ``monthly_limit``, ``global_daily_limit``, ``global_monthly_limit``.
    A limit of 0 is a kill switch: every call is refused.

    Windows are UTC calendar windows: ``day`` is the current UTC date, ``month`` the current
    UTC month from its first day. Scopes (a tenant, a user, a hash of an API key passed to
    :meth:`BudgetGate.begin`):

    * a call without a scope is gated by ``daily_limit``/``monthly_limit`` and by
      ``global_daily_limit``/``global_monthly_limit``, all against the global spend;
    * a call with ``scope="tenant-1"`` is gated by ``daily_limit``/``monthly_limit``
      against that scope's own spend, and by the ``global_*`` limits against the global
      spend (every scope together).

    ``prices`` maps model names to :class:`ModelPrice`, applied to the model that actually
    served: the exact name first, then the longest configured prefix the served name starts
    with (``"gpt-4o"`` prices ``"gpt-4o-2024-08-06"``), else the three surface prices.

    ``strict=True`` reserves each call's worst-case cost at the gate, so concurrent calls
    cannot overshoot a limit (see :class:`BudgetGate`). Without it the gate is a pre-call
    check: every call in flight when the limit is reached still completes and records, so
    spend can exceed a limit by up to the cost of the calls running concurrently.
    """

    #: Chat price per million input tokens.
    input_price_per_mtok: Decimal
    #: Chat price per million output tokens.
    output_price_per_mtok: Decimal
    #: Embedding price per million input tokens.
    embedding_price_per_mtok: Decimal
    #: Limit of a UTC day: global spend for unscoped calls, the scope's spend for scoped ones.
    daily_limit: Decimal | None
    #: Limit of a UTC month, scoped like ``daily_limit``.
    monthly_limit: Decimal | None
    #: Per-model prices (read-only), keyed by exact model name or name prefix.
    prices: Mapping[str, ModelPrice] = field(hash=False)
    #: Limit of the global spend of a UTC day, for every call, scoped or not.
    global_daily_limit: Decimal | None
    #: Limit of the global spend of a UTC month, for every call, scoped or not.
    global_monthly_limit: Decimal | None
    #: Reserve worst-case cost at the gate so concurrency cannot overshoot.
    strict: bool
    #: The three surface prices as one ``ModelPrice``, built once (every call prices).
    _surface_price: ModelPrice = field(init=False, repr=False, compare=False)

    def __init__(
        self,
        input_price_per_mtok: Money = 0,
        output_price_per_mtok: Money = 0,
        embedding_price_per_mtok: Money = 0,
        daily_limit: Money | None = None,
        monthly_limit: Money | None = None,
        *,
        prices: Mapping[str, ModelPrice] | None = None,
        global_daily_limit: Money | None = None,
        global_monthly_limit: Money | None = None,
        strict: bool = False,
    ) -> None:
        assign = object.__setattr__
        for option, value in (
            ("input_price_per_mtok", input_price_per_mtok),
            ("output_price_per_mtok", output_price_per_mtok),
            ("embedding_price_per_mtok", embedding_price_per_mtok),
        ):
            assign(self, option, money(option, value))
        limits = {
            "daily_limit": daily_limit,
            "monthly_limit": monthly_limit,
            "global_daily_limit": global_daily_limit,
            "global_monthly_limit": global_monthly_limit,
        }
        for option, limit in limits.items():
            assign(self, option, optional_money(option, limit))
        if all(limit is None for limit in limits.values()):
            raise ValueError(
                "CostBudget needs at least one limit: set daily_limit, monthly_limit, "
                "global_daily_limit or global_monthly_limit (money >= 0; 0 refuses every call)"
            )
        checked: dict[str, ModelPrice] = {}
        for model, price in (prices or {}).items():
            if not isinstance(model, str) or not model:
                raise TypeError(f"prices keys must be non-empty model names, got {model!r}")
            if not isinstance(price, ModelPrice):
                raise TypeError(
                    f"prices[{model!r}] must be a ModelPrice(input_per_mtok, output_per_mtok), "
                    f"got {price!r}"
                )
            checked[model] = price
        assign(self, "prices", MappingProxyType(checked))
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be True or False, got {strict!r}")
        assign(self, "strict", strict)
        assign(
            self,
            "_surface_price",
            ModelPrice(
                self.input_price_per_mtok,
                self.output_price_per_mtok,
                self.embedding_price_per_mtok,
            ),
        )

    def price_for(self, model: str | None) -> ModelPrice:
        """The price of ``model``: exact name, else longest matching prefix, else surface prices.

        >>> budget = CostBudget(daily_limit=1, prices={"gpt-4o": ModelPrice(2, 8)})
        >>> budget.price_for("gpt-4o-2024-08-06").output_per_mtok
        Decimal('8')
        """
        if model is not None and self.prices:
            exact = self.prices.get(model)
            if exact is not None:
                return exact
            prefixes = [name for name in self.prices if model.startswith(name)]
            if prefixes:
                return self.prices[max(prefixes, key=len)]
        return self._surface_price

    def limits_for(self, scope: str | None) -> list[tuple[Window, str | None, Decimal]]:
        """The limits gating a call of ``scope``, day first: ``(window, spend scope, limit)``.

        The spend scope is ``scope`` for a scope's own limit and None for the global spend.
        An unscoped call with both ``daily_limit`` and ``global_daily_limit`` gets the lower.
        """
        windows: tuple[tuple[Window, Decimal | None, Decimal | None], ...] = (
            ("day", self.daily_limit, self.global_daily_limit),
            ("month", self.monthly_limit, self.global_monthly_limit),
        )
        found: list[_Limit] = []
        for window, own, overall in windows:
            if scope is None:
                present = [limit for limit in (own, overall) if limit is not None]
                if present:
                    found.append((window, None, min(present)))
                continue
            if own is not None:
                found.append((window, scope, own))
            if overall is not None:
                found.append((window, None, overall))
        return found


def _utcnow() -> datetime:
    return datetime.now(UTC)


class BudgetGate:
    """Refuses calls once spend reaches a limit; records what each admitted call cost.

    ::

        gate = BudgetGate(budget, ledger)          # share one ledger across wrappers
        ticket = gate.begin("chat", scope="tenant-1", prompt=[("user", "Hi")],
                            max_output_tokens=512, model="gpt-4o")
        ...                                        # the call
        ticket.finish(usage, model="gpt-4o-2024-08-06")   # or ticket.abandon()

    Default mode: for each configured window, day first then month, the gate reads the
    window's spend (an unconfigured window is not read) and raises
    :class:`~llm_resilience.errors.BudgetExceededError` once ``spend >= limit``. Every
    window the budget needs (day and month, the scope's and the global) is read at once:
    one round trip on our ledgers (``spends``), one ``spend`` per window on a ledger
    without ``spends`` (stopping at the first refusal). It is a pre-call check, so calls
    admitted concurrently can overshoot a limit by up to the cost of every call in flight.

    Strict mode (``CostBudget(strict=True)``): the gate reserves the call's worst-case cost
    (:meth:`worst_case_cost`: ``estimated_input_tokens`` plus each model's output cap,
    at that model's price, the dearest over ``model`` and ``may_serve``; 4096
    (:data:`DEFAULT_MAX_OUTPUT_TOKENS`) output tokens for a chat model with no cap)
    atomically in the ledger, refusing it if any limit would be exceeded; ``finish``
    replaces the hold with the real cost. Concurrent calls cannot overshoot, as long as
    the real cost stays within the hold: pass every model a fallback chain may serve, with
    its output cap, as ``may_serve=[ServingModel(name, max_output_tokens), ...]`` (the
    framework wrappers do this for the chains below them).

    Ledger failures degrade, never break (each logs a WARNING on ``llm_resilience.budget``):
    an unreadable ledger lets the call through ungated (a limit of 0 still refuses, spend
    reported as 0); an unwritable one lets the call succeed unrecorded. With no ``ledger``
    an :class:`~llm_resilience.ledger.InMemoryCostLedger` is used, and one warning per gate
    names ``SqlCostLedger``, since in-memory spend resets when the process restarts (an
    ``InMemoryCostLedger`` passed on purpose is not warned about).

    ``now`` returns the current timezone-aware time (UTC by default); inject it in tests.
    """

    __slots__ = ("_now", "_unscoped", "budget", "ledger")

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
        self.ledger: CostLedger = InMemoryCostLedger() if ledger is None else _ledger(ledger)
        self._now = now
        #: The unscoped limits, computed once per budget (the budget is immutable).
        self._unscoped: tuple[CostBudget, list[_Limit]] | None = None
        if ledger is None:  # a ledger given by name, in memory or not, was a choice
            logger.warning(_IN_MEMORY_WARNING)

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
        output rate: :meth:`~llm_resilience.money.ModelPrice.dearest`), so whichever
        serves, the real cost stays within it. A model's output cap is the
        call's ``max_output_tokens`` when set (a call's ``max_tokens`` reaches every
        member of a chain), else its own :attr:`ServingModel.max_output_tokens`, else
        :data:`DEFAULT_MAX_OUTPUT_TOKENS` (4096). Embeddings have no output.

        The models that may serve are ``model`` and ``may_serve`` (the members of a
        fallback chain, as names or :class:`ServingModel`). A model named both plainly and
        with a cap is held at its cap; a None ``model`` (a chain, which never answers
        itself) counts only when ``may_serve`` is empty.

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
        for candidate in _serving_models(model, may_serve):
            output = 0
            if surface == "chat":
                output = _first_count(
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
    ) -> BudgetTicket:
        """Gate one call; raises ``BudgetExceededError`` if a limit refuses it.

        ``model`` is the model asked for (it prices the strict-mode hold and is recorded
        when ``finish`` is not told which model served). ``may_serve`` lists the models
        that may answer instead (a fallback chain's members), as names or
        :class:`ServingModel` with their own output caps; strict mode holds the worst
        case over all of them (:meth:`worst_case_cost`). Returns the ticket to
        ``finish`` or ``abandon``.

        The call's shape: pass a chat call's ``prompt`` as ``(role, text)`` pairs, or an
        embedding call's input ``texts``, and the gate decides what to count: in strict
        mode it estimates their tokens with ``cl100k_base``
        (:func:`~llm_resilience.tokens.count_message_tokens` /
        :func:`~llm_resilience.tokens.count_tokens`), in default mode it counts nothing.
        ``estimated_input_tokens`` is for a caller that counted itself; giving it with
        ``prompt`` or ``texts`` raises ``ValueError``.
        """
        now, limits, amount = self._prepare(
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
                reservation = self.ledger.reserve(
                    amount, limits=_mapping(limits), scope=scope, now=now
                )
            except BudgetExceededError:
                raise
            except Exception as exc:
                self._ungated(exc, surface, limits)
        else:
            read_all = batch_reader(self.ledger, "spends") if len(limits) > 1 else None
            if read_all is not None:
                try:
                    windows = [(window, spend_scope) for window, spend_scope, _ in limits]
                    spends = read_all(windows, now=now)
                except Exception as exc:
                    self._ungated(exc, surface, limits)
                else:
                    _check_spends(limits, spends)
                return BudgetTicket(self, surface, scope, model, reservation)
            for window, spend_scope, limit in limits:
                try:
                    spend = self.ledger.spend(window, scope=spend_scope, now=now)
                except Exception as exc:
                    self._ungated(exc, surface, limits)
                    break
                if spend >= limit:
                    raise BudgetExceededError(window, limit, spend, spend_scope)
        return BudgetTicket(self, surface, scope, model, reservation)

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
    ) -> BudgetTicket:
        """Async :meth:`begin`, through the ledger's async methods."""
        now, limits, amount = self._prepare(
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
                    windows = [(window, spend_scope) for window, spend_scope, _ in limits]
                    spends = await read_all(windows, now=now)
                except Exception as exc:
                    self._ungated(exc, surface, limits)
                else:
                    _check_spends(limits, spends)
                return BudgetTicket(self, surface, scope, model, reservation)
            for window, spend_scope, limit in limits:
                try:
                    spend = await self.ledger.aspend(window, scope=spend_scope, now=now)
                except Exception as exc:
                    self._ungated(exc, surface, limits)
                    break
                if spend >= limit:
                    raise BudgetExceededError(window, limit, spend, spend_scope)
        return BudgetTicket(self, surface, scope, model, reservation)

    async def _areserve(
        self, amount: Decimal, limits: list[_Limit], scope: str | None, now: datetime
    ) -> Reservation:
        """``areserve``, releasing the hold if the caller is cancelled while it is taken.

        The write goes on in the ledger's worker when the caller's task is cancelled
        (a thread cannot be stopped mid-transaction), so the hold it may still commit
        is released as soon as it lands, instead of counting as spend until its TTL.
        """
        taking = asyncio.ensure_future(
            self.ledger.areserve(amount, limits=_mapping(limits), scope=scope, now=now)
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
        release = functools.partial(_release, self.ledger, taking.result())
        _keep(asyncio.get_running_loop().run_in_executor(None, release))

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
    ) -> tuple[datetime, list[_Limit], Decimal]:
        _check_surface(surface)
        checks.scope("scope", scope)
        checks.count("estimated_input_tokens", estimated_input_tokens)
        if max_output_tokens is not None:
            checks.count("max_output_tokens", max_output_tokens)
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
        return self.now(), self._limits_for(scope), amount

    def _limits_for(self, scope: str | None) -> list[_Limit]:
        """The budget's limits for ``scope``; the unscoped ones are kept (read-only)."""
        budget = self.budget
        if scope is not None:
            return budget.limits_for(scope)
        cached = self._unscoped
        if cached is None or cached[0] is not budget:
            cached = self._unscoped = (budget, budget.limits_for(None))
        return cached[1]

    def now(self) -> datetime:
        """The injected clock's time, in UTC (a naive time raises ``ValueError``)."""
        if self._now is _utcnow:
            return datetime.now(UTC)  # aware and in UTC already
        current = self._now()
        if current.tzinfo is None or current.utcoffset() is None:
            raise ValueError(f"now() must return a timezone-aware datetime, got {current!r}")
        return current.astimezone(UTC)

    def _ungated(self, exc: Exception, surface: str, limits: list[_Limit]) -> None:
        # A kill switch needs no ledger: it refuses even when spend cannot be read.
        for window, spend_scope, limit in limits:
            if limit == 0:
                raise BudgetExceededError(window, limit, Decimal(0), spend_scope) from exc
        # The error's type only: its text may quote the request's scope (a user id, a key).
        logger.warning(
            "Cost ledger %s unreadable (%s); letting this %s call through ungated.",
            _name(self.ledger),
            type(exc).__name__,
            surface,
        )


class BudgetTicket:
    """One admitted call: ``finish`` records its cost, ``abandon`` records nothing.

    The first of ``finish``/``abandon`` (or their async twins) wins; later calls do nothing,
    so ``abandon`` is safe in a ``finally`` after ``finish``. Abandon a call that failed
    or was cancelled before it delivered anything, and a stream that failed. A stream its
    consumer closed or cancelled after chunks arrived is finished with
    :func:`~llm_resilience.usage.partial_stream_usage`: the provider billed it. In strict
    mode both release the hold. The async twins finish their ledger write even when the
    caller is cancelled meanwhile.
    """

    __slots__ = ("_done", "_gate", "model", "reservation", "scope", "surface")

    def __init__(
        self,
        gate: BudgetGate,
        surface: Surface,
        scope: str | None,
        model: str | None,
        reservation: Reservation | None,
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
        entry = self._entry(usage, model)
        if entry is None:
            return None
        ledger = self._gate.ledger
        try:
            if self.reservation is None:
                ledger.record(entry)
            else:
                ledger.settle(self.reservation, entry)
        except Exception as exc:
            _unwritable(exc, self.surface, ledger)
        return entry

    async def afinish(self, usage: Usage, *, model: str | None = None) -> LedgerEntry | None:
        """Async :meth:`finish`."""
        entry = self._entry(usage, model)
        if entry is None:
            return None
        ledger = self._gate.ledger
        surface = self.surface
        # Shielded: a caller cancelled now (a stream closed in a ``finally``) must not lose
        # what was already spent, nor leave its hold behind; a failure is warned about
        # even when nobody is left waiting for the write.
        write = (
            ledger.arecord(entry)
            if self.reservation is None
            else ledger.asettle(self.reservation, entry)
        )
        await _shielded(write, lambda exc: _unwritable(exc, surface, ledger))
        return entry

    def abandon(self) -> None:
        """Record nothing and release the strict-mode hold, if any."""
        if self._done:
            return
        self._done = True
        if self.reservation is not None:
            _release(self._gate.ledger, self.reservation)

    async def aabandon(self) -> None:
        """Async :meth:`abandon`."""
        if self._done:
            return
        self._done = True
        if self.reservation is not None:
            ledger = self._gate.ledger
            await _shielded(
                ledger.asettle(self.reservation, None), lambda exc: _unreleased(exc, ledger)
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
            _unwritable(exc, self.surface, ledger)
        return entry

    async def arecord_hedge(self, usage: Usage, *, model: str | None = None) -> LedgerEntry:
        """Async :meth:`record_hedge` (the write finishes even if the caller is cancelled)."""
        entry = self._hedge_entry(usage, model)
        ledger = self._gate.ledger
        surface = self.surface
        await _shielded(ledger.arecord(entry), lambda exc: _unwritable(exc, surface, ledger))
        return entry

    def _hedge_entry(self, usage: Usage, model: str | None) -> LedgerEntry:
        served = model if model is not None else self.model
        cost = cost_of(usage, self._gate.budget.price_for(served), surface=self.surface)
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
        )

    def _entry(self, usage: Usage, model: str | None) -> LedgerEntry | None:
        if self._done:
            return None
        self._done = True
        served = model if model is not None else self.model
        price = self._gate.budget.price_for(served)
        cost = cost_of(usage, price, surface=self.surface)
        record_llm_usage(
            surface=self.surface,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost=cost,
        )
        return checked_entry(
            timestamp=self._gate.now(),
            kind=self.surface,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost=cost,
            model=served,
            estimated=usage.estimated,
            scope=self.scope,
            cache_read_tokens=usage.cache_read_tokens or 0,
            cache_write_tokens=usage.cache_write_tokens or 0,
            cache_write_1h_tokens=usage.cache_write_1h_tokens or 0,
            reasoning_tokens=usage.reasoning_tokens or 0,
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


def _check_surface(surface: object) -> None:
    if surface not in ("chat", "embedding"):
        raise ValueError(f"surface must be 'chat' or 'embedding', got {surface!r}")


def _serving_models(
    model: str | None, may_serve: Sequence[str | ServingModel]
) -> list[ServingModel]:
    """Every model that may serve a call: ``model`` and ``may_serve``, as :meth:`worst_case_cost`
    counts them (an uncapped entry gives way to a capped one of the same name)."""
    if isinstance(may_serve, str):
        raise TypeError(f"may_serve must be a sequence of model names, not the str {may_serve!r}")
    listed: list[ServingModel] = []
    for entry in may_serve:
        if isinstance(entry, ServingModel):
            listed.append(entry)
        elif isinstance(entry, str) and entry:
            listed.append(ServingModel(entry))
        else:
            raise TypeError(
                f"may_serve entries must be model names or ServingModel(name, "
                f"max_output_tokens), got {entry!r}"
            )
    if model is not None or not listed:
        listed.insert(0, ServingModel(model))
    capped = {entry.name for entry in listed if entry.max_output_tokens is not None}
    return [
        entry for entry in listed if entry.max_output_tokens is not None or entry.name not in capped
    ]


#: Names a framework gives a model it cannot name (LlamaIndex's default ``model_name``).
_PLACEHOLDER_NAMES = frozenset({"unknown"})


def served_model(*candidates: object) -> str | None:
    """The model a ledger entry names: the first candidate that is a model's name, else None.

    The rule for every wrapper and surface: pass, most specific first, the name the
    provider's response reports, then the fallback member that answered (when a chain
    says), then the wrapped model's own name. A candidate is a name when it is non-empty
    text other than a framework's placeholder (``"unknown"``, LlamaIndex's default). An
    embedding entry names the embedding model the same way, and None when it has no name
    (it is then priced at the surface prices).

    >>> served_model(None, "", "gpt-4o-2024-08-06", "gpt-4o")
    'gpt-4o-2024-08-06'
    >>> served_model("unknown") is None
    True
    """
    for candidate in candidates:
        if isinstance(candidate, str) and candidate and candidate not in _PLACEHOLDER_NAMES:
            return candidate
    return None


def dearest_model(
    budget: CostBudget, usage: Usage, may_serve: Sequence[str | ServingModel]
) -> str | None:
    """Of the models that may have served a chat call, the one that prices ``usage`` highest.

    For an entry whose serving model is unknown (a stream through a fallback chain closed
    before the chain said which member answered): named and priced at the dearest
    candidate, the ledger never under-records it. The first of equals wins; None when
    ``may_serve`` is empty (the surface prices).

    >>> budget = CostBudget(daily_limit=1, prices={"dear": ModelPrice(10, 40)})
    >>> dearest_model(budget, Usage(100, 10, estimated=True), ["cheap", "dear"])
    'dear'
    """
    names = [entry.name for entry in _serving_models(None, may_serve)]
    return max(names, key=lambda name: cost_of(usage, budget.price_for(name)))


def _first_count(*counts: int | None) -> int:
    """The first count that is not None (the last one always is a count)."""
    return next(count for count in counts if count is not None)


def _check_spends(limits: list[_Limit], spends: Sequence[Decimal]) -> None:
    """Refuse at the first limit, day first, whose spend has reached it."""
    for (window, spend_scope, limit), spend in zip(limits, spends, strict=True):
        if spend >= limit:
            raise BudgetExceededError(window, limit, spend, spend_scope)


def _mapping(limits: list[_Limit]) -> dict[tuple[Window, str | None], Decimal]:
    return {(window, spend_scope): limit for window, spend_scope, limit in limits}


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


def _ledger(ledger: object) -> CostLedger:
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


def _name(ledger: object) -> str:
    """How warnings name a ledger: its type, and its URL (password hidden) if it has one."""
    url = getattr(ledger, "url", None)
    return f"{type(ledger).__name__}({url!r})" if isinstance(url, str) else type(ledger).__name__


def _keep(future: asyncio.Future[Any]) -> None:
    _background.add(future)
    future.add_done_callback(_background.discard)


async def _shielded(write: Awaitable[None], on_error: Callable[[Exception], None]) -> None:
    """Await ``write`` to its end even if the caller is cancelled meanwhile; a write that
    fails calls ``on_error`` (also when the caller has gone, so nothing fails unseen)."""

    async def guarded() -> None:
        try:
            await write
        except Exception as exc:
            on_error(exc)

    task = asyncio.ensure_future(guarded())
    _keep(task)
    await asyncio.shield(task)


def _release(ledger: CostLedger, reservation: Reservation) -> None:
    try:
        ledger.settle(reservation, None)
    except Exception as exc:
        _unreleased(exc, ledger)


def _unwritable(exc: Exception, surface: str, ledger: CostLedger) -> None:
    logger.warning(
        "Cost ledger %s unwritable (%s); the %s call succeeded but its cost was not recorded.",
        _name(ledger),
        type(exc).__name__,
        surface,
    )


def _unreleased(exc: Exception, ledger: CostLedger) -> None:
    logger.warning(
        "Cost ledger %s could not release a strict-mode reservation (%s); it stops counting "
        "once the ledger's reservation TTL (15 minutes by default) passes.",
        _name(ledger),
        type(exc).__name__,
    )
