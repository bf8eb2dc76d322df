"""Raising a configured error many times without keeping every raise alive."""

from __future__ import annotations

import copy
from typing import TypeVar

__all__ = ["fresh_error"]

E = TypeVar("E", bound=BaseException)


def fresh_error(error: E) -> E:
    """A copy of ``error`` to raise in its place: same type, arguments and attributes.

    A fake that raises one configured exception object on every call leaks: each raise
    prepends the raising frames to that object's ``__traceback__``, so the traceback
    grows by a few frames per call and keeps all of them (and everything they refer to)
    alive. Raising a shallow copy leaves the configured object untouched; each copy's
    traceback is its own and is freed with it.

    Exceptions whose constructor cannot be replayed from ``args`` (the SDKs' status
    errors take keyword-only ``response`` and ``body``) are copied without calling it.

    >>> original = ValueError("scripted")
    >>> copied = fresh_error(original)
    >>> copied is not original, type(copied), copied.args
    (True, <class 'ValueError'>, ('scripted',))
    """
    try:
        clone = copy.copy(error)
    except Exception:
        clone = type(error).__new__(type(error), *error.args)
        clone.__dict__.update(error.__dict__)
    clone.__traceback__ = None
    clone.__cause__ = error.__cause__
    clone.__suppress_context__ = error.__suppress_context__
    return clone
