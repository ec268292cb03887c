"""GradientMonitor's cost: ``fit`` with it against the same ``fit`` without it, measured side by side.

    .venv/bin/python benchmarks/bench_monitor.py                # the demo CNN (64x64, batch 32) and ResNet50
    .venv/bin/python benchmarks/bench_monitor.py --only demo    # one model
    .venv/bin/python benchmarks/bench_monitor.py --steps 40     # more timed steps per configuration
    .venv/bin/python benchmarks/bench_monitor.py --only llama3 --steps 4 --rounds 2   # Llama-3 309 M fine-tune
    .venv/bin/python benchmarks/bench_monitor.py --mirrored     # under MirroredStrategy over 2 logical CPUs
    .venv/bin/python benchmarks/bench_monitor.py --only demo --live   # + every=1 with the notebook's live view

Per model: the time of each training step (on_train_batch_begin -> end, which includes the step's record and the
sentinel) after a warm-up epoch that traces, for plain ``fit``, ``every=10``, ``every=1`` (all statistics,
histograms every 10th record: the defaults) and ``every=1`` with ``statistics="magnitude"``; the fits interleave
(plain, 10, 1, 1 magnitude, plain, ...) so that a machine getting slower hits all alike; each configuration keeps
its model and monitor, so its step is traced once. Reported: per round the mean step time, the median
over rounds, and its ratio to plain (goals: <= 1.10 at every=10, <= 1.30 at every=1). Set-up: from ``fit``'s
call to the end of its first step (the monitor's build and trace, or Keras' own trace) in the warm-up epoch, as a
ratio to plain ``fit``'s (goal <= 1.5).
``--live`` adds ``every=1 live``: every=1 with the notebook's live view (``gradscope.app.display.live``) started
and stopped around each fit as ``GradientMonitor(live=True)`` does in a kernel, polling every 0.05 s and redrawing
at every new record (the worst case; its output a stub that keeps the HTML), its draws counted.
Writes benchmarks/results/monitor.{json,csv} (monitor_<options>.{json,csv} with --only / --mirrored).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as _tf  # noqa: E402

MIRRORED = "--mirrored" in sys.argv
if MIRRORED:  # logical devices are fixed before TensorFlow starts
    _cpu = _tf.config.list_physical_devices("CPU")[0]
    _tf.config.set_logical_device_configuration(_cpu, [_tf.config.LogicalDeviceConfiguration()] * 2)

from gradscope.backend import keras, tf  # noqa: E402
from gradscope.engine.training.monitor import GradientMonitor  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# One strategy for the process: a second MirroredStrategy reuses collective instance keys and aborts (TensorFlow)
_STRATEGY = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if MIRRORED else None


class StepTimer(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def on_train_batch_begin(self, batch, logs=None):
        self._t = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self._t)


def demo_case():
    from gradscope.io.demo import demo_model_path
    from gradscope.io.synthetic import make_shapes_dataset

    def build():
        model = keras.saving.load_model(demo_model_path(), compile=False)
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss=keras.losses.SparseCategoricalCrossentropy())
        return model

    x, y, _, _ = make_shapes_dataset(320, seed=3, size=64)
    return "demo CNN (64x64, batch 32)", build, x, y, 32


def resnet_case():
    def build():
        keras.utils.set_random_seed(0)
        model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss=keras.losses.SparseCategoricalCrossentropy())
        return model

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(160, 64, 64, 3)).astype("float32")
    y = rng.integers(0, 10, size=160)
    return "ResNet50 (64x64, batch 16)", build, x, y, 16


def llama3_case():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_language_model import llama3

    def build():
        keras.utils.set_random_seed(0)
        model = llama3(16)
        model.compile(
            optimizer=keras.optimizers.SGD(1e-4),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=[],
        )
        return model

    rng = np.random.default_rng(0)
    ids = rng.integers(1, 32_000, size=(16, 65)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones((16, 64), "int32")}
    return "Llama-3 309 M fine-tune (sequence 64, batch 4)", build, x, ids[:, 1:], 4


class SetupTimer(keras.callbacks.Callback):
    """From ``fit``'s call (``t0``, set before it) to the end of the first step."""

    def __init__(self) -> None:
        super().__init__()
        self.t0 = time.perf_counter()
        self.first: float | None = None

    def on_train_batch_end(self, batch, logs=None):
        if self.first is None:
            self.first = time.perf_counter() - self.t0


def make_monitor(folder: Path, every: int) -> GradientMonitor:
    """``every`` < 0: every |every| steps, magnitude statistics only (defaults otherwise)."""
    folder = folder.with_name(folder.name.replace("=", "").replace(" ", "_"))
    return GradientMonitor(folder, every=abs(every), statistics="magnitude" if every < 0 else "all")


