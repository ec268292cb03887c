"""A/B comparison as a small evented model: the result pinned as B and how A (the result on screen) agrees with
it, node by node. The maps, their difference and the export are in ``app.compare``.

Owns: ``pinned`` (``Pinned``: B's result, plan and method) and ``node_cosine`` (per node, the cosine between A's
and B's signals, computed on the worker because it reads every node's signal).
Emits: ``changed(pinned or None)`` when B is pinned or dropped, when A changes, and when the cosines arrive.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gradscope.app.compare import Pinned, node_cosines
from gradscope.app.results import Results
from gradscope.core.events import Signal


class PlanComparison:
    def __init__(self, results: Results, submit: Callable[..., Any]) -> None:
        """``results``: A is always ``results.current``; ``submit(kind, label, job, on_done, quiet=True)`` runs
        a job on the worker (the Session's)."""
        self._results = results
        self._submit = submit
        self.pinned: Pinned | None = None
        self.node_cosine: dict[str, float] = {}
        self.changed = Signal("compare_changed")

    def pin(self, method: str) -> bool:
        """Keep the result on screen as B (``method``: its method's name when the results do not say)."""
        r = self._results
        if r.current is None or r.plan is None:
            return False
        self.pinned = Pinned(r.current, r.plan, r.method or method)
        self.refresh()
        return True

    def swap(self, method: str) -> Pinned | None:
        """The result on screen becomes B; returns the B it replaces (whose plan the caller makes current)."""
        old = self.pinned
        if old is None or not self.pin(method):
            return None
        return old

    def unpin(self) -> None:
        self.pinned = None
        self.node_cosine = {}
        self.changed.emit(None)

    def refresh(self) -> None:
        """A changed (or B was pinned): tell the views, then compute the per-node cosines on the worker."""
        self.node_cosine = {}
        self.changed.emit(self.pinned)
        a = self._results.current
        if self.pinned is None or a is None:
            return
        b = self.pinned.result

        def done(cosines: dict[str, float]) -> None:
            self.node_cosine = cosines
            self.changed.emit(self.pinned)

        self._submit("compare", "", lambda token: node_cosines(a, b), done, quiet=True)


__all__ = ["Pinned", "PlanComparison"]
