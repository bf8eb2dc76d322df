"""Spend as a pandas DataFrame: ledger entries, or a spend report, with exact money.

pandas has no exact decimal dtype, so a frame carries cost twice: ``cost`` holds each
`Decimal` as it was recorded (sum it for the exact spend) and
``cost_float`` the nearest ``float64`` (for ``groupby(...).sum()``, ``resample`` and
plots, where the last digits do not matter).

[`to_dataframe`][] is also on the face (``from llm_resilience import to_dataframe``).
pandas loads only when it is called, so ``import llm_resilience`` never imports it; it
comes with the ``pandas`` extra (``pip install "llm-resilience[pandas]"``), and without
it the call raises ``ImportError`` naming that extra.

Examples:
    >>> from datetime import UTC, datetime
    >>> from decimal import Decimal
    >>> from llm_resilience.ledger import LedgerEntry
    >>> df = to_dataframe([LedgerEntry(datetime(2026, 11, 29, tzinfo=UTC), "chat",
    ...                                1000, 200, Decimal("0.0065"), model="gpt-4o-mini")])
    >>> df.loc[0, "cost"], float(df.loc[0, "cost_float"]), str(df["timestamp"].dtype)
    (Decimal('0.0065'), 0.0065, 'datetime64[ns, UTC]')
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from llm_resilience.ledger._protocol import DETAIL_COLUMNS, LedgerEntry

if TYPE_CHECKING:
    import pandas as pd

    from llm_resilience.ledger import CostLedger
    from llm_resilience.spend import SpendReport

__all__ = ["ENTRY_COLUMNS", "REPORT_COLUMNS", "to_dataframe"]

#: Columns of an entries frame, in order, with their pandas dtypes.
ENTRY_COLUMNS: dict[str, str] = {
    "timestamp": "datetime64[ns, UTC]",
    "kind": "string",
    "model": "string",
    "scope": "string",
    "run_id": "string",
    "thread_id": "string",
    "surface": "string",
    "input_tokens": "int64",
    "output_tokens": "int64",
    "pages": "int64",
    "cache_read_tokens": "int64",
    "cache_write_tokens": "int64",
    "cache_write_1h_tokens": "int64",
    "reasoning_tokens": "int64",
    "estimated": "bool",
    "cost": "object",
    "cost_float": "float64",
    "entry_id": "string",
}

#: Columns of a report frame, in order, with their pandas dtypes.
REPORT_COLUMNS: dict[str, str] = {
    "key": "string",
    "cost": "object",
    "cost_float": "float64",
    "calls": "int64",
    "input_tokens": "int64",
    "output_tokens": "int64",
    "estimated_calls": "int64",
    "estimated_share": "float64",
}


def _pandas() -> Any:
    try:
        import pandas
    except ImportError as error:
        raise ImportError(
            "to_dataframe needs pandas, which comes with the pandas extra: "
            'pip install "llm-resilience[pandas]"'
        ) from error
    return pandas


def to_dataframe(source: Iterable[LedgerEntry] | SpendReport | CostLedger) -> pd.DataFrame:
    """A DataFrame of ledger entries (one row each) or of a spend report (one row per row).

    ``from llm_resilience import to_dataframe``. Pass a ledger itself for all of its
    entries, or ``ledger.entries(since, until, scope=..., model=..., kind=..., run=...,
    thread=...)`` for some (``run_id`` and ``thread_id`` are columns: group an agent's
    spend by run with ``df.groupby("run_id")``).

    Examples:
        >>> from datetime import UTC, datetime
        >>> from decimal import Decimal
        >>> from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry
        >>> ledger = InMemoryCostLedger()
        >>> ledger.record(LedgerEntry(datetime(2026, 11, 2, tzinfo=UTC), "ocr", pages=12,
        ...                           cost=Decimal("0.018"), model="mistral-ocr"))
        >>> to_dataframe(ledger)[["kind", "pages", "cost"]].to_dict("records")
        [{'kind': 'ocr', 'pages': 12, 'cost': Decimal('0.018')}]

    Entries give the columns of `ENTRY_COLUMNS`: ``timestamp`` as
    ``datetime64[ns, UTC]``, text as the ``string`` dtype (``<NA>`` when missing),
    counts as ``int64``, ``estimated`` as ``bool``, ``cost`` as exact ``Decimal`` objects
    and ``cost_float`` as ``float64``. A ``SpendReport`` gives `REPORT_COLUMNS`,
    with the report's ``by`` in ``df.attrs["by"]`` (its total row is not a row of the
    frame: it is ``df["cost"]``'s exact sum). No input gives an empty frame with the same
    columns and dtypes. Anything but a report or ``LedgerEntry`` objects raises
    ``TypeError``; without pandas, ``ImportError`` says which extra to install.
    """
    from llm_resilience.spend import SpendReport

    pandas = _pandas()
    if isinstance(source, SpendReport):
        return _report_frame(pandas, source)
    if not isinstance(source, Iterable) and callable(getattr(source, "entries", None)):
        source = source.entries()  # a ledger: every entry it holds, oldest first
    if isinstance(source, (str, bytes)) or not isinstance(source, Iterable):
        raise TypeError(
            "to_dataframe takes a ledger, an iterable of LedgerEntry or a SpendReport, "
            f"got {type(source).__name__}"
        )
    entries = list(source)
    for entry in entries:
        if not isinstance(entry, LedgerEntry):
            raise TypeError(
                "to_dataframe takes a ledger, an iterable of LedgerEntry or a SpendReport, "
                f"got an item of type {type(entry).__name__}"
            )
    columns: dict[str, list[Any]] = {
        "timestamp": [entry.timestamp for entry in entries],
        "kind": [entry.kind for entry in entries],
        "model": [entry.model for entry in entries],
        "scope": [entry.scope for entry in entries],
        "run_id": [entry.run_id for entry in entries],
        "thread_id": [entry.thread_id for entry in entries],
        "surface": [entry.surface for entry in entries],
        "input_tokens": [entry.input_tokens for entry in entries],
        "output_tokens": [entry.output_tokens for entry in entries],
        "pages": [entry.pages for entry in entries],
        **{name: [getattr(entry, name) for entry in entries] for name in DETAIL_COLUMNS},
        "estimated": [entry.estimated for entry in entries],
        "cost": [entry.cost for entry in entries],
        "cost_float": [float(entry.cost) for entry in entries],
        "entry_id": [entry.entry_id for entry in entries],
    }
    return _typed(pandas, columns, ENTRY_COLUMNS)


def _report_frame(pandas: Any, report: SpendReport) -> pd.DataFrame:
    rows = list(report.rows)
    columns: dict[str, list[Any]] = {
        "key": [row.key for row in rows],
        "cost": [row.cost for row in rows],
        "cost_float": [float(row.cost) for row in rows],
        "calls": [row.calls for row in rows],
        "input_tokens": [row.input_tokens for row in rows],
        "output_tokens": [row.output_tokens for row in rows],
        "estimated_calls": [row.estimated_calls for row in rows],
        "estimated_share": [float(row.estimated_share) for row in rows],
    }
    frame = _typed(pandas, columns, REPORT_COLUMNS)
    frame.attrs["by"] = report.by
    return frame


def _typed(pandas: Any, columns: dict[str, list[Any]], dtypes: dict[str, str]) -> pd.DataFrame:
    series: dict[str, Any] = {}
    for name, dtype in dtypes.items():
        values = columns[name]
        if name == "timestamp":
            series[name] = pandas.Series(
                pandas.to_datetime(values, utc=True), dtype=dtype, name=name
            )
        elif dtype == "string":
            series[name] = pandas.Series(values, dtype=pandas.StringDtype(), name=name)
        else:
            series[name] = pandas.Series(values, dtype=dtype, name=name)
    frame: pd.DataFrame = pandas.DataFrame(series)
    return frame
