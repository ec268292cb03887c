"""A/B comparison of two plans on the same model, input and target: the result on screen (A) against a pinned
one (B). Two maps read out with the same view, their difference, and per-node agreement of the signals: the
ratio of their norms (from the statistics) and the cosine of the signals themselves (computed on the worker:
the signals may still be engine tensors)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradscope import render
from gradscope.app.rendering.view import OverlayImages, ViewSettings, overlay_images


@dataclass
class Pinned:
    """The result kept as B, with what produced it."""

    result: Any  # BackwardResult
    plan: Any  # Plan
    method: str


@dataclass
class Comparison:
    a: OverlayImages  # the current plan's map
    b: OverlayImages  # the pinned plan's map, read out the same way
    difference: np.ndarray  # RGB: a/max|a| - b/max|b|, diverging colours (red: stronger in A, blue: in B)
    a_label: str
    b_label: str
    map_cosine: float  # cosine of the two maps (1: the same picture up to scale)
    norm_ratio: dict[str, float] = field(default_factory=dict)  # node -> |g|_A / |g|_B (NaN: no signal in one)
    difference_values: np.ndarray | None = None  # what ``difference`` draws: a/max|a| - b/max|b| per cell


def _unit(saliency: np.ndarray) -> np.ndarray:
    s = np.nan_to_num(np.asarray(saliency, np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    peak = np.abs(s).max()
    return s / peak if peak > 0 else s


def compare(
    signal_a: np.ndarray,
    signal_b: np.ndarray,
    image: np.ndarray | None,
    view: ViewSettings,
    node: str | None,
    labels: tuple[str, str],
    stats: tuple[dict, dict] = ({}, {}),
) -> Comparison:
    """Both maps through the one rendering pipeline (``overlay_images``) and their difference."""
    a = overlay_images(signal_a, image, view, node)
    b = overlay_images(signal_b, image, view, node)
    ua, ub = _unit(a.saliency), _unit(b.saliency)
    diff = ua - ub
    diff[np.abs(diff) < 1e-6] = 0.0  # float noise of equal maps must not straddle the colormap's centre
    heat = render.apply_colormap(np.clip(diff, -1.0, 1.0), "bwr", signed=True)
    return Comparison(
        a,
        b,
        np.asarray(heat)[..., :3].astype(np.uint8),
        labels[0],
        labels[1],
        _cosine(ua, ub),
        norm_ratio(*stats),
        diff,
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two arrays of one shape (NaN when either is all zero or the shapes differ)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    denominator = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / denominator) if a.shape == b.shape and denominator > 0 else float("nan")


def norm_ratio(current: dict, pinned: dict) -> dict[str, float]:
    """Per node, the ratio of the signal norms of A and B (the flow plot's "ratio to pinned")."""
    out = {}
    for node, a in current.items():
        b = pinned.get(node)
        ok = b is not None and a.status == "ok" and b.status == "ok" and b.norm > 0
        out[node] = a.norm / b.norm if ok else float("nan")
    return out


def node_cosines(result_a: Any, result_b: Any) -> dict[str, float]:
    """Per node, the cosine of the two signals (1: same direction, 0: unrelated, -1: opposite). Reads every
    node's signal: run it on the worker (``LazyArrays`` copy engine tensors when read)."""
    out = {}
    for node in result_a.node_grads:
        if node not in result_b.node_grads:
            continue
        out[node] = _cosine(result_a.node_grads[node], result_b.node_grads[node])
    return out


def comparison_picture(comparison: Comparison, long_side: int = 512) -> np.ndarray:
    """A, B and A-B side by side with their labels (what "Export comparison" writes)."""
    from PIL import Image

    from gradscope.render.fonts import draw_text

    panels = [comparison.a.picture, comparison.b.picture, comparison.difference]
    titles = [f"A: {comparison.a_label}", f"B: {comparison.b_label}", "A - B (red: A stronger, blue: B)"]
    h, w = panels[0].shape[:2]
    scale = long_side / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    canvas = Image.new("RGB", (3 * size[0] + 4 * 8, size[1] + 30), "white")
    # smoothed as the overlay export and the window draw a spatial map (nearest-neighbour was blocky); a token
    # or feature strip keeps its crisp cells
    resample = Image.Resampling.BILINEAR if comparison.a.spatial else Image.Resampling.NEAREST
    for i, (panel, title) in enumerate(zip(panels, titles)):
        x = 8 + i * (size[0] + 8)
        picture = Image.fromarray(np.ascontiguousarray(panel[..., :3])).resize(size, resample)
        canvas.paste(picture, (x, 24))
        draw_text(canvas, (x, 4), title[: max(8, size[0] // 7)], 13, (0, 0, 0))
    return np.asarray(canvas)
