"""Probing a stack of wrappers layer by layer: the rule behind every ``find_layer``.

Each wrapper exposes what it wraps as ``.inner`` (one object) or, for a fallback chain,
``.models``/``.llms`` (several). :func:`find_layer` walks that tree depth first, the
wrapper itself first, and returns the first object of the asked type.

>>> class Box:
...     def __init__(self, inner): self.inner = inner
>>> find_layer(Box(Box("provider")), str)
'provider'
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = ["find_layer", "layers_below", "leaves"]

LayerT = TypeVar("LayerT")

_CHILD_ATTRIBUTES = ("models", "llms", "inner")


def layers_below(layer: object) -> Iterable[object]:
    """The objects ``layer`` wraps directly, in order (members of a chain, or ``inner``)."""
    for attribute in _CHILD_ATTRIBUTES:
        try:
            children: Any = getattr(layer, attribute, None)
        except Exception:
            continue
        if children is None:
            continue
        if attribute == "inner":
            if isinstance(children, (list, tuple)):
                yield from children
            else:
                yield children
        else:
            yield from children
        return


def find_layer(layer: object, cls: type[LayerT]) -> LayerT | None:
    """The first object of type ``cls`` in the stack rooted at ``layer``, itself included."""
    pending = [layer]
    seen: set[int] = set()
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, cls):
            return current
        pending[0:0] = list(layers_below(current))
    return None


def leaves(layer: object) -> list[object]:
    """The objects at the bottom of the stack rooted at ``layer``, depth first, in order.

    For a fallback chain these are its providers (the members of nested chains
    included); for a model that wraps nothing, the model itself.
    """
    found: list[object] = []
    pending: list[object] = [layer]
    seen: set[int] = set()
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        children = list(layers_below(current))
        if children:
            pending[0:0] = children
        else:
            found.append(current)
    return found
