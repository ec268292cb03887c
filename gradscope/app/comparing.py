"""A/B comparison in the Session: pin the result on screen as B, edit the plan (A is always the current
result), see both maps, their difference and the per-node agreement; swap A and B in one click; export."""

from __future__ import annotations

from pathlib import Path

from gradscope.app import export
from gradscope.app.compare import Comparison, Pinned, compare, comparison_picture, node_cosines
from gradscope.core.errors import GraphError


class ComparingMixin:
    """For ``Session`` (which provides ``result``, ``result_plan``, ``result_method``, ``view``, ``image``,
    ``readout``, ``_signal_from``, ``set_plan``, the signals and ``_submit``)."""

    pinned: Pinned | None  # set by Session.__init__ (None) and reset when a model opens
    node_cosine: dict[str, float]

    def pin_for_compare(self) -> bool:
        """Keep the result on screen as B (what the next plans are compared with)."""
        if self.result is None or self.result_plan is None:
            self._error("Nothing to pin", "Wait for a result, then pin it to compare the next plan with it.", None)
            return False
        self.pinned = Pinned(self.result, self.result_plan, self.result_method or self.method_name)
        self._refresh_comparison()
        self.status_changed.emit(f"Pinned {self.pinned.method} as B: the next plans are compared with it.")
        return True

    def unpin(self) -> None:
        self.pinned = None
        self.node_cosine = {}
        self.compare_changed.emit(None)

    def _unpin_for(self, why: str) -> None:
        """B compares plans on one input and target: another one makes it meaningless."""
        if self.pinned is not None:
            self.unpin()
            self.status_changed.emit(f"Comparison ended: {why} (pin again to compare on it).")

    def swap_compare(self) -> bool:
        """B's plan becomes the current one (an undoable edit) and the result on screen becomes B."""
        if self.pinned is None or self.result is None or self.result_plan is None:
            return False
        old = self.pinned
        self.pinned = Pinned(self.result, self.result_plan, self.result_method or self.method_name)
        self.method_name = old.method
        self.set_plan(old.plan)
        self._refresh_comparison()
        return True

    def comparison(self) -> Comparison | None:
        """A (the result on screen) and B (pinned), read out with the current view at the current read-out."""
        if self.pinned is None or self.result is None:
            return None
        node = self.readout
        try:
            a, b = self._signal_from(self.result, node), self._signal_from(self.pinned.result, node)
        except GraphError:
            return None
        labels = (self.result_method or self.method_name, self.pinned.method)
        stats = (self.result.stats, self.pinned.result.stats)
        return compare(a, b, self.image, self.shown_view, node, labels, stats)

    def export_comparison(self, path: str | Path) -> Path:
        """A, B and A-B side by side as PNG, with a sidecar naming both plans and their agreement."""
        comparison = self.comparison()
        if comparison is None:
            raise GraphError("Nothing to compare: pin a result (Compare > Pin as B), then change the plan.")
        sidecar = {
            **self._sidecar(comparison.a.node),
            "compare": {
                "b_method": self.pinned.method,
                "b_plan": self.pinned.plan.to_dict(),
                "map_cosine": comparison.map_cosine,
                "node_cosine": self.node_cosine,
            },
        }
        return export.write_comparison(path, comparison_picture(comparison), sidecar, inputs=self._inputs())

    def _refresh_comparison(self) -> None:
        """Tell the views, then compute the per-node cosines on the worker (they read every node's signal)."""
        self.node_cosine = {}
        self.compare_changed.emit(self.pinned)
        if self.pinned is None or self.result is None:
            return
        a, b = self.result, self.pinned.result

        def done(cosines: dict[str, float]) -> None:
            self.node_cosine = cosines
            self.compare_changed.emit(self.pinned)

        self._submit("compare", "", lambda token: node_cosines(a, b), done, quiet=True)


__all__ = ["ComparingMixin", "Pinned"]
