"""FallbackChatModel reads what it cannot answer from its first member, as ``with_fallbacks``.

What both adapters share (read-through, writes, private names, copies) is proven in
``tests/behaviour/test_fallback_attributes.py``; this file holds the comparison with
LangChain's own ``with_fallbacks``.
"""

from __future__ import annotations

import pytest

from langchain_llm_resilience import FallbackChatModel
from langchain_llm_resilience.testing import ScriptedChatModel


class FooModel(ScriptedChatModel):
    """A model with attributes of its own, like langchain-core's ``FakeStructuredOutputModel``."""

    foo: int = 0


class BarModel(ScriptedChatModel):
    bar: int = 0


def test_unknown_attributes_are_read_from_the_first_member_as_with_fallbacks_reads_them() -> None:
    # langchain-core's own test_fallbacks_getattr, with our chain in place of with_fallbacks.
    chain = FallbackChatModel(models=[FooModel(foo=3), BarModel(bar=4)])
    built_in = FooModel(foo=3).with_fallbacks([BarModel(bar=4)])

    assert chain.foo == built_in.foo == 3
    with pytest.raises(AttributeError):
        built_in.bar  # noqa: B018
    with pytest.raises(AttributeError, match=r"'FallbackChatModel' object has no attribute 'bar'"):
        chain.bar  # noqa: B018
