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

from llama_index.core.instrumentation.events import BaseEvent

__all__ = ["FallbackStreamRestartEvent"]


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
