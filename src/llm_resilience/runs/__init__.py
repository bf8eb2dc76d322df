"""Agent runs: what one run (or thread) may spend, and the gate each of its attempts passes.

The framework-free core of the agent layers (LangChain middleware, LlamaIndex agents):
[`RunBudget`][] opens a run's [`RunSpend`][]; every model attempt of the run (retries,
fallbacks, and side calls a tool, a subagent or another middleware makes) passes
[`RunSpend.begin`][] and is recorded once by [`RunAttempt.finish`][], its ledger entry
naming the run and thread. [`RunTree`][] tells which run a side call belongs to.
[`AttemptCap`][] caps a run's model attempts (retries and fallbacks together) and
[`AttemptEvent`][] is what a UI is told of each attempt (started, superseded with why,
succeeded).
One job per module: ``_account`` (a run's money in process), ``_spend`` (the attempt
gate, the downgrade choice), ``_budget`` (opening runs), ``_tree`` (runs' roots),
``_attempts`` (the attempt cap and events).
"""

from llm_resilience.runs._account import Account, Per
from llm_resilience.runs._attempts import (
    ATTEMPT_EVENT_TYPE,
    AttemptCap,
    AttemptEvent,
    superseded_reason,
    timed_out_by,
)
from llm_resilience.runs._budget import RunBudget
from llm_resilience.runs._spend import Choice, Prompt, RunAttempt, RunSpend
from llm_resilience.runs._tree import RunTree

__all__ = [
    "ATTEMPT_EVENT_TYPE",
    "Account",
    "AttemptCap",
    "AttemptEvent",
    "Choice",
    "Per",
    "Prompt",
    "RunAttempt",
    "RunBudget",
    "RunSpend",
    "RunTree",
    "superseded_reason",
    "timed_out_by",
]
