"""Which agent run a framework's run belongs to: a child run's root, looked up in O(1).

A framework names every call it makes (LangChain's ``run_id`` and ``parent_run_id``); a
call a tool, a subagent or another middleware makes inside an agent run descends from
the agent's root run. `RunTree` keeps each run's root as runs start, so a side call
is charged to the run it happened in. Bounded: the oldest roots are forgotten first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["RunTree"]


class RunTree:
    """Each run's root: ``add(run, parent)`` as runs start, ``root(run)`` to look one up.

    ``max_roots`` bounds the memory: past it, the root seen longest ago is forgotten with
    all its runs (``forget`` does it at once, when a run ends). Thread-safe.

    Examples:
        >>> tree = RunTree()
        >>> tree.add("agent", None); tree.add("model", "agent"); tree.add("tool", "agent")
        >>> tree.add("subagent-model", "tool")
        >>> tree.root("subagent-model")
        'agent'
    """

    __slots__ = ("_lock", "_max_roots", "_members", "_roots")

    def __init__(self, *, max_roots: int = 10_000) -> None:
        if not isinstance(max_roots, int) or isinstance(max_roots, bool) or max_roots < 1:
            raise ValueError(f"max_roots must be a whole number >= 1, got {max_roots!r}")
        self._max_roots = max_roots
        self._roots: dict[Hashable, Hashable] = {}
        self._members: OrderedDict[Hashable, list[Hashable]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._roots)

    def add(self, run: Hashable, parent: Hashable | None) -> Hashable:
        """Record that ``run`` started under ``parent`` (None: it is a root); its root."""
        with self._lock:
            root = run if parent is None else self._roots.get(parent, parent)
            if root not in self._members:
                self._members[root] = [root]
                self._roots[root] = root
                while len(self._members) > self._max_roots:
                    _, runs = self._members.popitem(last=False)
                    for each in runs:
                        self._roots.pop(each, None)
            if run not in self._roots:
                self._roots[run] = root
                self._members[root].append(run)
            return self._roots[run]

    def root(self, run: Hashable) -> Hashable | None:
        """The root of ``run``, or None when it was never added (or was forgotten)."""
        return self._roots.get(run)

    def forget(self, root: Hashable) -> None:
        """Forget ``root`` and every run under it."""
        with self._lock:
            for each in self._members.pop(root, ()):
                self._roots.pop(each, None)
