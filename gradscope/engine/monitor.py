"""``GradientMonitor``: per-layer gradient flow while ``model.fit`` runs, recorded as TensorBoard event files.

    model.fit(x, y, epochs=5, callbacks=[gradscope.GradientMonitor("logs/run1", every=10)])
    # gradscope train-report logs/run1        (or: tensorboard --logdir logs ; gradscope gui --training logs/run1)

A Keras callback cannot see gradients, so at ``on_train_begin`` the monitor swaps the model's train function for
one that runs the same train step (Keras' ``train_step``, step for step: loss, loss tracker, loss scaling,
optimizer, metrics) with the forward pass run node by node by gradscope's engine, so the signal at every node's
output is a gradient source; ``on_train_end`` puts Keras' own function back. Everything is in the compiled step:

- every step, a sentinel: is the loss finite, are all weight gradients finite (one reduction per variable);
- every ``every`` steps, and on the first step the sentinel trips, the record: per node the flow statistics of
  its output signal, NaN/Inf in its forward value and the dead-unit fraction of ReLUs; per variable |W| and its
  gradient's statistics. Written in-graph as TensorBoard scalars and histograms per layer, plus one matrix per
  step that gradscope reads back (``gradscope.core.training_log`` has the layout).

With ``locate_ops`` (the default) the weights are copied before the update of the first non-finite step, and
that step is replayed eagerly with the weights it saw under ``tf.debugging.enable_check_numerics`` to name the
op that made the first NaN/Inf (as TensorBoard Debugger V2 does); the replay costs one eager step, once; the
copy costs one more set of weights in memory.

A model trained through ``plan_model`` is monitored with its plan: the recorded signals are the plan's.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from gradscope.backend import keras, tf
from gradscope.core.errors import GradscopeError
from gradscope.core.training_log import (
    ALERT_TAG,
    LOG_VERSION,
    LOSS_TAG,
    META_TAG,
    NODES_TAG,
    PLUGIN,
    WEIGHTS_TAG,
)
from gradscope.engine.paths import variable_owners
from gradscope.engine.stats import stats_rows

_RELU_ACTIVATIONS = ("relu", "relu6")
_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_./-]")
# check_numerics' message: '!!! Detected Infinity or NaN in output 0 of eagerly-executing op "Exp" ...'
_DETECTED = re.compile(r'Detected (.+?) in output \d+ of .*?op "([^"]+)"')
_VARIABLE = re.compile(r'ResourceHandle\(name="([^"]+)"')


def _tag(text: str) -> str:
    return _TAG_UNSAFE.sub("_", text)


def _metadata(plugin: str = PLUGIN, data_class: int = 2) -> Any:
    """Summary metadata as TensorBoard's own writers set it (``data_class``: 1 scalar, 2 tensor). Written with
    ``tf.summary.write`` so that recording needs no TensorBoard installed (``tf.summary.scalar`` does)."""
    meta = tf.compat.v1.SummaryMetadata()
    meta.plugin_data.plugin_name = plugin
    meta.plugin_data.content = str(LOG_VERSION).encode() if plugin == PLUGIN else b""
    meta.data_class = data_class
    return meta


_BUCKETS = 30


def _histogram(values: Any) -> Any:
    """(buckets, 3) [left edge, right edge, count] of the finite values: TensorBoard's histogram tensor (its own
    writer's layout, 30 equal buckets; counted with bincount, not its one-hot, which needs 30 floats a value)."""
    v = tf.reshape(tf.cast(values, tf.float64), [-1])
    v = tf.boolean_mask(v, tf.math.is_finite(v))

    def buckets() -> Any:
        lo, hi = tf.reduce_min(v), tf.reduce_max(v)
        width = tf.maximum((hi - lo) / _BUCKETS, 1e-300)
        index = tf.minimum(tf.cast(tf.floor((v - lo) / width), tf.int32), _BUCKETS - 1)
        counts = tf.cast(tf.math.bincount(index, minlength=_BUCKETS, maxlength=_BUCKETS), tf.float64)
        edges = lo + width * tf.range(_BUCKETS + 1, dtype=tf.float64)
        return tf.stack([edges[:-1], edges[1:], counts], axis=1)

    return tf.cond(tf.size(v) > 0, buckets, lambda: tf.zeros([0, 3], tf.float64))


def _nonfinite(t: Any) -> Any:
    t = tf.cast(t, tf.float32)
    return tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(t)), tf.float32))


def _dead_fraction(value: Any) -> Any:
    """Fraction of units (last axis) that are 0 for every sample and position (cf. ``flow.dead_unit_fraction``)."""
    v = tf.reshape(tf.cast(value, tf.float32), [-1, tf.shape(value)[-1]])
    dead = tf.reduce_all(tf.equal(v, 0.0), axis=0)
    return tf.reduce_mean(tf.cast(dead, tf.float32))


