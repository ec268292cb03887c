"""Run by test_monitor_distributed.py in a process of its own (logical devices are fixed before TensorFlow starts):
the same models and batches trained on one device and under MirroredStrategy over two logical CPUs, each with a
GradientMonitor; prints what the test compares as JSON.

    python tests/engine/training/distributed_run.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from gradscope.backend import keras  # noqa: E402
from gradscope.core.training_log import WEIGHT_COLUMNS  # noqa: E402
from gradscope.engine.training.monitor import GradientMonitor  # noqa: E402
from gradscope.engine.training.report import report_text, training_alerts  # noqa: E402
from gradscope.io.training_events import read_training_log  # noqa: E402


def mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu", name="hidden"), keras.layers.Dense(2, name="out")]
    )


def text() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((6,), dtype="int32"),
            keras.layers.Embedding(32, 8, name="embedding"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(3, name="logits"),
        ]
    )


def train(build, loss, x, y, folder: Path, strategy=None, lr: float = 0.0) -> dict:
    """Fit one epoch (global batch 16, not shuffled) with a monitor recording every step; its log read back."""
    scope = strategy.scope() if strategy is not None else tf.name_scope("one_device")
    with scope:
        model = build()
        model.compile(keras.optimizers.SGD(lr), loss)
    monitor = GradientMonitor(folder, every=1, histograms=1)
    history = model.fit(x, y, batch_size=16, shuffle=False, verbose=0, callbacks=[monitor])
    log = read_training_log(folder)
    alerts = training_alerts(log)
    return {
        "steps": log.steps,
        "replicas": log.replicas,
        "loss": [r.loss for r in log.records],
        "history": history.history["loss"],
        "nodes": [r.nodes.tolist() for r in log.records],
        "weights": [r.weights.tolist() for r in log.records],
        "norms": log.norms.global_norm.tolist() if log.norms is not None else [],
        "alerts": [a.to_dict() for a in alerts],
        "monitor_alerts": monitor.alerts,
        "report": report_text(log, alerts),
        "event_files": len(list(folder.glob("events.out.tfevents.*"))),
        "weight_columns": list(WEIGHT_COLUMNS),
    }


def main(out: Path) -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = rng.normal(size=(64, 2)).astype("float32")
    tokens, labels = rng.integers(0, 32, (64, 6)).astype("int32"), rng.integers(0, 3, 64).astype("int32")
    sparse = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    bad = x.copy()
    bad[16 + 12] = np.nan  # step 1, the second half of its global batch: replica 1's shard
    result = {
        "mlp_one": train(mlp, "mse", x, y, out / "mlp_one"),
        "mlp_two": train(mlp, "mse", x, y, out / "mlp_two", strategy),
        "text_one": train(text, sparse, tokens, labels, out / "text_one"),
        "text_two": train(text, sparse, tokens, labels, out / "text_two", strategy),
        "nan_two": train(mlp, "mse", bad, y, out / "nan_two", strategy, lr=0.01),
    }
    print("RESULT " + json.dumps(result, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
