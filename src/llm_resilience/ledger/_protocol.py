"""What a spend ledger is: the entry it stores, the hold strict mode takes, the protocol.

Windows are UTC calendar windows: ``"day"`` is the current UTC date and ``"month"`` the
current UTC month from its first day. Every entry and every hold belongs to exactly one
day and one month, named by `window_key` (``"day:2026-11-29"``, ``"month:2026-11"``),
and to the global total plus, when it has one, its scope's total.

Money is `Decimal` end to end and sums are exact: `exact_sum` adds
without the default context's 28-digit rounding.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal, NamedTuple, Protocol, get_args, runtime_checkable

from llm_resilience import checks
from llm_resilience.errors import BudgetExceededError
from llm_resilience.money import exact_sum, money, recorded_cost

__all__ = [
    "DEFAULT_RESERVATION_TTL",
    "DETAIL_COLUMNS",
    "RUN_COLUMNS",
    "WINDOWS",
    "SpendWindow",
    "CostLedger",
    "LedgerEntry",
    "Reservation",
    "Limit",
    "Window",
    "CheckedLimits",
    "EntryFilters",
    "RunColumn",
    "astored_run_spend",
    "check_amount",
    "check_entry_filters",
    "check_run_or_thread",
    "check_hold_scope",
    "check_limits",
    "check_now",
    "check_scope",
    "check_windows",
    "checked_row",
    "entry_of_row",
    "EntryRow",
    "exact_sum",
    "read_spends",
    "aread_spends",
    "batch_reader",
    "refusal",
    "stored_run_spend",
    "gate_reader",
    "inline_recorder",
    "row_recorder",
    "window_bounds",
    "window_key",
    "window_keys",
]

Window = Literal["day", "month"]
#: Which entry field a run-spend read sums over: ``"run_id"`` or ``"thread_id"``.
RunColumn = Literal["run_id", "thread_id"]
#: One spend a gate reads: a window, and the scope whose spend it is (None: the global total).
SpendWindow = tuple[Window, str | None]
#: The windows a ledger answers for, in the order a gate reads them.
WINDOWS: tuple[Window, ...] = get_args(Window)
#: How long a strict-mode hold counts toward spend unless settled first: 15 minutes, so a
#: worker that crashed between ``reserve`` and ``settle`` cannot block a budget forever.
DEFAULT_RESERVATION_TTL = timedelta(minutes=15)


def _utc(option: str, value: object) -> datetime:
    """``value`` converted to UTC; naive datetimes are refused, never guessed."""
    if type(value) is datetime and value.tzinfo is UTC:
        return value  # already UTC (the gate's clock): nothing to check or convert
    if not isinstance(value, datetime):
        raise TypeError(f"{option} must be a timezone-aware datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{option} must be timezone-aware (UTC), got naive {value!r}")
    return value.astimezone(UTC)


def _optional_text(option: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise TypeError(f"{option} must be non-empty text or None, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One priced call (or any other billed thing) as the ledger stores it.

    Examples:
        >>> from datetime import UTC, datetime
        >>> entry = LedgerEntry(datetime(2026, 11, 29, 10, tzinfo=UTC), "chat",
        ...                     input_tokens=1200, output_tokens=300, cost=Decimal("0.0081"))

    Counts and money only, never prompt or response text. Validated on construction, so
    every entry can be stored by every ledger: a naive ``timestamp`` raises
    ``ValueError`` (an aware one is converted to UTC); a float ``cost`` raises
    ``TypeError`` (an ``int`` or a string becomes a ``Decimal``, as everywhere money is
    read: `llm_resilience.money`); counts are integers from 0 to
    2,147,483,647 (a PostgreSQL ``INTEGER``); ``cost`` is >= 0, below 10**30 and has at
    most 24 decimal places (so is any cost priced from valid prices and counts); ``kind``
    is non-empty text; ``scope`` is None or at most 256 characters of printable text (no
    NUL or other control character, no lone surrogate).

    ``entry_id`` (32 hex digits, new for each entry) makes a write idempotent: a ledger
    stores an entry whose id it already holds only once, so a write retried after a
    failure that had in fact reached the database is not counted twice. It is not part
    of equality: two entries with the same facts compare equal.

    The cache and reasoning counts (keyword-only, 0 when the provider did not report
    them) are parts of the totals, as in `Usage`: cache reads
    plus writes are at most ``input_tokens``, one-hour writes at most the writes,
    reasoning at most ``output_tokens``; otherwise ``ValueError``.
    """

    #: When the call finished, timezone-aware, stored in UTC.
    timestamp: datetime
    #: What was billed: ``"chat"``, ``"embedding"``, ``"ocr"``, ... any non-empty text.
    kind: str
    #: Input (prompt) tokens, >= 0.
    input_tokens: int = 0
    #: Output (completion) tokens, >= 0.
    output_tokens: int = 0
    #: Exact money, >= 0, in the currency the prices are quoted in.
    cost: Decimal = Decimal(0)
    #: Pages, for per-page kinds such as ``"ocr"``; 0 for token-billed calls.
    pages: int = 0
    #: The model that actually served (a fallback leg, not the chain), if known.
    model: str | None = None
    #: True when the token counts were estimated, not reported by the provider.
    estimated: bool = False
    #: ``"chat"``, ``"embedding"`` or None.
    surface: str | None = None
    #: Budget scope (tenant, user, key); None is unscoped.
    scope: str | None = None
    #: Unique id of this entry; None only for rows stored before ids existed.
    entry_id: str | None = field(default_factory=lambda: uuid.uuid4().hex, compare=False)
    #: Of ``input_tokens``, those read from the provider's prompt cache.
    cache_read_tokens: int = field(default=0, kw_only=True)
    #: Of ``input_tokens``, those written to the provider's prompt cache (every lifetime).
    cache_write_tokens: int = field(default=0, kw_only=True)
    #: Of ``cache_write_tokens``, those written to be kept one hour (Anthropic).
    cache_write_1h_tokens: int = field(default=0, kw_only=True)
    #: Of ``output_tokens``, those spent reasoning.
    reasoning_tokens: int = field(default=0, kw_only=True)
    #: The agent run the call belonged to (an id given by the framework), or None.
    run_id: str | None = field(default=None, kw_only=True)
    #: The conversation thread the call belonged to (LangGraph's ``thread_id``), or None.
    thread_id: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "timestamp", _utc("timestamp", self.timestamp))
        if not isinstance(self.kind, str) or not self.kind:
            raise TypeError(f"kind must be non-empty text, got {self.kind!r}")
        for option in ("input_tokens", "output_tokens", "pages", *DETAIL_COLUMNS):
            checks.count(option, getattr(self, option))
        _check_parts(self)
        object.__setattr__(self, "cost", recorded_cost("cost", self.cost))
        if not isinstance(self.estimated, bool):
            raise TypeError(f"estimated must be a bool, got {self.estimated!r}")
        for option in ("model", "surface"):
            _optional_text(option, getattr(self, option))
        check_scope(self.scope)
        checks.scope("entry_id", _optional_text("entry_id", self.entry_id))
        checks.scope("run_id", self.run_id)
        checks.scope("thread_id", self.thread_id)


