"""Dataset-level scores of saliency maps, as the literature defines them (NumPy; the model is a ``score`` callable).

- Pointing Game (Zhang et al. 2016, TorchRay's protocol): the map, resized to the image (bilinear) and blurred
  for gradient-like methods, points at its maximum (first in raster order); a hit when some pixel of the class
  mask lies at a squared distance below ``tolerance²`` from that point (TorchRay's ``PointingGame.evaluate``).
- Deletion / insertion (Petsiuk et al. 2018, RISE; Xplique's ``Deletion`` / ``Insertion``): the pixels, in the
  order of the map (largest first, ties in raster order), are replaced by a baseline (deletion) or put back into
  the baseline (insertion) in ``steps`` equal parts; the score is the area under the class probability curve
  over the fraction of pixels changed (trapezoids). Every channel of a pixel changes at once.
- MuFidelity (Bhatt et al. 2020, as Xplique's ``MuFidelity``): ``samples`` random subsets of a ``grid x grid``
  grid (each cell removed with probability ``subset``) are set to the baseline; the score is Spearman's
  correlation between the drop of the class score and the sum of the map over the removed pixels (0 when
  either is constant).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gradscope.render.normalize import gaussian_smooth, resize_map, smoothing_sigma

#: score(inputs (n, H, W, C), classes (n,)) -> (n,) the class score of each input (a model forward pass)
Score = Callable[[np.ndarray, np.ndarray], np.ndarray]

INSERTION_BLUR_SIGMA = 5.0  # RISE's insertion substrate: Gaussian blur, sigma 5 px at 224 px (scaled with size)


# ------------------------------------------------------------------------------------------------- pointing
def pointing_points(maps: np.ndarray, size: tuple[int, int], smooth: bool) -> np.ndarray:
    """(k, 2) row and column of each map's maximum after resizing it to ``size`` = (H, W) (bilinear) and, when
    ``smooth``, blurring it with TorchRay's sigma (0.02 * max(H, W)); first in raster order, NaN never wins.
    The k maps are resized one by one and blurred as one (H, W, k) stack."""
    h, w = size
    full = np.stack([resize_map(np.asarray(m, np.float32), (w, h), "bilinear") for m in maps], axis=-1)
    if smooth:
        full = gaussian_smooth(full, smoothing_sigma(full.shape))
    flat = np.argmax(np.nan_to_num(full, nan=-np.inf).reshape(h * w, len(maps)), axis=0)
    return np.stack(np.unravel_index(flat, (h, w)), axis=1)


def pointing_point(saliency: np.ndarray, size: tuple[int, int], smooth: bool) -> tuple[int, int]:
    """``pointing_points`` of one map."""
    row, col = pointing_points(np.asarray(saliency)[None], size, smooth)[0]
    return int(row), int(col)


def pointing_hit(point: tuple[int, int], class_mask: np.ndarray, tolerance: float) -> bool:
    """Whether some pixel of ``class_mask`` (bool, (H, W)) lies at a squared distance below ``tolerance²``."""
    rows, cols = np.nonzero(class_mask)
    d2 = (rows - point[0]) ** 2 + (cols - point[1]) ** 2
    return bool(np.any(d2 < tolerance * tolerance))


def hit_region(class_mask: np.ndarray, tolerance: float) -> np.ndarray:
    """The points that would score a hit for ``class_mask``: its pixels dilated by the open disc of radius
    ``tolerance`` (its mean is the expected score of a uniformly random point). Row by row of the disc: a running
    sum finds the mask within the disc's half-width on each row, 2r + 1 passes instead of (2r + 1)²."""
    h, w = class_mask.shape
    r = int(np.ceil(tolerance))
    sums = np.pad(np.cumsum(class_mask.astype(np.int32), axis=1), ((0, 0), (1, 0)))  # (h, w + 1)
    cols = np.arange(w)
    region = np.zeros((h, w), bool)
    for dy in range(-r, r + 1):
        room = tolerance * tolerance - dy * dy
        if room <= 0:
            continue
        half = int(np.floor(np.sqrt(room)))
        while half * half >= room:  # the largest dx with dx² < room
            half -= 1
        lo, hi = np.clip(cols - half, 0, w), np.clip(cols + half + 1, 0, w)
        near = (sums[:, hi] - sums[:, lo]) > 0  # near[y, x]: mask on row y within x ± half
        if dy >= 0:
            region[: h - dy] |= near[dy:]
        else:
            region[-dy:] |= near[: h + dy]
    return region


def is_difficult(class_mask: np.ndarray, labelled: np.ndarray, classes_in_image: int) -> bool:
    """The Pointing Game's difficult pair (Zhang et al. 2016): the class covers less than a quarter of the image
    and another class is present (a distractor). ``labelled``: the pixels that are not "ignore"."""
    return bool(classes_in_image > 1 and class_mask.sum() < 0.25 * max(int(labelled.sum()), 1))


