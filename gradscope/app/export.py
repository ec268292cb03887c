"""The one export pipeline: overlay PNG + versioned JSON sidecar, flow CSV, plan JSON, for every front end.

``Session.export_overlay`` (GUI), ``Explanation.save`` (API) and ``gradscope explain`` (CLI) all build the
sidecar with ``overlay_sidecar`` and write with ``write_overlay``, so one result with one view gives the same
PNG bytes and the same JSON from any of them. Every write is atomic (``render.write_atomic``) and never
replaces a file the result was computed from.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gradscope import render
from gradscope.app.view import OverlayImages, ViewSettings
from gradscope.core.errors import GradscopeError
from gradscope.core.files import write_atomic

FLOW_COLUMNS = ("norm", "mean_abs", "max_abs", "zero_fraction", "nan_count", "inf_count")


class ExportError(GradscopeError):
    """An export would overwrite one of its own inputs, or cannot be written."""


def overlay_sidecar(
    *,
    model_name: str | None,
    model_file: str | None,
    image: str | None,
    preprocessing: str,
    target: Any,
    predicted_class: int | None,
    method: str,
    plan: Any,
    readout_node: str | None,
    changed_nodes: Iterable[str],
    view: ViewSettings,
) -> dict[str, Any]:
    """What the picture is: the schema ``render.save_png`` stamps with ``schema`` and ``gradscope_version``."""
    target_dict = dict(target.to_dict())
    target_dict["class_index"] = predicted_class  # the class actually explained (top-1 resolved)
    return {
        "model": model_name,
        "model_file": model_file,
        "image": image,
        "preprocessing": preprocessing,
        "target": target_dict,
        "predicted_class": predicted_class,
        "method": method,
        "plan": plan.to_dict(),
        "readout_node": readout_node,
        "changed_nodes": sorted(changed_nodes),
        "view": view.to_dict(),
    }


def refuse_overwriting(outputs: Iterable[str | Path], inputs: Iterable[str | Path | None]) -> None:
    """Raise ``ExportError`` if an output path is one of the inputs (``--out plan.png`` next to ``plan.json``
    would otherwise replace the plan with the sidecar)."""
    ins = {Path(p).resolve() for p in inputs if p}
    for out in outputs:
        if Path(out).resolve() in ins:
            raise ExportError(f"{out} is one of this result's inputs; choose another output name.")


def write_overlay(
    path: str | Path, images: OverlayImages, sidecar: dict[str, Any], *, inputs: Iterable[str | Path | None] = ()
) -> Path:
    """The overlay PNG (the blend, or the heat map where there is none) and its sidecar, both atomic."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        path = path.with_name(path.name + ".png") if path.suffix.lower() != ".json" else path.with_suffix(".png")
    refuse_overwriting([path, render.sidecar_path(path)], inputs)
    return render.save_png(path, images.picture, sidecar)


def write_flow_csv(path: str | Path, current: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> Path:
    """Per-node statistics of the current plan and the baseline, one row per node in graph order."""
    base = {r["node"]: r for r in baseline}
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["node", "rule", "status", *FLOW_COLUMNS, *(f"baseline_{c}" for c in FLOW_COLUMNS), "baseline_status"])
    for row in current:
        b = base.get(row["node"], {})
        w.writerow(
            [row["node"], row["rule"], row["status"]]
            + [row[c] for c in FLOW_COLUMNS]
            + [b.get(c, "") for c in FLOW_COLUMNS]
            + [b.get("status", "")]
        )
    data = buf.getvalue().encode("utf-8")
    return write_atomic(path, lambda fh: fh.write(data))
