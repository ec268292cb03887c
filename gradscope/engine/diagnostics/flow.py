"""Gradient flow (``gradient_flow``): per-node activation-gradient statistics and per-layer weight statistics of
one backward pass (usually of a training loss), with vanishing / exploding / dead-ReLU flags; see
``FlowThresholds`` for the defaults and why.

The per-layer picture of one backward pass; ``gradscope.engine.diagnostics.paths`` says why a path is cut.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.display import RichDisplay
from gradscope.core.errors import GraphError
from gradscope.core.files import write_atomic, write_text_atomic
from gradscope.core.results import NodeStats
from gradscope.core.targets import Target
from gradscope.engine.diagnostics.paths import as_engine, variable_owners


# ================================================================================================ gradient flow
@dataclass(frozen=True)
class FlowThresholds:
    """When a layer is flagged in the gradient-flow report (defaults and why).

    - ``vanishing_ratio = 1e-7``: ``|grad W| / |W|`` below this means even a learning rate of 1 moves the
      weights by less than float32 resolution (eps = 1.2e-7): the layer is frozen in practice.
    - ``exploding_ratio = 10``: one SGD step at lr 0.1 would move the weights by more than their own norm.
    - ``vanishing_activation = 1e-6`` / ``exploding_activation = 1e6``: mean ``|g|`` at a node relative to the
      output end of the backward pass (the node nearest the target with a non-zero gradient). Signals that
      shrink or grow by six orders of magnitude on the way down are the classic vanishing / exploding picture;
      the ratio is independent of the loss scale.
    - ``dead_relu = 0.5``: flag a ReLU node when at least half of its units (channels; neurons of a Dense)
      output 0 for every sample of the batch (and every position): those units pass no gradient at all.
    """

    vanishing_ratio: float = 1e-7
    exploding_ratio: float = 10.0
    vanishing_activation: float = 1e-6
    exploding_activation: float = 1e6
    dead_relu: float = 0.5

    def describe(self) -> str:
        return (
            f"vanishing if |grad W|/|W| < {self.vanishing_ratio:g} or mean|g| < {self.vanishing_activation:g} x the "
            f"output end; exploding if |grad W|/|W| > {self.exploding_ratio:g} or mean|g| > "
            f"{self.exploding_activation:g} x the output end; dead ReLU if >= {self.dead_relu:.0%} of units are 0 "
            "for the whole batch"
        )


#: ReLU-like activations whose "dead" units output exactly 0.
RELU_ACTIVATIONS = ("relu", "relu6")
FITTED_LOSS = 1e-6  # a loss at or below this: the batch is fitted (float32 cross-entropy of a sure, right answer)


@dataclass(frozen=True)
class WeightFlow:
    """Gradient of one trainable variable."""

    path: str
    node: str | None
    shape: tuple[int, ...]
    norm: float  # |W|
    grad_norm: float  # |grad W|
    grad_mean_abs: float
    grad_max_abs: float
    ratio: float  # |grad W| / |W| (nan when |W| = 0, e.g. a zero-initialised bias)
    nan_count: int
    inf_count: int
    is_none: bool  # no gradient at all (disconnected / cut)


@dataclass(frozen=True)
class FlowRow:
    """One node: the gradient arriving at its output, and the gradient of its layer's weights."""

    node: str
    layer: str | None
    op_type: str
    status: str  # none | nan | zero | ok (of the activation gradient)
    grad_norm: float
    grad_mean_abs: float
    grad_max_abs: float
    grad_zero_fraction: float
    grad_relative: float  # mean|g| / mean|g| at the output end
    grad_nan: int
    grad_inf: int
    weight_paths: tuple[str, ...] = ()
    weight_norm: float = math.nan
    weight_grad_norm: float = math.nan
    weight_grad_mean_abs: float = math.nan
    weight_grad_max_abs: float = math.nan
    weight_ratio: float = math.nan
    weight_nan: int = 0
    weight_inf: int = 0
    weights_without_gradient: tuple[str, ...] = ()
    dead_relu_fraction: float | None = None
    flags: tuple[str, ...] = ()


