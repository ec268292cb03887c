"""A/B comparison as a small evented model: the result pinned as B and how A (the result on screen) agrees with
it, node by node. The maps, their difference and the export are in ``app.rendering.comparison``.

Owns: ``pinned`` (``Pinned``: B's result, plan and method) and ``node_cosine`` (per node, the cosine between A's
and B's signals, computed on the worker because it reads every node's signal).
Emits: ``changed(pinned or None)`` when B is pinned or dropped, when A changes, and when the cosines arrive.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gradscope.app.models.feedback import Feedback
from gradscope.app.models.results import Results, signal_of
from gradscope.app.rendering.comparison import Comparison, Pinned, compare, node_cosines
from gradscope.app.rendering.view import ViewSettings
from gradscope.core.errors import GraphError
from gradscope.core.events import Signal


class PlanComparison:
    def __init__(self, results: Results, submit: Callable[..., Any], feedback: Feedback) -> None:
        """``results``: A is always ``results.current``; ``submit(kind, label, job, on_done, quiet=True)`` runs
        a job on the worker (``Jobs.submit``)."""
        self._results = results
        self._submit = submit
        self._feedback = feedback
        self.pinned: Pinned | None = None
        self.node_cosine: dict[str, float] = {}
        self.changed = Signal("compare_changed")

    def pin(self, *, quiet: bool = False) -> bool:
        """Keep the result on screen as B."""
        r = self._results
        if r.current is None or r.plan is None:
            if not quiet:
                self._feedback.error(
                    "Nothing to pin", "Wait for a result, then pin it to compare the next plan with it."
                )
            return False
        self.pinned = Pinned(r.current, r.plan, r.method or "custom")
        self.refresh()
        if not quiet:
            self._feedback.say(f"Pinned {self.pinned.method} as B: the next plans are compared with it.")
        return True

    def swap(self) -> Pinned | None:
        """The result on screen becomes B; returns the B it replaces (whose plan the caller makes current)."""
        old = self.pinned
        if old is None or not self.pin(quiet=True):
            return None
        return old

    def unpin(self) -> None:
        self.pinned = None
        self.node_cosine = {}
        self.changed.emit(None)

    def end(self, why: str) -> None:
        """B compares plans on one input and target: another one makes it meaningless (``why`` says which)."""
        if self.pinned is not None:
            self.unpin()
            self._feedback.say(f"Comparison ended: {why} (pin again to compare on it).")

    def drop(self) -> None:
        """A new model: the comparison belonged to the previous one (quiet, the new model is announced)."""
        self.pinned, self.node_cosine = None, {}

    def comparison(self, view: ViewSettings, node: str | None, image: Any, fallback_method: str) -> Comparison | None:
        """A (the result on screen) and B (pinned), read out with ``view`` at ``node`` (None: the input)."""
        a = self._results.current
        if self.pinned is None or a is None:
            return None
        try:
            sa, sb = signal_of(a, node, view), signal_of(self.pinned.result, node, view)
        except GraphError:
            return None
        labels = (self._results.method or fallback_method, self.pinned.method)
        return compare(sa, sb, image, view, node, labels, (a.stats, self.pinned.result.stats))

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
