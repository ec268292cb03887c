"""Channel reduction: turn a backward signal (H, W, C) into the one-value-per-location map that is drawn.

Which reduction is right depends on the method (RULES_SPEC §4): magnitude methods lose their sign on the way
back, so ``max_c |g|`` is read out; MWP/LRP signals are relevances that add up over channels, so they are summed
(signed); c-MWP keeps only the positive part of that sum.
"""

from __future__ import annotations

import functools
import math

import numpy as np

REDUCTIONS: tuple[str, ...] = ("max_abs", "sum", "sum_clamped", "l2", "abs_sum", "mean", "pos_sum")

# Read-out per method preset (RULES_SPEC §4). gradient x input is a relevance-like signed product, summed as in
# the method presets (gradscope.rules.methods).
DEFAULT_REDUCTION_FOR_METHOD: dict[str, str] = {
    "gradient": "max_abs",
    "gradient_x_input": "sum",
    "guided_backprop": "max_abs",
    "deconvnet": "max_abs",
    "mwp": "sum",
    "cmwp": "sum_clamped",
    "lrp_epsilon": "sum",
    "lrp_alpha_beta": "sum",
    "lrp_zplus": "sum",
}

_ALIASES = {"pos_sum": "sum_clamped"}


def reduce_channels(g: np.ndarray, mode: str = "max_abs", channel_axis: int | None = -1) -> np.ndarray:
    """Reduce ``g`` over its channel axis with ``mode``; returns float32 with that axis removed.

    Shapes: (H, W, C) -> (H, W); (N, H, W, C) -> (N, H, W); a Conv1D signal (L, C) -> (L,). A 1-D array, or any
    array with ``channel_axis=None``, is taken as a single-channel map and keeps its shape (the mode is then
    applied per element, e.g. ``max_abs`` -> |g|). Non-finite values propagate: the caller's normalisation
    decides how to show them.
    """
    mode = _ALIASES.get(mode, mode)
    if mode not in REDUCTIONS:
        raise ValueError(f"Unknown channel reduction {mode!r}; use one of: {', '.join(REDUCTIONS)}.")
    # float64 for the sums; |g| and its maximum are exact in the input's precision (and 5x faster on big batches)
    exact = mode == "max_abs" and np.asarray(g).dtype in (np.float32, np.float64)
    s = np.asarray(g) if exact else np.asarray(g, dtype=np.float64)
    if s.ndim == 0:
        raise ValueError("reduce_channels needs an array with at least one axis, got a scalar.")
    if channel_axis is None or s.ndim == 1:
        s = s[..., np.newaxis]
        axis = -1
    else:
        if not -s.ndim <= channel_axis < s.ndim:
            raise ValueError(f"channel_axis={channel_axis} is out of range for an array of shape {s.shape}.")
        axis = channel_axis
    if s.shape[axis] == 0:
        raise ValueError(f"Cannot reduce an empty channel axis (shape {s.shape}).")

    if mode == "max_abs":
        a = np.abs(s)
        if a.shape[axis] <= 8:  # numpy reduces a short last axis slowly: fold the channels pairwise instead
            out = functools.reduce(np.maximum, (np.take(a, i, axis=axis) for i in range(a.shape[axis])))
        else:
            out = np.max(a, axis=axis)
    elif mode == "sum":
        out = np.sum(s, axis=axis)
    elif mode == "sum_clamped":
        out = np.maximum(np.sum(s, axis=axis), 0.0)
    elif mode == "l2":
        out = np.sqrt(np.sum(s * s, axis=axis))
    elif mode == "abs_sum":
        out = np.sum(np.abs(s), axis=axis)
    else:  # mean
        out = np.mean(s, axis=axis)
    return out.astype(np.float32)


def token_grid(signal: np.ndarray) -> np.ndarray | None:
    """The (T, C) tokens of an image transformer as the (h, w, C) grid of patches they stand for: T a square,
    or T - 1 a square (a class token first, left out of the map); None when they are no grid."""
    s = np.asarray(signal)
    if s.ndim != 2:
        return None
    for skip in (0, 1):
        side = math.isqrt(s.shape[0] - skip)
        if side > 1 and side * side == s.shape[0] - skip:
            return s[skip:].reshape(side, side, s.shape[1])
    return None
