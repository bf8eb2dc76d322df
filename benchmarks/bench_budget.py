"""Overshoot: how far 50 concurrent calls push spend past a nearly spent budget.

    .venv/bin/python benchmarks/bench_budget.py            # in-memory and SQLite ledgers
    .venv/bin/python benchmarks/bench_budget.py --quick

The budget has 1.00 of limit with 0.90 already spent; each call costs 0.01 (1,000 input
and 600 output tokens at 1 and 15 per million tokens: 0.001 + 0.009). 50 callers start
together (a barrier), each passes the gate, "calls the provider" for 20 ms, and records.
Default mode admits every call whose gate read came before the spend crossed the limit;
strict mode reserves each call's worst case (its 600 output tokens as ``max_tokens``) at
the gate, so the 11th and later callers are refused.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import threading
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from llm_resilience import BudgetExceededError, CostBudget
from llm_resilience.budget import BudgetGate
from llm_resilience.ledger import InMemoryCostLedger, LedgerEntry, SqlCostLedger
from llm_resilience.usage import Usage

LIMIT = Decimal("1.00")
ALREADY_SPENT = Decimal("0.90")
CALLERS = 50
PROVIDER_SECONDS = 0.02


def run(ledger: Any, *, strict: bool) -> tuple[int, Decimal]:
    ledger.record(
        LedgerEntry(timestamp=datetime.now(UTC), kind="chat", cost=ALREADY_SPENT, model="seed")
    )
    budget = CostBudget(
        input_price_per_mtok=1, output_price_per_mtok=15, daily_limit=LIMIT, strict=strict
    )
    gate = BudgetGate(budget, ledger)
    barrier = threading.Barrier(CALLERS)
    admitted = 0
    lock = threading.Lock()

    def caller() -> None:
        nonlocal admitted
        barrier.wait()
        try:
            ticket = gate.begin("chat", estimated_input_tokens=1000, max_output_tokens=600)
        except BudgetExceededError:
            return
        with lock:
            admitted += 1
        time.sleep(PROVIDER_SECONDS)
        ticket.finish(Usage(1000, 600, estimated=False), model="bench-model")

    threads = [threading.Thread(target=caller) for _ in range(CALLERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return admitted, ledger.spend("day")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition instead of five")
    args = parser.parse_args()
    repetitions = 1 if args.quick else 5
    logging.getLogger("llm_resilience.budget").setLevel(logging.ERROR)  # in-memory warning
    rows: list[tuple[str, str, int, Decimal, Decimal]] = []
    with tempfile.TemporaryDirectory() as folder:
        for ledger_name in ("InMemoryCostLedger", "SqlCostLedger (SQLite)"):
            for strict in (False, True):
                worst_admitted, worst_spend = 0, Decimal(0)
                for repetition in range(repetitions):
                    if ledger_name.startswith("InMemory"):
                        ledger: Any = InMemoryCostLedger()
                    else:
                        path = Path(folder) / f"spend-{strict}-{repetition}.db"
                        ledger = SqlCostLedger(f"sqlite:///{path}")
                    admitted, spend = run(ledger, strict=strict)
                    if spend > worst_spend:
                        worst_admitted, worst_spend = admitted, spend
                    close = getattr(ledger, "close", None)
                    if close is not None:
                        close()
                mode = "strict" if strict else "default"
                overshoot = max(Decimal(0), worst_spend - LIMIT)
                rows.append((ledger_name, mode, worst_admitted, worst_spend, overshoot))
    print(
        f"{CALLERS} concurrent calls of 0.01 each against a {LIMIT} daily limit with "
        f"{ALREADY_SPENT} spent (worst of {repetitions} runs)\n"
    )
    print("| ledger | mode | calls admitted | spend after | overshoot |")
    print("| --- | --- | ---: | ---: | ---: |")
    for ledger_name, mode, admitted, spend, overshoot in rows:
        print(f"| {ledger_name} | {mode} | {admitted} | {spend} | **{overshoot}** |")


if __name__ == "__main__":
    main()