def checked_row(
    timestamp: datetime,
    kind: str,
    input_tokens: int,
    output_tokens: int,
    cost: Decimal,
    model: str | None,
    estimated: bool,
    scope: str | None,
    cache_read_tokens: int,
    cache_write_tokens: int,
    cache_write_1h_tokens: int,
    reasoning_tokens: int,
    run_id: str | None,
    thread_id: str | None,
) -> EntryRow:
    """A call's entry, as the tuple of its fields in field order (an `EntryRow`), from
    values its budget gate already checked.

    The gate's hot path: ``timestamp`` is the gate's UTC clock, ``kind`` its surface (also
    the entry's ``surface``), the counts a validated ``Usage``, ``cost`` priced from
    validated prices and counts (so within [`cost_in_range`][llm_resilience.checks.cost_in_range])
    and ``scope``, ``run_id`` and ``thread_id`` checked when the call was admitted; the
    cache and reasoning counts are the same ``Usage``'s (None there is 0 here). Only
    ``model`` and ``estimated``, which a caller of ``BudgetTicket.finish`` passes, are
    checked here; the entry gets a new id (`_ordered_id`). `entry_of_row` makes it an
    entry equal to ``LedgerEntry(...)`` of the same values (a core test holds the two to
    that); a ledger that keeps rows (the in-memory one) makes it one only when read.
    """
    if model is not None and (not isinstance(model, str) or not model):
        _optional_text("model", model)  # raises, naming the field
    if estimated is not True and estimated is not False:
        raise TypeError(f"estimated must be a bool, got {estimated!r}")
    return (
        timestamp,
        kind,
        input_tokens,
        output_tokens,
        cost,
        0,  # pages: a token-billed call's
        model,
        estimated,
        kind,  # surface
        scope,
        # `_ordered_id`, written out (a call saved on every entry).
        ((_time_ns() << 64) | _random_bits(64)).to_bytes(16, "big").hex(),
        cache_read_tokens,
        cache_write_tokens,
        cache_write_1h_tokens,
        reasoning_tokens,
        run_id,
        thread_id,
    )