def _before_weights(graph: Any, nodes: list[str], owners: set[str]) -> list[str]:
    trained: set[str] = set()
    for n in graph.nodes:  # topological order
        if n.id in owners or any(p in trained for p in n.inputs):
            trained.add(n.id)
    return [n for n in nodes if n not in trained]


class GradientMonitor(keras.callbacks.Callback):
    """Record per-layer gradient flow every ``every`` steps of ``fit`` into ``log_dir`` (TensorBoard events).

    ``histograms``: also a histogram per node signal and per weight gradient (TensorBoard's Histograms tab);
    ``locate_ops``: find the op of the first NaN/Inf by an eager replay (see the module docstring).
    """

    def __init__(self, log_dir: str | Path, every: int = 10, *, histograms: bool = True, locate_ops: bool = True):
        super().__init__()
        if int(every) < 1:
            raise GradscopeError(f"every must be 1 or more (record every N steps); got {every}.")
        self.log_dir = Path(log_dir)
        self.every = int(every)
        self.histograms = histograms
        self.locate_ops = locate_ops
        self.alerts: list[dict] = []
        self._saved_function: Any = None
        self._writer: Any = None

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
        from gradscope.engine.runner import Engine
        from gradscope.engine.training import PlanModel

        if isinstance(model, PlanModel):
            self._engine, self._rules, plan_name = model.engine, model._gs.rules, model.plan.describe()
        else:
            self._engine, self._rules, plan_name = Engine(model, strip_softmax=False), {}, None
        engine = self._engine
        self._nodes = list(engine.stat_nodes)
        self._variables = list(model.trainable_variables)
        owners = variable_owners(engine)
        self._relu = [i for i, n in enumerate(self._nodes) if engine.graph.node(n).activation in _RELU_ACTIVATIONS]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = tf.summary.create_file_writer(str(self.log_dir))
        self._step_before = tf.Variable(-1, dtype=tf.int64, trainable=False, name="gradscope_last_step")
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
            "every": self.every,
            "plan": plan_name,
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
                {"path": v.path, "node": owners.get(id(v)), "shape": [int(d) for d in v.shape]}
                for v in self._variables
            ],
            "outputs": list(graph.output_ids),
            # nodes no trainable variable acts before: no gradient reaches them in training, by design
            "before_weights": _before_weights(graph, self._nodes, set(owners.values())),
        }
        with self._writer.as_default():
            tf.summary.write(META_TAG, tf.constant(json.dumps(meta)), step=0, metadata=_metadata())
        self._writer.flush()
        self._saved_function = model.train_function
        model.train_function = self._make_train_function()

    def on_train_end(self, logs: Any = None) -> None:
        if self._saved_function is not None:
            self.model.train_function = self._saved_function
            self._saved_function = None
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
        self._backup = []

    # ------------------------------------------------------------------------------------------- the step
    def _make_train_function(self) -> Any:
        model = self.model
        step_fn = self._train_step if model.run_eagerly else tf.function(self._train_step, reduce_retracing=True)
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

    def _forward(self, x: Any) -> tuple[Any, dict]:
        engine = self._engine
        xs = [tf.convert_to_tensor(t) for t in keras.tree.flatten(x)]
        values, node_values = engine._run(xs, self._rules, training=True)
        outs = [values[k] for k in engine.exec.output_keys]
        struct = getattr(self.model, "_outputs_struct", None)
        if len(outs) == 1:
            y_pred = outs[0]
        elif struct is not None:
            y_pred = keras.tree.pack_sequence_as(struct, outs)
        else:
            y_pred = outs
        return y_pred, node_values

    def _loss(self, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> Any:
        from keras.src.losses.loss import unscale_loss_for_distribution

        model = self.model
        loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
        batch = tf.shape(next(i for i in keras.tree.flatten(x) if i is not None))[0]
        model._loss_tracker.update_state(unscale_loss_for_distribution(loss), sample_weight=batch)
        return loss

    def _train_step(self, data: Any) -> Any:
        """Keras' ``train_step`` (TensorFlow backend, 3.x) with every node's output a gradient source."""
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        variables = self._variables
        with tf.GradientTape() as tape:
            y_pred, node_values = self._forward(x)
            loss = self._loss(x, y, y_pred, sample_weight)
            scaled = model.optimizer.scale_loss(loss)
        node_outs = [node_values[n][0] for n in self._nodes]
        grads = tape.gradient(scaled, variables + node_outs)
        weight_grads, node_grads = grads[: len(variables)], grads[len(variables) :]

        step = tf.cast(model.optimizer.iterations, tf.int64)
        sentinel = tf.math.is_finite(tf.cast(loss, tf.float32))
        if weight_grads:
            zeros = [tf.reduce_sum(tf.cast(g, tf.float32) * 0.0) for g in weight_grads if g is not None]
            if zeros:
                sentinel = tf.logical_and(sentinel, tf.math.is_finite(tf.add_n(zeros)))
        first_bad = tf.logical_and(tf.logical_not(sentinel), self._first_bad < 0)
        record = tf.logical_or(tf.equal(step % self.every, 0), first_bad)

        def write() -> Any:
            self._write(step, loss, node_outs, node_grads, weight_grads)
            return tf.constant(True)

        tf.cond(record, write, lambda: tf.constant(False))
        if self._backup:

            def keep() -> Any:
                for b, v in zip(self._backup, variables):
                    b.assign(v)
                return tf.constant(True)

            tf.cond(first_bad, keep, lambda: tf.constant(False))
        self._first_bad.assign(tf.where(first_bad, step, self._first_bad))
        self._step_before.assign(step)
        if variables:
            model.optimizer.apply(weight_grads, variables)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _write(self, step: Any, loss: Any, node_outs: list, node_grads: list, weight_grads: list) -> None:
        filled = [tf.zeros_like(o) if g is None else g for g, o in zip(node_grads, node_outs)]
        rows = stats_rows(filled)
        none = tf.constant([[float(g is None)] for g in node_grads], tf.float32, shape=[len(node_grads), 1])
        nonfinite = tf.stack([_nonfinite(o) for o in node_outs]) if node_outs else tf.zeros([0])
        dead = [float("nan")] * len(node_outs)
        dead_t = [tf.constant(d) for d in dead]
        for i in self._relu:
            dead_t[i] = _dead_fraction(node_outs[i])
        nodes = tf.concat([rows, none, nonfinite[:, None], tf.stack(dead_t)[:, None]], axis=1) if node_outs else None

        variables = self._variables
        wfilled = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(weight_grads, variables)]
        wrows = stats_rows(wfilled)
        norms = tf.stack([tf.norm(tf.cast(v, tf.float32)) for v in variables]) if variables else tf.zeros([0])
        wnone = tf.constant([float(g is None) for g in weight_grads], tf.float32, shape=[len(variables)])
        wbad = tf.stack([_nonfinite(v) for v in variables]) if variables else tf.zeros([0])
        weights = tf.concat([norms[:, None], wrows, wnone[:, None], wbad[:, None]], axis=1)

        meta = _metadata()
        with self._writer.as_default(step=step):
            tf.summary.write(LOSS_TAG, tf.cast(loss, tf.float32), metadata=meta)
            if nodes is not None:
                tf.summary.write(NODES_TAG, nodes, metadata=meta)
            tf.summary.write(WEIGHTS_TAG, weights, metadata=meta)
            scalar, histogram = _metadata("scalars", 1), _metadata("histograms", 2)
            tf.summary.write("loss", tf.cast(loss, tf.float32), metadata=scalar)
            for i, n in enumerate(self._nodes):
                tf.summary.write(f"grad_mean_abs/{_tag(n)}", rows[i, 1], metadata=scalar)
                if self.histograms and node_grads[i] is not None:
                    tf.summary.write(f"grad/{_tag(n)}", _histogram(filled[i]), metadata=histogram)
            for i, v in enumerate(variables):
                ratio = wrows[i, 0] / tf.maximum(norms[i], 1e-30)
                tf.summary.write(f"weight_ratio/{_tag(v.path)}", ratio, metadata=scalar)
                if self.histograms and weight_grads[i] is not None:
                    tf.summary.write(f"weight_grad/{_tag(v.path)}", _histogram(wfilled[i]), metadata=histogram)

    # ------------------------------------------------------------------------------------------- the NaN's op
    def _locate(self, data: Any) -> None:
        """Replay the first non-finite step eagerly, with the weights it saw, under check_numerics."""
        step = int(self._first_bad.numpy())
        alert: dict[str, Any] = {"step": step, "op": None, "variable": None, "node": None, "phase": None, "message": None}
        current = [tf.identity(v) for v in self._variables]
        where: dict[str, str | None] = {"node": None}

        def on_step(node_id: str) -> None:
            where["node"] = node_id

        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        try:
            for v, b in zip(self._variables, self._backup):
                v.assign(b)
            tf.debugging.enable_check_numerics()
            try:
                with tf.GradientTape() as tape:
                    xs = [tf.convert_to_tensor(t) for t in keras.tree.flatten(x)]
                    values, _ = self._engine._run(xs, self._rules, training=True, on_step=on_step)
                    outs = [values[k] for k in self._engine.exec.output_keys]
                    y_pred = outs[0] if len(outs) == 1 else outs
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
            for v, c in zip(self._variables, current):
                v.assign(c)
        if alert["phase"] is None and alert["node"] is None and alert["op"] is None:
            alert["phase"] = "unknown"
        alert["wall_time"] = time.time()
        self.alerts.append(alert)
        if self._writer is not None:
            with self._writer.as_default():
                tf.summary.write(ALERT_TAG, tf.constant(json.dumps(alert)), step=step, metadata=_metadata())
            self._writer.flush()
