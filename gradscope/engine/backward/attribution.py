"""Attribution methods built from several backward passes of the engine, under any plan: SmoothGrad and
integrated gradients (what Captum, Xplique and tf-explain users compare rule-based maps against first), and
the Grad-CAM weighting of a feature map.

Each pass fixes the class first (the top-1 of the unperturbed input), so a noisy or interpolated copy that
the model classifies differently still explains the same class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gradscope.core.errors import TargetError
from gradscope.core.targets import Target
from gradscope.rules.plan import Plan

_CHUNK = 16  # copies per backward pass (every pass has this batch, padded: one trace for all of them)

Progress = Callable[[int, int], None]  # (copies done, copies in all); may raise Cancelled to stop


def fixed_target(engine: Any, x: np.ndarray, target: Target) -> Target:
    """``target`` with a "top-1" class resolved on the unperturbed input (one sample)."""
    if target.kind != "class" or target.index is not None:
        return target
    logits = np.asarray(engine.predict(x))
    if logits.ndim != 2:
        raise TargetError("A class target needs a (batch, classes) output; use a neuron or channel target.")
    return Target(index=int(np.argmax(logits[0])))


def _mean_input_grad(
    engine: Any, copies: np.ndarray, target: Target, plan: Plan, progress: Progress | None = None
) -> np.ndarray:
    """The mean input gradient over ``copies``, in compiled passes of one batch size (the last one padded with
    copies of the first), so that all of them run through one trace."""
    total = np.zeros(copies.shape[1:], np.float64)
    size = min(_CHUNK, len(copies))
    for start in range(0, len(copies), size):
        chunk = copies[start : start + size]
        n = len(chunk)
        if n < size:
            chunk = np.concatenate([chunk, np.repeat(copies[:1], size - n, axis=0)])
        result = engine.backward(chunk, target, plan, stats=False, mode="compiled")
        total += np.asarray(result.input_grad[:n], np.float64).sum(axis=0)
        if progress is not None:
            progress(start + n, len(copies))
    return (total / len(copies))[None].astype(np.float32)


def smoothgrad(
    engine: Any,
    x: np.ndarray,
    target: Target,
    plan: Plan | None = None,
    *,
    samples: int = 16,
    noise: float = 0.15,
    seed: int = 0,
    progress: Progress | None = None,
) -> np.ndarray:
    """Mean input gradient over ``samples`` copies of ``x`` (one sample) with Gaussian noise of standard
    deviation ``noise * (max(x) - min(x))`` (Smilkov et al. 2017; their default 10-20 %)."""
    x = np.asarray(x, np.float32)
    if samples < 1 or not np.isfinite(noise) or noise < 0:
        raise TargetError(f"SmoothGrad needs samples >= 1 and noise >= 0, got {samples} and {noise}.")
    sigma = noise * float(x.max() - x.min())
    rng = np.random.default_rng(seed)
    copies = x + rng.normal(0.0, sigma, (samples, *x.shape[1:])).astype(np.float32)
    return _mean_input_grad(engine, copies, fixed_target(engine, x, target), plan or Plan(), progress)


def integrated_gradients(
    engine: Any,
    x: np.ndarray,
    target: Target,
    plan: Plan | None = None,
    *,
    steps: int = 32,
    baseline: np.ndarray | None = None,
    progress: Progress | None = None,
) -> np.ndarray:
    """``(x - x0) * mean gradient`` on the straight path from ``x0`` (default: zeros) to ``x``, midpoint rule
    with ``steps`` points (Sundararajan et al. 2017). Under the identity plan the attributions sum to about
    ``f(x) - f(x0)`` (completeness)."""
    x = np.asarray(x, np.float32)
    if steps < 1:
        raise TargetError(f"Integrated gradients need steps >= 1, got {steps}.")
    x0 = np.zeros_like(x) if baseline is None else np.broadcast_to(np.asarray(baseline, np.float32), x.shape)
    alphas = ((np.arange(steps) + 0.5) / steps).astype(np.float32).reshape(-1, *([1] * (x.ndim - 1)))
    copies = x0 + alphas * (x - x0)
    return (x - x0) * _mean_input_grad(engine, copies, fixed_target(engine, x, target), plan or Plan(), progress)


def sampled_input_grad(
    engine: Any, x: Any, target: Target, plan: Plan, kind: str, options: dict, progress: Progress | None = None
) -> np.ndarray:
    """The input signal of a sampling method preset (``Method.sampling``): SmoothGrad's or integrated gradients'
    average, with the preset's options (others are ignored). One sample, one model input."""
    if isinstance(x, (list, tuple)):
        raise TargetError(f"{kind} needs a model with one input.")
    fn = {"smoothgrad": smoothgrad, "integrated_gradients": integrated_gradients}[kind]
    names = ("samples", "noise", "seed") if kind == "smoothgrad" else ("steps",)
    return fn(engine, x, target, plan, progress=progress, **{k: v for k, v in options.items() if k in names})


