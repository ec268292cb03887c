"""GradientMonitor: training is unchanged, the records are the true per-layer gradients (NumPy reference), the
event files are TensorBoard's, NaNs are found where they start, and the log is readable while it grows."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradscope.backend import keras
from gradscope.core.errors import GradscopeError, InputError
from gradscope.core.training_log import NODE_COLUMNS
from gradscope.engine.training.monitor import GradientMonitor
from gradscope.engine.training.plan_model import plan_model
from gradscope.engine.training.report import report_text, step_flow, training_alerts
from gradscope.io.training_events import TrainingLogReader, read_training_log
from tests.engine.training.test_plan_model import (
    LR,
    SIGMOID_BACKWARD,
    batch,
    mlp,
    mlp_backward,
    numpy_sgd_delta,
    relu_prime,
    sigmoid_prime,
)

ROOT = Path(__file__).resolve().parents[3]


def compiled(model: keras.Model) -> keras.Model:
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    return model


def reference_signals(weights, x, y, derivative) -> dict[str, np.ndarray]:
    """dL/d(node output) of ``mlp``'s MSE in float64: the signal at each node."""
    return {k: v for k, v in mlp_backward(weights, x, y, derivative).items() if k not in ("x", "a1", "a2")}


def test_monitored_fit_trains_exactly_like_plain_fit(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 2)).astype("float32")
    results = []
    for monitor in (None, GradientMonitor(tmp_path / "log", every=3)):
        model = compiled(mlp())
        history = model.fit(
            x, y, epochs=2, batch_size=16, shuffle=False, verbose=0, callbacks=[monitor] if monitor else []
        )
        results.append(([w.numpy() for w in model.weights], history.history["loss"]))
    (w_plain, loss_plain), (w_mon, loss_mon) = results
    for a, b in zip(w_plain, w_mon):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(loss_plain, loss_mon, rtol=1e-6)
    assert read_training_log(tmp_path / "log").steps == [0, 3, 6]  # 8 steps, every 3


@pytest.mark.parametrize("planned", [False, True], ids=["plain", "plan"])
def test_records_match_a_numpy_reference(tmp_path, planned):
    x, y = batch()
    model = compiled(mlp())
    weights = [w.numpy() for w in model.trainable_weights]
    derivative = sigmoid_prime if planned else relu_prime
    trained = compiled(plan_model(model, SIGMOID_BACKWARD)) if planned else model
    trained.fit(x, y, epochs=1, batch_size=8, verbose=0, callbacks=[GradientMonitor(tmp_path, every=1)])

    log = read_training_log(tmp_path)
    assert [n.id for n in log.nodes] == ["h1:pre", "h1", "h2", "relu2", "out"]
    record = log.record(0)
    signals = reference_signals(weights, x, y, derivative)
    col = {c: i for i, c in enumerate(NODE_COLUMNS)}
    for i, node in enumerate(log.nodes):
        g = signals[node.id]
        row = record.nodes[i]
        np.testing.assert_allclose(row[col["grad_mean_abs"]], np.abs(g).mean(), rtol=1e-4)
        np.testing.assert_allclose(row[col["grad_norm"]], np.linalg.norm(g), rtol=1e-4)
        np.testing.assert_allclose(row[col["grad_max_abs"]], np.abs(g).max(), rtol=1e-4)
        assert row[col["grad_none"]] == 0
        if node.id == "h1:pre":  # a fused activation's linear part: not read (TensorFlow fuses it), not counted
            assert np.isnan(row[col["value_nonfinite"]])
        else:
            assert row[col["value_nonfinite"]] == 0
    expected = [-d / LR for d in numpy_sgd_delta(weights, x, y, derivative)]
    np.testing.assert_allclose(record.weight_column("grad_norm"), [np.linalg.norm(g) for g in expected], rtol=1e-4)
    np.testing.assert_allclose(record.weight_column("norm"), [np.linalg.norm(w) for w in weights], rtol=1e-5)
    z1 = x.astype(np.float64) @ weights[0] + weights[1]
    dead = np.all(z1 <= 0, axis=0).mean()  # units of h1 that are 0 for the whole batch
    np.testing.assert_allclose(record.nodes[1, col["dead_fraction"]], dead)
    assert log.plan == (SIGMOID_BACKWARD.to_dict() if planned else None)
    flow = step_flow(log, 0)
    assert [r.node for r in flow.rows] == [n.id for n in log.nodes]
    assert "note" not in flow.meta
    tiny = np.array([1e-12 if c in ("grad_mean_abs", "grad_norm", "grad_max_abs") else 1.0 for c in NODE_COLUMNS])
    quiet = dataclasses.replace(record, loss=0.0, nodes=record.nodes * tiny)
    fitted = step_flow(log, quiet)  # a fitted step: tiny gradients are the loss's doing, as gradient_flow says
    assert "already fitted" in fitted.meta["note"]
    assert not any({"vanishing", "zero_gradient", "weights_zero_gradient"} & set(r.flags) for r in fitted.rows)
    assert flow.loss_value == pytest.approx(float(np.mean((keras_predict(model, weights, x) - y) ** 2)), rel=1e-5)


