"""Exports of the Session: what is on screen as PNG (blend or map alone), the raw signal as .npy, the flow CSV,
the plan as JSON or as a Python training script, all through ``app.export`` (one pipeline, one sidecar schema)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradscope.app import export
from gradscope.app.compare import comparison_picture
from gradscope.core.errors import GraphError


class ExportingMixin:
    """Exports for ``Session`` (which provides ``overlay``, ``signal``, ``result``, ``plan``, ``view`` ...)."""

    def export_overlay(
        self, path: str | Path, *, long_side: int | None = None, colorbar: bool = False, map_only: bool = False
    ) -> Path:
        """The picture on screen as PNG (``map_only``: the coloured map without the image), with the sidecar of
        the result it shows (``app.export``: the same pipeline and schema as ``gradscope explain``)."""
        images = self.overlay()
        return export.write_overlay(
            path,
            images,
            self._sidecar(images.node),
            inputs=self._inputs(),
            long_side=long_side,
            colorbar=colorbar,
            map_only=map_only,
        )

    def export_signal(self, path: str | Path) -> Path:
        """The raw signal behind the map on screen (.npy, before reduction and normalisation) and its sidecar."""
        images = self.overlay()
        return export.write_signal(path, self.signal(images.node), self._sidecar(images.node), inputs=self._inputs())

    def _inputs(self) -> list[Any]:
        return [self.model_path, self.image_path]

    def _sidecar(self, readout_node: str | None) -> dict[str, Any]:
        result = self.result
        predicted = int(result.target_indices[0]) if result is not None and result.target_indices.size else None
        sidecar = export.overlay_sidecar(
            model_name=self.graph.model_name if self.graph is not None else None,
            model_file=self.model_path,
            image=self.image_path,
            preprocessing=self.preprocessing,
            target=self.target,
            predicted_class=predicted,
            # the result shown (and exported) may belong to the previous plan while a newer one computes
            method=self.result_method or self.method_name,
            plan=self.plan if self.result_plan is None else self.result_plan,
            readout_node=readout_node,
            changed_nodes=result.rules if result is not None else (),
            view=self.shown_view,
        )
        return sidecar

    def export_flow_csv(self, path: str | Path) -> Path:
        """Per-node statistics of baseline and current plan, one row per node in graph order."""
        return export.write_flow_csv(path, self.flow_rows("current"), self.flow_rows("baseline"))

    def export_plan(self, path: str | Path) -> Path:
        path = Path(path)
        self.plan.save(path)
        return path

    def export_plan_snippet(self, path: str | Path) -> Path:
        """The plan as a Python training script (``plan_model``), to take a fix found here into training."""
        return export.write_plan_snippet(path, self.plan, self.model_path, method=self.method_name)

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
