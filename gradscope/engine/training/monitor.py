"""``GradientMonitor``: per-layer gradient flow while ``model.fit`` runs, recorded as TensorBoard event files.

    model.fit(x, y, epochs=5, callbacks=[gradscope.GradientMonitor("logs/run1", every=10)])
    # gradscope train-report logs/run1        (or: tensorboard --logdir logs ; gradscope gui --training logs/run1)

A Keras callback cannot see gradients, so at ``on_train_begin`` the monitor swaps the model's train function for
one that runs the same train step (Keras' ``train_step``, step for step: loss, loss tracker, loss scaling,
optimizer, metrics) with the forward pass run node by node by gradscope's engine, so the signal at every node's
output is a gradient source; ``on_train_end`` puts Keras' own function back. Everything is in the compiled step:

- every step, a sentinel: is the loss finite, are all weight gradients finite (one reduction per variable);
- every ``every`` steps the record: per node the flow statistics of its output signal and the dead-unit
  fraction of ReLUs; per variable |W| and its gradient's statistics. Written in-graph as TensorBoard scalars and
  histograms per layer, plus one matrix per step that gradscope reads back (``gradscope.core.training_log`` has
  the layout). Whether a step records is decided by its number alone, so a step that does not record costs
  what plain ``fit`` costs (see ``_train_step``).

The first step the sentinel trips is recorded in full, NaN/Inf in every node's forward value and in the batch
included. With ``locate_ops`` (the default) the weights are copied before its update, and the step is replayed
eagerly with the weights it saw: once to record it, once under ``tf.debugging.enable_check_numerics`` to name
the op that made the first NaN/Inf (as TensorBoard Debugger V2 does); that costs two eager steps, once, and one
more set of weights in memory. Without it (``locate_ops=False``, or ``steps_per_execution`` > 1) the compiled
step records it, and every step then holds its signals until the sentinel has run (~5 % of a step).

A model trained through ``plan_model`` is monitored with its plan: the recorded signals are the plan's.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.backend import keras, keras_train_step_internals, tf, unscale_loss_for_distribution
from gradscope.core.errors import GradscopeError
from gradscope.core.training_log import (
    ALERT_TAG,
    CHECKPOINT_TAG,
    LOG_VERSION,
    LOSS_TAG,
    META_TAG,
    NODES_TAG,
    PLUGIN,
    WEIGHTS_TAG,
    tensorboard_tag,
)
from gradscope.engine.backward.stats import magnitude_rows, nan_inf_counts, stats_rows
from gradscope.engine.diagnostics.flow import RELU_ACTIVATIONS
from gradscope.engine.diagnostics.paths import variable_owners
from gradscope.engine.training.event_log import MonitorLog, MonitorWarning, is_write_failure

# check_numerics' message: '!!! Detected Infinity or NaN in output 0 of eagerly-executing op "Exp" ...'
_DETECTED = re.compile(r'Detected (.+?) in output \d+ of .*?op "([^"]+)"')
_VARIABLE = re.compile(r'ResourceHandle\(name="([^"]+)"')


def _metadata(plugin: str = PLUGIN, data_class: int = 2) -> bytes:
    """Summary metadata as TensorBoard's own writers set it (``data_class``: 1 scalar, 2 tensor), serialised.
    Written with the summary op itself, so that recording needs no TensorBoard installed."""
    meta = tf.compat.v1.SummaryMetadata()
    meta.plugin_data.plugin_name = plugin
    meta.plugin_data.content = str(LOG_VERSION).encode() if plugin == PLUGIN else b""
    meta.data_class = data_class
    return meta.SerializeToString()


_BUCKETS = 30


_FRACTIONS = np.linspace(0.0, 1.0, _BUCKETS + 1)  # bucket edges as fractions of the range


def _histogram(values: Any) -> Any:
    """(buckets, 3) [left edge, right edge, count]: TensorBoard's histogram tensor (its writer's layout, 30 equal
    buckets). A tensor with NaN/Inf has no range: its counts are 0 (the records count the NaN/Inf).
    Counted by ``bincount`` of the bucket indices: 2x faster than the ``histogram_fixed_width`` kernel, which
    also refuses NaN (a full-size ``where`` before it cost as much again). Few ops and no tf.cond: ResNet50 has
    ~560 of these in its step, and every op lengthens the first step."""
    v = tf.reshape(values, [-1])
    lo, hi = tf.reduce_min(v), tf.reduce_max(v)
    # min/max may skip a NaN, the sum does not; an empty tensor's max - min is -inf - inf
    usable = tf.logical_and(tf.math.is_finite(hi - lo), tf.math.is_finite(tf.reduce_sum(v)))
    lo = tf.where(usable, lo, 0.0)
    # one value repeated: a range its float can tell apart from lo (lo + 1 == lo for |lo| > 2**24)
    span = tf.where(tf.logical_and(usable, hi > lo), hi - lo, tf.maximum(tf.abs(lo), 1.0))
    # the bucket of each value; the max falls on the right edge, into the last bucket; NaN/Inf (counts 0 then)
    # cast to whatever the CPU makes of them, which the clip keeps in range
    index = tf.clip_by_value(tf.cast((v - lo) * (_BUCKETS / span), tf.int32), 0, _BUCKETS - 1)
    counts = tf.math.bincount(index, minlength=_BUCKETS, maxlength=_BUCKETS) * tf.cast(usable, tf.int32)
    edges = tf.cast(lo, tf.float64) + tf.cast(span, tf.float64) * _FRACTIONS
    return tf.stack([edges[:-1], edges[1:], tf.cast(counts, tf.float64)], axis=1)


def _nonfinite_counts(tensors: list) -> Any:
    """NaN/Inf count of each tensor: one plain sum each (0.8 ms on 4M floats, against 2.6 ms for counting);
    ``nan_inf_counts`` counts only when a sum is not finite."""
    if not tensors:
        return tf.zeros([0])
    tensors = [tf.cast(t, tf.float32) for t in tensors]
    sums = tf.stack([tf.reduce_sum(t) for t in tensors])
    return tf.reduce_sum(nan_inf_counts(tensors, sums), axis=1)


def _dead_fraction(value: Any) -> Any:
    """Fraction of units (last axis) that are 0 for every sample and position (cf. ``flow.dead_unit_fraction``).
    A ReLU's output is >= 0, so "all zero" is "max is 0": one read, no tensor written (2.3 -> 0.6 ms on 4M)."""
    v = tf.reshape(tf.cast(value, tf.float32), [-1, tf.shape(value)[-1]])
    return tf.reduce_mean(tf.cast(tf.equal(tf.reduce_max(v, axis=0), 0.0), tf.float32))


