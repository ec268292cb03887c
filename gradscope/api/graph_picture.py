"""``graph``: the layer graph as the window lays it out, each box filled by its gradient (SVG)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.api.inputs import check_common, engine_for, inputs_of, vocabulary
from gradscope.core.display import RichDisplay
from gradscope.core.errors import GraphError
from gradscope.core.targets import Target


@dataclass
class GraphPicture(RichDisplay):
    """The layer graph as the window lays it out, each box filled by its node's gradient when ``flow`` (the
    ``FlowReport`` of the input it was given) is there: ``svg()``, ``save(path)``; in a notebook it shows itself."""

    layout: Any  # render.graph_layout.GraphLayout
    flow: Any = None  # engine.diagnostics.flow.FlowReport, or None (no input: boxes are not coloured)
    title: str = ""

    _html_maker = "gradscope.app.display.reports:graph_html"

    def svg(self) -> str:
        from gradscope.render.graph_svg import NodeFlow, graph_svg

        flow = None
        if self.flow is not None:
            flow = {
                r.node: NodeFlow(None if r.status == "none" else float(r.grad_mean_abs), tuple(r.flags))
                for r in self.flow.rows
            }
        return graph_svg(self.layout, flow, title=self.title)

    def save(self, path: str | Path) -> Path:
        """The SVG, written atomically (a ``.svg`` file)."""
        from gradscope.app.files.exports import refuse_overwriting
        from gradscope.core.files import write_text_atomic

        path = Path(path)
        if path.suffix.lower() != ".svg":
            raise GraphError(f"The graph is written as an .svg file; got {path.name}.")
        refuse_overwriting([path], [])
        return write_text_atomic(path, self.svg())


def graph(
    model: Any,
    inputs: Any = None,
    labels: Any = None,
    *,
    loss: str | None = None,
    preprocessing: str = "unit",
    vocab: Any = None,
    collapsed: Any = None,
    direction: str = "TB",
    safe_mode: bool = True,
) -> GraphPicture:
    """The layer graph (``keras.utils.plot_model`` with the flow). With ``inputs`` (anything ``explain`` takes, or a
    batch array) each box is filled by its node's mean |g| for the top class, or for the loss with ``labels``
    (``gradient_flow``; a language model's next token): red where a gradient is NaN/Inf or explodes, grey where
    none arrives. ``collapsed``:
    nested-model groups drawn as one box (default: as the window opens the model)."""
    from gradscope.engine.diagnostics.flow import gradient_flow
    from gradscope.render.graph_layout import compute_layout, default_collapsed

    check_common(vocab=vocab, safe_mode=safe_mode)
    engine = engine_for(model, safe_mode=safe_mode)
    groups = default_collapsed(engine.graph) if collapsed is None else set(collapsed)
    layout = compute_layout(engine.graph, groups, direction=direction)
    name = getattr(engine.model, "name", "model")
    if inputs is None:
        return GraphPicture(layout, None, name)
    if isinstance(inputs, np.ndarray) and inputs.ndim >= 2 and inputs.dtype.kind == "f":
        x = engine.checked_inputs([inputs])[0]  # a batch, as gradient_flow takes it
    else:
        _, x, _ = inputs_of(engine, inputs, preprocessing, None, vocab=vocabulary(vocab, model, inputs))
    target = Target().as_token() if labels is None and engine.is_language_model() else None  # the next token
    flow = gradient_flow(engine, x, labels, loss, weight_grads=False, target=target)
    return GraphPicture(layout, flow, f"{name}: gradient flow of {flow.target}")
