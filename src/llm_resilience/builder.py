"""The rules of ``ResilienceBuilder``: which layer wraps which surface, in which order.

A builder holds up to three surfaces (``"chat"``, ``"embeddings"``, ``"vector_store"``)
and, for each, the layers asked for so far. The rules live here, once, framework-free;
each adapter's ``ResilienceBuilder`` subclasses [`ResiliencePlan`][] and only names
its framework's types: the wrapper class of each layer on each surface (`_wrappers`,
built with the layer's fields as keywords) and the classes each surface accepts
(`_accepted`).

- Call order is nesting order: each ``use_*`` wraps what is registered for its surfaces
  at that point, so the last call is the outermost layer.
- ``use_rate_limiting`` and ``use_cost_budgeting`` are idempotent per surface: the first
  configuration of a surface wins and a repeat never adds a second layer. They are also
  all-or-nothing: a surface they are asked to wrap that has nothing registered raises
  ``ValueError`` at once, and nothing is wrapped.
- ``configure_resilience`` re-configures: the last policy wins, still one retry layer.
- A surface is registered once: registering it again (the same object, another one, or a
  member of the fallback chain) raises ``ValueError`` at that call, with advice that builds,
  and leaves the plan as it was.
- ``build()`` refuses (``ValueError`` naming the call and the surface) a surface registered
  after a layer meant to wrap it, since that surface would silently escape the layer.

Layers are recorded, not built, until [`ResiliencePlan.build`][]; every option is
checked when its ``use_*`` call is made. Without a framework, the plan is usable with a
``_wrap`` of your own:

Examples:
    >>> class Boxes(ResiliencePlan):
    ...     def _wrap(self, surface, layer, inner):
    ...         return (type(layer).__name__, inner)
    >>> Boxes().register_chat("model").use_rate_limiting(chat_requests_per_minute=60).build().chat
    ('RateLimitLayer', 'model')
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self, TypeAlias

from llm_resilience import checks
from llm_resilience.budget import CostBudget

if TYPE_CHECKING:
    from llm_resilience.ledger import CostLedger

__all__ = [
    "BudgetLayer",
    "Layer",
    "RateLimitLayer",
    "ResiliencePlan",
    "ResilienceStack",
    "RetryLayer",
    "Surface",
]

logger = logging.getLogger(__name__)

#: The surfaces a builder holds.
Surface: TypeAlias = Literal["chat", "embeddings", "vector_store"]
_SURFACES: tuple[Surface, ...] = ("chat", "embeddings", "vector_store")
_BUDGETED: tuple[Surface, ...] = ("chat", "embeddings")
_RETRIED: tuple[Surface, ...] = ("embeddings", "vector_store")
_REGISTER_CALL = {
    "chat": "register_chat",
    "embeddings": "register_embeddings",
    "vector_store": "register_vector_store",
}


@dataclass(frozen=True, slots=True)
class RateLimitLayer:
    """Take a permit from ``limiter`` before each call (a ``RateLimited*`` wrapper)."""

    #: The limiter the wrapper waits on (built from the numbers, or shared).
    limiter: Any


@dataclass(frozen=True, slots=True)
class BudgetLayer:
    """Gate each call on ``budget`` and record it in ``ledger`` (a ``CostTracked*`` wrapper)."""

    #: Prices, limits and mode.
    budget: CostBudget
    #: Where spend is recorded; one ledger serves every surface of one ``use_cost_budgeting``.
    ledger: CostLedger
    #: Budget scope of every call, or None.
    scope: str | None = None


@dataclass(frozen=True, slots=True)
class RetryLayer:
    """Run each call through a retry policy (a ``Retrying*`` wrapper)."""

    #: A ``llm_resilience.retry.RetryPolicy``, or None for the default policy.
    policy: Any = None


#: A layer a builder puts around a surface.
Layer: TypeAlias = RateLimitLayer | BudgetLayer | RetryLayer


@dataclass(frozen=True, slots=True)
class ResilienceStack:
    """What ``build()`` returns: each surface, wrapped in its layers (None if unregistered)."""

    #: The chat model (or LLM), outermost layer first.
    chat: Any = None
    #: The embeddings model.
    embeddings: Any = None
    #: The vector store.
    vector_store: Any = None


@dataclass(slots=True)
class _Step:
    """One ``use_*``/``configure_*`` call: its name and the surfaces it means to wrap."""

    call: str
    covers: frozenset[Surface]


@dataclass(slots=True)
class _SurfaceState:
    base: Any
    layers: list[Layer] = field(default_factory=list)


class ResiliencePlan:
    """The builder's rules, over any objects: subclasses say how a layer is built.

    Every method but [`build`][] returns the plan itself, so calls chain. See the
    module docstring for the rules; ``docs/composition.md`` for the order to use.
    Configure a plan from one thread; the objects it builds are safe to share.
    """

    __slots__ = (
        "_default_ledger",
        "_late",
        "_registered",
        "_sql_ledger",
        "_steps",
        "_surfaces",
    )

    #: The framework named when a surface is refused (`"LangChain"`, `"LlamaIndex"`).
    _framework: ClassVar[str] = ""
    #: The classes each surface accepts (a surface not named here takes any object).
    _accepted: ClassVar[Mapping[Surface, tuple[type[Any], ...]]] = {}
    #: The wrapper of each kind of layer on each surface, called as
    #: `wrapper(inner=..., **the layer's fields)`: `limiter=`; `budget=`, `ledger=`,
    #: `scope=`; `policy=`.
    _wrappers: ClassVar[Mapping[tuple[type[Any], Surface], Callable[..., Any]]] = {}

    def __init__(self) -> None:
        self._surfaces: dict[Surface, _SurfaceState] = {}
        self._steps: list[_Step] = []
        # (call that came too late, the earlier call that meant to wrap its surface, surface)
        self._late: list[tuple[str, str, Surface]] = []
        # Each surface's registration, in time or late: the call, and what it was given
        # (the model, or the chain's members).
        self._registered: dict[Surface, tuple[str, tuple[Any, ...]]] = {}
        self._sql_ledger: tuple[str, dict[str, Any]] | None = None
        self._default_ledger: CostLedger | None = None

    # -- what a framework adapter supplies -------------------------------------

    def _check_surface(self, surface: Surface, value: object, option: str) -> None:
        """Raise ``TypeError`` if ``value`` is None or none of the surface's `_accepted`."""
        if value is None:
            raise TypeError(f"{option} must be an object to wrap; got None")
        expected = self._accepted.get(surface)
        if expected and not isinstance(value, expected):
            raise TypeError(
                f"{option} must be a {self._framework} {expected[0].__name__}; "
                f"got {type(value).__name__}"
            )

    def _fallback_chain(self, members: Sequence[Any], options: Mapping[str, Any]) -> Any:
        """The fallback chain over ``members`` (adapters return their framework's chain)."""
        from llm_resilience.fallback import FallbackChain

        return FallbackChain(list(members), **options)

    def _wrap(self, surface: Surface, layer: Layer, inner: Any) -> Any:
        """``inner`` wrapped in ``layer``: the `_wrappers` entry for the layer and surface."""
        wrapper = self._wrappers.get((type(layer), surface))
        if wrapper is None:
            raise NotImplementedError(
                f"{type(self).__name__} cannot build a {type(layer).__name__}: use the "
                "ResilienceBuilder of langchain_llm_resilience or llama_index.resilience"
            )
        options = {option.name: getattr(layer, option.name) for option in fields(layer)}
        return wrapper(inner=inner, **options)

    # -- registering surfaces --------------------------------------------------

    def register_chat(self, model: Any) -> Self:
        """Register the chat model (or LLM) the chat layers will wrap."""
        return self._register("chat", model, "model")

    def register_embeddings(self, embeddings: Any) -> Self:
        """Register the embeddings model the embedding layers will wrap."""
        return self._register("embeddings", embeddings, "embeddings")

    def register_vector_store(self, vector_store: Any) -> Self:
        """Register the vector store ``configure_resilience`` will wrap."""
        return self._register("vector_store", vector_store, "vector_store")

    def _register(self, surface: Surface, value: Any, option: str) -> Self:
        call = _REGISTER_CALL[surface]
        self._check_surface(surface, value, f"{call}({option})")
        self._refuse_twice(call, surface, (value,))
        self._store(call, surface, value, (value,))
        return self

    def _refuse_twice(self, call: str, surface: Surface, given: Sequence[Any]) -> None:
        """Raise ``ValueError`` at the call if ``surface`` is registered already, with
        advice that builds: a builder holds one object per surface, registered once."""
        if surface not in self._registered:
            return
        earlier, held = self._registered[surface]
        label = {"chat": "chat model", "embeddings": "embeddings model"}.get(
            surface, _label(surface)
        )
        if call == "use_fallback_chain":
            drop = "drop that register_chat and " if earlier == "register_chat" else ""
            raise ValueError(
                f"use_fallback_chain registers the chat model, but one is already registered "
                f"(by {earlier}): {drop}put every model in use_fallback_chain's list instead"
            )
        if any(item is value for item in held for value in given):
            if earlier == "use_fallback_chain":
                raise ValueError(
                    f"{call}: this {label} is already registered, as a member of "
                    f"use_fallback_chain's chain (the chat model the layers wrap): drop this "
                    f"{call}"
                )
            raise ValueError(
                f"{call}: this {label} is already registered, by an earlier {earlier}: "
                f"register each surface once, before the calls meant to wrap it, and drop "
                f"this {call}"
            )
        if earlier == "use_fallback_chain":
            advice = (
                "to have the chain try this model too, put it in use_fallback_chain's list "
                "and drop this register_chat"
            )
        elif surface == "chat":
            advice = (
                "to try both in turn, replace both register_chat calls with one "
                "use_fallback_chain([first, second]); to wrap this one on its own, give it "
                "a ResilienceBuilder() of its own"
            )
        else:
            advice = "to wrap this one too, give it a ResilienceBuilder() of its own"
        raise ValueError(
            f"{call}: another {label} is already registered, by {earlier}, and a builder "
            f"holds one: {advice}"
        )

    def _store(self, call: str, surface: Surface, value: Any, given: tuple[Any, ...]) -> None:
        self._registered[surface] = (call, given)
        meant = [step.call for step in self._steps if surface in step.covers]
        if meant:
            # Refused by build(), which names both calls: the layer would miss this surface.
            self._late.append((call, meant[0], surface))
            return
        self._surfaces[surface] = _SurfaceState(value)

    # -- layers -----------------------------------------------------------------

    def use_fallback_chain(self, models: Sequence[Any], **options: Any) -> Self:
        """Register as the chat surface a fallback chain over ``models``, tried in order.

        ``options`` are the chain's own (``per_client_timeout=30``, ``cooldown=...``),
        checked now. Raises ``ValueError`` if a chat model is already registered: pass it
        in ``models`` instead.
        """
        self._refuse_twice("use_fallback_chain", "chat", ())
        if isinstance(models, (str, bytes)) or not isinstance(models, Sequence):
            raise TypeError(
                f"use_fallback_chain needs a list of models, primary first; "
                f"got {type(models).__name__}"
            )
        for index, member in enumerate(models):
            self._check_surface("chat", member, f"use_fallback_chain(models[{index}])")
        chain = self._fallback_chain(list(models), options)
        self._store("use_fallback_chain", "chat", chain, tuple(models))
        self._steps.append(_Step("use_fallback_chain", frozenset({"chat"})))
        return self

    def use_rate_limiting(
        self,
        *,
        chat_requests_per_minute: int | None = None,
        embedding_requests_per_minute: int | None = None,
        chat_tokens_per_minute: int | None = None,
        embedding_tokens_per_minute: int | None = None,
        max_queued_requests: int | None = None,
        chat_limiter: Any = None,
        embedding_limiter: Any = None,
    ) -> Self:
        """Make the chat and/or embeddings surface wait for a permit before each call.

        A surface is configured by its ``*_requests_per_minute`` and/or
        ``*_tokens_per_minute`` (a new ``TokenBucketRateLimiter``; tokens only leaves
        requests unlimited; with ``max_queued_requests`` if given) or its ``*_limiter``
        (a limiter shared with other wrappers or processes, such as a
        ``RedisTokenBucketRateLimiter``; pass the same one to both to share it). Raises
        ``ValueError`` when no surface is configured, or a configured one has nothing
        registered (and then wraps nothing).
        A surface already rate limited keeps its first configuration.
        """
        from llm_resilience.ratelimit import limiter_for

        wanted: dict[Surface, Any] = {}
        options: tuple[tuple[Surface, str, Any, Any, Any], ...] = (
            ("chat", "chat_", chat_requests_per_minute, chat_tokens_per_minute, chat_limiter),
            (
                "embeddings",
                "embedding_",
                embedding_requests_per_minute,
                embedding_tokens_per_minute,
                embedding_limiter,
            ),
        )
        for surface, prefix, requests, tokens, shared in options:
            if requests is None and tokens is None and shared is None:
                continue
            try:
                wanted[surface] = limiter_for(
                    requests_per_minute=requests,
                    max_queued_requests=max_queued_requests,
                    tokens_per_minute=tokens,
                    limiter=shared,
                )
            except (TypeError, ValueError) as error:
                raise type(error)(f"use_rate_limiting ({prefix}*): {error}") from None
        if not wanted:
            raise ValueError(
                "use_rate_limiting needs chat_requests_per_minute, chat_tokens_per_minute, "
                "embedding_requests_per_minute, embedding_tokens_per_minute, chat_limiter "
                "or embedding_limiter"
            )
        self._add(
            "use_rate_limiting", {s: RateLimitLayer(limiter) for s, limiter in wanted.items()}
        )
        return self

    def use_sql_cost_ledger(self, url: str, **options: Any) -> Self:
        """Record the spend of a later ``use_cost_budgeting`` in ``SqlCostLedger(url)``.

        ``options`` are the ledger's (``operation_timeout=``, ...). The ledger is opened
        by ``use_cost_budgeting``, and only if that call gets no ``ledger=`` of its own
        (an explicit ledger wins). Raises ``ValueError`` after ``use_cost_budgeting``,
        whose spend already goes elsewhere.
        """
        from llm_resilience.ledger._sql import _parse_url

        if any(step.call == "use_cost_budgeting" for step in self._steps):
            raise ValueError(
                "use_sql_cost_ledger must come before use_cost_budgeting: the budget already "
                "records its spend in another ledger"
            )
        _parse_url(url)
        self._sql_ledger = (url, dict(options))
        return self

    def use_cost_budgeting(
        self,
        budget: CostBudget,
        ledger: CostLedger | None = None,
        *,
        scope: str | None = None,
        surfaces: Iterable[Surface] | None = None,
    ) -> Self:
        """Refuse calls once ``budget``'s limits are reached, and record each call's spend.

        ``surfaces`` defaults to the chat and embeddings surfaces that are registered
        (raising ``ValueError`` if neither is); name them, e.g. ``surfaces=["chat"]``, to
        leave one out, in which case each must be registered. Spend goes to ``ledger``,
        else to the ``use_sql_cost_ledger`` ledger, else to one ``InMemoryCostLedger``
        (which resets with the process: one WARNING names ``SqlCostLedger``, as a
        ``CostTracked*`` wrapper given no ledger does); the surfaces share it. A
        surface already budgeted keeps its first configuration.

        Opening the SQL ledger is the one call to a dependency a builder makes; it is
        bounded by the ledger's ``connect_timeout`` and ``operation_timeout``, and if it
        fails (or is cancelled), nothing is wrapped and the next call tries again.
        """
        if not isinstance(budget, CostBudget):
            raise TypeError(f"budget must be a CostBudget(...); got {type(budget).__name__}")
        scope = checks.scope("scope", scope)
        if ledger is not None:
            from llm_resilience.budget._ledger import checked_ledger

            ledger = checked_ledger(ledger)
        if surfaces is None:
            chosen = [s for s in _BUDGETED if s in self._surfaces]
            if not chosen:
                raise ValueError(
                    "use_cost_budgeting wraps the chat and embeddings surfaces, but neither is "
                    "registered: call register_chat, use_fallback_chain or register_embeddings "
                    "first"
                )
            covers = frozenset(_BUDGETED)
        else:
            chosen = _surfaces_option(surfaces, _BUDGETED)
            covers = frozenset(chosen)
        self._require_registered("use_cost_budgeting", chosen)
        layers: dict[Surface, Layer] = {}
        if any(not self._has(surface, BudgetLayer) for surface in chosen):
            budget_ledger = ledger if ledger is not None else self._ledger()
            layers = {surface: BudgetLayer(budget, budget_ledger, scope) for surface in chosen}
        self._add("use_cost_budgeting", layers, covers=covers)
        return self

    def configure_resilience(self, policy: Any = None) -> Self:
        """Retry the embeddings and vector store calls with ``policy`` (a ``RetryPolicy``).

        None is the default policy (4 attempts, exponential backoff with jitter). Wraps
        whichever of the two is registered; raises ``ValueError`` if neither is. A repeat
        call replaces the policy (the last wins) and never adds a second retry layer.
        """
        if policy is not None:
            from llm_resilience.retry import RetryPolicy

            if not isinstance(policy, RetryPolicy):
                raise TypeError(
                    f"policy must be a RetryPolicy(...) or None; got {type(policy).__name__}"
                )
        chosen = [s for s in _RETRIED if s in self._surfaces]
        if not chosen:
            raise ValueError(
                "configure_resilience wraps the embeddings and the vector store, but neither "
                "is registered: call register_embeddings or register_vector_store first"
            )
        for surface in chosen:
            state = self._surfaces[surface]
            for index, layer in enumerate(state.layers):
                if isinstance(layer, RetryLayer):
                    state.layers[index] = replace(layer, policy=policy)
                    break
            else:
                state.layers.append(RetryLayer(policy))
        self._steps.append(_Step("configure_resilience", frozenset(_RETRIED)))
        return self

    # -- building -----------------------------------------------------------------

    def layers(self, surface: Surface) -> tuple[Layer, ...]:
        """The layers planned for ``surface``, innermost first."""
        state = self._surfaces.get(surface)
        return tuple(state.layers) if state is not None else ()

    def build(self) -> ResilienceStack:
        """Build every registered surface in its layers, innermost first.

        Raises ``ValueError`` when nothing is registered, or when a surface was registered
        after a call meant to wrap it (the message names both calls and the surface).
        Each build makes new wrappers; limiters and ledgers are shared between builds.
        """
        if self._late:
            late, earlier, surface = self._late[0]
            raise ValueError(
                f"{late} came after {earlier}, which wraps the {_label(surface)} registered "
                f"before it, so this {_label(surface)} would escape that layer: call {late} "
                f"before {earlier}"
            )
        if not self._surfaces:
            raise ValueError(
                "nothing to build: register a surface first (register_chat, "
                "use_fallback_chain, register_embeddings or register_vector_store)"
            )
        built: dict[str, Any] = {}
        for surface, state in self._surfaces.items():
            current = state.base
            for layer in state.layers:
                current = self._wrap(surface, layer, current)
            built[surface] = current
        return ResilienceStack(**built)

    # -- rules shared by the use_* calls --------------------------------------------

    def _has(self, surface: Surface, kind: type[Any]) -> bool:
        return any(isinstance(layer, kind) for layer in self.layers(surface))

    def _require_registered(self, call: str, surfaces: Iterable[Surface]) -> None:
        missing = [s for s in surfaces if s not in self._surfaces]
        if missing:
            needed = " and ".join(_label(s) for s in missing)
            how = " or ".join(
                ("register_chat or use_fallback_chain" if s == "chat" else _REGISTER_CALL[s])
                for s in missing
            )
            raise ValueError(
                f"{call} was asked to wrap the {needed}, but nothing is registered there: "
                f"call {how} first (nothing was wrapped)"
            )

    def _add(
        self,
        call: str,
        layers: Mapping[Surface, Layer],
        *,
        covers: frozenset[Surface] | None = None,
    ) -> None:
        """Append each layer to its surface, unless the surface already has one of its kind."""
        self._require_registered(call, layers)
        for surface, layer in layers.items():
            if self._has(surface, type(layer)):
                logger.info(
                    "%s: the %s already has this layer; the first configuration is kept",
                    call,
                    _label(surface),
                )
                continue
            self._surfaces[surface].layers.append(layer)
        self._steps.append(_Step(call, covers if covers is not None else frozenset(layers)))

    def _ledger(self) -> CostLedger:
        """The ledger of a budget given none: the SQL one if asked for, else in memory."""
        if self._default_ledger is None:
            if self._sql_ledger is not None:
                from llm_resilience.ledger import SqlCostLedger

                url, options = self._sql_ledger
                self._default_ledger = SqlCostLedger(url, **options)
            else:
                # The gate's own default and warning, once for every surface of this budget:
                # the wrappers get this ledger by name, so they do not warn again.
                from llm_resilience.budget._ledger import default_ledger

                self._default_ledger = default_ledger()
        return self._default_ledger


def _label(surface: Surface) -> str:
    return {"chat": "chat model", "embeddings": "embeddings", "vector_store": "vector store"}[
        surface
    ]


def _surfaces_option(value: object, allowed: Sequence[Surface]) -> list[Surface]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise TypeError(f"surfaces must be a list drawn from {list(allowed)}; got {value!r}")
    chosen: list[Surface] = []
    for item in value:
        if item not in allowed:
            raise ValueError(f"surfaces must be drawn from {list(allowed)}; got {item!r}")
        if item not in chosen:
            chosen.append(item)
    if not chosen:
        raise ValueError(f"surfaces must name at least one of {list(allowed)}; got none")
    return chosen
