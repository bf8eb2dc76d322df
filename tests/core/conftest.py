"""Fixtures shared by the core tests."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from llm_resilience import telemetry

# The process's one SDK meter provider and its reader, installed by the first test that
# asks: OpenTelemetry lets the global provider be set only once per process.
_installed: dict[str, Any] = {}


def _install() -> Any | None:
    """Install (once) an SDK provider with a delta in-memory reader; None if one is foreign."""
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
    from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader

    current = metrics.get_meter_provider()
    if _installed and current is _installed["provider"]:
        return _installed["reader"]
    if isinstance(current, MeterProvider):
        return None  # someone else's SDK provider: swap it out for the test instead
    delta = AggregationTemporality.DELTA
    reader = InMemoryMetricReader(preferred_temporality={Counter: delta, Histogram: delta})
    provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(provider)
    if metrics.get_meter_provider() is not provider:  # a set-once already spent elsewhere
        return None
    _installed.update(provider=provider, reader=reader)
    return reader


@pytest.fixture
def metric_reader() -> Iterator[Any]:
    """An ``InMemoryMetricReader`` holding only the points recorded during this test.

    Reuses the process-wide SDK provider (delta temporality, drained on entry) when it is
    ours; otherwise swaps a fresh provider in for this test and restores the old one.
    ``telemetry._instruments`` is cleared both ways so instruments bind to the provider
    in effect.
    """
    telemetry._instruments.clear()
    reader = _install()
    if reader is not None:
        reader.get_metrics_data()  # drop whatever earlier tests recorded
        try:
            yield reader
        finally:
            telemetry._instruments.clear()
        return

    from opentelemetry import metrics
    from opentelemetry.metrics import _internal as metrics_globals
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.util._once import Once

    fresh = InMemoryMetricReader()
    saved = (metrics_globals._METER_PROVIDER, metrics_globals._METER_PROVIDER_SET_ONCE)
    metrics_globals._METER_PROVIDER, metrics_globals._METER_PROVIDER_SET_ONCE = None, Once()
    metrics.set_meter_provider(MeterProvider(metric_readers=[fresh]))
    try:
        yield fresh
    finally:
        telemetry._instruments.clear()
        metrics_globals._METER_PROVIDER, metrics_globals._METER_PROVIDER_SET_ONCE = saved


@pytest.fixture
def postgres_schema_url(postgres_url: str) -> Iterator[str]:
    """A URL of the test PostgreSQL whose connections live in a new schema, dropped (with
    its tables) after the test."""
    import uuid

    pytest.importorskip("psycopg")
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    schema = f"ledger_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_url)
    with admin.begin() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
    try:
        url = make_url(postgres_url).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        admin.dispose()


@pytest.fixture
def without_cyclic_gc() -> Iterator[None]:
    """The cyclic GC off: what the test expects freed must be freed by reference counts.

    A provider stream left to the cyclic GC is finalized on whatever thread the GC next
    runs in; when that thread is inside httpcore's connection pool (its lock held),
    closing the stream there deadlocks it (encode/httpcore#990). An attempt's error,
    raised again by the chain, must not tie the attempt's frames into a cycle.
    """
    collecting = gc.isenabled()
    gc.disable()
    yield
    if collecting:
        gc.enable()


def _held_stream(closed: threading.Event) -> Iterator[str]:
    def provider() -> Iterator[str]:
        try:
            yield from ("p0", "p1")
        finally:
            closed.set()

    stream = provider()
    next(stream)
    return stream


@pytest.fixture
def held_stream() -> Callable[[threading.Event], Iterator[str]]:
    """``held_stream(closed)``: a provider's stream, started, for an attempt to hold in
    its locals; ``closed`` is set once it is freed (or closed)."""
    return _held_stream
