"""Weights that are already NaN or Inf (a checkpoint saved after a diverged step): such a model gives blank maps
and NaN logits reported as a class, so every result names the layers that hold them."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscope.core.graph import LayerGraph


def weight_problems(graph: LayerGraph, step_of: dict[str, Any]) -> list[str]:
    """One line per node whose layer's float weights hold NaN or Inf (``step_of``: node id -> its step)."""
    problems = []
    for node in graph.nodes:
        step = step_of.get(node.id)
        if step is None or step.kind == "activation":
            continue
        variables = [v for v in getattr(step.operation, "weights", []) or [] if "float" in str(v.dtype)]
        bad = [(v, _non_finite_counts(v)) for v in variables]
        bad = [(v, n) for v, n in bad if n[0] or n[1]]
        if bad:
            nan, inf = sum(n[0] for _, n in bad), sum(n[1] for _, n in bad)
            names = ", ".join(getattr(v, "path", None) or v.name for v, _ in bad[:3])
            problems.append(f"node {node.id!r} has {nan} NaN and {inf} Inf weight values ({names})")
    return problems


_LARGE = 1 << 20  # elements: from here one TensorFlow pass on the variable itself beats a host copy
_CHUNK = 1 << 22  # elements checked at a time: is_finite of a whole 128,256 x 2,048 embedding was 263 MB more


def _non_finite_counts(variable: Any) -> tuple[int, int]:
    """NaN and Inf counts of a variable; one pass decides whether any value is not finite, the counts only when
    one is. A small variable: a float64 NumPy sum of it (a sum of finite float32 values cannot overflow; ResNet50's
    320 variables ~15 ms, where two eager TensorFlow ops each took ~100 ms in a first result). A large one:
    ``is_finite`` and ``reduce_all`` where it lies, no host copy (a 1 B bfloat16 Llama's weights 0.33 s, where
    the copy and the sum through ml_dtypes took 2.9 s of its first map), a slice of ``_CHUNK`` at a time."""
    size = int(np.prod(variable.shape))
    if size >= _LARGE:
        from gradscope.backend import tf

        flat = tf.reshape(tf.convert_to_tensor(variable), [-1])
        if all(bool(tf.reduce_all(tf.math.is_finite(flat[i : i + _CHUNK]))) for i in range(0, size, _CHUNK)):
            return 0, 0
    else:
        value = np.asarray(variable)
        if np.isfinite(np.sum(value, dtype=np.float64)):
            return 0, 0
    value = np.asarray(variable)
    return int(np.count_nonzero(np.isnan(value))), int(np.count_nonzero(np.isinf(value)))