FLOW_COLUMNS = (
    "node",
    "layer",
    "op_type",
    "status",
    "grad_norm",
    "grad_mean_abs",
    "grad_max_abs",
    "grad_zero_fraction",
    "grad_relative",
    "grad_nan",
    "grad_inf",
    "weight_norm",
    "weight_grad_norm",
    "weight_grad_mean_abs",
    "weight_grad_max_abs",
    "weight_ratio",
    "weight_nan",
    "weight_inf",
    "dead_relu_fraction",
    "flags",
)


@dataclass
class FlowReport(RichDisplay):
    """Per-layer gradient flow of one backward pass; ``rows`` in graph order (inputs excluded)."""

    _html_maker = "gradscope.app.display.reports:flow_html"  # in a notebook (gradscope.core.display)

    model_name: str
    target: str
    rows: list[FlowRow]
    weights: list[WeightFlow]
    thresholds: FlowThresholds
    reference_node: str | None  # the output-end node relative values are measured against
    loss_value: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def row(self, node_id: str) -> FlowRow:
        for r in self.rows:
            if r.node == node_id:
                return r
        raise GraphError(f"No node {node_id!r} in the gradient-flow report.")

    def flagged(self, flag: str | None = None) -> list[FlowRow]:
        return [r for r in self.rows if (flag in r.flags if flag else r.flags)]

    @property
    def ok(self) -> bool:
        return not self.flagged()

    def table(self) -> list[dict[str, Any]]:
        out = []
        for r in self.rows:
            d = {c: getattr(r, c) for c in FLOW_COLUMNS}
            d["flags"] = " ".join(r.flags)
            out.append(d)
        return out

    def to_csv(self, path: str | Path) -> Path:
        """One row per node (columns ``FLOW_COLUMNS``); empty cells where a value does not apply."""
        f = io.StringIO(newline="")
        writer = csv.DictWriter(f, fieldnames=FLOW_COLUMNS)
        writer.writeheader()
        for d in self.table():
            writer.writerow({k: _csv_cell(v) for k, v in d.items()})
        return write_text_atomic(path, f.getvalue())  # a full disk leaves the old CSV whole

    def weights_to_csv(self, path: str | Path) -> Path:
        names = [f.name for f in WeightFlow.__dataclass_fields__.values()]
        f = io.StringIO(newline="")
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        for w in self.weights:
            d = asdict(w)
            d["shape"] = "x".join(str(s) for s in w.shape)
            writer.writerow({k: _csv_cell(v) for k, v in d.items()})
        return write_text_atomic(path, f.getvalue())

    def to_text(self) -> str:
        head = f"Gradient flow of {self.model_name!r}, target {self.target}"
        if self.loss_value is not None:
            head += f" (loss {self.loss_value:.6g})"
        lines = [head + ":"]
        cols = ("node", "mean|g|", "max|g|", "rel", "|gW|/|W|", "dead", "flags")
        table = [cols]
        for r in self.rows:
            table.append(
                (
                    r.node,
                    _num(r.grad_mean_abs) if r.status != "none" else "none",
                    _num(r.grad_max_abs) if r.status != "none" else "",
                    _num(r.grad_relative),
                    _num(r.weight_ratio) if r.weight_paths else "",
                    f"{r.dead_relu_fraction:.0%}" if r.dead_relu_fraction is not None else "",
                    " ".join(r.flags),
                )
            )
        widths = [max(len(str(row[i])) for row in table) for i in range(len(cols))]
        for row in table:
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        flagged = self.flagged()
        lines.append(f"{len(flagged)} flagged node(s); thresholds: {self.thresholds.describe()}.")
        if self.reference_node:
            lines.append(f"rel = mean|g| relative to {self.reference_node!r} (the output end).")
        if self.meta.get("note"):
            lines.append(self.meta["note"])
        return "\n".join(lines)

    def to_png(self, path: str | Path) -> Path:
        """A headless chart (Pillow): per node, mean|g| and max|g| on a log scale, and |grad W| / |W| with the
        vanishing / exploding thresholds; flagged nodes in red, nodes without a gradient marked "none"."""
        from PIL import Image

        picture = flow_picture(self)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, lambda fh: Image.fromarray(picture).save(fh, format="PNG"))

    def to_dict(self) -> dict:
        return {
            "model_name": self.model_name,
            "target": self.target,
            "loss_value": self.loss_value,
            "reference_node": self.reference_node,
            "thresholds": asdict(self.thresholds),
            "rows": [{**asdict(r), "flags": list(r.flags)} for r in self.rows],
            "weights": [{**asdict(w), "shape": list(w.shape)} for w in self.weights],
            "meta": {k: v for k, v in self.meta.items() if isinstance(v, (str, int, float, bool, list)) or v is None},
        }


