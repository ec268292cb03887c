"""The bundled evaluation dataset: 24 held-out images of the demo's shapes task with their object masks, in the
``images/`` + ``masks/`` layout, so that ``gradscope evaluate`` has a first run to try:

    .venv/bin/python scripts/demo_dataset.py        # writes resources/demo/eval/{images,masks}/*.png
    gradscope evaluate resources/demo/shapes_cnn.keras resources/demo/eval --method gradient,cmwp --out /tmp/eval

A mask holds class index + 1 on the object's pixels and 0 elsewhere (``gradscope.io.datasets``). Seeded: a rerun
writes the same files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gradscope.io.synthetic import SHAPE_CLASSES, make_shapes_dataset  # noqa: E402

SEED = 2468  # not the demo model's train (1234), validation (1235), demo-image (1236) or Pointing Game (4321) seeds
COUNT = 24


def main() -> int:
    out = ROOT / "resources" / "demo" / "eval"
    images, labels, _, masks = make_shapes_dataset(COUNT, SEED, size=64)
    for sub in ("images", "masks"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    for i, (x, label, mask) in enumerate(zip(images, labels, masks)):
        name = f"{i:02d}_{SHAPE_CLASSES[label]}.png"
        Image.fromarray((x * 255).round().astype(np.uint8)).save(out / "images" / name, optimize=True)
        Image.fromarray(np.where(mask, label + 1, 0).astype(np.uint8), mode="L").save(out / "masks" / name)
    print(f"wrote {COUNT} images and masks to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
