"""The bundled demo: a small shapes classifier and a few input images (resources/demo, made by
``scripts/train_demo.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gradscope.core.errors import ImageLoadError, ModelLoadError
from gradscope.core.resources import resource_path

DEMO_MODEL = "shapes_cnn.keras"
DEMO_META = "shapes_meta.json"


def demo_dir() -> Path:
    """``resources/demo`` (in a checkout, an install or a bundle: see ``core.resources``)."""
    return resource_path("demo")


def demo_model_path() -> Path:
    """The bundled demo model (``shapes_cnn.keras``): 64x64 RGB in [0, 1] -> 4 shape classes."""
    path = demo_dir() / DEMO_MODEL
    if not path.is_file():
        raise ModelLoadError(f"The demo model is missing ({path}). Recreate it with `python scripts/train_demo.py`.")
    return path


def demo_image_paths() -> list[Path]:
    """The demo images (``images/<class>_<k>.png``), sorted by name."""
    folder = demo_dir() / "images"
    paths = sorted(folder.glob("*.png")) if folder.is_dir() else []
    if not paths:
        raise ImageLoadError(
            f"The demo images are missing ({folder}). Recreate them with `python scripts/train_demo.py`."
        )
    return paths


def demo_meta() -> dict[str, Any]:
    """The demo model's description: class names, input size, preprocessing, validation accuracy, seeds."""
    path = demo_dir() / DEMO_META
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"The demo model's description {path} cannot be read ({exc}). Recreate it with "
            "`python scripts/train_demo.py`."
        ) from exc


def demo_boxes() -> dict[str, dict[str, Any]]:
    """Per demo image file name: ``label``, ``class``, ``box`` (x0, y0, x1, y1, x1/y1 exclusive), ``seed``,
    ``index`` (``make_shapes_dataset(index + 1, seed)`` regenerates the image and its object mask)."""
    path = demo_dir() / "images" / "boxes.json"
    try:
        return json.loads(path.read_text())["images"]
    except (OSError, ValueError, KeyError) as exc:
        raise ImageLoadError(
            f"The demo boxes file {path} cannot be read ({exc}). Recreate it with `python scripts/train_demo.py`."
        ) from exc
