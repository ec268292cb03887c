"""Two trainings that go wrong, watched by GradientMonitor, so that ``gradscope train-report`` has something to find.

    python scripts/training_demos.py blowup    --logdir logs/blowup      # learning rate too high: NaN
    python scripts/training_demos.py vanishing --logdir logs/vanishing   # 16 sigmoid layers: the first ones starve
    gradscope train-report logs/blowup          # exit 1: the first NaN, the layer (and op) it came from
    gradscope gui --training logs/blowup        # the Training view; checkpoints saved per epoch open from it

Both train on the synthetic shapes task of the bundled demo (``gradscope.io.synthetic``), seeded, on the CPU in
seconds; every 2 steps the model is saved as ``LOGDIR/epoch-EE-batch-BBB.keras`` by Keras' ModelCheckpoint (what
a user would do), so the Training view can open the weights from before a step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CASES = ("blowup", "vanishing")


def build(case: str):
    from gradscope.backend import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((32, 32, 3), name="image")
    if case == "blowup":
        # A plain small CNN; SGD at lr 2 with momentum (a sane lr is ~0.05) grows the weights until they overflow.
        x = keras.layers.Conv2D(16, 3, activation="elu", name="conv1")(inputs)
        x = keras.layers.MaxPooling2D(name="pool1")(x)
        x = keras.layers.Conv2D(32, 3, activation="elu", name="conv2")(x)
        x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
        x = keras.layers.Dense(32, activation="elu", name="fc")(x)
        outputs = keras.layers.Dense(4, name="logits")(x)
        optimizer = keras.optimizers.SGD(learning_rate=2.0, momentum=0.9)
    elif case == "vanishing":
        # Sixteen sigmoid layers: sigmoid' <= 1/4, so the signal shrinks by ~10x a layer on the way down.
        x = keras.layers.Flatten(name="flatten")(inputs)
        for i in range(16):
            x = keras.layers.Dense(32, activation="sigmoid", name=f"dense{i + 1}")(x)
        outputs = keras.layers.Dense(4, name="logits")(x)
        optimizer = keras.optimizers.SGD(learning_rate=0.05)
    else:
        raise SystemExit(f"unknown case {case!r}: choose one of {', '.join(CASES)}")
    model = keras.Model(inputs, outputs, name=f"{case}_demo")
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def run(case: str, logdir: str | Path, *, epochs: int = 3, images: int = 256, every: int = 2, verbose: int = 0):
    """Train ``case`` with a GradientMonitor into ``logdir``; returns the Keras history."""
    from gradscope.backend import keras
    from gradscope.engine.training.monitor import GradientMonitor
    from gradscope.io.synthetic import make_shapes_dataset

    logdir = Path(logdir)
    x, y, _, _ = make_shapes_dataset(images, seed=1, size=32)
    model = build(case)
    checkpoints = keras.callbacks.ModelCheckpoint(
        str(logdir / "epoch-{epoch:02d}-batch-{batch:03d}.keras"), save_freq=2
    )
    monitor = GradientMonitor(logdir, every=every)
    return model.fit(
        x, y, epochs=epochs, batch_size=32, shuffle=False, verbose=verbose, callbacks=[monitor, checkpoints]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=CASES)
    parser.add_argument("--logdir", required=True, help="where the GradientMonitor log and checkpoints go")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--images", type=int, default=256, help="training images (synthetic shapes, 32x32)")
    parser.add_argument("--every", type=int, default=2, help="record every N steps")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    history = run(args.case, args.logdir, epochs=args.epochs, images=args.images, every=args.every, verbose=2)
    print(f"loss per epoch: {history.history['loss']}")
    print(f"now: gradscope train-report {args.logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
