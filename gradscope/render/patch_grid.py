"""Patching effects as a picture (Pillow, headless): one heat map per component, a row per block, a column per
unit (a token, written upwards; or an image's grid cell), on one colour scale shared by every component so their
cells compare: signed effects red (the metric rises) and blue (it falls), magnitudes (AtP*) dark to bright; the
range under a colour bar. The notebook, ``gradscope patch``, ``gradscope report`` and the window draw this."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from gradscope.render.colormap import apply_colormap
from gradscope.render.fonts import draw_text, text_width

INK, EDGE = (38, 50, 56), (207, 216, 220)
FONT, PAD = 12, 6


def cell_size(units: int) -> int:
    return max(8, min(28, 900 // max(units, 1)))


@dataclass(frozen=True)
class GridLayout:
    """Where each cell of the picture lies, for drawing it and for finding the cell under a click."""

    left: int
    head: int
    cell: int
    width: int
    height: int
    tops: dict[str, int]  # component -> the y of its first row
    blocks: dict[str, int]  # component -> its rows
    units: int

    def cell_at(self, x: float, y: float) -> tuple[str, int, int] | None:
        """(component, block, unit) of the cell at pixel (x, y), None between cells."""
        if not self.left <= x < self.left + self.cell * self.units:
            return None
        for component, top in self.tops.items():
            if top <= y < top + self.cell * self.blocks[component]:
                return component, int((y - top) // self.cell), int((x - self.left) // self.cell)
        return None


def grid_layout(
    effects: dict[str, np.ndarray], units: Sequence[str], labels: dict[str, list[str]], title: str
) -> GridLayout:
    cell = cell_size(len(units))
    left = min(260, max((text_width(f"{c}: {r}", FONT) for c, rs in labels.items() for r in rs), default=40) + 2 * PAD)
    head = min(150, max((text_width(u, FONT) for u in units), default=0) + 2 * PAD)
    tops, y = {}, 26 + head
    for component, values in effects.items():
        tops[component] = y
        y += len(values) * cell + PAD * 2
    width = max(left + cell * len(units) + PAD, text_width(title, FONT + 1) + 2 * PAD, 360)
    blocks = {c: len(e) for c, e in effects.items()}
    return GridLayout(left, head, cell, width, y + 56, tops, blocks, len(units))


def patch_grid_picture(
    effects: dict[str, np.ndarray],
    units: Sequence[str],
    *,
    title: str,
    signed: bool = True,
    rows: dict[str, Sequence[str]] | None = None,
) -> np.ndarray:
    """uint8 (H, W, 3). ``effects``: component -> (blocks, units); ``rows``: each component's row labels (default:
    "block i"). ``grid_layout`` of the same arguments says where each cell lies."""
    panels = {c: np.asarray(e, np.float64) for c, e in effects.items()}
    finite = [np.abs(e[np.isfinite(e)]).max() for e in panels.values() if np.isfinite(e).any()]
    top_value = max(finite, default=0.0) or 1.0
    labels = row_labels(panels, rows)
    layout = grid_layout(panels, units, labels, title)
    cell, left = layout.cell, layout.left
    img = Image.new("RGB", (layout.width, layout.height), "white")
    draw = ImageDraw.Draw(img)
    draw_text(img, (PAD, 4), title, FONT + 1, INK)
    for j, unit in enumerate(units):  # column labels, written upwards
        text = Image.new("RGB", (layout.head, cell), "white")
        draw_text(text, (PAD, max(0, (cell - FONT) // 2 - 1)), unit[:24], FONT, INK)
        img.paste(text.rotate(90, expand=True), (left + j * cell, 26))
    for component, values in panels.items():
        colours = _colours(values, top_value, signed)
        y = layout.tops[component]
        for i, label in enumerate(labels[component]):
            draw_text(img, (PAD, y + max(0, (cell - FONT) // 2 - 1)), f"{component}: {label}"[:40], FONT, INK)
            for j in range(values.shape[1]):
                x = left + j * cell
                fill = tuple(int(v) for v in colours[i, j])
                draw.rectangle((x, y, x + cell - 1, y + cell - 1), fill=fill, outline=EDGE)
            y += cell
    _colour_bar(img, draw, (left, layout.height - 52), top_value, signed)
    return np.asarray(img, np.uint8)


def row_labels(effects: dict[str, np.ndarray], rows: dict[str, Sequence[str]] | None) -> dict[str, list[str]]:
    return {
        c: list(rows[c]) if rows and c in rows else [f"block {i}" for i in range(len(e))] for c, e in effects.items()
    }


def _colours(values: np.ndarray, top: float, signed: bool) -> np.ndarray:
    clean = np.where(np.isfinite(values), values, 0.0)
    if signed:
        return apply_colormap(np.clip(clean / top, -1, 1).astype(np.float32), "bwr", signed=True)
    return apply_colormap(np.clip(np.abs(clean) / top, 0, 1).astype(np.float32), "viridis")


def _colour_bar(img: Image.Image, draw: ImageDraw.ImageDraw, xy: tuple[int, int], top: float, signed: bool) -> None:
    x0, y0 = xy
    steps = np.linspace(-1 if signed else 0, 1, 160).astype(np.float32)[None]
    strip = apply_colormap(steps, "bwr", signed=True) if signed else apply_colormap(steps, "viridis")
    for k in range(strip.shape[1]):
        draw.line((x0 + k, y0, x0 + k, y0 + 10), fill=tuple(int(v) for v in strip[0, k]))
    low = f"{-top:+.3g}" if signed else "0"
    words = f"{low} … {top:+.3g}" + ("  (red: the metric rises, blue: it falls)" if signed else "  (|effect|)")
    draw_text(img, (x0, y0 + 14), words, FONT, INK)
