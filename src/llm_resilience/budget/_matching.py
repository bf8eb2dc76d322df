"""Which configured price a served model's name takes, and the warning when none fits.

A provider answers with either an alias (``gpt-4o``, ``claude-sonnet-4-5``) or a dated
snapshot of it (``gpt-4o-2024-08-06``, ``claude-sonnet-4-5-20250929``, Vertex's
``claude-sonnet-4-5@20250929``), and the same model can be named both ways in one process
(LlamaIndex's Anthropic stream never names the snapshot its calls name). The rule, in order:

1. ``exact``: the served name is a key.
2. ``snapshot``: the served name is a dated snapshot whose alias is a key (``gpt-4o``
   prices ``gpt-4o-2024-08-06``).
3. ``alias``: the served name is an alias and exactly one key is a dated snapshot of it
   (``claude-sonnet-4-5-20250929`` prices ``claude-sonnet-4-5``); with two snapshots keyed
   the alias is ambiguous and takes neither.
4. ``default``: the budget's surface prices.

A date suffix is ``-YYYYMMDD``, ``-YYYY-MM-DD`` or ``@YYYYMMDD``, nothing else: no prefix
match, so ``gpt-4o`` never prices ``gpt-4o-mini`` and ``gpt-4`` never ``gpt-4-turbo``.
A dated key prices its own snapshot and its alias, never another date of the same alias
(snapshots of one alias are priced differently: ``gpt-4o-2024-05-13`` and
``gpt-4o-2024-08-06``).

The ``alias`` and ``default`` rules are guesses, so the first record priced by either
warns once per model name, naming it, and every such record counts on the
``llm_resilience.budget.unpriced`` counter.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from llm_resilience.money import ModelPrice
from llm_resilience.telemetry import record_guessed_price

__all__ = ["GUESSED_RULES", "PriceMatch", "alias_of", "match_price", "warn_guessed_price"]

_log = logging.getLogger("llm_resilience.budget")

Rule = Literal["exact", "snapshot", "alias", "default"]

_DATED = re.compile(r"(?:-\d{8}|-\d{4}-\d{2}-\d{2}|@\d{8})$")


def alias_of(model: str) -> str | None:
    """The alias a dated snapshot's name stands for, or None when ``model`` is not dated.

    Examples:
        >>> alias_of("gpt-4o-2024-08-06"), alias_of("claude-sonnet-4-5@20250929")
        ('gpt-4o', 'claude-sonnet-4-5')
        >>> alias_of("gpt-4o-mini") is None
        True
    """
    found = _DATED.search(model)
    if found is None or found.start() == 0:
        return None
    return model[: found.start()]


@dataclass(frozen=True, slots=True)
class PriceMatch:
    """A served name's price and the rule that chose it (``key`` None: the default)."""

    price: ModelPrice | None
    rule: Rule
    key: str | None


_DEFAULT = PriceMatch(None, "default", None)

#: The rules that guess a price: a record priced by one is counted and warned about.
GUESSED_RULES = frozenset({"alias", "default"})


def match_price(prices: Mapping[str, ModelPrice], model: str | None) -> PriceMatch:
    """The price ``model`` takes from ``prices`` by the rule in this module's docstring.

    Examples:
        >>> match_price({"gpt-4o": ModelPrice(2, 8)}, "gpt-4o-2024-08-06").rule
        'snapshot'
        >>> match_price({"gpt-4o": ModelPrice(2, 8)}, "gpt-4o-mini").rule
        'default'
    """
    if model is None or not prices:
        return _DEFAULT
    exact = prices.get(model)
    if exact is not None:
        return PriceMatch(exact, "exact", model)
    alias = alias_of(model)
    if alias is not None:
        keyed = prices.get(alias)
        return _DEFAULT if keyed is None else PriceMatch(keyed, "snapshot", alias)
    snapshots = [key for key in prices if alias_of(key) == model]
    if len(snapshots) == 1:
        return PriceMatch(prices[snapshots[0]], "alias", snapshots[0])
    return _DEFAULT


# Model names are a small set in any process; the cap keeps a process that is sent
# arbitrary names (a proxy, say) from growing this without end. Past it, no more warnings.
_WARNED_CAP = 1024
_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_guessed_price(model: str | None, match: PriceMatch, surface: str) -> None:
    """Count a record priced by the ``alias`` or ``default`` rule, and warn once per
    process per model name (a record naming no model counts, and never warns)."""
    if match.rule not in GUESSED_RULES:
        return
    record_guessed_price(model=model, rule=match.rule, surface=surface)
    # Warned already (the usual case): the set only grows, and reading it needs no lock.
    if model is None or model in _warned:
        return
    with _warned_lock:
        if model in _warned or len(_warned) >= _WARNED_CAP:
            return
        _warned.add(model)
    if match.rule == "default":
        _log.warning(
            "model %r has no price in CostBudget.prices: its calls are priced at the "
            "budget's surface prices; add prices={%r: ModelPrice(...)} to price it",
            model,
            model,
        )
    else:
        _log.warning(
            "model %r is priced by the dated key %r (the only snapshot of it in "
            "CostBudget.prices); add prices={%r: ModelPrice(...)} if the alias is priced "
            "differently",
            model,
            match.key,
            model,
        )