class LiveAround(keras.callbacks.Callback):
    """What ``GradientMonitor(live=True)`` does in a notebook, with a stub output: the watcher thread reads the log
    folder and draws while the fit runs."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder, self.draws, self.draw_seconds = folder, 0, 0.0

    def on_train_begin(self, logs=None):
        from gradscope.app.display.live import LiveTraining

        class Output:
            active = True

            def update(self, html):
                self.html = html

        self.live = LiveTraining(self.folder, every=1, display=Output(), poll_s=0.05).start()

    def on_train_end(self, logs=None):
        self.live.stop()
        self.draws += self.live.draws
        self.draw_seconds += self.live.draw_seconds


def measure(name, build, x, y, batch, steps: int, rounds: int, live: bool = False) -> dict:
    configs = {"plain": None, "every=10": 10, "every=1": 1, "every=1 magnitude": -1}
    if live:
        configs = {"plain": None, "every=1": 1, "every=1 live": 1}
    models: dict = {}
    fits: dict[str, list[float]] = {k: [] for k in configs}
    setup: dict[str, float] = {}
    steps_per_epoch = len(keras.tree.flatten(x)[0]) // batch
    epochs = max(1, steps // steps_per_epoch)
    strategy = _STRATEGY
    with tempfile.TemporaryDirectory() as tmp:
        for label, every in configs.items():  # warm-up: build + trace once per configuration
            if strategy is not None:
                with strategy.scope():
                    model = build()
            else:
                model = build()
            monitor = make_monitor(Path(tmp) / label, every) if every else None
            timer = SetupTimer()
            t = timer.t0 = time.perf_counter()
            model.fit(
                x,
                y,
                batch_size=batch,
                epochs=1,
                verbose=0,
                shuffle=False,
                callbacks=[monitor, timer] if monitor else [timer],
            )
            setup[label] = float(timer.first)
            print(
                f"  {name} {label}: first epoch (trace) {time.perf_counter() - t:.1f} s, to the end of the first "
                f"step {timer.first:.2f} s",
                flush=True,
            )
            models[label] = (model, monitor)
        watchers = {label: LiveAround(monitor.log_dir) for label, (_, monitor) in models.items() if "live" in label}
        for _ in range(rounds):
            for label, (model, monitor) in models.items():
                timer = StepTimer()
                callbacks = [monitor, timer] if monitor else [timer]  # the same monitor: its trace is reused
                callbacks += [watchers[label]] if label in watchers else []
                model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, shuffle=False, callbacks=callbacks)
                fits[label].append(float(np.mean(timer.times[1:])))  # the first step re-enters the function
    # Per round, the mean step time (record steps included); across rounds, the median (this machine is shared:
    # one slow round would otherwise decide the ratio).
    plain = float(np.median(fits["plain"]))
    row = {
        "model": name + (" under MirroredStrategy (2 CPUs)" if MIRRORED else ""),
        "rounds": rounds,
        "steps_per_round": epochs * steps_per_epoch - 1,
        "plain_s": plain,
        "plain_setup_s": setup["plain"],
    }
    for label in [k for k in configs if k != "plain"]:
        per_step = float(np.median(fits[label]))
        row[f"{label}_s"] = per_step
        row[f"{label}_ratio"] = per_step / plain
        row[f"{label}_setup_ratio"] = setup[label] / setup["plain"]
    for label, watcher in watchers.items():
        row[f"{label}_draws"] = watcher.draws
        row[f"{label}_draw_s"] = watcher.draw_seconds / max(1, watcher.draws)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("demo", "resnet", "llama3"))
    parser.add_argument("--mirrored", action="store_true", help="train under MirroredStrategy over 2 logical CPUs")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per configuration and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--live", action="store_true", help="plain, every=1 and every=1 with the live view")
    args = parser.parse_args()
    cases = {"demo": demo_case, "resnet": resnet_case, "llama3": llama3_case}
    rows = []
    for key, case in cases.items():
        if (args.only and key != args.only) or (not args.only and key == "llama3"):
            continue  # the language model only when asked for (minutes a step set)
        name, build, x, y, batch = case()
        rows.append(measure(name, build, x, y, batch, args.steps, args.rounds, args.live))
        r = rows[-1]
        if args.live:
            print(
                f"{r['model']}: plain {r['plain_s'] * 1e3:.1f} ms/step; every=1 {r['every=1_ratio']:.3f}x; with the "
                f"live view {r['every=1 live_ratio']:.3f}x ({r['every=1 live_draws']} drawings, "
                f"{r['every=1 live_draw_s'] * 1e3:.0f} ms each, on the watcher thread)",
                flush=True,
            )
            continue
        print(
            f"{r['model']}: plain {r['plain_s'] * 1e3:.1f} ms/step; every=10 {r['every=10_ratio']:.3f}x; "
            f"every=1 {r['every=1_ratio']:.3f}x, magnitude statistics {r['every=1 magnitude_ratio']:.3f}x "
            f"(median of {r['rounds']} rounds of {r['steps_per_round']} steps); set-up (fit -> end of the first "
            f"step) {r['every=10_setup_ratio']:.2f}x plain's {r['plain_setup_s']:.2f} s",
            flush=True,
        )
    RESULTS.mkdir(exist_ok=True)
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(), "tensorflow": tf.__version__}
    parts = (args.only, "mirrored" if MIRRORED else None, "live" if args.live else None)
    stem = "monitor" + "".join(f"_{part}" for part in parts if part)
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    with (RESULTS / f"{stem}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
