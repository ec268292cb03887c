"""The evaluation metrics against independent slow references and what they guarantee by construction."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.engine.evaluation import faithfulness as fm


def _torchray_hit(mask: np.ndarray, point: tuple[int, int], tolerance: float) -> bool:
    """TorchRay's PointingGame.evaluate: an acceptance disc around the point, a hit when it meets the mask."""
    h, w = mask.shape
    v, u = np.meshgrid((np.arange(h) - point[0]) ** 2.0, (np.arange(w) - point[1]) ** 2.0, indexing="ij")
    return bool((mask & ((v + u) < tolerance**2)).any())


def test_pointing_hit_and_hit_region_match_torchray_point_by_point():
    rng = np.random.default_rng(0)
    for tolerance in (1.0, 2.5, 4.29, 6.0):
        mask = np.zeros((23, 31), bool)
        mask[rng.integers(0, 23, 5), rng.integers(0, 31, 5)] = True
        mask[8:11, 12:20] = True
        region = fm.hit_region(mask, tolerance)
        for r in range(23):
            for c in range(31):
                want = _torchray_hit(mask, (r, c), tolerance)
                assert fm.pointing_hit((r, c), mask, tolerance) == want
                assert region[r, c] == want


def test_pointing_point_is_the_maximum_of_the_resized_blurred_map():
    saliency = np.zeros((8, 8), np.float32)
    saliency[2, 5] = 1.0
    assert fm.pointing_point(saliency, (8, 8), smooth=False) == (2, 5)
    row, col = fm.pointing_point(saliency, (64, 64), smooth=True)  # 8x upsampled: the peak's centre
    assert abs(row - 2.5 * 8) <= 1 and abs(col - 5.5 * 8) <= 1
    ties = np.ones((4, 4), np.float32)
    assert fm.pointing_point(ties, (4, 4), smooth=False) == (0, 0)  # first in raster order, as torch.argmax
    nan = np.full((4, 4), np.nan, np.float32)
    nan[3, 1] = -5.0
    assert fm.pointing_point(nan, (4, 4), smooth=False) == (3, 1)  # NaN never wins


def test_difficult_pairs_are_small_objects_with_a_distractor():
    mask = np.zeros((10, 10), int) - 1
    mask[:2, :2] = 0  # 4 % of the image
    mask[5:, :] = 1  # 50 %
    labelled = np.ones((10, 10), bool)
    assert fm.is_difficult(mask == 0, labelled, 2) and not fm.is_difficult(mask == 1, labelled, 2)
    assert not fm.is_difficult(mask == 0, labelled, 1)  # no distractor


def _reference_curve(score, x, saliency, cls, baseline, mode, steps):
    """Xplique's CausalFidelity.detailed_evaluate for one input, written out (stable order, ties by index)."""
    h, w = saliency.shape
    flat = saliency.reshape(-1)
    order = sorted(range(h * w), key=lambda i: (-flat[i], i))
    start, end = (x, baseline) if mode == "deletion" else (baseline, x)
    out = []
    for k in np.linspace(0, h * w, steps + 1).astype(int):
        img = start.copy().reshape(h * w, -1)
        for i in order[:k]:
            img[i] = end.reshape(h * w, -1)[i]
        out.append(score(img.reshape(1, *x.shape), np.array([cls]))[0])
    return np.array(out)


def _linear_score(weights):
    def score(inputs, classes):
        return (inputs * weights[None]).reshape(len(inputs), -1).sum(axis=1)

    return score


@pytest.mark.parametrize("mode", ["deletion", "insertion"])
def test_causal_curves_match_the_reference_and_end_where_the_path_ends(mode):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 5, 6, 2)).astype(np.float32)
    weights = rng.normal(size=(5, 6, 2)).astype(np.float32)
    maps = rng.integers(0, 4, size=(3, 5, 6)).astype(np.float32)  # many ties
    base = fm.insertion_baseline(x) if mode == "insertion" else np.zeros_like(x)
    score = _linear_score(weights)
    got = fm.causal_curves(score, x, maps, np.zeros(3, int), base, mode, steps=7, chunk=5)
    for i in range(3):
        want = _reference_curve(score, x[i], maps[i], 0, base[i], mode, 7)
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)
        first, last = (x[i], base[i]) if mode == "deletion" else (base[i], x[i])
        np.testing.assert_allclose(got[i, 0], score(first[None], None)[0], rtol=1e-5)
        np.testing.assert_allclose(got[i, -1], score(last[None], None)[0], rtol=1e-5)


