"""Charts of a training run (Pillow, headless): the step x layer heat map of a gradient statistic and a series over
steps (the loss) with marked steps. The notebook's displays, the live monitor and ``gradscope report`` draw them."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

from gradscope.render.colormap import apply_colormap
from gradscope.render.fonts import draw_text, text_width

INK, GRID, RED, BLUE = (38, 50, 56), (225, 229, 232), (198, 40, 40), (78, 121, 167)
FONT = 12


def heatmap_picture(
    matrix: np.ndarray, rows: Sequence[str], steps: Sequence[int], *, title: str, colormap: str = "viridis"
) -> np.ndarray:
    """uint8 (H, W, 3): ``matrix`` (rows x steps) on a log10 colour scale with its range written below; NaN/Inf
    cells in red, zero cells white (no gradient), the rows named on the left, the first and last step below."""
    values = np.asarray(matrix, np.float64)
    n_rows, n_steps = values.shape if values.ndim == 2 else (0, 0)
    cell_h = 14
    cell_w = max(2, min(24, 720 // max(1, n_steps)))
    left = min(260, max((text_width(r, FONT) for r in rows), default=20) + 12)
    top, bottom = 24, 48
    width, height = left + cell_w * n_steps + 16, top + cell_h * n_rows + bottom
    finite = np.isfinite(values) & (values > 0)
    if finite.any():
        logs = np.log10(values[finite])
        lo, hi = float(logs.min()), float(logs.max())
        hi = hi if hi > lo else lo + 1.0
        scaled = np.zeros_like(values)
        scaled[finite] = (np.log10(values[finite]) - lo) / (hi - lo)
        colours = apply_colormap(scaled.astype(np.float32), colormap)
    else:
        lo = hi = math.nan
        colours = np.full((*values.shape, 3), 255, np.uint8)
    scale = "no positive finite value" if math.isnan(lo) else f"log10 colour scale: 1e{lo:.1f} (dark) … 1e{hi:.1f}"
    scale += "; red: NaN/Inf; white: 0"
    width = max(width, left + text_width(scale, FONT) + 8, text_width(title, FONT + 1) + 8)
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    draw_text(img, (4, 4), title, FONT + 1, INK)
    for i, name in enumerate(rows):
        y = top + i * cell_h
        draw_text(img, (4, y), name[:40], FONT, INK)
        for j in range(n_steps):
            v = values[i, j]
            fill = (255, 255, 255) if v <= 0 else tuple(int(c) for c in colours[i, j])
            fill = RED if not math.isfinite(v) else fill
            x = left + j * cell_w
            draw.rectangle((x, y, x + cell_w - 1, y + cell_h - 2), fill=fill)
    y = top + cell_h * n_rows + 4
    if n_steps:
        draw_text(img, (left, y), f"step {steps[0]}", FONT, INK)
        last = f"step {steps[-1]}"
        draw_text(img, (max(left + 60, left + cell_w * n_steps - text_width(last, FONT)), y), last, FONT, INK)
    draw_text(img, (left, y + 18), scale, FONT, INK)
    return np.asarray(img, np.uint8)


def series_picture(
    steps: Sequence[int],
    values: Sequence[float],
    *,
    title: str,
    marks: Sequence[int] = (),
    stop: int | None = None,
    stop_text: str = "",
    size: tuple[int, int] = (720, 220),
) -> np.ndarray:
    """uint8 (H, W, 3): ``values`` over ``steps`` (log scale when they span more than two decades and are
    positive), the ``marks`` steps as red rings (loss spikes), a red vertical line at ``stop`` with ``stop_text``
    (the first NaN), non-finite values left out of the line."""
    w, h = size
    left, top, right, bottom = 64, 24, 16, 28
    img = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(img)
    draw_text(img, (4, 4), title, FONT + 1, INK)
    xs = np.asarray(steps, np.float64)
    ys = np.asarray(values, np.float64)
    ok = np.isfinite(ys)
    pw, ph = w - left - right, h - top - bottom
    draw.rectangle((left, top, left + pw, top + ph), outline=(176, 190, 197))
    if not xs.size:
        draw_text(img, (left + 8, top + 8), "no step recorded yet", FONT, INK)
        return np.asarray(img, np.uint8)
    x_lo, x_hi = float(xs.min()), float(xs.max())
    x_hi = x_hi if x_hi > x_lo else x_lo + 1.0
    good = ys[ok]
    log = bool(good.size and good.min() > 0 and good.max() / good.min() > 100)
    ty = np.log10(np.where(ok & (ys > 0), ys, 1.0)) if log else np.where(ok, ys, 0.0)
    y_lo, y_hi = (float(ty[ok].min()), float(ty[ok].max())) if ok.any() else (0.0, 1.0)
    y_hi = y_hi if y_hi > y_lo else y_lo + 1.0

    def at(x: float, y: float) -> tuple[float, float]:
        return left + (x - x_lo) / (x_hi - x_lo) * pw, top + ph - (y - y_lo) / (y_hi - y_lo) * ph

    for k in range(5):
        y = y_lo + (y_hi - y_lo) * k / 4
        _, py = at(x_lo, y)
        draw.line((left, py, left + pw, py), fill=GRID)
        draw_text(img, (4, py - 7), f"{10**y if log else y:.3g}", FONT - 1, INK)
    draw_text(img, (left, top + ph + 6), f"step {int(x_lo)}", FONT - 1, INK)
    end = f"step {int(xs.max())}"
    draw_text(img, (left + pw - text_width(end, FONT - 1), top + ph + 6), end, FONT - 1, INK)
    points = [at(x, y) for x, y, good_y in zip(xs, ty, ok) if good_y]
    if len(points) > 1:
        draw.line(points, fill=BLUE, width=2)
    elif points:
        x, y = points[0]
        draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=BLUE)
    index = {int(s): i for i, s in enumerate(xs)}
    for step in marks:
        i = index.get(int(step))
        if i is not None and ok[i]:
            x, y = at(xs[i], ty[i])
            draw.ellipse((x - 5, y - 5, x + 5, y + 5), outline=RED, width=2)
    if stop is not None:
        x, _ = at(min(max(float(stop), x_lo), x_hi), y_lo)
        draw.line((x, top, x, top + ph), fill=RED, width=2)
        if stop_text:
            tx = x + 4 if x + 4 + text_width(stop_text, FONT) < w else x - 4 - text_width(stop_text, FONT)
            draw_text(img, (tx, top + 4), stop_text, FONT, RED)
    return np.asarray(img, np.uint8)
