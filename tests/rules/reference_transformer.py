"""Slow, independent NumPy references for the transformer rules, in the relevance form of the papers
(AttnLRP: Achtibat et al. 2024, eqs. for linear layers, products and softmax; CP-LRP: Ali et al. 2022). No
TensorFlow: weights come in as arrays, every sum is written out per head and position."""

from __future__ import annotations

import numpy as np


def stab(z: np.ndarray, eps: float) -> np.ndarray:
    return z + eps * np.where(z >= 0, 1.0, -1.0)


def mha_weights(layer) -> dict[str, np.ndarray]:
    """Kernels (in, heads, dim) / (heads, dim, out) and biases of a Keras MultiHeadAttention, as float64."""
    out = {}
    for part in ("query", "key", "value", "output"):
        dense = getattr(layer, "_output_dense" if part == "output" else f"_{part}_dense")
        out[f"{part}_kernel"] = np.asarray(dense.kernel, np.float64)
        bias = getattr(dense, "bias", None)
        out[f"{part}_bias"] = None if bias is None else np.asarray(bias, np.float64)
    return out


def mha_forward(w: dict, xq: np.ndarray, xv: np.ndarray, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Self-contained forward of one sample: x (T, D) -> every intermediate, as in Keras (key = value).
    ``mask`` (T, S), True where a query may attend: the others get probability 0."""

    def proj(x, part):
        z = np.einsum("td,dhk->thk", x, w[f"{part}_kernel"])
        return z if w[f"{part}_bias"] is None else z + w[f"{part}_bias"]

    q, k, v = proj(xq, "query"), proj(xv, "key"), proj(xv, "value")
    scale = 1.0 / np.sqrt(q.shape[-1])
    qs = q * scale
    s = np.einsum("thk,shk->hts", qs, k)
    allowed = np.where(np.ones_like(s, bool) if mask is None else mask[None], s, -np.inf)
    p = np.exp(allowed - allowed.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    o = np.einsum("hts,she->the", p, v)
    y = np.einsum("the,hed->td", o, w["output_kernel"])
    if w["output_bias"] is not None:
        y = y + w["output_bias"]
    return {"q": q, "k": k, "v": v, "qs": qs, "s": s, "p": p, "o": o, "y": y, "scale": scale}


def attnlrp_mha_relevance(w: dict, xq: np.ndarray, xv: np.ndarray, r_y: np.ndarray, eps: float, mask=None):
    """AttnLRP relevance at the query and value inputs of one sample, from the relevance ``r_y`` at the output
    (masked positions: probability 0, so no relevance flows through them)."""
    f = mha_forward(w, xq, xv, mask)
    q, k, v, qs, s, p, o, y = (f[n] for n in ("q", "k", "v", "qs", "s", "p", "o", "y"))
    # output projection: ε rule
    r_o = o * np.einsum("td,hed->the", r_y / stab(y, eps), w["output_kernel"])
    # O = P·V: uniform ε rule, half to each factor
    ratio = r_o / stab(o, eps)  # (t, h, e)
    r_p = 0.5 * p * np.einsum("the,she->hts", ratio, v)
    r_v = 0.5 * v * np.einsum("the,hts->she", ratio, p)
    # softmax, linearised at its input: R_in = s ⊙ (R − p Σ R)
    r_s = s * (r_p - p * r_p.sum(axis=-1, keepdims=True))
    # S = Qs·Kᵀ: uniform ε rule
    ratio_s = r_s / stab(s, eps)  # (h, t, s)
    r_qs = 0.5 * qs * np.einsum("hts,shk->thk", ratio_s, k)
    r_k = 0.5 * k * np.einsum("hts,thk->shk", ratio_s, qs)
    r_q = r_qs  # a constant scale passes relevance unchanged

    # projections: ε rule
    def back(x, part, z, r):
        return x * np.einsum("thk,dhk->td", r / stab(z, eps), w[f"{part}_kernel"])

    return back(xq, "query", q, r_q), back(xv, "key", k, r_k) + back(xv, "value", v, r_v)


def cp_mha_relevance(w: dict, xq: np.ndarray, xv: np.ndarray, r_y: np.ndarray, mask=None):
    """CP-LRP relevance at the query and value inputs: with P constant, y is linear in x through V (LRP-0,
    bias-free): R_x = x ⊙ Jᵀ(R_y / y); the query gets none (it only moves P)."""
    f = mha_forward(w, xq, xv, mask)
    g_o = np.einsum("td,hed->the", r_y / f["y"], w["output_kernel"])
    g_v = np.einsum("the,hts->she", g_o, f["p"])
    g_xv = np.einsum("she,dhe->sd", g_v, w["value_kernel"])
    return np.zeros_like(xq), xv * g_xv


def layernorm_constant_scale_vjp(x: np.ndarray, g: np.ndarray, gamma: np.ndarray | None, eps: float) -> np.ndarray:
    """VJP of y = γ(x − μ)/σ + β over the last axis with σ held constant: (γg − mean(γg))/σ."""
    sigma = np.sqrt(x.var(axis=-1, keepdims=True) + eps)
    gg = g * (gamma if gamma is not None else 1.0)
    return (gg - gg.mean(axis=-1, keepdims=True)) / sigma
