"""Which model a call is priced at: the models that may serve it, the one a ledger entry
names, the dearest of them, and the price a model's name matches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from llm_resilience import checks
from llm_resilience.money import ModelPrice, cost_of
from llm_resilience.usage import Usage

__all__ = [
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "Priced",
    "ServingModel",
    "dearest_model",
    "first_count",
    "served_model",
    "serving_models",
]

#: Output tokens a strict-mode hold assumes for a model that may serve a chat call when
#: neither the call nor the model caps its output (no ``max_output_tokens``, no
#: `ServingModel.max_output_tokens`).
DEFAULT_MAX_OUTPUT_TOKENS = 4096


class Priced(Protocol):
    """What prices a model by name (a [`CostBudget`][])."""

    def price_for(self, model: str | None) -> ModelPrice: ...


@dataclass(frozen=True, slots=True)
class ServingModel:
    """A model that may serve a call, and the most output tokens it writes per call.

    Examples:
        >>> ServingModel("gpt-4o", max_output_tokens=16384)
        ServingModel(name='gpt-4o', max_output_tokens=16384)

    Strict mode holds each call's worst case over every model that may serve it (see
    [`BudgetGate.worst_case_cost`][]); pass the members of a fallback chain as
    ``may_serve=[ServingModel(...), ...]``. A ``name`` of None is priced at the surface
    prices. ``TypeError``/``ValueError`` name the field that is wrong.
    """

    #: The model's name, priced by [`CostBudget.price_for`][]; None: the surface prices.
    name: str | None
    #: Its own output cap (its ``max_tokens``, else its provider's documented maximum);
    #: None: unknown, so `DEFAULT_MAX_OUTPUT_TOKENS` unless the call sets one. >= 0.
    max_output_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise TypeError(f"ServingModel.name must be a non-empty str or None, got {self.name!r}")
        if self.max_output_tokens is not None:
            checks.count("ServingModel.max_output_tokens", self.max_output_tokens)


def serving_models(
    model: str | None, may_serve: Sequence[str | ServingModel]
) -> list[ServingModel]:
    """Every model that may serve a call: ``model`` and ``may_serve``, as
    [`worst_case_cost`][llm_resilience.BudgetGate.worst_case_cost] counts them (an uncapped entry
    gives way to a capped one of the same name)."""
    if isinstance(may_serve, str):
        raise TypeError(f"may_serve must be a sequence of model names, not the str {may_serve!r}")
    listed: list[ServingModel] = []
    for entry in may_serve:
        if isinstance(entry, ServingModel):
            listed.append(entry)
        elif isinstance(entry, str) and entry:
            listed.append(ServingModel(entry))
        else:
            raise TypeError(
                f"may_serve entries must be model names or ServingModel(name, "
                f"max_output_tokens), got {entry!r}"
            )
    if model is not None or not listed:
        listed.insert(0, ServingModel(model))
    capped = {entry.name for entry in listed if entry.max_output_tokens is not None}
    return [
        entry for entry in listed if entry.max_output_tokens is not None or entry.name not in capped
    ]


#: Names a framework gives a model it cannot name (LlamaIndex's default ``model_name``).
_PLACEHOLDER_NAMES = frozenset({"unknown"})


def served_model(*candidates: object) -> str | None:
    """The model a ledger entry names: the first candidate that is a model's name, else None.

    The rule for every wrapper and surface: pass, most specific first, the name the
    provider's response reports, then the fallback member that answered (when a chain
    says), then the wrapped model's own name. A candidate is a name when it is non-empty
    text other than a framework's placeholder (``"unknown"``, LlamaIndex's default). An
    embedding entry names the embedding model the same way, and None when it has no name
    (it is then priced at the surface prices).

    Examples:
        >>> served_model(None, "", "gpt-4o-2024-08-06", "gpt-4o")
        'gpt-4o-2024-08-06'
        >>> served_model("unknown") is None
        True
    """
    for candidate in candidates:
        if isinstance(candidate, str) and candidate and candidate not in _PLACEHOLDER_NAMES:
            return candidate
    return None


def dearest_model(
    budget: Priced, usage: Usage, may_serve: Sequence[str | ServingModel]
) -> str | None:
    """Of the models that may have served a chat call, the one that prices ``usage`` highest.

    For an entry whose serving model is unknown (a stream through a fallback chain closed
    before the chain said which member answered): named and priced at the dearest
    candidate, the ledger never under-records it. The first of equals wins; None when
    ``may_serve`` is empty (the surface prices).

    Examples:
        >>> from llm_resilience.budget import CostBudget
        >>> budget = CostBudget(daily_limit=1, prices={"dear": ModelPrice(10, 40)})
        >>> dearest_model(budget, Usage(100, 10, estimated=True), ["cheap", "dear"])
        'dear'
    """
    names = [entry.name for entry in serving_models(None, may_serve)]
    return max(names, key=lambda name: cost_of(usage, budget.price_for(name)))


def first_count(*counts: int | None) -> int:
    """The first count that is not None (the last one always is a count)."""
    return next(count for count in counts if count is not None)
