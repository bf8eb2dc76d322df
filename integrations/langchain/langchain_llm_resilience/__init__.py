"""LangChain adapters for llm-resilience.

>>> from langchain_llm_resilience import FallbackChatModel
"""

from langchain_llm_resilience.fallback import STREAM_RESTART_EVENT, FallbackChatModel

__all__ = ["STREAM_RESTART_EVENT", "FallbackChatModel"]