def keras_predict(model, weights, x):
    w1, b1, w2, b2, w3, b3 = weights
    return np.maximum(np.maximum(x @ w1 + b1, 0) @ w2 + b2, 0) @ w3 + b3


def test_tensorboard_reads_the_scalars_and_histograms(tmp_path):
    pea = pytest.importorskip("tensorboard.backend.event_processing.plugin_event_accumulator")
    x, y = batch()
    model = compiled(mlp())
    model.fit(x, y, epochs=3, batch_size=4, verbose=0, callbacks=[GradientMonitor(tmp_path, every=2)])
    acc = pea.EventAccumulator(str(tmp_path), size_guidance={pea.TENSORS: 0})
    acc.Reload()
    scalars, histograms = acc.PluginTagToContent("scalars"), acc.PluginTagToContent("histograms")
    assert {"loss", "grad_mean_abs/h1_pre", "weight_ratio/h1/kernel"} <= set(scalars)
    assert {"grad/h1_pre", "weight_grad/out/kernel"} <= set(histograms)
    log = read_training_log(tmp_path)
    loss_steps = [e.step for e in acc.Tensors("loss")]
    assert loss_steps == log.steps == [0, 2, 4]
    from gradscope.backend import tf

    mean_abs = [float(tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors("grad_mean_abs/h1_pre")]
    np.testing.assert_allclose(mean_abs, log.matrix("grad_mean_abs")[0], rtol=1e-6)
    hist = tf.make_ndarray(acc.Tensors("grad/h1_pre")[0].tensor_proto)
    assert hist.shape[1] == 3 and hist[:, 2].sum() == 4 * 6  # every value of the (4, 6) signal, once
    assert np.all(hist[1:, 0] >= hist[:-1, 0])
    reader = TrainingLogReader(tmp_path)
    reader.update()
    assert np.array_equal(reader.histogram("grad/h1_pre", 0), hist)


def test_the_reader_waits_for_a_record_cut_short(tmp_path):
    x, y = batch()
    model = compiled(mlp())
    model.fit(x, y, epochs=2, batch_size=4, verbose=0, callbacks=[GradientMonitor(tmp_path / "full", every=1)])
    (events,) = (tmp_path / "full").glob("events.out.tfevents.*")
    data = events.read_bytes()
    growing = tmp_path / "growing"
    growing.mkdir()
    target = growing / events.name
    reader = TrainingLogReader(growing)
    assert not reader.update()
    with pytest.raises(InputError, match="no gradscope training log yet"):
        reader.log()
    cut = len(data) * 2 // 3 + 5  # somewhere inside a record
    target.write_bytes(data[:cut])
    assert reader.update()
    partial = reader.log().steps
    with target.open("ab") as f:
        f.write(data[cut:])
    assert reader.update()
    assert len(partial) < len(reader.log().steps) == 4
    assert reader.log().steps == read_training_log(tmp_path / "full").steps


def test_train_function_is_restored_and_misuse_is_refused(tmp_path):
    x, y = batch()
    model = compiled(mlp())
    model.fit(x, y, epochs=1, verbose=0, callbacks=[GradientMonitor(tmp_path, every=1)])
    keras_function = model.train_function
    model.fit(x, y, epochs=1, verbose=0)
    assert model.train_function is keras_function
    assert len(read_training_log(tmp_path).records) == 1  # the second fit was not monitored
    with pytest.raises(GradscopeError, match="every must be a whole number >= 1"):
        GradientMonitor(tmp_path, every=0)
    uncompiled = GradientMonitor(tmp_path / "uncompiled")
    uncompiled.set_model(mlp())
    with pytest.raises(GradscopeError, match="not compiled"):
        uncompiled.on_train_begin()

    class OwnStep(keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    inp = keras.Input((4,))
    own = OwnStep(inp, keras.layers.Dense(2)(inp))
    own.compile(optimizer="sgd", loss="mse")
    with pytest.raises(GradscopeError, match="overrides train_step"):
        own.fit(x, y, epochs=1, verbose=0, callbacks=[GradientMonitor(tmp_path / "own")])


def _demo(case: str, logdir: Path, **kwargs):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import training_demos
    finally:
        sys.path.pop(0)
    return training_demos.run(case, logdir, **kwargs)


def test_blowup_demo_first_nan_is_found_with_its_op(tmp_path):
    _demo("blowup", tmp_path, epochs=1, images=256, every=4)
    log = read_training_log(tmp_path)
    alerts = training_alerts(log)
    nan = [a for a in alerts if a.kind == "nonfinite"]
    assert len(nan) == 1
    first = nan[0]
    earlier = [r for r in log.records if r.step < first.first_step]
    assert earlier and all(r.finite for r in earlier)  # the records before the alert are finite
    assert not log.record(first.first_step).finite  # the first bad step is recorded though every=4
    assert first.node in {n.id for n in log.nodes} and first.op  # a layer, and the op the replay found
    assert "exploding" in {a.kind for a in alerts}
    done = subprocess.run(
        [sys.executable, "-m", "gradscope", "train-report", str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 1, done.stderr
    assert f"[nonfinite] from step {first.first_step} at {first.node}" in done.stdout
    assert "epoch-01-batch-002.keras" in {p.name for p in tmp_path.glob("*.keras")}  # saved every 2 steps


def test_vanishing_demo_is_reported_and_exits_0(tmp_path):
    _demo("vanishing", tmp_path, epochs=1, images=64, every=1)
    log = read_training_log(tmp_path)
    alerts = training_alerts(log)
    assert not [a for a in alerts if a.kind == "nonfinite"]
    vanishing = {a.node for a in alerts if a.kind == "vanishing"}
    assert {"dense1:pre", "dense1", "dense2:pre"} <= vanishing
    assert not {"dense16", "logits"} & vanishing  # the top of the stack still gets its signal
    assert "flatten" in log.before_weights and not [a for a in alerts if a.kind == "no_gradient"]
    assert "[vanishing] from step 0 at dense1:pre" in report_text(log, alerts)
    from gradscope.cli import main

    assert main(["train-report", str(tmp_path), "--step", str(log.steps[-1])]) == 0


def test_magnitude_statistics_are_exact_and_stand_in_for_mean_abs(tmp_path):
    x, y = batch()
    model = compiled(mlp())
    weights = [w.numpy() for w in model.trainable_weights]
    monitor = GradientMonitor(tmp_path, every=1, statistics="magnitude")
    model.fit(x, y, epochs=1, batch_size=8, verbose=0, callbacks=[monitor])
    log = read_training_log(tmp_path)
    assert log.statistics == "magnitude"
    record = log.record(0)
    col = {c: i for i, c in enumerate(NODE_COLUMNS)}
    signals = reference_signals(weights, x, y, relu_prime)
    for i, node in enumerate(log.nodes):
        g = signals[node.id]
        np.testing.assert_allclose(record.nodes[i, col["grad_norm"]], np.linalg.norm(g), rtol=1e-4)
        np.testing.assert_allclose(record.nodes[i, col["grad_max_abs"]], np.abs(g).max(), rtol=1e-4)
        assert np.isnan(record.nodes[i, col["grad_mean_abs"]]) and record.nodes[i, col["size"]] == g.size
        rms = np.sqrt(np.mean(g**2))
        np.testing.assert_allclose(log.matrix("grad_mean_abs")[i, 0], rms, rtol=1e-4)
        np.testing.assert_allclose(step_flow(log, 0).rows[i].grad_mean_abs, rms, rtol=1e-4)
    with pytest.raises(GradscopeError, match="statistics must be"):
        GradientMonitor(tmp_path, statistics="some")


def test_histogram_counts_like_numpy_and_survives_odd_tensors():
    from gradscope.engine.training.statistics import histogram as _histogram

    values = np.random.default_rng(3).normal(size=(64, 9)).astype("float32")
    hist = _histogram(values).numpy()
    counts, edges = np.histogram(values, bins=30, range=(values.min(), values.max()))
    np.testing.assert_allclose(hist[:, 0], edges[:-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hist[:, 1], edges[1:], rtol=1e-5, atol=1e-6)
    assert abs(hist[:, 2] - counts).sum() <= 2 and hist[:, 2].sum() == values.size  # edge values may swap buckets
    assert _histogram(np.full(7, 1e20, np.float32)).numpy()[:, 2].sum() == 7  # one value, far from 0
    for odd in (np.array([np.nan, 1.0], np.float32), np.zeros(0, np.float32), np.array([np.inf], np.float32)):
        assert _histogram(odd).numpy()[:, 2].sum() == 0  # NaN/Inf are counted by the records, not here


def test_the_nan_replay_leaves_training_as_it_was(tmp_path):
    """A NaN in the data at step 2: the replay runs layers in training mode (BatchNorm moves its statistics),
    yet the model ends exactly as without the replay; the op is named."""

    def build():
        keras.utils.set_random_seed(5)
        inp = keras.Input((4,))
        h = keras.layers.Dense(8, name="d1")(inp)
        h = keras.layers.BatchNormalization(name="bn")(h)
        out = keras.layers.Dense(2, name="d2")(keras.layers.ReLU(name="r")(h))
        return compiled(keras.Model(inp, out))

    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(32, 4)).astype("float32"), rng.normal(size=(32, 2)).astype("float32")
    x[9, 2] = np.nan  # batch size 4: step 2
    finals = []
    for locate in (False, True):
        model = build()
        monitor = GradientMonitor(tmp_path / str(locate), every=100, locate_ops=locate)
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[monitor])
        finals.append([v.numpy() for v in model.variables])
    for a, b in zip(*finals):
        np.testing.assert_array_equal(a, b)
    assert len(monitor.alerts) == 1 and monitor.alerts[0]["step"] == 2
    assert monitor.alerts[0]["op"] and monitor.alerts[0]["node"] == "d1"  # the first layer reads the NaN
    log = read_training_log(tmp_path / "True")
    assert log.steps == [0, 2]  # every=100, and the first non-finite step
    (alert,) = [a for a in training_alerts(log) if a.kind == "nonfinite"]
    assert alert.first_step == 2 and alert.op == monitor.alerts[0]["op"]


@pytest.mark.parametrize("locate_ops", [True, False], ids=["replayed", "in-graph"])
def test_a_nan_in_a_fused_layer_is_named_by_its_layer(tmp_path, locate_ops):
    """The linear part of ``Dense(activation="relu")`` is not read in training (TensorFlow fuses it with its
    activation); an Inf made there shows in the activation's value, and the report names the layer and its weights.
    (Inf, not NaN: oneDNN's fused ReLU turns a NaN into 0, on some CPUs, in a plain fit as well.) The forward
    values are counted by the step's replay (which then stands in for its record), or in the step without one."""
    model = compiled(mlp())
    bias = model.get_layer("h1").bias
    bias.assign(np.where(np.arange(6) == 2, np.inf, bias.numpy()).astype("float32"))
    x, y = batch()
    model.fit(
        x, y, epochs=1, batch_size=8, verbose=0, callbacks=[GradientMonitor(tmp_path, every=5, locate_ops=locate_ops)]
    )
    log = read_training_log(tmp_path)
    nodes = {n.id: i for i, n in enumerate(log.nodes)}
    values = log.record(0).node_column("value_nonfinite")
    assert np.isnan(values[nodes["h1:pre"]]) and values[nodes["h1"]] == 8  # one unit, 8 samples
    (alert,) = [a for a in training_alerts(log) if a.kind == "nonfinite"]
    assert alert.node == "h1" and alert.first_step == 0
    assert "layer h1 (Dense + relu)" in alert.detail and bias.path in alert.detail


def test_a_non_finite_step_its_replay_did_not_make_again_is_still_reported(tmp_path):
    """A NaN/Inf the sentinel saw between records, whose replay (e.g. another dropout mask) ran finite, has no
    record: the report still names its step from the replay's alert, and train-report exits 1."""
    from gradscope.cli import main
    from gradscope.core.training_log import ALERT_TAG
    from gradscope.engine.training.monitor import _metadata

    x, y = batch()
    model = compiled(mlp())
    monitor = GradientMonitor(tmp_path, every=5)
    model.fit(x, y, epochs=8, batch_size=8, verbose=0, callbacks=[monitor])
    assert not [a for a in training_alerts(read_training_log(tmp_path)) if a.kind == "nonfinite"]
    alert = {"step": 3, "op": None, "variable": None, "node": None, "phase": None}
    alert["message"] = "the replay ran without NaN/Inf (a random layer, e.g. dropout, differed)"
    monitor._log.write_json(ALERT_TAG, alert, 3, _metadata())  # as GradientMonitor._locate writes it
    log = read_training_log(tmp_path)
    assert log.steps == [0, 5] and all(r.finite for r in log.records)
    (found,) = [a for a in training_alerts(log) if a.kind == "nonfinite"]
    assert found.first_step == 3 and "dropout" in found.detail and "not recorded" in found.detail
    assert "[nonfinite] from step 3:" in report_text(log, training_alerts(log))
    assert main(["train-report", str(tmp_path)]) == 1


def test_another_model_in_the_same_folder_replaces_the_records_and_alerts(tmp_path):
    x, y = batch()
    broken = compiled(mlp())
    bias = broken.get_layer("h1").bias
    bias.assign(np.where(np.arange(6) == 2, np.inf, bias.numpy()).astype("float32"))
    broken.fit(x, y, epochs=1, batch_size=8, verbose=0, callbacks=[GradientMonitor(tmp_path, every=5)])
    assert read_training_log(tmp_path).alerts  # the replay's
    keras.utils.set_random_seed(3)
    inp = keras.Input((4,), name="x")
    other = compiled(keras.Model(inp, keras.layers.Dense(2, name="only")(inp)))
    other.fit(x, y, epochs=2, batch_size=8, verbose=0, callbacks=[GradientMonitor(tmp_path, every=1)])
    log = read_training_log(tmp_path)
    assert [n.id for n in log.nodes] == ["only"] and log.steps == [0, 1]
    assert log.alerts == [] and not [a for a in training_alerts(log) if a.kind == "nonfinite"]
