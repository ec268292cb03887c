"""The synthetic shapes task: deterministic per seed, and the object masks lie inside their boxes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from gradscope.io.synthetic import SHAPE_CLASSES, make_shapes_dataset


@pytest.fixture(scope="module")
def data():
    return make_shapes_dataset(200, seed=7)


def test_shapes_and_ranges(data):
    images, labels, boxes, masks = data
    assert images.shape == (200, 64, 64, 3) and images.dtype == np.float32
    assert labels.shape == (200,) and np.issubdtype(labels.dtype, np.integer)
    assert boxes.shape == (200, 4) and np.issubdtype(boxes.dtype, np.integer)
    assert masks.shape == (200, 64, 64) and masks.dtype == bool
    assert images.min() >= 0.0 and images.max() <= 1.0
    assert set(np.unique(labels)) == set(range(len(SHAPE_CLASSES)))
    assert SHAPE_CLASSES == ("circle", "square", "triangle", "cross")


def test_deterministic_per_seed(data):
    again = make_shapes_dataset(200, seed=7)
    for a, b in zip(data, again):
        np.testing.assert_array_equal(a, b)
    other = make_shapes_dataset(200, seed=8)
    assert not np.array_equal(data[0], other[0])
    # Image i does not depend on how many images were asked for.
    prefix = make_shapes_dataset(20, seed=7)
    for a, b in zip(data, prefix):
        np.testing.assert_array_equal(a[:20], b)


def test_masks_lie_inside_tight_boxes(data):
    _, _, boxes, masks = data
    for (x0, y0, x1, y1), mask in zip(boxes, masks):
        assert 0 <= x0 < x1 <= 64 and 0 <= y0 < y1 <= 64
        inside = np.zeros_like(mask)
        inside[y0:y1, x0:x1] = True
        assert mask.any() and not (mask & ~inside).any()
        # Tight: the object touches every side of its box.
        assert mask[y0, x0:x1].any() and mask[y1 - 1, x0:x1].any()
        assert mask[y0:y1, x0].any() and mask[y0:y1, x1 - 1].any()
        assert 6 <= max(x1 - x0, y1 - y0) <= 30  # 10-20 px shapes, tilted up to 30 degrees


def test_object_pixels_differ_from_background(data):
    images, _, _, masks = data
    for image, mask in zip(images[:50], masks[:50]):
        inside = image[mask].mean(axis=0)
        ring = image[~mask].mean(axis=0)
        assert np.linalg.norm(inside - ring) > 0.1


def test_other_sizes():
    images, _, boxes, masks = make_shapes_dataset(5, seed=0, size=32)
    assert images.shape == (5, 32, 32, 3) and masks.shape == (5, 32, 32)
    assert (boxes[:, 2:] <= 32).all()
    assert make_shapes_dataset(0, seed=0)[0].shape == (0, 64, 64, 3)


def test_io_imports_without_tensorflow():
    code = (
        "import sys\n"
        "for m in ('tensorflow', 'keras'): sys.modules[m] = None\n"
        "import gradscope.io, gradscope.io.models, gradscope.io.images, gradscope.io.demo\n"
        "from gradscope.io.synthetic import make_shapes_dataset\n"
        "make_shapes_dataset(2, 0)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
