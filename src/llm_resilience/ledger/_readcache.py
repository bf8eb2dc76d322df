"""Gate reads kept per SQLite connection while the database has not changed.

A budget gate reads the same running totals before every call. On a SQLite file the
answer only changes when a transaction commits, and SQLite says when that happened:
``PRAGMA data_version`` (a read of the WAL index, no table touched) returns a new value
on a connection once *another* connection, of this process or any other, has committed.

Commits made on the connection itself do not change it, and the ledger accounts for them
itself: a write transaction reads the version under the write lock first. When it is
still the version the kept reads were made under, nobody else committed since, so the
reads plus what this transaction stored are exactly what the database holds after it
commits; the entries it stored are added to them then. Anything it cannot account
for (a released hold, a batch, a failure) forgets them instead.

A read is kept with what else decides its answer: the UTC instant it was read at, and
the earliest expiry among the strict-mode holds it counted. It answers a later read of
the same windows only while the version is unchanged, the new instant is not before the
old one (an earlier instant could count holds that had expired by the old one), and
no counted hold has expired since. Every other case reads the database again.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from llm_resilience.ledger._protocol import (
    WINDOWS,
    LedgerEntry,
    SpendWindow,
    Window,
    exact_sum,
    window_key,
)
from llm_resilience.ledger._schema import Run, sqlite_spends_expiring, sqlite_time

__all__ = ["MAX_CACHED_READS", "ReadCache", "versioned_spends"]

#: Distinct reads (windows and scopes, per day) kept per connection.
MAX_CACHED_READS = 256

#: A kept read's key: the ``(window, scope)`` pairs read, and each one's window key.
ReadKey = tuple[tuple[SpendWindow, ...], tuple[str, ...]]


class ReadCache:
    """The gate reads made on one SQLite connection under one ``data_version``, and
    the entries stored by the write transaction in progress on it."""

    __slots__ = ("_added", "_reads", "_unknown", "version")

    def __init__(self) -> None:
        #: The connection's ``data_version`` the reads were made under (None: none yet).
        self.version: int | None = None
        # key -> (amounts, read at (SQLite text), earliest counted hold expiry or None).
        self._reads: dict[ReadKey, tuple[tuple[Decimal, ...], str, str | None]] = {}
        # The write transaction in progress: entries it stored, and whether it did
        # anything else to the amounts (then the reads are forgotten when it ends).
        self._added: list[LedgerEntry] = []
        self._unknown = False

    def forget(self) -> None:
        """Drop every read."""
        self.version = None
        self._reads.clear()

    def get(self, key: ReadKey, version: int, when: str) -> tuple[Decimal, ...] | None:
        """The amounts read for ``key``, if still the database's answer at ``when``
        (SQLite text, as stored) under ``version``; else None."""
        if version != self.version:
            self.forget()
            self.version = version
            return None
        found = self._reads.get(key)
        if found is None:
            return None
        amounts, read_at, expires = found
        if when < read_at or (expires is not None and when >= expires):
            return None
        return amounts

    def put(
        self,
        key: ReadKey,
        version: int,
        when: str,
        amounts: tuple[Decimal, ...],
        expires: str | None,
    ) -> None:
        """Keep ``amounts``, read for ``key`` at ``when`` under ``version``; ``expires`` is
        the earliest expiry among the holds they count (None: no hold)."""
        if version != self.version:
            self.forget()
            self.version = version
        if len(self._reads) >= MAX_CACHED_READS:
            self._reads.clear()
        self._reads[key] = (amounts, when, expires)

    # -- a write transaction on the connection ------------------------------------------

    def begin_write(self, version: int) -> None:
        """A write transaction holds the write lock; ``version`` is the connection's
        ``data_version`` read under it. Reads made under another version are dropped."""
        if version != self.version:
            self.forget()
        self._added.clear()
        self._unknown = False

    def stored(self, entry: LedgerEntry) -> None:
        """The transaction stored ``entry`` (and added its cost to its totals)."""
        self._added.append(entry)

    def unaccounted(self) -> None:
        """The transaction changed the amounts otherwise (a hold released, a batch)."""
        self._unknown = True

    def committed(self) -> None:
        """The transaction committed: its entries are added to the kept reads."""
        added, self._added = self._added, []
        if self._unknown:
            self._unknown = False
            self.forget()
            return
        reads = self._reads
        for entry in added:
            # The keys of the entry's own day and month, once per entry, not per read.
            own = {window: window_key(window, entry.timestamp) for window in WINDOWS}
            for key, (amounts, read_at, expires) in list(reads.items()):
                reads[key] = (_plus(key, amounts, entry, own), read_at, expires)

    def ended(self) -> None:
        """The transaction failed or was rolled back: nothing kept can be trusted."""
        self._added.clear()
        self._unknown = False
        self.forget()


def _plus(
    key: ReadKey, amounts: tuple[Decimal, ...], entry: LedgerEntry, own: dict[Window, str]
) -> tuple[Decimal, ...]:
    """``amounts`` read for ``key`` with ``entry``'s cost added where it counts: its own
    day and month (``own``: each window's key at the entry's time), globally (scope
    None) and under its scope."""
    windows, keys = key
    return tuple(
        [
            exact_sum((amount, entry.cost))
            if own[window] == window_key_read and (scope is None or scope == entry.scope)
            else amount
            for (window, scope), window_key_read, amount in zip(windows, keys, amounts, strict=True)
        ]
    )


def versioned_spends(
    run: Run,
    reads: ReadCache,
    checked: tuple[SpendWindow, ...],
    keys: tuple[str, ...],
    when: datetime,
) -> tuple[Decimal, ...]:
    """The stored spends of ``checked`` on a direct SQLite connection: the connection's
    last answer while no commit landed since (``PRAGMA data_version``, see
    ``_readcache``), else one read."""
    ((version,),) = run("PRAGMA data_version", ())
    at = sqlite_time(when)
    cache_key = (checked, keys)
    stored = reads.get(cache_key, version, at)
    if stored is None:
        amounts, expires = sqlite_spends_expiring(run, checked, when)
        stored = tuple(amounts)
        reads.put(cache_key, version, at, stored, expires)
    return stored