def entry_of_row(row: EntryRow) -> LedgerEntry:
    """The entry whose fields, in field order, are ``row`` (`checked_row`'s), built
    unchecked: each field through its slot's own setter (``object.__setattr__`` looks the
    slot up by name first, which took 40% of building an entry)."""
    entry = object.__new__(LedgerEntry)
    for set_field, value in zip(_SETTERS, row, strict=True):
        set_field(entry, value)
    return entry


#: An entry's fields in field order (`checked_row`, `entry_of_row`).
EntryRow = tuple[Any, ...]

#: Where `checked_row` puts the fields a ledger's running totals read.
ROW_TIMESTAMP, ROW_COST, ROW_SCOPE, ROW_RUN_ID, ROW_THREAD_ID = 0, 4, 9, 15, 16


#: The slot setter of each of `LedgerEntry`'s fields, in field order (`entry_of_row`).
_SETTERS = tuple(vars(LedgerEntry)[each.name].__set__ for each in fields(LedgerEntry))

#: An entry's cache and reasoning counts, as fields and as SQL columns.
DETAIL_COLUMNS = (
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
    "reasoning_tokens",
)


#: The agent run and thread an entry belongs to, as fields and as SQL columns.
RUN_COLUMNS: tuple[RunColumn, ...] = ("run_id", "thread_id")


def _check_parts(entry: LedgerEntry) -> None:
    if entry.cache_read_tokens + entry.cache_write_tokens > entry.input_tokens:
        raise ValueError(
            f"cache_read_tokens + cache_write_tokens ({entry.cache_read_tokens} + "
            f"{entry.cache_write_tokens}) exceed input_tokens ({entry.input_tokens})"
        )
    if entry.cache_write_1h_tokens > entry.cache_write_tokens:
        raise ValueError(
            f"cache_write_1h_tokens ({entry.cache_write_1h_tokens}) exceed "
            f"cache_write_tokens ({entry.cache_write_tokens})"
        )
    if entry.reasoning_tokens > entry.output_tokens:
        raise ValueError(
            f"reasoning_tokens ({entry.reasoning_tokens}) exceed "
            f"output_tokens ({entry.output_tokens})"
        )


_ids = random.Random(os.urandom(32))
_random_bits = _ids.getrandbits
_time_ns = time.time_ns
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))


