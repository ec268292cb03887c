"""Re-save the bundled models (demo, hypernetwork examples) with the Keras this runs under, weights unchanged.

A ``.keras`` file keeps every config key of the Keras that wrote it, and an older Keras refuses keys it does
not know (Keras 3.15 writes ``input_axes`` in initializers and ``quantization_config`` in Dense, which 3.13 and
older reject), while a newer Keras reads older files. So the bundled files are written by the OLDEST supported
Keras. Each model is rebuilt by the code that made it (``scripts/train_demo.py``,
``resources/hypernet/build_examples.py``), its trained weights are read from the existing file (weights only,
no config), and the file is replaced atomically. Run it under the oldest supported pair, e.g.::

    python3 -m venv /tmp/oldest && /tmp/oldest/bin/pip install tensorflow==2.19.1 keras==3.10.0 pillow
    /tmp/oldest/bin/python scripts/resave_bundled_models.py
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _resave(model, path: Path) -> None:
    model.load_weights(path)  # reads model.weights.h5 only: no config of the newer Keras is parsed
    fd, tmp = tempfile.mkstemp(suffix=".keras", dir=path.parent)
    os.close(fd)
    try:
        model.save(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"re-saved {path.relative_to(ROOT)}")


def main() -> int:
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    print(f"Keras {keras.__version__}")
    sys.path.insert(0, str(ROOT))
    demo = _module(ROOT / "scripts" / "train_demo.py", "gradscope_train_demo")
    model = demo.build_model(keras)
    _resave(keras.Model(model.input, model.output, name=model.name), ROOT / "resources" / "demo" / "shapes_cnn.keras")
    hyper = _module(ROOT / "resources" / "hypernet" / "build_examples.py", "gradscope_hypernet_examples")
    for kind, filename in hyper.FILES.items():
        _resave(hyper.build(kind), ROOT / "resources" / "hypernet" / filename)
    return 0


if __name__ == "__main__":
    sys.exit(main())
