"""Pointing Game (RULES_SPEC §6) on the synthetic shapes task with the bundled demo model: a thin call of
``gradscope.evaluate`` (the protocol lives in ``gradscope.engine.evaluation.faithfulness``; the rows below are its
methods).

For every image and its ground-truth class (the prediction is not used), compute the method's map for that
class, resize it to the image (bilinear, as TorchRay), take its maximum (first in raster order) and count a hit
when that point lies within the tolerance of the object's mask. The reported number is the mean over classes of
hits / (hits + misses), as in the paper and TorchRay.

Scale: the protocol's 15 px tolerance is for ~224 px images; the shapes are 64x64, so the tolerance is scaled to
15 * 64 / 224 = 4.29 px (a point counts when its squared distance to some mask pixel is below 4.29²).
As in TorchRay's benchmark, gradient, guided backprop and deconvnet maps are blurred with a Gaussian of
sigma = 0.02 * max(H, W) before the maximum is taken; the MWP, c-MWP and LRP maps are not.

    .venv/bin/python scripts/pointing_game.py                # 1000 held-out images, the table on the terminal
    .venv/bin/python scripts/pointing_game.py --csv docs/pointing_game.csv   # ...and the README's table file
    .venv/bin/python scripts/pointing_game.py --n 200 --csv /tmp/pg.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gradscope.app.evaluation.run import SMOOTHED  # noqa: E402
from gradscope.io.datasets import BACKGROUND  # noqa: E402
from gradscope.io.demo import demo_meta, demo_model_path  # noqa: E402
from gradscope.io.models import load_model  # noqa: E402
from gradscope.io.synthetic import SHAPE_CLASSES, make_shapes_dataset  # noqa: E402
from gradscope.rules.methods import available_methods, build_method  # noqa: E402

#: (row label, method preset, options). Rows whose preset is not registered are skipped (and said so).
ROWS = [
    ("gradient", "gradient", {}),
    ("gradient_x_input", "gradient_x_input", {}),
    ("guided_backprop", "guided_backprop", {}),
    ("deconvnet", "deconvnet", {}),
    ("mwp", "mwp", {}),
    ("cmwp", "cmwp", {}),
    ("cmwp@res_relu", "cmwp", {"readout": "res_relu"}),
    ("cmwp@conv4", "cmwp", {"readout": "conv4"}),
    ("grad_cam", "grad_cam", {}),
    ("mwp@conv4", "mwp", {"readout": "conv4"}),
    ("mwp@res_relu", "mwp", {"readout": "res_relu"}),
    ("lrp_epsilon", "lrp_epsilon", {}),
    ("lrp_alpha_beta", "lrp_alpha_beta", {}),
    ("lrp_zplus", "lrp_zplus", {}),
]
HELD_OUT_SEED = 4321  # not the demo model's train (1234), validation (1235) or demo-image (1236) seeds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="number of held-out images (default 1000)")
    ap.add_argument("--seed", type=int, default=HELD_OUT_SEED, help=f"dataset seed (default {HELD_OUT_SEED})")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--csv", type=Path, help="also write the table here (docs/pointing_game.csv is the README's)")
    args = ap.parse_args(argv)

    import gradscope
    from gradscope.engine.backward.runner import Engine

    meta = demo_meta()
    size = tuple(meta["input_size"][:2])
    images, labels, _, masks = make_shapes_dataset(args.n, args.seed, size=size[0])
    tol = 15.0 * size[0] / 224.0
    engine = Engine(load_model(demo_model_path()))
    accuracy = float((engine.predict(images).argmax(-1) == labels).mean())
    print(f"demo model {meta['name']}: {args.n} images (seed {args.seed}), top-1 accuracy {accuracy:.3f}")
    print(f"tolerance {tol:.2f} px (15 px scaled to {size[0]} px); classes {', '.join(SHAPE_CLASSES)}")

    known = available_methods()
    rows = [(label, preset, options) for label, preset, options in ROWS if preset in known]
    for label, preset, _ in ROWS:
        if preset not in known:
            print(f"skipped {label}: method {preset!r} is not registered")
    report = gradscope.evaluate(
        engine,
        images,
        masks=np.where(masks, labels[:, None, None], BACKGROUND),  # each image's object: its class
        methods=["center", "random", *(label for label, _, _ in rows)],
        metrics=["pointing"],
        batch=args.batch,
        tolerance=tol,
    )
    shown = [("center", "center", "-", "-"), ("random (expected)", "random", "-", "-")]
    for label, preset, options in rows:
        method = build_method(preset, engine.graph, **options)
        shown.append((label, label, method.readout_node or "input", method.reduction))

    header = ["method", "readout", "reduction", "smoothed", "mean_class_acc", "overall_acc"]
    header += [f"acc_{c}" for c in SHAPE_CLASSES] + ["seconds", "images", "seed", "tolerance_px", "model_top1"]
    print()
    print(
        f"{'method':20s} {'readout':10s} {'reduction':12s} {'smooth':6s} {'mean/cls':>8s} {'overall':>8s}  "
        + " ".join(f"{c:>8s}" for c in SHAPE_CLASSES)
    )
    table = []
    for name, label, node, red in shown:
        got = report.classes["pointing"][label]
        per_class = [got["per_class"].get(str(c), float("nan")) for c in range(len(SHAPE_CLASSES))]
        smooth = label.partition("@")[0] in SMOOTHED
        secs = report.seconds.get(label, 0.0)
        table.append((name, node, red, smooth, report.value(label, "pointing"), got["overall"], per_class, secs))
    for name, node, red, smooth, mean_acc, overall, per_class, _ in table:
        print(
            f"{name:20s} {node:10s} {red:12s} {'yes' if smooth else 'no':6s} {mean_acc:8.3f} {overall:8.3f}  "
            + " ".join(f"{a:8.3f}" for a in per_class)
        )
    if args.csv is None:
        return 0
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for name, node, red, smooth, mean_acc, overall, per_class, secs in table:
            cells = [name, node, red, smooth, f"{mean_acc:.4f}", f"{overall:.4f}", *(f"{a:.4f}" for a in per_class)]
            secs = 0.0 if node == "-" else secs
            w.writerow([*cells, f"{secs:.1f}", args.n, args.seed, f"{tol:.2f}", f"{accuracy:.4f}"])
    print(f"\nwrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
