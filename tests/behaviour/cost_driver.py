"""What the cost behaviours need of each framework, as mixins over ``driver.py``'s drivers."""

from __future__ import annotations


class LangChainCost:
    """LangChain's side of the cost behaviours."""


class LlamaIndexCost:
    """LlamaIndex's side of the cost behaviours."""
