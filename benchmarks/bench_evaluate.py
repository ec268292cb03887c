"""``gradscope evaluate`` throughput against a plain batched ``tf.GradientTape`` loop over the same images.

    .venv/bin/python benchmarks/bench_evaluate.py                 # demo CNN (64 px) and ResNet50 (224 px)
    .venv/bin/python benchmarks/bench_evaluate.py --only demo --images 1024
    .venv/bin/python benchmarks/bench_evaluate.py --memory 4000   # RSS over a long run (demo CNN)

Both sides read the same PNG folder with the same loader (Pillow decode, resize, scale) in batches, and take the
gradient of each image's class logit with respect to its input. The plain loop is a compiled ``tf.function``
(``GradientTape`` over ``model(x)``), nothing else; ``evaluate`` is the whole run of ``--method gradient
--metric pointing``: reading (the next batch in a thread), the engine's gradient, the map read out, resized,
blurred and scored against the mask, a record per batch written atomically, and the report with its bootstrap
at the end. Rounds interleave (plain, evaluate, plain, ...); each side's first round, which traces, is not
timed. Reported: images per second, median over rounds, and the ratio (goal: evaluate >= 80 % of plain).
Writes benchmarks/results/evaluate.{json,csv}.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from gradscope.backend import keras, tf  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def write_folder(folder: Path, n: int, size: int) -> None:
    from gradscope.io.synthetic import make_shapes_dataset

    images, labels, _, masks = make_shapes_dataset(n, 4321, size=size)
    (folder / "masks").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray((images[i] * 255).round().astype(np.uint8)).save(folder / f"img{i:05d}.png")
        Image.fromarray(np.where(masks[i], labels[i] + 1, 0).astype(np.uint8), mode="L").save(
            folder / "masks" / f"img{i:05d}.png"
        )


def plain_loop(model, source, keys, batch):
    """Images per second of the plain batched tape gradient (same loader, same classes)."""
    from gradscope.io.datasets import Sample  # noqa: F401  (the loader's output)

    fn = _tape_fn(model)
    start = time.perf_counter()
    for lo in range(0, len(keys), batch):
        samples = [source.load(k) for k in keys[lo : lo + batch]]
        x = np.stack([s.x for s in samples])
        classes = np.array([s.classes()[0] for s in samples], np.int32)
        if len(x) < batch:  # the same padding as evaluate: one batch shape
            x = np.concatenate([x, np.repeat(x[:1], batch - len(x), 0)])
            classes = np.concatenate([classes, np.repeat(classes[:1], batch - len(classes))])
        fn(tf.constant(x), tf.constant(classes)).numpy()
    return len(keys) / (time.perf_counter() - start)


_FNS: dict = {}


def _tape_fn(model):
    if id(model) not in _FNS:
        logits_model = model
        last = model.layers[-1]
        if getattr(last, "activation", None) is keras.activations.softmax:  # the logit, as gradscope's target
            if isinstance(last, keras.layers.Activation):
                logits_model = keras.Model(model.inputs, last.input)
            else:  # a Dense ending in softmax (ResNet50): its logits from its input
                features = keras.Model(model.inputs, last.input)
                logits_model = lambda x, training: tf.matmul(features(x, training=training), last.kernel) + last.bias  # noqa: E731

        @tf.function
        def fn(x, classes):
            with tf.GradientTape() as tape:
                tape.watch(x)
                out = logits_model(x, training=False)
                score = tf.reduce_sum(tf.gather(out, classes, axis=1, batch_dims=1))
            return tape.gradient(score, x)

        _FNS[id(model)] = fn
    return _FNS[id(model)]


def evaluate_run(engine, source, keys, batch, tolerance):
    from gradscope.app.evaluation.run import EvalSettings, run_evaluation

    settings = EvalSettings(methods=["gradient"], metrics=["pointing"], batch=batch, tolerance=tolerance)
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        run_evaluation(engine, _Subset(source, keys), settings, Path(out))
        return len(keys) / (time.perf_counter() - start)


class _Subset:
    def __init__(self, source, keys):
        self.source, self._keys = source, keys

    def keys(self):
        return list(self._keys)

    def load(self, key):
        return self.source.load(key)

    def describe(self):
        return self.source.describe()


def case(name, model, size, n, batch, rounds, work):
    from gradscope.engine.backward.runner import Engine
    from gradscope.io.datasets import ImageFolder

    folder = work / name
    if not folder.exists():
        write_folder(folder, n, size)
    shape = tuple(model.inputs[0].shape)
    source = ImageFolder(folder, shape, "unit", with_masks=True, classes=model.outputs[0].shape[-1])
    keys = source.keys()
    engine = Engine(model)
    tolerance = 15.0 * size / 224.0
    warm = keys[: 2 * batch]
    plain_loop(model, source, warm, batch)
    evaluate_run(engine, source, warm, batch, tolerance)
    plain, ours = [], []
    for r in range(rounds):
        plain.append(plain_loop(model, source, keys, batch))
        ours.append(evaluate_run(engine, source, keys, batch, tolerance))
        print(f"  {name} round {r + 1}: plain {plain[-1]:.1f} img/s, evaluate {ours[-1]:.1f} img/s", flush=True)
    p, o = statistics.median(plain), statistics.median(ours)
    return {
        "case": name,
        "images": n,
        "batch": batch,
        "plain_img_s": round(p, 2),
        "evaluate_img_s": round(o, 2),
        "ratio": round(o / p, 3),
        "rounds": rounds,
    }


def memory_run(n, batch, work):
    """RSS (MB) after each batch of a long evaluation of the demo model: flat means no growth with images."""
    from gradscope.app.evaluation.run import EvalSettings, run_evaluation
    from gradscope.engine.backward.runner import Engine
    from gradscope.io.datasets import ImageFolder
    from gradscope.io.demo import demo_model_path
    from gradscope.io.models import load_model

    folder = work / f"memory{n}"
    if not folder.exists():
        write_folder(folder, n, 64)
    engine = Engine(load_model(demo_model_path()))
    source = ImageFolder(folder, (None, 64, 64, 3), "unit", with_masks=True, classes=4)
    rss = []

    def progress(done, total, left):
        with open("/proc/self/statm") as fh:
            rss.append(int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20)

    settings = EvalSettings(
        methods=["gradient", "cmwp"], metrics=["pointing", "deletion"], batch=batch, steps=10, tolerance=15 * 64 / 224
    )
    with tempfile.TemporaryDirectory() as out:
        run_evaluation(engine, source, settings, Path(out), progress=progress)
    tenth = rss[min(10, len(rss) - 1)]
    print(
        f"RSS over {n} images: after 10 batches {tenth:.0f} MB, at the end {rss[-1]:.0f} MB, "
        f"max {max(rss):.0f} MB ({len(rss) - 1} batches)"
    )
    return {
        "images": n,
        "batch": batch,
        "rss_after_10_batches_mb": round(tenth, 1),
        "rss_end_mb": round(rss[-1], 1),
        "rss_max_mb": round(max(rss), 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["demo", "resnet"])
    ap.add_argument("--images", type=int, help="images per case (default: demo 512, ResNet50 96)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory", type=int, metavar="N", help="only the memory run over N images")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gradscope-bench-evaluate")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.memory:
        memory_run(args.memory, 32, args.work)
        return 0
    rows = []
    if args.only in (None, "demo"):
        from gradscope.io.demo import demo_model_path
        from gradscope.io.models import load_model

        rows.append(case("demo", load_model(demo_model_path()), 64, args.images or 512, 32, args.rounds, args.work))
    if args.only in (None, "resnet"):
        keras.utils.set_random_seed(0)
        model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
        rows.append(case("resnet50", model, 224, args.images or 96, 16, args.rounds, args.work))
    for row in rows:
        print(
            f"{row['case']}: plain {row['plain_img_s']} img/s, evaluate {row['evaluate_img_s']} img/s, "
            f"ratio {row['ratio']:.2f} (goal >= 0.80)"
        )
    RESULTS.mkdir(exist_ok=True)
    meta = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "tf": tf.__version__}
    (RESULTS / "evaluate.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    with (RESULTS / "evaluate.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
