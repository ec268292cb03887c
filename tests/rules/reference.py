"""A slow, independent NumPy forward + backward for small nets, with per-node ReLU backward variants.

Nothing here uses gradscope or TensorFlow: the layers' weights and configs are read through the public Keras API
(``get_weights``/``get_config``) by the test, and every op is written out with explicit loops in float64.
The net is given explicitly as a list of nodes, so the reference does not share the engine's graph walk:

    net = ReferenceNet([
        RefNode("x", "input"),
        RefNode("conv:pre", "conv2d", ("x",), conv_params(model.get_layer("conv"))),
        RefNode("conv", "relu", ("conv:pre",)),
        ...
    ])
    values = net.forward(x)
    grads = net.backward(values, class_index=2, relu_mode="guided")

Ops: input, conv2d (strides, 'same'/'valid', bias; linear part only), dense (linear part only), relu, relu6,
leaky_relu (params alpha), maxpool (2x2 stride 2 'valid'; raises on ties, RULES_SPEC pitfall), flatten (NHWC
order, like Keras), gap (global average pooling over H, W), add.
ReLU backward modes: "gradient" (g·f'(z)), "guided" (g·f'(z)·1[g>0]) and "deconvnet" (max(g, 0)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

RELU_OPS = ("relu", "relu6", "leaky_relu")
RELU_MODES = ("gradient", "guided", "deconvnet")


@dataclass
class RefNode:
    id: str
    op: str
    inputs: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)


def conv_params(layer: Any) -> dict[str, Any]:
    """Kernel, bias, strides and padding of a Keras Conv2D (its activation is for the test to add as a node)."""
    cfg = layer.get_config()
    weights = layer.get_weights()
    kernel = np.asarray(weights[0], np.float64)
    bias = np.asarray(weights[1], np.float64) if cfg.get("use_bias", True) else np.zeros(kernel.shape[-1])
    assert cfg.get("data_format", "channels_last") == "channels_last"
    assert tuple(cfg.get("dilation_rate", (1, 1))) == (1, 1) and cfg.get("groups", 1) == 1
    return {"kernel": kernel, "bias": bias, "strides": tuple(cfg["strides"]), "padding": cfg["padding"]}


def dense_params(layer: Any) -> dict[str, Any]:
    cfg = layer.get_config()
    weights = layer.get_weights()
    kernel = np.asarray(weights[0], np.float64)
    bias = np.asarray(weights[1], np.float64) if cfg.get("use_bias", True) else np.zeros(kernel.shape[-1])
    return {"kernel": kernel, "bias": bias}


# ---------------------------------------------------------------------------------------------- conv helpers
def _same_pads(size: int, k: int, s: int) -> tuple[int, int]:
    """TensorFlow's 'same' padding: total = max((ceil(n/s) - 1)·s + k - n, 0), the extra pixel at the end."""
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def _conv_geometry(x_shape: tuple, kernel: np.ndarray, strides: tuple, padding: str):
    _, h, w, _ = x_shape
    kh, kw = kernel.shape[:2]
    sh, sw = strides
    if padding == "same":
        (pt, pb), (pl, pr) = _same_pads(h, kh, sh), _same_pads(w, kw, sw)
    elif padding == "valid":
        pt = pb = pl = pr = 0
    else:
        raise ValueError(f"padding {padding!r}")
    oh = (h + pt + pb - kh) // sh + 1
    ow = (w + pl + pr - kw) // sw + 1
    return (pt, pb, pl, pr), (oh, ow)


def conv2d_forward(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, strides: tuple, padding: str) -> np.ndarray:
    (pt, pb, pl, pr), (oh, ow) = _conv_geometry(x.shape, kernel, strides, padding)
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    kh, kw = kernel.shape[:2]
    sh, sw = strides
    out = np.zeros((x.shape[0], oh, ow, kernel.shape[-1]))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, i * sh : i * sh + kh, j * sw : j * sw + kw, :]  # (n, kh, kw, cin)
            out[:, i, j, :] = np.tensordot(patch, kernel, axes=([1, 2, 3], [0, 1, 2])) + bias
    return out


def conv2d_backward(g: np.ndarray, x: np.ndarray, kernel: np.ndarray, strides: tuple, padding: str) -> np.ndarray:
    """d<conv(x), g>/dx: scatter every output position's g·Wᵀ back onto its input patch."""
    (pt, pb, pl, pr), (oh, ow) = _conv_geometry(x.shape, kernel, strides, padding)
    n, h, w, _ = x.shape
    kh, kw = kernel.shape[:2]
    sh, sw = strides
    gxp = np.zeros((n, h + pt + pb, w + pl + pr, x.shape[-1]))
    for i in range(oh):
        for j in range(ow):
            # (n, cout) x (kh, kw, cin, cout) -> (n, kh, kw, cin)
            back = np.tensordot(g[:, i, j, :], kernel, axes=([1], [3]))
            gxp[:, i * sh : i * sh + kh, j * sw : j * sw + kw, :] += back
    return gxp[:, pt : pt + h, pl : pl + w, :]


# ---------------------------------------------------------------------------------------------- max pool
def maxpool_forward(x: np.ndarray) -> np.ndarray:
    n, h, w, c = x.shape
    oh, ow = h // 2, w // 2
    out = np.zeros((n, oh, ow, c))
    for i in range(oh):
        for j in range(ow):
            out[:, i, j, :] = x[:, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2, :].max(axis=(1, 2))
    return out


