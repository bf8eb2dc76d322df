"""The cost layer in both adapters: gate before, record once after, for the member that served."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from cost_driver import EMBED_SHAPES
from driver import PROMPT, STREAMS, Mode

from llm_resilience import BudgetExceededError, CostBudget, ModelPrice
from llm_resilience.budget import DEFAULT_MAX_OUTPUT_TOKENS
from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry, SqlCostLedger
from llm_resilience.ratelimit import TokenBucketRateLimiter
from llm_resilience.testing import Fault, FaultInjectingServer
from llm_resilience.tokens import count_message_tokens, count_tokens

# One token in and out costs 1 and 2 millionths: costs stay readable.
BUDGET = CostBudget(input_price_per_mtok=1, output_price_per_mtok=2, daily_limit=10)


def tracked(
    driver: Any, inner: Any, budget: CostBudget = BUDGET, **options: Any
) -> tuple[Any, InMemoryCostLedger]:
    ledger = InMemoryCostLedger()
    return driver.cost_tracked(inner, budget=budget, ledger=ledger, **options), ledger


# -- gate before, record once after ------------------------------------------------------


async def test_every_call_shape_records_exactly_one_entry_with_the_reported_usage(
    driver: Any, mode: Mode
) -> None:
    inner = driver.answering(model="gpt-4o")
    layer, ledger = tracked(driver, inner)

    reply = await driver.run(layer, mode)

    [entry] = ledger.entries()
    reported = driver.reported_usage(reply)
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == (*reported, False)
    assert (entry.kind, entry.surface, entry.model, entry.scope) == ("chat", "chat", "gpt-4o", None)
    assert entry.cost == (Decimal(reported[0]) * 1 + Decimal(reported[1]) * 2) / 10**6
    assert driver.calls(inner) == 1


async def test_a_kill_switch_refuses_every_call_shape_before_the_inner_model_is_called(
    driver: Any, mode: Mode
) -> None:
    inner = driver.answering()
    layer, ledger = tracked(driver, inner, CostBudget(3, 15, daily_limit=0))

    with pytest.raises(BudgetExceededError) as refused:
        await driver.run(layer, mode)

    assert refused.value.window == "day"
    assert driver.calls(inner) == 0
    assert ledger.entries() == []


async def test_a_spent_budget_refuses_naming_its_window_limit_and_spend(
    driver: Any, mode: Mode
) -> None:
    inner = driver.answering()
    layer, ledger = tracked(driver, inner, CostBudget(daily_limit=1))
    ledger.record(LedgerEntry(datetime.now(UTC), "chat", cost=Decimal(1)))

    with pytest.raises(BudgetExceededError) as refused:
        await driver.run(layer, mode)

    facts = (refused.value.window, refused.value.limit, refused.value.spend)
    assert facts == ("day", Decimal(1), Decimal(1))
    assert driver.calls(inner) == 0
    assert len(ledger.entries()) == 1


def test_a_stream_is_gated_on_first_iteration_and_recorded_only_once_it_ends(driver: Any) -> None:
    inner = driver.answering("one two three four")
    refusing, _ = tracked(driver, inner, CostBudget(3, 15, daily_limit=0))
    stream = driver.open_stream(refusing, PROMPT)  # nothing is gated yet
    with pytest.raises(BudgetExceededError):
        next(stream)
    assert driver.calls(inner) == 0

    layer, ledger = tracked(driver, inner)
    chunks = len(list(driver.open_stream(inner, PROMPT)))
    stream = driver.open_stream(layer, PROMPT)
    for _ in range(chunks):
        next(stream)
    assert ledger.entries() == []  # the last chunk is out, but the stream has not ended
    with pytest.raises(StopIteration):
        next(stream)
    assert len(ledger.entries()) == 1


@pytest.mark.parametrize("mode", STREAMS)
async def test_a_stream_that_fails_mid_way_records_nothing_and_releases_its_hold(
    driver: Any, mode: Mode
) -> None:
    error = driver.rate_limit_error()
    strict = CostBudget(3, 15, daily_limit=10, strict=True)
    layer, ledger = tracked(driver, driver.failing(error, chunks_before_error=2), strict)

    with pytest.raises(type(error)):
        await driver.run(layer, mode)

    assert ledger.entries() == []
    assert ledger.spend("day") == 0


# -- the model that served -----------------------------------------------------------------


async def test_the_entry_names_and_prices_the_fallback_member_that_served(
    driver: Any, mode: Mode
) -> None:
    chain = driver.fallback(
        [driver.failing(model="primary"), driver.answering(model="cheap-2025-01-31")]
    )
    budget = CostBudget(daily_limit=10, prices={"cheap": ModelPrice(1000, 1000)})
    layer, ledger = tracked(driver, chain, budget)

    reply = await driver.run(layer, mode)

    [entry] = ledger.entries()
    assert entry.model == "cheap-2025-01-31"  # a dated snapshot, priced by its alias
    assert entry.cost == Decimal(sum(driver.reported_usage(reply))) * 1000 / 10**6


async def test_a_member_whose_answers_name_no_model_is_recorded_by_its_own_name(
    driver: Any, mode: Mode
) -> None:
    # The chain forwards attribute reads to its primary, yet the primary did not answer.
    chain = driver.fallback([driver.failing(model="primary"), driver.unnamed(model="secondary")])
    budget = CostBudget(daily_limit=10, prices={"secondary": ModelPrice(1000, 1000)})
    layer, ledger = tracked(driver, chain, budget)

    reply = await driver.run(layer, mode)

    [entry] = ledger.entries()
    assert entry.model == "secondary"
    assert entry.cost == Decimal(sum(driver.reported_usage(reply))) * 1000 / 10**6


async def test_a_fallback_of_fallbacks_records_the_member_that_served_when_it_names_no_model(
    driver: Any, mode: Mode
) -> None:
    # Issue 19's first drift: LangChain recorded the member that failed.
    inner = driver.fallback(
        [driver.failing(model="dead-primary"), driver.unnamed(model="live-secondary")]
    )
    chain = driver.fallback([inner, driver.answering(model="spare")])
    layer, ledger = tracked(driver, chain)

    await driver.run(layer, mode)

    assert [entry.model for entry in ledger.entries()] == ["live-secondary"]


async def test_a_member_deep_in_a_rate_limited_nested_fallback_is_recorded(driver: Any) -> None:
    nested = driver.fallback([driver.failing(model="b"), driver.unnamed(model="deep")])
    chain = driver.fallback([driver.failing(model="a"), nested])
    layer, ledger = tracked(driver, driver.rate_limited(chain, requests_per_minute=60))

    await driver.run(layer, "call")

    assert [entry.model for entry in ledger.entries()] == ["deep"]


def test_without_a_reported_model_the_inner_models_name_is_recorded(driver: Any) -> None:
    layer, ledger = tracked(driver, driver.unnamed(model="local-model"))

    driver.run_sync(layer)

    assert [entry.model for entry in ledger.entries()] == ["local-model"]


# -- scopes --------------------------------------------------------------------------------


async def test_a_per_call_budget_scope_overrides_the_layers_and_has_its_own_window(
    driver: Any, mode: Mode
) -> None:
    layer, ledger = tracked(driver, driver.answering(), scope="tenant-1")

    await driver.run(layer, mode)
    await driver.run(layer, mode, budget_scope="tenant-2")

    first, second = ledger.entries()
    assert (first.scope, second.scope) == ("tenant-1", "tenant-2")
    assert ledger.spend("day", scope="tenant-1") == first.cost


def test_a_scope_that_spent_its_limit_is_refused_while_others_go_on(driver: Any) -> None:
    inner = driver.answering()
    layer, ledger = tracked(driver, inner, CostBudget(daily_limit=1))
    ledger.record(LedgerEntry(datetime.now(UTC), "chat", cost=Decimal(1), scope="tenant-1"))

    with pytest.raises(BudgetExceededError) as refused:
        driver.run_sync(layer, budget_scope="tenant-1")
    driver.run_sync(layer, budget_scope="tenant-2")

    assert refused.value.scope == "tenant-1"
    assert driver.calls(inner) == 1


# -- strict holds --------------------------------------------------------------------------


def test_a_strict_hold_covers_the_dearest_fallback_member(driver: Any) -> None:
    chain = driver.fallback(
        [driver.failing(model="dear-model"), driver.answering(model="cheap-model")]
    )
    budget = CostBudget(
        daily_limit="0.05",
        strict=True,
        prices={"dear-model": ModelPrice(100, 100), "cheap-model": ModelPrice(1, 1)},
    )
    layer, ledger = tracked(driver, chain, budget)
    # 1,000 output tokens at the dear member's price (0.1) do not fit the 0.05 left, even
    # though the cheap member (0.001) is the one that would answer.
    with pytest.raises(BudgetExceededError):
        driver.run_sync(layer, max_tokens=1000)
    driver.run_sync(layer, max_tokens=100)  # 0.01 at the dear price: fits
    assert [entry.model for entry in ledger.entries()] == ["cheap-model"]


async def held_by(driver: Any, layer: Any, ledger: Any, server: Any, **call: Any) -> Decimal:
    """The strict hold of one call, read from the ledger while the provider hangs on it."""
    task = asyncio.create_task(driver.run(layer, "acall", **call))
    while not server.requests:  # noqa: ASYNC110 - the server's record, polled
        await asyncio.sleep(0.005)
    held: Decimal = ledger.spend("day")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ledger.spend("day") == 0  # the hold of the cancelled call is released
    return held


def worst_case(driver: Any, output_tokens: int, price: ModelPrice) -> Decimal:
    prompt = count_message_tokens([(driver.prompt_role, PROMPT)])
    return (prompt * price.input_per_mtok + output_tokens * price.output_per_mtok) / 10**6


# The second member is dearer per token in and out than the first at any cap its framework
# assumes for it (LangChain reads its profile's maximum, LlamaIndex assumes 4,096).
GPT_4O, DEAR_MINI = ModelPrice("2.50", 10), ModelPrice(3, 30)


@pytest.mark.parametrize(
    ("call", "output_tokens"),
    [({}, 8000), ({"max_tokens": 100}, 100)],
    ids=["members-own-caps", "call-max-tokens-caps-every-member"],
)
async def test_a_strict_hold_covers_a_real_member_allowed_8000_output_tokens_at_its_price(
    driver: Any, tmp_path: Path, call: dict[str, Any], output_tokens: int
) -> None:
    with FaultInjectingServer(default_fault=Fault.hang()) as hanging:
        chain = driver.fallback(
            [
                driver.capped_openai(hanging.openai_base_url, "gpt-4o", None),
                driver.capped_openai(hanging.openai_base_url, "gpt-4o-mini", 8000),  # not called
            ]
        )
        ledger = SqlCostLedger("sqlite:///" + str(tmp_path / "spend.db"))
        budget = CostBudget(
            daily_limit=10, strict=True, prices={"gpt-4o": GPT_4O, "gpt-4o-mini": DEAR_MINI}
        )
        layer = driver.cost_tracked(chain, budget=budget, ledger=ledger)
        held = await held_by(driver, layer, ledger, hanging, **call)
    # Without a call cap, 8,000 tokens at the second member's price is the dearest
    # combination; the old default (4,096 tokens at the dearest price) held about half.
    assert held == worst_case(driver, output_tokens, DEAR_MINI)
    if not call:
        assert held > worst_case(driver, DEFAULT_MAX_OUTPUT_TOKENS, DEAR_MINI)


@pytest.mark.parametrize(
    ("cap", "call", "expected"),
    [(None, {}, None), (8000, {}, 8000), (8000, {"max_tokens": 100}, 100)],
    ids=["assumed-cap", "own-cap", "call-max-tokens-wins"],
)
async def test_a_real_openai_models_hold_is_its_own_output_cap(
    driver: Any, tmp_path: Path, cap: int | None, call: dict[str, Any], expected: int | None
) -> None:
    mini = ModelPrice("0.15", "0.60")
    with FaultInjectingServer(default_fault=Fault.hang()) as hanging:
        openai = driver.capped_openai(hanging.openai_base_url, "gpt-4o-mini", cap)
        ledger = SqlCostLedger("sqlite:///" + str(tmp_path / "spend.db"))
        budget = CostBudget(daily_limit=10, strict=True, prices={"gpt-4o-mini": mini})
        layer = driver.cost_tracked(openai, budget=budget, ledger=ledger)
        held = await held_by(driver, layer, ledger, hanging, **call)
    if expected is None:
        # LangChain's profile maximum (above the core's default), LlamaIndex's default.
        expected = driver.assumed_output_cap(openai)
        assert expected >= DEFAULT_MAX_OUTPUT_TOKENS
    assert held == worst_case(driver, expected, mini)


class Refused(Exception):
    """What :class:`AskedLimiter` raises once it has seen a call: the model is never called."""


class AskedLimiter(TokenBucketRateLimiter):
    """Records each permit's token weight and the ledger's spend (the strict hold) at
    that moment, then refuses the call."""

    def __init__(self, ledger: InMemoryCostLedger) -> None:
        super().__init__(60, tokens_per_minute=1_000_000)
        self.ledger = ledger
        self.asked: list[tuple[int, Decimal]] = []

    def acquire(self, num_tokens: int = 0, **kwargs: Any) -> bool:
        self.asked.append((num_tokens, self.ledger.spend("day")))
        raise Refused

    async def aacquire(self, num_tokens: int = 0, **kwargs: Any) -> bool:
        return self.acquire(num_tokens, **kwargs)


async def weighed_and_held(driver: Any, mode: Mode, **call: Any) -> tuple[int, Decimal]:
    # An output token costs 1 and an input token nothing: the hold in dollars is the
    # output cap the budget assumed.
    ledger = InMemoryCostLedger()
    limiter = AskedLimiter(ledger)
    limited = driver.rate_limited(driver.capped(2048), limiter=limiter)
    budget = CostBudget(0, 10**6, daily_limit=100_000, strict=True)
    layer = driver.cost_tracked(limited, budget=budget, ledger=ledger)
    with pytest.raises(Refused):
        await driver.run(layer, mode, **call)
    [asked] = limiter.asked
    assert ledger.spend("day") == 0  # the refused call's hold is released
    return asked


async def test_the_budgets_hold_and_the_limiters_weight_use_one_output_cap(
    driver: Any, mode: Mode
) -> None:
    # Issue 19's second drift: LangChain's limiter weighed only the prompt.
    weight, held = await weighed_and_held(driver, mode)

    assert held == 2048
    prompt = weight - 2048
    assert 0 < prompt < 50  # the estimated prompt of one short question
    for keyword in driver.output_cap_keywords:
        assert await weighed_and_held(driver, mode, **{keyword: 500}) == (prompt + 500, 500)


# -- ledger failures, options ------------------------------------------------------------


class BrokenLedger(InMemoryCostLedger):
    """A ledger whose reads or whose writes fail, as a full or vanished disk does."""

    def __init__(self, *, reads: bool, writes: bool) -> None:
        super().__init__()
        self.reads, self.writes = reads, writes

    def spend(self, *args: Any, **kwargs: Any) -> Decimal:
        if not self.reads:
            raise OSError("disk gone")
        return super().spend(*args, **kwargs)

    def record(self, entry: Any) -> None:
        if not self.writes:
            raise OSError("disk full")
        super().record(entry)


@pytest.mark.parametrize(("reads", "writes"), [(False, True), (True, False)])
async def test_ledger_failures_degrade_to_a_warning_and_the_call_succeeds(
    driver: Any, mode: Mode, reads: bool, writes: bool, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = BrokenLedger(reads=reads, writes=writes)
    model = driver.cost_tracked(driver.answering("ok"), budget=BUDGET, ledger=ledger)

    with caplog.at_level(logging.WARNING, logger="llm_resilience.budget"):
        assert (await driver.run(model, mode)).text == "ok"

    assert any(record.name == "llm_resilience.budget" for record in caplog.records)


@pytest.mark.parametrize("layer", ["chat", "embeddings"])
@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"budget": {"daily_limit": 1}}, TypeError, r"budget must be a CostBudget\(\.\.\.\)"),
        ({"scope": 7}, TypeError, "scope must be text or None"),
        ({"scope": ""}, ValueError, "scope"),
    ],
    ids=["budget-not-a-cost-budget", "scope-not-text", "scope-empty"],
)
def test_bad_options_fail_at_construction_naming_the_option(
    driver: Any, layer: str, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    build, inner = (
        (driver.cost_tracked, driver.answering())
        if layer == "chat"
        else (driver.cost_tracked_embeddings, driver.embeddings())
    )

    with pytest.raises(error, match=message):
        build(inner, **{"budget": BUDGET, "ledger": InMemoryCostLedger(), **options})


# -- embeddings ----------------------------------------------------------------------------

EMBEDDING_BUDGET = CostBudget(embedding_price_per_mtok=1000, daily_limit=10)


@pytest.mark.parametrize("shape", EMBED_SHAPES)
async def test_every_embeddings_call_is_recorded_once_as_an_estimate_without_a_fakes_name(
    driver: Any, shape: Any
) -> None:
    ledger = InMemoryCostLedger()
    model = driver.cost_tracked_embeddings(
        driver.embeddings(), budget=EMBEDDING_BUDGET, ledger=ledger, scope="tenant-1"
    )
    texts = ["hello world", "hello"] if "batch" in shape else ["hello world"]

    assert await driver.embed(model, texts, shape) == len(texts)

    [entry] = ledger.entries()
    tokens = sum(count_tokens(text) for text in texts)
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == (tokens, 0, True)
    # Neither framework's fake embeddings have a name (LlamaIndex's say "unknown").
    assert (entry.surface, entry.model, entry.scope) == ("embedding", None, "tenant-1")
    assert entry.cost == Decimal(tokens) / 1000


@pytest.mark.parametrize("shape", EMBED_SHAPES)
async def test_a_spent_embeddings_budget_never_reaches_the_inner_model(
    driver: Any, shape: Any
) -> None:
    inner = driver.flaky_embeddings()  # no errors: it only counts its requests
    ledger = InMemoryCostLedger()
    kill_switch = CostBudget(embedding_price_per_mtok=1, daily_limit=0)
    model = driver.cost_tracked_embeddings(inner, budget=kill_switch, ledger=ledger)

    with pytest.raises(BudgetExceededError):
        await driver.embed(model, ["hello", "world"], shape)

    assert inner.calls == 0
    assert ledger.entries() == []


# -- Anthropic's compaction, through the real clients ----------------------------------------

# A recorded compacted call: the answer's own step read 229 tokens and wrote 5 (the top-level
# counts: the server's prompt words and reply chunks); the summarising step before it read
# 100, wrote 55,096 to the cache and 131 of summary, reported only in usage.iterations.
COMPACTED_PROMPT = " ".join(["clause"] * 229)
COMPACTED_REPLY = "The contract renews every year."
SUMMARY = "The user asked about the renewal clause."
SONNET = ModelPrice(3, 15, cache_read_price_per_mtok="0.30", cache_write_price_per_mtok="3.75")


def compaction(summary: str | None = SUMMARY) -> Fault:
    return Fault.compacted(
        input_tokens=100, output_tokens=131, cache_write_5m=55_096, summary=summary
    )


def compaction_bill(driver: Any, mode: Mode) -> tuple[int, int, int, bool, Decimal]:
    """The entry of the compacted call: input, output and cache-write tokens, whether
    estimated, and the cost."""
    if mode not in driver.compaction_unreported:
        # 329 uncached x $3 + 55,096 written x $3.75 + 136 out x $15 per million tokens,
        # where the top-level counts alone (229 in, 5 out) cost 0.000762: 275 times less.
        return 55_425, 136, 55_096, False, Decimal("0.209637")
    # The framework dropped the raw usage: the summarising step is estimated, its input
    # as the prompt's tokens and its output as the summary's, at the plain prices.
    step_in = count_message_tokens([(driver.prompt_role, COMPACTED_PROMPT)])
    step_out = count_tokens(SUMMARY)
    cost = (Decimal(229 + step_in) * 3 + Decimal(5 + step_out) * 15) / 10**6
    return 229 + step_in, 5 + step_out, 0, True, cost


@pytest.fixture
def compacting() -> Any:
    with FaultInjectingServer(reply=COMPACTED_REPLY, name="compaction") as running:
        yield running


async def test_a_compacted_answer_bills_its_summarising_step_on_top_of_its_own_usage(
    driver: Any, mode: Mode, compacting: FaultInjectingServer
) -> None:
    # The client each framework documents for compaction; an answer without the summary
    # block where the framework's client cannot parse it (LlamaIndex's chat).
    compacting.script(compaction(None if mode in driver.compaction_beta_breaks else SUMMARY))
    ledger = InMemoryCostLedger()
    budget = CostBudget(daily_limit=10, prices={"claude-sonnet-4-5": SONNET})
    inner = driver.compacting_anthropic(compacting, "claude-sonnet-4-5")
    layer = driver.cost_tracked(inner, budget=budget, ledger=ledger)

    reply = await driver.run(layer, mode, prompt=COMPACTED_PROMPT)

    assert reply.text.strip() == COMPACTED_REPLY
    [entry] = ledger.entries()
    recorded = (entry.input_tokens, entry.output_tokens, entry.cache_write_tokens)
    assert (*recorded, entry.estimated, entry.cost) == compaction_bill(driver, mode)
    assert entry.model == "claude-sonnet-4-5"


async def test_a_client_that_cannot_parse_a_compacted_answer_fails_as_it_does_alone(
    driver: Any, mode: Mode, compacting: FaultInjectingServer
) -> None:
    strict = CostBudget(daily_limit=10, strict=True, prices={"claude-sonnet-4-5": SONNET})
    ledger = InMemoryCostLedger()
    bare = driver.provider_client("anthropic", compacting, "claude-sonnet-4-5")
    layer = driver.cost_tracked(
        driver.provider_client("anthropic", compacting, "claude-sonnet-4-5"),
        budget=strict,
        ledger=ledger,
    )
    outcomes = []
    for model in (bare, layer):
        compacting.script(compaction())
        try:
            outcomes.append((await driver.run(model, mode, prompt=COMPACTED_PROMPT)).text)
        except Exception as error:  # the framework's own, whatever it is
            outcomes.append(error)

    alone, layered = outcomes
    # The framework's known failures (docs/providers.md), and only those.
    assert isinstance(alone, Exception) == (mode in driver.compaction_breaks)
    if isinstance(alone, Exception):
        # Neither hidden nor changed: the same type and message, nothing recorded, the
        # strict hold released.
        assert (type(layered), str(layered)) == (type(alone), str(alone))
        assert ledger.entries() == []
        assert ledger.spend("day") == 0
    else:
        assert layered == alone
        [entry] = ledger.entries()
        assert entry.cost == compaction_bill(driver, mode)[-1]
