"""Inside an attention layer: the outputs of its query, key and value projections (the ``q``, ``k``, ``v``
components, per position, all heads) and its attention probabilities, reached by hooking the layer's sublayers
while the engine runs it (as the AttnLRP rule does), and AtP*'s QK fix.

QK fix (Kramár et al. 2024, §3.1.1): a query or key patch acts through the softmax, where a saturated pattern has a
near-zero gradient and AtP misses large effects. The attention probabilities are recomputed exactly with the patch
(a query at position t changes row t; a key at s changes column s of every row), and only what follows them is
linearised: Σ (A_patched − A_clean) ⊙ ∂m/∂A.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from gradscope.backend import tf
from gradscope.core.errors import Cancelled, GraphError
from gradscope.engine.patching.units import Units
from gradscope.rules.builtin.attention import calls_replaced, softmax_sublayer, sublayer

ROLES = {"q": "query_dense", "k": "key_dense", "v": "value_dense"}
PROBS = "probs"


@contextlib.contextmanager
def hooked(engine: Any, nodes: list[str], *, record: dict | None = None, patch: dict | None = None) -> Iterator[None]:
    """While the engine runs the attention ``nodes``: ``record[(node, role)]`` receives each q/k/v projection's
    output and ``record[(node, "probs")]`` the attention probabilities; ``patch[(node, role)](y)`` replaces a
    projection's output ``y``."""
    replacements = []
    for node in nodes:
        layer = engine.exec.operations[node]
        parts = {role: sublayer(layer, name) for role, name in ROLES.items()}
        parts[PROBS] = softmax_sublayer(layer)
        missing = [role for role, found in parts.items() if found is None]
        if missing:
            raise GraphError(
                f"{node!r} ({type(layer).__name__}) has no {', '.join(missing)} sublayer gradscope can reach: its "
                "queries, keys and values cannot be patched one by one (patch the attention output: attn)."
            )
        replacements += [(sub, _hook(node, role, sub, record, patch)) for role, sub in parts.items()]
    with calls_replaced(replacements):
        yield


def _hook(node: str, role: str, sub: Any, record: dict | None, patch: dict | None) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        y = type(sub).call(sub, *args, **kwargs)
        if patch is not None and (node, role) in patch:
            y = patch[(node, role)](y)
        if record is not None:
            record[(node, role)] = y
        return y

    return call


def attention_call(engine: Any, node: str, values: dict, patch: dict | None = None, record: dict | None = None) -> list:
    """The attention node's outputs on ``values`` (a run's values by key), its projections patched as ``patch``."""
    with hooked(engine, [node], record=record, patch=patch):
        return engine._call_step(engine._step_of[node], values, None)


def qk_fixed(
    engine: Any,
    clean_values: dict,
    node: str,
    role: str,
    corrupt: Any,
    units: Units,
    probs: Any,
    gradients: list[Any],
    *,
    on_batch: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[np.ndarray]:
    """For each of ``gradients`` (∂m/∂A at the clean input, or with a block held back), the QK-fixed estimate of
    patching ``role`` ("q" or "k") of ``node`` at each unit: Σ (A_patched − A_clean) ⊙ gradient."""
    from gradscope.engine.patching.exact import Tiled

    clean = None
    out = [np.zeros(units.count) for _ in gradients]
    per_batch = max(1, 64 // max(1, units.count // 64))  # probabilities are (batch, heads, L, L): a few at a time
    for start in range(0, units.count, per_batch):
        if should_stop is not None and should_stop():
            raise Cancelled("Patching cancelled.")
        chunk = range(start, min(start + per_batch, units.count))
        seen: dict = {}
        if clean is None:
            attention_call(engine, node, clean_values, record=seen)
            clean = seen[(node, role)]
        masks = units.masks(tuple(clean.shape), chunk)
        change = {(node, role): lambda y, m=masks: tf.where(m, corrupt, y)}
        attention_call(engine, node, Tiled(clean_values, len(chunk)), patch=change, record=seen)
        delta = tf.cast(seen[(node, PROBS)], tf.float32) - tf.cast(probs, tf.float32)
        axes = list(range(1, delta.shape.rank))
        for k, gradient in enumerate(gradients):
            out[k][start : chunk.stop] = tf.reduce_sum(delta * tf.cast(gradient, tf.float32), axis=axes).numpy()
        if on_batch is not None:
            on_batch(len(chunk))
    return out