def _log_span(values: list[float], floor: float = 1e-30) -> tuple[float, float]:
    logs = [math.log10(max(v, floor)) for v in values if v is not None and math.isfinite(v) and v > 0]
    if not logs:
        return -1.0, 1.0
    lo, hi = math.floor(min(logs)), math.ceil(max(logs))
    return (lo - 1.0, hi + 1.0) if lo == hi else (float(lo), float(hi))


def flow_picture(report: FlowReport, baseline: FlowReport | None = None, baseline_name: str = "") -> np.ndarray:
    """uint8 (H, W, 3), the chart ``to_png`` writes; ``baseline``: another pass's mean|g| of each node as a grey
    tick (the live monitor's first record under its last), named ``baseline_name`` in the title."""
    from PIL import Image, ImageDraw

    row_h, top, label_w, panel_w = 16, 44, 8 + 7 * max((len(r.node) for r in report.rows), default=4), 240
    # as wide as its longest flags (a fixed 190 px cut "zero_gradient weights_zero_gradient"; none: a margin)
    flag_w = min(320, max(40, 10 + 7 * max((len(" ".join(r.flags)) for r in report.rows), default=0)))
    # the weights' panel only when their gradients were taken (``gs.graph`` takes none: its panel was empty)
    weighted = any(math.isfinite(r.weight_ratio) or r.weights_without_gradient for r in report.rows)
    width = label_w + (2 if weighted else 1) * (panel_w + 20) + flag_w
    height = top + row_h * len(report.rows) + 24
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    before = {r.node: r.grad_mean_abs for r in baseline.rows} if baseline is not None else {}
    grads = [r.grad_mean_abs for r in report.rows] + [r.grad_max_abs for r in report.rows] + list(before.values())
    t = report.thresholds
    ratios = [r.weight_ratio for r in report.rows] + [t.vanishing_ratio, t.exploding_ratio]
    panels = [
        (label_w, _log_span(grads), "mean|g| (bar), max|g| (tick)"),
        (label_w + panel_w + 20, _log_span(ratios), "|grad W| / |W|"),
    ][: 2 if weighted else 1]

    def x_of(panel: tuple, v: float) -> float:
        x0, (lo, hi), _ = panel
        return x0 + panel_w * (min(max(math.log10(max(v, 1e-30)), lo), hi) - lo) / (hi - lo)

    tick = f"; grey tick: {baseline_name or 'baseline'}" if baseline is not None else ""
    draw.text((6, 4), f"{report.model_name}: {report.target}{tick}"[:160], fill="black")
    for panel in panels:
        x0, (lo, hi), title = panel
        draw.text((x0, 18), f"{title}, log10 {lo:g}..{hi:g}", fill="black")
        for k in range(int(lo), int(hi) + 1):
            x = x_of(panel, 10.0**k)
            draw.line([(x, top - 4), (x, height - 20)], fill=(225, 225, 225))
        draw.text((x0, height - 16), f"1e{int(lo)}", fill="gray")
        draw.text((x0 + panel_w - 30, height - 16), f"1e{int(hi)}", fill="gray")
    for limit in (t.vanishing_ratio, t.exploding_ratio) if weighted else ():
        if limit > 0:
            x = x_of(panels[1], limit)
            draw.line([(x, top - 4), (x, height - 20)], fill=(240, 160, 160))
    for i, r in enumerate(report.rows):
        y = top + i * row_h
        color = (200, 30, 30) if r.flags else (40, 40, 40)
        draw.text((4, y + 2), r.node, fill=color)
        bar = (220, 80, 80) if r.flags else (70, 120, 200)
        if r.status == "none":
            draw.text((panels[0][0] + 2, y + 2), "none", fill="gray")
        elif r.grad_mean_abs > 0 and math.isfinite(r.grad_mean_abs):
            draw.rectangle([panels[0][0], y + 3, x_of(panels[0], r.grad_mean_abs), y + row_h - 3], fill=bar)
            if r.grad_max_abs > 0 and math.isfinite(r.grad_max_abs):
                xm = x_of(panels[0], r.grad_max_abs)
                draw.line([(xm, y + 1), (xm, y + row_h - 1)], fill=(20, 20, 20), width=2)
        old = before.get(r.node)
        if old is not None and math.isfinite(old) and old > 0:
            xb = x_of(panels[0], old)
            draw.line([(xb, y + 1), (xb, y + row_h - 1)], fill=(150, 150, 150), width=3)
        if weighted and r.weight_paths and math.isfinite(r.weight_ratio) and r.weight_ratio > 0:
            draw.rectangle([panels[1][0], y + 3, x_of(panels[1], r.weight_ratio), y + row_h - 3], fill=bar)
        elif weighted and r.weights_without_gradient:
            draw.text((panels[1][0] + 2, y + 2), "none", fill="gray")
        if r.flags:
            draw.text((label_w + len(panels) * (panel_w + 20), y + 2), " ".join(r.flags), fill=color)
    return np.asarray(img, np.uint8)


