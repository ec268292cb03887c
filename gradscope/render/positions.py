"""Pictures of per-position maps (numpy + Pillow): a token strip for text (each word on a box coloured by its
score, as Captum's and LXT's text heat maps) and a bar chart for tabular features.

Scores are normalised as the image maps are (``render.normalize``): a signed map is coloured around white, so
red and blue read as for and against the target.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gradscope.render.colormap import apply_colormap
from gradscope.render.fonts import draw_text, text_width
from gradscope.render.normalize import is_signed, normalize

FONT_SIZE = 16
PAD = 6


def position_colours(scores: np.ndarray, colormap: str, normalization: str) -> np.ndarray:
    """(n, 3) uint8: each score's colour, as the window's strips, the exports and the notebook's HTML show it."""
    signed = is_signed(normalization)
    m = normalize(np.asarray(scores, np.float32), normalization)
    return apply_colormap(np.clip(m, -1.0 if signed else 0.0, 1.0), colormap, signed=signed)


def ink(rgb: np.ndarray) -> tuple[int, int, int]:
    """Black or white text, whichever reads on ``rgb``."""
    luma = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]
    return (0, 0, 0) if luma > 140 else (255, 255, 255)


def shown_token(token: str) -> str:
    """What a strip shows of a token: itself, or, for a blank one, "[pad]" or its repr (still visible)."""
    return token if token.strip() else ("[pad]" if token == "" else repr(token))


def token_boxes(tokens: Sequence[str], width: int = 1024) -> tuple[list[tuple[int, int, int, str]], int]:
    """Where ``token_strip`` draws each token: ``(x, y, box width, text shown)`` in reading order, wrapped into
    lines of ``width`` pixels, and the picture's height (a window finds and frames a token by it)."""
    line_h = FONT_SIZE + 2 * PAD
    boxes, x, y = [], PAD, PAD
    for token in tokens:
        text = shown_token(token)
        w = text_width(text, FONT_SIZE) + 2 * PAD
        if x + w > width - PAD and x > PAD:
            x, y = PAD, y + line_h + PAD
        boxes.append((x, y, w, text))
        x += w + 2
    return boxes, y + line_h + PAD


def token_strip(
    tokens: Sequence[str],
    scores: np.ndarray,
    *,
    colormap: str = "bwr",
    normalization: str = "signed",
    width: int = 1024,
) -> np.ndarray:
    """uint8 (H, ``width``, 3): the tokens in reading order, wrapped into lines (``token_boxes``), each on a box of
    its score's colour."""
    from PIL import Image, ImageDraw

    scores = np.asarray(scores, np.float32).reshape(-1)
    if len(tokens) != len(scores):
        raise ValueError(f"{len(tokens)} tokens for {len(scores)} scores.")
    colours = position_colours(scores, colormap, normalization)
    line_h = FONT_SIZE + 2 * PAD
    boxes, height = token_boxes(tokens, width)
    img = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    for (x, y, w, text), rgb in zip(boxes, colours):
        draw.rectangle((x, y, x + w - 1, y + line_h - 1), fill=tuple(int(c) for c in rgb), outline=(207, 216, 220))
        draw_text(img, (x + PAD, y + PAD), text, FONT_SIZE, ink(rgb))
    return np.asarray(img, np.uint8)


