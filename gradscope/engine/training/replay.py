"""The first non-finite step replayed eagerly, with the weights it saw: recorded in full, then once more under
``tf.debugging.enable_check_numerics`` to name the op that made the first NaN/Inf (as TensorBoard Debugger V2
does). Under ``tf.distribute`` the replay runs the shard of the replica whose own gradient went bad."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from gradscope.backend import keras, quiet_native_stderr, tf
from gradscope.engine.training.node_measures import node_measures
from gradscope.engine.training.statistics import weight_gradient, weight_rows

# check_numerics' message: '!!! Detected Infinity or NaN in output 0 of eagerly-executing op "Exp" ...'
_DETECTED = re.compile(r'Detected (.+?) in output \d+ of .*?op "([^"]+)"')
_VARIABLE = re.compile(r'ResourceHandle\(name="([^"]+)"')


def _record_replay(monitor: Any, step: int, x: Any, y: Any, sample_weight: Any) -> None:
    """The record of the first non-finite step: every statistic, the histograms, and the NaN/Inf in each forward
    value and in the batch. Written when the replay makes the NaN/Inf again (a random layer may not); it then
    stands in for the step's record, if it had one."""
    _, loss, node_outs, node_grads, weight_grads = monitor._signals(x, y, sample_weight, track_loss=False)
    finite = np.isfinite(float(loss)) and all(
        bool(tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(g)))) for g in weight_grads if g is not None
    )
    if finite:
        return
    inverse = monitor._inverse_scale()
    rows, sizes, dead = node_measures(node_outs, node_grads, inverse, monitor._relu, monitor.statistics)
    wgrads = [weight_gradient(g) for g in weight_grads]
    wrows, wextra = weight_rows(wgrads, monitor._variables, inverse, statistics=monitor.statistics)
    measured = {
        "rows": rows,
        "sizes": sizes,
        "dead": dead,
        "wrows": wrows,
        "wextra": wextra,
        "nonfinite": monitor.value_counts(node_outs),
    }
    at = tf.constant(step, tf.int64)
    monitor._write(at, loss, measured, node_outs, node_grads, wgrads, inverse, tf.constant(monitor.histograms > 0))
    monitor._write_loss(at, loss, tf.constant(True), node_outs, x)


def _not_made_again(model: Any, step: int) -> str:
    """Why an eager replay of a non-finite step can run clean, as far as the model tells: its random layers drew
    other numbers, or (none) the compiled step and the eager replay round differently near float32's limits."""
    random = [layer.name for layer in model._flatten_layers(include_self=False) if hasattr(layer, "seed_generator")]
    said = f"its eager replay with the weights and batch of step {step} made no NaN/Inf"
    if random:
        return f"{said}; {', '.join(random[:4])} draw random numbers, which differed in the replay"
    return (
        f"{said}, and the model has no random layer: the compiled step rounds differently from the eager replay, "
        "so a value of that step sat at the edge of float32's range (see the step's norms)"
    )


def locate_first_nonfinite(monitor: Any, data: Any) -> dict[str, Any]:
    """Replay the first non-finite step with the weights it saw (the monitor's backup), record it, and find the
    op of its first NaN/Inf under check_numerics; every variable is put back as the step left it."""
    model = monitor.model
    step = int(monitor._first_bad.numpy())
    alert: dict[str, Any] = {"step": step, "op": None, "variable": None, "node": None, "phase": None, "message": None}
    # every variable as the step left it: the replay runs layers in training mode, so BatchNorm's moving
    # statistics would move a second time; they and the weights are put back afterwards
    everything = list(model.variables)
    current = [tf.identity(v) for v in everything]
    where: dict[str, str | None] = {"node": None}

    def on_step(node_id: str) -> None:
        where["node"] = node_id

    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    try:
        for v, b in zip(monitor._variables, monitor._backup):
            v.assign(tf.convert_to_tensor(b))
        _record_replay(monitor, step, x, y, sample_weight)
        logger = tf.get_logger()
        level = logger.level
        logger.setLevel("WARNING")  # not "Enabled check-numerics callback" in the user's output (or notebook)
        tf.debugging.enable_check_numerics()
        try:
            # the abort is an exception here; TensorFlow also logs it from C++ (a red block under a notebook cell)
            with quiet_native_stderr():
                with tf.GradientTape() as tape:
                    y_pred, _ = monitor._forward(x, on_step=on_step)
                    where["node"] = None
                    alert["phase"] = "loss"
                    loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
                alert["phase"] = "backward"
                tape.gradient(loss, monitor._variables)
            alert["phase"] = None
            alert["message"] = _not_made_again(model, step)
        finally:
            tf.debugging.disable_check_numerics()
            logger.setLevel(level)
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
    return alert
