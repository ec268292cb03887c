"""``GradientMonitor``: per-layer gradient flow while ``model.fit`` runs, recorded as TensorBoard event files.

    model.fit(x, y, epochs=5, callbacks=[gradscope.GradientMonitor("logs/run1", every=10)])
    # gradscope train-report logs/run1        (or: tensorboard --logdir logs ; gradscope gui --training logs/run1)

A Keras callback cannot see gradients, so at ``on_train_begin`` the monitor swaps the model's train function for
one that runs the same train step (Keras' ``train_step``, step for step: loss, loss tracker, loss scaling,
optimizer, metrics) with the forward pass run node by node by gradscope's engine, so the signal at every node's
output is a gradient source; ``on_train_end`` puts Keras' own function back. Everything is in the compiled step:

- every step, a sentinel: is the loss finite, are all weight gradients finite; it is the sum of squares of each
  gradient (one reduction per variable), so the same reduction gives every step's global and per-variable
  gradient norm, kept as one small event (the loss spikes and clipping of ``train-report``);
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

Where training runs: sparse gradients (an ``Embedding``'s) are measured over the rows the step touched
(``statistics``); under ``tf.distribute`` the records are of the global batch and one replica writes
(``replicas``); with a loss scaler (``mixed_float16``) the statistics are of the unscaled gradients and an update
the scaler skips for an overflow is written as such, not as a NaN.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.backend import (
    keras,
    keras_train_step_internals,
    reduce_per_replica,
    tf,
    unscale_loss_for_distribution,
)
from gradscope.core.display import drawing_function, in_notebook
from gradscope.core.errors import GradscopeError
from gradscope.core.files import shorten
from gradscope.core.training_log import (
    ALERT_TAG,
    CHECKPOINT_TAG,
    LOG_VERSION,
    LOSS_TAG,
    META_TAG,
    NODES_TAG,
    NORMS_TAG,
    OVERFLOW_TAG,
    PLUGIN,
    WEIGHTS_TAG,
    tensorboard_tag,
)
from gradscope.engine.diagnostics.flow import RELU_ACTIVATIONS
from gradscope.engine.diagnostics.paths import variable_owners
from gradscope.engine.training.event_log import MonitorLog, MonitorWarning, is_write_failure
from gradscope.engine.training.node_measures import combined_node_measures, node_measures, node_shard
from gradscope.engine.training.replicas import (
    all_reduced,
    gathered,
    is_chief,
    is_writer,
    local_results,
    optimizer_reduction_off,
    replica_context,
    replica_local_variable,
    strategy_of,
)
from gradscope.engine.training.statistics import (
    dense_signal,
    gradient_norms,
    histogram,
    nonfinite_counts,
    scaled_norm,
    weight_gradient,
    weight_rows,
)


def _metadata(plugin: str = PLUGIN, data_class: int = 2) -> bytes:
    """Summary metadata as TensorBoard's own writers set it (``data_class``: 1 scalar, 2 tensor), serialised.
    Written with the summary op itself, so that recording needs no TensorBoard installed."""
    meta = tf.compat.v1.SummaryMetadata()
    meta.plugin_data.plugin_name = plugin
    meta.plugin_data.content = str(LOG_VERSION).encode() if plugin == PLUGIN else b""
    meta.data_class = data_class
    return meta.SerializeToString()


def _when(condition: Any, write: Any) -> None:
    """Run ``write`` (events) in the compiled step only when ``condition`` holds."""

    def run() -> Any:
        write()
        return tf.constant(True)

    tf.cond(condition, run, lambda: tf.constant(False))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


def keras_function(train_function: Any) -> Any:
    """Keras' own train function under any monitors' wrappers (a stale one of a fit that ended by an exception)."""
    while getattr(train_function, "gradscope_monitor", None) is not None:
        train_function = train_function.gradscope_keras_function
    return train_function


#: Counts the compiled step multiplies (``every`` x ``histograms``) and takes the int64 step number modulo.
MAX_COUNT = 2**30


def _whole(name: str, value: Any, minimum: int) -> int:
    """A count argument checked before use: ``every=float("nan")`` names ``every``, not int()'s complaint, and
    ``every=2**63`` is refused here, not as an OverflowError inside the first step."""
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if number is None or not math.isfinite(number) or number != int(number) or number < minimum:
        raise GradscopeError(f"{name} must be a whole number >= {minimum}; got {value!r}.")
    if number > MAX_COUNT:
        raise GradscopeError(f"{name} must be at most {MAX_COUNT:,} (steps); got {shorten(str(value), 40)}.")
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
    "magnitude" (norm, max|g|, NaN/Inf of every node's signal and every weight gradient: no tensor written,
    ~1/4 of the cost, for recording every step, a language model's above all; the report then measures
    vanishing/exploding by the RMS, norm / sqrt(size), in place of mean|g|);
    ``locate_ops``: record the first non-finite step and find the op of its first NaN/Inf by eager replays
    (see the module docstring);
    ``live``: in a Jupyter notebook, one output redrawn every ``live_every`` records while ``fit`` runs (the loss
    with its spikes, the first NaN and its layer, the per-layer heat map and flow), by a thread that reads the log
    folder (``gradscope.app.display.live``); None (default): on when a notebook kernel runs this.
    """

    def __init__(
        self,
        log_dir: str | Path,
        every: int = 10,
        *,
        histograms: int = 10,
        statistics: str = "all",
        locate_ops: bool = True,
        live: bool | None = None,
        live_every: int = 1,
    ):
        super().__init__()
        every = _whole("every", every, 1)
        self.live_every = _whole("live_every", live_every, 1)
        if live is not None and not isinstance(live, bool):
            raise GradscopeError(f"live must be True, False or None (on in a notebook); got {live!r}.")
        self.live = in_notebook() if live is None else live
        self._live: Any = None
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
        try:
            self._begin(self.model)
        except Exception as exc:
            self._note_failure(self.model, f"the monitor could not start: {_first_line(exc)}")
            raise
        if self.live and self._live is None and getattr(self, "_chief", True):
            live_view = drawing_function("gradscope.app.display.live:LiveTraining")
            self._live = live_view(self.log_dir, every=self.live_every).start()

    def _begin(self, model: Any) -> None:
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
        self._steps_run = 0
        model.train_function = self._attached(keras_function(current))
        self._checkpoints_seen = {p.name for p in self.log_dir.glob("*.keras")}

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._armed = True
        self._note_checkpoints()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._log is not None:
            self._log.queued()  # on disk within FLUSH_WITHIN_S, whether or not another step comes

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
            log = self._log
            try:
                with log.step():
                    logs = self._train_function(iterator)
            except tf.errors.OpError as exc:  # the writer flushed inside the step (its queue full) and failed
                if not is_write_failure(exc):
                    self._note_step_failure(exc)
                    log.flush()
                    raise
                log.fail(exc)  # recording off: the next steps cannot fail so; this batch was not trained
                return model.get_metrics_result()
            except BaseException as exc:  # Ctrl-C too: the records so far go to disk now, not at the next fit
                self._note_step_failure(exc)
                log.flush()
                raise
            self._steps_run += 1
            return logs

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
            self._log.flush()

    def _note_step_failure(self, exc: BaseException) -> None:
        """The first monitored step (its trace: the set-up) failing is written into the log before it is raised."""
        if self._steps_run == 0 and not isinstance(exc, KeyboardInterrupt):
            self._note_failure(self.model, f"the first monitored step failed: {_first_line(exc)}", in_run=True)

    def _note_failure(self, model: Any, why: str, in_run: bool = False) -> None:
        """A run that records nothing says why in its log (``train-report`` shows it), not only in a warning:
        its meta written again with the reason (``in_run``: the reader keeps a run's last), or a run of its own."""
        if not getattr(self, "_chief", True):
            return
        try:
            if in_run and self._log is not None:
                self._log.write_json(META_TAG, {**self._meta, "failure": why}, 0, _metadata())
                return
            log = MonitorLog(self.log_dir)
            meta = {"version": LOG_VERSION, "model_name": model.name, "run": log.run, "nodes": [], "weights": []}
            log.write_json(META_TAG, {**meta, "failure": why}, 0, _metadata())
            log.close()
        except Exception:  # noqa: BLE001 - a log folder that cannot be written: the error raised says enough
            return

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
        self._strategy = strategy = strategy_of(model)
        self._chief = is_chief(strategy)
        optimizer = model.optimizer
        if not optimizer.built:
            # Built before the step is traced, as Keras' symbolic build does when it can: a loss scaler traced
            # unbuilt scales the loss by its initial scale, a constant, while it unscales by its variable.
            with strategy.scope() if strategy is not None else contextlib.nullcontext():
                optimizer.build(self._variables)
        self._loss_scaler = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        self._log = log = MonitorLog(self.log_dir, strategy)
        self._first_bad = replica_local_variable(strategy, -1, "gradscope_first_bad", tf.int64)
        self._backup = (
            [replica_local_variable(strategy, tf.convert_to_tensor(v), "gradscope_backup") for v in self._variables]
            if self.locate_ops
            else []
        )
        clipping = {
            name: float(getattr(optimizer, name))
            for name in ("clipnorm", "global_clipnorm", "clipvalue")
            if getattr(optimizer, name, None)
        }
        graph = engine.graph
        meta = {
            "version": LOG_VERSION,
            "model_name": model.name,
            "run": log.run,
            "every": self.every,
            "statistics": self.statistics,
            "plan": plan,
            "replicas": strategy.num_replicas_in_sync if strategy is not None else 1,
            "strategy": type(strategy).__name__ if strategy is not None else None,
            "loss_scaled": self._loss_scaler,
            "clipping": clipping,
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
        self._meta = meta
        if self._chief:
            log.write_json(META_TAG, meta, 0, _metadata())
        self._train_function = self._make_train_function()
        self._built_for = (model, model.optimizer)

    def on_train_end(self, logs: Any = None) -> None:
        """Keras' train function back; the log flushed (the writer stays open for the next fit, whose steps
        continue the log: the compiled step holds it)."""
        self._note_checkpoints()  # the one saved at the last step or epoch end
        self._detach(self.model)
        live, self._live = self._live, None
        if live is not None:  # the last drawing, with what the fit ended on
            live.stop()

    # ------------------------------------------------------------------------------------------- the step
    def _make_train_function(self) -> Any:
        model, strategy = self.model, self._strategy
        if model.steps_per_execution != 1:  # Keras' own loop over steps; no replay (the batch is not visible here)
            self.locate_ops = False
            return model._make_function(self._train_step)

        def one_step(data: Any) -> Any:
            if strategy is None:
                return self._step(data)
            logs, local_bad = strategy.run(self._step, args=(data,))
            return reduce_per_replica(logs, strategy), local_results(strategy, local_bad)

        # No AutoGraph: the step has no tensor-dependent Python control flow (it branches with tf.cond), and
        # converting it and everything it calls (the engine, Keras' loss) made the first step ~2x slower to trace.
        step_fn = one_step if model.run_eagerly else tf.function(one_step, reduce_retracing=True, autograph=False)

        def function(iterator: Any) -> Any:
            data = next(iterator)
            logs, local_bad = step_fn(data)
            if self.locate_ops and not self.alerts and int(self._first_bad.numpy()) >= 0:
                flags = [bool(np.asarray(f)) for f in (local_bad if strategy is not None else [local_bad])]
                self._locate(data, flags.index(True) if True in flags else 0)
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
        them (the scaled loss differentiated; this replica's); ``track_loss``: update Keras' loss tracker (not in
        a replay)."""
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
        node_grads = [None if g is None else dense_signal(g) for g in grads[len(variables) :]]
        return y_pred, loss, node_outs, node_grads, grads[: len(variables)]

    def _inverse_scale(self) -> Any:
        """1 / the loss scale the step's gradients carry (None: unscaled), read before the update changes it."""
        optimizer = self.model.optimizer
        if self._loss_scaler:
            return 1.0 / tf.cast(tf.convert_to_tensor(optimizer.dynamic_scale), tf.float32)
        factor = getattr(optimizer, "loss_scale_factor", None)
        return tf.constant(1.0 / factor) if factor else None

    def _train_step(self, data: Any) -> Any:
        """Keras' ``train_step`` (TensorFlow backend, 3.x) with every node's output a gradient source."""
        return self._step(data)[0]

    def _step(self, data: Any) -> tuple[Any, Any]:
        """(Keras' logs, whether this replica's own gradient was not finite when the global one was not)."""
        model, variables = self.model, self._variables
        context = replica_context()
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        inverse = self._inverse_scale()
        y_pred, loss, node_outs, node_grads, local_grads = self._signals(x, y, sample_weight, track_loss=True)
        step = tf.cast(model.optimizer.iterations, tf.int64)
        recording = self._log.recording  # off for good after a failed write
        record = tf.logical_and(tf.equal(step % self.every, 0), recording)
        # under a strategy each replica's node statistics travel in the gradients' all-reduce (a collective
        # cannot sit in a cond, and a second one a step cost 5 % of a small model's step); without the replay
        # the first non-finite step records too, which is known only after it: a gather of its own then
        shard = None
        if context is not None and self.locate_ops:
            shard = node_shard(record, node_outs, node_grads, inverse, self._relu, self.statistics)
        reduced, global_loss, shards = all_reduced(context, local_grads, loss, shard)
        wgrads = [weight_gradient(g) for g in reduced]
        norms, grads_finite = gradient_norms(wgrads)  # every step: the sentinel and the spikes' norms
        loss_finite = tf.math.is_finite(tf.cast(global_loss, tf.float32))
        # a loss scaler skips a step whose gradients overflowed: that is its business, not a NaN alert
        sentinel = loss_finite if self._loss_scaler else tf.logical_and(loss_finite, grads_finite)
        overflow = tf.logical_and(loss_finite, tf.logical_not(grads_finite)) if self._loss_scaler else None
        local_bad = tf.constant(False)
        if context is not None:  # which replica's own gradient went bad (only looked at when the global one did)

            def own_gradient_bad() -> Any:
                local = [weight_gradient(g) for g in local_grads]
                finite = gradient_norms(local)[1]
                return tf.logical_not(tf.logical_and(tf.math.is_finite(tf.cast(loss, tf.float32)), finite))

            local_bad = tf.cond(sentinel, lambda: tf.constant(False), own_gradient_bad)

        first_bad = tf.logical_and(tf.logical_not(sentinel), self._first_bad < 0)
        writer = tf.logical_and(is_writer(context), self._chief)
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

        if context is None:
            # every step recording: the statistics need not wait for the sentinel, so each node's run while the
            # backward pass goes on below it
            early = (
                node_measures(node_outs, node_grads, inverse, self._relu, self.statistics) if self.every == 1 else None
            )

            def nodes() -> tuple:
                return (
                    early
                    if early is not None
                    else node_measures(node_outs, node_grads, inverse, self._relu, self.statistics)
                )

        else:  # each replica measures its shard; all of them are gathered (a collective: never inside a cond)
            if shards is None:
                shards = gathered(
                    context, node_shard(record, node_outs, node_grads, inverse, self._relu, self.statistics)
                )
            gathered_nodes = combined_node_measures(shards, node_outs, self._relu)

            def nodes() -> tuple:
                return gathered_nodes

        def write() -> Any:
            rows, sizes, dead = nodes()
            wrows, wextra = weight_rows(wgrads, variables, inverse, statistics=self.statistics)
            measured = {"rows": rows, "sizes": sizes, "dead": dead, "wrows": wrows, "wextra": wextra}
            if count_values is not None:
                measured["nonfinite"] = tf.cond(
                    count_values, lambda: self.value_counts(node_outs), lambda: self._uncounted(len(node_outs))
                )
            self._write(step, global_loss, measured, node_outs, node_grads, wgrads, inverse, with_histograms)
            self._write_loss(step, global_loss, count_values, node_outs, x)
            return tf.constant(True)

        tf.cond(tf.logical_and(record, writer), write, lambda: tf.constant(False))
        self._write_step_norms(step, global_loss, norms, inverse, tf.logical_and(recording, writer))
        if overflow is not None:
            self._write_overflow(step, inverse, tf.logical_and(overflow, tf.logical_and(recording, writer)))
        if self._backup:

            def keep() -> Any:
                for b, v in zip(self._backup, variables):
                    b.assign(v)
                return tf.constant(True)

            tf.cond(first_bad, keep, lambda: tf.constant(False))
        self._first_bad.assign(tf.where(first_bad, step, self._first_bad))
        if variables:
            with optimizer_reduction_off(model.optimizer, context):
                model.optimizer.apply(reduced, variables)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight), local_bad

    def _write(
        self,
        step: Any,
        loss: Any,
        measured: dict,
        node_outs: list,
        node_grads: list,
        wgrads: list,
        inverse: Any,
        histograms: Any,
    ) -> None:
        """The record's events but its loss (``_write_loss``). ``histograms``: whether to write them;
        ``measured["nonfinite"]``: NaN/Inf counted in each forward value (absent: none counted)."""
        rows, wrows, wextra = measured["rows"], measured["wrows"], measured["wextra"]
        none = tf.constant([[float(g is None)] for g in node_grads], tf.float32, shape=[len(node_grads), 1])
        nonfinite = measured.get("nonfinite")
        if nonfinite is None:
            nonfinite = self._uncounted(len(node_outs))
        nodes = (
            tf.concat([rows, none, nonfinite[:, None], measured["dead"][:, None], measured["sizes"][:, None]], axis=1)
            if node_outs
            else None
        )
        variables = self._variables
        wnone = tf.constant([float(g.values is None) for g in wgrads], tf.float32, shape=[len(variables)])
        # WEIGHT_COLUMNS: |W|, the gradient's statistics, none, NaN/Inf in W, |W| over the rows touched, rows
        weights = tf.concat(
            [wextra[:, 0:1], wrows, wnone[:, None], wextra[:, 3:4], wextra[:, 1:2], wextra[:, 2:3]], axis=1
        )

        meta = _metadata()
        scalar = _metadata("scalars", 1)
        event = self._log.event
        if nodes is not None:
            event(NODES_TAG, nodes, step, meta)
        event(WEIGHTS_TAG, weights, step, meta)
        event("loss", tf.cast(loss, tf.float32), step, scalar)
        # one unstack, not a slice per node (three constants and an op each, in a step of thousands)
        for n, value in zip(self._nodes, tf.unstack(rows[:, 1], num=len(node_outs)) if node_outs else []):
            event(tensorboard_tag("grad_mean_abs", n), value, step, scalar)
        ratios = tf.unstack(wrows[:, 0] / tf.maximum(wextra[:, 1], 1e-30), num=len(variables)) if variables else []
        for v, ratio in zip(variables, ratios):
            event(tensorboard_tag("weight_ratio", v.path), ratio, step, scalar)
        if self.histograms:
            named = [(tensorboard_tag("grad", n), g) for n, g in zip(self._nodes, node_grads) if g is not None]
            named += [
                (tensorboard_tag("weight_grad", v.path), g.values)
                for v, g in zip(variables, wgrads)
                if g.values is not None
            ]
            tf.cond(histograms, lambda: self._write_histograms(named, step, inverse), lambda: tf.constant(False))

    def _write_loss(self, step: Any, loss: Any, count: Any, node_outs: list, x: Any) -> None:
        """The record's loss and the NaN/Inf in the batch; on the first non-finite step where no replay records it
        (``count``, None: never), also the NaN/Inf in each forward value, written after the nodes' matrix (the
        reader keeps the last of a step). Forward values are read on that step only (the one the report traces
        back; the sentinel catches every NaN that reaches the loss), not on every record (one more read of every
        node); NaN for the values not read (see _build)."""
        data_bad = tf.constant(0.0)
        if count is not None:
            floats = [t for t in keras.tree.flatten(x) if t is not None and t.dtype.is_floating]  # the batch itself
            data_bad = tf.cond(count, lambda: tf.reduce_sum(nonfinite_counts(floats)), lambda: 0.0)
        self._log.event(LOSS_TAG, tf.stack([tf.cast(loss, tf.float32), data_bad]), step, _metadata())

    def _uncounted(self, n: int) -> Any:
        """The NaN/Inf column of a record that counted none: 0 for the values it reads, NaN for the others."""
        return tf.constant([0.0 if i in self._value_checked else float("nan") for i in range(n)], tf.float32, [n])

    def value_counts(self, node_outs: list) -> Any:
        """(n,) NaN/Inf in each node's forward value (NaN: a value not read, see _build)."""
        checked = nonfinite_counts([node_outs[i] for i in self._value_checked])
        column = [tf.constant(float("nan"))] * len(node_outs)
        for i, c in zip(self._value_checked, tf.unstack(checked, num=len(self._value_checked))):
            column[i] = c
        return tf.stack(column) if node_outs else tf.zeros([0])

    def _write_histograms(self, named: list, step: Any, inverse: Any) -> Any:
        histogram_meta = _metadata("histograms", 2)
        for tag, values in named:
            values = tf.cast(values, tf.float32)
            self._log.event(tag, histogram(values if inverse is None else values * inverse), step, histogram_meta)
        return tf.constant(True)

    def _write_step_norms(self, step: Any, loss: Any, norms: Any, inverse: Any, write: Any) -> None:
        """Every step: [loss, global norm, each variable's norm] of the gradients the optimizer gets (unscaled)."""
        if inverse is not None:
            norms = norms * inverse
        finite = tf.reduce_all(tf.math.is_finite(norms))
        whole = tf.where(finite, scaled_norm(tf.where(finite, norms, 0.0)), tf.sqrt(tf.reduce_sum(tf.square(norms))))
        row = tf.concat([[tf.cast(loss, tf.float32), whole], norms], axis=0)
        _when(write, lambda: self._log.event(NORMS_TAG, row, step, _metadata()))

    def _write_overflow(self, step: Any, inverse: Any, skipped: Any) -> None:
        """A step the loss scaler skips: the scale it had (the report counts them; not a NaN alert)."""
        _when(skipped, lambda: self._log.event(OVERFLOW_TAG, tf.reshape(1.0 / inverse, [1]), step, _metadata()))

    # ------------------------------------------------------------------------------------------- the NaN's op
    def _locate(self, data: Any, replica: int) -> None:
        """Replay the first non-finite step eagerly (``replica``'s shard of it), with the weights it saw."""
        from gradscope.engine.training.replay import locate_first_nonfinite

        if self._strategy is not None:
            data = local_results(self._strategy, data)[replica]
        alert = locate_first_nonfinite(self, data)
        alert["replica"] = replica if self._strategy is not None else None
        alert["wall_time"] = time.time()
        self.alerts.append(alert)
        if self._log is not None:
            self._log.write_json(ALERT_TAG, alert, alert["step"], _metadata())
