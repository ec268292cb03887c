"""Exact patching: for each unit of a node, the model run with the node's value there replaced by its corrupted
value, the metric's change measured. The patches of one node run as batches, what lies below the node is reused
from the clean run (the values the layers above read, tiled to the batch), and each batch is one traced function
per node and metric, made once: eager Keras calls above an early node cost more than the arithmetic (ResNet50's
first stage: 2.5x a batched forward per cell when eager)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from gradscope.backend import tf
from gradscope.core.errors import Cancelled
from gradscope.engine.patching.metric import Metric
from gradscope.engine.patching.units import Units

#: Token positions (or image samples) per batch of patches: 8,192 rows of a 309 M Llama's activations at a time.
POSITIONS_PER_BATCH = 8192
CELLS_PER_BATCH = 16


class Tiled(dict):
    """A run's values by key, each tiled to ``batch`` samples (an int or a scalar tensor) the first time a layer
    reads it."""

    def __init__(self, base: dict, batch: Any) -> None:
        super().__init__()
        self.base, self.batch = base, batch

    def __missing__(self, key: Any) -> Any:
        value = self.base[key]
        if tf.is_tensor(value) and value.shape.rank and value.shape[0] == 1:
            value = tf.repeat(value, self.batch, axis=0)
        self[key] = value
        return value

    def get(self, key: Any, default: Any = None) -> Any:  # Keras' fill_in reads with get()
        return self[key] if key in self or key in self.base else default

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or key in self.base


def changed_units(units: Units, clean: Any, corrupt: Any) -> np.ndarray:
    """Which units a patch changes at all (before the first token where the inputs differ, a causal model's values
    are the same: such a patch is exactly 0 and is not run)."""
    return units.totals(tf.cast(tf.not_equal(clean, corrupt), tf.float32)) > 0


def run_patches(
    engine: Any,
    clean_values: dict,
    node: str,
    units: Units,
    metric: Metric,
    clean: Any,
    corrupt: Any,
    *,
    role: str | None = None,
    on_batch: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> np.ndarray:
    """(units.count,) metric changes when ``node``'s output (``role`` None) or its attention layer's q, k or v
    projection (``role``) takes ``corrupt`` in place of ``clean`` at each unit, the layers above run from there.
    Each batch carries unpatched rows, its own baseline (a batch's kernels may round otherwise than the clean
    run's); a unit whose patch changes nothing is exactly 0 and is not run."""
    from gradscope.engine.patching.attribution import traced

    todo = np.flatnonzero(changed_units(units, clean, corrupt)).tolist()
    if on_batch is not None and len(todo) < units.count:
        on_batch(units.count - len(todo))
    out = np.zeros(units.count)
    if not todo:
        return out
    limit = max(1, POSITIONS_PER_BATCH // max(units.count, 1)) if units.kind == "positions" else CELLS_PER_BATCH
    batches = math.ceil(len(todo) / limit)
    size = math.ceil(len(todo) / batches)  # balanced batches, each padded to ``size`` + 1 rows: one trace
    keys = frontier(engine, node)
    fn = traced(
        engine, ("patch", node, role, metric.shape_key), lambda: _batch_function(engine, node, role, keys, metric)
    )
    below = [clean_values[k] for k in keys]
    for start in range(0, len(todo), size):
        if should_stop is not None and should_stop():
            raise Cancelled("Patching cancelled.")
        chunk = todo[start : start + size]
        masks = units.masks(tuple(clean.shape), chunk)
        padding = tf.zeros([size + 1 - len(chunk), *masks.shape[1:]], tf.bool)  # unpatched: the last is the baseline
        measured = fn(below, tf.concat([masks, padding], axis=0), clean, corrupt, metric.spec()).numpy()
        out[chunk] = measured[: len(chunk)] - measured[-1]
        if on_batch is not None:
            on_batch(len(chunk))
    return out


def frontier(engine: Any, node: str) -> list[Any]:
    """The keys of the values that ``node``'s step and the steps after it read but do not make, and the node's
    outputs after its first (a mixture of experts' router logits): what a patched run reuses from the clean one."""
    steps = engine.exec.steps
    made: set[Any] = set()
    needed: dict[Any, None] = dict.fromkeys(engine._step_of[node].out_keys[1:])
    for step in steps[steps.index(engine._step_of[node]) :]:
        for key in step.in_keys:
            if key not in made:
                needed.setdefault(key)
        made.update(step.out_keys)
    return list(needed)


def _batch_function(engine: Any, node: str, role: str | None, keys: list[Any], metric: Metric) -> Any:
    step = engine._step_of[node]

    def batch(below: list, masks: Any, clean: Any, corrupt: Any, spec: Any) -> Any:
        values = Tiled(dict(zip(keys, below)), tf.shape(masks)[0])
        if role is None:
            outs = [tf.where(masks, corrupt, clean)] + [values[k] for k in step.out_keys[1:]]
        else:
            from gradscope.engine.patching.attention_parts import attention_call

            outs = attention_call(engine, node, values, patch={(node, role): lambda y: tf.where(masks, corrupt, y)})
        for key, y in zip(step.out_keys, outs):
            values[key] = y
        result, _ = engine._run(None, {}, resume=(node, values))
        return metric.of(result[engine.logits_key], spec)

    return tf.function(batch, autograph=False, reduce_retracing=True)