def _ordered_id() -> str:
    """32 hex digits, like ``uuid4().hex``: the time in nanoseconds then 64 random bits.

    Unique as surely (64 random bits for each nanosecond), several times faster to make,
    and ids of successive entries sort together, so the SQL ledger's unique index on them
    grows at its end instead of at a random page (about 10% of a SQLite write). The bits
    come from a generator of the ledger's own (not ``random``'s, which an application may
    seed), seeded from ``os.urandom`` at import and again in every forked child, so no
    two processes share a sequence; no system call per entry (``os.urandom`` costs one).
    """
    return ((time.time_ns() << 64) | _random_bits(64)).to_bytes(16, "big").hex()


@dataclass(frozen=True, slots=True)
class Reservation:
    """A hold on budget taken at the gate in strict mode, released by ``settle``.

    Counts toward `CostLedger.spend` in the day and month of ``timestamp``,
    globally and for ``scope``, until settled or until the ledger's reservation TTL
    (15 minutes by default) has passed since ``timestamp``.
    """

    #: Opaque unique id (32 hex digits).
    id: str
    #: The money held: the call's worst-case cost.
    amount: Decimal
    #: The scope the hold counts toward besides the global total; None is unscoped.
    scope: str | None
    #: When the hold was taken (UTC).
    timestamp: datetime


@runtime_checkable
class CostLedger(Protocol):
    """Where spend is recorded and read back; any object with these methods will do.

    ``spend`` includes outstanding holds, so concurrent strict-mode gates see each
    other; ``reserve`` checks and holds atomically. Failures are raised, never hidden:
    the budget gate decides what a failing ledger means for a call.

    Optional extras, not part of the protocol (it is ``runtime_checkable``, so adding
    them would make ``isinstance`` reject every ledger written before them): both of our
    ledgers also answer ``spends(windows, now=)``/``aspends`` (the spend of several
    ``(window, scope)`` pairs in one read, which the budget gate uses when it has more
    than one window to check; `read_spends` falls back to ``spend`` per window),
    ``entries(..., scope=, model=, kind=, run=, thread=)``, ``aentries``,
    ``iter_entries`` (streamed in pages), ``report``, and ``run_spend(*, run=, thread=)``
    / ``arun_spend`` (the stored cost of one agent run or one thread, in one bounded,
    indexed read; `stored_run_spend` reads a ledger without them through ``entries``).
    `llm_resilience.spend.spend_report` works on any ledger, reading one that has
    only ``entries(since, until)`` through it.
    """

    def record(self, entry: LedgerEntry) -> None:
        """Store ``entry``; it counts toward its day and month at once."""

    async def arecord(self, entry: LedgerEntry) -> None:
        """Async `record`."""

    def spend(
        self, window: Window, *, scope: str | None = None, now: datetime | None = None
    ) -> Decimal:
        """Spend of the ``window`` holding ``now`` (default: the current UTC time):
        every entry and live hold of that UTC day or month, for ``scope`` (None: all)."""

    async def aspend(
        self, window: Window, *, scope: str | None = None, now: datetime | None = None
    ) -> Decimal:
        """Async `spend`."""

    def reserve(
        self,
        amount: Decimal,
        *,
        limits: Mapping[tuple[Window, str | None], Decimal],
        scope: str | None,
        now: datetime | None = None,
    ) -> Reservation:
        """Atomically check every ``(window, limit_scope) -> limit`` and hold ``amount``.

        Raises [`BudgetExceededError`][] for the first limit
        the hold would exceed (``spend + amount > limit``, or a limit already reached).
        """

    async def areserve(
        self,
        amount: Decimal,
        *,
        limits: Mapping[tuple[Window, str | None], Decimal],
        scope: str | None,
        now: datetime | None = None,
    ) -> Reservation:
        """Async `reserve`."""

    def settle(self, reservation: Reservation, entry: LedgerEntry | None) -> None:
        """Release ``reservation`` and record ``entry`` (if any) in one transaction.

        Settling a hold that expired or was already settled just records ``entry``.
        """

    async def asettle(self, reservation: Reservation, entry: LedgerEntry | None) -> None:
        """Async `settle`."""

    def entries(
        self, since: datetime | None = None, until: datetime | None = None
    ) -> list[LedgerEntry]:
        """Entries with ``since <= timestamp < until`` (either bound optional), oldest first."""

    def close(self) -> None:
        """Release connections; a closed in-memory ledger keeps its entries."""


