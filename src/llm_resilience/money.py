"""Money: what it is, how it is checked, and how it adds up, exactly, for every part of the core.

Money is `Decimal`, in whatever currency the prices are quoted in. Users
write it as a ``Decimal``, an ``int`` or a string (``"0.15"``); a float is refused,
since ``0.1 + 0.2`` is not ``0.3`` in binary. Arithmetic never rounds: sums and costs
use a context with the largest precision the ``decimal`` module allows, with
``Inexact`` trapped, so a rounding can never pass silently.

Examples:
    >>> exact_sum([money("cost", "0.1"), money("cost", Decimal("0.2"))])
    Decimal('0.3')

`llm_resilience.budget` and the ledgers import from here; it reads
`Usage` (the layer below) to price a call.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Literal, TypeAlias

from llm_resilience import checks

if TYPE_CHECKING:
    from llm_resilience.usage import Usage

__all__ = [
    "EXACT",
    "TOKENS_PER_MTOK",
    "Money",
    "ModelPrice",
    "cost_of",
    "exact_sum",
    "money",
    "optional_money",
    "recorded_cost",
]

#: Money as users may write it: ``Decimal("0.15")``, ``"0.15"`` or an ``int``; never a float.
Money: TypeAlias = Decimal | int | str

#: Prices are quoted per million tokens.
TOKENS_PER_MTOK = Decimal(1_000_000)

#: The context every sum and cost is computed in: the largest precision and exponent
#: range the ``decimal`` module allows (the default context would round past 28 digits),
#: with ``Inexact``, ``InvalidOperation`` and ``Overflow`` trapped.
EXACT = decimal.Context(
    prec=decimal.MAX_PREC,
    Emax=decimal.MAX_EMAX,
    Emin=decimal.MIN_EMIN,
    traps=[decimal.InvalidOperation, decimal.Inexact, decimal.Overflow],
)

#: ``EXACT`` with a precision that holds any cost's digits: dividing by a million never
#: adds a digit, so the quotient is exact here too, and dividing at ``MAX_PREC`` costs
#: libmpdec over three times as much (a cost is divided once per ledger entry).
_MILLIONTHS = decimal.Context(
    prec=60,
    Emax=decimal.MAX_EMAX,
    Emin=decimal.MIN_EMIN,
    traps=[decimal.InvalidOperation, decimal.Inexact, decimal.Overflow],
)


def _per_million(total: Decimal) -> Decimal:
    """``total / 1,000,000`` exactly, as ``EXACT`` divides (the same digits and exponent)."""
    try:
        return _MILLIONTHS.divide(total, TOKENS_PER_MTOK)
    except decimal.Inexact:  # a total of more than 60 digits: no price makes one
        return EXACT.divide(total, TOKENS_PER_MTOK)


def money(option: str, value: object) -> Decimal:
    """``value`` as exact, finite, non-negative money that every ledger can store.

    Accepts a ``Decimal``, an ``int`` or a string (surrounding spaces ignored). A float
    or a bool raises ``TypeError``; a negative, non-finite or unreadable value, one of
    `MAX_MONEY` or more, or one with more than
    `MAX_MONEY_PLACES` decimal places raises
    ``ValueError``. Every message names ``option``.

    Examples:
        >>> money("daily_limit", " 25.50 ")
        Decimal('25.50')
    """
    return checks.money_in_range(option, _decimal(option, value))


def optional_money(option: str, value: object) -> Decimal | None:
    """`money`, with None passing through (an option left unset)."""
    return None if value is None else money(option, value)


def recorded_cost(option: str, value: object) -> Decimal:
    """A recorded cost: as `money` reads it, bounded by
    [`cost_in_range`][llm_resilience.checks.cost_in_range] (a cost has a price's places plus 6)."""
    return checks.cost_in_range(option, _decimal(option, value))


def _decimal(option: str, value: object) -> Decimal:
    if isinstance(value, float):
        raise TypeError(
            f"{option} must be exact money, not the float {value!r}: "
            f"use Decimal('0.15') or a string"
        )
    if isinstance(value, bool) or not isinstance(value, Decimal | int | str):
        raise TypeError(f"{option} must be a Decimal, an int or a string, got {value!r}")
    try:
        amount = Decimal(value.strip() if isinstance(value, str) else value)
    except InvalidOperation:
        raise ValueError(f"{option} must be a number >= 0, got {value!r}") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"{option} must be a finite number >= 0, got {value!r}")
    return amount


