"""Normalisation, resizing and smoothing of 2-D saliency maps (float32 in, float32 out).

A map has arbitrary scale (a gradient is tiny, a relevance sums to the logit), so it is brought to [0, 1]
(or [-1, 1] for signed maps) before a colormap is applied. Non-finite values come out as 0: the diagnostics
panel reports NaN/Inf counts, the picture must still be drawable.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

NORMALIZATIONS: tuple[str, ...] = ("minmax", "percentile", "signed", "signed_percentile", "abs", "abs_max")
#: Fewer values than this (a token strip, a feature bar) are never clipped: a percentile of a few is their top.
PERCENTILE_MIN_VALUES = 100


def is_signed(mode: str) -> bool:
    """Whether a normalisation keeps the sign (a diverging colour map centred on zero)."""
    return mode in ("signed", "signed_percentile")


RESIZE_METHODS: tuple[str, ...] = ("bilinear", "bicubic", "nearest")

_RESAMPLE = {
    "bilinear": Image.Resampling.BILINEAR,  # TorchRay: F.interpolate(bilinear, align_corners=False)
    "bicubic": Image.Resampling.BICUBIC,  # Caffe demo: skimage resize order=3
    "nearest": Image.Resampling.NEAREST,
}


def normalize(m: np.ndarray, mode: str = "minmax", percentile: float = 99.0) -> np.ndarray:
    """Scale a map for display; returns float32 of the same shape.

    - ``minmax``: ``m -= min``, then divide by ``max`` if ``max > 0`` (Caffe demo) -> [0, 1].
    - ``percentile``: ``|m|`` clipped at its ``percentile``-th percentile, divided by it -> [0, 1]; one hot
      pixel then does not wash out the rest. If that percentile is 0 (a sparse map) ``max|m|`` is used.
    - ``signed``: ``m / max|m|`` -> [-1, 1], zero stays zero (for diverging colormaps).
    - ``signed_percentile``: ``m`` over the ``percentile``-th percentile of ``|m|``, clipped to [-1, 1]: a signed
      map whose mass sits in a few pixels (LRP's) still shows the rest, as peers draw it (Captum clips the top 2 %);
      a map of fewer than ``PERCENTILE_MIN_VALUES`` values (tokens, features) is ``signed``.
    - ``abs`` (alias ``abs_max``): ``|m| / max|m|`` -> [0, 1].

    A constant map carries no spatial information and becomes zeros; NaN/Inf entries become 0 and are left
    out of the statistics.
    """
    if mode == "abs_max":
        mode = "abs"
    if mode not in NORMALIZATIONS:
        raise ValueError(f"Unknown normalisation {mode!r}; use one of: {', '.join(NORMALIZATIONS)}.")
    a = np.asarray(m, dtype=np.float64)
    finite = np.isfinite(a)
    out = np.zeros(a.shape, dtype=np.float64)
    if not finite.any():
        return out.astype(np.float32)
    v = a[finite]
    lo, hi = float(v.min()), float(v.max())
    if lo == hi:  # constant (including all-zero)
        return out.astype(np.float32)

    if mode == "minmax":
        shifted = v - lo
        top = float(shifted.max())
        out[finite] = shifted / top if top > 0 else shifted
    elif mode == "percentile":
        if not 0.0 < percentile <= 100.0:
            raise ValueError(f"percentile must be in (0, 100], got {percentile}.")
        mag = np.abs(v)
        top = float(np.percentile(mag, percentile))
        if top <= 0:
            top = float(mag.max())
        out[finite] = np.clip(mag / top, 0.0, 1.0)
    elif mode == "signed_percentile":
        mag = np.abs(v)
        top = float(np.percentile(mag, percentile)) if v.size >= PERCENTILE_MIN_VALUES else 0.0
        if top <= 0:
            top = float(mag.max())
        out[finite] = np.clip(v / top, -1.0, 1.0)
    else:  # signed / abs
        top = float(np.max(np.abs(v)))
        out[finite] = v / top if mode == "signed" else np.abs(v) / top
    return out.astype(np.float32)


def resize_map(m: np.ndarray, size: tuple[int, int], method: str = "bilinear") -> np.ndarray:
    """Resample a 2-D map to ``size = (W, H)`` (Pillow's order) with a float ("F") image: no 8-bit rounding.

    Bicubic can overshoot the input range; clip afterwards if the colormap needs [0, 1].
    """
    if method not in _RESAMPLE:
        raise ValueError(f"Unknown resize method {method!r}; use one of: {', '.join(RESIZE_METHODS)}.")
    a = np.asarray(m, dtype=np.float32)
    if a.ndim != 2:
        raise ValueError(f"resize_map needs a 2-D (h, w) map, got shape {a.shape}.")
    w, h = (int(s) for s in size)
    if w <= 0 or h <= 0:
        raise ValueError(f"size must be positive (W, H), got {size}.")
    if a.shape == (h, w):
        return a.copy()
    a = np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)  # a NaN would spread over the filter support
    img = Image.fromarray(np.ascontiguousarray(a))  # float32 2-D -> mode "F" (the mode= argument is deprecated)
    return np.asarray(img.resize((w, h), _RESAMPLE[method]), dtype=np.float32)


def smoothing_sigma(shape: tuple[int, ...], fraction: float = 0.02) -> float:
    """TorchRay's benchmark blur: ``sigma = fraction * max(H, W)`` pixels."""
    return float(fraction) * float(max(shape[0], shape[1]))


def gaussian_smooth(m: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur over the first two axes, replicate padding (as TorchRay's ``imsmooth``).

    The kernel spans ``±ceil(4 sigma)`` and sums to one, so a constant map is unchanged. ``sigma <= 0`` returns
    a copy.
    """
    a = np.asarray(m, dtype=np.float64)
    if a.ndim < 2:
        raise ValueError(f"gaussian_smooth needs a map with two spatial axes, got shape {a.shape}.")
    if sigma <= 0:
        return a.astype(np.float32)
    radius = max(1, math.ceil(4.0 * sigma))
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    k /= k.sum()
    for axis in (0, 1):
        n = a.shape[axis]
        pad = [(0, 0)] * a.ndim
        pad[axis] = (radius, radius)
        p = np.pad(a, pad, mode="edge")
        acc = np.zeros_like(a)
        for i, w in enumerate(k):
            acc += w * np.take(p, np.arange(i, i + n), axis=axis)
        a = acc
    return a.astype(np.float32)
