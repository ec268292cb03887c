"""Numbers the views show beside the gradients: weight statistics per node, the model input's gradient
statistics (computed on the worker, delivered as plain data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gradscope.core.names import weight_names
from gradscope.core.results import BackwardResult, NodeStats


@dataclass(frozen=True)
class WeightInfo:
    name: str
    shape: tuple[int, ...]
    mean: float
    std: float
    min: float
    max: float
    zero_fraction: float

    def describe(self) -> str:
        shape = "x".join(str(d) for d in self.shape) or "scalar"
        return f"{self.name} {shape}: mean {self.mean:.3g}, std {self.std:.3g}, min {self.min:.3g}, max {self.max:.3g}"


def weight_info(engine: Any) -> dict[str, list[WeightInfo]]:
    """Weight statistics per node (runs on the worker: reading variables is TensorFlow work)."""
    out: dict[str, list[WeightInfo]] = {}
    seen: dict[int, list[WeightInfo]] = {}
    for node in engine.graph.nodes:
        if node.fused_with is not None:  # the activation of a fused layer: its weights are at "<id>:pre"
            continue
        op = engine.exec.operations.get(node.id)
        if op is None or not getattr(op, "weights", None) or getattr(op, "layers", None):
            continue
        if id(op) in seen:  # a shared layer: same weights for every call
            out[node.id] = seen[id(op)]
            continue
        infos = []
        for v, name in zip(op.weights, weight_names(op, op.weights)):  # the names rules address them by
            a = np.asarray(v)
            if a.size == 0:
                continue
            mean, std = _moments(a)
            infos.append(
                WeightInfo(
                    name,
                    tuple(a.shape),
                    mean,
                    std,
                    float(a.min()),
                    float(a.max()),
                    1.0 - np.count_nonzero(a) / a.size,
                )
            )
        out[node.id] = seen[id(op)] = infos
    return out


def _moments(a: np.ndarray, block: int = 1 << 20) -> tuple[float, float]:
    """Mean and standard deviation in float64, a block at a time: a float64 copy of a BERT-base model's
    weights (880 MB of fresh memory) took longer than the statistics. Shifted by the first value, so values
    far from zero with a small spread (BatchNorm variances) keep their digits."""
    flat = a.reshape(-1)
    shift = float(flat[0])
    total = squares = 0.0
    for start in range(0, flat.size, block):
        b = flat[start : start + block].astype(np.float64) - shift
        total += float(b.sum())
        squares += float(np.dot(b, b))
    mean = total / flat.size
    return shift + mean, float(np.sqrt(max(squares / flat.size - mean * mean, 0.0)))


def with_input_stats(result: BackwardResult) -> BackwardResult:
    """Add the model input's statistics (the engine has them only for nodes) under ``INPUT_KEY``."""
    g = np.asarray(result.input_grads[0], dtype=np.float64)
    finite = np.isfinite(g)
    gf = np.where(finite, g, 0.0)
    result.meta["input_stats"] = NodeStats(
        float(np.sqrt(np.sum(gf * gf))),
        float(np.mean(np.abs(gf))) if g.size else 0.0,
        float(np.max(np.abs(gf))) if g.size else 0.0,
        float(np.mean(g == 0)) if g.size else 1.0,
        int(np.isnan(g).sum()),
        int(np.isinf(g).sum()),
    )
    return result