def exact_sum(values: Iterable[Decimal]) -> Decimal:
    """The exact sum of ``values`` (``Decimal(0)`` when empty), whatever their digits.

    Examples:
        >>> exact_sum([Decimal("0.1"), Decimal("0.2")])
        Decimal('0.3')
    """
    total = Decimal(0)
    for value in values:
        total = EXACT.add(total, value)
    return total


@dataclass(frozen=True, slots=True, init=False)
class ModelPrice:
    """One model's prices per million tokens, exact.

    Examples:
        >>> ModelPrice("2.50", 10).output_per_mtok
        Decimal('10')

    Values are ``Decimal``, ``int`` or ``str``: a float raises ``TypeError`` (floats are not
    exact) and a negative value ``ValueError``, each naming the field. An embedding model's
    price usually needs only ``input_per_mtok`` (``output_per_mtok=0``): embeddings bill at
    ``embedding_per_mtok`` when set, else at ``input_per_mtok``.

    Prompt caching and reasoning have their own optional prices (keyword-only), each
    falling back to the plain price when unset, so a price that sets none of them bills
    every input token at ``input_per_mtok`` and every output token at ``output_per_mtok``:

    * ``cache_read_price_per_mtok``: input tokens read from the provider's prompt cache;
    * ``cache_write_price_per_mtok``: input tokens written to it (Anthropic's 5-minute
      writes; every write when the provider does not say how long it keeps them);
    * ``cache_write_1h_price_per_mtok``: input tokens written to it for one hour (Anthropic);
    * ``reasoning_price_per_mtok``: output tokens spent reasoning (they are part of the
      output count; providers bill them at the output price today).

    Examples:
        >>> sonnet = ModelPrice(3, 15, cache_read_price_per_mtok="0.30",
        ...                     cache_write_price_per_mtok="3.75", cache_write_1h_price_per_mtok=6)
        >>> sonnet.cache_write_1h_price_per_mtok, ModelPrice(3, 15).cache_read_price_per_mtok
        (Decimal('6'), None)
    """

    #: Price per million input (prompt) tokens.
    input_per_mtok: Decimal
    #: Price per million output (completion) tokens.
    output_per_mtok: Decimal
    #: Price per million embedded tokens; None bills embeddings at ``input_per_mtok``.
    embedding_per_mtok: Decimal | None
    #: Price per million input tokens read from the prompt cache; None: ``input_per_mtok``.
    cache_read_price_per_mtok: Decimal | None
    #: Price per million input tokens written to the prompt cache (5-minute writes);
    #: None: ``input_per_mtok``.
    cache_write_price_per_mtok: Decimal | None
    #: Price per million input tokens written to the prompt cache for one hour;
    #: None: ``input_per_mtok``.
    cache_write_1h_price_per_mtok: Decimal | None
    #: Price per million reasoning (thinking) output tokens; None: ``output_per_mtok``.
    reasoning_price_per_mtok: Decimal | None

    def __init__(
        self,
        input_per_mtok: Money,
        output_per_mtok: Money,
        embedding_per_mtok: Money | None = None,
        *,
        cache_read_price_per_mtok: Money | None = None,
        cache_write_price_per_mtok: Money | None = None,
        cache_write_1h_price_per_mtok: Money | None = None,
        reasoning_price_per_mtok: Money | None = None,
    ) -> None:
        assign = object.__setattr__
        assign(self, "input_per_mtok", money("input_per_mtok", input_per_mtok))
        assign(self, "output_per_mtok", money("output_per_mtok", output_per_mtok))
        assign(self, "embedding_per_mtok", optional_money("embedding_per_mtok", embedding_per_mtok))
        for name, value in (
            ("cache_read_price_per_mtok", cache_read_price_per_mtok),
            ("cache_write_price_per_mtok", cache_write_price_per_mtok),
            ("cache_write_1h_price_per_mtok", cache_write_1h_price_per_mtok),
            ("reasoning_price_per_mtok", reasoning_price_per_mtok),
        ):
            assign(self, name, optional_money(name, value))

    def dearest(self) -> ModelPrice:
        """This price with every input token at its dearest input rate and every output
        token at its dearest output rate: what a worst-case hold charges, since it cannot
        know in advance how much of a prompt the provider reads from or writes to its cache.

        Examples:
            >>> ModelPrice(3, 15, cache_write_1h_price_per_mtok=6).dearest().input_per_mtok
            Decimal('6')
        """
        dearest_input = max(
            [
                self.input_per_mtok,
                *_set(
                    self.cache_read_price_per_mtok,
                    self.cache_write_price_per_mtok,
                    self.cache_write_1h_price_per_mtok,
                ),
            ]
        )
        dearest_output = max([self.output_per_mtok, *_set(self.reasoning_price_per_mtok)])
        if dearest_input == self.input_per_mtok and dearest_output == self.output_per_mtok:
            return self  # no dearer rate (the usual price): a hold's hot path builds nothing
        return ModelPrice(dearest_input, dearest_output, self.embedding_per_mtok)