def check_now(now: datetime | None) -> datetime:
    """``now`` in UTC, or the current UTC time when None; a naive ``now`` is refused."""
    return datetime.now(UTC) if now is None else _utc("now", now)


def check_scope(scope: object) -> str | None:
    """A budget scope: None for the global total, or text every ledger can store and
    index (at most 256 characters, no control character or lone surrogate)."""
    return checks.scope("scope", scope)


def _check_window(window: object) -> Window:
    if window == "day":
        return "day"
    if window == "month":
        return "month"
    raise ValueError(f"window must be 'day' or 'month', got {window!r}")


def window_key(window: Window, when: datetime) -> str:
    """The name of the ``window`` holding the UTC instant ``when``.

    Examples:
        >>> when = datetime(2026, 11, 29, 23, 59, tzinfo=UTC)
        >>> window_key("day", when), window_key("month", when)
        ('day:2026-11-29', 'month:2026-11')
    """
    key = (window, when.toordinal())
    name = _window_keys.get(key)
    if name is None:
        if _check_window(window) == "day":
            name = f"day:{when.year:04d}-{when.month:02d}-{when.day:02d}"
        else:
            name = f"month:{when.year:04d}-{when.month:02d}"
        if len(_window_keys) >= 256:  # a long-lived process moves on day by day
            _window_keys.clear()
        _window_keys[key] = name
    return name


#: ``(window, day ordinal)`` -> its window's name: every read and record names the
#: windows of today, and formatting the date costs more than the rest of a memory read.
_window_keys: dict[tuple[object, int], str] = {}


def window_keys(when: datetime) -> tuple[str, str]:
    """``(window_key("day", when), window_key("month", when))``, kept per day: a record
    names both windows of its instant, in one look-up instead of two.

    Examples:
        >>> window_keys(datetime(2026, 11, 29, 23, 59, tzinfo=UTC))
        ('day:2026-11-29', 'month:2026-11')
    """
    ordinal = when.toordinal()
    pair = _window_pairs.get(ordinal)
    if pair is None:
        pair = (window_key("day", when), window_key("month", when))
        if len(_window_pairs) >= 256:
            _window_pairs.clear()
        _window_pairs[ordinal] = pair
    return pair


#: Day ordinal -> the names of its day and month (`window_keys`).
_window_pairs: dict[int, tuple[str, str]] = {}

#: The reads a ledger answers; a subclass overriding one decides what a read is.
_READS = frozenset({"spend", "spends", "aspend", "aspends"})


def inline_recorder(ledger: object) -> Any:
    """``ledger``'s ``record`` when its ``arecord`` is that ``record`` called in place (it
    never waits: the in-memory ledger's, which says so with ``_arecord_records``), so an
    async caller may call ``record`` itself, with nothing to shield; None otherwise, and
    when a subclass overrides ``record`` or ``arecord`` below the class that says so."""
    for klass in type(ledger).__mro__:
        namespace = vars(klass)
        if "_arecord_records" in namespace:
            method = getattr(ledger, "record", None)
            return method if namespace["_arecord_records"] is True and callable(method) else None
        if "record" in namespace or "arecord" in namespace:
            return None
    return None