def feature_bars(
    names: Sequence[str],
    scores: np.ndarray,
    *,
    colormap: str = "bwr",
    normalization: str = "signed",
    width: int = 768,
) -> np.ndarray:
    """uint8 (H, ``width``, 3): one horizontal bar per feature, its length the score's size, its colour the
    score's colour; positive to the right of the axis, negative to the left."""
    from PIL import Image, ImageDraw

    scores = np.nan_to_num(np.asarray(scores, np.float32).reshape(-1))
    if len(names) != len(scores):
        raise ValueError(f"{len(names)} names for {len(scores)} scores.")
    colours = position_colours(scores, colormap, normalization)
    label_w = min(width // 3, max(text_width(n, 14) for n in names) + 2 * PAD) if names else PAD
    row_h = 22
    img = Image.new("RGB", (width, row_h * len(scores) + 2 * PAD), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    span = width - label_w - 2 * PAD
    top = float(np.max(np.abs(scores))) if scores.size else 0.0
    has_negative = bool((scores < 0).any())
    axis = label_w + (span // 2 if has_negative else 0)
    half = span // 2 if has_negative else span
    for i, (name, s, rgb) in enumerate(zip(names, scores, colours)):
        y = PAD + i * row_h
        draw_text(img, (PAD, y + 3), name, 14, (38, 50, 56))
        length = int(round(abs(float(s)) / top * half)) if top > 0 else 0
        x0, x1 = (axis, axis + length) if s >= 0 else (axis - length, axis)
        draw.rectangle(
            (x0, y + 3, max(x0, x1), y + row_h - 3), fill=tuple(int(c) for c in rgb), outline=(120, 144, 156)
        )
    draw.line((axis, PAD, axis, img.height - PAD), fill=(96, 125, 139))
    return np.asarray(img, np.uint8)


MATRIX_CELL = 28  # px: a token_matrix cell


def matrix_row_top(height: int, rows: int, row: int) -> int:
    """The y of row ``row`` of a ``token_matrix`` image ``height`` px tall with ``rows`` rows."""
    return height - PAD - (rows - row) * MATRIX_CELL


def matrix_row_at(height: int, rows: int, y: float) -> int | None:
    """The row of a ``token_matrix`` image (``height`` px tall, ``rows`` rows) at ``y`` px from its top, or None
    above (the column labels) or below the rows: what a click on the drawn matrix picks."""
    top = matrix_row_top(height, rows, 0)
    row = int((y - top) // MATRIX_CELL) if y >= top else -1
    return row if 0 <= row < rows else None


def token_matrix(
    context: Sequence[str],
    generated: Sequence[str],
    matrix: np.ndarray,
    *,
    colormap: str = "bwr",
    cell: int = MATRIX_CELL,
) -> np.ndarray:
    """uint8 (H, W, 3): a generation's attribution (Inseq's matrix): one row per generated token (its word and
    probability label the row), one column per context token (prompt, then the generated ones), each cell coloured
    by that token's score for the row's token, normalised per row (signed: red for, blue against); cells after the
    row's token, which it could not see, are grey."""
    from PIL import Image, ImageDraw

    scores = np.asarray(matrix, np.float64)
    rows, cols = scores.shape
    if len(generated) != rows or len(context) != cols:
        raise ValueError(f"{len(generated)} x {len(context)} labels for a {rows} x {cols} matrix.")
    left = min(260, max((text_width(t, 13) for t in generated), default=0) + 2 * PAD)
    top = min(160, max((text_width(t, 13) for t in context), default=0) + 2 * PAD)
    img = Image.new("RGB", (left + cols * cell + PAD, top + rows * cell + PAD), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    for j, label in enumerate(context):  # column labels, written upwards
        text = Image.new("RGB", (top, cell), (255, 255, 255))
        draw_text(text, (PAD, (cell - 13) // 2), label[:24], 13, (38, 50, 56))
        img.paste(text.rotate(90, expand=True), (left + j * cell, 0))
    for i, label in enumerate(generated):
        y = top + i * cell
        draw_text(img, (PAD, y + (cell - 13) // 2), label[:36], 13, (38, 50, 56))
        row = scores[i]
        seen = np.isfinite(row)
        colours = position_colours(np.where(seen, row, 0.0), colormap, "signed") if seen.any() else None
        for j in range(cols):
            x = left + j * cell
            fill = tuple(int(c) for c in colours[j]) if colours is not None and seen[j] else (236, 239, 241)
            draw.rectangle((x, y, x + cell - 2, y + cell - 2), fill=fill)
    return np.asarray(img, np.uint8)


def with_heading(picture: np.ndarray, text: str, size: int = 14) -> np.ndarray:
    """``picture`` under a white band with ``text`` (what was explained: a token map's PNG names its next token
    and contrast, as the window's panel does), wrapped to the picture's width at word boundaries."""
    from PIL import Image

    width = int(picture.shape[1])
    lines, line = [], ""
    for word in text.split(" "):
        trial = f"{line} {word}".strip()
        if line and text_width(trial, size) > width - 2 * PAD:
            lines.append(line)
            line = word
        else:
            line = trial
    lines.append(line)
    step = size + 6
    band = Image.new("RGB", (width, PAD + step * len(lines)), (255, 255, 255))
    for i, part in enumerate(lines):
        draw_text(band, (PAD, PAD + i * step), part, size, (38, 50, 56))
    return np.concatenate([np.asarray(band, np.uint8), np.asarray(picture, np.uint8)[..., :3]], axis=0)
