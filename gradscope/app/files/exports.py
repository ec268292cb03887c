"""The one export pipeline: overlay PNG + versioned JSON sidecar, flow CSV, plan JSON, for every front end.

``Session.export_overlay`` (GUI), ``Explanation.save`` (API) and ``gradscope explain`` (CLI) all build the
sidecar with ``overlay_sidecar`` and write with ``write_overlay``, so one result with one view gives the same
PNG bytes and the same JSON from any of them. Every write is atomic, a picture and its sidecar as a pair
(``core.files.write_files_atomic``), and never replaces a file the result was computed from.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from gradscope import render
from gradscope.app.rendering.view import OverlayImages, ViewSettings
from gradscope.core.errors import GradscopeError
from gradscope.core.files import write_atomic, write_files_atomic, write_text_atomic
from gradscope.core.formats import SIDECAR_SCHEMA, SidecarFile, encode, read_file
from gradscope.render.normalize import PERCENTILE_MIN_VALUES

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
    positions: list[dict[str, Any]] | None = None,
    explained_token: dict[str, Any] | None = None,
    alternate: str | None = None,
    token_score: str | None = None,
) -> dict[str, Any]:
    """What the picture is: the schema ``render.save_png`` stamps with ``schema`` and ``gradscope_version``;
    ``positions``: per-token or per-feature scores of a text or tabular input (``position_rows``);
    ``explained_token``: a language model's next token explained (``core.targets.next_token_summary``);
    ``alternate``: the other input the plan's value rules read; ``token_score``: how a token's score is read
    (``engine.backward.attribution.TOKEN_READOUTS``)."""
    target_dict = dict(target.to_dict())
    target_dict["class_index"] = predicted_class  # the class actually explained (top-1 resolved)
    extra: dict[str, Any] = {"positions": positions} if positions else {}
    if explained_token:
        extra["explained_token"] = explained_token
    if alternate:
        extra["alternate"] = alternate
    if token_score:
        extra["token_score"] = token_score
    return {
        **extra,
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


def read_sidecar(path: str | Path) -> dict[str, Any]:
    """The sidecar of an exported PNG (pass the PNG or its JSON), checked against ``core.formats.SidecarFile``:
    a hand-edited or foreign file is refused with the place of the problem, not half-read."""
    p = Path(path)
    p = p if p.suffix.lower() == ".json" else render.sidecar_path(p)
    doc = read_file(p, SidecarFile, what="sidecar", error=ExportError)
    if doc.schema > SIDECAR_SCHEMA:
        raise ExportError(f"{p.name} has sidecar schema {doc.schema}; this gradscope reads {SIDECAR_SCHEMA}.")
    return encode(doc)


def refuse_overwriting(outputs: Iterable[str | Path], inputs: Iterable[str | Path | None]) -> None:
    """Raise ``ExportError`` if an output path is one of the inputs (``--out plan.png`` next to ``plan.json``
    would otherwise replace the plan with the sidecar)."""
    ins = {Path(p).resolve() for p in inputs if p}
    for out in outputs:
        if Path(out).resolve() in ins:
            raise ExportError(f"{out} is one of this result's inputs; choose another output name.")


MIN_LONG_SIDE = 512  # a 64x64 overlay is a thumbnail nobody can read: exports are at least this long
# A requested size is checked before anything is allocated: 100000 px asked for 30 GB and the kernel's OOM
# killer ended the process. 8192 px is a 200 MB picture, past any screen or print use.
SIZE_RANGE = (16, 8192)


def check_long_side(long_side: int | None) -> None:
    """Raise ``ExportError`` for a requested long side outside ``SIZE_RANGE`` (None: the default size)."""
    if long_side is None:
        return
    low, high = SIZE_RANGE
    if isinstance(long_side, bool) or not isinstance(long_side, int) or not low <= long_side <= high:
        raise ExportError(
            f"Cannot export at {long_side!r} px: the long side must be a whole number from {low} to {high}."
        )


def export_picture(
    images: OverlayImages,
    view: ViewSettings,
    *,
    long_side: int | None = None,
    colorbar: bool = False,
    map_only: bool = False,
) -> np.ndarray:
    """What an overlay export writes: the picture on screen (``map_only``: the coloured map without the image),
    resized so its long side is ``long_side`` (default: the image's own size, at least ``MIN_LONG_SIDE``), with
    an optional colour bar below it."""
    picture = images.heat if map_only else images.picture
    h, w = picture.shape[:2]
    check_long_side(long_side)
    target = long_side if long_side else max(MIN_LONG_SIDE, h, w)
    if target < 8:
        raise ExportError(f"An overlay needs a long side of at least 8 pixels, got {target}.")
    if max(h, w) != target:
        scale = target / max(h, w)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        # a heat map strip keeps its cells; a blend over a photo is smoothed
        resample = Image.Resampling.NEAREST if images.blend is None or map_only else Image.Resampling.BILINEAR
        picture = np.asarray(Image.fromarray(picture).resize(size, resample))
    if images.labels and images.blend is None:  # a token strip ends where its tokens do (not 1024 px, most white)
        picture = _trimmed_right(picture)
    if colorbar:
        picture = _with_colorbar(picture, view, images.saliency)
    return picture


def _trimmed_right(picture: np.ndarray, margin: int = 6, least: int = 320) -> np.ndarray:
    """``picture`` without the white columns at its right beyond ``margin``, at least ``least`` wide (the colour
    bar's labels and the heading need some width)."""
    ink = np.flatnonzero((picture[..., :3] < 250).any(axis=(0, 2)))
    width = max(least, int(ink[-1]) + 1 + margin) if ink.size else picture.shape[1]
    return picture[:, : min(width, picture.shape[1])]


def clip_value(values: np.ndarray, normalization: str, percentile: float = 99.0) -> float | None:
    """Where a percentile normalisation clips ``values`` (None: it does not clip them)."""
    if normalization != "signed_percentile" or values.size < PERCENTILE_MIN_VALUES:
        return None
    top = float(np.percentile(np.abs(values), percentile))
    return top if top > 0 else None


def _with_colorbar(picture: np.ndarray, view: ViewSettings, saliency: np.ndarray) -> np.ndarray:
    """The colormap as a strip under the picture, labelled with the map's range before normalisation."""
    h, w = picture.shape[:2]
    bar_h, pad = max(10, h // 32), max(4, h // 100)
    signed = render.is_signed(view.normalization)
    ramp = np.linspace(-1.0 if signed else 0.0, 1.0, w)[None, :].repeat(bar_h, axis=0)
    bar = render.apply_colormap(ramp, view.colormap, signed=signed)
    canvas = Image.new("RGB", (w, h + pad + bar_h + 14), "white")
    canvas.paste(Image.fromarray(np.ascontiguousarray(picture[..., :3])), (0, 0))
    canvas.paste(Image.fromarray(np.ascontiguousarray(bar)), (0, h + pad))
    finite = np.asarray(saliency, np.float64)[np.isfinite(saliency)]
    draw = ImageDraw.Draw(canvas)
    clip = clip_value(finite, view.normalization)
    if clip is not None:  # the ends' colours stand for +-the clip value and everything past it
        low, label = f"<= {-clip:.3g}", f">= {clip:.3g}"
    elif finite.size:
        low, label = f"{finite.min():.3g}", f"{finite.max():.3g}"
    else:  # no value to label the ends with: say so rather than "0 ... 0"
        low, label = "no finite value in the map (NaN/Inf)", ""
    draw.text((2, h + pad + bar_h + 1), low, fill="black")
    draw.text((w - 2 - draw.textlength(label), h + pad + bar_h + 1), label, fill="black")
    return np.asarray(canvas)


def write_overlay(
    path: str | Path,
    images: OverlayImages,
    sidecar: dict[str, Any],
    *,
    inputs: Iterable[str | Path | None] = (),
    long_side: int | None = None,
    colorbar: bool = False,
    map_only: bool = False,
) -> Path:
    """The overlay PNG (the blend, or the heat map where there is none; ``map_only``: the heat map alone; see
    ``export_picture``) and its sidecar, both atomic. The sidecar's ``export`` says the written size, whether a
    colour bar is drawn and whether the picture is the map alone."""
    path = _ending_in(path, ".png", replacing=".json")
    refuse_overwriting([path, render.sidecar_path(path)], inputs)
    view = ViewSettings.from_dict(sidecar.get("view") or {})
    picture = export_picture(images, view, long_side=long_side, colorbar=colorbar, map_only=map_only)
    token = sidecar.get("explained_token")
    if token and images.labels:  # a language model's map says which next token (and contrast) it explains
        from gradscope.core.targets import describe_next_token
        from gradscope.render.positions import with_heading

        picture = with_heading(picture, describe_next_token(token).capitalize())
    size = [int(picture.shape[1]), int(picture.shape[0])]
    export = {"size": size, "colorbar": colorbar, "map_only": map_only}
    positions = sidecar.get("positions") or []
    companions = []
    if positions:  # a text or tabular input: its scores as a table too, written with the picture
        table = path.with_name(path.stem + "_scores.csv")
        refuse_overwriting([table], inputs)
        data = scores_csv_text(positions).encode("utf-8")
        companions.append((table, lambda fh: fh.write(data)))
        export["scores_csv"] = table.name
    return render.save_png(path, picture, {**sidecar, "export": export}, companions)


def position_rows(labels: Iterable[str], scores: np.ndarray, ids: Any = None) -> list[dict[str, Any]]:
    """The sidecar's ``positions``: one row per token or feature, in input order."""
    rows = []
    for i, (label, score) in enumerate(zip(labels, np.asarray(scores, np.float64).reshape(-1).tolist())):
        row: dict[str, Any] = {"index": i, "label": str(label), "score": score}
        if ids is not None:
            row["id"] = int(np.asarray(ids).reshape(-1)[i])
        rows.append(row)
    return rows


def scores_csv_text(positions: list[dict[str, Any]]) -> str:
    """Per-position scores as CSV (index, label, id, score)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["index", "label", "id", "score"])
    for p in positions:
        writer.writerow([p["index"], p["label"], "" if p.get("id") is None else p["id"], repr(float(p["score"]))])
    return out.getvalue()


def write_comparison(path: str | Path, picture: np.ndarray, sidecar: dict[str, Any], *, inputs: Iterable = ()) -> Path:
    """The A|B comparison picture (``app.rendering.comparison.comparison_picture``) as PNG with its sidecar, atomic."""
    path = _ending_in(path, ".png")
    refuse_overwriting([path, render.sidecar_path(path)], inputs)
    return render.save_png(path, picture, sidecar)


def write_signal(path: str | Path, signal: np.ndarray, sidecar: dict[str, Any], *, inputs: Iterable = ()) -> Path:
    """The raw signal behind a map (one sample, float32, before channel reduction and normalisation) as
    ``.npy``, with the same sidecar as the overlay (``export.kind`` = "signal"), both atomic."""
    path = _ending_in(path, ".npy")
    refuse_overwriting([path, render.sidecar_path(path)], inputs)
    array = np.ascontiguousarray(np.asarray(signal, np.float32))
    text = render.sidecar_text(
        {**sidecar, "export": {"kind": "signal", "shape": list(array.shape), "dtype": "float32"}}
    )
    data = text.encode("utf-8")
    write_files_atomic(
        [(path, lambda f: np.save(f, array, allow_pickle=False)), (render.sidecar_path(path), lambda f: f.write(data))]
    )
    return path


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


def plan_snippet(plan: Any, model_file: str | Path | None, *, method: str = "") -> str:
    """A Python script that trains with ``plan``: the model loaded as gradscope loads it, wrapped by
    ``plan_model`` so that ``fit`` follows the plan's backward pass (a fix found in the GUI goes straight into
    a training script). Rule files the plan needs are loaded by path; plugin rules by their package."""
    import pprint

    from gradscope.rules.base import rule_source

    sources = sorted({rule_source(e.rule) for e in plan.entries} - {"builtin", "?"})
    files = [s for s in sources if not s.startswith("plugin ")]
    model = repr(str(model_file)) if model_file else '"model.keras"  # your model file'
    # Every value from the plan, the model's path or the command line is written as a literal in code (repr),
    # never inside the docstring or a comment: a plan's name is data, and a `"""` in it must not end a string.
    lines = [
        '"""Train with a gradscope plan (PLAN below): forward unchanged, backward as planned. Generated by',
        "gradscope; edit freely.",
        '"""',
        "",
        "from gradscope.engine.training.plan_model import plan_model",
        "from gradscope.io.models import load_model",
        "from gradscope.rules.plan import Plan",
    ]
    if files:
        lines.append("from gradscope.rules.base import load_rule_file")
    if any(s.startswith("plugin ") for s in sources):
        lines.append("from gradscope.rules.base import load_rule_plugins")
    lines.append("")
    lines += [f"load_rule_file({f!r})  # the plan's own rules (Python code: run only what you trust)" for f in files]
    if any(s.startswith("plugin ") for s in sources):
        plugins = [s.removeprefix("plugin ") for s in sources if s.startswith("plugin ")]
        lines.append(f"load_rule_plugins()  # the plan's rules come from the plugin(s) {plugins!r}")
    lines += [
        f"PLAN = Plan.from_dict({pprint.pformat(plan.to_dict(), indent=4, width=100)})",
        f"PLAN_NAME = PLAN.name or {method or '(unnamed)'!r}  # the method the plan came from, when it has no name",
        "",
        f"model = load_model({model})",
        "planned = plan_model(model, PLAN)  # trains `model`'s own variables; save `model`, not the wrapper",
        "",
        'if __name__ == "__main__":',
        '    # planned.compile(optimizer="adam", loss="sparse_categorical_crossentropy")',
        "    # planned.fit(x_train, y_train, epochs=1)",
        '    print(f"{model.name} with plan {PLAN_NAME!r}: call planned.compile(...) and planned.fit(...)")',
        "",
    ]
    return "\n".join(lines)


def write_plan_snippet(path: str | Path, plan: Any, model_file: str | Path | None, *, method: str = "") -> Path:
    path = _ending_in(path, ".py")
    refuse_overwriting([path], [model_file])
    return write_text_atomic(path, plan_snippet(plan, model_file, method=method))


def _ending_in(path: str | Path, suffix: str, *, replacing: str | None = None) -> Path:
    """``path`` with ``suffix`` appended unless it already ends so (``replacing``: that suffix is swapped)."""
    path = Path(path)
    if path.suffix.lower() == suffix:
        return path
    if replacing is not None and path.suffix.lower() == replacing:
        return path.with_suffix(suffix)
    return path.with_name(path.name + suffix)