def _csv_cell(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, (tuple, list)):
        return " ".join(str(x) for x in v)
    return v


def _num(v: float) -> str:
    return "" if v is None or math.isnan(v) else f"{v:.3g}"


def dead_unit_fraction(values: np.ndarray) -> float:
    """Fraction of units (last axis) that are 0 for every sample and position: the dead-ReLU fraction."""
    v = np.asarray(values)
    if v.ndim < 2 or v.shape[-1] == 0:
        return math.nan
    per_unit = np.all(v.reshape(-1, v.shape[-1]) == 0, axis=0)
    return float(per_unit.mean())


def _weight_flow(path: str, node: str | None, value: np.ndarray, grad: np.ndarray | None) -> WeightFlow:
    w = np.asarray(value, np.float64)
    norm = float(np.linalg.norm(w))
    if grad is None:
        return WeightFlow(path, node, tuple(w.shape), norm, math.nan, math.nan, math.nan, math.nan, 0, 0, True)
    g = np.asarray(grad, np.float64)
    finite = np.isfinite(g)
    gn = float(np.linalg.norm(g))
    a = np.abs(g)
    return WeightFlow(
        path=path,
        node=node,
        shape=tuple(w.shape),
        norm=norm,
        grad_norm=gn,
        grad_mean_abs=float(a.mean()) if a.size else 0.0,
        grad_max_abs=float(a.max()) if a.size else 0.0,
        ratio=gn / norm if norm > 0 else math.nan,
        nan_count=int(np.isnan(g).sum()),
        inf_count=int((~finite).sum() - np.isnan(g).sum()),
        is_none=False,
    )


