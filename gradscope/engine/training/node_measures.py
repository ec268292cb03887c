"""Each monitored node's statistics in one step: its signal's rows, its size and (ReLU nodes) the fraction of
dead units, on one device or combined from every replica's shard (which rides in the gradients' all-reduce)."""

from __future__ import annotations

from typing import Any

from gradscope.backend import tf
from gradscope.engine.backward.stats import magnitude_rows, stats_rows
from gradscope.engine.training.replicas import combined_rows
from gradscope.engine.training.statistics import dead_fraction, unit_maxima, unscaled_rows


def node_measures(node_outs: list, node_grads: list, inverse: Any, relu: list[int], statistics: str) -> tuple:
    """((n, 6) statistics of each node's signal, (n,) sizes, (n,) dead-unit fractions; NaN: not a ReLU)."""
    if not node_outs:
        return tf.zeros([0, 6]), tf.zeros([0]), tf.zeros([0])
    filled = [tf.zeros_like(o) if g is None else g for g, o in zip(node_grads, node_outs)]
    rows = unscaled_rows((stats_rows if statistics == "all" else magnitude_rows)(filled), inverse)
    # sizes from the gradients (same shapes): a size op on a forward value is a reader too (see _build)
    sizes = tf.cast(tf.stack([tf.size(g) for g in filled]), tf.float32)
    dead = [tf.constant(float("nan"))] * len(node_outs)
    for i in relu:
        dead[i] = dead_fraction(unit_maxima(node_outs[i]))
    return rows, sizes, tf.stack(dead)


def relu_units(relu: list[int], node_outs: list) -> tuple[list[int], list[int]]:
    relu = [i for i in relu if node_outs[i].shape[-1] is not None]
    return relu, [int(node_outs[i].shape[-1]) for i in relu]


def node_shard(record: Any, node_outs: list, node_grads: list, inverse: Any, relu: list[int], statistics: str) -> Any:
    """This replica's node statistics as one vector: rows (n x 6), sizes (n), the ReLU units' maxima; zeros
    when the step does not record. Never empty (an empty collective crashes TensorFlow's ring gatherer)."""
    n = len(node_outs)
    relu, units = relu_units(relu, node_outs)

    def measure() -> Any:
        rows, sizes, _ = node_measures(node_outs, node_grads, inverse, relu, statistics)
        maxima = [unit_maxima(node_outs[i]) for i in relu]
        return tf.concat([tf.reshape(rows, [-1]), sizes, *maxima, tf.zeros([1])], axis=0)

    return tf.cond(record, measure, lambda: tf.zeros([7 * n + sum(units) + 1]))


def combined_node_measures(shards: Any, node_outs: list, relu: list[int]) -> tuple:
    """``node_measures`` of the global batch from every replica's ``node_shard`` (replicas, size): norms
    add in squares, means by size, maxima by max; a ReLU unit is dead when it is 0 on every shard."""
    n = len(node_outs)
    if n == 0:
        return tf.zeros([0, 6]), tf.zeros([0]), tf.zeros([0])
    relu, units = relu_units(relu, node_outs)
    rows, total = combined_rows(tf.reshape(shards[:, : 6 * n], [-1, n, 6]), shards[:, 6 * n : 7 * n])
    maxima = tf.reduce_max(shards[:, 7 * n : 7 * n + sum(units)], axis=0)
    dead = [tf.constant(float("nan"))] * n
    for i, part in zip(relu, tf.split(maxima, units) if units else []):
        dead[i] = dead_fraction(part)
    return rows, total, tf.stack(dead)
