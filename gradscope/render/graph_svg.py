"""The layer graph as SVG (``keras.utils.plot_model`` with the flow): the window's layout (``graph_layout``) drawn
as boxes and arrows, each box filled by its node's gradient (log10 mean |g| on a colormap; red: NaN/Inf or
flagged; grey: no gradient reaches it), the value and the flags in its tooltip."""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass

import numpy as np

from gradscope.render.colormap import apply_colormap, hex_colour
from gradscope.render.graph_layout import GraphLayout
from gradscope.render.positions import ink

MARGIN = 16.0
NO_GRADIENT, BROKEN, PLAIN = "#cfd8dc", "#e53935", "#eceff1"


@dataclass(frozen=True)
class NodeFlow:
    """What a box shows of its node's gradient."""

    mean_abs: float | None  # None: no gradient reaches the node
    flags: tuple[str, ...] = ()


def _colour(t: float, colormap: str = "viridis") -> str:
    return hex_colour(apply_colormap(np.array([t], np.float32), colormap)[0])


def _ink(fill: str) -> str:
    """Black or white text on ``fill`` (#rrggbb), as the token strips choose it."""
    return hex_colour(ink(tuple(int(fill[i : i + 2], 16) for i in (1, 3, 5))))


def node_fills(flow: dict[str, NodeFlow], colormap: str = "viridis") -> tuple[dict[str, str], tuple[float, float]]:
    """A fill per node and the log10 range the colours span."""
    logs = {
        k: math.log10(f.mean_abs)
        for k, f in flow.items()
        if f.mean_abs and math.isfinite(f.mean_abs) and f.mean_abs > 0
    }
    lo, hi = (min(logs.values()), max(logs.values())) if logs else (0.0, 1.0)
    hi = hi if hi > lo else lo + 1.0
    fills = {}
    for node, f in flow.items():
        if f.mean_abs is None or f.mean_abs == 0:
            fills[node] = NO_GRADIENT
        elif not math.isfinite(f.mean_abs) or any(flag in ("nan", "inf", "nonfinite", "exploding") for flag in f.flags):
            fills[node] = BROKEN
        else:
            fills[node] = _colour((logs[node] - lo) / (hi - lo), colormap)
    return fills, (lo, hi)


# Characters XML 1.0 does not allow in a document, even escaped (Keras accepts a layer named 'a\x01b\x0cc').
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml(text: str) -> str:
    """``text`` as XML character data: markup escaped, a character XML forbids written as its escape (``\\x01``)."""
    return html.escape(_NOT_XML.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode(), text))


def elide_middle(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, an ellipsis in the middle: node names differ at both ends
    (``feedforward_intermediate_dense:pre`` and ``feedforward_intermediate_dense`` cut at the end read alike)."""
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head) :]


def _subtitle(text: str, limit: int) -> str:
    """``kind  shape`` in ``limit`` characters: the shape whole (``?x128`` cut read ``?x1``), the kind elided."""
    kind, sep, shape = text.rpartition("  ")
    if len(text) <= limit or not sep:
        return elide_middle(text, limit)
    return f"{elide_middle(kind, max(3, limit - len(shape) - 2))}  {shape}"


def graph_svg(layout: GraphLayout, flow: dict[str, NodeFlow] | None = None, *, title: str = "") -> str:
    """The SVG text of ``layout``, filled by ``flow`` (node id -> ``NodeFlow``) where given."""
    x0, y0, x1, y1 = layout.bounds
    top = 28.0 if title else 0.0
    legend = 36.0 if flow else 0.0
    width, height = x1 - x0 + 2 * MARGIN, y1 - y0 + 2 * MARGIN + top + legend
    width = max(width, 8.0 * len(title) + 2 * MARGIN, 600.0 if flow else 0.0)  # the title and legend fit
    dx, dy = MARGIN - x0, MARGIN - y0 + top
    fills, (lo, hi) = node_fills(flow) if flow else ({}, (0.0, 1.0))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" '
        f'height="{height:.0f}" style="max-width:100%;height:auto;font-family:sans-serif">',
        '<defs><marker id="gs-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
        'orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" fill="#78909c"/></marker></defs>',
    ]
    if title:
        out.append(f'<text x="{MARGIN}" y="20" font-size="15">{_xml(title)}</text>')
    for frame in layout.frames:
        out.append(
            f'<rect x="{frame.x0 + dx:.1f}" y="{frame.y0 + dy:.1f}" width="{frame.x1 - frame.x0:.1f}" '
            f'height="{frame.y1 - frame.y0:.1f}" fill="none" stroke="#b0bec5" stroke-dasharray="4 3"/>'
        )
    for edge in layout.edges:
        points = " ".join(f"{x + dx:.1f},{y + dy:.1f}" for x, y in edge.points)
        out.append(f'<polyline points="{points}" fill="none" stroke="#78909c" marker-end="url(#gs-arrow)"/>')
    for box in layout.boxes.values():
        fill = fills.get(box.id, PLAIN)
        members = box.members or (box.id,)
        if flow and box.collapsed_group:  # a collapsed nested model: its worst member
            fill = next((fills[m] for m in members if fills.get(m) == BROKEN), fills.get(members[-1], PLAIN))
        tip = [box.id, box.subtitle]
        f = flow.get(box.id) if flow else None
        if f is not None:
            tip.append("no gradient" if f.mean_abs is None else f"mean |g| = {f.mean_abs:.4g}")
            tip.extend(f.flags)
        x, y = box.x - box.w / 2 + dx, box.y - box.h / 2 + dy
        ink = _ink(fill)
        out.append(
            f"<g><title>{_xml(chr(10).join(t for t in tip if t))}</title>"
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{box.w:.1f}" height="{box.h:.1f}" rx="5" fill="{fill}" '
            f'stroke="#546e7a"/>'
            f'<text x="{box.x + dx:.1f}" y="{box.y + dy - 3:.1f}" font-size="12" text-anchor="middle" '
            f'fill="{ink}">{_xml(elide_middle(box.title, 26))}</text>'
            f'<text x="{box.x + dx:.1f}" y="{box.y + dy + 12:.1f}" font-size="10" text-anchor="middle" '
            f'fill="{ink}">{_xml(_subtitle(box.subtitle, 30))}</text></g>'
        )
    if flow:
        y = height - legend + 8
        steps = 24
        for k in range(steps):
            fill = _colour(k / (steps - 1))
            out.append(f'<rect x="{MARGIN + 6 * k:.0f}" y="{y:.0f}" width="6" height="10" fill="{fill}"/>')
        out.append(
            f'<text x="{MARGIN + 6 * steps + 6:.0f}" y="{y + 9:.0f}" font-size="11">mean |g| 1e{lo:.1f} … 1e{hi:.1f}; '
            f'<tspan fill="{BROKEN}">red: NaN/Inf or exploding</tspan>; grey: no gradient</text>'
        )
    out.append("</svg>")
    return "\n".join(out)
