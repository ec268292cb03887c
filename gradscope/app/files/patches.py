"""Patching effects written as every export is: the heat map as PNG, the numbers as ``<name>_effects.csv`` (one row
per component, block and unit; the exact effect beside an estimate when both were computed) and the JSON sidecar
(``core.formats.SidecarPatching``: method, metric, inputs, nodes, agreement), all or none."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gradscope import render
from gradscope.app.files.exports import _ending_in, refuse_overwriting
from gradscope.render.patch_grid import patch_grid_picture


def patch_title(result: Any) -> str:
    kind = "magnitude" if not result.signed else "change"
    return (
        f"{result.method}: {kind} of the {result.metric} when one value takes the corrupted input's "
        f"(clean {result.clean_value:.4g}, corrupted {result.corrupt_value:.4g})"
    )


def patch_picture(result: Any) -> Any:
    rows = {c: [f"{i} {_short(n)}" for i, n in enumerate(nodes)] for c, nodes in result.nodes.items()}
    return patch_grid_picture(
        result.by_component, result.units, title=patch_title(result), signed=result.signed, rows=rows
    )


def effects_csv(result: Any) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    both = bool(result.exact)
    writer.writerow(["component", "block", "node", "unit", "label", result.method, *(["exact"] if both else [])])
    for component, effects in result.by_component.items():
        for block, row in enumerate(effects):
            for unit, value in enumerate(row):
                extra = [repr(float(result.exact[component][block, unit]))] if both else []
                label = result.units[unit]
                writer.writerow(
                    [component, block, result.nodes[component][block], unit, label, repr(float(value)), *extra]
                )
    return out.getvalue()


def patch_sidecar(result: Any) -> dict[str, Any]:
    info = result.sidecar
    target = {k: info.get(k) for k in ("kind", "index", "contrast", "position")}
    return {
        "method": f"patching ({result.method})",
        "plan": {"entries": []},  # patching runs the model as it is
        "target": {**{k: v for k, v in target.items() if v is not None}, "class_index": info.get("index")},
        "view": {"colormap": "bwr" if result.signed else "viridis", "normalization": "signed", "signed": result.signed},
        "model": info.get("model"),
        "model_file": info.get("model_file"),
        "patching": {
            "method": result.method,
            "metric": result.metric,
            "metric_kind": info.get("metric_kind", "logit"),
            "clean": str(info.get("clean", "")),
            "corrupt": str(info.get("corrupt", "")),
            "clean_value": result.clean_value,
            "corrupt_value": result.corrupt_value,
            "signed": result.signed,
            "components": {c: list(n) for c, n in result.nodes.items()},
            "units": list(result.units),
            "grid": list(result.grid) if result.grid else None,
            "agreement": {c: a.to_dict() for c, a in result.agreement.items()},
            "seconds": result.seconds,
            "effects_csv": "",
        },
    }


def write_patch_result(result: Any, path: str | Path, *, inputs: Iterable[Any] = ()) -> Path:
    """The PNG at ``path`` (``.png`` added when missing), its CSV and sidecar; none replaces an input."""
    path = _ending_in(path, ".png")
    table = path.with_name(path.stem + "_effects.csv")
    refuse_overwriting([path, render.sidecar_path(path), table], [result.sidecar.get("model_file"), *inputs])
    sidecar = patch_sidecar(result)
    sidecar["patching"]["effects_csv"] = table.name
    data = effects_csv(result).encode("utf-8")
    return render.save_png(path, patch_picture(result), sidecar, [(table, lambda fh: fh.write(data))])


def _short(node: str) -> str:
    return node.rsplit("/", 1)[-1]
