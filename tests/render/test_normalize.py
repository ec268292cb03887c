"""Normalisation, resizing and smoothing of maps."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.render import gaussian_smooth, is_signed, normalize, resize_map, smoothing_sigma


@pytest.fixture
def noisy() -> np.ndarray:
    return np.random.default_rng(1).normal(size=(12, 9)) * 3.0 + 1.0


def test_minmax_is_caffe_formula(noisy: np.ndarray) -> None:
    got = normalize(noisy, "minmax")
    assert got.dtype == np.float32
    assert got.min() == 0.0 and got.max() == pytest.approx(1.0)
    expected = (noisy - noisy.min()) / (noisy - noisy.min()).max()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", ["minmax", "percentile", "signed", "abs"])
@pytest.mark.parametrize("value", [0.0, 2.5, -7.0])
def test_constant_map_becomes_zeros(mode: str, value: float) -> None:
    got = normalize(np.full((4, 5), value), mode)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, np.zeros((4, 5), np.float32))


@pytest.mark.parametrize("mode", ["minmax", "percentile", "signed", "abs"])
def test_nan_and_inf_become_zero_and_do_not_poison_the_rest(mode: str) -> None:
    m = np.array([[np.nan, 1.0], [3.0, np.inf], [-np.inf, 2.0]])
    got = normalize(m, mode)
    assert np.isfinite(got).all()
    assert got[0, 0] == 0 and got[1, 1] == 0 and got[2, 0] == 0
    assert got[1, 0] == pytest.approx(1.0)  # the finite maximum still reaches the top


def test_all_nan_map() -> None:
    np.testing.assert_array_equal(normalize(np.full((3, 3), np.nan)), np.zeros((3, 3)))


def test_signed_range_keeps_sign_and_zero(noisy: np.ndarray) -> None:
    m = noisy - 1.0
    got = normalize(m, "signed")
    assert got.min() >= -1.0 and got.max() <= 1.0
    assert max(abs(got.min()), got.max()) == pytest.approx(1.0)
    np.testing.assert_array_equal(np.sign(got), np.sign(m))
    np.testing.assert_allclose(got, m / np.abs(m).max(), rtol=1e-6)


def test_abs(noisy: np.ndarray) -> None:
    np.testing.assert_allclose(normalize(noisy, "abs"), np.abs(noisy) / np.abs(noisy).max(), rtol=1e-6)


def test_percentile_clips_a_hot_pixel() -> None:
    m = np.tile(np.linspace(0.0, 1.0, 100), (10, 1))
    m[0, 0] = 1000.0
    got = normalize(m, "percentile", percentile=99.0)
    top = np.percentile(np.abs(m), 99.0)
    np.testing.assert_allclose(got, np.clip(np.abs(m) / top, 0, 1), rtol=1e-6)
    assert got.max() == 1.0 and 0.2 < np.median(got) < 0.8  # minmax would squash everything to ~0
    assert np.median(normalize(m, "minmax")) < 0.001


def test_percentile_of_sparse_map_falls_back_to_max() -> None:
    m = np.zeros((10, 10))
    m[3, 4] = 5.0
    got = normalize(m, "percentile", percentile=99.0)
    assert got[3, 4] == 1.0 and got.sum() == 1.0


def test_unknown_normalisation() -> None:
    with pytest.raises(ValueError, match="Unknown normalisation"):
        normalize(np.ones((2, 2)), "zscore")


@pytest.mark.parametrize("method", ["bilinear", "bicubic", "nearest"])
def test_resize_shape_and_constant(method: str) -> None:
    m = np.full((7, 5), 0.37, np.float32)
    got = resize_map(m, (40, 30), method)  # (W, H)
    assert got.shape == (30, 40) and got.dtype == np.float32
    np.testing.assert_allclose(got, 0.37, atol=1e-6)


def test_resize_bilinear_matches_half_pixel_interpolation() -> None:
    m = np.array([[0.0, 1.0]], np.float32)
    got = resize_map(m, (4, 1), "bilinear")
    # align_corners=False: output centres at 0.25, 0.75, 1.25, 1.75 input px -> clamped ramp
    np.testing.assert_allclose(got[0], [0.0, 0.25, 0.75, 1.0], atol=1e-6)


def test_resize_nearest_repeats_pixels() -> None:
    m = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    np.testing.assert_array_equal(resize_map(m, (4, 4), "nearest"), np.kron(m, np.ones((2, 2))))


def test_gaussian_smooth_constant_and_noise() -> None:
    const = np.full((20, 30), 2.0)
    np.testing.assert_allclose(gaussian_smooth(const, 3.0), 2.0, rtol=1e-6)
    noise = np.random.default_rng(2).normal(size=(64, 64))
    smooth = gaussian_smooth(noise, 2.0)
    assert smooth.shape == noise.shape
    assert smooth.var() < 0.2 * noise.var()
    assert abs(smooth.mean() - noise.mean()) < 0.05


def test_gaussian_smooth_matches_direct_convolution() -> None:
    rng = np.random.default_rng(3)
    m = rng.normal(size=(9, 11))
    sigma = 1.3
    r = int(np.ceil(4 * sigma))
    x = np.arange(-r, r + 1)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    k /= k.sum()
    kernel2d = np.outer(k, k)
    p = np.pad(m, r, mode="edge")
    expected = np.array(
        [[np.sum(p[i : i + 2 * r + 1, j : j + 2 * r + 1] * kernel2d) for j in range(11)] for i in range(9)]
    )
    np.testing.assert_allclose(gaussian_smooth(m, sigma), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(gaussian_smooth(m, 0.0), m.astype(np.float32))


def test_smoothing_sigma_torchray() -> None:
    assert smoothing_sigma((224, 300)) == pytest.approx(6.0)


def test_signed_percentile_clips_both_signs_at_a_percentile_of_the_magnitude() -> None:
    """LRP's mass in a few pixels (issue 51): m / P99(|m|), clipped to [-1, 1]; few values (tokens) as signed."""
    rng = np.random.default_rng(3)
    m = rng.normal(size=(32, 32))
    m[5, 5], m[9, 9] = 400.0, -300.0
    top = np.percentile(np.abs(m), 99)
    want = np.clip(m / top, -1, 1)
    got = normalize(m, "signed_percentile")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert got[5, 5] == 1.0 and got[9, 9] == -1.0 and np.abs(got).mean() > 5 * np.abs(normalize(m, "signed")).mean()
    tokens = rng.normal(size=9)
    np.testing.assert_allclose(normalize(tokens, "signed_percentile"), normalize(tokens, "signed"), rtol=1e-6)
    assert is_signed("signed_percentile") and is_signed("signed") and not is_signed("percentile")


def test_a_map_whose_mass_sits_in_a_few_pixels_is_named() -> None:
    from gradscope.app.rendering.view import concentration_note

    m = np.full((64, 64), 1e-3)
    m[:3, :3] = 50.0  # 9 of 4096 pixels hold nearly everything: 5 of them half of it
    assert "5 of its 4096 values" in concentration_note(m, "signed") and "signed_percentile" in concentration_note(
        m, "signed"
    )
    assert "clipped at the 99th percentile" in concentration_note(m, "signed_percentile")
    assert concentration_note(np.random.default_rng(0).normal(size=(64, 64)), "signed") == ""
