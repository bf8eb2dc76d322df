"""Reading a chain's unknown attributes from its first member, as ``with_fallbacks`` does.

Code written against one model (``model.model_name``, ``model.temperature``, a custom
attribute) keeps working once that model becomes the primary of a chain: a read the
chain cannot answer itself goes to the member tried first. Only reads: a write always
lands on the chain (or fails there), never on a member.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["read_from_primary"]


def read_from_primary(
    chain: object, name: str, members: Sequence[object] | None, missing: AttributeError
) -> object:
    """The value of ``name`` read from ``members[0]``, for a chain's ``__getattr__``.

    ``missing`` is the ``AttributeError`` the chain's own lookup raised; it is raised
    unchanged when the read is not the primary's to answer:

    * a private or dunder name (``_x``, ``__x__``): the chain's own internals, pydantic's
      private attributes, and the protocol probes of ``copy``, ``pickle`` and the
      frameworks stay the chain's, present or absent;
    * a name the chain's class defines (a property that failed must not be masked by the
      primary's value);
    * a chain not yet built (no members yet: during construction or unpickling).

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
    if name.startswith("_") or hasattr(type(chain), name) or not members:
        raise missing
    primary = members[0]
    try:
        return getattr(primary, name)
    except AttributeError as error:
        raise AttributeError(
            f"{type(chain).__name__!r} object has no attribute {name!r}, nor has its "
            f"first member ({type(primary).__name__})",
            name=name,
            obj=chain,
        ) from error