def ancestors(inputs_of: dict[str, Sequence[str]], nodes: Sequence[str]) -> set[str]:
    """``nodes`` and every node they depend on (``inputs_of``: node id -> its input ids)."""
    seen, stack = set(nodes), list(nodes)
    while stack:
        for parent in inputs_of.get(stack.pop(), ()):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def flow_rows(
    nodes: Sequence[Any],
    stats: dict[str, NodeStats],
    upstream: set[str],
    dead: dict[str, float],
    weights_by_node: dict[str, list[WeightFlow]],
    thresholds: FlowThresholds,
) -> tuple[list[FlowRow], str | None]:
    """The flagged rows of one backward pass, and the output-end node relative values are measured against.

    ``nodes``: in graph order, each with ``id``, ``layer_name``, ``op_type`` (a ``NodeSpec``, or a training log's
    ``LogNode``); ``stats``: the signal at each node's output; ``upstream``: the nodes the target depends on (a
    node above the target gets no gradient by design); ``dead``: dead-unit fractions of ReLU nodes.
    Shared by ``gradient_flow`` (one batch) and the training report (one recorded step), so both flag alike.
    """
    reference_node, reference = None, math.nan
    for n in reversed(nodes):
        s = stats.get(n.id)
        if s is not None and n.id in upstream and not s.is_none and s.mean_abs > 0 and math.isfinite(s.mean_abs):
            reference_node, reference = n.id, s.mean_abs
            break
    rows = []
    for n in nodes:
        if n.id not in stats:
            continue
        s = stats[n.id]
        rel = s.mean_abs / reference if not s.is_none and reference > 0 else math.nan
        flags: list[str] = []
        if s.is_none and n.id in upstream:
            flags.append("no_gradient")
        if s.nan_count or s.inf_count:
            flags.append("nan")
        if not s.is_none and s.max_abs == 0 and n.id in upstream:
            flags.append("zero_gradient")
        elif not math.isnan(rel) and rel < thresholds.vanishing_activation:
            flags.append("vanishing")
        if not math.isnan(rel) and rel > thresholds.exploding_activation:
            flags.append("exploding")
        fraction = dead.get(n.id)
        if fraction is not None and math.isnan(fraction):
            fraction = None
        if fraction is not None and fraction >= thresholds.dead_relu:
            flags.append("dead_relu")
        extra: dict[str, Any] = {}
        ws = weights_by_node.get(n.id, [])
        if ws:
            have = [w for w in ws if not w.is_none]
            norm = math.sqrt(sum(w.norm**2 for w in ws))
            gnorm = math.sqrt(sum(w.grad_norm**2 for w in have)) if have else math.nan
            size = sum(math.prod(w.shape) for w in have)
            mean_abs = sum(w.grad_mean_abs * math.prod(w.shape) for w in have) / size if size else math.nan
            ratio = gnorm / norm if have and norm > 0 else math.nan
            extra = dict(
                weight_paths=tuple(w.path for w in ws),
                weight_norm=norm,
                weight_grad_norm=gnorm,
                weight_grad_mean_abs=mean_abs,
                weight_grad_max_abs=max((w.grad_max_abs for w in have), default=math.nan),
                weight_ratio=ratio,
                weight_nan=sum(w.nan_count for w in have),
                weight_inf=sum(w.inf_count for w in have),
                weights_without_gradient=tuple(w.path for w in ws if w.is_none),
            )
            if extra["weights_without_gradient"]:
                flags.append("weights_no_gradient")
            if (extra["weight_nan"] or extra["weight_inf"]) and "nan" not in flags:
                flags.append("nan")
            if have and gnorm == 0:
                flags.append("weights_zero_gradient")
            elif not math.isnan(ratio) and ratio < thresholds.vanishing_ratio and "vanishing" not in flags:
                flags.append("vanishing")
            if not math.isnan(ratio) and ratio > thresholds.exploding_ratio and "exploding" not in flags:
                flags.append("exploding")
        rows.append(
            FlowRow(
                node=n.id,
                layer=n.layer_name,
                op_type=n.op_type,
                status=s.status,
                grad_norm=s.norm,
                grad_mean_abs=s.mean_abs,
                grad_max_abs=s.max_abs,
                grad_zero_fraction=s.zero_fraction,
                grad_relative=rel,
                grad_nan=s.nan_count,
                grad_inf=s.inf_count,
                dead_relu_fraction=fraction,
                flags=tuple(flags),
                **extra,
            )
        )
    return rows, reference_node


_NO_GRADIENT_TEXT = re.compile(r"gradient registry has no entry|No gradient defined for operation")


def unflag_fitted(rows: list[FlowRow], loss_value: float | None) -> tuple[list[FlowRow], str | None]:
    """At a loss of (near) zero the batch is fitted: small gradients are the loss's doing, not the network's
    (11 of 23 nodes were flagged "vanishing"). Returns the rows without those flags and a note saying why, or
    the rows as they are and None. Shared by ``gradient_flow`` and the training report."""
    if loss_value is None or not abs(loss_value) <= FITTED_LOSS:
        return rows, None
    small = {"vanishing", "zero_gradient", "weights_zero_gradient"}
    rows = [dataclasses.replace(r, flags=tuple(f for f in r.flags if f not in small)) for r in rows]
    return rows, (
        f"The loss is {loss_value:.3g}: the batch is already fitted, so its gradients are (near) zero; no node is "
        "flagged vanishing or zero for that."
    )


