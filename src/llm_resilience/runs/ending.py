"""How an agent run its budget stopped ends: the final answer it gives instead of a call.

An agent layer with ``exit_behavior="end"`` answers the attempt its budget refused with
[`spent_message`][llm_resilience.runs.ending.spent_message] as the model's final text, so the agent
loop ends the way it ends on any final answer (no tool call), and the user reads why.

Examples:
    >>> from decimal import Decimal
    >>> from llm_resilience import BudgetExceededError
    >>> error = BudgetExceededError("run", Decimal("0.05"), Decimal("0.05"), "run-1")
    >>> spent_message(error)[:63]
    "I have to stop here: this run's budget is spent (0.05 of its 0."
"""

from __future__ import annotations

from llm_resilience.errors import BudgetExceededError

__all__ = ["spent_message"]

#: What each window's budget is called in the final answer.
_WHOSE = {
    "run": "this run's budget",
    "thread": "this conversation's budget",
    "day": "today's budget",
    "month": "this month's budget",
}


def spent_message(error: BudgetExceededError) -> str:
    """The final answer of a run stopped by ``error``: which budget is spent, and the money.

    Names the window (``"run"``, ``"thread"``, ``"day"``, ``"month"``) and its exact
    spend and limit; never a run, thread or tenant id (the user may not own them) and
    never prompt text. It holds none of ReAct's keywords (``Thought:``, ``Action:``,
    ``Answer:``), so a ReAct agent reads it as a final answer too.
    """
    whose = _WHOSE.get(error.window, f"the {error.window} budget")
    return (
        f"I have to stop here: {whose} is spent ({error.spend} of its {error.limit} limit). "
        "Start a new run or raise the limit to go on."
    )
