"""Saliency maps of many images at once, each for its own class, and the model scores the metrics need.

One backward pass per batch with the classes fed as data, every batch padded to one size: one trace per plan
and batch shape, however many images and classes follow (``Engine.backward(classes=...)``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscope.core.errors import GraphError
from gradscope.core.targets import Target
from gradscope.engine.backward.attribution import grad_cam_weighting, sampled_input_grad
from gradscope.render import reduce_channels, token_grid
from gradscope.rules.methods import Method


def padded(x: np.ndarray, size: int) -> np.ndarray:
    """``x`` with its first row repeated up to ``size`` rows (one batch shape for every pass)."""
    return x if len(x) >= size else np.concatenate([x, np.repeat(x[:1], size - len(x), axis=0)])


def method_maps(engine: Any, method: Method, inputs: np.ndarray, classes: np.ndarray, batch: int) -> np.ndarray:
    """(n, h, w) the method's 2-D map of every input for its class (-1: its top-1), read at the method's node
    with its reduction, as ``gradscope.explain`` reads one. Sampling methods (SmoothGrad, integrated gradients)
    run their copies per input."""
    node = method.readout_node
    if node is not None and engine.graph.node(node).is_input:
        node = None
    maps: list[np.ndarray] = []
    for lo in range(0, len(inputs), batch):
        x, c = inputs[lo : lo + batch], np.asarray(classes[lo : lo + batch], np.int32)
        n = len(x)
        r = engine.backward(
            padded(x, batch),
            Target(),
            method.plan,
            capture=[node] if node else (),
            stats=False,
            classes=padded(c, batch),
            mode="compiled",
        )
        if node is None:
            signal, value = r.input_grad[:n], r.inputs[0][:n]
        else:
            signal, value = r.node_grads[node][:n], r.node_values[node][:n]
        if method.sampling is not None:
            if node is not None:
                raise GraphError(f"{method.sampling} reads its map at the model input, not at {node!r}.")
            top = r.target_indices[:n]
            signal = np.concatenate(
                [
                    sampled_input_grad(
                        engine, x[i : i + 1], Target(index=int(top[i])), method.plan, method.sampling, method.options
                    )
                    for i in range(n)
                ]
            )
        maps.append(_as_maps(signal, value, method))
    return np.concatenate(maps)


def _as_maps(signal: np.ndarray, value: np.ndarray, method: Method) -> np.ndarray:
    """(n, h, w) maps from a batch of read-out signals, as ``gradscope.explain`` makes one (times the value,
    Grad-CAM's weighting, an image transformer's tokens as their grid of patches, the channel reduction)."""
    if method.times_input:
        signal = signal * value
    if method.grad_cam:
        signal = np.stack([grad_cam_weighting(s, v) for s, v in zip(signal, value)])
    if signal.ndim == 3:  # (n, T, C) tokens of an image transformer: a map per patch
        grids = [token_grid(s) for s in signal]
        if all(g is not None for g in grids):
            signal = np.stack(grids)
    if signal.ndim != 4:
        raise GraphError(f"A map needs a spatial (H, W, C) signal; {method.name} gives shape {signal.shape[1:]}.")
    return reduce_channels(signal, method.reduction)


def top_classes(engine: Any, inputs: np.ndarray, batch: int) -> np.ndarray:
    """Each input's top-1 class, from the compiled forward pass in padded batches."""
    out = []
    for lo in range(0, len(inputs), batch):
        x = inputs[lo : lo + batch]
        out.append(engine.logits(padded(x, batch))[: len(x)].argmax(axis=-1))
    return np.concatenate(out).astype(np.int32)


def class_scores(engine: Any, kind: str) -> Any:
    """``score(inputs, classes) -> (n,)``: the class probability (``"probability"``: softmax of the logits, a
    sigmoid for one output; RISE's deletion/insertion score) or the model's own output for the class
    (``"output"``: probabilities when the model ends in softmax, else its logits; Xplique's MuFidelity)."""
    as_probability = kind == "probability" or engine.softmax_stripped

    def score(inputs: np.ndarray, classes: np.ndarray) -> np.ndarray:
        logits = engine.logits(inputs).astype(np.float64)
        if as_probability:
            if logits.shape[-1] == 1:  # one output: its sigmoid is the probability of the one class
                return 1.0 / (1.0 + np.exp(-logits[:, 0]))
            z = logits - logits.max(axis=-1, keepdims=True)
            probs = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
            return probs[np.arange(len(classes)), classes]
        return logits[np.arange(len(classes)), classes]

    return score
