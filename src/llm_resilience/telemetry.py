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
"""

from __future__ import annotations

import threading
from typing import Any, Literal

__all__ = [
    "METER_NAME",
    "RATELIMIT_WAIT",
    "Outcome",
    "Surface",
    "record_rate_limit_wait",
]

METER_NAME = "llm_resilience"
RATELIMIT_WAIT = "llm_resilience.ratelimit.wait.duration"

Surface = Literal["chat", "embedding"]
Outcome = Literal["granted", "rejected", "cancelled", "faulted"]

_lock = threading.Lock()
_instruments: dict[str, Any] = {}


def _meter() -> Any:
    from opentelemetry import metrics

    from llm_resilience import __version__

    return metrics.get_meter(METER_NAME, __version__)


def _histogram(name: str, unit: str, description: str) -> Any:
    instrument = _instruments.get(name)
    if instrument is None:
        with _lock:
            instrument = _instruments.get(name)
            if instrument is None:
                instrument = _meter().create_histogram(name, unit=unit, description=description)
                _instruments[name] = instrument
    return instrument


def record_rate_limit_wait(milliseconds: float, *, surface: str, outcome: Outcome) -> None:
    """Record how long a caller waited for a permit, and how the wait ended."""
    _histogram(RATELIMIT_WAIT, "ms", "Time callers spent waiting for a rate-limit permit.").record(
        milliseconds, {"surface": surface, "outcome": outcome}
    )
