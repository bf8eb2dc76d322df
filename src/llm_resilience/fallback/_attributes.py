"""Reading a chain's unknown attributes from its first member, as ``with_fallbacks`` does.

Code written against one model (``model.model_name``, ``model.temperature``, a custom
attribute) keeps working once that model becomes the primary of a chain: a read the
chain cannot answer itself goes to the member tried first. Only reads: a write always
lands on the chain (or fails there), never on a member.
"""

from __future__ import annotations

from collections.abc import Sequence

from llm_resilience.layers import read_through

__all__ = ["read_from_primary"]


def read_from_primary(
    chain: object, name: str, members: Sequence[object] | None, missing: AttributeError
) -> object:
    """The value of ``name`` read from ``members[0]``, for a chain's ``__getattr__``.

    ``missing`` is the ``AttributeError`` the chain's own lookup raised; it is raised
    unchanged when the read is not the primary's to answer: a private or dunder name, a
    name the chain's class defines, or a chain not yet built (no members yet: during
    construction or unpickling). The rule is every wrapper's:
    [`llm_resilience.layers.read_through`][].

    Otherwise the primary answers, and if it has no such attribute either the
    ``AttributeError`` names the chain, the attribute and the primary's type.

    Examples:
        >>> class Primary:
        ...     model_name = "gpt-4o"
        >>> class Chain:
        ...     members = (Primary(),)
        ...     def __getattr__(self, name):
        ...         return read_from_primary(self, name, self.members, AttributeError(name))
        >>> Chain().model_name
        'gpt-4o'
        >>> Chain().foo
        Traceback (most recent call last):
        ...
        AttributeError: 'Chain' object has no attribute 'foo', nor has its first member (Primary)
    """
    primary = members[0] if members else None
    return read_through(chain, name, primary, missing, role="first member")
