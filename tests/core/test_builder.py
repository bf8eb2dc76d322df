"""The builder's rules, framework-free: order, idempotency, all-or-nothing, refusals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from llm_resilience import CostBudget, InMemoryCostLedger, ResiliencePlan, SqlCostLedger
from llm_resilience.builder import BudgetLayer, Layer, RateLimitLayer, RetryLayer, Surface
from llm_resilience.fallback import FallbackChain
from llm_resilience.ratelimit import TokenBucketRateLimiter
from llm_resilience.retry import RetryPolicy

BUDGET = CostBudget(input_price_per_mtok=3, output_price_per_mtok=15, daily_limit=25)


class Box:
    """A stand-in wrapper: which layer, around what."""

    def __init__(self, surface: Surface, layer: Layer, inner: Any) -> None:
        self.surface = surface
        self.layer = layer
        self.inner = inner


class Plan(ResiliencePlan):
    """The rules with the simplest translation: each layer becomes a Box."""

    def _wrap(self, surface: Surface, layer: Layer, inner: Any) -> Any:
        return Box(surface, layer, inner)


def kinds(built: Any) -> list[str]:
    """Layer kinds from the outside in, then the base object."""
    found: list[str] = []
    while isinstance(built, Box):
        found.append(type(built.layer).__name__)
        built = built.inner
    return [*found, built if isinstance(built, str) else type(built).__name__]


def test_call_order_is_nesting_order_with_the_last_call_outermost() -> None:
    stack = (
        Plan()
        .use_fallback_chain(["primary", "secondary"], per_client_timeout=30)
        .use_rate_limiting(chat_requests_per_minute=300)
        .use_cost_budgeting(BUDGET)
        .build()
    )

    assert kinds(stack.chat) == ["BudgetLayer", "RateLimitLayer", "FallbackChain"]
    chain = stack.chat.inner.inner
    assert list(chain.clients) == ["primary", "secondary"]
    assert stack.embeddings is None
    assert stack.vector_store is None


def test_a_different_call_order_nests_the_other_way_round() -> None:
    stack = (
        Plan()
        .register_chat("model")
        .use_cost_budgeting(BUDGET)
        .use_rate_limiting(chat_requests_per_minute=300)
        .build()
    )

    assert kinds(stack.chat) == ["RateLimitLayer", "BudgetLayer", "model"]


def test_each_use_call_wraps_only_the_surfaces_it_is_configured_for() -> None:
    plan = (
        Plan()
        .register_chat("chat")
        .register_embeddings("embeddings")
        .register_vector_store("store")
        .use_rate_limiting(embedding_requests_per_minute=1200)
        .use_cost_budgeting(BUDGET)
        .configure_resilience()
    )
    stack = plan.build()

    assert kinds(stack.chat) == ["BudgetLayer", "chat"]
    assert kinds(stack.embeddings) == ["RetryLayer", "BudgetLayer", "RateLimitLayer", "embeddings"]
    assert kinds(stack.vector_store) == ["RetryLayer", "store"]
    # One budget, one ledger for both surfaces, so their spend adds up in one window.
    chat_budget = plan.layers("chat")[0]
    embedding_budget = plan.layers("embeddings")[1]
    assert isinstance(chat_budget, BudgetLayer)
    assert isinstance(embedding_budget, BudgetLayer)
    assert chat_budget.ledger is embedding_budget.ledger
    assert isinstance(chat_budget.ledger, InMemoryCostLedger)


def test_rate_limiting_twice_keeps_the_first_configuration_and_one_layer() -> None:
    plan = Plan().register_chat("chat")
    plan.use_rate_limiting(chat_requests_per_minute=300)
    plan.use_rate_limiting(chat_requests_per_minute=10)

    (layer,) = plan.layers("chat")
    assert isinstance(layer, RateLimitLayer)
    assert layer.limiter.capacity == 300


def test_a_repeat_rate_limiting_call_still_wraps_a_surface_it_did_not_wrap_before() -> None:
    plan = Plan().register_chat("chat").register_embeddings("embeddings")
    plan.use_rate_limiting(chat_requests_per_minute=300)
    plan.use_rate_limiting(chat_requests_per_minute=10, embedding_requests_per_minute=1200)

    assert [layer.limiter.capacity for layer in plan.layers("chat")] == [300]  # type: ignore[union-attr]
    assert [layer.limiter.capacity for layer in plan.layers("embeddings")] == [1200]  # type: ignore[union-attr]


def test_cost_budgeting_twice_keeps_the_first_budget_and_one_layer() -> None:
    first = InMemoryCostLedger()
    plan = Plan().register_chat("chat")
    plan.use_cost_budgeting(BUDGET, first)
    plan.use_cost_budgeting(
        CostBudget(input_price_per_mtok=1, output_price_per_mtok=1, daily_limit=1)
    )

    (layer,) = plan.layers("chat")
    assert isinstance(layer, BudgetLayer)
    assert layer.budget is BUDGET
    assert layer.ledger is first


def test_rate_limiting_a_surface_with_nothing_registered_raises_and_wraps_nothing() -> None:
    plan = Plan().register_chat("chat")

    with pytest.raises(ValueError, match=r"use_rate_limiting .*embeddings.*register_embeddings"):
        plan.use_rate_limiting(chat_requests_per_minute=300, embedding_requests_per_minute=1200)

    assert plan.layers("chat") == ()
    # Nothing was recorded, so registering embeddings now is not "too late".
    stack = plan.register_embeddings("embeddings").build()
    assert stack.chat == "chat"
    assert stack.embeddings == "embeddings"


def test_budgeting_a_named_surface_with_nothing_registered_raises_and_wraps_nothing() -> None:
    plan = Plan().register_chat("chat")

    with pytest.raises(ValueError, match=r"use_cost_budgeting .*embeddings"):
        plan.use_cost_budgeting(BUDGET, surfaces=["chat", "embeddings"])

    assert plan.layers("chat") == ()


def test_budgeting_with_neither_chat_nor_embeddings_registered_raises() -> None:
    plan = Plan().register_vector_store("store")

    with pytest.raises(ValueError, match="neither is registered: call register_chat"):
        plan.use_cost_budgeting(BUDGET)


def test_rate_limiting_without_any_surface_configured_names_the_options() -> None:
    with pytest.raises(ValueError, match="chat_requests_per_minute, chat_tokens_per_minute, "):
        Plan().register_chat("chat").use_rate_limiting()


def test_rate_limiting_by_tokens_alone_leaves_requests_unlimited() -> None:
    plan = Plan().register_chat("chat").use_rate_limiting(chat_tokens_per_minute=60_000)
    (layer,) = plan.layers("chat")
    assert isinstance(layer, RateLimitLayer)
    assert layer.limiter.tokens_per_minute == 60_000
    assert layer.limiter.requests_per_minute is None


def test_a_bad_rate_is_refused_at_the_call_naming_the_surface() -> None:
    with pytest.raises(ValueError, match=r"use_rate_limiting \(chat_\*\): requests_per_minute"):
        Plan().register_chat("chat").use_rate_limiting(chat_requests_per_minute=0)


def test_a_shared_limiter_serves_both_surfaces() -> None:
    shared = TokenBucketRateLimiter(600)
    plan = Plan().register_chat("chat").register_embeddings("embeddings")
    plan.use_rate_limiting(chat_limiter=shared, embedding_limiter=shared)

    assert [layer.limiter for layer in plan.layers("chat")] == [shared]  # type: ignore[union-attr]
    assert [layer.limiter for layer in plan.layers("embeddings")] == [shared]  # type: ignore[union-attr]


def test_budgeting_refuses_what_is_not_a_budget_or_a_ledger() -> None:
    plan = Plan().register_chat("chat")

    with pytest.raises(TypeError, match=r"budget must be a CostBudget"):
        plan.use_cost_budgeting(25)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"ledger must be a ledger object"):
        plan.use_cost_budgeting(BUDGET, "sqlite:///spend.db")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"surfaces must be drawn from \['chat', 'embeddings'\]"):
        plan.use_cost_budgeting(BUDGET, surfaces=["vector_store"])
    assert plan.layers("chat") == ()


def test_configure_resilience_twice_replaces_the_policy_and_keeps_one_layer() -> None:
    first, last = RetryPolicy(attempts=2), RetryPolicy(attempts=5)
    plan = Plan().register_embeddings("embeddings").register_vector_store("store")
    plan.configure_resilience(first)
    plan.use_rate_limiting(embedding_requests_per_minute=1200)
    plan.configure_resilience(last)

    assert plan.layers("embeddings") == (RetryLayer(last), plan.layers("embeddings")[1])
    assert plan.layers("vector_store") == (RetryLayer(last),)
    # The retry layer keeps the place its first call gave it.
    assert kinds(plan.build().embeddings) == ["RateLimitLayer", "RetryLayer", "embeddings"]


def test_configure_resilience_with_neither_surface_registered_says_what_to_register() -> None:
    plan = Plan().register_chat("chat")

    with pytest.raises(ValueError, match="call register_embeddings or register_vector_store"):
        plan.configure_resilience()


def test_configure_resilience_refuses_what_is_not_a_retry_policy() -> None:
    with pytest.raises(TypeError, match=r"policy must be a RetryPolicy\(\.\.\.\) or None; got int"):
        Plan().register_embeddings("embeddings").configure_resilience(3)


def _late_chat_after_budgeting(plan: Plan) -> None:
    plan.register_embeddings("embeddings").use_cost_budgeting(BUDGET).register_chat("late")


def _late_fallback_chain_after_budgeting(plan: Plan) -> None:
    plan.register_embeddings("embeddings").use_cost_budgeting(BUDGET)
    plan.use_fallback_chain(["a", "b"])


def _late_embeddings_after_retry(plan: Plan) -> None:
    plan.register_vector_store("store").configure_resilience().register_embeddings("late")


def _late_embeddings_after_budgeting(plan: Plan) -> None:
    plan.register_chat("chat").use_cost_budgeting(BUDGET).register_embeddings("late")


def _late_store_after_retry(plan: Plan) -> None:
    plan.register_embeddings("embeddings").configure_resilience().register_vector_store("late")


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (
            _late_chat_after_budgeting,
            "register_chat came after use_cost_budgeting, which wraps the chat model",
        ),
        (
            _late_fallback_chain_after_budgeting,
            "use_fallback_chain came after use_cost_budgeting, which wraps the chat model",
        ),
        (
            _late_embeddings_after_retry,
            "register_embeddings came after configure_resilience, which wraps the embeddings",
        ),
        (
            _late_embeddings_after_budgeting,
            "register_embeddings came after use_cost_budgeting, which wraps the embeddings",
        ),
        (
            _late_store_after_retry,
            "register_vector_store came after configure_resilience, which wraps the vector store",
        ),
    ],
)
def test_build_refuses_a_surface_registered_after_a_layer_meant_to_wrap_it(
    steps: Any, message: str
) -> None:
    plan = Plan()
    steps(plan)

    with pytest.raises(ValueError, match=f"^{message}") as refused:
        plan.build()
    assert "would escape that layer" in str(refused.value)


def test_a_surface_a_layer_was_not_configured_for_may_be_registered_after_it() -> None:
    plan = Plan().register_chat("chat").use_rate_limiting(chat_requests_per_minute=60)
    plan.register_embeddings("embeddings")  # only chat was rate limited

    assert kinds(plan.build().embeddings) == ["embeddings"]


def test_naming_the_budgeted_surfaces_lets_the_others_come_later() -> None:
    plan = Plan().register_chat("chat").use_cost_budgeting(BUDGET, surfaces=["chat"])
    plan.register_embeddings("embeddings")

    stack = plan.build()
    assert kinds(stack.chat) == ["BudgetLayer", "chat"]
    assert kinds(stack.embeddings) == ["embeddings"]


def test_the_fallback_chain_refuses_a_chat_model_already_registered() -> None:
    with pytest.raises(ValueError, match="put every model in use_fallback_chain's list"):
        Plan().register_chat("chat").use_fallback_chain(["a", "b"])


def test_the_fallback_chain_checks_its_options_at_the_call() -> None:
    with pytest.raises(ValueError, match="per_client_timeout"):
        Plan().use_fallback_chain(["a", "b"], per_client_timeout=-1)


def test_the_advice_of_a_late_registration_builds_when_followed() -> None:
    plan = Plan().register_embeddings("embeddings").use_cost_budgeting(BUDGET)
    plan.register_chat("late")
    with pytest.raises(ValueError, match="call register_chat before use_cost_budgeting"):
        plan.build()

    followed = Plan().register_embeddings("embeddings").register_chat("late")
    followed.use_cost_budgeting(BUDGET)
    assert kinds(followed.build().chat) == ["BudgetLayer", "late"]


# Each case: the calls up to the refused one, the refused call, the message, and the calls
# its advice asks for instead (which must build).
_TWICE: list[tuple[Callable[[Plan], Plan], Callable[[Plan], Plan], str, Callable[[], Plan]]] = [
    (
        lambda plan: plan.use_fallback_chain(["a", "b"]),
        lambda plan: plan.register_chat("a"),
        r"register_chat: this chat model is already registered, as a member of "
        r"use_fallback_chain's chain .*: drop this register_chat",
        lambda: Plan().use_fallback_chain(["a", "b"]),
    ),
    (
        lambda plan: plan.use_fallback_chain(["a", "b"]),
        lambda plan: plan.register_chat("c"),
        r"register_chat: another chat model is already registered, by use_fallback_chain.*"
        r"put it in use_fallback_chain's list and drop this register_chat",
        lambda: Plan().use_fallback_chain(["a", "b", "c"]),
    ),
    (
        lambda plan: plan.register_chat("a").use_rate_limiting(chat_requests_per_minute=60),
        lambda plan: plan.register_chat("b"),
        r"register_chat: another chat model is already registered, by register_chat.*"
        r"replace both register_chat calls with one use_fallback_chain\(\[first, second\]\)",
        lambda: (
            Plan().use_fallback_chain(["a", "b"]).use_rate_limiting(chat_requests_per_minute=60)
        ),
    ),
    (
        lambda plan: plan.register_embeddings("e").configure_resilience(),
        lambda plan: plan.register_embeddings("e"),
        r"register_embeddings: this embeddings model is already registered, by an earlier "
        r"register_embeddings: .*drop this register_embeddings",
        lambda: Plan().register_embeddings("e").configure_resilience(),
    ),
    (
        lambda plan: plan.register_embeddings("e").use_rate_limiting(
            embedding_requests_per_minute=60
        ),
        lambda plan: plan.register_embeddings("f"),
        r"register_embeddings: another embeddings model is already registered, by "
        r"register_embeddings, and a builder holds one: .*ResilienceBuilder\(\) of its own",
        lambda: Plan().register_embeddings("f").use_rate_limiting(embedding_requests_per_minute=60),
    ),
    (
        lambda plan: plan.register_vector_store("store"),
        lambda plan: plan.register_vector_store("store"),
        "register_vector_store: this vector store is already registered",
        lambda: Plan().register_vector_store("store"),
    ),
]


@pytest.mark.parametrize(
    ("before", "twice", "message", "advised"),
    _TWICE,
    ids=[
        "a-chain-member-again",
        "another-model-after-the-chain",
        "a-second-chat-model",
        "the-same-embeddings-after-retry",
        "a-second-embeddings-model",
        "the-same-vector-store",
    ],
)
def test_registering_a_surface_twice_is_refused_at_the_call_with_advice_that_builds(
    before: Callable[[Plan], Plan],
    twice: Callable[[Plan], Plan],
    message: str,
    advised: Callable[[], Plan],
) -> None:
    plan = before(Plan())
    expected = plan.build()

    with pytest.raises(ValueError, match=f"^{message}"):
        twice(plan)
    # Refused at the call, the plan is as it was: build() has nothing more to refuse.
    assert [kinds(getattr(plan.build(), s)) for s in ("chat", "embeddings", "vector_store")] == [
        kinds(getattr(expected, s)) for s in ("chat", "embeddings", "vector_store")
    ]
    assert advised().build() is not None  # the advice, followed, builds


def test_the_fallback_chain_after_a_chat_model_advises_dropping_register_chat() -> None:
    with pytest.raises(ValueError, match="drop that register_chat and put every model"):
        Plan().register_chat("chat").use_fallback_chain(["chat", "b"])
    with pytest.raises(ValueError, match=r"^use_fallback_chain registers the chat model"):
        Plan().use_fallback_chain(["a", "b"]).use_fallback_chain(["c", "d"])


def test_build_with_nothing_registered_says_what_to_register() -> None:
    with pytest.raises(ValueError, match="nothing to build: register a surface first"):
        Plan().build()


def test_the_core_plan_alone_cannot_build_a_framework_wrapper() -> None:
    plan = ResiliencePlan().register_chat("chat").use_rate_limiting(chat_requests_per_minute=60)

    with pytest.raises(NotImplementedError, match="ResilienceBuilder of langchain_llm_resilience"):
        plan.build()


def test_the_core_fallback_chain_is_the_default_chain() -> None:
    stack = Plan().use_fallback_chain(["a", "b"]).build()

    assert isinstance(stack.chat, FallbackChain)


def test_a_sql_ledger_asked_for_before_budgeting_records_the_spend(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'spend.db'}"
    plan = Plan().register_chat("chat").register_embeddings("embeddings")
    plan.use_sql_cost_ledger(url).use_cost_budgeting(BUDGET)

    (chat_layer,) = plan.layers("chat")
    (embedding_layer,) = plan.layers("embeddings")
    assert isinstance(chat_layer, BudgetLayer)
    assert isinstance(embedding_layer, BudgetLayer)
    assert isinstance(chat_layer.ledger, SqlCostLedger)
    assert chat_layer.ledger is embedding_layer.ledger
    assert (tmp_path / "spend.db").exists()
    chat_layer.ledger.close()


def test_a_ledger_given_to_budgeting_wins_over_the_sql_ledger(tmp_path: Path) -> None:
    mine = InMemoryCostLedger()
    plan = Plan().register_chat("chat")
    plan.use_sql_cost_ledger(f"sqlite:///{tmp_path / 'spend.db'}").use_cost_budgeting(BUDGET, mine)

    (layer,) = plan.layers("chat")
    assert isinstance(layer, BudgetLayer)
    assert layer.ledger is mine
    assert not (tmp_path / "spend.db").exists()  # never opened


def test_a_sql_ledger_asked_for_after_budgeting_is_refused(tmp_path: Path) -> None:
    plan = Plan().register_chat("chat").use_cost_budgeting(BUDGET)

    with pytest.raises(ValueError, match="use_sql_cost_ledger must come before use_cost_budgeting"):
        plan.use_sql_cost_ledger(f"sqlite:///{tmp_path / 'spend.db'}")


def test_a_sql_ledger_url_is_checked_at_the_call() -> None:
    with pytest.raises(ValueError, match="url must be a SQLite or PostgreSQL URL"):
        Plan().use_sql_cost_ledger("mysql://somewhere/spend")


def test_a_sql_ledger_that_cannot_open_leaves_nothing_budgeted(tmp_path: Path) -> None:
    plan = Plan().register_chat("chat")
    plan.use_sql_cost_ledger(f"sqlite:///{tmp_path / 'missing' / 'dir' / 'spend.db'}")

    with pytest.raises(OperationalError, match="unable to open database file"):
        plan.use_cost_budgeting(BUDGET)
    assert plan.layers("chat") == ()

    # Nothing half-done: the same call with a ledger of its own now succeeds.
    mine = InMemoryCostLedger()
    plan.use_cost_budgeting(BUDGET, mine)
    assert plan.layers("chat") == (BudgetLayer(BUDGET, mine),)


class Wrapped:
    """A stand-in wrapper class: the keywords it was built with."""

    def __init__(self, **options: Any) -> None:
        self.options = options


class TabledPlan(ResiliencePlan):
    """A framework's builder as the adapters write one: tables, no code."""

    _framework = "Boxed"
    _accepted = {"chat": (str,)}
    _wrappers = {
        (RateLimitLayer, "chat"): Wrapped,
        (BudgetLayer, "chat"): Wrapped,
        (RetryLayer, "embeddings"): Wrapped,
    }


