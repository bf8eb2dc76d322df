"""What the fallback behaviours need of each framework, as mixins over ``driver.py``'s drivers."""

from __future__ import annotations


class LangChainFallback:
    """LangChain's side of the fallback behaviours."""


class LlamaIndexFallback:
    """LlamaIndex's side of the fallback behaviours."""
