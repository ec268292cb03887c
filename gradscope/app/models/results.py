"""The results on screen, as a small evented model: the current plan's result and the baseline, what they were
computed with, and what the views derive from them. Plain numpy: no TensorFlow, no Qt.

Owns: ``current`` and ``baseline`` (``BackwardResult``), the ``plan``, ``method`` and ``readout`` (the view's
read-out fields) the current one was computed with, the run's ``seconds``, and the ``baseline_key`` (model,
input version, target) the baseline belongs to.
Emits: ``changed(current, baseline)`` when a run's results arrive or the results are cleared.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from gradscope.app.rendering.view import INPUT_KEY, ViewSettings
from gradscope.core.errors import GraphError
from gradscope.core.events import Signal
from gradscope.core.graph import LayerGraph
from gradscope.core.results import BackwardResult, NodeStats
from gradscope.core.targets import whole_number
from gradscope.engine.backward.attribution import weighted_signal
from gradscope.rules.plan import Plan


class Results:
    """Also a language model's generation attributed token by token (``generation``: the engine's
    ``Generation``, ``generation_labels``: a label per token), computed on the worker."""

    def __init__(self) -> None:
        self.generation: Any = None
        self.generation_labels: tuple[str, ...] = ()
        self.generation_changed = Signal("generation_changed")  # (generation or None)
        self.current: BackwardResult | None = None
        self.baseline: BackwardResult | None = None
        #: The plan and method ``current`` was computed with: while a newer plan computes, the views label the
        #: result with these (never the old pixels under the new plan's name) and exports use them.
        self.plan: Plan | None = None
        self.method: str | None = None
        self.readout: dict[str, Any] = {}  # and the read-out settings it was computed for
        self.seconds: float | None = None
        self.baseline_key: tuple | None = None
        self.changed = Signal("result_changed")  # (current, baseline)

    def show(
        self,
        current: BackwardResult,
        baseline: BackwardResult,
        *,
        plan: Plan,
        method: str,
        readout: dict[str, Any],
        seconds: float,
        baseline_key: tuple,
    ) -> None:
        """A run's results arrive: they replace what is shown."""
        self.current, self.baseline, self.baseline_key = current, baseline, baseline_key
        self.plan, self.method, self.readout, self.seconds = plan, method, dict(readout), seconds
        self.changed.emit(current, baseline)

    def clear(self) -> None:
        """Nothing computed (a new model): quiet, the caller announces the new model."""
        self.current = self.baseline = self.plan = self.method = self.seconds = self.baseline_key = None
        self.readout = {}
        self.generation, self.generation_labels = None, ()  # the views hear of it with the new model's events

    def baseline_for(self, key: tuple) -> BackwardResult | None:
        """The baseline, if it was computed for ``key`` (same engine, input and target): a plan edit reuses it."""
        return self.baseline if key == self.baseline_key else None

    # ------------------------------------------------------------------------------------------- derived
    def is_stale(self, plan: Plan) -> bool:
        """True while the shown result belongs to another plan than ``plan`` (the current one computes)."""
        return self.current is not None and self.plan is not None and self.plan != plan

    def view_for(self, view: ViewSettings, plan: Plan) -> ViewSettings:
        """The view the shown result is drawn with: ``view``, except that while a newer plan computes the
        read-out (node, channel reduction, x input, sign, Grad-CAM) stays the one the result was computed for,
        so a preset's new reduction is never applied to the previous plan's signal."""
        if not self.is_stale(plan) or not self.readout:
            return view
        return dataclasses.replace(view, **self.readout)

    def caption(self, plan: Plan) -> str:
        """What the shown result is: its method and plan size, marked when a newer plan is computing."""
        if self.current is None or self.plan is None:
            return ""
        n = len(self.plan.entries)
        text = f"{self.method or 'custom'}, {n} plan {'entry' if n == 1 else 'entries'}"
        return f"{text} (previous plan; the new one is computing)" if self.is_stale(plan) else text

    def skipped_nodes(self, graph: LayerGraph | None) -> set[str]:
        """Nodes the target does not reach by design: the final softmax when the logits are explained."""
        res = self.current or self.baseline
        if res is not None and graph is not None and res.meta.get("softmax_stripped"):
            return {graph.output_ids[0]}
        return set()

    def top_k(self, k: int = 5) -> list[tuple[int, float]]:
        """The model's top-k classes for the first sample: (index, probability or score); for a language model
        the top-k next tokens at the explained position, with their probabilities."""
        res = self.current or self.baseline
        k = whole_number(k, "number of classes") or 0
        if res is None or k < 1:
            return []
        if res.predictions.ndim == 3 and "token_position" in res.meta:
            row = np.asarray(res.logits[0, res.meta["token_position"]], np.float64)
            p = np.exp(row - row.max())
            p /= p.sum()
        elif res.predictions.ndim == 2:
            p = res.predictions[0]
        else:
            return []
        order = np.argsort(-p, kind="stable")[:k]
        return [(int(i), float(p[i])) for i in order]

    def set_generation(self, generation: Any, labels: tuple[str, ...] = ()) -> None:
        self.generation, self.generation_labels = generation, tuple(labels)
        self.generation_changed.emit(generation)

    def of(self, which: str) -> BackwardResult | None:
        return self.current if which == "current" else self.baseline

    def stats(self, which: str = "current") -> dict[str, NodeStats]:
        res = self.of(which)
        return {} if res is None else res.stats

    def flow_rows(self, which: str = "current") -> list[dict[str, Any]]:
        res = self.of(which)
        return [] if res is None else res.flow_table()


def readout_node(view: ViewSettings, selected: str | None, graph: LayerGraph | None) -> str | None:
    """The node whose signal the map shows under ``view`` (its read-out node, else the selected one); None:
    the model input (for token ids, which no gradient reaches: the embedding's output)."""
    node = view.readout_node or selected
    if node is None or node == INPUT_KEY or graph is None or node not in graph or graph.node(node).is_input:
        if graph is not None and graph.token_input is not None:
            embedding = graph.embedding_of(graph.token_input)  # no gradient reaches token ids: read it here
            return embedding.id if embedding is not None else None
        return None
    return node


def signal_of(res: BackwardResult | None, node: str | None, view: ViewSettings) -> np.ndarray:
    """The first sample's backward signal at ``node`` (None: the input), weighted as ``view`` says (x input,
    Grad-CAM)."""
    if res is None:
        raise GraphError("No result yet: open a model and wait for the gradients.")
    if node is None:
        sig, val = res.input_grads[0][0], res.inputs[0][0] if res.inputs else None
    else:
        if node not in res.node_grads:
            raise GraphError(f"No signal was captured at {node!r}.")
        sig, val = res.node_grads[node][0], res.node_values.get(node, [None])[0]
    return weighted_signal(sig, val, times_input=view.times_input, grad_cam=view.grad_cam)