def weighted_signal(signal: np.ndarray, value: Any, *, times_input: bool, grad_cam: bool) -> np.ndarray:
    """A read-out's signal as the method defines it: times the forward value (gradient x input) and/or with
    Grad-CAM's channel weighting; a value of another shape (or none) leaves the signal as it is."""
    fits = value is not None and np.shape(value) == np.shape(signal)
    signal = _at_least_float32(signal)  # a bfloat16 product rounds each term to 8 bits: read out in float32
    if times_input and fits:
        signal = signal * _at_least_float32(value)
    if grad_cam and fits and np.ndim(signal) >= 2:
        signal = grad_cam_weighting(signal, value)
    return np.asarray(signal)


def _at_least_float32(a: Any) -> np.ndarray:
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype.name in ("bfloat16", "float16") else a


#: How one score per token is read from the signal at the token embeddings (``token_readout``), as the sidecar says.
TOKEN_READOUTS = {
    "relevance": "the relevance at each token's embedding, summed over the embedding dimension",
    "gradient_x_embedding": "the signal times each token's embedding, summed over the embedding dimension",
    "gradient_norm": "the L2 norm of the signal at each token's embedding (saliency, as Inseq and Captum read it)",
}


def token_readout(rule_names: Any, *, times_input: bool) -> str:
    """Which ``TOKEN_READOUTS`` a token map under the rules ``rule_names`` (a result's ``rules.values()``) is:
    rules that pass relevance are read as it is; a method times the input (gradient x input) sums signal x
    embedding; a gradient is the L2 norm of the gradient at the embedding (else ``gradient`` and
    ``gradient_x_input`` gave one map)."""
    from gradscope.rules.base import carries_relevance

    if carries_relevance(rule_names):
        return "relevance"
    return "gradient_x_embedding" if times_input else "gradient_norm"


def token_map(signal: np.ndarray, embedding: Any, readout: str) -> np.ndarray:
    """(seq,) one score per token from the signal at the embedding (seq, dim) read as ``readout``."""
    if readout not in TOKEN_READOUTS:
        raise ValueError(f"Unknown token read-out {readout!r}; one of {', '.join(TOKEN_READOUTS)}.")
    if readout == "gradient_norm":
        g = _at_least_float32(signal).astype(np.float32)
        return np.sqrt((g.reshape(g.shape[0], -1) ** 2).sum(axis=1)) if g.ndim >= 2 else np.abs(g)
    weighted = weighted_signal(signal, embedding, times_input=readout == "gradient_x_embedding", grad_cam=False)
    return token_scores(weighted)


def token_scores(weighted: np.ndarray) -> np.ndarray:
    """One score per token from the signal times the embedding, (seq, dim) -> (seq,): summed over the embedding
    dimension, so for gradient x input they add up (with the bias terms) to the explained logit on a linear
    model, and under LRP rules they are each token's relevance."""
    w = np.asarray(weighted, np.float32)
    return w.reshape(w.shape[0], -1).sum(axis=1) if w.ndim >= 2 else w


def grad_cam_weighting(grad: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Grad-CAM's per-channel weighting of a feature map: ``mean_hw(dy/dA)_c * A_c`` (Selvaraju et al. 2017);
    its channel sum, clamped at 0 (``sum_clamped``), is the Grad-CAM map. ``grad``/``value``: (H, W, C)."""
    g, a = np.asarray(grad, np.float32), np.asarray(value, np.float32)
    if g.ndim < 2 or g.shape != a.shape:
        raise TargetError(f"Grad-CAM needs a feature map (H, W, C) and its gradient; got shape {g.shape}.")
    alpha = g.mean(axis=tuple(range(g.ndim - 1)), keepdims=True)
    return alpha * a


def with_sampled_input(
    engine: Any, x: Any, target: Target, plan: Plan, result: Any, sampling: tuple, token: Any = None
) -> Any:
    """``result`` with its input signal replaced by SmoothGrad's or integrated gradients' average (worker);
    ``token`` gets the progress and stops the work between two passes when cancelled."""
    import dataclasses

    kind, options = sampling

    def progress(done: int, total: int) -> None:
        if token is not None:
            token.step(f"{kind}: {done} of {total} copies...")

    grad = sampled_input_grad(engine, x, target, plan, kind, options, progress)
    meta = {**result.meta, "sampling": kind}
    return dataclasses.replace(result, input_grads=[grad, *result.input_grads[1:]], meta=meta)
