"""Train the bundled demo model on the synthetic shapes task and write resources/demo/.

    .venv/bin/python scripts/train_demo.py            # about a minute on a laptop CPU

Writes ``shapes_cnn.keras`` (the model), ``shapes_meta.json`` (class names, input size, preprocessing,
validation accuracy, seeds, the command) and ``images/<class>_<k>.png`` + ``images/boxes.json`` (demo inputs
with their object boxes). Everything is seeded, so a rerun on the same machine/library versions reproduces it.

The architecture is small but exercises the engine: Conv2D layers with a fused ReLU (conv1, res_conv_a,
conv4), Conv2D -> BatchNormalization -> standalone ReLU (conv2/bn2/relu2, conv3/bn3/relu3), max pooling, a
residual ``Add`` block, global average pooling, a ``Dense`` logits layer and a separate softmax
``Activation`` (for canonicalisation to strip).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from gradscope.io.synthetic import SHAPE_CLASSES, make_shapes_dataset  # noqa: E402

SEED = 1234
TRAIN_SEED, VAL_SEED, DEMO_SEED = SEED, SEED + 1, SEED + 2
SIZE = 64


def build_model(keras, size: int = SIZE, classes: int = len(SHAPE_CLASSES)):
    layers = keras.layers
    inp = keras.Input((size, size, 3), name="image")
    x = layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1")(inp)
    x = layers.MaxPooling2D(name="pool1")(x)  # 32x32
    x = layers.Conv2D(32, 3, padding="same", use_bias=False, name="conv2")(x)
    x = layers.BatchNormalization(name="bn2")(x)
    x = layers.ReLU(name="relu2")(x)
    x = layers.MaxPooling2D(name="pool2")(x)  # 16x16
    shortcut = x
    x = layers.Conv2D(32, 3, padding="same", activation="relu", name="res_conv_a")(x)
    x = layers.Conv2D(32, 3, padding="same", use_bias=False, name="res_conv_b")(x)
    x = layers.BatchNormalization(name="res_bn")(x)
    x = layers.Add(name="res_add")([shortcut, x])
    x = layers.ReLU(name="res_relu")(x)
    x = layers.MaxPooling2D(name="pool3")(x)  # 8x8
    x = layers.Conv2D(64, 3, padding="same", use_bias=False, name="conv3")(x)
    x = layers.BatchNormalization(name="bn3")(x)
    x = layers.ReLU(name="relu3")(x)
    x = layers.MaxPooling2D(name="pool4")(x)  # 4x4: a small grid keeps the object from being averaged away
    x = layers.Conv2D(64, 3, padding="same", activation="relu", name="conv4")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    x = layers.Dense(classes, name="logits")(x)
    out = layers.Activation("softmax", name="probs")(x)
    return keras.Model(inp, out, name="shapes_cnn")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "resources" / "demo")
    parser.add_argument("--train", type=int, default=8000, help="training images")
    parser.add_argument("--val", type=int, default=1000, help="validation images")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)

    import keras
    import tensorflow as tf
    from PIL import Image

    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()

    start = time.perf_counter()
    x_train, y_train, _, _ = make_shapes_dataset(args.train, TRAIN_SEED, SIZE)
    x_val, y_val, _, _ = make_shapes_dataset(args.val, VAL_SEED, SIZE)
    print(f"data: {args.train} train / {args.val} val images in {time.perf_counter() - start:.1f} s")

    model = build_model(keras)
    model.summary()
    steps = args.epochs * int(np.ceil(args.train / args.batch))
    schedule = keras.optimizers.schedules.CosineDecay(2e-3, decay_steps=steps, alpha=0.05)
    # The model outputs probabilities (a separate softmax layer), so the loss is on probabilities.
    model.compile(
        optimizer=keras.optimizers.Adam(schedule),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=["accuracy"],
    )
    fit_start = time.perf_counter()
    model.fit(
        x_train,
        y_train,
        batch_size=args.batch,
        epochs=args.epochs,
        validation_data=(x_val, y_val),
        verbose=2,
        shuffle=True,
    )
    train_seconds = time.perf_counter() - fit_start
    val_accuracy = float(np.mean(np.argmax(model.predict(x_val, verbose=0), axis=1) == y_val))
    print(f"validation accuracy {val_accuracy:.4f} after {train_seconds:.0f} s of training")

    out: Path = args.out
    (out / "images").mkdir(parents=True, exist_ok=True)
    model_path = out / "shapes_cnn.keras"
    # Saved uncompiled (no optimizer state: the file stays small), with one input tensor, not a list of one.
    keras.Model(model.input, model.output, name=model.name).save(model_path)

    # Demo images: the first image of each class from the demo seed, then the next two of any class.
    images, labels, boxes, _ = make_shapes_dataset(64, DEMO_SEED, SIZE)
    chosen: list[int] = [int(np.flatnonzero(labels == c)[0]) for c in range(len(SHAPE_CLASSES))]
    chosen += [i for i in range(len(labels)) if i not in chosen][:2]
    for old in (out / "images").glob("*.png"):
        old.unlink()
    counts = dict.fromkeys(SHAPE_CLASSES, 0)
    entries = {}
    probs = model.predict(images[chosen], verbose=0)
    for i, p in zip(chosen, probs):
        name = SHAPE_CLASSES[labels[i]]
        filename = f"{name}_{counts[name]}.png"
        counts[name] += 1
        Image.fromarray(np.rint(images[i] * 255).astype(np.uint8)).save(out / "images" / filename)
        entries[filename] = {
            "label": int(labels[i]),
            "class": name,
            "box": [int(v) for v in boxes[i]],
            "seed": DEMO_SEED,
            "index": i,
            "predicted": SHAPE_CLASSES[int(np.argmax(p))],
        }
    (out / "images" / "boxes.json").write_text(
        json.dumps(
            {
                "box_format": "x0, y0, x1, y1 in pixels, x1/y1 exclusive (object = mask[y0:y1, x0:x1])",
                "masks": "make_shapes_dataset(index + 1, seed)[3][index] regenerates each object mask",
                "images": dict(sorted(entries.items())),
            },
            indent=2,
        )
        + "\n"
    )

    meta = {
        "name": "shapes_cnn",
        "description": "Synthetic shapes classifier: one coloured shape on a cluttered 64x64 background.",
        "class_names": list(SHAPE_CLASSES),
        "input_size": [SIZE, SIZE, 3],
        "preprocessing": "unit",
        "output": "probabilities from layer 'probs' (softmax); logits from layer 'logits'",
        "val_accuracy": round(val_accuracy, 4),
        "val_images": args.val,
        "train_images": args.train,
        "epochs": args.epochs,
        "seed": SEED,
        "seeds": {"train": TRAIN_SEED, "val": VAL_SEED, "demo_images": DEMO_SEED},
        "train_seconds": round(train_seconds, 1),
        "training_command": "python scripts/train_demo.py"
        + (" " + " ".join(argv if argv is not None else sys.argv[1:]) if (argv or sys.argv[1:]) else ""),
        "keras_version": keras.__version__,
        "tensorflow_version": tf.__version__,
        "parameters": int(model.count_params()),
    }
    (out / "shapes_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    size_kb = model_path.stat().st_size / 1024
    print(f"wrote {model_path} ({size_kb:.0f} KB), {len(entries)} demo images, shapes_meta.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