def row_recorder(ledger: object) -> Any:
    """``ledger``'s ``_record_row(row)`` (it records a `checked_row` as ``record`` records
    the entry it stands for, in place, never waiting: the in-memory ledger's), so a gate
    of ours need not build the entry; None when it has none, and when a subclass
    overrides ``record`` or ``arecord`` below the class that defines it (entries then go
    through the override)."""
    for klass in type(ledger).__mro__:
        namespace = vars(klass)
        if "_record_row" in namespace:
            method = getattr(ledger, "_record_row", None)
            return method if callable(method) else None
        if "record" in namespace or "arecord" in namespace:
            return None
    return None


def gate_reader(ledger: object) -> Any:
    """``ledger``'s ``_gate_spends(limits, now)``, or None when it has none, or when a
    subclass overrides a read (``spend``, ``spends`` or their async twins) below the
    class that defines it (the override is then honoured, as `batch_reader` does).

    ``_gate_spends`` is what a gate of ours reads, sync or async, for
    `CheckedLimits` and its own UTC clock's time: ``spends`` of the limits' windows,
    with nothing checked again and no waiting (an in-memory ledger's read never waits
    for more than its lock).
    """
    for klass in type(ledger).__mro__:
        namespace = vars(klass)
        if "_gate_spends" in namespace:
            method = getattr(ledger, "_gate_spends", None)
            return method if callable(method) else None
        if not _READS.isdisjoint(namespace):
            return None
    return None


def window_bounds(window: Window, when: datetime) -> tuple[datetime, datetime]:
    """``[start, end)`` in UTC of the ``window`` holding the UTC instant ``when``.

    Examples:
        >>> start, end = window_bounds("month", datetime(2026, 12, 31, 23, tzinfo=UTC))
        >>> start.isoformat(), end.isoformat()
        ('2026-12-01T00:00:00+00:00', '2027-01-01T00:00:00+00:00')
    """
    day = datetime(when.year, when.month, when.day, tzinfo=UTC)
    if _check_window(window) == "day":
        return day, day + timedelta(days=1)
    start = day.replace(day=1)
    end = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )
    return start, end


def check_amount(amount: object) -> Decimal:
    """A reservation's ``amount``: money as `money` reads it,
    bounded like a recorded cost (float: ``TypeError``)."""
    return recorded_cost("amount", amount)


#: One limit of a reservation: its window, the scope whose spend it reads, the limit.
Limit = tuple[Window, str | None, Decimal]


class CheckedLimits(Mapping[SpendWindow, Decimal]):
    """``reserve``'s ``limits`` for a call of ``scope``, built from values already checked
    (the gate's: windows and money parsed when its budget was built, the scope checked once
    per call), so a ledger of ours checks nothing again on each reservation. Any other
    mapping is checked by `check_limits` as before."""

    __slots__ = ("_by_window", "scope", "triples")

    def __init__(self, triples: Sequence[Limit], scope: str | None) -> None:
        #: The limits in order, as ``reserve`` applies them.
        self.triples: tuple[Limit, ...] = tuple(triples)
        #: The (checked) scope of the call these limits gate.
        self.scope = scope
        self._by_window = {(window, limit_scope): limit for window, limit_scope, limit in triples}

    def __getitem__(self, key: SpendWindow) -> Decimal:
        return self._by_window[key]

    def __iter__(self) -> Iterator[SpendWindow]:
        return iter(self._by_window)

    def __len__(self) -> int:
        return len(self._by_window)


def check_limits(limits: Mapping[SpendWindow, Decimal]) -> Sequence[Limit]:
    """``reserve``'s ``limits`` as validated ``(window, scope, limit)`` triples, in order
    (`CheckedLimits` as they are)."""
    if isinstance(limits, CheckedLimits):
        return limits.triples
    checked: list[Limit] = []
    for (window, scope), limit in limits.items():
        checked.append((_check_window(window), check_scope(scope), money("limit", limit)))
    return checked


def check_hold_scope(limits: Mapping[SpendWindow, Decimal], scope: object) -> str | None:
    """``reserve``'s ``scope``, checked unless it is the one its `CheckedLimits`
    were checked for."""
    if isinstance(limits, CheckedLimits) and scope is limits.scope:
        return limits.scope
    return check_scope(scope)