# ------------------------------------------------------------------------------------------------- deletion / insertion
def causal_curves(
    score: Score,
    inputs: np.ndarray,
    maps: np.ndarray,
    classes: np.ndarray,
    baseline: np.ndarray,
    mode: str,
    steps: int,
    chunk: int = 64,
) -> np.ndarray:
    """(n, steps + 1) class scores along the deletion (``inputs`` -> ``baseline``) or insertion (``baseline`` ->
    ``inputs``) path, pixels taken in the order of ``maps`` (n, H, W) at the inputs' size."""
    if mode not in ("deletion", "insertion"):
        raise ValueError(f"mode must be 'deletion' or 'insertion', not {mode!r}")
    n, h, w = maps.shape
    pixels = h * w
    order = np.argsort(-maps.reshape(n, pixels), axis=1, kind="stable")  # largest first, ties in raster order
    counts = np.linspace(0, pixels, steps + 1).astype(np.int64)
    start, end = (inputs, baseline) if mode == "deletion" else (baseline, inputs)
    start = start.reshape(n, pixels, -1)
    end = end.reshape(n, pixels, -1)
    curves = np.empty((n, steps + 1), np.float64)
    jobs = [(i, k) for i in range(n) for k in range(steps + 1)]
    for lo in range(0, len(jobs), chunk):
        part = jobs[lo : lo + chunk]
        batch = np.empty((len(part), pixels, start.shape[-1]), np.float32)
        for j, (i, k) in enumerate(part):
            batch[j] = start[i]
            changed = order[i, : counts[k]]
            batch[j, changed] = end[i, changed]
        got = score(batch.reshape(len(part), *inputs.shape[1:]), np.array([classes[i] for i, _ in part]))
        for j, (i, k) in enumerate(part):
            curves[i, k] = got[j]
    return curves


def area_under(curves: np.ndarray) -> np.ndarray:
    """Trapezoidal area under curves sampled at equal steps over [0, 1] (RISE, Xplique)."""
    c = np.asarray(curves, np.float64)
    return 0.5 * (c[..., :-1] + c[..., 1:]).mean(axis=-1)


def insertion_baseline(inputs: np.ndarray) -> np.ndarray:
    """RISE's insertion start: each input blurred (sigma 5 px at 224 px, scaled to the input's size)."""
    out = np.empty_like(inputs, dtype=np.float32)
    for i, x in enumerate(inputs):
        out[i] = gaussian_smooth(x, INSERTION_BLUR_SIGMA * max(x.shape[0], x.shape[1]) / 224.0)
    return out


# ------------------------------------------------------------------------------------------------- MuFidelity
def fidelity_masks(rng: np.random.Generator, samples: int, grid: int, subset: float, size: tuple[int, int]):
    """(samples, H, W) float masks, 1 = kept, 0 = set to the baseline: a ``grid x grid`` draw (a cell removed
    with probability ``subset``), resized nearest as ``tf.image.resize`` does (half-pixel centres)."""
    h, w = size
    cells = (rng.uniform(size=(samples, grid * grid)) > subset).astype(np.float32).reshape(samples, grid, grid)
    rows = np.minimum(np.floor((np.arange(h) + 0.5) * grid / h).astype(np.int64), grid - 1)
    cols = np.minimum(np.floor((np.arange(w) + 0.5) * grid / w).astype(np.int64), grid - 1)
    return cells[:, rows][:, :, cols]


def fidelity_drops(score: Score, x: np.ndarray, cls: int, masks: np.ndarray, baseline: float, chunk: int = 64):
    """(samples,) the drop of the class score of one input ``x`` (H, W, C) when each mask's removed pixels are
    set to ``baseline``: what MuFidelity correlates, the same for every method (computed once per image)."""
    base = float(score(x[None], np.array([cls]))[0])
    drops = np.empty(len(masks), np.float64)
    for lo in range(0, len(masks), chunk):
        m = masks[lo : lo + chunk, :, :, None]
        perturbed = (x[None] * m + (1.0 - m) * baseline).astype(np.float32)
        drops[lo : lo + len(m)] = base - score(perturbed, np.full(len(m), cls))
    return drops


def fidelity_score(saliency: np.ndarray, masks: np.ndarray, drops: np.ndarray) -> float:
    """MuFidelity of one map (H, W) at the input's size: Spearman's rho between the drops and the map's sum over
    each mask's removed pixels; 0 when either does not vary (Xplique)."""
    attributed = ((1.0 - masks) * np.asarray(saliency, np.float64)[None]).reshape(len(masks), -1).sum(axis=1)
    rho = spearman(attributed, drops)
    return 0.0 if not np.isfinite(rho) else rho


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (ties share their mean rank), NaN when either side is constant."""
    ra, rb = _ranks(np.asarray(a, np.float64)), _ranks(np.asarray(b, np.float64))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def _ranks(v: np.ndarray) -> np.ndarray:
    order = np.argsort(v, kind="stable")
    sorted_v = v[order]
    starts = np.flatnonzero(np.r_[True, sorted_v[1:] != sorted_v[:-1]])
    ends = np.r_[starts[1:], len(v)]
    mean_rank = (starts + ends - 1) / 2.0 + 1.0
    ranks = np.empty(len(v), np.float64)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks
