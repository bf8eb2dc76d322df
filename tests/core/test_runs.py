"""The agent-run core: a run's (thread's) limit, strict holds, entries naming the run,
the downgrade choice and the run tree. Framework-free; both adapters translate it."""

from __future__ import annotations

import asyncio
import threading
from decimal import Decimal

import pytest

from llm_resilience import CostBudget, ModelPrice
from llm_resilience.errors import BudgetExceededError
from llm_resilience.ledger import InMemoryCostLedger, SqlCostLedger
from llm_resilience.runs import RunBudget, RunTree
from llm_resilience.usage import Usage

PROMPT = [("user", "What is the weather in Paris?")]
# 1 per input token and 1 per output token (per million): a call of 1,000,000 output
# tokens costs 1; prices below make each attempt's cost easy to read.
# CostBudget needs a window limit: a month's far above any run's is the "no window" here.
BUDGET = dict(input_price_per_mtok=1_000_000, output_price_per_mtok=1_000_000)
NO_WINDOW = dict(BUDGET, global_monthly_limit=10**9)


def _runs(strict: bool, limit: str, **options: object) -> RunBudget:
    budget = CostBudget(**NO_WINDOW, strict=strict)  # type: ignore[arg-type]
    return RunBudget(budget, InMemoryCostLedger(), limit=limit, **options)  # type: ignore[arg-type]


def test_strict_run_stops_before_an_attempt_whose_worst_case_would_pass_its_limit() -> None:
    runs = _runs(True, "100")
    spend = runs.open("run-1", thread_id="thread-1", scope="tenant-1")
    finished = 0
    refused = None
    while refused is None and finished < 10:
        try:
            attempt = spend.begin(model="m", prompt=PROMPT, max_output_tokens=10)
        except BudgetExceededError as error:
            refused = error
        else:
            attempt.finish(Usage(10, 10, False))  # 20 each, within the hold
            finished += 1
    assert refused is not None
    assert refused.window == "run"
    assert refused.scope == "run-1"
    worst = spend.estimate(model="m", prompt=PROMPT, max_output_tokens=10)
    entries = runs.ledger.entries()
    spent = sum(entry.cost for entry in entries)
    assert len(entries) == finished == 4
    assert spent == spend.spent == Decimal(80)
    assert spent <= Decimal(100) < spent + worst  # it stopped at the last attempt that fit
    assert {(e.run_id, e.thread_id, e.scope) for e in entries} == {
        ("run-1", "thread-1", "tenant-1")
    }
    assert spend.held == 0