def test_each_layer_becomes_its_tabled_wrapper_built_with_the_layers_fields() -> None:
    limiter = TokenBucketRateLimiter(requests_per_minute=60)
    ledger = InMemoryCostLedger()
    policy = RetryPolicy(attempts=2)
    stack = (
        TabledPlan()
        .register_chat("model")
        .register_embeddings("embedder")
        .use_rate_limiting(chat_limiter=limiter)
        .use_cost_budgeting(BUDGET, ledger, surfaces=["chat"], scope="team-a")
        .configure_resilience(policy)
        .build()
    )
    outer = stack.chat.options
    assert set(outer) == {"inner", "budget", "ledger", "scope"}
    assert (outer["budget"], outer["ledger"], outer["scope"]) == (BUDGET, ledger, "team-a")
    assert outer["inner"].options == {"inner": "model", "limiter": limiter}
    assert stack.embeddings.options == {"inner": "embedder", "policy": policy}


def test_a_surface_of_the_wrong_class_is_refused_naming_the_framework_and_the_class() -> None:
    with pytest.raises(TypeError, match=r"register_chat\(model\) must be a Boxed str; got int"):
        TabledPlan().register_chat(42)
    TabledPlan().register_embeddings(42)  # a surface with no classes named takes any object


def test_a_layer_missing_from_the_table_cannot_be_built() -> None:
    plan = (
        TabledPlan()
        .register_embeddings("embedder")
        .use_rate_limiting(embedding_requests_per_minute=60)
    )
    with pytest.raises(NotImplementedError, match="cannot build a RateLimitLayer"):
        plan.build()


def test_the_core_plan_forwards_a_retry_budget_to_its_chain_and_refuses_a_misspelled_one() -> None:
    from llm_resilience import RetryBudget

    budget = RetryBudget(ratio=0.1)
    stack = Plan().use_fallback_chain(["a", "b"], retry_budget=budget).build()
    assert stack.chat.retry_budget is budget
    with pytest.raises(TypeError, match="did you mean 'retry_budget'"):
        Plan().use_fallback_chain(["a", "b"], retry_budgt=budget)
