"""Slow NumPy references (float64) for the language-model pieces the AttnLRP / CP-LRP rules act on: keras_hub's
Llama attention (rotary embedding, grouped key/value heads, causal mask) forward and its modified backward, RMS
norms with the normaliser held constant, gated products. Independent of TensorFlow's gradients: every backward
here is written out by hand."""

from __future__ import annotations

import numpy as np


def rope(x: np.ndarray, wavelength: float, inverse: bool = False) -> np.ndarray:
    """keras_hub's RotaryEmbedding on (seq, heads, dim): rotate-half with cos/sin of position x frequency;
    ``inverse``: the transposed rotation (what a gradient passes back)."""
    seq, _, dim = x.shape
    inv_freq = 1.0 / wavelength ** (np.arange(0, dim, 2) / dim)
    freq = np.outer(np.arange(seq), inv_freq)
    emb = np.concatenate([freq, freq], axis=-1)[:, None, :]
    cos, sin = np.cos(emb), np.sin(emb) * (-1.0 if inverse else 1.0)
    half = dim // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def llama_attention(w: dict, x: np.ndarray, mask: np.ndarray, wavelength: float) -> dict:
    """Forward of one sequence ``x`` (seq, hidden): every intermediate the backward needs."""
    q = rope(np.einsum("sm,muh->suh", x, w["q"]), wavelength)
    k = rope(np.einsum("sm,muh->suh", x, w["k"]), wavelength)
    v = np.einsum("sm,muh->suh", x, w["v"])
    groups = q.shape[1] // k.shape[1]
    kr, vr = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    scale = 1.0 / np.sqrt(q.shape[-1])
    scores = np.einsum("qhd,khd->hqk", q, kr) * scale
    scores = np.where(mask[None] > 0, scores, -1e9)
    a = np.exp(scores - scores.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    o = np.einsum("hqk,khd->qhd", a, vr)
    y = np.einsum("qhd,hdm->qm", o, w["o"])
    return {"q": q, "k": k, "v": v, "kr": kr, "vr": vr, "a": a, "o": o, "y": y, "scale": scale, "groups": groups}


def llama_attention_backward(w: dict, x: np.ndarray, f: dict, g: np.ndarray, factors, wavelength: float):
    """The gradient at ``x`` for the output gradient ``g``, with the gradients at q, k and v (after the rotary
    embedding, before the heads are repeated) multiplied by ``factors`` (AttnLRP: ¼, ¼, ½; CP-LRP: 0, 0, 1)."""
    fq, fk, fv = factors
    go = np.einsum("qm,hdm->qhd", g, w["o"])
    ga = np.einsum("qhd,khd->hqk", go, f["vr"])
    gvr = np.einsum("hqk,qhd->khd", f["a"], go)
    gs = f["a"] * (ga - (ga * f["a"]).sum(-1, keepdims=True))  # softmax's own gradient
    gq = np.einsum("hqk,khd->qhd", gs, f["kr"]) * f["scale"]
    gkr = np.einsum("hqk,qhd->khd", gs, f["q"]) * f["scale"]
    seq, kv, dim = f["k"].shape
    gk = gkr.reshape(seq, kv, f["groups"], dim).sum(2)  # the repeated heads' gradients add up
    gv = gvr.reshape(seq, kv, f["groups"], dim).sum(2)
    gq, gk, gv = fq * gq, fk * gk, fv * gv
    gq, gk = rope(gq, wavelength, inverse=True), rope(gk, wavelength, inverse=True)
    return sum(np.einsum("suh,muh->sm", gp, w[name]) for gp, name in ((gq, "q"), (gk, "k"), (gv, "v")))


def rms_constant_vjp(x: np.ndarray, g: np.ndarray, scale: np.ndarray, eps: float) -> np.ndarray:
    """RMS norm ``x · s · scale`` with ``s = 1/sqrt(mean(x²) + ε)`` held constant: the gradient is ``g · s · scale``."""
    s = 1.0 / np.sqrt((x**2).mean(-1, keepdims=True) + eps)
    return g * s * scale
