"""Issue 49 (2): the training report says what happened near float32's limits. A finite gradient whose squares
overflow float32 is not a NaN; a run that went NaN does not read as one whose loss ended at its last finite value;
a recorded step is never said to have fallen between records; no random layer is invented."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import keras, tf
from gradscope.core.training_log import ALERT_TAG
from gradscope.engine.training.monitor import GradientMonitor, _metadata
from gradscope.engine.training.replay import _not_made_again
from gradscope.engine.training.report import report_text, training_alerts
from gradscope.io.training_events import read_training_log
from tests.engine.training.test_plan_model import batch, mlp


def _huge_inputs_model(lr: float) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(lr), "mse")
    return model


def test_finite_gradients_whose_squares_overflow_are_no_nan(tmp_path):
    """Inputs of 1e12: the loss (~1e24) and every gradient (~1e25) are finite, their squares are not. The fit
    equals a plain one, no step is reported non-finite, and the global norm is the gradient's true norm."""
    x = np.random.default_rng(0).uniform(size=(16, 8)).astype("float32") * 1e12
    y = np.zeros((16, 2), "float32")
    model = _huge_inputs_model(1e-40)  # the weights stay put: every step sees the first step's gradient
    with tf.GradientTape() as tape:
        loss = keras.losses.mean_squared_error(y[:8], model(x[:8]))
        loss = tf.reduce_mean(loss)
    grads = tape.gradient(loss, model.trainable_variables)
    squares = sum(float(np.sum(np.square(g.numpy().astype(np.float64)))) for g in grads)
    assert squares > float(np.finfo(np.float32).max) and all(np.isfinite(g.numpy()).all() for g in grads)
    monitor = GradientMonitor(tmp_path, every=1)
    monitored = model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[monitor])
    plain = _huge_inputs_model(1e-40).fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert monitored.history["loss"] == plain.history["loss"]
    log = read_training_log(tmp_path)
    assert all(r.finite for r in log.records) and log.alerts == []
    assert not [a for a in training_alerts(log) if a.kind == "nonfinite"]
    assert log.norms.global_norm[0] == pytest.approx(np.sqrt(squares), rel=1e-4)


def test_a_run_that_went_nan_says_where_its_finite_losses_end(tmp_path):
    x, y = batch()
    model = mlp()
    model.compile(keras.optimizers.SGD(1e10), "mse")
    model.fit(x, y, batch_size=2, epochs=3, verbose=0, callbacks=[GradientMonitor(tmp_path, every=1)])
    log = read_training_log(tmp_path)
    finite = [r.step for r in log.records if np.isfinite(r.loss)]
    later = [r.step for r in log.records if r.step > finite[-1]]
    assert later, "the learning rate of 1e10 was meant to make the run NaN"
    text = report_text(log, training_alerts(log))
    assert f"(step {finite[-1]}), then NaN/Inf in the {len(later)} later record(s)" in text


def test_a_recorded_step_is_never_said_to_have_fallen_between_records(tmp_path):
    """The sentinel's alert for a step whose record is finite (its replay ran clean) says both, and no more."""
    x, y = batch()
    model = mlp()
    model.compile(keras.optimizers.SGD(0.01), "mse")
    monitor = GradientMonitor(tmp_path, every=2)
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[monitor])
    alert = {"step": 2, "op": None, "variable": None, "node": None, "phase": None}
    alert["message"] = _not_made_again(model, 2)
    monitor._log.write_json(ALERT_TAG, alert, 2, _metadata())
    log = read_training_log(tmp_path)
    (found,) = [a for a in training_alerts(log) if a.kind == "nonfinite"]
    assert found.first_step == 2 and "fell between records" not in found.detail
    assert "the step's record is finite" in found.detail and "no random layer" in found.detail
    assert "dropout" not in found.detail


def test_the_replay_names_the_random_layers_a_model_has():
    keras.utils.set_random_seed(1)
    inp = keras.Input((4,))
    out = keras.layers.Dense(2)(keras.layers.Dropout(0.5, name="drop")(keras.layers.Dense(3)(inp)))
    said = _not_made_again(keras.Model(inp, out), 7)
    assert "step 7" in said and "drop draw random numbers" in said
    assert "no random layer" in _not_made_again(mlp(), 7)
