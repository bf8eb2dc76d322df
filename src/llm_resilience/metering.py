"""Metering one call: the cost layer's choreography, and how a stream ended.

A cost layer of any adapter builds one [`Meter`][] over its budget and the stack it
wraps, and drives a [`MeteredCall`][] per call: ``begin`` (the budget gate; the
per-call scope popped and checked; the call's output cap read), the call, then
``settle`` with its usage and whatever names the model that served, ``abandon`` when
it failed, or ``end_early`` when its consumer stopped a stream. Under a hedged fallback
chain (``hedge_after``) the meter opens the inbox the chain reports its losing attempts
to ([`Meter.inbox`][], [`Meter.stream`][]), so they are recorded as ``"hedge"``
entries.

Examples:
    >>> from llm_resilience import CostBudget, InMemoryCostLedger
    >>> from llm_resilience.usage import Usage
    >>> meter = Meter(CostBudget(3, 15, daily_limit=1), InMemoryCostLedger(),
    ...               stack="gpt-4o", name_of=str)
    >>> call = meter.begin({BUDGET_SCOPE_KWARG: "tenant-1"}, prompt=[("user", "Hi")])
    >>> call.settle(Usage(9, 20, estimated=False))
    >>> [(entry.scope, entry.model) for entry in meter.gate.ledger.entries()]
    [('tenant-1', 'gpt-4o')]

How a stream ended is one decision too ([`StreamOutcome`][]): every layer of every
adapter that settles its streams records, when one raises, what its outcome records
(``consumed`` or ``nothing``), and the answer when it completes. A ``try``/``except``
around the chunks, not a context manager: the stream's usual end costs nothing extra.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal, TypeVar

from llm_resilience import checks
from llm_resilience.budget import (
    BudgetGate,
    BudgetTicket,
    CostBudget,
    ServingModel,
    Surface,
    dearest_model,
    served_model,
)
from llm_resilience.fallback._hedge_inbox import (
    ahedge_inbox_stream,
    bind_hedge_ticket,
    hedge_inbox,
    hedge_inbox_stream,
    hedges_below,
)
from llm_resilience.layers import leaves
from llm_resilience.served import served_member
from llm_resilience.usage import Usage, model_output_cap, output_cap

__all__ = [
    "BUDGET_SCOPE_KWARG",
    "Meter",
    "MeteredCall",
    "StreamOutcome",
    "stack_output_caps",
]

T = TypeVar("T")

#: Per-call keyword naming the budget scope (a tenant, a user, a hash of a key), e.g.
#: ``model.invoke(prompt, budget_scope="tenant-1")``; it never reaches the provider.
BUDGET_SCOPE_KWARG = "budget_scope"

Prompt = Sequence[tuple[str, str]]
_NO_INBOX: AbstractContextManager[object] = nullcontext()


def stack_output_caps(
    stack: object, documented: Callable[[object], object] | None = None
) -> tuple[int | None, ...]:
    """The output cap of each model at the bottom of ``stack`` (one provider, or every
    member of a fallback chain), as `model_output_cap`
    reads it; ``documented`` gives a model's documented cap in its framework.

    Examples:
        >>> class Gemini: max_output_tokens = 2048
        >>> stack_output_caps(Gemini())
        (2048,)
    """
    return tuple(
        model_output_cap(leaf, documented(leaf) if documented else None) for leaf in leaves(stack)
    )


class Meter:
    """One cost layer's meter: its gate, who may serve, and whether a hedged chain is below.

    ``budget`` is a [`CostBudget`][] (anything else raises
    ``TypeError``), ``ledger`` any ledger (None: in memory, with a warning), ``scope``
    the layer's budget scope (None: unscoped; checked as the ``scope`` option).
    ``stack`` is what the layer wraps; ``name_of`` reads a model's name in its framework
    and ``documented_cap`` the output cap its framework documents for it (for a strict
    hold). ``surface`` is ``"chat"`` (default) or ``"embedding"``.
    """

    __slots__ = ("_name_of", "_stack", "gate", "hedged", "may_serve", "model", "scope", "surface")

    def __init__(
        self,
        budget: object,
        ledger: Any = None,
        *,
        stack: object,
        name_of: Callable[[object], object],
        documented_cap: Callable[[object], object] | None = None,
        scope: object = None,
        surface: Surface = "chat",
    ) -> None:
        if not isinstance(budget, CostBudget):
            raise TypeError(f"budget must be a CostBudget(...); got {type(budget).__name__}")
        #: The layer's budget scope, or None.
        self.scope = checks.scope("scope", scope)
        #: The gate every call passes.
        self.gate = BudgetGate(budget, ledger)
        #: ``"chat"`` or ``"embedding"``.
        self.surface: Surface = surface
        providers = leaves(stack)
        #: The one model below, by name; None under a chain (it never answers itself).
        self.model = served_model(name_of(providers[0])) if len(providers) == 1 else None
        caps = stack_output_caps(stack, documented_cap) if surface == "chat" else ()
        #: Every model that may serve a chat call, each with its own output cap.
        self.may_serve = tuple(
            ServingModel(served_model(name_of(leaf)), cap)
            for leaf, cap in zip(providers, caps, strict=False)
        )
        #: Whether a chain below hedges (``hedge_after``): then each call opens an inbox.
        self.hedged = hedges_below(stack)
        self._stack = stack
        self._name_of = name_of

    def __repr__(self) -> str:
        return f"Meter(gate={self.gate!r}, scope={self.scope!r}, model={self.model!r})"

    def _gate_args(
        self,
        scope: str | None,
        call: MutableMapping[str, Any] | None,
        prompt: Prompt | Callable[[], Prompt] | None,
        texts: Sequence[str] | None,
    ) -> dict[str, Any]:
        args: dict[str, Any] = {"scope": scope, "model": self.model, "texts": texts}
        if self.surface == "chat":
            args["may_serve"] = self.may_serve
            # Only a strict hold reads the output cap and counts the prompt's tokens: the
            # default gate reads neither.
            if self.gate.budget.strict:
                # The call's own cap reaches every model below; each model's own is in
                # may_serve.
                args["max_output_tokens"] = output_cap(call or {})
                if prompt is not None:
                    args["prompt"] = prompt() if callable(prompt) else prompt
        return args

    def begin(
        self,
        call: MutableMapping[str, Any] | None = None,
        *,
        prompt: Prompt | Callable[[], Prompt] | None = None,
        texts: Sequence[str] | None = None,
    ) -> MeteredCall:
        """Gate one call; raises [`BudgetExceededError`][].

        ``call`` is the call's keyword arguments: `BUDGET_SCOPE_KWARG` is popped
        from it (a bad one raises ``TypeError``/``ValueError`` naming it) and its output
        cap read (`output_cap`). ``prompt`` is a chat call's
        ``(role, text)`` pairs, or a function giving them (read only for a strict hold or
        an estimate); ``texts`` an embedding call's inputs.
        """
        gate = self.gate
        # The call's scope: its own `BUDGET_SCOPE_KWARG` (popped, checked), else the layer's.
        scope = self.scope
        if call is not None and BUDGET_SCOPE_KWARG in call:
            scope = checks.scope(BUDGET_SCOPE_KWARG, call.pop(BUDGET_SCOPE_KWARG))
        ticket = None
        if texts is None and self.surface == "chat":  # the usual call
            # Default mode: in one read of an in-memory ledger, else its arguments given
            # directly (the gate reads neither a prompt nor an output cap).
            ticket = gate._admit(scope, self.model)
            if ticket is None and not gate.budget.strict:
                ticket = gate.begin("chat", scope=scope, model=self.model, may_serve=self.may_serve)
        if ticket is None:
            ticket = gate.begin(self.surface, **self._gate_args(scope, call, prompt, texts))
        bind_hedge_ticket(ticket)
        return MeteredCall(self, ticket, prompt)

    async def abegin(
        self,
        call: MutableMapping[str, Any] | None = None,
        *,
        prompt: Prompt | Callable[[], Prompt] | None = None,
        texts: Sequence[str] | None = None,
    ) -> MeteredCall:
        """Async [`begin`][]."""
        gate = self.gate
        scope = self.scope  # as `begin` reads it
        if call is not None and BUDGET_SCOPE_KWARG in call:
            scope = checks.scope(BUDGET_SCOPE_KWARG, call.pop(BUDGET_SCOPE_KWARG))
        ticket = None
        if texts is None and self.surface == "chat":
            ticket = gate._admit(scope, self.model)  # its read never waits
            if ticket is None and not gate.budget.strict:
                ticket = await gate.abegin(
                    "chat", scope=scope, model=self.model, may_serve=self.may_serve
                )
        if ticket is None:
            ticket = await gate.abegin(self.surface, **self._gate_args(scope, call, prompt, texts))
        bind_hedge_ticket(ticket)
        return MeteredCall(self, ticket, prompt)

    def inbox(self) -> AbstractContextManager[object]:
        """Where a call runs: a fresh hedge inbox when a chain below hedges, else nothing."""
        return hedge_inbox() if self.hedged else _NO_INBOX

    def stream(self, stream: Iterator[T]) -> Iterator[T]:
        """``stream``, whose first step (where the call begins) runs in [`inbox`][]."""
        return hedge_inbox_stream(stream) if self.hedged else stream

    def astream(self, stream: AsyncIterator[T]) -> AsyncIterator[T]:
        """Async [`stream`][]."""
        return ahedge_inbox_stream(stream) if self.hedged else stream

    def served(self, named: object = None, mark: object = None) -> str | None:
        """The model an entry names: the one the answer ``named``, else the member the
        answer's ``mark`` says served ([`served_member`][]),
        else the one model below (None under a chain)."""
        answered = served_model(named)
        if answered is not None:  # the usual case: no chain to look the member up in
            return answered
        member = served_member(self._stack, mark) if mark is not None else None
        return served_model(self._name_of(member) if member is not None else None, self.model)


class MeteredCall:
    """One admitted call: settle it, abandon it, or end it early. Made by [`Meter.begin`][]."""

    __slots__ = ("_meter", "_prompt", "ticket")

    def __init__(
        self, meter: Meter, ticket: BudgetTicket, prompt: Prompt | Callable[[], Prompt] | None
    ) -> None:
        self._meter = meter
        #: The gate's ticket for this call.
        self.ticket = ticket
        self._prompt = prompt

    @property
    def prompt(self) -> Prompt:
        """The call's ``(role, text)`` pairs (read once, when first asked for)."""
        prompt = self._prompt
        if callable(prompt):
            prompt = self._prompt = prompt()
        return prompt if prompt is not None else ()

    def settle(self, usage: Usage, *, named: object = None, mark: object = None) -> None:
        """Record what the call used, priced for the model that served ([`Meter.served`][])."""
        self.ticket.settle(usage, model=self._meter.served(named, mark))

    async def asettle(self, usage: Usage, *, named: object = None, mark: object = None) -> None:
        """Async [`settle`][] (its writes shielded from a cancellation)."""
        await self.ticket.asettle(usage, model=self._meter.served(named, mark))

    def abandon(self) -> None:
        """The call failed: record nothing (a strict hold is released)."""
        self.ticket.abandon()

    async def aabandon(self) -> None:
        """Async [`abandon`][]."""
        await self.ticket.aabandon()

    def _consumed_by(self, usage: Usage, named: object, mark: object) -> str | None:
        member = served_member(self._meter._stack, mark) if mark is not None else None
        served = served_model(named, self._meter._name_of(member) if member else None)
        # Closed before the stream named who served: the dearest that may have (the one
        # model itself when there is one), so the entry is never under-priced.
        return served or dearest_model(self._meter.gate.budget, usage, self._meter.may_serve)

    def end_early(self, usage: Usage | None, *, named: object = None, mark: object = None) -> None:
        """A stream its consumer closed or cancelled: record ``usage``, what it consumed
        (`partial_stream_usage`; None: nothing, abandoned),
        under the model named so far, else the dearest that may have served."""
        if usage is None:
            self.ticket.abandon()
        else:
            self.ticket.settle(usage, model=self._consumed_by(usage, named, mark))

    async def aend_early(
        self, usage: Usage | None, *, named: object = None, mark: object = None
    ) -> None:
        """Async [`end_early`][]; runs while the stream's task may be cancelled: the
        ticket's async writes are shielded, so the entry is kept even if cancelled again."""
        if usage is None:
            await self.ticket.aabandon()
        else:
            await self.ticket.asettle(usage, model=self._consumed_by(usage, named, mark))


