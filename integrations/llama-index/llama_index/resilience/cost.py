"""``CostTrackedLLM`` and ``CostTrackedEmbedding``: LlamaIndex layers over a spend budget.

The adapter only translates: limits, windows, prices, what counts as reported usage and
how missing usage is estimated are the core's (:mod:`llm_resilience.budget`,
:mod:`llm_resilience.usage`). Each call passes the budget gate before the inner call
(a spent budget raises :class:`~llm_resilience.errors.BudgetExceededError` and the inner
model is never called) and records one ledger entry after it:

* chat and completion: the provider's usage when the response reports both counts
  (OpenAI-shaped ``raw.usage``/``additional_kwargs``, Anthropic-shaped ``raw["usage"]``
  or ``message.additional_kwargs["usage"]``), else both estimated over the request
  messages and the answer, flagged ``estimated``;
* streams: gated on first iteration, recorded once after the last chunk from the usage
  the chunks reported, else estimated from the accumulated text. A stream its consumer
  closes early (``break``, ``close()``/``aclose()``, garbage collection) or cancels
  after chunks arrived records what it consumed
  (:func:`~llm_resilience.usage.partial_stream_usage`: the usage reported so far, else
  the prompt and the delivered text estimated); one that failed with an error records
  nothing (a failover inside a :class:`~llama_index.resilience.FallbackLLM` below is
  not seen here);
* a hedged ``FallbackLLM`` below (``hedge_after``): the attempt that lost is recorded as
  its own entry of kind ``"hedge"`` when its provider reported usage;
* embeddings: always estimated over the input texts.

Every entry names the model that served, by the core's rule
(:func:`~llm_resilience.budget.served_model`): the provider's ``raw.model``, else the
member of a :class:`~llama_index.resilience.FallbackLLM` below that answered, else the
inner LLM's ``metadata.model_name``; LlamaIndex's placeholder ``"unknown"`` is no name,
so an unnamed model (embedding models included) records None. A stream closed early
before naming its model records the dearest that may have served. A failed call
records nothing.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from llama_index.core.base.llms.types import ChatResponse, CompletionResponse
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.llms.llm import LLM
from llama_index.resilience._delegate import (
    AnyResponse,
    CallKind,
    DelegatingEmbedding,
    DelegatingLLM,
    EmbeddingKind,
    Request,
)
from llama_index.resilience._usage import (
    StreamTally,
    asked_output_tokens,
    output_cap,
    prompt_pairs,
    raw_model,
    reported_details,
    reported_tokens,
    response_text,
)
from llama_index.resilience.fallback import SERVED_BY_KEY, FallbackLLM

from llm_resilience import checks
from llm_resilience.budget import (
    BudgetGate,
    BudgetTicket,
    CostBudget,
    ServingModel,
    dearest_model,
    served_model,
)
from llm_resilience.fallback import (
    ahedge_inbox_stream,
    bind_hedge_ticket,
    hedge_inbox,
    hedge_inbox_stream,
    hedges_below,
)
from llm_resilience.layers import find_layer, leaves
from llm_resilience.ledger import CostLedger
from llm_resilience.usage import Usage, chat_usage, embedding_usage, partial_stream_usage

__all__ = ["BUDGET_SCOPE_KWARG", "CostTrackedEmbedding", "CostTrackedLLM"]

_ResponseT = TypeVar("_ResponseT", ChatResponse, CompletionResponse)

#: Per-call keyword that overrides a :class:`CostTrackedLLM`'s ``scope`` (never sent on).
BUDGET_SCOPE_KWARG = "budget_scope"


class CostTrackedLLM(DelegatingLLM):
    """An LLM that refuses calls once a spend limit is reached, and records each call's cost.

    Example::

        from llama_index.core import Settings
        from llama_index.llms.openai import OpenAI
        from llama_index.resilience import CostTrackedLLM
        from llm_resilience import CostBudget
        from llm_resilience.ledger import SqlCostLedger

        llm = CostTrackedLLM(
            inner=OpenAI(model="gpt-4o"),
            budget=CostBudget(input_price_per_mtok="2.50", output_price_per_mtok=10,
                              daily_limit=25),
            ledger=SqlCostLedger("sqlite:///spend.db"),
        )
        Settings.llm = llm                            # query engines and agents are gated
        llm.complete("Hi", budget_scope="tenant-7")  # counts toward tenant-7's limits

    ``budget`` is a :class:`~llm_resilience.budget.CostBudget`; this layer keeps one
    :class:`~llm_resilience.budget.BudgetGate` over it. ``ledger`` may be shared by every
    layer of the process (None: a new in-memory ledger, with a warning naming
    ``SqlCostLedger``). ``scope`` (a tenant, a user, a hash of a key; None: unscoped) applies to
    every call; a call's ``budget_scope=`` keyword overrides it and is never passed to
    the inner LLM. Windows are UTC days and months; money is exact ``Decimal``. In strict
    mode the hold covers every LLM below that may serve, each up to its own output cap
    (the call's ``max_tokens``, else the LLM's ``max_tokens``, else its
    ``metadata.num_output``, else 4,096), at its own price.

    Raises ``TypeError`` for a ``budget`` that is not a ``CostBudget``, an empty or
    non-text ``scope``, or an ``inner`` that is not an ``LLM``; calls raise
    :class:`~llm_resilience.errors.BudgetExceededError` (``window``, ``limit``,
    ``spend``) once spend has reached a limit. Tools, structured output and metadata
    pass through to ``inner``.
    """

    budget: Any = Field(exclude=True, description="The llm_resilience.CostBudget applied.")
    ledger: Any = Field(exclude=True, description="Where spend is recorded and read back.")
    scope: str | None = Field(default=None, description="Budget scope of every call.")

    _call_options = (BUDGET_SCOPE_KWARG,)
    _gate: BudgetGate = PrivateAttr()
    _may_serve: tuple[ServingModel, ...] = PrivateAttr(default=())
    _hedged: bool = PrivateAttr(default=False)

    def __init__(
        self,
        *,
        inner: LLM,
        budget: CostBudget,
        ledger: CostLedger | None = None,
        scope: str | None = None,
        **kwargs: Any,
    ) -> None:
        gate = _gate(budget, ledger, scope)
        super().__init__(inner=inner, budget=budget, ledger=gate.ledger, scope=scope, **kwargs)
        self._gate = gate
        self._hedged = hedges_below(inner)
        # Strict holds cover every model that may answer (any fallback leg) up to its cap.
        self._may_serve = tuple(
            ServingModel(served_model(leaf.metadata.model_name), output_cap(leaf))
            for leaf in leaves(inner)
            if isinstance(leaf, LLM)
        )

    @classmethod
    def class_name(cls) -> str:
        return "CostTrackedLLM"

    @property
    def gate(self) -> BudgetGate:
        """The budget gate every call of this layer passes."""
        return self._gate

    # -- hooks ----------------------------------------------------------------------------

    def _admit(self, request: Request, kwargs: dict[str, Any]) -> tuple[dict[str, Any], _Call]:
        scope = checks.scope(BUDGET_SCOPE_KWARG, kwargs.pop(BUDGET_SCOPE_KWARG, self.scope))
        prompt = prompt_pairs(request)
        gate_kwargs = {
            "scope": scope,
            "prompt": prompt,
            # The call's own cap reaches every model below; each model's own is in _may_serve.
            "max_output_tokens": asked_output_tokens(kwargs),
            "model": served_model(self.inner.metadata.model_name),
            "may_serve": self._may_serve,
        }
        return gate_kwargs, _Call(prompt)

    def _begin(self, kind: CallKind, request: Request, kwargs: dict[str, Any]) -> _Call:
        gate_kwargs, call = self._admit(request, kwargs)
        call.ticket = self._gate.begin("chat", **gate_kwargs)
        bind_hedge_ticket(call.ticket)
        return call

    async def _abegin(self, kind: CallKind, request: Request, kwargs: dict[str, Any]) -> _Call:
        gate_kwargs, call = self._admit(request, kwargs)
        call.ticket = await self._gate.abegin("chat", **gate_kwargs)
        bind_hedge_ticket(call.ticket)
        return call

    # A hedged FallbackLLM below reports the attempt that lost to the inbox each call
    # opens here; its ticket records it as a "hedge" entry (see llm_resilience.fallback).
    def _call(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], _ResponseT],
    ) -> _ResponseT:
        if not self._hedged:
            return super()._call(kind, request, kwargs, invoke)
        with hedge_inbox():
            return super()._call(kind, request, kwargs, invoke)

    async def _acall(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], Awaitable[_ResponseT]],
    ) -> _ResponseT:
        if not self._hedged:
            return await super()._acall(kind, request, kwargs, invoke)
        with hedge_inbox():
            return await super()._acall(kind, request, kwargs, invoke)

    def _stream(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], Iterator[_ResponseT]],
    ) -> Generator[_ResponseT, None, None]:
        stream = super()._stream(kind, request, kwargs, invoke)
        return hedge_inbox_stream(stream) if self._hedged else stream

    def _astream(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], Awaitable[AsyncIterator[_ResponseT]] | AsyncIterator[_ResponseT]],
    ) -> AsyncGenerator[_ResponseT, None]:
        stream = super()._astream(kind, request, kwargs, invoke)
        return ahedge_inbox_stream(stream) if self._hedged else stream

    def _on_chunk(self, context: Any, chunk: AnyResponse) -> None:
        call: _Call = context
        call.tally.add(chunk)

    def _end(self, context: Any, response: AnyResponse | None) -> None:
        call: _Call = context
        assert call.ticket is not None
        if response is None:
            call.ticket.abandon()
            return
        usage, model = self._account(call, response)
        call.ticket.finish(usage, model=model)

    async def _aend(self, context: Any, response: AnyResponse | None) -> None:
        call: _Call = context
        assert call.ticket is not None
        if response is None:
            await call.ticket.aabandon()
            return
        usage, model = self._account(call, response)
        await call.ticket.afinish(usage, model=model)

    def _end_early(self, context: Any, last: AnyResponse | None) -> None:
        call: _Call = context
        assert call.ticket is not None
        usage, model = self._consumed(call, last)
        if usage is None:
            call.ticket.abandon()
        else:
            call.ticket.finish(usage, model=model)

    async def _aend_early(self, context: Any, last: AnyResponse | None) -> None:
        # Runs in the stream's ``finally``, often while its task is being cancelled: the
        # ticket's async writes are shielded, so the entry is kept even if cancelled again.
        call: _Call = context
        assert call.ticket is not None
        usage, model = self._consumed(call, last)
        if usage is None:
            await call.ticket.aabandon()
        else:
            await call.ticket.afinish(usage, model=model)

    def _consumed(self, call: _Call, last: AnyResponse | None) -> tuple[Usage | None, str | None]:
        """What a stream closed early consumed (None: nothing to record), and who served."""
        tally = call.tally
        usage = partial_stream_usage(
            tally.input_tokens,
            tally.output_tokens,
            prompt=call.prompt,
            deltas=tally.deltas,
            delivered_text=tally.text(last) if last is not None else None,
            details=tally.details,
        )
        member = self._member_named(last) if last is not None else None
        served = served_model(tally.model, member)
        # Closed before the stream named who served: the dearest that may have (the
        # inner LLM itself when it is the only one), so the entry is never under-priced.
        if served is None and usage is not None:
            served = dearest_model(self._gate.budget, usage, self._may_serve)
        return usage, served

    def _account(self, call: _Call, response: AnyResponse) -> tuple[Usage, str | None]:
        """The usage to record and the model that served."""
        tally = call.tally
        if tally.started:
            reported_in, reported_out = tally.input_tokens, tally.output_tokens
            details = tally.details
            text, model = tally.text(response), tally.model
        else:
            reported_in, reported_out = reported_tokens(response)
            details = reported_details(response)
            text, model = response_text(response), raw_model(response)
        usage = chat_usage(
            reported_in, reported_out, prompt=call.prompt, response_text=text, details=details
        )
        member = self._member_named(response)
        return usage, served_model(model, member, self.inner.metadata.model_name)

    def _member_named(self, response: AnyResponse) -> str | None:
        """The name of the fallback member that answered (by its path mark), if marked."""
        path = response.additional_kwargs.get(SERVED_BY_KEY)
        chain = find_layer(self.inner, FallbackLLM)
        if chain is not None and isinstance(path, list) and path:
            member = _member_at(chain, path)
            if member is not None:
                return member.metadata.model_name
        return None


class CostTrackedEmbedding(DelegatingEmbedding):
    """An embedding model gated by a spend budget, recording each call's estimated cost.

    Example::

        Settings.embed_model = CostTrackedEmbedding(
            inner=OpenAIEmbedding(),
            budget=CostBudget(embedding_price_per_mtok="0.02", daily_limit=5),
            ledger=ledger,  # shared with the CostTrackedLLM
        )

    One gate and one ledger entry per provider call (a query, a text, or a batch of up
    to ``embed_batch_size`` texts), priced at ``embedding_price_per_mtok`` (or the
    ``prices`` entry of the inner model's ``model_name``). Usage is always estimated
    over the input texts (``cl100k_base``). Options and errors are
    :class:`CostTrackedLLM`'s; the scope is fixed per layer (LlamaIndex's embedding
    calls take no per-call keywords).
    """

    budget: Any = Field(exclude=True, description="The llm_resilience.CostBudget applied.")
    ledger: Any = Field(exclude=True, description="Where spend is recorded and read back.")
    scope: str | None = Field(default=None, description="Budget scope of every call.")

    _gate: BudgetGate = PrivateAttr()

    def __init__(
        self,
        *,
        inner: BaseEmbedding,
        budget: CostBudget,
        ledger: CostLedger | None = None,
        scope: str | None = None,
        **kwargs: Any,
    ) -> None:
        gate = _gate(budget, ledger, scope)
        super().__init__(inner=inner, budget=budget, ledger=gate.ledger, scope=scope, **kwargs)
        self._gate = gate

    @classmethod
    def class_name(cls) -> str:
        return "CostTrackedEmbedding"

    @property
    def gate(self) -> BudgetGate:
        """The budget gate every call of this layer passes."""
        return self._gate

    def _begin(self, kind: EmbeddingKind, texts: list[str]) -> tuple[BudgetTicket, list[str]]:
        ticket = self._gate.begin(
            "embedding",
            scope=self.scope,
            texts=texts,
            model=served_model(self.inner.model_name),
        )
        return ticket, texts

    async def _abegin(
        self, kind: EmbeddingKind, texts: list[str]
    ) -> tuple[BudgetTicket, list[str]]:
        ticket = await self._gate.abegin(
            "embedding",
            scope=self.scope,
            texts=texts,
            model=served_model(self.inner.model_name),
        )
        return ticket, texts

    def _end(self, context: Any, embeddings: list[list[float]] | None) -> None:
        ticket, texts = context
        if embeddings is None:
            ticket.abandon()
        else:
            ticket.finish(embedding_usage(texts), model=served_model(self.inner.model_name))

    async def _aend(self, context: Any, embeddings: list[list[float]] | None) -> None:
        ticket, texts = context
        if embeddings is None:
            await ticket.aabandon()
        else:
            await ticket.afinish(embedding_usage(texts), model=served_model(self.inner.model_name))


@dataclass(slots=True)
class _Call:
    """One admitted chat or completion call: its prompt, ticket and stream tally."""

    prompt: list[tuple[str, str]]
    ticket: BudgetTicket | None = None
    tally: StreamTally = field(default_factory=StreamTally)


def _gate(budget: object, ledger: CostLedger | None, scope: object) -> BudgetGate:
    if not isinstance(budget, CostBudget):
        raise TypeError(f"budget must be a CostBudget(...); got {type(budget).__name__}")
    checks.scope("scope", scope)
    return BudgetGate(budget, ledger)


def _member_at(chain: FallbackLLM, path: list[Any]) -> LLM | None:
    """The member ``path`` names (``[1, 0]``: ``llms[1]``, then that chain's ``llms[0]``)."""
    current: FallbackLLM | None = chain
    member: LLM | None = None
    for index in path:
        if current is None or isinstance(index, bool) or not isinstance(index, int):
            return None
        if not 0 <= index < len(current.llms):
            return None
        member = current.llms[index]
        current = find_layer(member, FallbackLLM)
    return member
