"""A synthetic image task where the object's location is known: one coloured shape on a cluttered background.

Used to train the bundled demo model and to evaluate saliency maps (Pointing Game: does the map's maximum fall
on the object?). Pure NumPy and deterministic per seed; image ``i`` of a dataset does not depend on ``n``, so
``make_shapes_dataset(10, s)`` is the first ten images of ``make_shapes_dataset(1000, s)``.
"""

from __future__ import annotations

import numpy as np

SHAPE_CLASSES = ("circle", "square", "triangle", "cross")

_MIN_SIZE, _MAX_SIZE = 10, 20  # object extent in pixels (diameter / side) at size=64
_MAX_TILT = np.deg2rad(30.0)  # polygons are rotated by up to this much either way


def make_shapes_dataset(n: int, seed: int, size: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``n`` images of one shape each on a cluttered background.

    Returns ``(images, labels, boxes, masks)``: images float32 ``(n, size, size, 3)`` in [0, 1]; labels int64
    ``(n,)`` indexing ``SHAPE_CLASSES``; boxes int64 ``(n, 4)`` as ``x0, y0, x1, y1`` in pixels with ``x1``,
    ``y1`` exclusive (the object is ``masks[i, y0:y1, x0:x1]``); masks bool ``(n, size, size)``, True on the
    object's pixels. The object is fully inside the image, 10-20 px across at ``size=64`` (scaled with size).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if size < 16:
        raise ValueError(f"size must be at least 16 pixels, got {size}")
    rng = np.random.default_rng(seed)
    images = np.empty((n, size, size, 3), np.float32)
    labels = np.empty(n, np.int64)
    boxes = np.empty((n, 4), np.int64)
    masks = np.empty((n, size, size), bool)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5  # pixel centres
    for i in range(n):
        images[i], labels[i], boxes[i], masks[i] = _one_image(rng, size, xx, yy)
    return images, labels, boxes, masks


def _one_image(
    rng: np.random.Generator, size: int, xx: np.ndarray, yy: np.ndarray
) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    scale = size / 64.0
    base = rng.uniform(0.15, 0.85, 3).astype(np.float32)
    img = np.broadcast_to(base, (size, size, 3)).copy()

    # Clutter: faint blobs and lines in random colours, then pixel noise over everything (object included).
    for _ in range(rng.integers(2, 5)):
        cx, cy = rng.uniform(0, size, 2)
        sigma = rng.uniform(3, 10) * scale
        weight = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * sigma**2))[..., None]
        img += rng.uniform(0.1, 0.25) * weight * (rng.uniform(0, 1, 3) - base)
    for _ in range(rng.integers(2, 5)):
        p0, p1 = rng.uniform(0, size, (2, 2))
        width = rng.uniform(0.6, 1.5) * scale
        line = (_segment_distance(xx, yy, p0, p1) <= width)[..., None]
        img = np.where(line, img + rng.uniform(0.12, 0.25) * (rng.uniform(0, 1, 3) - img), img)

    label = int(rng.integers(len(SHAPE_CLASSES)))
    extent = rng.uniform(_MIN_SIZE, _MAX_SIZE) * scale
    angle = rng.uniform(-_MAX_TILT, _MAX_TILT)
    margin = extent / 2 * np.sqrt(2) + 1  # a tilted square's corner still lies inside the image
    cx, cy = rng.uniform(margin, size - margin, 2)
    mask = _shape_mask(SHAPE_CLASSES[label], xx - cx, yy - cy, extent, angle)

    colour = rng.uniform(0, 1, 3)
    while np.linalg.norm(colour - base) < 0.45:  # keep the object visible against the background
        colour = rng.uniform(0, 1, 3)
    img[mask] = colour
    img += rng.normal(0.0, rng.uniform(0.02, 0.08), img.shape).astype(np.float32)
    np.clip(img, 0.0, 1.0, out=img)

    ys, xs = np.nonzero(mask)
    box = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.int64)
    return img, label, box, mask


def _shape_mask(shape: str, dx: np.ndarray, dy: np.ndarray, extent: float, angle: float) -> np.ndarray:
    """Pixels of a shape ``extent`` px across centred at offset (0, 0); polygons are rotated by ``angle``."""
    half = extent / 2
    if shape == "circle":
        return dx**2 + dy**2 <= half**2
    c, s = np.cos(angle), np.sin(angle)
    u, v = c * dx + s * dy, -s * dx + c * dy  # coordinates in the shape's own frame
    if shape == "square":
        return (np.abs(u) <= half) & (np.abs(v) <= half)
    if shape == "cross":
        arm = max(extent / 6, 1.5)  # half the bar thickness: bars are a third of the extent wide
        return ((np.abs(u) <= half) & (np.abs(v) <= arm)) | ((np.abs(u) <= arm) & (np.abs(v) <= half))
    if shape == "triangle":
        # Point up, base at v = +half*0.8, apex at v = -half; an isoceles triangle spanning the extent.
        top, bottom = -half, half * 0.8
        t = (v - top) / (bottom - top)  # 0 at the apex, 1 at the base
        return (t >= 0) & (t <= 1) & (np.abs(u) <= t * half)
    raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPE_CLASSES}")


def _segment_distance(xx: np.ndarray, yy: np.ndarray, p0: np.ndarray, p1: np.ndarray) -> np.ndarray:
    d = p1 - p0
    t = ((xx - p0[0]) * d[0] + (yy - p0[1]) * d[1]) / max(float(d @ d), 1e-6)
    t = np.clip(t, 0.0, 1.0)
    return np.hypot(xx - (p0[0] + t * d[0]), yy - (p0[1] + t * d[1]))