def test_strict_holds_of_concurrent_attempts_never_pass_the_run_limit() -> None:
    runs = _runs(True, "200")
    spend = runs.open("run-1")
    admitted: list[object] = []
    refused: list[BudgetExceededError] = []
    barrier = threading.Barrier(12)

    def attempt() -> None:
        barrier.wait()
        try:
            admitted.append(spend.begin(model="m", prompt=PROMPT, max_output_tokens=30))
        except BudgetExceededError as error:
            refused.append(error)

    workers = [threading.Thread(target=attempt) for _ in range(12)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    worst = spend.estimate(model="m", prompt=PROMPT, max_output_tokens=30)
    assert len(admitted) == int(Decimal(200) // worst)
    assert refused
    assert spend.held == worst * len(admitted) <= Decimal(200)
    for each in admitted:
        each.abandon()  # type: ignore[attr-defined]
    assert spend.held == 0
    assert runs.ledger.entries() == []


def test_default_mode_refuses_once_the_limit_is_reached_over_by_at_most_the_calls_in_flight() -> (
    None
):
    runs = _runs(False, "50")
    spend = runs.open("run-1")
    in_flight = [spend.begin(model="m", prompt=PROMPT) for _ in range(3)]
    for attempt in in_flight:
        attempt.finish(Usage(20, 10, False))  # 30 each: 90, over 50 by the two calls in flight
    with pytest.raises(BudgetExceededError) as refused:
        spend.begin(model="m", prompt=PROMPT)
    assert refused.value.window == "run"
    assert refused.value.spend == Decimal(90)


def test_the_budget_s_day_window_still_applies_to_a_run_under_its_own_limit() -> None:
    budget = CostBudget(**BUDGET, daily_limit=40, strict=True)  # type: ignore[arg-type]
    runs = RunBudget(budget, InMemoryCostLedger(), limit="1000")
    spend = runs.open("run-1")
    spend.begin(model="m", prompt=PROMPT, max_output_tokens=5).finish(Usage(20, 5, False))
    with pytest.raises(BudgetExceededError) as refused:
        spend.begin(model="m", prompt=PROMPT, max_output_tokens=5)
    assert refused.value.window == "day"
    assert spend.held == 0  # the run's hold was given back when the window refused


def test_a_thread_budget_counts_every_run_of_the_thread_from_the_ledger(tmp_path) -> None:
    ledger = InMemoryCostLedger()
    budget = CostBudget(**NO_WINDOW, strict=True)  # type: ignore[arg-type]
    first = RunBudget(budget, ledger, per="thread", limit="60")
    first.open("run-1", thread_id="t").begin(model="m", prompt=PROMPT, max_output_tokens=5).finish(
        Usage(20, 5, False)
    )
    # A fresh process (a new RunBudget) resumes the thread: it starts from the ledger.
    later = RunBudget(budget, ledger, per="thread", limit="60")
    spend = later.open("run-2", thread_id="t")
    assert spend.spent == Decimal(25)
    spend.begin(model="m", prompt=PROMPT, max_output_tokens=5).finish(Usage(20, 5, False))
    with pytest.raises(BudgetExceededError) as refused:
        spend.begin(model="m", prompt=PROMPT, max_output_tokens=5)
    assert (refused.value.window, refused.value.scope) == ("thread", "t")
    assert [e.run_id for e in ledger.entries()] == ["run-1", "run-2"]


def test_a_thread_budget_needs_a_thread_id_and_says_how_to_get_one() -> None:
    runs = _runs(True, "10", per="thread")
    with pytest.raises(ValueError, match="checkpointer"):
        runs.open("run-1")


def test_choose_downgrades_below_the_threshold_and_when_the_strict_estimate_does_not_fit() -> None:
    budget = CostBudget(
        **NO_WINDOW,  # type: ignore[arg-type]
        strict=True,
        prices={"cheap": ModelPrice(1, 1)},
    )
    runs = RunBudget(
        budget, InMemoryCostLedger(), limit="100", downgrade_to="cheap", downgrade_below="30"
    )
    spend = runs.open("run-1")
    kept = spend.choose("big", prompt=PROMPT, max_output_tokens=10)
    assert not kept.downgraded
    assert kept.model == "big"
    assert kept.remaining == Decimal(100)
    spend.begin(model="big", prompt=PROMPT, max_output_tokens=20).finish(Usage(50, 20, False))
    tight = spend.choose("big", prompt=PROMPT, max_output_tokens=50)
    assert tight.downgraded
    assert tight.reason == "estimate_does_not_fit"
    assert tight.estimate > tight.remaining == Decimal(30) > tight.chosen_estimate
    spend.begin(model="cheap", prompt=PROMPT, max_output_tokens=10).finish(Usage(15, 0, False))
    low = spend.choose("big", prompt=PROMPT, max_output_tokens=1)
    assert (low.downgraded, low.reason, low.model) == (True, "below_threshold", "cheap")
    assert low.payload()["estimate"] == str(low.estimate)


def test_window_remaining_reads_the_tightest_window_in_one_read() -> None:
    budget = CostBudget(**BUDGET, daily_limit=80, monthly_limit=50)  # type: ignore[arg-type]
    runs = RunBudget(budget, InMemoryCostLedger())
    spend = runs.open("run-1")
    spend.begin(model="m").finish(Usage(10, 10, False))
    assert spend.window_remaining() == Decimal(30)
    assert asyncio.run(spend.awindow_remaining()) == Decimal(30)


def test_async_attempts_hold_settle_and_record_the_run_once() -> None:
    runs = _runs(True, "100")

    async def main() -> None:
        spend = await runs.aopen("run-a", thread_id="t-a")
        attempt = await spend.abegin(model="m", prompt=PROMPT, max_output_tokens=10)
        assert spend.held > 0
        await attempt.afinish(Usage(10, 10, False))
        await attempt.afinish(Usage(10, 10, False))  # a second finish records nothing
        failed = await spend.abegin(model="m", prompt=PROMPT, max_output_tokens=10)
        await failed.aabandon()
        assert spend.held == 0
        assert spend.spent == Decimal(20)

    asyncio.run(main())
    assert [(e.run_id, e.cost) for e in runs.ledger.entries()] == [("run-a", Decimal(20))]


def test_open_returns_the_same_run_until_closed() -> None:
    runs = _runs(False, "10")
    assert runs.open("r") is runs.open("r") is runs.get("r")
    runs.close("r")
    assert runs.get("r") is None
    assert runs.open("r") is not None


def test_run_budget_refuses_bad_options_naming_them() -> None:
    budget = CostBudget(**NO_WINDOW)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="per must be 'run' or 'thread'"):
        RunBudget(budget, per="turn")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limit"):
        RunBudget(budget, limit=0.5)
    with pytest.raises(TypeError, match="did you mean 'limit'"):
        RunBudget(budget, limt="1")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="budget must be a CostBudget"):
        RunBudget("budget")  # type: ignore[arg-type]


