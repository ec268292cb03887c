"""GradientMonitor where training really happens: sparse gradients (Embedding, keras_hub token embeddings), causal
language models opened block by block, mixed precision (unscaled statistics, skipped steps), loss spikes and
clipping from every step's norms, and runs that stop before their first record. MirroredStrategy:
test_monitor_distributed.py. References: a plain GradientTape on the same weights (SGD with learning rate 0 keeps
them), never the monitor's own numbers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from gradscope.backend import keras
from gradscope.cli import main
from gradscope.engine.training.monitor import GradientMonitor
from gradscope.engine.training.report import report_text, training_alerts
from gradscope.engine.training.spikes import clipped_steps, loss_spikes
from gradscope.io.training_events import read_training_log

ROOT = Path(__file__).resolve().parents[3]
VOCAB, WIDTH, LENGTH = 64, 16, 8


def text_classifier(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((LENGTH,), dtype="int32"),
            keras.layers.Embedding(VOCAB, WIDTH, name="embedding"),
            keras.layers.GlobalAveragePooling1D(name="pool"),
            keras.layers.Dense(3, name="logits"),
        ],
        name="text",
    )


def token_batch(n: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, (n, LENGTH)).astype("int32"), rng.integers(0, 3, n).astype("int32")


def weight_row(log, record, path_part: str) -> dict[str, float]:
    i = next(i for i, w in enumerate(log.weights) if path_part in w.path)
    from gradscope.core.training_log import WEIGHT_COLUMNS

    return {name: float(record.weight_column(name)[i]) for name in WEIGHT_COLUMNS}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_an_embedding_model_trains_and_its_sparse_gradient_is_measured_over_the_rows_touched(tmp_path, optimizer):
    x, y = token_batch()
    model = text_classifier()
    opt = keras.optimizers.SGD(0.0) if optimizer == "sgd" else keras.optimizers.Adam(0.0)
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # the reference: a plain tape at the same weights (learning rate 0 keeps them), the dense gradient
    first = x[:16]
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y[:16], model(first))
    table = model.get_layer("embedding").embeddings
    sparse = tape.gradient(loss, table)
    assert isinstance(sparse, tf.IndexedSlices)  # what crashed the monitor
    dense = tf.convert_to_tensor(sparse).numpy()
    rows = np.unique(first)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[GradientMonitor(tmp_path, every=1)])
    log = read_training_log(tmp_path)
    assert log.steps == [0, 1] and not training_alerts(log)
    row = weight_row(log, log.records[0], "embedding")
    assert row["rows_touched"] == len(rows)
    np.testing.assert_allclose(row["grad_norm"], np.linalg.norm(dense), rtol=1e-5)
    np.testing.assert_allclose(row["grad_max_abs"], np.abs(dense).max(), rtol=1e-5)
    # mean |g| and the zero fraction over the rows touched, not the vocabulary
    np.testing.assert_allclose(row["grad_mean_abs"], np.abs(dense[rows]).mean(), rtol=1e-5)
    w = table.numpy()
    np.testing.assert_allclose(row["norm"], np.linalg.norm(w), rtol=1e-5)
    np.testing.assert_allclose(row["norm_touched"], np.linalg.norm(w[rows]), rtol=1e-5)
    dense_row = weight_row(log, log.records[0], "logits/kernel")
    assert np.isnan(dense_row["rows_touched"]) and dense_row["norm_touched"] == dense_row["norm"]
    # the per-step norms are the same gradient's
    np.testing.assert_allclose(log.norms.variables[0][0], np.linalg.norm(dense), rtol=1e-5)
    # the update ratio of the report is against the rows touched
    from gradscope.engine.training.report import step_flow

    wf = next(wf for wf in step_flow(log, 0).weights if "embedding" in wf.path)
    np.testing.assert_allclose(wf.ratio, np.linalg.norm(dense) / np.linalg.norm(w[rows]), rtol=1e-5)


def test_a_gather_of_a_node_and_histograms_of_sparse_gradients(tmp_path):
    """A node read by a gather gets a sparse signal; the embedding's histogram covers its rows touched."""
    keras.utils.set_random_seed(1)
    tokens = keras.Input((LENGTH,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, WIDTH, name="embedding")(tokens)
    last = keras.layers.Lambda(lambda t: tf.gather(t, [LENGTH - 1], axis=1)[:, 0], name="last")(h)
    model = keras.Model(tokens, keras.layers.Dense(3, name="logits")(last))
    model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = token_batch()
    monitor = GradientMonitor(tmp_path, every=1, histograms=1)
    model.fit(x, y, batch_size=16, shuffle=False, verbose=0, callbacks=[monitor])
    log = read_training_log(tmp_path)
    assert len(log.records) == 2 and all(r.finite for r in log.records)
    from gradscope.io.training_events import TrainingLogReader

    reader = TrainingLogReader(tmp_path)
    reader.update()
    hist = reader.histogram("weight_grad/embedding/embeddings", 0)
    # the lookup's gradient has a row for every token of the batch (zeros where only the last position reads)
    assert hist is not None and hist[:, 2].sum() == len(np.unique(x[:16])) * WIDTH


@pytest.mark.parametrize("family", ["llama3", "gpt2"])  # untied (sparse) and tied (dense) token embeddings
def test_a_causal_language_model_fine_tunes_with_its_blocks_open(tmp_path, family):
    from tests.engine.backward.language_models import V, tiny_causal_lm

    lm = tiny_causal_lm(family)
    lm.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[],
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(1, V, (8, 9)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones((8, 8), "int32")}
    lm.fit(x, ids[:, 1:], batch_size=4, verbose=0, callbacks=[GradientMonitor(tmp_path, every=1)])
    log = read_training_log(tmp_path)
    assert log.steps == [0, 1] and not [a for a in training_alerts(log) if a.kind == "nonfinite"]
    inside = [n.id for n in log.nodes if "/" in n.id]  # nodes inside the decoder blocks
    assert len(inside) > 10, [n.id for n in log.nodes]
    signal = log.records[0].node_column("grad_norm")
    assert np.isfinite(signal).all() and (signal[[log.node_index(n) for n in inside]] > 0).any()
    row = weight_row(log, log.records[0], "token_embedding")
    if family == "llama3":  # untied: the lookup's gradient is sparse, its rows are the tokens of the batch
        assert row["rows_touched"] == len(np.unique(ids[:4, :-1]))
    else:  # tied to the head: dense
        assert np.isnan(row["rows_touched"])
    assert row["grad_norm"] > 0 and np.isfinite(row["grad_norm"])


def _mixed(policy: str):
    class Policy:
        def __enter__(self):
            self.before = keras.mixed_precision.dtype_policy()
            keras.mixed_precision.set_dtype_policy(policy)

        def __exit__(self, *exc):
            keras.mixed_precision.set_dtype_policy(self.before)

    return Policy()


def mlp3(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(16, activation="relu", name="hidden"), keras.layers.Dense(3, name="out")]
    )