def gradient_flow(
    engine_or_model: Any,
    inputs: Any,
    labels: Any = None,
    loss: str | None = None,
    weight_grads: bool = True,
    *,
    target: Target | None = None,
    plan: Any = None,
    thresholds: FlowThresholds | None = None,
    output: str | None = None,
) -> FlowReport:
    """Per-layer gradient flow of one backward pass.

    With ``labels`` the target is the training loss (``loss``: "auto" (default), "compiled", "crossentropy",
    "mse"; see ``gradscope.engine.backward.loss_targets``; ``output``: the output node it reads, for multi-output
    models);
    without, ``target`` (default: the top-1 logit).
    ``weight_grads``: also the weights' gradients and ``|grad W| / |W|`` (opt-in in the engine: ~1.7x cost).
    ``plan``: rules to apply (compare a modified backward pass with the baseline ``plan=None``).
    """
    engine = as_engine(engine_or_model)
    thresholds = thresholds or FlowThresholds()
    if labels is not None:
        target = Target(kind="loss", loss=loss, node=output)
    elif loss is not None:
        from gradscope.core.errors import TargetError

        raise TargetError(f"Loss {loss!r} needs labels: pass labels (one class index per sample, or targets).")
    target = target or Target()
    graph = engine.graph
    relu_nodes = [n.id for n in graph.nodes if n.activation in RELU_ACTIVATIONS and not n.is_input]
    try:
        result = engine.backward(inputs, target, plan, capture=relu_nodes, weight_grads=weight_grads, labels=labels)
    except Exception as exc:  # an op on a float path has no gradient at all: the tape cannot backprop
        missing = [line.strip() for line in str(exc).splitlines() if _NO_GRADIENT_TEXT.search(line)]
        if not missing:
            raise
        raise GraphError(
            f"The backward pass fails: {missing[0].removeprefix('LookupError: ')}. Run `gradscope diagnose MODEL` "
            "to find the op."
        ) from exc

    weights: list[WeightFlow] = []
    by_node: dict[str, list[WeightFlow]] = {}
    if weight_grads:
        owners = variable_owners(engine)
        grads = result.meta.get("weight_grads", {})
        none = set(result.meta.get("none_weights", []))
        for v in engine.model.trainable_variables:
            node = owners.get(id(v))
            g = None if v.path in none else grads.get(v.path)
            wf = _weight_flow(v.path, node, np.asarray(v.numpy()), g)
            weights.append(wf)
            if node is not None:
                by_node.setdefault(node, []).append(wf)

    # The output end: nodes nearest the target first; a node downstream of the target gets no gradient by design.
    target_node = target.node if target.kind in ("neuron", "channel") and target.node else None
    if target_node is None:
        target_node = graph.output_ids[0]
        if engine.softmax_stripped and target.kind in ("class", "loss"):
            target_node = graph.node(target_node).inputs[0]
    upstream = ancestors({n.id: n.inputs for n in graph.nodes}, [target_node])
    dead = {nid: dead_unit_fraction(v) for nid, v in result.node_values.items()}
    stats = {n.id: result.stats[n.id] for n in graph.nodes if not n.is_input and n.id in result.stats}
    rows, reference_node = flow_rows(
        [n for n in graph.nodes if not n.is_input], stats, upstream, dead, by_node, thresholds
    )
    loss_value = result.meta.get("loss_value")
    meta: dict[str, Any] = {"seconds": result.meta.get("seconds"), "softmax_stripped": engine.softmax_stripped}
    rows, note = unflag_fitted(rows, loss_value)
    if note:
        meta["note"] = note + " Try a batch the model gets wrong."
    return FlowReport(
        model_name=engine.model.name,
        target=result.meta.get("loss") or target.describe(),
        rows=rows,
        weights=weights,
        thresholds=thresholds,
        reference_node=reference_node,
        loss_value=loss_value,
        meta=meta,
    )
