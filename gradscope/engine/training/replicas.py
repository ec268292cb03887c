"""Where training runs: a ``GradientMonitor``'s step under ``tf.distribute``.

Under a strategy with several replicas (``MirroredStrategy``; written for ``MultiWorkerMirroredStrategy``, which
plain Keras ``fit`` cannot run on this project's machines, so untested) the monitored step

- all-reduces the weight gradients (and the loss) itself, once, and hands the optimizer the reduced ones with
  its own all-reduce turned off while the step is traced: the records, the sentinel and the per-step norms are
  of the global batch's gradients at no second all-reduce. One difference from Keras' own step: a ``clipnorm`` /
  ``global_clipnorm`` optimizer clips the global gradient, where Keras clips each replica's before adding them;
- gathers each node's statistics from every replica (the signals are of each replica's shard), in the same
  all-reduce, and combines them;
- checks its own shard only when the global gradient is not finite, to name the replica where a NaN started;
- writes from replica 0 of the chief worker only.

Collectives cannot sit inside a ``tf.cond`` under ``MirroredStrategy`` (``merge_call``), so each runs every step,
on what the record needs or on zeros of the same shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gradscope.backend import tf
from gradscope.core.errors import GradscopeError


def strategy_of(model: Any) -> Any | None:
    """The model's strategy when it has one (``None``: the default, one device)."""
    strategy = model.distribute_strategy
    default = tf.distribute.get_strategy() if not tf.distribute.has_strategy() else None
    if strategy is default or type(strategy).__name__ == "_DefaultDistributionStrategy":
        return None
    if "TPU" in type(strategy).__name__:
        raise GradscopeError(
            f"GradientMonitor does not run under {type(strategy).__name__}: its records are written from the "
            "step, which a TPU would need to send to the host. Train with the monitor on CPU/GPU, or without it."
        )
    return strategy


def is_chief(strategy: Any | None) -> bool:
    """Whether this worker writes the log: the chief (or worker 0 in a cluster without one); always on one host."""
    resolver = getattr(strategy, "cluster_resolver", None) if strategy is not None else None
    task_type = getattr(resolver, "task_type", None)
    if task_type in (None, "chief"):
        return True
    spec = resolver.cluster_spec().as_dict() if hasattr(resolver, "cluster_spec") else {}
    return task_type == "worker" and int(getattr(resolver, "task_id", 0) or 0) == 0 and "chief" not in spec


def replica_context() -> Any | None:
    """The replica context of the step being traced when it is one of several (``None``: one replica)."""
    context = tf.distribute.get_replica_context()
    return context if context is not None and context.num_replicas_in_sync > 1 else None


def is_writer(context: Any | None) -> Any:
    """True on the replica that writes (replica 0; the only one without a strategy)."""
    if context is None:
        return tf.constant(True)
    return tf.equal(context.replica_id_in_sync_group, 0)


def all_reduced(context: Any | None, grads: list, loss: Any, shard: Any = None) -> tuple[list, Any, Any]:
    """(the gradients, the loss) summed over the replicas (each replica's loss is already divided by their number,
    as Keras scales it), and ``shard`` (a vector, each replica's own) of every replica stacked (replicas, size):
    one all-reduce for all of them, ``shard`` in its replica's slot of a zero vector (a sum that gathers)."""
    if context is None:
        return grads, loss, None if shard is None else shard[None]
    present = [g for g in grads if g is not None]
    extra = []
    if shard is not None:
        slot = tf.one_hot(context.replica_id_in_sync_group, context.num_replicas_in_sync, dtype=tf.float32)
        extra = [tf.reshape(slot[:, None] * shard[None, :], [-1])]
    reduced = iter(context.all_reduce(tf.distribute.ReduceOp.SUM, [*present, tf.cast(loss, tf.float32), *extra]))
    grads = [None if g is None else next(reduced) for g in grads]
    loss = next(reduced)
    stacked = tf.reshape(next(reduced), [context.num_replicas_in_sync, -1]) if shard is not None else None
    return grads, loss, stacked


def gathered(context: Any | None, value: Any) -> Any:
    """``value`` of every replica stacked on a new first axis ((1, ...) with one replica)."""
    if context is None:
        return value[None]
    return context.all_gather(value[None], axis=0)


def combined_rows(rows: Any, sizes: Any) -> tuple[Any, Any]:
    """(n, 6) statistics of the whole batch from (replicas, n, 6) per-shard ``stats_rows`` and (replicas, n) sizes:
    norms add in squares, means and zero fractions by size, maxima by max, NaN/Inf counts by sum."""
    total = tf.reduce_sum(sizes, axis=0)
    weight = sizes / tf.maximum(total, 1.0)
    norm = tf.sqrt(tf.reduce_sum(tf.square(rows[..., 0]), axis=0))
    mean = tf.reduce_sum(rows[..., 1] * weight, axis=0)
    biggest = tf.reduce_max(rows[..., 2], axis=0)
    zero = tf.reduce_sum(rows[..., 3] * weight, axis=0)
    nan, inf = tf.reduce_sum(rows[..., 4], axis=0), tf.reduce_sum(rows[..., 5], axis=0)
    return tf.stack([norm, mean, biggest, zero, nan, inf], axis=1), total


@contextmanager
def optimizer_reduction_off(optimizer: Any, context: Any | None) -> Iterator[None]:
    """While the step is traced: the optimizer applies the gradients it is given as they are (the step reduced
    them), instead of all-reducing them a second time. The attribute is Keras' TensorFlow optimizer's (checked by
    ``backend.keras_train_step_internals``)."""
    if context is None:
        yield
        return
    target = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's inner one reduces
    # in the instance's dict, past Keras' attribute tracking (which would keep it as the optimizer's state)
    vars(target)["_all_reduce_sum_gradients"] = list
    try:
        yield
    finally:
        vars(target).pop("_all_reduce_sum_gradients", None)


def local_results(strategy: Any | None, value: Any) -> list:
    """Each replica's part of a per-replica value (the value itself with one replica)."""
    if strategy is None:
        return [value]
    return list(strategy.experimental_local_results(value))


def replica_local_variable(strategy: Any | None, initial: Any, name: str, dtype: Any = None) -> Any:
    """A variable the step reads and writes on every replica without synchronising (one copy each, the first
    replica's read from outside the step): the monitor's own state."""
    if strategy is None:
        return tf.Variable(initial, trainable=False, name=name, dtype=dtype)
    with strategy.scope():
        return tf.Variable(
            initial,
            trainable=False,
            name=name,
            dtype=dtype,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
