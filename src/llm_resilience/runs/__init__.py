"""An agent run's share of the call: its attempts (and, with the lead's part, its money).

* [`AttemptCap`][]: how many model attempts (retries and fallbacks together) one agent
  run may make, counted per run with bounded memory;
* [`AttemptEvent`][]: one attempt's lifecycle (``started``, ``superseded`` with why,
  ``succeeded``), as an agent streams it to a UI.

Examples:
    >>> cap = AttemptCap(3)
    >>> cap.take("run-1"), cap.take("run-1")
    (1, 2)
"""

from llm_resilience.runs._attempts import (
    ATTEMPT_EVENT_TYPE,
    AttemptCap,
    AttemptEvent,
    superseded_reason,
    timed_out_by,
)

__all__ = ["ATTEMPT_EVENT_TYPE", "AttemptCap", "AttemptEvent", "superseded_reason", "timed_out_by"]
