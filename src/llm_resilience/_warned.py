"""Warning once per object: the table each warning about an object keeps."""

from __future__ import annotations

import threading
import weakref
from typing import Any

__all__ = ["WarnedOnce"]


class WarnedOnce:
    """The objects already warned about, so each is warned about once.

    Kept by id, each with a weak reference whose callback forgets the id once the object
    is gone: a process that builds a model per request neither grows this table nor
    stays silent about a new object that reuses a freed object's address.
    """

    def __init__(self) -> None:
        self._seen: dict[int, weakref.ref[Any] | None] = {}
        self._lock = threading.RLock()

    def __contains__(self, key: int) -> bool:
        return key in self._seen

    def first(self, candidate: object) -> bool:
        """True the first time ``candidate`` (this very object) is seen."""
        key = id(candidate)
        with self._lock:
            if key in self._seen:
                return False
            try:
                self._seen[key] = weakref.ref(candidate, lambda _: self._forget(key))
            except TypeError:  # not weakly referenceable: remembered for the process's life
                self._seen[key] = None
            return True

    def _forget(self, key: int) -> None:
        with self._lock:
            self._seen.pop(key, None)