def _set(*prices: Decimal | None) -> list[Decimal]:
    return [price for price in prices if price is not None]


def cost_of(
    usage: Usage, price: ModelPrice, *, surface: Literal["chat", "embedding"] = "chat"
) -> Decimal:
    """Exact cost of ``usage`` at ``price``: tokens x price per million / 1,000,000.

    Chat bills what the provider bills, each token once:

    * uncached input (``input_tokens`` less cache reads and writes) at ``input_per_mtok``;
    * cache reads at ``cache_read_price_per_mtok``; cache writes kept one hour at
      ``cache_write_1h_price_per_mtok``; other cache writes at ``cache_write_price_per_mtok``;
    * output that is not reasoning at ``output_per_mtok``, reasoning tokens at
      ``reasoning_price_per_mtok``.

    Each optional price left unset is the input (or output) price, and a count the
    provider did not report is 0, so without either the cost is
    ``input_tokens x input_per_mtok + output_tokens x output_per_mtok``. Embeddings bill
    input at ``embedding_per_mtok``, or at ``input_per_mtok`` when the price has no
    embedding rate (a ``prices`` entry for an embedding model usually sets only input).

    Examples:
        >>> from llm_resilience.usage import Usage
        >>> cost_of(Usage(1000, 500, False), ModelPrice("3", "15"))
        Decimal('0.0105')
        >>> cached = Usage(1000, 500, False, cache_read_tokens=800)
        >>> cost_of(cached, ModelPrice("3", "15", cache_read_price_per_mtok="0.30"))
        Decimal('0.00834')
    """
    if surface == "embedding":
        rate = (
            price.input_per_mtok if price.embedding_per_mtok is None else price.embedding_per_mtok
        )
        total = EXACT.multiply(usage.input_tokens, rate)
        return _per_million(total)
    read = usage.cache_read_tokens or 0
    written = usage.cache_write_tokens or 0
    written_1h = usage.cache_write_1h_tokens or 0
    reasoning = usage.reasoning_tokens or 0
    plain_in, plain_out = price.input_per_mtok, price.output_per_mtok
    if not (read or written or reasoning):  # no split reported: two products (the hot path)
        total = EXACT.add(
            EXACT.multiply(usage.input_tokens, plain_in),
            EXACT.multiply(usage.output_tokens, plain_out),
        )
        try:  # `_per_million`, written out on the hot path
            return _MILLIONTHS.divide(total, TOKENS_PER_MTOK)
        except decimal.Inexact:
            return EXACT.divide(total, TOKENS_PER_MTOK)
    # The context converts the integer counts exactly (no ``Decimal`` built for them).
    parts = (
        EXACT.multiply(usage.input_tokens - read - written, plain_in),
        EXACT.multiply(read, _or(price.cache_read_price_per_mtok, plain_in)),
        EXACT.multiply(written - written_1h, _or(price.cache_write_price_per_mtok, plain_in)),
        EXACT.multiply(written_1h, _or(price.cache_write_1h_price_per_mtok, plain_in)),
        EXACT.multiply(usage.output_tokens - reasoning, plain_out),
        EXACT.multiply(reasoning, _or(price.reasoning_price_per_mtok, plain_out)),
    )
    return _per_million(exact_sum(parts))


def _or(price: Decimal | None, fallback: Decimal) -> Decimal:
    return fallback if price is None else price
