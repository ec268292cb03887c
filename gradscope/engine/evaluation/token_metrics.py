"""Faithfulness of a token map, from its perturbation curves (NumPy; the model runs in ``token_curves``).

- Ranking: the real tokens by score, largest first, ties in position order (as deletion ranks pixels); the least
  relevant first is the reverse, so "keep the top k" and "remove the top k" name the same k tokens.
- ABPC (AttnLRP's protocol, Achtibat et al. 2024, after Blücher et al. 2024): MoRF removes the most relevant tokens
  first, LeRF the least relevant first, k = 0 .. n; each point is the target's logit with those tokens' input
  embeddings replaced (zero, or the pad / mask token's). ABPC = area under LeRF - area under MoRF, trapezoids
  over the fraction of tokens removed; higher is better.
- Comprehensiveness and sufficiency (ERASER, DeYoung et al. 2020; ferret's AOPC with ``based_on="perc"``): for each
  fraction q of 1, 5, 10, 20, 50 %, k = floor(q n) tokens (a k of 0 is skipped, and so is a k equal to the previous
  one: the same rationale is averaged once); comprehensiveness = mean of p(target) - p(target | top k removed),
  higher is better; sufficiency = mean of p(target) - p(target | only the top k kept), lower is better. The
  tokens are replaced, not deleted (ferret's ``remove_tokens=False``): the sequence keeps its length and positions.
- Token pointing: a hit when the highest-scoring real token lies in the rationale a person marked.
"""

from __future__ import annotations

import numpy as np

AOPC_FRACTIONS = (0.01, 0.05, 0.10, 0.20, 0.50)


def token_order(scores: np.ndarray) -> np.ndarray:
    """(n,) positions of the real tokens, most relevant first (ties in position order); NaN ranks last."""
    s = np.nan_to_num(np.asarray(scores, np.float64), nan=-np.inf)
    return np.argsort(-s, kind="stable")


def removal_masks(order: np.ndarray, positions: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(n + 1, length) MoRF and LeRF masks (True: replaced) over a sequence of ``length`` whose real tokens sit at
    ``positions`` (in ``order``'s indexing): row k replaces the first k of the order, or of its reverse."""
    n = len(order)
    morf = np.zeros((n + 1, length), bool)
    lerf = np.zeros((n + 1, length), bool)
    for k in range(1, n + 1):
        morf[k, positions[order[:k]]] = True
        lerf[k, positions[order[::-1][:k]]] = True
    return morf, lerf


def area(curve: np.ndarray) -> float:
    """Trapezoidal area of a curve sampled at k = 0 .. n over the fraction [0, 1] (one point: the point)."""
    c = np.asarray(curve, np.float64)
    return float(c[0]) if len(c) == 1 else float(0.5 * (c[:-1] + c[1:]).mean())


def abpc(morf: np.ndarray, lerf: np.ndarray) -> float:
    """Area between the perturbation curves: LeRF above MoRF is a faithful map."""
    return area(lerf) - area(morf)


def aopc_ks(n: int) -> list[int]:
    """The k of each AOPC fraction for n tokens, as ferret cuts them: floor(q n), zeros and repeats dropped."""
    out: list[int] = []
    for q in AOPC_FRACTIONS:
        k = int(q * n)
        if 0 < k <= n and (not out or out[-1] != k):
            out.append(k)
    return out


def comprehensiveness(morf_probability: np.ndarray) -> float:
    """AOPC comprehensiveness from the MoRF probabilities (k = 0 .. n); NaN when no fraction removes a token."""
    p = np.asarray(morf_probability, np.float64)
    ks = aopc_ks(len(p) - 1)
    return float(np.mean([p[0] - p[k] for k in ks])) if ks else float("nan")


def sufficiency(lerf_probability: np.ndarray) -> float:
    """AOPC sufficiency from the LeRF probabilities: keeping the top k is removing the n - k least relevant."""
    p = np.asarray(lerf_probability, np.float64)
    n = len(p) - 1
    ks = aopc_ks(n)
    return float(np.mean([p[0] - p[n - k] for k in ks])) if ks else float("nan")


def token_pointing(scores: np.ndarray, rationale: list[int]) -> float:
    """1.0 when the highest-scoring token (first in position order on ties) is one the rationale marks."""
    return float(int(token_order(scores)[0]) in set(rationale))


def on_grid(curve: np.ndarray, points: int) -> np.ndarray:
    """A curve over k = 0 .. n resampled at ``points`` equal fractions of [0, 1] (linear): curves of texts of
    different lengths are averaged on one grid."""
    c = np.asarray(curve, np.float64)
    if len(c) == 1:
        return np.full(points, c[0])
    return np.interp(np.linspace(0.0, 1.0, points), np.linspace(0.0, 1.0, len(c)), c)
