"""Blending and the signal -> picture pipeline."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.render import RenderedMap, apply_colormap, blend, lut, normalize, reduce_channels, render_overlay


@pytest.fixture
def image() -> np.ndarray:
    return np.random.default_rng(4).integers(0, 256, size=(16, 20, 3), dtype=np.uint8)


@pytest.fixture
def map01() -> np.ndarray:
    return np.random.default_rng(5).uniform(size=(16, 20)).astype(np.float32)


def test_alpha_zero_is_the_image(image: np.ndarray, map01: np.ndarray) -> None:
    np.testing.assert_array_equal(blend(image, map01, alpha=0.0), image)


def test_alpha_one_is_the_colored_map(image: np.ndarray, map01: np.ndarray) -> None:
    np.testing.assert_array_equal(blend(image, map01, cmap="jet", alpha=1.0), apply_colormap(map01, "jet"))


def test_alpha_half_formula(image: np.ndarray, map01: np.ndarray) -> None:
    expected = np.rint(0.7 * image + 0.3 * apply_colormap(map01, "viridis").astype(float))
    np.testing.assert_allclose(blend(image, map01, cmap="viridis", alpha=0.3), expected, atol=1)


def test_caffe_style(image: np.ndarray, map01: np.ndarray) -> None:
    np.testing.assert_array_equal(blend(image, np.zeros((16, 20)), style="caffe"), image)
    full = blend(image, np.ones((16, 20)), style="caffe")
    np.testing.assert_array_equal(full, np.broadcast_to(lut("jet")[255], image.shape))
    w = map01[..., None].astype(float) ** 0.8
    expected = (1 - w) * image + w * apply_colormap(map01, "jet")
    np.testing.assert_allclose(blend(image, map01, style="caffe").astype(float), expected, atol=1.0)


def test_grayscale_and_float_images(map01: np.ndarray) -> None:
    gray = np.random.default_rng(6).integers(0, 256, size=(16, 20), dtype=np.uint8)
    rgb = np.repeat(gray[..., None], 3, axis=-1)
    np.testing.assert_array_equal(blend(gray, map01, alpha=0.4), blend(rgb, map01, alpha=0.4))
    np.testing.assert_array_equal(blend(gray[..., None], map01, alpha=0.4), blend(rgb, map01, alpha=0.4))
    np.testing.assert_array_equal(blend(rgb / 255.0, map01, alpha=0.0), rgb)  # float in [0, 1]
    np.testing.assert_array_equal(blend(rgb.astype(np.float32), map01, alpha=0.0), rgb)  # float in [0, 255]
    rgba = np.concatenate([rgb, np.full((16, 20, 1), 255, np.uint8)], axis=-1)
    assert blend(rgba, map01).shape == (16, 20, 3)


def test_map_of_other_size_is_resized(image: np.ndarray) -> None:
    small = np.full((4, 5), 1.0)
    out = blend(image, small, alpha=1.0)
    assert out.shape == image.shape
    np.testing.assert_array_equal(out, np.broadcast_to(lut("jet")[255], image.shape))


def test_bad_arguments(image: np.ndarray, map01: np.ndarray) -> None:
    with pytest.raises(ValueError, match="blend style"):
        blend(image, map01, style="screen")
    with pytest.raises(ValueError, match="alpha"):
        blend(image, map01, alpha=1.5)
    with pytest.raises(ValueError, match="2-D map"):
        blend(image, np.zeros((16, 20, 3)))


def test_render_overlay_from_raw_gradient(image: np.ndarray) -> None:
    g = np.random.default_rng(7).normal(size=(4, 5, 3))
    r = render_overlay(image, g, reduction="max_abs", normalization="minmax", cmap="jet", alpha=0.5)
    assert isinstance(r, RenderedMap)
    assert r.map01.shape == (16, 20) and r.map01.dtype == np.float32
    assert r.map01.min() >= 0 and r.map01.max() <= 1
    assert r.colored.shape == r.overlay.shape == (16, 20, 3)
    # the pipeline equals its steps done by hand
    from gradscope.render import resize_map

    m = np.clip(resize_map(normalize(reduce_channels(g, "max_abs")), (20, 16)), 0, 1)
    np.testing.assert_allclose(r.map01, m, atol=1e-6)
    np.testing.assert_array_equal(r.colored, apply_colormap(m, "jet"))
    np.testing.assert_array_equal(r.overlay, blend(image, m, "jet", 0.5))


def test_render_overlay_signed_and_smoothed(image: np.ndarray) -> None:
    m = np.zeros((16, 20))
    m[2, 3], m[12, 15] = 5.0, -5.0
    r = render_overlay(image, m, normalization="signed", cmap="bwr", smooth=0.05)
    assert r.map01.min() == pytest.approx(-1.0) and r.map01.max() == pytest.approx(1.0)
    assert r.map01[2, 3] > 0.9 and r.map01[12, 15] < -0.9
    assert r.colored[2, 3, 0] > r.colored[2, 3, 2]  # positive is red
    assert r.colored[12, 15, 2] > r.colored[12, 15, 0]  # negative is blue
    assert np.count_nonzero(r.map01) > 2  # the blur spread the two peaks


def test_render_overlay_rejects_bad_shapes(image: np.ndarray) -> None:
    with pytest.raises(ValueError):
        render_overlay(image, np.zeros(7))
