"""What one patch replaces of a node's value: one token position (axis 1 of a (batch, sequence, ...) value) or one
cell of a grid laid over an image's (batch, H, W, C) value (rows and columns split as evenly as they go, so a 7 x 7
grid on ResNet50's 7 x 7 stage is its pixels, and on its 56 x 56 stage 8 x 8 blocks)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gradscope.backend import tf


@dataclass(frozen=True)
class Units:
    kind: str  # "positions" or "cells"
    count: int
    labels: tuple[str, ...]
    grid: tuple[int, int] | None = None

    @classmethod
    def positions(cls, length: int, labels: tuple[str, ...] | None = None) -> Units:
        return cls("positions", length, tuple(labels) if labels else tuple(str(i) for i in range(length)))

    @classmethod
    def cells(cls, rows: int, cols: int) -> Units:
        return cls("cells", rows * cols, tuple(f"{r},{c}" for r in range(rows) for c in range(cols)), (rows, cols))

    def masks(self, shape: tuple, units: Sequence[int]) -> tf.Tensor:
        """(len(units), ...) booleans that broadcast to a value of ``shape`` (batch first): unit k's elements."""
        rank = len(shape)
        if self.kind == "positions":
            picked = np.zeros((len(units), shape[1]), bool)
            picked[np.arange(len(units)), list(units)] = True
            return tf.constant(picked.reshape(len(units), shape[1], *[1] * (rank - 2)))
        rows, cols = self._bounds(shape)
        out = np.zeros((len(units), shape[1], shape[2], 1), bool)
        for k, u in enumerate(units):
            r, c = divmod(u, self.grid[1])
            out[k, rows[r] : rows[r + 1], cols[c] : cols[c + 1]] = True
        return tf.constant(out)

    def totals(self, per_element: tf.Tensor) -> np.ndarray:
        """(count,) sums of a (1, ...) value over each unit's elements (a patch's first-order effect)."""
        x = per_element[0]
        if self.kind == "positions":
            return tf.reduce_sum(tf.reshape(tf.cast(x, tf.float32), [x.shape[0], -1]), axis=1).numpy()
        pixels = tf.reduce_sum(tf.cast(x, tf.float32), axis=-1).numpy()  # (H, W)
        rows, cols = self._bounds((1, *x.shape))
        return np.array(
            [
                pixels[rows[r] : rows[r + 1], cols[c] : cols[c + 1]].sum()
                for r in range(self.grid[0])
                for c in range(self.grid[1])
            ]
        )

    def check(self, shape: tuple, node: str) -> None:
        from gradscope.core.errors import GraphError

        if self.kind == "positions" and (len(shape) < 3 or shape[1] != self.count):
            raise GraphError(f"Node {node!r} has shape {shape}: patching by token needs (batch, {self.count}, ...).")
        if self.kind == "cells" and len(shape) != 4:
            raise GraphError(f"Node {node!r} has shape {shape}: patching grid cells needs a (batch, H, W, C) value.")

    def _bounds(self, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
        rows, cols = self.grid
        return (
            np.linspace(0, shape[1], rows + 1).round().astype(int),
            np.linspace(0, shape[2], cols + 1).round().astype(int),
        )
