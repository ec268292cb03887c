"""numpy uint8 images to Qt pixmaps (copies: the QImage must not outlive the numpy buffer otherwise)."""

from __future__ import annotations

import numpy as np
from PySide6.QtGui import QImage, QPixmap


def to_qimage(array: np.ndarray) -> QImage:
    a = np.asarray(array)
    if a.dtype != np.uint8:
        a = np.clip(a * (255.0 if a.size and a.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, axis=-1)
    a = np.ascontiguousarray(a[..., :3])
    h, w = a.shape[:2]
    return QImage(a.data, w, h, 3 * w, QImage.Format.Format_RGB888).copy()


def to_pixmap(array: np.ndarray) -> QPixmap:
    return QPixmap.fromImage(to_qimage(array))
