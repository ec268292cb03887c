"""Line charts of evaluation curves (Pillow, headless): one panel per metric, one line per method."""

from __future__ import annotations

import io

from PIL import Image, ImageDraw

# Tableau-10: distinct on white and for the common colour-vision deficiencies.
PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"]


def curves_png(
    panels: dict[str, dict[str, list[float]]],
    *,
    x_label: str = "",
    y_label: str = "",
    panel_size: tuple[int, int] = (420, 300),
    y_range: tuple[float, float] | None = (0.0, 1.0),
) -> bytes:
    """PNG bytes: for each panel title, the curves (method -> values at equal steps over [0, 1]) on y in
    ``y_range`` (None: the range of every value shown, shared by the panels: logits are not probabilities)."""
    if y_range is None:
        every = [float(v) for curves in panels.values() for values in curves.values() for v in values]
        low, high = (min(every), max(every)) if every else (0.0, 1.0)
        y_range = (low, high if high > low else low + 1.0)
    y_low, y_span = y_range[0], y_range[1] - y_range[0]
    pw, ph = panel_size
    left, top, right, bottom, gap = 52, 30, 16, 40, 24
    methods = list(dict.fromkeys(m for curves in panels.values() for m in curves))
    legend_h = 18 * len(methods) + 10
    width = max(1, len(panels)) * (left + pw + right + gap)
    height = top + ph + bottom + legend_h + (14 if y_label else 0)
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    for p, (title, curves) in enumerate(panels.items()):
        x0 = p * (left + pw + right + gap) + left
        y0 = top
        draw.text((x0, 8), title, fill="black")
        draw.rectangle([x0, y0, x0 + pw, y0 + ph], outline="#444444")
        for t in range(6):
            frac = t / 5
            gy = y0 + ph - frac * ph
            gx = x0 + frac * pw
            draw.line([x0, gy, x0 + pw, gy], fill="#e6e6e6")
            draw.text((x0 - 46, gy - 6), f"{y_low + frac * y_span:.3g}", fill="#444444")
            draw.text((gx - 8, y0 + ph + 6), f"{frac:.1f}", fill="#444444")
        draw.text((x0 + pw // 2 - 3 * len(x_label), y0 + ph + 22), x_label, fill="#444444")
        for m, values in curves.items():
            color = PALETTE[methods.index(m) % len(PALETTE)]
            n = len(values)
            if n < 2:
                continue
            pts = [
                (x0 + i / (n - 1) * pw, y0 + ph - min(max((float(v) - y_low) / y_span, 0.0), 1.0) * ph)
                for i, v in enumerate(values)
            ]
            draw.line(pts, fill=color, width=2)
    ly = top + ph + bottom
    if y_label:
        draw.text((8, ly), f"y: {y_label}", fill="#444444")
    for k, m in enumerate(methods):
        color = PALETTE[k % len(PALETTE)]
        y = ly + 4 + 18 * k + (14 if y_label else 0)
        draw.line([left, y + 7, left + 24, y + 7], fill=color, width=3)
        draw.text((left + 32, y), m, fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()