def test_mixed_precision_records_unscaled_statistics(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 4)).astype("float32"), rng.integers(0, 3, 32)
    records = {}
    for policy in ("float32", "mixed_float16"):
        with _mixed(policy):
            model = mlp3()
            model.compile(keras.optimizers.SGD(0.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            if policy == "mixed_float16":
                assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
            folder = tmp_path / policy
            model.fit(x, y, batch_size=16, verbose=0, callbacks=[GradientMonitor(folder, every=1)])
        log = read_training_log(folder)
        records[policy] = (log, log.records[0])
    (log32, r32), (log16, r16) = records["float32"], records["mixed_float16"]
    for column in ("grad_norm", "grad_mean_abs", "grad_max_abs"):
        np.testing.assert_allclose(r16.node_column(column), r32.node_column(column), rtol=2e-2)
        np.testing.assert_allclose(r16.weight_column(column), r32.weight_column(column), rtol=2e-2)
    np.testing.assert_allclose(log16.norms.global_norm, log32.norms.global_norm, rtol=2e-2)
    assert not training_alerts(log16)  # the scaled statistics were flagged "exploding"


def test_a_step_the_loss_scaler_skips_is_an_overflow_not_a_nan(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 3, 64)
    with _mixed("mixed_float16"):
        model = mlp3()
        # a scale of 2**40 overflows float16 in the backward pass: the scaler halves it and skips the update
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**40)
        model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[GradientMonitor(tmp_path, every=1)])
    log = read_training_log(tmp_path)
    scales = [scale for _, scale in log.overflows]
    assert len(log.overflows) >= 20 and scales[:3] == [2.0**40, 2.0**39, 2.0**38]
    assert int(model.optimizer.iterations.numpy()) == 32 - len(log.overflows)  # skipped, as Keras counts
    assert not [a for a in training_alerts(log) if a.kind == "nonfinite"]
    text = report_text(log, training_alerts(log))
    assert f"The loss scaler skipped {len(log.overflows)} update(s)" in text
    assert main(["train-report", str(tmp_path)]) == 0


def spike_data(n_steps: int = 40, at: int = 30, factor: float = 300.0):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n_steps * 8, 4)).astype("float32")
    y = rng.normal(size=(n_steps * 8, 3)).astype("float32")
    x[at * 8 : at * 8 + 8] *= factor
    return x, y


