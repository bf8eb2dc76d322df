"""The spend budget: prices, limits, and the gate every priced call passes through.

```python
gate = BudgetGate(CostBudget(input_price_per_mtok=3, output_price_per_mtok=15,
                             daily_limit=25), ledger=SqlCostLedger("sqlite:///spend.db"))
ticket = gate.begin("chat", prompt=pairs, max_output_tokens=1024)  # BudgetExceededError?
try:
    response = call_the_model()
except BaseException:
    ticket.abandon()                                   # a failed call costs nothing
    raise
ticket.finish(chat_usage(in_tokens, out_tokens, prompt=pairs, response_text=text),
              model=served_model)
```

Adapters only translate framework types into these calls; every rule lives here and in
`llm_resilience.usage`.

One job per module: ``_options`` ([`CostBudget`][]: prices and limits, parsed once),
``_models`` (which model a call is priced at: [`ServingModel`][], `served_model`,
`dearest_model`, the price a name matches), ``_gate`` ([`BudgetGate`][],
`BudgetTicket`) and ``_ledger`` (the gate's side of a ledger: checking one, writes
that outlive a cancelled caller, the warnings of a ledger failure). Import from
``llm_resilience.budget``.
"""

from llm_resilience.budget._gate import HEDGE_KIND, BudgetGate, BudgetTicket, Surface
from llm_resilience.budget._models import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    ServingModel,
    dearest_model,
    served_model,
)
from llm_resilience.budget._options import CostBudget, ModelPrice

__all__ = [
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "HEDGE_KIND",
    "BudgetGate",
    "BudgetTicket",
    "CostBudget",
    "ModelPrice",
    "ServingModel",
    "Surface",
    "dearest_model",
    "served_model",
]
