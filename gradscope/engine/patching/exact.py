"""Exact patching: for each unit of a node, the model run with the node's value there replaced by its corrupted
value, the metric's change measured. The patches of one node run as one batch, and what lies below the node is
reused from the clean run (its values tiled to the batch as the layers above read them), never recomputed."""

from __future__ import annotations

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
    """A run's values by key, each tiled to ``batch`` samples the first time a layer reads it."""

    def __init__(self, base: dict, batch: int) -> None:
        super().__init__()
        self.base, self.batch = base, batch

    def __missing__(self, key: Any) -> Any:
        value = self.base[key]
        if tf.is_tensor(value) and value.shape.rank and value.shape[0] == 1 and self.batch != 1:
            value = tf.repeat(value, self.batch, axis=0)
        self[key] = value
        return value

    def get(self, key: Any, default: Any = None) -> Any:  # Keras' fill_in reads with get()
        return self[key] if key in self or key in self.base else default

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or key in self.base


def exact_effects(
    engine: Any,
    clean_values: dict,
    node: str,
    clean: Any,
    corrupt: Any,
    units: Units,
    metric: Metric,
    base: float,
    *,
    on_batch: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> np.ndarray:
    """(units.count,) metric changes; ``clean`` / ``corrupt``: the node's (1, ...) values on the two inputs."""
    step = engine._step_of[node]

    def patched(masks: Any, values: dict) -> list:
        return [tf.where(masks, corrupt, clean)] + [values[k] for k in step.out_keys[1:]]

    return run_patches(
        engine, clean_values, node, units, metric, base, patched, tuple(clean.shape),
        changes=changed_units(units, clean, corrupt), on_batch=on_batch, should_stop=should_stop,
    )  # fmt: skip


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
    base: float,
    patched: Callable[[Any, dict], list],
    shape: tuple,
    *,
    changes: np.ndarray | None = None,
    on_batch: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> np.ndarray:
    """The metric change of each unit when ``node``'s outputs are ``patched(masks, values)`` for a batch of unit
    masks (of a value of ``shape``) and the batch's values below the node, the layers above run from there. Each
    batch carries one unpatched row, its own baseline: a batch's kernels may round otherwise than the clean run's.
    ``changes``: the units worth running (the others are exactly 0)."""
    step = engine._step_of[node]
    per_batch = max(1, POSITIONS_PER_BATCH // max(units.count, 1)) if units.kind == "positions" else CELLS_PER_BATCH
    todo = [u for u in range(units.count) if changes is None or changes[u]]
    out = np.zeros(units.count)
    if on_batch is not None and len(todo) < units.count:
        on_batch(units.count - len(todo))
    for start in range(0, len(todo), per_batch):
        if should_stop is not None and should_stop():
            raise Cancelled("Patching cancelled.")
        chunk = todo[start : start + per_batch]
        masks = units.masks(shape, chunk)
        masks = tf.concat([masks, tf.zeros_like(masks[:1])], axis=0)  # the last row: unpatched
        values = Tiled(clean_values, len(chunk) + 1)
        outs = patched(masks, values)
        for key, y in zip(step.out_keys, outs):
            values[key] = y
        result, _ = engine._run(None, {}, resume=(node, values))
        measured = metric.of(result[engine.logits_key]).numpy()
        out[chunk] = measured[:-1] - measured[-1]
        if on_batch is not None:
            on_batch(len(chunk))
    return out
