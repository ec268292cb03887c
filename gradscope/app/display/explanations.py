"""An explanation in a notebook: an image's overlay with its colour bar and caption (the PNG ``save(colorbar=True)``
writes, headed), a token map as an HTML strip, a generation as an HTML matrix. The colours come from the
window's and the exports' code (``render.positions.position_colours``, ``app.files.exports.export_picture``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscope.app.display.html import esc, figure, fragment
from gradscope.render.colormap import hex_colour
from gradscope.render.positions import ink, position_colours, shown_token

MAX_STRIP_TOKENS = 4096  # longer maps show their first tokens and say how many more there are


def target_caption(e: Any) -> str:
    """Model, method, what was explained and how likely the model found it."""
    from gradscope.core.targets import describe_next_token

    parts = [str(e.sidecar.get("model") or "model"), e.method.name]
    token = e.sidecar.get("explained_token")
    if token:
        parts.append(describe_next_token(token))
    else:
        index = e.predicted_class
        predictions = np.asarray(e.result.predictions)
        text = f"class {index}"
        if predictions.ndim == 2 and 0 <= index < predictions.shape[1]:
            row = predictions[0].astype(np.float64)
            probabilities = bool(np.all(row >= 0) and abs(row.sum() - 1.0) < 1e-3)
            text += f" ({'p' if probabilities else 'score'} = {row[index]:.3g})"
        if e.target.kind == "class" and e.target.index is None:
            text += ", the top class"
        parts.append(text)
    if e.node:
        parts.append(f"read at {e.node}")
    return " · ".join(parts)


def explanation_picture(e: Any, **view_options: Any) -> np.ndarray:
    """What ``save(colorbar=True)`` writes (the overlay or the strip, its colour bar); the caption is the HTML's
    (it was drawn into the picture as well, and read twice)."""
    from gradscope.app.files.exports import export_picture

    return export_picture(e.images(**view_options), e.view(**view_options), colorbar=True)


def explanation_html(e: Any) -> str:
    notes = "".join(f'<div class="note">⚠ {esc(w)}</div>' for w in e.warnings)
    if e.labels and e.fed is not None and e.fed.kind == "tokens":
        return fragment(token_strip_html(e) + notes)
    # an overlay on an image as JPEG: a photograph to PNG (a 64x64 input's 512 px map was 330 KB); bars stay PNG
    photo = e.fed is None or e.fed.kind == "image"
    return fragment(figure(explanation_picture(e), target_caption(e), photo=photo) + notes)


def _range_note(scores: np.ndarray) -> str:
    finite = scores[np.isfinite(scores)]
    if not finite.size:
        return "no finite score (NaN/Inf)"
    return f"scores from {finite.min():.3g} to {finite.max():.3g}"


def token_strip_html(e: Any) -> str:
    """The tokens in reading order (``dir="auto"``: a right-to-left text reads right to left), each on its
    score's colour; hovering shows the position, the token id and the score."""
    view = e.view()
    scores = np.asarray(e.saliency, np.float32).reshape(-1)
    labels = e.labels
    colours = position_colours(scores, view.colormap, view.normalization)
    ids = e.fed.ids if e.fed is not None and e.fed.ids is not None else None
    shown = min(len(labels), MAX_STRIP_TOKENS)
    cells = []
    for i in range(shown):
        rgb = colours[i]
        text = shown_token(labels[i])
        token_id = f", id {int(ids[i])}" if ids is not None and i < len(ids) else ""
        title = f"{i}: {labels[i]!r}{token_id}, score {float(scores[i]):.4g}"
        cells.append(
            f'<span class="tok" title="{esc(title)}" style="background:{hex_colour(rgb)};color:{hex_colour(ink(rgb))}">'
            f"<bdi>{esc(text)}</bdi></span>"
        )
    more = (
        f'<div class="note">… {len(labels) - shown} more tokens (save() writes them all)</div>'
        if shown < len(labels)
        else ""
    )
    caption = f"{target_caption(e)}; {_range_note(scores)} ({view.colormap}, {view.normalization})"
    return f'<div class="strip" dir="auto">{"".join(cells)}</div>{more}<div class="note">{esc(caption)}</div>'


def generation_html(g: Any) -> str:
    """Inseq's table: a row per generated token (with its probability), a column per context token, each cell
    its score's colour (normalised per row, as ``render.positions.token_matrix`` draws it), the value on hover;
    cells a token could not see are grey."""
    gen, labels = g.generation, g.labels
    matrix = np.asarray(gen.matrix, np.float32)
    context = labels[: matrix.shape[1]]
    colormap = (g.sidecar.get("view") or {}).get("colormap", "bwr")
    head = "".join(f'<th title="{j}"><bdi>{esc(t)}</bdi></th>' for j, t in enumerate(context))
    rows = []
    for i, p in enumerate(gen.probabilities):
        position = gen.prompt.size + i
        seen = np.isfinite(matrix[i])
        colours = position_colours(np.where(seen, matrix[i], 0.0), colormap, "signed") if seen.any() else None
        cells = []
        for j in range(matrix.shape[1]):
            if colours is None or not seen[j]:
                cells.append('<td style="background:#eceff1"></td>')
                continue
            title = f"{labels[position]!r} <- {j}: {context[j]!r}, score {float(matrix[i, j]):.4g}"
            cells.append(f'<td title="{esc(title)}" style="background:{hex_colour(colours[j])}"></td>')
        name = f"<bdi>{esc(labels[position])}</bdi> <small>p = {float(p):.2f}</small>"
        rows.append(f"<tr><th>{name}</th>{''.join(cells)}</tr>")
    table = (
        f'<div class="scroll"><table class="matrix"><thead><tr><th></th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )
    caption = (
        f"{g.sidecar.get('model', 'model')} · {g.method.name}: {len(gen.generated)} generated tokens (rows) "
        f"attributed to the context (columns); {_range_note(matrix)}"
    )
    return fragment(table + f'<div class="note">{esc(caption)}</div>')
