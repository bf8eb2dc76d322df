"""LlamaIndex adapters for llm-resilience.

Example::

    from llama_index.resilience import FallbackLLM

    llm = FallbackLLM(llms=[primary, secondary], per_client_timeout=30)
"""

from __future__ import annotations

from llama_index.resilience.events import FallbackStreamRestartEvent
from llama_index.resilience.fallback import SERVED_BY_KEY, FallbackLLM

__all__ = ["SERVED_BY_KEY", "FallbackLLM", "FallbackStreamRestartEvent"]
