"""The budget's options: prices and spend limits, checked and parsed once, when built."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType

from llm_resilience.budget._matching import PriceMatch, match_price
from llm_resilience.ledger import Window
from llm_resilience.ledger._protocol import Limit
from llm_resilience.money import ModelPrice, Money, money, optional_money

__all__ = ["CostBudget", "ModelPrice"]


@dataclass(frozen=True, init=False)
class CostBudget:
    """Prices and spend limits, exact to the last digit (``Decimal``).

    Examples:
        >>> budget = CostBudget(input_price_per_mtok=3, output_price_per_mtok=15,
        ...                     embedding_price_per_mtok="0.02", daily_limit=25, monthly_limit=400)

    Money is ``Decimal``, ``int`` or ``str`` in whatever currency the prices are quoted in;
    a float raises ``TypeError`` ("use Decimal('0.15') or a string"). Validated here:
    no negative values (``ValueError`` naming the option), and at least one of
    ``daily_limit``, ``monthly_limit``, ``global_daily_limit``, ``global_monthly_limit``.
    A limit of 0 is a kill switch: every call is refused.

    Windows are UTC calendar windows: ``day`` is the current UTC date, ``month`` the current
    UTC month from its first day. Scopes (a tenant, a user, a hash of an API key passed to
    [`BudgetGate.begin`][]):

    * a call without a scope is gated by ``daily_limit``/``monthly_limit`` and by
      ``global_daily_limit``/``global_monthly_limit``, all against the global spend;
    * a call with ``scope="tenant-1"`` is gated by ``daily_limit``/``monthly_limit``
      against that scope's own spend, and by the ``global_*`` limits against the global
      spend (every scope together).

    ``prices`` maps model names to [`ModelPrice`][], applied to the model that actually
    served: the exact name first, then the alias of a dated snapshot (``"gpt-4o"`` prices
    ``"gpt-4o-2024-08-06"``, never ``"gpt-4o-mini"``), then the one dated key of an alias
    (``"claude-sonnet-4-5-20250929"`` prices ``"claude-sonnet-4-5"``), else the three
    surface prices; the last two warn once per model (``llm_resilience.budget._matching``).

    ``strict=True`` reserves each call's worst-case cost at the gate, so concurrent calls
    cannot overshoot a limit (see [`BudgetGate`][]). Without it the gate is a pre-call
    check: every call in flight when the limit is reached still completes and records, so
    spend can exceed a limit by up to the cost of the calls running concurrently.
    """

    #: Chat price per million input tokens.
    input_price_per_mtok: Decimal
    #: Chat price per million output tokens.
    output_price_per_mtok: Decimal
    #: Embedding price per million input tokens.
    embedding_price_per_mtok: Decimal
    #: Limit of a UTC day: global spend for unscoped calls, the scope's spend for scoped ones.
    daily_limit: Decimal | None
    #: Limit of a UTC month, scoped like ``daily_limit``.
    monthly_limit: Decimal | None
    #: Per-model prices (read-only), keyed by model name: an alias or a dated snapshot.
    prices: Mapping[str, ModelPrice] = field(hash=False)
    #: Limit of the global spend of a UTC day, for every call, scoped or not.
    global_daily_limit: Decimal | None
    #: Limit of the global spend of a UTC month, for every call, scoped or not.
    global_monthly_limit: Decimal | None
    #: Reserve worst-case cost at the gate so concurrency cannot overshoot.
    strict: bool
    #: The three surface prices as one ``ModelPrice``, built once (every call prices).
    _surface_price: ModelPrice = field(init=False, repr=False, compare=False)

    def __init__(
        self,
        input_price_per_mtok: Money = 0,
        output_price_per_mtok: Money = 0,
        embedding_price_per_mtok: Money = 0,
        daily_limit: Money | None = None,
        monthly_limit: Money | None = None,
        *,
        prices: Mapping[str, ModelPrice] | None = None,
        global_daily_limit: Money | None = None,
        global_monthly_limit: Money | None = None,
        strict: bool = False,
    ) -> None:
        assign = object.__setattr__
        for option, value in (
            ("input_price_per_mtok", input_price_per_mtok),
            ("output_price_per_mtok", output_price_per_mtok),
            ("embedding_price_per_mtok", embedding_price_per_mtok),
        ):
            assign(self, option, money(option, value))
        limits = {
            "daily_limit": daily_limit,
            "monthly_limit": monthly_limit,
            "global_daily_limit": global_daily_limit,
            "global_monthly_limit": global_monthly_limit,
        }
        for option, limit in limits.items():
            assign(self, option, optional_money(option, limit))
        if all(limit is None for limit in limits.values()):
            raise ValueError(
                "CostBudget needs at least one limit: set daily_limit, monthly_limit, "
                "global_daily_limit or global_monthly_limit (money >= 0; 0 refuses every call)"
            )
        checked: dict[str, ModelPrice] = {}
        for model, price in (prices or {}).items():
            if not isinstance(model, str) or not model:
                raise TypeError(f"prices keys must be non-empty model names, got {model!r}")
            if not isinstance(price, ModelPrice):
                raise TypeError(
                    f"prices[{model!r}] must be a ModelPrice(input_per_mtok, output_per_mtok), "
                    f"got {price!r}"
                )
            checked[model] = price
        assign(self, "prices", MappingProxyType(checked))
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be True or False, got {strict!r}")
        assign(self, "strict", strict)
        assign(
            self,
            "_surface_price",
            ModelPrice(
                self.input_price_per_mtok,
                self.output_price_per_mtok,
                self.embedding_price_per_mtok,
            ),
        )

    def price_for(self, model: str | None) -> ModelPrice:
        """The price of ``model``: exact name, else its alias or snapshot, else surface prices.

        Examples:
            >>> budget = CostBudget(daily_limit=1, prices={"gpt-4o": ModelPrice(2, 8)})
            >>> budget.price_for("gpt-4o-2024-08-06").output_per_mtok
            Decimal('8')
        """
        matched = match_price(self.prices, model).price
        return self._surface_price if matched is None else matched

    def price_match(self, model: str | None) -> PriceMatch:
        """The price ``model`` takes and the rule that chose it (price None: surface prices).

        Examples:
            >>> CostBudget(daily_limit=1, prices={"gpt-4o": ModelPrice(2, 8)}).price_match(
            ...     "gpt-4o-mini"
            ... ).rule
            'default'
        """
        return match_price(self.prices, model)

    def limits_for(self, scope: str | None) -> list[Limit]:
        """The limits gating a call of ``scope``, day first: ``(window, spend scope, limit)``.

        The spend scope is ``scope`` for a scope's own limit and None for the global spend.
        An unscoped call with both ``daily_limit`` and ``global_daily_limit`` gets the lower.
        """
        windows: tuple[tuple[Window, Decimal | None, Decimal | None], ...] = (
            ("day", self.daily_limit, self.global_daily_limit),
            ("month", self.monthly_limit, self.global_monthly_limit),
        )
        found: list[Limit] = []
        for window, own, overall in windows:
            if scope is None:
                present = [limit for limit in (own, overall) if limit is not None]
                if present:
                    found.append((window, None, min(present)))
                continue
            if own is not None:
                found.append((window, scope, own))
            if overall is not None:
                found.append((window, None, overall))
        return found
