"""Per-position maps of text and tabular inputs, as the views and exports show them: one score per token (read
at the embedding's output, where the signal exists) or per feature, drawn as a token strip or a bar chart
(``render.positions``). Plain numpy: no TensorFlow, no Qt."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscope.app.rendering.view import OverlayImages, ViewSettings
from gradscope.core.results import BackwardResult
from gradscope.engine.backward.attribution import token_map, token_readout, weighted_signal
from gradscope.io.model_inputs import ModelInput


def position_scores(res: BackwardResult, node: str | None, fed: ModelInput, view: ViewSettings) -> np.ndarray | None:
    """One score per position of ``fed``, or None when the map at ``node`` is not per position (a node after
    pooling, an image). Tokens: the signal at the embedding summed over its dimension as relevance under LRP
    and MWP rules, else times the embedding (the view's "x input") or the L2 norm of the gradient. Features:
    the input signal, times the input when the view says so."""
    labels = fed.labels
    if not labels:
        return None
    if fed.kind == "tokens":
        if node is None or node not in res.node_grads:
            return None
        g = np.asarray(res.node_grads[node][0])
        value = res.node_values.get(node)
        if g.ndim < 1 or g.shape[0] != len(labels) or value is None:
            return None
        return token_map(g, value[0], token_readout(res.rules.values(), times_input=view.times_input))
    if node is not None:
        return None
    scores = weighted_signal(res.input_grads[0][0], res.inputs[0][0], times_input=view.times_input, grad_cam=False)
    return scores if scores.shape == (len(labels),) else None


def position_images(
    res: BackwardResult | None, node: str | None, fed: ModelInput | None, view: ViewSettings, *, width: int = 1024
) -> OverlayImages | None:
    """The token strip or feature bars of the map at ``node``, or None when it is not per position."""
    if res is None or fed is None:
        return None
    scores = position_scores(res, node, fed, view)
    return None if scores is None else position_picture(fed, scores, view, node, width=width)


def position_picture(
    fed: ModelInput, scores: np.ndarray, view: ViewSettings, node: str | None, *, width: int = 1024
) -> OverlayImages:
    """``scores`` (one per position of ``fed``) drawn as a token strip or feature bars ``width`` pixels wide."""
    from gradscope.render.positions import feature_bars, token_strip

    view.check()
    draw: Any = token_strip if fed.kind == "tokens" else feature_bars
    picture = draw(fed.labels, scores, colormap=view.colormap, normalization=view.normalization, width=width)
    return OverlayImages(None, picture, None, scores, node, False, labels=fed.labels)
