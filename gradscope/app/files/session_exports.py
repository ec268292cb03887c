"""Exports of what a Session shows: the picture on screen as PNG (blend or map alone), the raw signal as .npy,
the flow CSV, the plan as JSON or as a Python training script, all through ``app.files.exports`` (one pipeline, one
sidecar schema). An ``Exporter`` holds no state: it reads the Session's public read-out, so what is exported is
what is shown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradscope.app.files import exports as export
from gradscope.app.rendering.comparison import comparison_picture
from gradscope.core.errors import GraphError


class Exporter:
    def __init__(self, session: Any) -> None:
        self._s = session

    def overlay(
        self, path: str | Path, *, long_side: int | None = None, colorbar: bool = False, map_only: bool = False
    ) -> Path:
        """The picture on screen as PNG (``map_only``: the coloured map without the image), with the sidecar of
        the result it shows (``app.files.exports``: the same pipeline and schema as ``gradscope explain``)."""
        images = self._s.overlay()
        return export.write_overlay(
            path,
            images,
            self._sidecar(images.node, images),
            inputs=self._inputs(),
            long_side=long_side,
            colorbar=colorbar,
            map_only=map_only,
        )

    def signal(self, path: str | Path) -> Path:
        """The raw signal behind the map on screen (.npy, before reduction and normalisation) and its sidecar."""
        images = self._s.overlay()
        return export.write_signal(path, self._s.signal(images.node), self._sidecar(images.node), inputs=self._inputs())

    def _inputs(self) -> list[Any]:
        fed = self._s.fed
        return [self._s.document.path, fed.image_path, fed.source, fed.vocab.source if fed.vocab else None]

    def _sidecar(self, readout_node: str | None, images: Any = None) -> dict[str, Any]:
        s = self._s
        fed = s.fed.fed
        ids = fed.ids if fed is not None else None
        positions = export.position_rows(images.labels, images.saliency, ids) if images and images.labels else None
        result, shown = s.results.current, s.results
        predicted = int(result.target_indices[0]) if result is not None and result.target_indices.size else None
        sidecar = export.overlay_sidecar(
            model_name=s.graph.model_name if s.graph is not None else None,
            model_file=s.document.path,
            image=s.fed.described,
            preprocessing=s.fed.preprocessing,
            target=s.target,
            predicted_class=predicted,
            # the result shown (and exported) may belong to the previous plan while a newer one computes
            method=shown.method or s.editor.method_name,
            plan=s.plan if shown.plan is None else shown.plan,
            readout_node=readout_node,
            changed_nodes=result.rules if result is not None else (),
            view=s.shown_view,
            positions=positions,
            explained_token=self._explained_token(result),
            token_score=self._token_score(result, positions),
        )
        return sidecar

    def _token_score(self, result: Any, positions: Any) -> str | None:
        """How the token strip's scores were read (``rendering.positions.position_scores``), for token inputs."""
        from gradscope.engine.backward.attribution import TOKEN_READOUTS, token_readout

        fed = self._s.fed.fed
        if result is None or not positions or fed is None or fed.kind != "tokens":
            return None
        return TOKEN_READOUTS[token_readout(result.rules.values(), times_input=self._s.shown_view.times_input)]

    def _explained_token(self, result: Any) -> dict[str, Any] | None:
        """A language model's next token, as ``gradscope explain`` records it (its export is headed by it)."""
        from gradscope.core.targets import next_token_summary

        s = self._s
        if result is None or "token_position" not in result.meta or result.predictions.ndim != 3:
            return None  # the engine records the position of a language model's next token (its default target)
        position = int(result.meta["token_position"])
        vocab = s.fed.vocab
        return next_token_summary(
            result.logits[0, position],
            position,
            int(result.target_indices[0]),
            s.target.contrast,
            vocab.decode if vocab is not None else None,
        )

    def flow_csv(self, path: str | Path) -> Path:
        """Per-node statistics of baseline and current plan, one row per node in graph order."""
        results = self._s.results
        return export.write_flow_csv(path, results.flow_rows("current"), results.flow_rows("baseline"))

    def plan(self, path: str | Path) -> Path:
        path = Path(path)
        self._s.plan.save(path)
        return path

    def plan_snippet(self, path: str | Path) -> Path:
        """The plan as a Python training script (``plan_model``), to take a fix found here into training."""
        s = self._s
        return export.write_plan_snippet(path, s.plan, s.document.path, method=s.editor.method_name)

    def comparison(self, path: str | Path) -> Path:
        """A, B and A-B side by side as PNG, with a sidecar naming both plans and their agreement."""
        comparison, ab = self._s.comparison(), self._s.ab
        if comparison is None:
            raise GraphError("Nothing to compare: pin a result (Compare > Pin as B), then change the plan.")
        sidecar = {
            **self._sidecar(comparison.a.node),
            "compare": {
                "b_method": ab.pinned.method,
                "b_plan": ab.pinned.plan.to_dict(),
                "map_cosine": comparison.map_cosine,
                "node_cosine": ab.node_cosine,
            },
        }
        return export.write_comparison(path, comparison_picture(comparison), sidecar, inputs=self._inputs())
