"""What the model is fed, as a small evented model: the image (or none), how its pixels are scaled, and the
batch built from them for the open model's input shapes. Plain numpy and Pillow: no TensorFlow, no Qt.

Owns: ``image`` (uint8 RGB) and ``image_path``, ``preprocessing``, ``batch`` (the model's input arrays),
``note`` (why the batch is what it is, e.g. a random one for a model whose input is not an image) and
``version`` (bumped with every new batch: a baseline computed for an older batch is stale).
Emits: ``image_changed(image)`` when the image changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gradscope.app.view import PREPROCESSINGS, ViewError
from gradscope.core.errors import ImageLoadError
from gradscope.core.events import Signal
from gradscope.core.graph import LayerGraph


class Inputs:
    def __init__(self) -> None:
        self.image: np.ndarray | None = None
        self.image_path: str | None = None
        self.preprocessing = "unit"
        self.batch: Any = None  # one array, or a list of arrays for a multi-input model
        self.note = ""
        self.version = 0
        self.image_changed = Signal("image_changed")  # (image or None)

    def open(self, path: str | Path) -> None:
        """Read an image file (``ImageLoadError`` with the reason when it is not one) and make it current."""
        from gradscope.io.images import load_image

        self.set_image(load_image(path), str(path))

    def set_image(self, image: Any, path: str | None = None) -> None:
        """Make ``image`` (any array Pillow can show as RGB) current; ``ImageLoadError`` when it cannot be."""
        from gradscope.io.images import rgb_image

        self.image, self.image_path = rgb_image(image), path
        self.image_changed.emit(self.image)

    def set_preprocessing(self, mode: str) -> bool:
        """Change the pixel scaling; False when it already was ``mode``."""
        if mode not in PREPROCESSINGS:
            raise ViewError(f"Unknown preprocessing {mode!r}. Choose one of {', '.join(PREPROCESSINGS)}.")
        changed = mode != self.preprocessing
        self.preprocessing = mode
        return changed

    def prepare(self, graph: LayerGraph) -> None:
        """The batch for ``graph``'s inputs: the image, scaled, when the model takes one image; else a seeded
        random batch, so the gradient flow of a model whose input is not an image can still be inspected."""
        shapes = [graph.node(i).output_shape for i in graph.input_ids]
        self.note = ""
        self.version += 1
        if self.image is not None and len(shapes) == 1:
            from gradscope.io.images import prepare_input

            try:
                self.batch = prepare_input(self.image, shapes[0], self.preprocessing)
                return
            except ImageLoadError as exc:
                self.note = str(exc)
        rng = np.random.default_rng(0)
        batch = [rng.standard_normal([1] + [d or 8 for d in s[1:]]).astype(np.float32) for s in shapes]
        self.batch = batch[0] if len(batch) == 1 else batch
        self.note = f"{self.note} Using a random input (seed 0)." if self.note else "Using a random input (seed 0)."
