"""Probing a stack of wrappers layer by layer: the layer contract, and every ``find_layer``.

The contract, once for every wrapper of every adapter: a layer answers
``layers_below()`` with a tuple of the objects it wraps directly, in order (one
``inner`` for a wrapper, the members for a fallback chain, nothing for a provider).
[`find_layer`][] and [`leaves`][] walk that tree depth first, the layer itself first.

An object without ``layers_below()`` (your own wrapper, following the SPEC's ``.inner``)
is read through its ``inner`` attribute: one object, or a list or tuple of them. Nothing
else is guessed from attribute names.

Examples:
    >>> class Box:
    ...     def __init__(self, inner): self.inner = inner
    >>> find_layer(Box(Box("provider")), str)
    'provider'
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = ["Layer", "Probeable", "WrapsOne", "find_layer", "layers_below", "leaves"]

LayerT = TypeVar("LayerT")


@runtime_checkable
class Layer(Protocol):
    """A wrapper in a resilience stack: it names what it wraps directly."""

    def layers_below(self) -> tuple[object, ...]:
        """The objects this layer wraps directly, in order (members of a chain in the
        order they are tried); empty for a provider."""
        ...


def layers_below(layer: object) -> tuple[object, ...]:
    """The objects ``layer`` wraps directly, in order: its ``layers_below()``, else its
    ``inner`` (one object or a sequence), else nothing.

    An attribute that fails to read (a property of a half-built object) counts as absent.
    """
    try:
        method: Any = getattr(layer, "layers_below", None)
        if callable(method) and not isinstance(layer, type):
            return tuple(method())
        inner: Any = getattr(layer, "inner", None)
    except Exception:
        return ()
    if inner is None:
        return ()
    if isinstance(inner, (list, tuple)):
        return tuple(inner)
    return (inner,)


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
        pending[0:0] = layers_below(current)
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
        children = layers_below(current)
        if children:
            pending[0:0] = children
        else:
            found.append(current)
    return found


class Probeable:
    """A layer's ``find_layer(cls)``: the first layer of type ``cls`` in the stack below
    it, itself included ([`find_layer`][]). A mixin for every wrapper of both adapters.

    Examples:
        >>> class Chain(Probeable):
        ...     def layers_below(self): return ("provider",)
        >>> Chain().find_layer(str)
        'provider'
    """

    __slots__ = ()

    def find_layer(self, cls: type[LayerT]) -> LayerT | None:
        """The first layer of type ``cls`` in the stack below (itself included), or None."""
        return find_layer(self, cls)


class WrapsOne(Probeable):
    """A layer over one object, its ``inner``: ``layers_below()`` is ``(inner,)`` and
    ``find_layer`` probes through it. A mixin for the single-inner wrappers of both
    adapters (a fallback chain names its members itself)."""

    __slots__ = ()

    def layers_below(self) -> tuple[object, ...]:
        """What this layer wraps directly: ``(inner,)`` (the layer contract)."""
        inner: object = self.inner  # type: ignore[attr-defined]
        return (inner,)
