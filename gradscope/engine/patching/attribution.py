"""Attribution patching: every patch estimated at once from one backward pass on the clean input.

- AtP (Nanda 2023; Syed, Rager, Conmy 2023): atp(n, u) = Σ over unit u of (n_corrupt − n_clean) · ∂m/∂n at the
  clean input: the first-order Taylor estimate of the exact effect.
- GradDrop, AtP*'s fix for cancellation (Kramár, Lieberum, Shah, Nanda 2024, arXiv 2403.00745, §3.1.2): AtP
  recomputed L times, the gradient through block l's contribution to the residual stream held back each time
  (its branches pass their value on, not their gradient), and combined as (1 / (L − 1)) Σ_l |atp_l(n, u)|: a
  magnitude. A node inside block l gets no gradient while l is held back, hence L − 1.

One traced function gives the gradients for any choice of held-back block (a gate per block fed as data), so the
L + 1 passes share one trace.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import numpy as np

from gradscope.backend import tf
from gradscope.engine.patching.attention_parts import hooked
from gradscope.engine.patching.metric import Metric


class Pass(NamedTuple):
    """One backward pass on the clean input: the gradient at each node and part, their values, the logits."""

    grads: dict[Any, Any]
    values: dict[Any, Any]
    logits: Any


class Signals:
    """``∂m/∂n`` at the clean input for ``nodes`` (node ids) and ``parts`` (``(attention node, role)``: a q, k or v
    projection's output, or its probabilities), with the blocks whose ``branches`` a gate of 0 holds back. The
    traced function is kept per engine and parts (``traced``); the metric's token and position are data."""

    def __init__(
        self, engine: Any, metric: Metric, nodes: list[str], branches: list[tuple[str, ...]], parts: list = ()
    ) -> None:
        self.engine, self.metric, self.nodes, self.branches = engine, metric, list(dict.fromkeys(nodes)), branches
        self.parts = list(dict.fromkeys(parts))
        key = ("signals", tuple(self.nodes), tuple(self.parts), tuple(map(tuple, branches)), metric.shape_key)
        self._fn = traced(engine, key, lambda: tf.function(self._signals, autograph=False, reduce_retracing=True))

    def __call__(self, xs: list, held_back: int | None = None) -> Pass:
        gates = np.ones(max(len(self.branches), 1), np.float32)
        if held_back is not None:
            gates[held_back] = 0.0
        keys = [*self.nodes, *self.parts]
        out = self._fn(list(xs), self.metric.spec(), tf.constant(gates))  # lists: their keys mix names and pairs
        return Pass(dict(zip(keys, out[0])), dict(zip(keys, out[1])), out[2])

    def _signals(self, xs: list, spec: Any, gates: Any) -> tuple:
        recorded: dict[str, Any] = {}
        gate_of = {node: block for block, names in enumerate(self.branches) for node in names}

        def transform(node: str) -> Any:
            def apply(outs: list) -> list:
                y = outs[0]
                if node in self.nodes:
                    recorded[node] = y  # before the gate: a held-back block's own nodes get no gradient
                if node in gate_of:
                    g = tf.cast(gates[gate_of[node]], y.dtype)
                    y = g * y + (1 - g) * tf.stop_gradient(y)  # the value passes, the gradient by the gate
                return [y, *outs[1:]]

            return apply

        transforms = {n: transform(n) for n in {*self.nodes, *gate_of}}
        inside: dict = {}
        with tf.GradientTape() as tape, hooked(self.engine, sorted({n for n, _ in self.parts}), record=inside):
            values, _ = self.engine._run(xs, {}, transforms=transforms)
            total = tf.reduce_sum(self.metric.of(values[self.engine.logits_key], spec))
        recorded.update({part: inside[part] for part in self.parts})
        keys = [*self.nodes, *self.parts]
        grads = tape.gradient(total, [recorded[k] for k in keys])
        grads = [tf.zeros_like(recorded[k]) if g is None else g for k, g in zip(keys, grads)]
        return grads, [recorded[k] for k in keys], values[self.engine.logits_key]


def captured_forward(engine: Any, nodes: list[str], parts: list) -> Any:
    """``fn(xs) -> (logits, [each node's output, each part's value])``, traced once per engine and parts."""

    def forward(xs: list) -> tuple:
        inside: dict = {}
        with hooked(engine, sorted({n for n, _ in parts}), record=inside):
            values, node_values = engine._run(xs, {})
        return values[engine.logits_key], [node_values[n][0] for n in nodes] + [inside[p] for p in parts]

    key = ("forward", tuple(nodes), tuple(parts))
    return traced(engine, key, lambda: tf.function(forward, autograph=False, reduce_retracing=True))


_TRACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> {key: traced function}
_KEPT = 8  # traced functions kept per engine (each holds a graph of the model)


def traced(engine: Any, key: tuple, make: Any) -> Any:
    """The traced function ``key`` of ``engine``, made once: a second patching of the same parts traces nothing."""
    kept = _TRACED.setdefault(engine, {})
    if key not in kept:
        while len(kept) >= _KEPT:
            kept.pop(next(iter(kept)))
        kept[key] = make()
    return kept[key]


def first_order(diff: Any, grad: Any) -> Any:
    """(n_corrupt − n_clean) · ∂m/∂n, elementwise in float32 (summed over a unit's elements by ``Units.totals``)."""
    return tf.cast(diff, tf.float32) * tf.cast(grad, tf.float32)


def graddrop(per_block: list[np.ndarray]) -> np.ndarray:
    """AtP*'s combination of the estimates with each block held back in turn: (1 / (L − 1)) Σ_l |atp_l|."""
    if len(per_block) < 2:
        return np.abs(per_block[0])
    return np.sum([np.abs(e) for e in per_block], axis=0) / (len(per_block) - 1)