def keras_function(train_function: Any) -> Any:
    """Keras' own train function under any monitors' wrappers (a stale one of a fit that ended by an exception)."""
    while getattr(train_function, "gradscope_monitor", None) is not None:
        train_function = train_function.gradscope_keras_function
    return train_function


def _whole(name: str, value: Any, minimum: int) -> int:
    """A count argument checked before use: ``every=float("nan")`` names ``every``, not int()'s complaint."""
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if number is None or not math.isfinite(number) or number != int(number) or number < minimum:
        raise GradscopeError(f"{name} must be a whole number >= {minimum}; got {value!r}.")
    return int(number)


def _before_weights(graph: Any, nodes: list[str], owners: set[str]) -> list[str]:
    trained: set[str] = set()
    for n in graph.nodes:  # topological order
        if n.id in owners or any(p in trained for p in n.inputs):
            trained.add(n.id)
    return [n for n in nodes if n not in trained]


class GradientMonitor(keras.callbacks.Callback):
    """Record per-layer gradient flow every ``every`` steps of ``fit`` into ``log_dir`` (TensorBoard events).

    ``histograms``: also a histogram per node signal and per weight gradient (TensorBoard's Histograms tab) every
    ``histograms`` records (0: none; they cost as much as the other statistics together: see bench_monitor);
    ``statistics``: "all" (norm, mean|g|, max|g|, zero fraction, NaN/Inf of every node's signal) or
    "magnitude" (norm, max|g|, NaN/Inf: no tensor written, ~1/4 of the cost, for recording every step; the
    report then measures vanishing/exploding by the RMS, norm / sqrt(size), in place of mean|g|);
    ``locate_ops``: record the first non-finite step and find the op of its first NaN/Inf by eager replays
    (see the module docstring).
    """

    def __init__(
        self,
        log_dir: str | Path,
        every: int = 10,
        *,
        histograms: int = 10,
        statistics: str = "all",
        locate_ops: bool = True,
    ):
        super().__init__()
        every = _whole("every", every, 1)
        histograms = _whole("histograms", histograms, 0)
        if statistics not in ("all", "magnitude"):
            raise GradscopeError(f'statistics must be "all" or "magnitude"; got {statistics!r}.')
        self.statistics = statistics
        self.log_dir = Path(log_dir)
        self.every = every
        self.histograms = histograms
        self.locate_ops = locate_ops
        self.alerts: list[dict] = []
        self._log: MonitorLog | None = None
        self._armed = False  # set by this fit's on_train_batch_begin, used up by the step it announces
        self._fit_params: Any = None  # the params dict Keras gave this fit's callbacks (one per fit)

    # ------------------------------------------------------------------------------------------- set-up
    def on_train_begin(self, logs: Any = None) -> None:
        model = self.model
        if type(model).train_step is not keras.Model.train_step:
            raise GradscopeError(
                f"{type(model).__name__} overrides train_step: GradientMonitor runs Keras' standard train step, "
                "so it would not train your model as you wrote it. Use gradscope.gradient_flow on batches instead."
            )
        if getattr(model, "optimizer", None) is None:
            raise GradscopeError("The model is not compiled: call model.compile(optimizer=..., loss=...) first.")
        missing = keras_train_step_internals(model)
        if missing:
            raise GradscopeError(
                f"This Keras ({keras.__version__}) lacks what GradientMonitor runs its train step with "
                f"({', '.join(missing)}); gradscope supports the Keras versions `gradscope --version` names."
            )
        current = model.train_function
        other = getattr(current, "gradscope_monitor", None)
        if other is not None and other is not self and other._fit_params is self.params:
            model.train_function = keras_function(current)  # the fit goes no further; leave Keras' step in place
            raise GradscopeError(
                "Two GradientMonitors in one fit: each runs the train step, so only one can. Pass one monitor "
                "(its every=, histograms= and statistics= set what it records)."
            )
        if not model.trainable_variables:
            warnings.warn(
                f"GradientMonitor: {model.name} has no trainable weights, so fit computes no gradients and there "
                "is nothing to record.",
                MonitorWarning,
                stacklevel=2,
            )
            self._note_failure(model, "the model has no trainable weights: fit computes no gradients to record")
            return
        # A second fit of the same model and optimizer reuses the trace; a recompiled model needs a new one.
        if getattr(self, "_built_for", None) != (model, model.optimizer):
            self._build(model)
        self._fit_params = self.params
        model.train_function = self._attached(keras_function(current))
        self._checkpoints_seen = {p.name for p in self.log_dir.glob("*.keras")}

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._armed = True
        self._note_checkpoints()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._log is not None:
            self._log.flush()  # every FLUSH_EVERY_S, from here: a failure is caught, not raised inside the step

    def _attached(self, keras_step: Any) -> Any:
        """The train function ``fit`` calls while this monitor is attached. It runs the monitored step only when
        this monitor announced it (``on_train_batch_begin`` of the same fit): after a fit that ended by an
        exception or Ctrl-C (Keras then skips ``on_train_end``), the next plain ``fit`` finds it unannounced,
        puts Keras' own function back and runs that: the monitor never outlives its fit."""
        model = self.model

        def train_function(iterator: Any) -> Any:
            if not self._armed:
                self._detach(model)
                return keras_step(iterator)
            self._armed = False
            try:
                return self._train_function(iterator)
            except tf.errors.OpError as exc:  # the writer flushed inside the step (its queue full) and failed
                if self._log is None or not is_write_failure(exc):
                    raise
                self._log.fail(exc)  # recording off: the next steps cannot fail so; this batch was not trained
                return model.get_metrics_result()

        train_function.gradscope_monitor = self  # type: ignore[attr-defined]
        train_function.gradscope_keras_function = keras_step  # type: ignore[attr-defined]
        return train_function

    def _detach(self, model: Any) -> None:
        """Keras' own train function back (if this monitor's is still there), the log flushed."""
        if getattr(model.train_function, "gradscope_monitor", None) is self:
            model.train_function = keras_function(model.train_function)
        self._armed = False
        self._fit_params = None
        if self._log is not None:
            self._log.flush(force=True)

    def _note_failure(self, model: Any, why: str) -> None:
        """A run that records nothing says why in its log (``train-report`` shows it), not only in a warning."""
        log = MonitorLog(self.log_dir)
        meta = {"version": LOG_VERSION, "model_name": model.name, "run": log.run, "nodes": [], "weights": []}
        log.write_json(META_TAG, {**meta, "failure": why}, 0, _metadata())
        log.close()

    def _note_checkpoints(self) -> None:
        """Name the ``.keras`` files that appeared in the log folder since the last step (a ModelCheckpoint's)
        with the last step whose update they hold. Step numbers, not file times: a file system's clock may
        differ from the one that stamps events (20 s apart on this project's machine)."""
        if self._log is None or self._log.failure is not None:
            return
        new = sorted(p.name for p in self.log_dir.glob("*.keras") if p.name not in self._checkpoints_seen)
        if not new:
            return
        step = int(self.model.optimizer.iterations.numpy()) - 1
        for name in new:
            self._log.write_json(CHECKPOINT_TAG, {"name": name}, step, _metadata())
        self._checkpoints_seen.update(new)

    def _build(self, model: Any) -> None:
        from gradscope.engine.backward.runner import Engine
        from gradscope.engine.training.plan_model import PlanModel

        if self._log is not None:
            self._log.close()
        if isinstance(model, PlanModel):
            self._engine, self._rules, plan = model.engine, model._gs.rules, model.plan.to_dict()
        else:
            self._engine, self._rules, plan = Engine(model, strip_softmax=False), {}, None
        engine = self._engine
        self._nodes = list(engine.stat_nodes)
        self._variables = list(model.trainable_variables)
        owners = variable_owners(engine)
        self._relu = [i for i, n in enumerate(self._nodes) if engine.graph.node(n).activation in RELU_ACTIVATIONS]
        # Forward values read for NaN/Inf: not the linear part of a layer with a fused activation ("conv1:pre").
        # Any extra reader of that tensor stops TensorFlow fusing the layer's op with its activation (Conv2D +
        # BiasAdd + Relu), which cost every step, recording or not (demo CNN: 1.16 -> 1.10x at every=10). The
        # activation's value carries a NaN on (ReLU, sigmoid, GELU... propagate it); the report names the layer.
        self._value_checked = [i for i, n in enumerate(self._nodes) if not engine.graph.node(n).fused_activation]
        self._log = log = MonitorLog(self.log_dir)
        self._first_bad = tf.Variable(-1, dtype=tf.int64, trainable=False, name="gradscope_first_bad")
        self._backup = (
            [tf.Variable(v, trainable=False, name="gradscope_backup") for v in self._variables]
            if self.locate_ops
            else []
        )
        graph = engine.graph
        meta = {
            "version": LOG_VERSION,
            "model_name": model.name,
            "run": log.run,
            "every": self.every,
            "statistics": self.statistics,
            "plan": plan,
            "nodes": [
                {
                    "id": n,
                    "layer": graph.node(n).layer_name,
                    "op_type": graph.node(n).op_type,
                    "inputs": list(graph.node(n).inputs),
                    "activation": graph.node(n).activation,
                }
                for n in self._nodes
            ],
            "weights": [
                {"path": v.path, "node": owners.get(id(v)), "shape": [int(d) for d in v.shape]} for v in self._variables
            ],
            "outputs": list(graph.output_ids),
            # nodes no trainable variable acts before: no gradient reaches them in training, by design
            "before_weights": _before_weights(graph, self._nodes, set(owners.values())),
        }
        log.write_json(META_TAG, meta, 0, _metadata())
        self._train_function = self._make_train_function()
        self._built_for = (model, model.optimizer)

    def on_train_end(self, logs: Any = None) -> None:
        """Keras' train function back; the log flushed (the writer stays open for the next fit, whose steps
        continue the log: the compiled step holds it)."""
        self._note_checkpoints()  # the one saved at the last step or epoch end
        self._detach(self.model)

    # ------------------------------------------------------------------------------------------- the step
    def _make_train_function(self) -> Any:
        model = self.model
        # No AutoGraph: the step has no tensor-dependent Python control flow (it branches with tf.cond), and
        # converting it and everything it calls (the engine, Keras' loss) made the first step ~2x slower to trace.
        step_fn = (
            self._train_step
            if model.run_eagerly
            else tf.function(self._train_step, reduce_retracing=True, autograph=False)
        )
        single = model.steps_per_execution == 1 and not tf.distribute.has_strategy()
        if not single:  # Keras' own loop over steps; no replay (the batch is not visible from here)
            self.locate_ops = False
            return model._make_function(self._train_step)

        def function(iterator: Any) -> Any:
            data = next(iterator)
            logs = step_fn(data)
            if self.locate_ops and not self.alerts and int(self._first_bad.numpy()) >= 0:
                self._locate(data)
            return logs

        return function

    def _forward(self, x: Any, on_step: Any = None) -> tuple[Any, dict]:
        from gradscope.engine.training.plan_model import inputs_in_graph_order

        engine = self._engine
        xs = inputs_in_graph_order(engine.graph, x)
        values, node_values = engine._run(xs, self._rules, training=True, on_step=on_step)
        outs = [values[k] for k in engine.exec.output_keys]
        struct = getattr(self.model, "_outputs_struct", None)
        if len(outs) == 1:
            y_pred = outs[0]
        elif struct is not None:
            y_pred = keras.tree.pack_sequence_as(struct, outs)
        else:
            y_pred = outs
        return y_pred, node_values

    def _signals(self, x: Any, y: Any, sample_weight: Any, *, track_loss: bool) -> tuple:
        """(y_pred, loss, node values, node signals, weight gradients) of one step, as Keras' train step computes
        them (the scaled loss differentiated); ``track_loss``: update Keras' loss tracker (not in a replay)."""
        model, variables = self.model, self._variables
        with tf.GradientTape() as tape:
            y_pred, node_values = self._forward(x)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            if track_loss:
                batch = tf.shape(next(i for i in keras.tree.flatten(x) if i is not None))[0]
                model._loss_tracker.update_state(unscale_loss_for_distribution(loss), sample_weight=batch)
            scaled = model.optimizer.scale_loss(loss)
        node_outs = [node_values[n][0] for n in self._nodes]
        grads = tape.gradient(scaled, variables + node_outs)
        return y_pred, loss, node_outs, grads[len(variables) :], grads[: len(variables)]

    def _train_step(self, data: Any) -> Any:
        """Keras' ``train_step`` (TensorFlow backend, 3.x) with every node's output a gradient source."""
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        variables = self._variables
        y_pred, loss, node_outs, node_grads, weight_grads = self._signals(x, y, sample_weight, track_loss=True)

        step = tf.cast(model.optimizer.iterations, tf.int64)
        sentinel = tf.math.is_finite(tf.cast(loss, tf.float32))
        if weight_grads:
            zeros = [tf.reduce_sum(tf.cast(g, tf.float32) * 0.0) for g in weight_grads if g is not None]
            if zeros:
                sentinel = tf.logical_and(sentinel, tf.math.is_finite(tf.add_n(zeros)))
        first_bad = tf.logical_and(tf.logical_not(sentinel), self._first_bad < 0)
        recording = self._log.recording  # off for good after a failed write
        record = tf.logical_and(tf.equal(step % self.every, 0), recording)
        with_histograms = tf.equal(step % (self.every * max(self.histograms, 1)), 0)
        # What a record reads is held until its branch is decided: decided by the step number, it is decided at
        # once, and a step that does not record lets go of its signals as plain fit does. Waiting for the sentinel
        # (the end of the backward pass) held every node's value and signal through the backward pass: demo CNN
        # 1.10 -> 1.04x of plain fit at every=10, 1.23 -> 1.18x at every=1. So the first non-finite step is
        # recorded in full by its replay (_locate), and here only where there is no replay.
        count_values = None
        if not self.locate_ops:
            record = tf.logical_or(record, tf.logical_and(first_bad, recording))
            with_histograms = tf.logical_or(with_histograms, first_bad)
            count_values = first_bad

        # Every step recording: the statistics need not wait for the sentinel either, so each node's run while
        # the backward pass goes on below it.
        early = self._measure(node_outs, node_grads, weight_grads) if self.every == 1 else None

        def write() -> Any:
            measured = early if early is not None else self._measure(node_outs, node_grads, weight_grads)
            self._write(step, loss, measured, node_outs, node_grads, weight_grads, with_histograms, count_values, x)
            return tf.constant(True)

        tf.cond(record, write, lambda: tf.constant(False))
        if self._backup:

            def keep() -> Any:
                for b, v in zip(self._backup, variables):
                    b.assign(v)
                return tf.constant(True)

            tf.cond(first_bad, keep, lambda: tf.constant(False))
        self._first_bad.assign(tf.where(first_bad, step, self._first_bad))
        if variables:
            model.optimizer.apply(weight_grads, variables)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _measure(self, node_outs: list, node_grads: list, weight_grads: list) -> dict:
        """The record's statistics: stateless ops on the step's signals, gradients and weights."""
        filled = [tf.zeros_like(o) if g is None else g for g, o in zip(node_grads, node_outs)]
        variables = self._variables
        wfilled = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(weight_grads, variables)]
        nan = tf.constant(float("nan"))
        dead = [nan] * len(node_outs)
        for i in self._relu:
            dead[i] = _dead_fraction(node_outs[i])
        return {
            "filled": filled,
            "wfilled": wfilled,
            "rows": (stats_rows if self.statistics == "all" else magnitude_rows)(filled),
            "dead": tf.stack(dead) if node_outs else tf.zeros([0]),
            "wrows": stats_rows(wfilled),
            "norms": (
                tf.stack([tf.sqrt(2.0 * tf.nn.l2_loss(tf.cast(v, tf.float32))) for v in variables])
                if variables
                else tf.zeros([0])
            ),
            "wbad": _nonfinite_counts(variables),
        }

    def _write(
        self,
        step: Any,
        loss: Any,
        measured: dict,
        node_outs: list,
        node_grads: list,
        weight_grads: list,
        histograms: Any,
        count_values: Any,
        x: Any,
    ) -> None:
        """The record's events. ``histograms``: whether to write them; ``count_values``: whether to count NaN/Inf
        in the forward values and the batch (None: not counted, 0)."""
        rows, wrows, norms = measured["rows"], measured["wrows"], measured["norms"]
        # sizes from the gradients (same shapes): a size op on a forward value is a reader too (see _build)
        sizes = tf.cast(tf.stack([tf.size(g) for g in measured["filled"]]), tf.float32) if node_outs else tf.zeros([0])
        none = tf.constant([[float(g is None)] for g in node_grads], tf.float32, shape=[len(node_grads), 1])
        # NaN/Inf in forward values: read on the first non-finite step only (the one the report traces back; the
        # sentinel catches every NaN that reaches the loss), not on every record (one more read of every node);
        # NaN for the values not read (see _build).
        checked = [node_outs[i] for i in self._value_checked]
        floats = [t for t in keras.tree.flatten(x) if t is not None and t.dtype.is_floating]  # the batch itself
        if count_values is None:
            counts, data_bad = [tf.constant(0.0)] * len(checked), tf.constant(0.0)
        else:
            counts = tf.unstack(
                tf.cond(count_values, lambda: _nonfinite_counts(checked), lambda: tf.zeros([len(checked)])),
                num=len(checked),
            )
            data_bad = tf.cond(count_values, lambda: tf.reduce_sum(_nonfinite_counts(floats)), lambda: 0.0)
        column = [tf.constant(float("nan"))] * len(node_outs)
        for i, count in zip(self._value_checked, counts):
            column[i] = count
        nonfinite = tf.stack(column) if node_outs else tf.zeros([0])
        nodes = (
            tf.concat([rows, none, nonfinite[:, None], measured["dead"][:, None], sizes[:, None]], axis=1)
            if node_outs
            else None
        )
        variables = self._variables
        wnone = tf.constant([float(g is None) for g in weight_grads], tf.float32, shape=[len(variables)])
        weights = tf.concat([norms[:, None], wrows, wnone[:, None], measured["wbad"][:, None]], axis=1)

        meta = _metadata()
        scalar = _metadata("scalars", 1)
        event = self._log.event
        event(LOSS_TAG, tf.stack([tf.cast(loss, tf.float32), data_bad]), step, meta)
        if nodes is not None:
            event(NODES_TAG, nodes, step, meta)
        event(WEIGHTS_TAG, weights, step, meta)
        event("loss", tf.cast(loss, tf.float32), step, scalar)
        # one unstack, not a slice per node (three constants and an op each, in a step of thousands)
        for n, value in zip(self._nodes, tf.unstack(rows[:, 1]) if node_outs else []):
            event(tensorboard_tag("grad_mean_abs", n), value, step, scalar)
        ratios = tf.unstack(wrows[:, 0] / tf.maximum(norms, 1e-30)) if variables else []
        for v, ratio in zip(variables, ratios):
            event(tensorboard_tag("weight_ratio", v.path), ratio, step, scalar)
        if self.histograms:
            named = [
                (tensorboard_tag("grad", n), g)
                for n, g, raw in zip(self._nodes, measured["filled"], node_grads)
                if raw is not None
            ]
            named += [
                (tensorboard_tag("weight_grad", v.path), g)
                for v, g, raw in zip(variables, measured["wfilled"], weight_grads)
                if raw is not None
            ]
            tf.cond(histograms, lambda: self._write_histograms(named, step), lambda: tf.constant(False))

    def _write_histograms(self, named: list, step: Any) -> Any:
        histogram = _metadata("histograms", 2)
        for tag, values in named:
            self._log.event(tag, _histogram(values), step, histogram)
        return tf.constant(True)

    # ------------------------------------------------------------------------------------------- the NaN's op
    def _record_replay(self, step: int, x: Any, y: Any, sample_weight: Any) -> None:
        """The record of the first non-finite step, from an eager replay with the weights it saw: every statistic,
        the histograms, and the NaN/Inf in each forward value and in the batch. Written when the replay makes the
        NaN/Inf again (a random layer may not); it then stands in for the step's record, if it had one."""
        _, loss, node_outs, node_grads, weight_grads = self._signals(x, y, sample_weight, track_loss=False)
        finite = np.isfinite(float(loss)) and all(
            bool(tf.reduce_all(tf.math.is_finite(g))) for g in weight_grads if g is not None
        )
        if finite:
            return
        measured = self._measure(node_outs, node_grads, weight_grads)
        self._write(
            tf.constant(step, tf.int64),
            loss,
            measured,
            node_outs,
            node_grads,
            weight_grads,
            tf.constant(self.histograms > 0),
            tf.constant(True),
            x,
        )

    def _locate(self, data: Any) -> None:
        """Replay the first non-finite step eagerly, with the weights it saw, under check_numerics."""
        step = int(self._first_bad.numpy())
        alert: dict[str, Any] = {
            "step": step,
            "op": None,
            "variable": None,
            "node": None,
            "phase": None,
            "message": None,
        }
        # every variable as the step left it: the replay runs layers in training mode, so BatchNorm's moving
        # statistics would move a second time; they and the weights are put back afterwards
        everything = list(self.model.variables)
        current = [tf.identity(v) for v in everything]
        where: dict[str, str | None] = {"node": None}

        def on_step(node_id: str) -> None:
            where["node"] = node_id

        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        try:
            for v, b in zip(self._variables, self._backup):
                v.assign(b)
            self._record_replay(step, x, y, sample_weight)
            tf.debugging.enable_check_numerics()
            try:
                with tf.GradientTape() as tape:
                    y_pred, _ = self._forward(x, on_step=on_step)
                    where["node"] = None
                    alert["phase"] = "loss"
                    loss = self.model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
                alert["phase"] = "backward"
                tape.gradient(loss, self._variables)
                alert["phase"] = None
                alert["message"] = "the replay ran without NaN/Inf (a random layer, e.g. dropout, differed)"
            finally:
                tf.debugging.disable_check_numerics()
        except Exception as exc:  # noqa: BLE001 - whatever stopped the replay is what is reported
            text = str(exc)
            found = _DETECTED.search(text)
            alert["op"] = found.group(2) if found else None
            handle = _VARIABLE.search(text) if found and found.group(2) == "ReadVariableOp" else None
            alert["variable"] = handle.group(1).rsplit("/", 1)[0] if handle else None
            if where["node"] is not None and alert["phase"] is None:
                alert["phase"] = "forward"
            alert["node"] = where["node"]
            alert["message"] = f"{found.group(1)} in the output of op {found.group(2)}" if found else text[:300]
        finally:
            for v, c in zip(everything, current):
                v.assign(c)
        if alert["phase"] is None and alert["node"] is None and alert["op"] is None:
            alert["phase"] = "unknown"
        alert["wall_time"] = time.time()
        self.alerts.append(alert)
        if self._log is not None:
            self._log.write_json(ALERT_TAG, alert, step, _metadata())