def refusal(
    window: Window, limit_scope: str | None, limit: Decimal, spend: Decimal, amount: Decimal
) -> BudgetExceededError | None:
    """The error ``reserve`` raises for this limit, or None if the hold fits.

    A hold fits when ``spend + amount <= limit`` and the limit is not already reached,
    so a hold of 0 is refused at a reached limit (a limit of 0 stays a kill switch),
    as the plain gate refuses once ``spend >= limit``.
    """
    if spend >= limit or exact_sum((spend, amount)) > limit:
        return BudgetExceededError(window, limit, spend, scope=limit_scope)
    return None


class EntryFilters(NamedTuple):
    """The filters of ``entries``/``iter_entries``/``report``, checked by
    `check_entry_filters`."""

    #: Inclusive lower bound of the timestamps (UTC), or None.
    since: datetime | None
    #: Exclusive upper bound (UTC), or None.
    until: datetime | None
    #: Only this budget scope's entries, or None (every scope).
    scope: str | None
    #: Only this model's entries, or None.
    model: str | None
    #: Only this kind's entries, or None.
    kind: str | None
    #: Only this agent run's entries, or None.
    run: str | None = None
    #: Only this conversation thread's entries, or None.
    thread: str | None = None


def check_entry_filters(
    since: object,
    until: object,
    scope: object,
    model: object,
    kind: object,
    *,
    run: object = None,
    thread: object = None,
) -> EntryFilters:
    """The filters of ``entries``/``iter_entries``, checked: aware bounds in UTC (naive:
    ``ValueError``), a valid scope, ``model``/``kind`` as non-empty text or None, and
    ``run``/``thread`` checked like a scope (an entry's ``run_id``/``thread_id``).

    Examples:
        >>> checked = check_entry_filters(None, None, "tenant-1", None, "chat", run="run-7")
        >>> checked.scope, checked.kind, checked.run, checked.thread
        ('tenant-1', 'chat', 'run-7', None)
    """
    low = None if since is None else _utc("since", since)
    high = None if until is None else _utc("until", until)
    model, kind = _optional_text("model", model), _optional_text("kind", kind)
    return EntryFilters(
        low,
        high,
        check_scope(scope),
        model,
        kind,
        checks.scope("run", run),
        checks.scope("thread", thread),
    )


def check_run_or_thread(run: object, thread: object) -> tuple[RunColumn, str]:
    """``run_spend``'s arguments: exactly one of ``run`` and ``thread``, checked like a
    scope; returns the entry field to match and its value.

    Examples:
        >>> check_run_or_thread("run-7", None)
        ('run_id', 'run-7')

    Neither or both raise ``TypeError`` naming ``run`` and ``thread``.
    """
    if (run is None) == (thread is None):
        given = "both" if run is not None else "neither"
        raise TypeError(f"run_spend takes exactly one of run= and thread=, got {given}")
    if run is not None:
        checked = checks.scope("run", run)
        assert checked is not None
        return "run_id", checked
    checked = checks.scope("thread", thread)
    assert checked is not None
    return "thread_id", checked


def _by_name(column: RunColumn, value: str) -> dict[str, str]:
    """``run_spend``'s keyword for ``column``: ``{"run": value}`` or ``{"thread": value}``."""
    return {"run": value} if column == "run_id" else {"thread": value}


def _summed(entries: Iterable[LedgerEntry], column: RunColumn, value: str) -> Decimal:
    return exact_sum(entry.cost for entry in entries if getattr(entry, column) == value)


