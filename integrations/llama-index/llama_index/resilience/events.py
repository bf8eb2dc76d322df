"""Instrumentation events of the LlamaIndex adapters.

A stream that fails after it yielded chunks is restarted from the beginning on the next
LLM of a [`FallbackLLM`][]; the chunks already yielded stay
yielded. [`FallbackStreamRestartEvent`][] tells a consumer to drop what it
accumulated, without parsing logs:

Example:

```python
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.resilience import FallbackStreamRestartEvent

class DropPartialOutput(BaseEventHandler):
    def handle(self, event, **kwargs):
        if isinstance(event, FallbackStreamRestartEvent):
            ...  # forget the text streamed so far

get_dispatcher().add_event_handler(DropPartialOutput())
```

Events carry indexes and counts only, never prompt or response text.
"""

from __future__ import annotations

from decimal import Decimal

from llama_index.core.instrumentation.events import BaseEvent

__all__ = ["FallbackStreamRestartEvent", "RunBudgetDowngradeEvent", "RunBudgetSpentEvent"]


class FallbackStreamRestartEvent(BaseEvent):
    """A stream failed mid-way and goes on: discard the chunks received so far, unless
    ``continued`` (``mid_stream="continue"``: the next LLM carries on from their text).

    Emitted through the ``llama_index.resilience.fallback`` dispatcher (it propagates to
    the root dispatcher) in the thread or task that consumes the stream, inside the
    wrapper's ``stream_*`` span, before the first chunk of the next LLM.
    """

    #: Index in ``FallbackLLM.llms`` of the LLM that failed mid-stream.
    failed_client: int
    #: Index of the LLM that streams the response again from its beginning.
    next_client: int
    #: Content chunks the failed LLM had yielded (the ones to discard).
    chunks: int
    #: Class name of the failure (``PerClientTimeoutError``-style timeouts show as
    #: ``TimeoutError``); never its message, which may quote provider output.
    error_type: str
    #: True when the next LLM continues from the text delivered (keep the chunks); False
    #: when it streams the response again from the beginning (discard them).
    continued: bool = False

    @classmethod
    def class_name(cls) -> str:
        return "FallbackStreamRestartEvent"


class RunBudgetDowngradeEvent(BaseEvent):
    """A run's next model attempt goes to the cheaper LLM its budget names.

    Emitted through the ``llama_index.resilience.agents`` dispatcher by
    [`RunBudgetLLM`][llama_index.resilience.RunBudgetLLM], in the step that makes the call,
    before the cheaper LLM is called. Money is exact ``Decimal``.
    """

    #: The agent run (the workflow's ``run_id``).
    run_id: str
    #: The run's thread, or None.
    thread_id: str | None = None
    #: The model asked for (the run's own LLM), or None when unnamed.
    asked_model: str | None = None
    #: The cheaper model the attempt uses.
    model: str | None = None
    #: ``"below_threshold"`` (what is left is under ``downgrade_below``) or
    #: ``"estimate_does_not_fit"`` (strict: the asked model's worst case exceeds it).
    reason: str
    #: The asked model's worst-case cost for this attempt.
    estimate: Decimal
    #: The cheaper model's worst-case cost for this attempt.
    chosen_estimate: Decimal
    #: What was left of the run's (or the tightest window's) budget; None: no limit.
    remaining: Decimal | None = None

    @classmethod
    def class_name(cls) -> str:
        return "RunBudgetDowngradeEvent"


class RunBudgetSpentEvent(BaseEvent):
    """A run's budget refused a model attempt: the run ends with its final answer saying so
    (``exit_behavior="end"``) or raises [`BudgetExceededError`][llm_resilience.BudgetExceededError].

    Emitted through the ``llama_index.resilience.agents`` dispatcher, in the step that
    made the call. Money is exact ``Decimal``.
    """

    #: The agent run (the workflow's ``run_id``).
    run_id: str
    #: The run's thread, or None.
    thread_id: str | None = None
    #: The window that refused: ``"run"``, ``"thread"``, ``"day"`` or ``"month"``.
    window: str
    #: That window's limit.
    limit: Decimal
    #: What that window had spent (and held) when it refused.
    spend: Decimal
    #: ``"end"`` (the run ends with a final answer) or ``"error"`` (it raises).
    exit_behavior: str

    @classmethod
    def class_name(cls) -> str:
        return "RunBudgetSpentEvent"
