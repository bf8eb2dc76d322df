"""Money: what it is, how it is checked, and how it adds up, exactly, for every part of the core.

Money is :class:`~decimal.Decimal`, in whatever currency the prices are quoted in. Users
write it as a ``Decimal``, an ``int`` or a string (``"0.15"``); a float is refused,
since ``0.1 + 0.2`` is not ``0.3`` in binary. Arithmetic never rounds: sums and costs
use a context with the largest precision the ``decimal`` module allows, with
``Inexact`` trapped, so a rounding can never pass silently.

>>> exact_sum([money("cost", "0.1"), money("cost", Decimal("0.2"))])
Decimal('0.3')

:mod:`llm_resilience.budget`, :mod:`llm_resilience.usage` and the ledgers import from
here; ``ModelPrice`` and ``cost_of`` stay importable from where they were.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Literal, TypeAlias

from llm_resilience import _checks

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


def money(option: str, value: object) -> Decimal:
    """``value`` as exact, finite, non-negative money that every ledger can store.

    Accepts a ``Decimal``, an ``int`` or a string (surrounding spaces ignored). A float
    or a bool raises ``TypeError``; a negative, non-finite or unreadable value, one of
    :data:`~llm_resilience._checks.MAX_MONEY` or more, or one with more than
    :data:`~llm_resilience._checks.MAX_MONEY_PLACES` decimal places raises
    ``ValueError``. Every message names ``option``.

    >>> money("daily_limit", " 25.50 ")
    Decimal('25.50')
    """
    return _checks.money_in_range(option, _decimal(option, value))


def optional_money(option: str, value: object) -> Decimal | None:
    """:func:`money`, with None passing through (an option left unset)."""
    return None if value is None else money(option, value)


def recorded_cost(option: str, value: object) -> Decimal:
    """A recorded cost: as :func:`money` reads it, bounded by
    :func:`~llm_resilience._checks.cost_in_range` (a cost has a price's places plus 6)."""
    return _checks.cost_in_range(option, _decimal(option, value))


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

    >>> ModelPrice("2.50", 10).output_per_mtok
    Decimal('10')

    Values are ``Decimal``, ``int`` or ``str``: a float raises ``TypeError`` (floats are not
    exact) and a negative value ``ValueError``, each naming the field. An embedding model's
    price usually needs only ``input_per_mtok`` (``output_per_mtok=0``): embeddings bill at
    ``embedding_per_mtok`` when set, else at ``input_per_mtok``.
    """

    #: Price per million input (prompt) tokens.
    input_per_mtok: Decimal
    #: Price per million output (completion) tokens.
    output_per_mtok: Decimal
    #: Price per million embedded tokens; None bills embeddings at ``input_per_mtok``.
    embedding_per_mtok: Decimal | None

    def __init__(
        self, input_per_mtok: Money, output_per_mtok: Money, embedding_per_mtok: Money | None = None
    ) -> None:
        object.__setattr__(self, "input_per_mtok", money("input_per_mtok", input_per_mtok))
        object.__setattr__(self, "output_per_mtok", money("output_per_mtok", output_per_mtok))
        object.__setattr__(
            self, "embedding_per_mtok", optional_money("embedding_per_mtok", embedding_per_mtok)
        )


def cost_of(
    usage: Usage, price: ModelPrice, *, surface: Literal["chat", "embedding"] = "chat"
) -> Decimal:
    """Exact cost of ``usage`` at ``price``: tokens x price per million / 1,000,000.

    Chat bills input at ``input_per_mtok`` and output at ``output_per_mtok``. Embeddings
    bill input at ``embedding_per_mtok``, or at ``input_per_mtok`` when the price has no
    embedding rate (a ``prices`` entry for an embedding model usually sets only input).

    >>> from llm_resilience.usage import Usage
    >>> cost_of(Usage(1000, 500, False), ModelPrice("3", "15"))
    Decimal('0.0105')
    """
    if surface == "embedding":
        rate = (
            price.input_per_mtok if price.embedding_per_mtok is None else price.embedding_per_mtok
        )
        total = EXACT.multiply(usage.input_tokens, rate)
    else:
        # The context converts the integer counts exactly (no ``Decimal`` built for them).
        total = EXACT.add(
            EXACT.multiply(usage.input_tokens, price.input_per_mtok),
            EXACT.multiply(usage.output_tokens, price.output_per_mtok),
        )
    return EXACT.divide(total, TOKENS_PER_MTOK)
