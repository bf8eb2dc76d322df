"""Metrics through ``opentelemetry-api`` only: the SDK (and an exporter) is the user's choice.

Instruments are created lazily from the global meter provider, so importing this module
costs nothing and a provider installed after import is still honoured (the API's proxy
meter forwards to it). Without an SDK every call is a no-op.

* ``llm_resilience.ratelimit.wait.duration``: histogram, ms; attributes ``surface``
  (chat, embedding) and ``outcome`` (granted, rejected, cancelled, faulted).
* ``llm_resilience.llm.tokens``: counter, tokens; attributes ``direction`` (in, out),
  ``surface``, ``gen_ai.operation.name``, ``gen_ai.token.type``.
* ``llm_resilience.llm.cost``: counter, in the prices' currency; attributes ``surface``,
  ``gen_ai.operation.name``.
* ``llm_resilience.budget.unpriced``: counter, ledger entries priced by a guess: the
  budget's surface prices (``rule=default``) or an alias priced by its one dated key
  (``rule=alias``); attributes ``surface``, ``rule`` and ``gen_ai.request.model`` (the
  served name, ``""`` when none was named).
* ``llm_resilience.ledger.pending``: up-down counter, ledger writes waiting in memory for
  the database to answer again; attribute ``backend`` (sqlite, postgresql).
* ``llm_resilience.ledger.dropped``: counter, pending writes given up (the queue was full,
  or the database refused the write); attribute ``backend``.
* ``llm_resilience.fallback.circuit.state``: observable gauge, one point per member of
  every live fallback chain that has a ``Cooldown``: 0 closed, 1 half-open (a trial call
  is due), 2 open (skipped); attributes ``chain`` (a number per chain in this process)
  and ``client`` (the member's index).
* ``llm_resilience.fallback.circuit.failures``: observable gauge, transient failures
  counted in each member's current window; same attributes.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, Protocol

__all__ = [
    "BUDGET_UNPRICED",
    "CIRCUIT_FAILURES",
    "CIRCUIT_STATE",
    "LEDGER_DROPPED",
    "LEDGER_PENDING",
    "LLM_COST",
    "LLM_TOKENS",
    "METER_NAME",
    "RATELIMIT_WAIT",
    "Outcome",
    "Surface",
    "record_guessed_price",
    "record_ledger_dropped",
    "record_ledger_pending",
    "record_llm_usage",
    "record_circuit_opening",
    "record_rate_limit_wait",
    "watch_circuit",
]

METER_NAME = "llm_resilience"
RATELIMIT_WAIT = "llm_resilience.ratelimit.wait.duration"
LLM_TOKENS = "llm_resilience.llm.tokens"
LLM_COST = "llm_resilience.llm.cost"
BUDGET_UNPRICED = "llm_resilience.budget.unpriced"
LEDGER_PENDING = "llm_resilience.ledger.pending"
LEDGER_DROPPED = "llm_resilience.ledger.dropped"
CIRCUIT_STATE = "llm_resilience.fallback.circuit.state"
CIRCUIT_FAILURES = "llm_resilience.fallback.circuit.failures"
CIRCUIT_OPENINGS = "llm_resilience.fallback.circuit.openings"

Surface = Literal["chat", "embedding"]
Outcome = Literal["granted", "rejected", "cancelled", "faulted"]

_lock = threading.Lock()
_instruments: dict[str, Any] = {}


def _meter() -> Any:
    from importlib.metadata import version

    from opentelemetry import metrics

    # The distribution's version, read here: the package face sits above every module.
    return metrics.get_meter(METER_NAME, version("llm-resilience"))


def _instrument(
    kind: Literal["histogram", "counter", "updowncounter"], name: str, unit: str, description: str
) -> Any:
    instrument = _instruments.get(name)
    if instrument is None:
        with _lock:
            instrument = _instruments.get(name)
            if instrument is None:
                meter = _meter()
                create = {
                    "histogram": meter.create_histogram,
                    "counter": meter.create_counter,
                    "updowncounter": meter.create_up_down_counter,
                }[kind]
                instrument = create(name, unit=unit, description=description)
                _instruments[name] = instrument
    return instrument


def _dropped(instrument: Any) -> bool:
    """Whether ``instrument`` is the API's proxy with no SDK behind it yet, which drops
    every point: then a caller need not build one. Installing a provider later gives the
    proxy its real instrument, and points flow from then on. An instrument of any other
    kind (an SDK's own) is never taken for dropped."""
    return getattr(instrument, "_real_instrument", instrument) is None


def _histogram(name: str, unit: str, description: str) -> Any:
    return _instrument("histogram", name, unit, description)


def record_rate_limit_wait(milliseconds: float, *, surface: str, outcome: Outcome) -> None:
    """Record how long a caller waited for a permit, and how the wait ended."""
    histogram = _histogram(
        RATELIMIT_WAIT, "ms", "Time callers spent waiting for a rate-limit permit."
    )
    if not _dropped(histogram):
        histogram.record(milliseconds, {"surface": surface, "outcome": outcome})


# OpenTelemetry GenAI semantic conventions name the operation "embeddings" (plural).
_OPERATION = {"chat": "chat", "embedding": "embeddings"}


def record_llm_usage(
    *, surface: Surface, input_tokens: int, output_tokens: int, cost: Decimal
) -> None:
    """Count one finished call's tokens and cost.

    ``llm_resilience.llm.tokens`` gets ``input_tokens`` with ``direction=in`` and, for
    chat, ``output_tokens`` with ``direction=out``; ``llm_resilience.llm.cost`` gets
    ``cost`` (as a float: metrics are for dashboards, the ledger is the exact record).
    """
    # `_instrument` and `_dropped`, written out for a made instrument (every call's path).
    tokens = _instruments.get(LLM_TOKENS)
    if tokens is None:
        tokens = _instrument("counter", LLM_TOKENS, "{token}", "Tokens consumed by LLM calls.")
    if getattr(tokens, "_real_instrument", tokens) is None:
        return
    attributes = _USAGE_ATTRIBUTES[surface]
    tokens.add(input_tokens, attributes.tokens_in)
    if surface == "chat":
        tokens.add(output_tokens, attributes.tokens_out)
    _instrument(
        "counter", LLM_COST, "{currency}", "Cost of LLM calls, in the prices' currency."
    ).add(float(cost), attributes.cost)


class _UsageAttributes(NamedTuple):
    """The attributes of one surface's usage points, built once (they never vary)."""

    tokens_in: Mapping[str, str]
    tokens_out: Mapping[str, str]
    cost: Mapping[str, str]


def _usage_attributes(surface: Surface) -> _UsageAttributes:
    operation = _OPERATION[surface]
    common = {"surface": surface, "gen_ai.operation.name": operation}
    return _UsageAttributes(
        MappingProxyType({"direction": "in", **common, "gen_ai.token.type": "input"}),
        MappingProxyType({"direction": "out", **common, "gen_ai.token.type": "output"}),
        MappingProxyType(common),
    )


_USAGE_ATTRIBUTES = {surface: _usage_attributes(surface) for surface in ("chat", "embedding")}


def record_guessed_price(*, model: str | None, rule: str, surface: str) -> None:
    """Count one ledger entry priced by a guess (``rule``: ``default`` or ``alias``)."""
    counter = _instruments.get(BUDGET_UNPRICED)  # `_instrument`, once it is made
    if counter is None:
        counter = _instrument(
            "counter",
            BUDGET_UNPRICED,
            "{entry}",
            "Ledger entries priced by the surface prices or an alias's one dated key.",
        )
    if getattr(counter, "_real_instrument", counter) is not None:  # not `_dropped`
        counter.add(1, _guessed_attributes(surface, rule, model or ""))


@functools.lru_cache(maxsize=1024)  # a process names few models; a bound all the same
def _guessed_attributes(surface: str, rule: str, model: str) -> Mapping[str, str]:
    return MappingProxyType({"surface": surface, "rule": rule, "gen_ai.request.model": model})


def record_ledger_pending(change: int, *, backend: str) -> None:
    """Add ``change`` to the ledger writes pending: +1 per write queued, minus those
    written or dropped."""
    _instrument(
        "updowncounter",
        LEDGER_PENDING,
        "{entry}",
        "Ledger writes waiting in memory for the database to answer.",
    ).add(change, {"backend": backend})


def record_ledger_dropped(count: int, *, backend: str) -> None:
    """Count ``count`` pending ledger writes given up (queue full, or refused)."""
    _instrument(
        "counter", LEDGER_DROPPED, "{entry}", "Pending ledger writes given up, never written."
    ).add(count, {"backend": backend})


# -- circuit state -----------------------------------------------------------------------


class _MemberState(Protocol):
    @property
    def client(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def failures(self) -> int: ...


class _Circuit(Protocol):
    chain_id: int

    def health(self) -> Sequence[_MemberState]: ...


_CIRCUIT_LEVEL = {"closed": 0, "half_open": 1, "open": 2}
_circuits: weakref.WeakSet[Any] = weakref.WeakSet()
_circuit_gauges_made = False


def watch_circuit(circuit: _Circuit) -> None:
    """Report ``circuit``'s members in the circuit gauges for as long as it lives.

    The gauges are observed, not recorded: a metric reader asks for them at each
    collection, and a chain that was garbage-collected simply stops appearing.
    """
    global _circuit_gauges_made
    _circuits.add(circuit)
    if _circuit_gauges_made:
        return
    with _lock:
        if _circuit_gauges_made:
            return
        meter = _meter()
        meter.create_observable_gauge(
            CIRCUIT_STATE,
            callbacks=[_observe_states],
            unit="1",
            description="Fallback member circuit: 0 closed, 1 half-open, 2 open.",
        )
        meter.create_observable_gauge(
            CIRCUIT_FAILURES,
            callbacks=[_observe_failures],
            unit="{failure}",
            description="Transient failures counted in each fallback member's window.",
        )
        _circuit_gauges_made = True


def record_circuit_opening(attributes: Mapping[str, str | int], *, view: str) -> None:
    """Count one opening of a member's circuit: ``view="fleet"`` once for the fleet (by
    the worker whose failure opened it, with the member's shared key), ``"local"`` by a
    process's own breaker."""
    _instrument(
        "counter",
        CIRCUIT_OPENINGS,
        "{opening}",
        "Times a fallback member's circuit opened (skipped until its cooldown ends).",
    ).add(1, {**attributes, "view": view})


def _members() -> Iterator[tuple[dict[str, int | str], _MemberState]]:
    for circuit in list(_circuits):
        for member in circuit.health():
            attributes: dict[str, int | str] = {"chain": circuit.chain_id, "client": member.client}
            key = getattr(member, "key", None)
            if key is not None:
                attributes["member"] = key
            yield attributes, member


def _observe_states(_options: Any) -> Iterator[Any]:
    from opentelemetry.metrics import Observation

    for attributes, member in _members():
        yield Observation(_CIRCUIT_LEVEL[member.state], attributes)


def _observe_failures(_options: Any) -> Iterator[Any]:
    from opentelemetry.metrics import Observation

    for attributes, member in _members():
        yield Observation(member.failures, attributes)
