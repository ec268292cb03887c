"""Build and save the two hypernetwork examples (``python resources/hypernet/build_examples.py``).

Both models take ``features`` (8 numbers) and ``condition`` (4 numbers). A small hypernetwork
(``hyper_hidden`` -> ``hyper_head``) maps the condition to the 8x6 kernel of the target network's first layer
(``target_dense``), followed by ReLU and a 3-class softmax classifier. The label depends on both inputs (the
sign of ``condition[0]`` flips which feature wins), so the target network needs the hypernetwork to learn.

- ``hypernet_assign.keras``: ``target_dense`` is ``AssignedDense``: it assigns the prediction into its
  ``Dense`` variable, so the hypernetwork gets no gradient (``gradscope diagnose`` shows the cut).
- ``hypernet_tensor.keras``: ``target_dense`` is ``PredictedDense``: the prediction is used as a tensor, the
  hypernetwork gets a gradient and trains.

Open them with ``--custom-objects resources/hypernet/hyperlayers.py``, e.g.
``gradscope diagnose resources/hypernet/hypernet_assign.keras --custom-objects resources/hypernet/hyperlayers.py``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

HERE = Path(__file__).resolve().parent
FEATURES, CONDITION, UNITS, CLASSES = 8, 4, 6, 3
FILES = {"assign": "hypernet_assign.keras", "tensor": "hypernet_tensor.keras"}


def hyperlayers() -> ModuleType:
    """The custom-layer module (imported once by path: ``resources`` is not a Python package)."""
    name = "gradscope_hypernet_layers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "hyperlayers.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def build(kind: str, seed: int = 0, learning_rate: float = 0.05):
    """``kind``: "assign" (broken: the hypernetwork gets no gradient) or "tensor" (correct)."""
    import keras

    layers = hyperlayers()
    keras.utils.set_random_seed(seed)
    x = keras.Input((FEATURES,), name="features")
    c = keras.Input((CONDITION,), name="condition")
    h = keras.layers.Dense(16, activation="tanh", name="hyper_hidden")(c)
    w = keras.layers.Dense(FEATURES * UNITS, name="hyper_head")(h)
    target_cls = {"assign": layers.AssignedDense, "tensor": layers.PredictedDense}[kind]
    y = target_cls(UNITS, name="target_dense")([x, w])
    y = keras.layers.ReLU(name="target_relu")(y)
    out = keras.layers.Dense(CLASSES, activation="softmax", name="classifier")(y)
    model = keras.Model([x, c], out, name=f"hypernet_{kind}")
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate), loss="sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


def make_data(n: int = 64, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """Inputs ``[features, condition]`` and labels: argmax of ``features[:, :3] * sign(condition[:, 0])``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    c = rng.normal(size=(n, CONDITION)).astype(np.float32)
    sign = np.where(c[:, :1] > 0, 1.0, -1.0).astype(np.float32)
    labels = np.argmax(x[:, :CLASSES] * sign, axis=1).astype(np.int64)
    return [x, c], labels


def main(out_dir: Path = HERE) -> list[Path]:
    written = []
    for kind, name in FILES.items():
        model = build(kind)
        path = Path(out_dir) / name
        model.save(path)
        written.append(path)
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return written


if __name__ == "__main__":
    main()
