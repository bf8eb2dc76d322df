"""The SQL ledger's PostgreSQL writes: one statement per record, and per batch.

A record inserts its entry and adds its cost to its totals in one statement (a
data-modifying ``WITH``), atomic without a transaction, so one round trip stores it; a
batch (write-behind's, or writes kept during an outage) is one statement too, its columns
sent as arrays (``unnest``). Both lock the totals in key order, as every writer does, so
writers of any number of processes never wait for each other in a cycle. Each total is
spread over ``POSTGRES_TOTALS_SHARDS`` rows, one chosen at random per statement.

The statements run through SQLAlchemy (``record_entry``, ``record_entries``) or, as text
for psycopg's own parameters (``psycopg_statements``), on the connections the ledger
keeps itself for its per-call operations. Tables and reads are in ``_schema``.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, bindparam, text
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import TextClause

from llm_resilience.ledger._protocol import (
    DETAIL_COLUMNS,
    RUN_COLUMNS,
    LedgerEntry,
    Window,
    window_key,
)
from llm_resilience.ledger._schema import (
    POSTGRES_TOTALS_SHARDS,
    Money,
    UtcTime,
    entry_columns,
    spends_parameters,
    spends_statement,
)

__all__ = [
    "batch_parameters",
    "psycopg_spends",
    "psycopg_statements",
    "record_entries",
    "record_entry",
    "record_parameters",
]


def _postgres_record_statement(scoped: bool) -> TextClause:
    """Insert an entry and add its cost to its totals in one statement: one round trip,
    atomic without a transaction. An entry whose id is already stored inserts nothing and
    adds nothing. Totals are locked in key order, so two writers never wait for each other
    in a cycle."""
    # '' is GLOBAL_SCOPE.
    totals = "(:day, ''), (:month, '')" + (", (:day, :scope), (:month, :scope)" if scoped else "")
    return text(
        f"""
        WITH entry AS (
            INSERT INTO cost_ledger ("timestamp", kind, input_tokens, output_tokens, cost,
                                     pages, model, estimated, surface, scope, entry_id,
                                     cache_read_tokens, cache_write_tokens,
                                     cache_write_1h_tokens, reasoning_tokens,
                                     run_id, thread_id)
            VALUES (:timestamp, :kind, :input_tokens, :output_tokens, :cost,
                    :pages, :model, :estimated, :surface, :scope, :entry_id,
                    :cache_read_tokens, :cache_write_tokens,
                    :cache_write_1h_tokens, :reasoning_tokens,
                    :run_id, :thread_id)
            ON CONFLICT (entry_id) DO NOTHING
            RETURNING cost
        )
        INSERT INTO cost_ledger_totals (window_key, scope, shard, total)
        SELECT totals.window_key, totals.scope, :shard, entry.cost
        FROM entry CROSS JOIN (VALUES {totals}) AS totals (window_key, scope)
        ORDER BY totals.window_key, totals.scope
        ON CONFLICT (window_key, scope, shard)
        DO UPDATE SET total = cost_ledger_totals.total + EXCLUDED.total
        """
    ).bindparams(
        bindparam("timestamp", type_=UtcTime()),
        bindparam("cost", type_=Money()),
        bindparam("estimated", type_=Boolean()),
    )


_POSTGRES_RECORD = {
    False: _postgres_record_statement(False),
    True: _postgres_record_statement(True),
}
#: The columns of ``cost_ledger`` a write fills, and the array type each is sent as.
_POSTGRES_COLUMNS = (
    ("timestamp", "timestamptz"),
    ("kind", "text"),
    ("input_tokens", "bigint"),
    ("output_tokens", "bigint"),
    ("cost", "numeric"),
    ("pages", "bigint"),
    ("model", "text"),
    ("estimated", "boolean"),
    ("surface", "text"),
    ("scope", "text"),
    ("entry_id", "text"),
    *((name, "bigint") for name in DETAIL_COLUMNS),
    *((name, "text") for name in RUN_COLUMNS),
)


def _postgres_batch_statement() -> TextClause:
    """Insert a batch of entries and add their costs to their totals in one statement.

    Each column comes as one array (``unnest``), with the day and month key of each
    entry beside them. Entries whose id is already stored insert nothing and add
    nothing. The costs are summed per total first (one upsert may not touch a row twice),
    and the totals are then locked in key order, as by a single record
    (`_postgres_record_statement`): writers of batches and of single entries, in any
    number of processes, take the totals' row locks in one order and never deadlock.
    """
    columns = ", ".join(f'"{name}"' for name, _ in _POSTGRES_COLUMNS)
    arrays = ", ".join(f"CAST(:{name} AS {kind}[])" for name, kind in _POSTGRES_COLUMNS)
    # '' is GLOBAL_SCOPE; a NULL scope adds to the global totals only.
    return text(
        f"""
        WITH batch AS (
            SELECT * FROM unnest({arrays}, CAST(:day AS text[]), CAST(:month AS text[]))
            AS batch ({columns}, day, month)
        ),
        entry AS (
            INSERT INTO cost_ledger ({columns})
            SELECT {columns} FROM batch
            ON CONFLICT (entry_id) DO NOTHING
            RETURNING entry_id
        ),
        added AS (
            SELECT totals.window_key, totals.scope, sum(batch.cost) AS total
            FROM batch CROSS JOIN LATERAL (
                VALUES (batch.day, ''), (batch.month, ''),
                       (batch.day, batch.scope), (batch.month, batch.scope)
            ) AS totals (window_key, scope)
            WHERE totals.scope IS NOT NULL
              AND (batch.entry_id IS NULL OR batch.entry_id IN (SELECT entry_id FROM entry))
            GROUP BY totals.window_key, totals.scope
        )
        INSERT INTO cost_ledger_totals (window_key, scope, shard, total)
        SELECT window_key, scope, :shard, total FROM added
        ORDER BY window_key, scope
        ON CONFLICT (window_key, scope, shard)
        DO UPDATE SET total = cost_ledger_totals.total + EXCLUDED.total
        """
    )


_POSTGRES_BATCH = _postgres_batch_statement()


def record_entry(connection: Connection, entry: LedgerEntry) -> None:
    """Store ``entry`` and add its cost to its totals, in one statement, unless its id
    is already stored."""
    connection.execute(_POSTGRES_RECORD[entry.scope is not None], record_parameters(entry))


def record_parameters(entry: LedgerEntry) -> dict[str, Any]:
    """The parameters of the PostgreSQL statement that records ``entry``."""
    parameters = entry_columns(entry)
    parameters["day"] = window_key("day", entry.timestamp)
    parameters["month"] = window_key("month", entry.timestamp)
    parameters["shard"] = random.randrange(POSTGRES_TOTALS_SHARDS)
    return parameters


def record_entries(connection: Connection, entries: Sequence[LedgerEntry]) -> None:
    """Store ``entries`` on PostgreSQL and add their costs to their totals, in one
    statement (atomic on its own), skipping any whose id is already stored or repeated.

    One shard of each total for the whole batch (a random one, as for a single record),
    and the totals locked in key order: see `_postgres_batch_statement`.
    """
    connection.execute(_POSTGRES_BATCH, batch_parameters(entries))


def batch_parameters(entries: Sequence[LedgerEntry]) -> dict[str, Any]:
    """The parameters of the PostgreSQL statement that records ``entries`` at once
    (an entry repeated within them is sent once)."""
    unique: list[LedgerEntry] = []
    seen: set[str] = set()
    for entry in entries:
        if entry.entry_id is not None:
            if entry.entry_id in seen:
                continue  # a repeat within the batch: stored and counted once
            seen.add(entry.entry_id)
        unique.append(entry)
    fields: dict[str, Any] = {
        name: [getattr(entry, name) for entry in unique] for name, _ in _POSTGRES_COLUMNS
    }
    fields["day"] = [window_key("day", entry.timestamp) for entry in unique]
    fields["month"] = [window_key("month", entry.timestamp) for entry in unique]
    fields["shard"] = random.randrange(POSTGRES_TOTALS_SHARDS)
    return fields


def psycopg_statements() -> tuple[dict[bool, str], str]:
    """The PostgreSQL record statements (by whether the entry has a scope) and the
    batch statement, as SQL text for psycopg's own ``%(name)s`` parameters."""
    return (
        {scoped: _psycopg_text(statement.text) for scoped, statement in _POSTGRES_RECORD.items()},
        _psycopg_text(_POSTGRES_BATCH.text),
    )


def psycopg_spends(
    windows: Sequence[tuple[Window, str | None]], when: datetime
) -> tuple[str, dict[str, Any]]:
    """`read_spends`'s statement on PostgreSQL as psycopg SQL text, and its parameters."""
    statement = _psycopg_text(spends_statement(tuple(scope is not None for _, scope in windows)))
    return statement, spends_parameters(windows, when, sqlite=False)


@functools.cache
def _psycopg_text(statement: str) -> str:
    """``statement`` with SQLAlchemy's ``:name`` parameters as psycopg's ``%(name)s``."""
    return re.sub(r"(?<![:\w]):([A-Za-z_]\w*)", r"%(\1)s", statement.replace("%", "%%"))
