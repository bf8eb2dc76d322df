"""Which member of a stack served a call: the mark fallback chains put on an answer.

Every fallback chain of every adapter marks each answer (each streamed chunk, or the
stream's last) under `SERVED_BY_KEY` with the *path* of member indexes that
served it, outermost chain first: ``[1]`` is the chain's second member, ``[1, 0]`` the
first member of a chain that is itself the second member. Each chain puts its own
index in front of the path its member's answer already carries ([`served_mark`][]),
so a chain of chains never overwrites the mark below it. [`served_member`][] reads
the path back against the stack (the layer contract of [`llm_resilience.layers`][]:
a layer with several layers below is a chain, one with one is a wrapper).

Examples:
    >>> class Chain:
    ...     def __init__(self, *members): self.members = members
    ...     def layers_below(self): return self.members
    >>> stack = Chain("dead-primary", Chain("dead-secondary", "live-tertiary"))
    >>> served_member(stack, served_mark(1, served_mark(1, None)))
    'live-tertiary'
"""

from __future__ import annotations

from llm_resilience.layers import layers_below, leaves

__all__ = ["SERVED_BY_KEY", "served_mark", "served_member", "served_path"]

#: Where an answer carries the path of member indexes that served it: LangChain's
#: ``response_metadata``, LlamaIndex's ``response.additional_kwargs``.
SERVED_BY_KEY = "fallback_served_by"


def served_path(mark: object) -> tuple[int, ...] | None:
    """``mark`` as a path of member indexes, or None when it is not one (absent, empty,
    or holding anything but ints >= 0).

    Examples:
        >>> served_path([1, 0]), served_path([]), served_path(1), served_path([True])
        ((1, 0), None, None, None)
    """
    if not isinstance(mark, list | tuple) or not mark:
        return None
    for index in mark:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            return None
    return tuple(mark)


def served_mark(index: int, below: object = None) -> list[int]:
    """The mark a chain puts on an answer its member ``index`` gave: ``index`` in front
    of the path the answer already carries (``below``, from a chain inside that member),
    or ``[index]`` when it carries none.

    Examples:
        >>> served_mark(0, [1]), served_mark(2, None)
        ([0, 1], [2])
    """
    if below is None:  # a member that is no chain: most answers, one per streamed chunk
        return [index]
    return [index, *(served_path(below) or ())]


def served_member(stack: object, mark: object) -> object | None:
    """The model that served a call through ``stack``, by the answer's ``mark``.

    The path is followed from the first chain in ``stack`` (wrappers above it are passed
    through), one chain per index; the member it ends at, below which no chain lies, is
    the model that served (through any wrappers of its own: the one model at its
    bottom). None when ``mark`` is no path ([`served_path`][]), an index is out of
    range, or the path stops above a chain (which member of that chain served is not
    known: its primary did not necessarily).
    """
    path = served_path(mark)
    if path is None:
        return None
    current = stack
    for index in path:
        chain = _chain_in(current)
        if chain is None:
            return None
        members = layers_below(chain)
        if index >= len(members):
            return None
        current = members[index]
    if _chain_in(current) is not None:
        return None
    bottom = leaves(current)
    return bottom[0] if len(bottom) == 1 else None


def _chain_in(layer: object) -> object | None:
    """The first chain at or below ``layer`` through wrappers, or None when there is none."""
    seen: set[int] = set()
    current = layer
    while id(current) not in seen:
        seen.add(id(current))
        below = layers_below(current)
        if len(below) != 1:
            return current if below else None
        current = below[0]
    return None