class StreamOutcome(enum.Enum):
    """How a stream ended, and so what a layer records for it ([`records`][]).

    Examples:
        >>> StreamOutcome.of(None), StreamOutcome.of(GeneratorExit()).records
        (<StreamOutcome.COMPLETED: 'completed'>, 'consumed')
    """

    #: Read to its end: the whole answer is recorded.
    COMPLETED = "completed"
    #: Its consumer stopped reading (``break``, ``close()``/``aclose()``, garbage
    #: collection): what it consumed is recorded.
    CLOSED = "closed"
    #: Its consumer's task was cancelled while waiting for a chunk: what it consumed is
    #: recorded, as for `CLOSED`.
    CANCELLED = "cancelled"
    #: It raised: nothing is recorded (a failover below is not seen here).
    FAILED = "failed"

    @classmethod
    def of(cls, error: BaseException | None) -> StreamOutcome:
        """The outcome of a stream that ended raising ``error`` (None: it completed)."""
        if error is None:
            return cls.COMPLETED
        if isinstance(error, GeneratorExit):
            return cls.CLOSED
        if isinstance(error, asyncio.CancelledError):
            return cls.CANCELLED
        return cls.FAILED

    @property
    def records(self) -> Literal["answer", "consumed", "nothing"]:
        """``"answer"`` (completed), ``"consumed"`` (closed or cancelled), ``"nothing"``."""
        if self is StreamOutcome.COMPLETED:
            return "answer"
        return "nothing" if self is StreamOutcome.FAILED else "consumed"
