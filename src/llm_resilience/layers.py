"""Probing a stack of wrappers layer by layer: the layer contract, every ``find_layer``,
and what a wrapper reads from the object below it.

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

A wrapper that stands in for what it wraps answers the reads it cannot answer itself
from the object below ([`read_through`][]) and never passes a write down
([`refuse_shadowing_write`][]): a fallback chain reads from its first member, a
retrying vector store from its store.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = [
    "Layer",
    "Probeable",
    "WrapsOne",
    "find_layer",
    "layers_below",
    "leaves",
    "read_through",
    "reads_through",
    "refuse_shadowing_write",
]

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


def reads_through(layer: object, name: str) -> bool:
    """Whether a read of ``name`` that ``layer``'s own lookup missed may go below it.

    Not for a private or dunder name (``_x``, ``__x__``): the layer's internals,
    pydantic's private attributes, and the protocol probes of ``copy``, ``pickle`` and
    the frameworks stay the layer's, present or absent. Not for a name the layer's class
    defines or declares (an attribute, a property, a method, an annotation such as a
    pydantic field): a property that failed must not be masked by the value below.
    """
    if name.startswith("_"):
        return False
    cls = type(layer)
    if hasattr(cls, name):
        return False
    return not any(name in vars(klass).get("__annotations__", ()) for klass in cls.__mro__)


def read_through(
    layer: object,
    name: str,
    below: object | None,
    missing: AttributeError | None = None,
    *,
    role: str,
    methods_refused: str | None = None,
) -> object:
    """The value of ``name`` read from ``below``, for ``layer``'s ``__getattr__``.

    ``missing`` is the ``AttributeError`` the layer's own lookup raised (by default one
    naming the layer and the attribute); it is raised unchanged when the read is not
    ``below``'s to answer: [`reads_through`][] says no, or ``below`` is None (a layer
    not yet built: during construction or unpickling). ``role`` says what ``below`` is to
    the layer (``"first member"``, ``"inner store"``) in the error for a name ``below``
    lacks too. With ``methods_refused`` (why, in a few words) a method bound to
    ``below`` or its class is not handed out: a call through it would skip what the
    layer does around calls.

    Examples:
        >>> class Store:
        ...     collection_name = "docs"
        >>> class Wrapper:
        ...     inner = Store()
        ...     def __getattr__(self, name):
        ...         return read_through(self, name, self.inner, role="inner store")
        >>> Wrapper().collection_name
        'docs'
        >>> Wrapper().foo
        Traceback (most recent call last):
        ...
        AttributeError: 'Wrapper' object has no attribute 'foo', nor has its inner store (Store)
    """
    if missing is None:
        missing = AttributeError(
            f"{type(layer).__name__!r} object has no attribute {name!r}", name=name, obj=layer
        )
    if below is None or not reads_through(layer, name):
        raise missing
    try:
        value = getattr(below, name)
    except AttributeError as error:
        raise AttributeError(
            f"{type(layer).__name__!r} object has no attribute {name!r}, nor has its "
            f"{role} ({type(below).__name__})",
            name=name,
            obj=layer,
        ) from error
    if (
        methods_refused is not None
        and inspect.ismethod(value)
        and value.__self__ in (below, type(below))
    ):
        raise AttributeError(
            f"{type(layer).__name__!r} object does not hand out its {role}'s method "
            f"{name!r}: {methods_refused}; .inner.{name}(...) calls it directly",
            name=name,
            obj=layer,
        )
    return value


def refuse_shadowing_write(layer: object, name: str, below: object | None, *, role: str) -> None:
    """Raise ``AttributeError`` if writing ``name`` on ``layer`` would hide ``below``'s.

    The counterpart of [`read_through`][], for ``__setattr__``: a write never goes
    below (a wrapper does not change what it wraps), and one that landed on the layer
    would leave the layer reading one value while ``below`` works with another. So a
    write of a name read through from ``below`` is refused; the layer's own names (its
    class's, those it holds already, private ones) and names ``below`` lacks are the
    layer's to write.

    ```pycon
    >>> class Store:
    ...     collection_name = "docs"
    >>> class Wrapper:
    ...     pass
    >>> refuse_shadowing_write(Wrapper(), "collection_name", Store(), role="store")
    Traceback (most recent call last):
    ...
    AttributeError: 'Wrapper' object does not pass writes to its store (Store): set collection_name on .inner instead

    ```
    """  # noqa: E501
    if below is None or name in getattr(layer, "__dict__", ()) or not reads_through(layer, name):
        return
    if hasattr(below, name):
        raise AttributeError(
            f"{type(layer).__name__!r} object does not pass writes to its {role} "
            f"({type(below).__name__}): set {name} on .inner instead",
            name=name,
            obj=layer,
        )


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
