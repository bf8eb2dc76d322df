"""How a call's tokens and cost are counted: one set of rules for every adapter.

Adapters turn their framework's messages into ``(role, text)`` pairs and their
response metadata into two optional integers; everything else is decided here.

>>> usage = chat_usage(12, 30, prompt=[("user", "Hi")], response_text="Hello!")
>>> usage
Usage(input_tokens=12, output_tokens=30, estimated=False)

* Chat: the provider's counts when it reports both; otherwise both sides are
  estimated with tiktoken ``cl100k_base`` (over the request messages and the response
  text) and the usage is flagged ``estimated``. A reported input of 0 for a non-empty
  prompt is not a report: some integrations fill a missing count with 0.
* Embeddings: always estimated over the input texts; output is 0.
* Money: ``tokens * price_per_mtok / 1_000_000``, exact in ``Decimal``.

``cl100k_base`` is an OpenAI tokenizer, so estimates for other providers' models can be
systematically off: treat estimated entries as close approximations, not invoices.
"""

from __future__ import annotations

import decimal
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Literal

from llm_resilience.tokens import count_message_tokens, count_tokens

if TYPE_CHECKING:
    from llm_resilience.budget import ModelPrice

__all__ = [
    "TOKENS_PER_MTOK",
    "Usage",
    "chat_usage",
    "cost_of",
    "embedding_usage",
    "estimate_request_tokens",
]

#: Prices are quoted per million tokens.
TOKENS_PER_MTOK = Decimal(1_000_000)

# Money never rounds: tokens x price and the division by a million are exact at any
# number of digits (the default context would round past 28), and Inexact is trapped.
_EXACT = decimal.Context(
    prec=decimal.MAX_PREC,
    Emax=decimal.MAX_EMAX,
    Emin=decimal.MIN_EMIN,
    traps=[decimal.InvalidOperation, decimal.Inexact, decimal.Overflow],
)


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one call consumed, and whether they were estimated rather than reported."""

    #: Prompt tokens (for embeddings: the input texts' tokens). >= 0.
    input_tokens: int
    #: Completion tokens; 0 for embeddings. >= 0.
    output_tokens: int
    #: True when the counts come from ``cl100k_base``, not from the provider.
    estimated: bool

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Usage.{name} must be an int >= 0, got {value!r}")


def chat_usage(
    reported_input: int | None,
    reported_output: int | None,
    *,
    prompt: Sequence[tuple[str, str]],
    response_text: str,
) -> Usage:
    """The usage to record for one chat call (or one completed stream).

    ``reported_input``/``reported_output`` are the provider's counts, None when absent.
    Both present → recorded as reported. Either missing, negative, or an input of 0
    for a non-empty ``prompt`` → both estimated: ``count_message_tokens(prompt)`` and
    ``count_tokens(response_text)``, flagged ``estimated=True``.

    >>> chat_usage(None, 5, prompt=[("user", "hello world")], response_text="hi").estimated
    True
    """
    if (
        reported_input is not None
        and reported_output is not None
        and reported_input >= 0
        and reported_output >= 0
        and not (reported_input == 0 and len(prompt) > 0)
    ):
        return Usage(reported_input, reported_output, estimated=False)
    return Usage(count_message_tokens(prompt), count_tokens(response_text), estimated=True)


def embedding_usage(texts: Sequence[str]) -> Usage:
    """Estimated usage of one embedding call over ``texts`` (providers rarely report it).

    >>> embedding_usage(["hello world", "hello"])
    Usage(input_tokens=3, output_tokens=0, estimated=True)
    """
    return Usage(sum(count_tokens(text) for text in texts), 0, estimated=True)


def estimate_request_tokens(
    prompt: Sequence[tuple[str, str]], max_output_tokens: int | None
) -> int:
    """A request's token weight before it is sent: estimated prompt + ``max_output_tokens``.

    Used for a rate limiter's token permits and a strict budget's reservation. None
    counts as 0 output tokens here (the limiter reconciles with real usage afterwards;
    the budget gate applies its own default of 4096).

    >>> estimate_request_tokens([("user", "hello world")], 100)  # 9 prompt tokens + 100
    109
    """
    if max_output_tokens is not None and max_output_tokens < 0:
        raise ValueError(f"max_output_tokens must be >= 0 or None, got {max_output_tokens!r}")
    return count_message_tokens(prompt) + (max_output_tokens or 0)


def cost_of(
    usage: Usage, price: ModelPrice, *, surface: Literal["chat", "embedding"] = "chat"
) -> Decimal:
    """Exact cost of ``usage`` at ``price``: tokens x price per million / 1,000,000.

    Chat bills input at ``input_per_mtok`` and output at ``output_per_mtok``. Embeddings
    bill input at ``embedding_per_mtok``, or at ``input_per_mtok`` when the price has no
    embedding rate (a ``prices`` entry for an embedding model usually sets only input).

    >>> from llm_resilience.budget import ModelPrice
    >>> cost_of(Usage(1000, 500, False), ModelPrice("3", "15"))
    Decimal('0.0105')
    """
    if surface == "embedding":
        rate = (
            price.input_per_mtok if price.embedding_per_mtok is None else price.embedding_per_mtok
        )
        total = _EXACT.multiply(Decimal(usage.input_tokens), rate)
    else:
        total = _EXACT.add(
            _EXACT.multiply(Decimal(usage.input_tokens), price.input_per_mtok),
            _EXACT.multiply(Decimal(usage.output_tokens), price.output_per_mtok),
        )
    return _EXACT.divide(total, TOKENS_PER_MTOK)