def stored_run_spend(
    ledger: CostLedger, *, run: str | None = None, thread: str | None = None
) -> Decimal:
    """The stored cost of every entry of agent run ``run`` (or of thread ``thread``;
    exactly one of the two, else ``TypeError``), exact.

    Examples:
        >>> from llm_resilience.ledger import InMemoryCostLedger
        >>> ledger = InMemoryCostLedger()
        >>> when = datetime(2026, 11, 29, tzinfo=UTC)
        >>> ledger.record(LedgerEntry(when, "chat", cost=Decimal("0.1"), run_id="run-7"))
        >>> ledger.record(LedgerEntry(when, "chat", cost=Decimal("0.2"), run_id="run-8"))
        >>> stored_run_spend(ledger, run="run-7")
        Decimal('0.1')

    Through the ledger's own ``run_spend`` when it has one (both of ours: one bounded,
    indexed read), else by summing what ``entries()`` lists (any `CostLedger`).
    """
    column, value = check_run_or_thread(run, thread)
    own = getattr(ledger, "run_spend", None)
    if callable(own):
        total: Decimal = own(**_by_name(column, value))
        return total
    return _summed(ledger.entries(), column, value)


async def astored_run_spend(
    ledger: CostLedger, *, run: str | None = None, thread: str | None = None
) -> Decimal:
    """Async `stored_run_spend`: through ``arun_spend`` or ``run_spend``, else ``aentries``,
    else ``entries`` in a worker thread (the event loop never waits on a database)."""
    column, value = check_run_or_thread(run, thread)
    keyword = _by_name(column, value)
    own = getattr(ledger, "arun_spend", None)
    if callable(own):
        total: Decimal = await own(**keyword)
        return total
    sync = getattr(ledger, "run_spend", None)
    if callable(sync):
        total = await asyncio.to_thread(sync, **keyword)
        return total
    listed = getattr(ledger, "aentries", None)
    if callable(listed):
        return _summed(await listed(), column, value)
    return _summed(await asyncio.to_thread(ledger.entries), column, value)


def batch_reader(ledger: object, batch: Literal["spends", "aspends"]) -> Any:
    """``ledger``'s ``spends`` (or ``aspends``), or None when it has none, or when a
    subclass overrides ``spend`` (``aspend``) below the class that defines it: the
    override then decides what a read is, so it is honoured."""
    single = batch[:-1]
    for klass in type(ledger).__mro__:
        namespace = vars(klass)
        if batch in namespace:
            method = getattr(ledger, batch, None)
            return method if callable(method) else None
        if single in namespace:
            return None
    return None


def read_spends(
    ledger: CostLedger, windows: Sequence[SpendWindow], *, now: datetime
) -> tuple[Decimal, ...]:
    """The spend of each ``(window, scope)`` at ``now``, in order: in one read when the
    ledger has ``spends`` (both of ours: one bounded operation, one statement), else
    one `CostLedger.spend` per window (the protocol's default, for any ledger)."""
    spends = batch_reader(ledger, "spends")
    if spends is not None:
        return tuple(spends(windows, now=now))
    return tuple(ledger.spend(window, scope=scope, now=now) for window, scope in windows)


async def aread_spends(
    ledger: CostLedger, windows: Sequence[SpendWindow], *, now: datetime
) -> tuple[Decimal, ...]:
    """Async `read_spends`, through ``aspends`` or ``aspend``."""
    aspends = batch_reader(ledger, "aspends")
    if aspends is not None:
        return tuple(await aspends(windows, now=now))
    return tuple([await ledger.aspend(window, scope=scope, now=now) for window, scope in windows])


def check_windows(windows: object) -> list[SpendWindow]:
    """``spends``' ``windows`` checked: a sequence of ``(window, scope)`` pairs."""
    if isinstance(windows, str | bytes) or not isinstance(windows, Sequence):
        raise TypeError(f"windows must be a sequence of (window, scope) pairs, got {windows!r}")
    checked: list[SpendWindow] = []
    for pair in windows:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"windows must hold (window, scope) pairs, got {pair!r}")
        checked.append((_check_window(pair[0]), check_scope(pair[1])))
    return checked