def maxpool_backward(g: np.ndarray, x: np.ndarray, tie_tol: float = 1e-5) -> np.ndarray:
    """Route each window's signal to its argmax; a (near-)tie makes the result depend on tie-breaking: refuse."""
    n, h, w, c = x.shape
    gx = np.zeros_like(x)
    for b in range(n):
        for i in range(h // 2):
            for j in range(w // 2):
                for ch in range(c):
                    win = x[b, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2, ch].ravel()
                    order = np.sort(win)
                    if order[-1] - order[-2] <= tie_tol * max(1.0, abs(order[-1])):
                        raise ValueError(f"max-pool tie at sample {b}, window ({i}, {j}), channel {ch}: {win}")
                    k = int(np.argmax(win))
                    gx[b, 2 * i + k // 2, 2 * j + k % 2, ch] = g[b, i, j, ch]
    return gx


# ---------------------------------------------------------------------------------------------- activations
def relu_like_forward(op: str, z: np.ndarray, alpha: float = 0.2) -> np.ndarray:
    if op == "relu":
        return np.maximum(z, 0.0)
    if op == "relu6":
        return np.clip(z, 0.0, 6.0)
    if op == "leaky_relu":
        return np.where(z > 0, z, alpha * z)
    raise ValueError(op)


def relu_like_derivative(op: str, z: np.ndarray, alpha: float = 0.2) -> np.ndarray:
    """f'(z), 0 at the kinks (TensorFlow's and zennit's convention: nothing passes at z == 0)."""
    if op == "relu":
        return (z > 0).astype(np.float64)
    if op == "relu6":
        return ((z > 0) & (z < 6)).astype(np.float64)
    if op == "leaky_relu":
        return np.where(z > 0, 1.0, alpha)
    raise ValueError(op)


def relu_like_backward(op: str, mode: str, g: np.ndarray, z: np.ndarray, alpha: float = 0.2) -> np.ndarray:
    if mode == "gradient":
        return g * relu_like_derivative(op, z, alpha)
    if mode == "guided":
        return g * relu_like_derivative(op, z, alpha) * (g > 0)
    if mode == "deconvnet":
        return np.maximum(g, 0.0)
    raise ValueError(f"relu mode {mode!r}; use one of {RELU_MODES}")


# ---------------------------------------------------------------------------------------------- the net
class ReferenceNet:
    """A DAG of reference nodes in topological order; the last node is the output (the logits)."""

    def __init__(self, nodes: list[RefNode]) -> None:
        self.nodes = list(nodes)
        ids = [n.id for n in self.nodes]
        assert len(set(ids)) == len(ids), "duplicate node ids"
        seen: set[str] = set()
        for n in self.nodes:
            missing = [i for i in n.inputs if i not in seen]
            assert not missing, f"{n.id}: inputs {missing} not defined before it"
            seen.add(n.id)
        self.output = self.nodes[-1].id

    def forward(self, x: np.ndarray) -> dict[str, np.ndarray]:
        values: dict[str, np.ndarray] = {}
        for n in self.nodes:
            ins = [values[i] for i in n.inputs]
            p = n.params
            if n.op == "input":
                out = np.asarray(x, np.float64)
            elif n.op == "conv2d":
                out = conv2d_forward(ins[0], p["kernel"], p["bias"], p["strides"], p["padding"])
            elif n.op == "dense":
                out = ins[0] @ p["kernel"] + p["bias"]
            elif n.op in RELU_OPS:
                out = relu_like_forward(n.op, ins[0], p.get("alpha", 0.2))
            elif n.op == "maxpool":
                out = maxpool_forward(ins[0])
            elif n.op == "flatten":
                out = ins[0].reshape(ins[0].shape[0], -1)
            elif n.op == "gap":
                out = ins[0].mean(axis=(1, 2))
            elif n.op == "add":
                out = sum(ins[1:], ins[0])
            else:
                raise ValueError(f"unknown reference op {n.op!r}")
            values[n.id] = out
        return values

    def backward(
        self,
        values: dict[str, np.ndarray],
        class_index: int,
        relu_mode: str = "gradient",
        modes: dict[str, str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Signal arriving at every node's output, seeded with a one-hot on ``class_index`` of the output.

        ``relu_mode`` applies to every ReLU-like node; ``modes`` (node id -> mode) overrides single nodes.
        The input node's entry is the input gradient.
        """
        modes = modes or {}
        out = values[self.output]
        seed = np.zeros_like(out)
        seed[:, class_index] = 1.0
        grads: dict[str, np.ndarray] = {self.output: seed}
        for n in reversed(self.nodes):
            if n.id not in grads or n.op == "input":
                continue
            g = grads[n.id]
            ins = [values[i] for i in n.inputs]
            p = n.params
            if n.op == "conv2d":
                gin = [conv2d_backward(g, ins[0], p["kernel"], p["strides"], p["padding"])]
            elif n.op == "dense":
                gin = [g @ p["kernel"].T]
            elif n.op in RELU_OPS:
                gin = [relu_like_backward(n.op, modes.get(n.id, relu_mode), g, ins[0], p.get("alpha", 0.2))]
            elif n.op == "maxpool":
                gin = [maxpool_backward(g, ins[0])]
            elif n.op == "flatten":
                gin = [g.reshape(ins[0].shape)]
            elif n.op == "gap":
                h, w = ins[0].shape[1:3]
                gin = [np.broadcast_to(g[:, None, None, :] / (h * w), ins[0].shape).copy()]
            elif n.op == "add":
                gin = [g.copy() for _ in ins]
            else:
                raise ValueError(f"unknown reference op {n.op!r}")
            for src, gi in zip(n.inputs, gin):
                grads[src] = grads[src] + gi if src in grads else gi  # fan-out: signals add up
        return grads
