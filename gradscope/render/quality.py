"""Is a map worth showing? Degenerate maps (all zero, constant, non-finite) are reported, never drawn silently.

A random-init or badly conditioned network can give a map with no information (c-MWP's ``max(Σ_c Δ, 0)`` is
all zero when the contrast is negative everywhere; ε-stabilised LRP underflows to 0 on untrained BatchNorm
nets). Normalisation turns such a map into a blank picture; the front ends say why instead.
"""

from __future__ import annotations

import numpy as np


def degeneracy(m: np.ndarray) -> str | None:
    """Why ``m`` carries no spatial information (``"all zero"``, ``"constant (v)"``, ``"NaN/Inf ..."``), or None.

    Non-finite entries are reported first: they make every other statistic meaningless.
    """
    a = np.asarray(m, dtype=np.float64)
    if a.size == 0:
        return "empty"
    nan, inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
    if nan or inf:
        return f"non-finite values ({nan} NaN, {inf} Inf of {a.size})"
    lo, hi = float(a.min()), float(a.max())
    if lo == hi:
        return "all zero" if hi == 0.0 else f"constant ({hi:.3g})"
    return None