def test_run_tree_finds_a_side_call_s_root_and_forgets_whole_runs() -> None:
    tree = RunTree(max_roots=2)
    tree.add("agent", None)
    tree.add("tool", "agent")
    tree.add("subagent", "tool")
    tree.add("subagent-model", "subagent")
    assert tree.root("subagent-model") == "agent"
    tree.add("other", None)
    tree.add("third", None)  # past max_roots: the oldest root goes with its runs
    assert tree.root("subagent-model") is None
    assert tree.root("third") == "third"
    tree.forget("other")
    assert tree.root("other") is None
    assert len(tree) == 1


def test_sqlite_entries_name_the_run_and_thread(tmp_path) -> None:
    ledger = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
    runs = RunBudget(CostBudget(**NO_WINDOW), ledger, limit="100")  # type: ignore[arg-type]
    runs.open("run-1", thread_id="t").begin(model="m").finish(Usage(1, 1, False))
    ledger.close()
    reopened = SqlCostLedger(f"sqlite:///{tmp_path / 'spend.db'}")
    assert [(e.run_id, e.thread_id) for e in reopened.entries()] == [("run-1", "t")]
    # A fresh process resuming the thread starts from what the file holds for it.
    thread = RunBudget(CostBudget(**NO_WINDOW), reopened, per="thread", limit="100")  # type: ignore[arg-type]
    assert thread.open("run-2", thread_id="t").spent == Decimal(2)
    assert asyncio.run(thread.aopen("run-3", thread_id="t")).spent == Decimal(2)
    reopened.close()


def test_choose_counts_a_chain_s_dearest_member_and_after_refusal_names_the_cheaper_model() -> None:
    budget = CostBudget(
        **NO_WINDOW,  # type: ignore[arg-type]
        strict=True,
        prices={"cheap": ModelPrice(1, 1), "primary": ModelPrice(1, 1)},
    )
    runs = RunBudget(budget, InMemoryCostLedger(), limit="100", downgrade_to="cheap")
    spend = runs.open("run-1")
    # The primary alone fits; the chain's dearest member (priced at the budget's surface
    # prices) does not, so the choice downgrades before any hold is refused.
    alone = spend.choose("primary", prompt=PROMPT, max_output_tokens=90)
    chained = spend.choose("primary", prompt=PROMPT, max_output_tokens=90, may_serve=["dear"])
    assert not alone.downgraded
    assert (chained.downgraded, chained.reason) == (True, "estimate_does_not_fit")
    forced = spend.after_refusal("primary", prompt=PROMPT, max_output_tokens=90)
    assert forced is not None
    assert (forced.asked, forced.model, forced.reason) == (
        "primary",
        "cheap",
        "estimate_does_not_fit",
    )
    assert spend.after_refusal("cheap", prompt=PROMPT) is None  # the cheaper one was refused
    default = RunBudget(CostBudget(**NO_WINDOW), downgrade_to="cheap").open("r")  # type: ignore[arg-type]
    assert default.after_refusal("primary") is None  # default mode never holds