def test_deletion_in_the_order_of_the_true_contributions_falls_fastest():
    """For a linear score with a zero baseline, deleting by w*x (each pixel's exact contribution) leaves the
    least score after every step: no other order's curve lies below it."""
    rng = np.random.default_rng(2)
    x = rng.uniform(size=(1, 6, 6, 1)).astype(np.float32)
    w = rng.normal(size=(6, 6, 1)).astype(np.float32)
    score = _linear_score(w)
    exact = (w * x[0])[..., 0][None]
    best = fm.causal_curves(score, x, exact, np.zeros(1, int), np.zeros_like(x), "deletion", steps=36)
    for seed in range(5):
        other = np.random.default_rng(seed).uniform(size=(1, 6, 6))
        curve = fm.causal_curves(score, x, other, np.zeros(1, int), np.zeros_like(x), "deletion", steps=36)
        assert np.all(best <= curve + 1e-5)
        assert fm.area_under(best)[0] <= fm.area_under(curve)[0] + 1e-6


def test_area_under_is_the_trapezoid_rule_on_the_unit_interval():
    c = np.array([[1.0, 0.5, 0.25, 0.0], [0.0, 1.0, 1.0, 1.0]])
    want = [np.trapezoid(row, np.linspace(0, 1, 4)) for row in c]
    np.testing.assert_allclose(fm.area_under(c), want)


def test_spearman_matches_scipy_with_ties():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for _ in range(20):
        a = rng.integers(0, 5, 30).astype(float)
        b = a + rng.normal(size=30)
        np.testing.assert_allclose(fm.spearman(a, b), scipy_stats.spearmanr(a, b)[0], rtol=1e-12)
    assert np.isnan(fm.spearman(np.ones(5), np.arange(5.0)))


def test_fidelity_masks_are_tf_nearest_resized_grids():
    tf = pytest.importorskip("tensorflow")
    masks = fm.fidelity_masks(np.random.default_rng(4), 6, 9, 0.2, (64, 50))
    cells = masks[:, ::1, ::1]
    assert set(np.unique(cells)) <= {0.0, 1.0}
    # the grid the masks came from, resized as Xplique does (tf.image.resize, nearest)
    grid = np.random.default_rng(4).uniform(size=(6, 81)) > 0.2
    want = tf.image.resize(grid.reshape(6, 9, 9, 1).astype(np.float32), (64, 50), method="nearest").numpy()[..., 0]
    np.testing.assert_array_equal(masks, want)
    big = fm.fidelity_masks(np.random.default_rng(5), 400, 9, 0.2, (9, 9))
    assert abs((1 - big).mean() - 0.2) < 0.02  # a fifth of the cells removed


def test_mufidelity_is_one_for_exact_attributions_of_a_linear_model():
    """f(x) = sum(w x) with baseline 0: removing a subset drops f by exactly the sum of w x over it, so the exact
    attribution w x correlates perfectly; an all-zero map scores 0 (Xplique's NaN rule)."""
    rng = np.random.default_rng(6)
    x = rng.uniform(size=(12, 12, 1)).astype(np.float32)
    w = rng.normal(size=(12, 12, 1)).astype(np.float32)
    score = _linear_score(w)
    masks = fm.fidelity_masks(rng, 50, 4, 0.3, (12, 12))
    drops = fm.fidelity_drops(score, x, 0, masks, 0.0, chunk=7)
    assert fm.fidelity_score((w * x)[..., 0], masks, drops) == pytest.approx(1.0)
    assert fm.fidelity_score(np.zeros((12, 12)), masks, drops) == 0.0
    assert fm.fidelity_score(-(w * x)[..., 0], masks, drops) == pytest.approx(-1.0)
