"""``CostTrackedLLM`` and ``CostTrackedEmbedding``: LlamaIndex layers over a spend budget.

The adapter only translates: limits, windows, prices, what counts as reported usage and
how missing usage is estimated are the core's (`llm_resilience.budget`,
`llm_resilience.usage`). Each call passes the budget gate before the inner call
(a spent budget raises [`BudgetExceededError`][llm_resilience.BudgetExceededError] and the inner
model is never called) and records one ledger entry after it:

* chat and completion: the provider's usage when the response reports both counts
  (OpenAI-shaped ``raw.usage``/``additional_kwargs``, Anthropic-shaped ``raw["usage"]``
  or ``message.additional_kwargs["usage"]``), else both estimated over the request
  messages and the answer, flagged ``estimated``;
* streams: gated on first iteration, recorded once after the last chunk from the usage
  the chunks reported, else estimated from the accumulated text. A stream its consumer
  closes early (``break``, ``close()``/``aclose()``, garbage collection) or cancels
  after chunks arrived records what it consumed
  (`partial_stream_usage`: the usage reported so far, else
  the prompt and the delivered text estimated); one that failed with an error records
  nothing (a failover inside a [`FallbackLLM`][] below is
  not seen here);
* a hedged ``FallbackLLM`` below (``hedge_after``): the attempt that lost is recorded as
  its own entry of kind ``"hedge"`` when its provider reported usage;
* embeddings: always estimated over the input texts.

Every entry names the model that served, by the core's rule
(`served_model`): the provider's ``raw.model``, else the
member of a [`FallbackLLM`][] below that answered, else the
inner LLM's ``metadata.model_name``; LlamaIndex's placeholder ``"unknown"`` is no name,
so an unnamed model (embedding models included) records None. A stream closed early
before naming its model records the dearest that may have served. A failed call
records nothing.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator
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
    llm_name,
    num_output,
    plain_report,
    prompt_pairs,
    raw_model,
    reported,
    response_text,
)

from llm_resilience.budget import BudgetGate, CostBudget
from llm_resilience.ledger import CostLedger
from llm_resilience.metering import BUDGET_SCOPE_KWARG, Meter, MeteredCall
from llm_resilience.served import SERVED_BY_KEY
from llm_resilience.usage import (
    NO_DETAILS,
    Usage,
    embedding_usage,
    estimated_usage,
    partial_stream_usage,
    reported_usage,
)

__all__ = ["BUDGET_SCOPE_KWARG", "CostTrackedEmbedding", "CostTrackedLLM"]

_ResponseT = TypeVar("_ResponseT", ChatResponse, CompletionResponse)


class MeteredLLM(DelegatingLLM):
    """Base of the LLM layers that meter each call: what a response, a stream or a stream
    closed early used, read from LlamaIndex's responses and settled on the call object
    ``_begin`` returns (a `_Call` over anything shaped as the core's
    [`MeteredCall`][llm_resilience.metering.MeteredCall]). Subclasses define ``_begin``,
    ``_abegin`` and ``_meter`` (the [`Meter`][llm_resilience.metering.Meter] that names
    who served and opens a hedged chain's inbox).
    """

    _meter: Meter = PrivateAttr()

    def __init__(self, *, inner: LLM, **kwargs: Any) -> None:
        super().__init__(inner=inner, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "MeteredLLM"

    # A hedged FallbackLLM below reports the attempt that lost to the inbox each call
    # opens here; its ticket records it as a "hedge" entry (see llm_resilience.metering).
    def _call(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], _ResponseT],
    ) -> _ResponseT:
        meter = _meter_of(self)
        if not meter.hedged:  # no inbox to open (`Meter.inbox`): no context entered
            return super()._call(kind, request, kwargs, invoke)
        with meter.inbox():
            return super()._call(kind, request, kwargs, invoke)

    async def _acall(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], Awaitable[_ResponseT]],
    ) -> _ResponseT:
        meter = _meter_of(self)
        if not meter.hedged:  # no inbox to open (`Meter.inbox`): no context entered
            return await super()._acall(kind, request, kwargs, invoke)
        with meter.inbox():
            return await super()._acall(kind, request, kwargs, invoke)

    def _stream(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], Iterator[_ResponseT]],
    ) -> Generator[_ResponseT, None, None]:
        stream = super()._stream(kind, request, kwargs, invoke)
        return _meter_of(self).stream(stream)  # type: ignore[return-value]

    def _astream(
        self,
        kind: CallKind,
        request: Request,
        kwargs: dict[str, Any],
        invoke: Callable[[], Awaitable[AsyncIterator[_ResponseT]] | AsyncIterator[_ResponseT]],
    ) -> AsyncGenerator[_ResponseT, None]:
        stream = super()._astream(kind, request, kwargs, invoke)
        return _meter_of(self).astream(stream)  # type: ignore[return-value]

    def _on_chunk(self, context: Any, chunk: AnyResponse) -> None:
        call: _Call = context
        tally = call._tally  # made on the first chunk (`_Call.tally`)
        (tally if tally is not None else call.tally).add(chunk)

    def _end(self, context: Any, response: AnyResponse | None) -> None:
        call: _Call = context
        if response is None:
            call.metered.abandon()
            return
        usage, named, mark = self._account(call, response)
        call.metered.settle(usage, named=named, mark=mark)

    async def _aend(self, context: Any, response: AnyResponse | None) -> None:
        call: _Call = context
        if response is None:
            await call.metered.aabandon()
            return
        usage, named, mark = self._account(call, response)
        await call.metered.asettle(usage, named=named, mark=mark)

    def _end_early(self, context: Any, last: AnyResponse | None) -> None:
        call: _Call = context
        usage = self._consumed(call, last)
        call.metered.end_early(usage, named=call.tally.model, mark=_mark(last))

    async def _aend_early(self, context: Any, last: AnyResponse | None) -> None:
        call: _Call = context
        usage = self._consumed(call, last)
        await call.metered.aend_early(usage, named=call.tally.model, mark=_mark(last))

    def _consumed(self, call: _Call, last: AnyResponse | None) -> Usage | None:
        """What a stream closed early consumed (None: nothing to record)."""
        tally = call.tally
        return partial_stream_usage(
            tally.input_tokens,
            tally.output_tokens,
            prompt=call.metered.prompt,
            deltas=tally.deltas,
            delivered_text=tally.text(last) if last is not None else None,
            details=tally.details,
        )

    def _account(self, call: _Call, response: AnyResponse) -> tuple[Usage, str | None, object]:
        """The usage to record, the model the provider says served, and the path mark a
        ``FallbackLLM`` below put on the answer."""
        tally = call.streamed
        plain = None if tally is not None else plain_report(response)
        reported_in: int | None
        reported_out: int | None
        if plain is not None:  # the usual report: no ``additional_kwargs``, so no mark
            reported_in, reported_out, model = plain
            details, mark = NO_DETAILS, None
        elif tally is not None:
            reported_in, reported_out = tally.input_tokens, tally.output_tokens
            details, model, mark = tally.details, tally.model, _mark(response)
        else:
            reported_in, reported_out, details = reported(response)
            model, mark = raw_model(response), _mark(response)
        # A report needs only to know whether the call had a prompt: the prompt's and the
        # answer's texts are read only for an estimate (`chat_usage`'s rule, in two steps).
        stand_in = _SOME_PROMPT if call.prompted else ()
        usage = reported_usage(reported_in, reported_out, prompt=stand_in, details=details)
        if usage is None:  # no report (the prompt's emptiness is the stand-in's)
            text = tally.text(response) if tally is not None else response_text(response)
            usage = estimated_usage(call.metered.prompt, text)
        return usage, model, mark


class CostTrackedLLM(MeteredLLM):
    """An LLM that refuses calls once a spend limit is reached, and records each call's cost.

    Example:

    ```python
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
    ```

    ``budget`` is a [`CostBudget`][]; this layer keeps one
    [`BudgetGate`][] over it. ``ledger`` may be shared by every
    layer of the process (None: a new in-memory ledger, with a warning naming
    ``SqlCostLedger``). ``scope`` (a tenant, a user, a hash of a key; None: unscoped) applies to
    every call; a call's ``budget_scope=`` keyword overrides it and is never passed to
    the inner LLM. Windows are UTC days and months; money is exact ``Decimal``. In strict
    mode the hold covers every LLM below that may serve, each up to its own output cap
    (`output_cap`: the call's ``max_tokens``,
    ``max_completion_tokens`` or ``max_output_tokens``, else the LLM's own field of those
    names, else its ``metadata.num_output``, else 4,096), at its own price.

    Raises ``TypeError`` for a ``budget`` that is not a ``CostBudget``, an empty or
    non-text ``scope``, an ``inner`` that is not an ``LLM``, or a keyword it does not
    take (naming the closest); calls raise
    [`BudgetExceededError`][llm_resilience.BudgetExceededError] (``window``, ``limit``,
    ``spend``) once spend has reached a limit. Tools, structured output and metadata
    pass through to ``inner``.
    """

    budget: Any = Field(exclude=True, description="The llm_resilience.CostBudget applied.")
    ledger: Any = Field(exclude=True, description="Where spend is recorded and read back.")
    scope: str | None = Field(default=None, description="Budget scope of every call.")

    _call_options = (BUDGET_SCOPE_KWARG,)

    def __init__(
        self,
        *,
        inner: LLM,
        budget: CostBudget,
        ledger: CostLedger | None = None,
        scope: str | None = None,
        **kwargs: Any,
    ) -> None:
        meter = Meter(
            budget,
            ledger,
            stack=inner,
            name_of=llm_name,
            documented_cap=num_output,
            scope=scope,
        )
        super().__init__(
            inner=inner, budget=budget, ledger=meter.gate.ledger, scope=scope, **kwargs
        )
        self._meter = meter

    @classmethod
    def class_name(cls) -> str:
        return "CostTrackedLLM"

    @property
    def gate(self) -> BudgetGate:
        """The budget gate every call of this layer passes."""
        return self._meter.gate

    # -- hooks ----------------------------------------------------------------------------

    # The prompt's pairs are made only if read: for a strict hold or an estimate.
    def _begin(self, kind: CallKind, request: Request, kwargs: dict[str, Any]) -> _Call:
        metered = _meter_of(self).begin(kwargs, prompt=lambda: prompt_pairs(request))
        return _Call(metered, prompted=_prompted(request))

    async def _abegin(self, kind: CallKind, request: Request, kwargs: dict[str, Any]) -> _Call:
        metered = await _meter_of(self).abegin(kwargs, prompt=lambda: prompt_pairs(request))
        return _Call(metered, prompted=_prompted(request))


class CostTrackedEmbedding(DelegatingEmbedding):
    """An embedding model gated by a spend budget, recording each call's estimated cost.

    Example:

    ```python
    Settings.embed_model = CostTrackedEmbedding(
        inner=OpenAIEmbedding(),
        budget=CostBudget(embedding_price_per_mtok="0.02", daily_limit=5),
        ledger=ledger,  # shared with the CostTrackedLLM
    )
    ```

    One gate and one ledger entry per provider call (a query, a text, or a batch of up
    to ``embed_batch_size`` texts), priced at ``embedding_price_per_mtok`` (or the
    ``prices`` entry of the inner model's ``model_name``). Usage is always estimated
    over the input texts (``cl100k_base``). Options and errors are
    [`CostTrackedLLM`][]'s; the scope is fixed per layer (LlamaIndex's embedding
    calls take no per-call keywords).
    """

    budget: Any = Field(exclude=True, description="The llm_resilience.CostBudget applied.")
    ledger: Any = Field(exclude=True, description="Where spend is recorded and read back.")
    scope: str | None = Field(default=None, description="Budget scope of every call.")

    _meter: Meter = PrivateAttr()

    def __init__(
        self,
        *,
        inner: BaseEmbedding,
        budget: CostBudget,
        ledger: CostLedger | None = None,
        scope: str | None = None,
        **kwargs: Any,
    ) -> None:
        meter = Meter(
            budget,
            ledger,
            stack=inner,
            name_of=lambda model: getattr(model, "model_name", None),
            scope=scope,
            surface="embedding",
        )
        super().__init__(
            inner=inner, budget=budget, ledger=meter.gate.ledger, scope=scope, **kwargs
        )
        self._meter = meter

    @classmethod
    def class_name(cls) -> str:
        return "CostTrackedEmbedding"

    @property
    def gate(self) -> BudgetGate:
        """The budget gate every call of this layer passes."""
        return self._meter.gate

    def _begin(self, kind: EmbeddingKind, texts: list[str]) -> tuple[MeteredCall, list[str]]:
        return _meter_of(self).begin(texts=texts), texts

    async def _abegin(self, kind: EmbeddingKind, texts: list[str]) -> tuple[MeteredCall, list[str]]:
        return await _meter_of(self).abegin(texts=texts), texts

    def _end(self, context: Any, embeddings: list[list[float]] | None) -> None:
        call, texts = context
        if embeddings is None:
            call.abandon()
        else:
            call.settle(embedding_usage(texts))

    async def _aend(self, context: Any, embeddings: list[list[float]] | None) -> None:
        call, texts = context
        if embeddings is None:
            await call.aabandon()
        else:
            await call.asettle(embedding_usage(texts))


class _Call:
    """One admitted chat or completion call: its metered call and stream tally (made on
    the first chunk: a call that is not a stream never needs one)."""

    __slots__ = ("_prompted", "_tally", "metered")

    def __init__(self, metered: MeteredCall, *, prompted: bool | None = None) -> None:
        self.metered = metered
        self._prompted = prompted
        self._tally: StreamTally | None = None

    @property
    def prompted(self) -> bool:
        """Whether the call had a prompt (given, else read from the metered call)."""
        if self._prompted is None:
            self._prompted = bool(self.metered.prompt)
        return self._prompted

    @property
    def tally(self) -> StreamTally:
        """What the stream's chunks reported so far."""
        tally = self._tally
        if tally is None:
            tally = self._tally = StreamTally()
        return tally

    @property
    def streamed(self) -> StreamTally | None:
        """The tally, once a chunk was added to it; None for a call that did not stream."""
        tally = self._tally
        return tally if tally is not None and tally.started else None


def _prompted(request: Request) -> bool:
    """Whether `prompt_pairs` of ``request`` is non-empty: a completion prompt always
    makes one user turn, chat messages one pair each."""
    return isinstance(request, str) or bool(request)


#: A stand-in prompt of one message: whether a provider's counts are a report depends
#: only on whether the prompt is empty (`reported_usage`).
_SOME_PROMPT = (("", ""),)


def _meter_of(layer: MeteredLLM | CostTrackedEmbedding) -> Meter:
    """``layer``'s meter, read from pydantic's private state directly: ``layer._meter``
    fails the normal lookup and then probes pydantic's ``__getattr__`` (about 2 µs a call)."""
    state = layer.__pydantic_private__
    assert state is not None  # set in __init__
    meter: Meter = state["_meter"]
    return meter


def _mark(response: AnyResponse | None) -> object:
    """The path mark a ``FallbackLLM`` below put on ``response``, if any."""
    return response.additional_kwargs.get(SERVED_BY_KEY) if response is not None else None