def test_a_loss_spike_is_flagged_with_the_layers_that_rose(tmp_path, capsys):
    x, y = spike_data()
    model = mlp3()
    model.compile(keras.optimizers.SGD(1e-6), "mse")  # small steps: the spike does not derail the training after it
    # the reference for the first step's norm: a plain tape at the initial weights
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y[:8], model(x[:8]))
    grads = tape.gradient(loss, model.trainable_weights)
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=[GradientMonitor(tmp_path, every=10)])
    log = read_training_log(tmp_path)
    assert len(log.records) == 4 and len(log.norms) == 40  # the norms of every step, records every 10
    np.testing.assert_allclose(log.norms.variables[0], [np.linalg.norm(g) for g in grads], rtol=1e-5)
    np.testing.assert_allclose(log.norms.global_norm[0], np.sqrt(sum(np.sum(g**2) for g in grads)), rtol=1e-5)
    spikes = loss_spikes(log)
    assert [s.step for s in spikes] == [30]
    spike = spikes[0]
    assert spike.factor > 5 and {layer for layer, _ in spike.layers} == {"hidden", "out"}
    rises = [r for _, r in spike.layers]
    assert rises == sorted(rises, reverse=True) and min(rises) > 5  # each layer against its own running median
    alerts = training_alerts(log)
    assert [a.first_step for a in alerts if a.kind == "spike"] == [30]
    assert main(["train-report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[spike] step 30: global gradient norm" in out and f"rose most: {spike.layers[0][0]}" in out
    assert main(["train-report", str(tmp_path), "--spike", "1e9"]) == 0
    assert "[spike]" not in capsys.readouterr().out
    assert main(["train-report", str(tmp_path), "--spike", "0.5"]) == 2
    assert "--spike must be a number above 1" in capsys.readouterr().err


@pytest.mark.parametrize(("kind", "limit", "all_clipped"), [("global_clipnorm", 1e-9, True), ("clipnorm", 1e9, False)])
def test_clipping_is_counted(tmp_path, capsys, kind, limit, all_clipped):
    x, y = spike_data(n_steps=12, at=5, factor=1.0)
    model = mlp3()
    model.compile(keras.optimizers.SGD(1e-3, **{kind: limit}), "mse")
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=[GradientMonitor(tmp_path, every=5)])
    log = read_training_log(tmp_path)
    what, steps = clipped_steps(log)
    assert what == f"{kind}={limit:g}" and steps == (list(range(12)) if all_clipped else [])
    assert main(["train-report", str(tmp_path)]) == 0
    assert f"{kind}={limit:g} clipped {12 if all_clipped else 0} of 12 steps" in capsys.readouterr().out


def test_a_run_whose_first_step_fails_says_so_and_train_report_exits_2(tmp_path, capsys):
    model = mlp3()
    model.compile(keras.optimizers.SGD(0.1), "mse")
    x = np.zeros((16, 4), "float32")
    with pytest.raises(Exception):  # noqa: B017 - Keras' own error for mismatched shapes
        model.fit(x, np.zeros((16, 5), "float32"), verbose=0, callbacks=[GradientMonitor(tmp_path)])
    assert main(["train-report", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "Nothing recorded: the first monitored step failed:" in out


def test_a_run_whose_process_died_before_its_first_record_says_so(tmp_path, capsys):
    script = f"""
import os, sys
sys.path.insert(0, {str(ROOT)!r})
import numpy as np
from gradscope.backend import keras
from gradscope.engine.training.monitor import GradientMonitor

class Die(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        os._exit(3)  # killed before the first step ran: no record, no reason written

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
model.compile("sgd", "mse")
model.fit(np.zeros((8, 4)), np.zeros((8, 2)), verbose=0, callbacks=[GradientMonitor({str(tmp_path)!r}), Die()])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr[-2000:]
    assert main(["train-report", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "Nothing recorded: the run stopped before its first record: its process" in out and "ended" in out


def test_a_run_still_starting_is_not_called_stopped(tmp_path, capsys):
    from gradscope.engine.training.event_log import MonitorLog
    from gradscope.engine.training.monitor import _metadata

    log = MonitorLog(tmp_path)  # this process: alive
    log.write_json(
        "gradscope/meta", {"version": 2, "model_name": "m", "run": log.run, "nodes": [], "weights": []}, 0, _metadata()
    )
    log.close()
    assert main(["train-report", str(tmp_path)]) == 0
    assert "No step recorded yet (the run is starting)." in capsys.readouterr().out


def test_magnitude_statistics_measure_the_weight_gradients_cheaply_too(tmp_path):
    x, y = token_batch()
    model = text_classifier()
    model.compile(keras.optimizers.SGD(0.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    monitor = GradientMonitor(tmp_path, every=1, statistics="magnitude")
    model.fit(x, y, batch_size=16, shuffle=False, verbose=0, callbacks=[monitor])
    log = read_training_log(tmp_path)
    record = log.records[0]
    assert np.isnan(record.weight_column("grad_mean_abs")).all()  # not measured: no tensor written
    from gradscope.engine.training.report import step_flow

    flows = {wf.path: wf for wf in step_flow(log, 0).weights}
    kernel = next(wf for path, wf in flows.items() if "logits/kernel" in path)
    np.testing.assert_allclose(kernel.grad_mean_abs, kernel.grad_norm / np.sqrt(WIDTH * 3), rtol=1e-6)  # the RMS
    table = next(wf for path, wf in flows.items() if "embedding" in path)
    touched = weight_row(log, record, "embedding")["rows_touched"]
    np.testing.assert_allclose(table.grad_mean_abs, table.grad_norm / np.sqrt(touched * WIDTH), rtol=1e-6)
