"""A slow, independent NumPy reference for Excitation Backprop (MWP, c-MWP) and LRP (ε, αβ, z⁺).

The reference itself imports neither gradscope nor TensorFlow; the parameter readers take Keras layers through
the public API (``layer.weights``, ``get_config``), and the tiny seeded nets at the end build Keras models
(importing Keras lazily) together with their hand-written reference description.

Every linear layer is written out as an explicit matrix ``M`` (rows: flattened NHWC outputs, columns: flattened
inputs) built with loops over output positions and kernel taps, so ``y = M x + b`` per sample; the rules of
RULES_SPEC §2 are then plain matrix algebra in float64:

    MWP      z = M₊x,  g_in = x ⊙ M₊ᵀ(g ⊘ z)          (0 where z == 0; exact division, no stabiliser)
    split    z = M₊x₊ + M₋x₋,  g_in = x₊ ⊙ M₊ᵀs + x₋ ⊙ M₋ᵀs
    LRP-ε    z = Mx + b,  g_in = x ⊙ Mᵀ(g ⊘ (z + ε·sign₀(z)))
    αβ       zp = M₊x₊ + M₋x₋ + b₊, zn = M₋x₊ + M₊x₋ + b₋, α·[...zp...] − β·[...zn...]

Clamping ``M`` entrywise is clamping the kernel, because every entry of these matrices is one kernel tap (or 0).
Ops (``RefNode.op``): input, conv (1-D/2-D/3-D, strides, 'same'/'valid', dilation, groups; also depthwise via
``depthwise_params``), conv_transpose ('valid'), dense, avgpool (TF 'same' excludes padding from the count),
gap, bn (inference: diagonal affine), maxpool (routes to the argmax; refuses a tie that carries signal), relu,
relu6 (pass-through under MWP/LRP), flatten, reshape, concat (of flat inputs), add. The net is a DAG in
topological order; its last node gives the logits.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

LINEAR_OPS = ("conv", "conv_transpose", "dense", "avgpool", "gap", "bn")
POOL_OPS = ("avgpool", "gap")
METHODS = ("gradient", "mwp", "cmwp", "lrp_epsilon", "lrp_alpha_beta", "lrp_zplus")
NORM_EPS = 1e-6


@dataclass
class RefNode:
    id: str
    op: str
    inputs: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- Keras -> params
def _weights(layer: Any) -> dict[str, np.ndarray]:
    """A layer's weights by short name, in float64, through the public Keras API."""
    return {w.path.split("/")[-1]: np.asarray(w.numpy(), np.float64) for w in layer.weights}


def _tuple(v: Any, rank: int) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, (list, tuple)) else (int(v),) * rank


def conv_params(layer: Any) -> dict[str, Any]:
    """Conv1D/2D/3D (channels_last): kernel, bias, strides, padding, dilation, groups."""
    cfg, w = layer.get_config(), _weights(layer)
    kernel = w["kernel"]
    rank = kernel.ndim - 2
    assert cfg.get("data_format", "channels_last") == "channels_last"
    return {
        "kernel": kernel,
        "bias": w.get("bias", np.zeros(kernel.shape[-1])),
        "strides": _tuple(cfg["strides"], rank),
        "padding": cfg["padding"],
        "dilation": _tuple(cfg.get("dilation_rate", 1), rank),
        "groups": int(cfg.get("groups", 1)),
    }


def depthwise_params(layer: Any, kernel_name: str = "kernel", bias: bool = True) -> dict[str, Any]:
    """DepthwiseConv (or a SeparableConv's depthwise step) as a grouped conv: (k..., cin, m) -> (k..., 1, cin·m).

    Output channel ``c·m + j`` is input channel ``c`` times multiplier ``j``: the same order as Keras.
    """
    cfg, w = layer.get_config(), _weights(layer)
    k = w[kernel_name]
    rank = k.ndim - 2
    cin, mult = k.shape[-2], k.shape[-1]
    kernel = k.reshape(k.shape[:-2] + (1, cin * mult))
    b = w.get("bias") if bias else None
    return {
        "kernel": kernel,
        "bias": b if b is not None else np.zeros(cin * mult),
        "strides": _tuple(cfg["strides"], rank),
        "padding": cfg["padding"],
        "dilation": _tuple(cfg.get("dilation_rate", 1), rank),
        "groups": cin,
    }


def pointwise_params(layer: Any) -> dict[str, Any]:
    """A SeparableConv's pointwise step: a 1x1 conv with the layer's bias."""
    w = _weights(layer)
    k = w["pointwise_kernel"]
    rank = k.ndim - 2
    return {
        "kernel": k,
        "bias": w.get("bias", np.zeros(k.shape[-1])),
        "strides": (1,) * rank,
        "padding": "valid",
        "dilation": (1,) * rank,
        "groups": 1,
    }


def conv_transpose_params(layer: Any) -> dict[str, Any]:
    cfg, w = layer.get_config(), _weights(layer)
    kernel = w["kernel"]  # (k..., cout, cin)
    rank = kernel.ndim - 2
    assert cfg["padding"] == "valid" and _tuple(cfg.get("dilation_rate", 1), rank) == (1,) * rank
    return {
        "kernel": kernel,
        "bias": w.get("bias", np.zeros(kernel.shape[-2])),
        "strides": _tuple(cfg["strides"], rank),
    }


def dense_params(layer: Any) -> dict[str, Any]:
    w = _weights(layer)
    return {"kernel": w["kernel"], "bias": w.get("bias", np.zeros(w["kernel"].shape[-1]))}


def pool_params(layer: Any) -> dict[str, Any]:
    cfg = layer.get_config()
    rank = len(tuple(cfg["pool_size"]))
    return {
        "pool": _tuple(cfg["pool_size"], rank),
        "strides": _tuple(cfg["strides"] or cfg["pool_size"], rank),
        "padding": cfg["padding"],
    }


def bn_params(layer: Any) -> dict[str, Any]:
    """Inference BatchNorm as ``a·x + c``: ``a = γ/√(σ²+ε)``, ``c = β − a·μ``."""
    cfg, w = layer.get_config(), _weights(layer)
    n = w["moving_mean"].shape[0]
    gamma, beta = w.get("gamma", np.ones(n)), w.get("beta", np.zeros(n))
    a = gamma / np.sqrt(w["moving_variance"] + cfg["epsilon"])
    return {"scale": a, "shift": beta - a * w["moving_mean"]}


# ---------------------------------------------------------------------------------------------- matrices
def _flat(pos: tuple[int, ...], shape: tuple[int, ...]) -> int:
    return int(np.ravel_multi_index(pos, shape)) if shape else 0


def _pads(size: int, k: int, s: int, d: int, padding: str) -> tuple[int, int]:
    """(pad before, output size); TF 'same': total = max((ceil(n/s)-1)·s + k_eff − n, 0), extra at the end."""
    k_eff = (k - 1) * d + 1
    if padding == "valid":
        return 0, (size - k_eff) // s + 1
    out = -(-size // s)
    total = max((out - 1) * s + k_eff - size, 0)
    return total // 2, out


def conv_matrix(in_shape: tuple, p: dict[str, Any]) -> tuple[np.ndarray, tuple]:
    """Loops over output positions and kernel taps; each tap adds a (cout_g x cin_g) block per group."""
    spatial, cin = tuple(in_shape[:-1]), in_shape[-1]
    kernel, groups = p["kernel"], p["groups"]
    ksize, cin_g, cout = kernel.shape[:-2], kernel.shape[-2], kernel.shape[-1]
    assert cin_g * groups == cin, (cin_g, groups, cin)
    cout_g = cout // groups
    geo = [_pads(n, k, s, d, p["padding"]) for n, k, s, d in zip(spatial, ksize, p["strides"], p["dilation"])]
    out_sp = tuple(o for _, o in geo)
    m = np.zeros((int(np.prod(out_sp)) * cout, int(np.prod(spatial)) * cin))
    for o in itertools.product(*map(range, out_sp)):
        row = _flat(o, out_sp) * cout
        for t in itertools.product(*map(range, ksize)):
            pos = tuple(oi * s + ti * d - pb for oi, ti, s, d, (pb, _) in zip(o, t, p["strides"], p["dilation"], geo))
            if any(not 0 <= q < n for q, n in zip(pos, spatial)):
                continue  # zero padding: contributes nothing
            col = _flat(pos, spatial) * cin
            for gi in range(groups):
                block = kernel[t][:, gi * cout_g : (gi + 1) * cout_g].T  # (cout_g, cin_g)
                m[row + gi * cout_g : row + (gi + 1) * cout_g, col + gi * cin_g : col + (gi + 1) * cin_g] += block
    return m, out_sp + (cout,)


def conv_transpose_matrix(in_shape: tuple, p: dict[str, Any]) -> tuple[np.ndarray, tuple]:
    """'valid' transposed conv: input position i and tap t write to output position i·s + t (no flip)."""
    spatial, cin = tuple(in_shape[:-1]), in_shape[-1]
    kernel = p["kernel"]
    ksize, cout = kernel.shape[:-2], kernel.shape[-2]
    out_sp = tuple((n - 1) * s + k for n, s, k in zip(spatial, p["strides"], ksize))
    m = np.zeros((int(np.prod(out_sp)) * cout, int(np.prod(spatial)) * cin))
    for i in itertools.product(*map(range, spatial)):
        col = _flat(i, spatial) * cin
        for t in itertools.product(*map(range, ksize)):
            o = tuple(ii * s + ti for ii, s, ti in zip(i, p["strides"], t))
            row = _flat(o, out_sp) * cout
            m[row : row + cout, col : col + cin] += kernel[t]  # (cout, cin)
    return m, out_sp + (cout,)


def avgpool_matrix(in_shape: tuple, p: dict[str, Any]) -> tuple[np.ndarray, tuple]:
    spatial, c = tuple(in_shape[:-1]), in_shape[-1]
    geo = [_pads(n, k, s, 1, p["padding"]) for n, k, s in zip(spatial, p["pool"], p["strides"])]
    out_sp = tuple(o for _, o in geo)
    m = np.zeros((int(np.prod(out_sp)) * c, int(np.prod(spatial)) * c))
    eye = np.eye(c)
    for o in itertools.product(*map(range, out_sp)):
        window = []
        for t in itertools.product(*map(range, p["pool"])):
            pos = tuple(oi * s + ti - pb for oi, ti, s, (pb, _) in zip(o, t, p["strides"], geo))
            if all(0 <= q < n for q, n in zip(pos, spatial)):
                window.append(pos)
        row = _flat(o, out_sp) * c
        for pos in window:  # TF's 'same' average excludes the padding from the count
            col = _flat(pos, spatial) * c
            m[row : row + c, col : col + c] += eye / len(window)
    return m, out_sp + (c,)


def gap_matrix(in_shape: tuple) -> tuple[np.ndarray, tuple]:
    spatial, c = tuple(in_shape[:-1]), in_shape[-1]
    n = int(np.prod(spatial))
    m = np.zeros((c, n * c))
    for k in range(n):
        m[:, k * c : (k + 1) * c] += np.eye(c) / n
    return m, (c,)


def dense_matrix(in_shape: tuple, p: dict[str, Any]) -> tuple[np.ndarray, tuple]:
    assert len(in_shape) == 1, "dense on a flat input only"
    return p["kernel"].T.copy(), (p["kernel"].shape[-1],)


def bn_matrix(in_shape: tuple, p: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    reps = int(np.prod(in_shape[:-1]))
    return np.diag(np.tile(p["scale"], reps)), np.tile(p["shift"], reps)


# ---------------------------------------------------------------------------------------------- rules
def _div(g: np.ndarray, z: np.ndarray, eps: float | None) -> np.ndarray:
    """MWP (eps None): exact g/z, 0 where z == 0. LRP: g/(z + ε·sign₀(z)), 0 where that is 0."""
    d = z if eps is None else z + eps * np.where(z >= 0, 1.0, -1.0)
    safe = np.where(d == 0, 1.0, d)
    return np.where(d == 0, 0.0, g / safe)


def _redistribute(g: np.ndarray, terms: list[tuple[np.ndarray, np.ndarray, np.ndarray]], eps: float | None):
    """Per sample (rows): z = Σ M_k x_k + b_k, s = g/stab(z), g_in = Σ x_k ⊙ M_kᵀ s."""
    z = sum(x @ m.T + b for x, m, b in terms)
    s = _div(g, z, eps)
    return sum(x * (s @ m) for x, m, _ in terms)


def mwp_matrix_rule(x: np.ndarray, g: np.ndarray, m: np.ndarray, mode: str) -> np.ndarray:
    mp, mn, zero = np.maximum(m, 0), np.minimum(m, 0), np.zeros(m.shape[0])
    xp, xn = np.maximum(x, 0), np.minimum(x, 0)
    if mode == "torchray":
        return _redistribute(g, [(x, mp, zero)], None)
    if mode == "clamp":
        return _redistribute(g, [(xp, mp, zero)], None)
    assert mode == "mwp_split", mode
    return _redistribute(g, [(xp, mp, zero), (xn, mn, zero)], None)


def alpha_beta_matrix_rule(x, g, m, b, alpha: float, beta: float, bias: bool) -> np.ndarray:
    mp, mn, zero = np.maximum(m, 0), np.minimum(m, 0), np.zeros(m.shape[0])
    xp, xn = np.maximum(x, 0), np.minimum(x, 0)
    bp, bn = (np.maximum(b, 0), np.minimum(b, 0)) if bias else (zero, zero)
    out = alpha * _redistribute(g, [(xp, mp, bp), (xn, mn, zero)], NORM_EPS)
    if beta:
        out = out - beta * _redistribute(g, [(xp, mn, bn), (xn, mp, zero)], NORM_EPS)
    return out


# ---------------------------------------------------------------------------------------------- the net
class ReferenceNet:
    """A DAG of reference nodes (topological order) on flat per-sample vectors; shapes come from the input."""

    def __init__(self, nodes: list[RefNode], input_shape: tuple[int, ...]) -> None:
        self.nodes = list(nodes)
        assert self.nodes[0].op == "input"
        self.output = self.nodes[-1].id
        self.shapes: dict[str, tuple] = {}
        self.mats: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for n in self.nodes:
            assert all(i in self.shapes for i in n.inputs), f"{n.id}: inputs must come first"
            ins = [self.shapes[i] for i in n.inputs]
            p = n.params
            if n.op == "input":
                shape = tuple(input_shape)
            elif n.op == "reshape":
                shape = tuple(p["shape"])
                assert np.prod(shape) == np.prod(ins[0])
            elif n.op == "concat":
                assert all(len(s) == 1 for s in ins), "concat of flat inputs only"
                shape = (sum(s[0] for s in ins),)
            elif n.op in ("relu", "relu6", "maxpool", "flatten", "add"):
                shape = ins[0]
                if n.op == "flatten":
                    shape = (int(np.prod(ins[0])),)
                if n.op == "maxpool":
                    shape = tuple(s // k for s, k in zip(ins[0][:-1], p["pool"])) + (ins[0][-1],)
                    assert p["padding"] == "valid" and tuple(p["strides"]) == tuple(p["pool"])
                if n.op == "add":
                    assert all(s == ins[0] for s in ins)
            else:
                m, b, shape = self._matrix(n, ins[0])
                self.mats[n.id] = (m, b)
            self.shapes[n.id] = shape

    @staticmethod
    def _matrix(n: RefNode, in_shape: tuple) -> tuple[np.ndarray, np.ndarray, tuple]:
        p = n.params
        if n.op == "conv":
            m, shape = conv_matrix(in_shape, p)
        elif n.op == "conv_transpose":
            m, shape = conv_transpose_matrix(in_shape, p)
        elif n.op == "dense":
            m, shape = dense_matrix(in_shape, p)
        elif n.op == "avgpool":
            m, shape = avgpool_matrix(in_shape, p)
            return m, np.zeros(m.shape[0]), shape
        elif n.op == "gap":
            m, shape = gap_matrix(in_shape)
            return m, np.zeros(m.shape[0]), shape
        elif n.op == "bn":
            m, b = bn_matrix(in_shape, p)
            return m, b, in_shape
        else:
            raise ValueError(f"unknown reference op {n.op!r}")
        reps = int(np.prod(shape[:-1]))
        return m, np.tile(p["bias"], reps), shape

    # -------------------------------------------------------------------------------------------- forward
    def forward(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """Flat (batch, size) float64 values of every node."""
        x = np.asarray(x, np.float64)
        values: dict[str, np.ndarray] = {}
        for n in self.nodes:
            ins = [values[i] for i in n.inputs]
            if n.op == "input":
                out = x.reshape(x.shape[0], -1)
            elif n.id in self.mats:
                m, b = self.mats[n.id]
                out = ins[0] @ m.T + b
            elif n.op == "relu":
                out = np.maximum(ins[0], 0)
            elif n.op == "relu6":
                out = np.clip(ins[0], 0, 6)
            elif n.op in ("flatten", "reshape"):
                out = ins[0]  # NHWC C-order: a reshape does not move anything in the flat vector
            elif n.op == "concat":
                out = np.concatenate(ins, axis=1)
            elif n.op == "add":
                out = sum(ins[1:], ins[0])
            elif n.op == "maxpool":
                out = np.stack([self._maxpool(n, v)[0] for v in ins[0]])
            else:
                raise ValueError(n.op)
            values[n.id] = out
        return values

    def _maxpool(self, n: RefNode, v: np.ndarray) -> tuple[np.ndarray, list[list[int]], list[bool]]:
        """One sample: output, and per output entry the flat input index of the max and whether it ties."""
        in_shape = self.shapes[n.inputs[0]]
        spatial, c = in_shape[:-1], in_shape[-1]
        out_sp = self.shapes[n.id][:-1]
        vol = v.reshape(in_shape)
        out, arg, ties = [], [], []
        for o in itertools.product(*map(range, out_sp)):
            for ch in range(c):
                cands = []
                for t in itertools.product(*map(range, n.params["pool"])):
                    pos = tuple(oi * k + ti for oi, k, ti in zip(o, n.params["pool"], t))
                    cands.append((vol[pos + (ch,)], _flat(pos, spatial) * c + ch))
                vals = np.array([a for a, _ in cands])
                k = int(np.argmax(vals))
                out.append(vals[k])
                arg.append(cands[k][1])
                ties.append(bool(np.sum(np.isclose(vals, vals[k], rtol=1e-6, atol=1e-7)) > 1))
        return np.array(out), arg, ties

    # -------------------------------------------------------------------------------------------- backward
    def backward(
        self,
        values: dict[str, np.ndarray],
        class_index: int | np.ndarray,
        method: str,
        *,
        signed_input: str = "mwp_split",
        classifier: str | None = None,
        epsilon: float = 0.1,
        alpha: float = 2.0,
        beta: float = 1.0,
        bias: bool = True,
    ) -> dict[str, np.ndarray]:
        """Flat signal arriving at every node's output for a one-hot seed (value 1) on the logits."""
        assert method in METHODS, method
        logits = values[self.output]
        seed = np.zeros_like(logits)
        seed[np.arange(len(logits)), np.broadcast_to(class_index, len(logits))] = 1.0
        grads = {self.output: seed}
        for n in reversed(self.nodes):
            if n.id not in grads or n.op == "input":
                continue
            g, ins = grads[n.id], [values[i] for i in n.inputs]
            if n.id in self.mats:
                gin = [self._linear(n, ins[0], g, method, signed_input, classifier, epsilon, alpha, beta, bias)]
            elif n.op == "relu":
                gin = [g * (ins[0] > 0)]  # true gradient under every method; nothing passes at 0
            elif n.op == "relu6":  # MWP/LRP: a non-ReLU activation passes the signal through (zennit Pass)
                gin = [g * ((ins[0] > 0) & (ins[0] < 6)) if method == "gradient" else g]
            elif n.op in ("flatten", "reshape"):
                gin = [g]
            elif n.op == "concat":
                cuts = np.cumsum([self.shapes[i][0] for i in n.inputs])[:-1]
                gin = np.split(g, cuts, axis=1)
            elif n.op == "maxpool":
                gin = [self._maxpool_back(n, ins[0], g)]
            elif n.op == "add":
                gin = self._add(ins, g, method, signed_input)
            else:
                raise ValueError(n.op)
            for src, gi in zip(n.inputs, gin):
                grads[src] = grads[src] + gi if src in grads else gi
        return grads

    def _linear(self, n, x, g, method, signed_input, classifier, epsilon, alpha, beta, bias) -> np.ndarray:
        m, b = self.mats[n.id]
        if method == "gradient":
            return g @ m
        if method in ("mwp", "cmwp"):
            if n.op == "bn":
                return g  # MWP: BatchNorm passes the signal unchanged (Caffe, TorchRay)
            out = mwp_matrix_rule(x, g, m, signed_input)
            if method == "cmwp" and n.id == classifier:
                out = out - mwp_matrix_rule(x, g, -m, signed_input)
            return out
        if n.op in POOL_OPS:  # LRP: Norm
            return _redistribute(g, [(x, m, b)], NORM_EPS)
        if n.op == "bn":  # LRP: the ε rule on a diagonal affine layer
            return _redistribute(g, [(x, m, b)], epsilon if method == "lrp_epsilon" else NORM_EPS)
        if method == "lrp_epsilon":
            return _redistribute(g, [(x, m, b if bias else np.zeros_like(b))], epsilon)
        if method == "lrp_zplus":
            alpha, beta = 1.0, 0.0
        return alpha_beta_matrix_rule(x, g, m, b, alpha, beta, bias)

    def _maxpool_back(self, n: RefNode, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        gx = np.zeros_like(x)
        for i, (v, gs) in enumerate(zip(x, g)):
            _, arg, ties = self._maxpool(n, v)
            for k, (j, tie) in enumerate(zip(arg, ties)):
                if tie and gs[k] != 0:
                    raise ValueError(f"{n.id}: max-pool tie carrying signal (sample {i}, output {k})")
                gx[i, j] += gs[k]
        return gx

    @staticmethod
    def _add(ins: list[np.ndarray], g: np.ndarray, method: str, signed_input: str) -> list[np.ndarray]:
        if method == "gradient":
            return [g.copy() for _ in ins]
        if method in ("mwp", "cmwp"):
            xs = ins if signed_input == "torchray" else [np.maximum(x, 0) for x in ins]
            s = _div(g, sum(xs), None)
        else:
            xs = ins
            s = _div(g, sum(xs), NORM_EPS)
        return [x * s for x in xs]


# ---------------------------------------------------------------------------------------------- seeded nets
# Each builder returns (keras model, ReferenceNet, classifier node id). Keras is imported lazily so the
# reference above stays free of it.


def _random_biases(model: Any, seed: int, scale: float = 0.1) -> Any:
    """Non-zero biases, so that a rule that drops, splits or double-counts a bias shows up."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        for w in layer.weights:
            if w.path.endswith("/bias"):
                w.assign(rng.normal(0, scale, w.shape).astype("float32"))
    return model


def conv_net(use_bias: bool = True):
    """conv -> max-pool -> ReLU -> strided conv(relu) -> avg-pool -> flatten -> dense(relu) -> dense(softmax)."""
    from keras import Input, Model, layers, utils

    utils.set_random_seed(31)
    inp = Input((10, 10, 3), name="image")
    x = layers.Conv2D(4, 3, padding="same", use_bias=use_bias, name="conv1")(inp)
    x = layers.MaxPooling2D(2, name="pool1")(x)  # before the ReLU: no ties among zeros for the gradient
    x = layers.ReLU(name="relu1")(x)
    x = layers.Conv2D(6, 3, strides=2, padding="same", activation="relu", use_bias=use_bias, name="conv2")(x)
    x = layers.AveragePooling2D(2, strides=1, name="avg")(x)
    x = layers.Flatten(name="flat")(x)
    x = layers.Dense(8, activation="relu", use_bias=use_bias, name="fc1")(x)
    x = layers.Dense(3, activation="softmax", use_bias=use_bias, name="fc2")(x)
    model = Model(inp, x, name="conv_net")
    if use_bias:
        _random_biases(model, 31)
    get = model.get_layer
    ref = ReferenceNet(
        [
            RefNode("image", "input"),
            RefNode("conv1", "conv", ("image",), conv_params(get("conv1"))),
            RefNode("pool1", "maxpool", ("conv1",), {"pool": (2, 2), "strides": (2, 2), "padding": "valid"}),
            RefNode("relu1", "relu", ("pool1",)),
            RefNode("conv2:pre", "conv", ("relu1",), conv_params(get("conv2"))),
            RefNode("conv2", "relu", ("conv2:pre",)),
            RefNode("avg", "avgpool", ("conv2",), pool_params(get("avg"))),
            RefNode("flat", "flatten", ("avg",)),
            RefNode("fc1:pre", "dense", ("flat",), dense_params(get("fc1"))),
            RefNode("fc1", "relu", ("fc1:pre",)),
            RefNode("fc2:pre", "dense", ("fc1",), dense_params(get("fc2"))),
        ],
        (10, 10, 3),
    )
    return model, ref, "fc2"


def residual_net():
    """conv(relu) -> [conv(relu) -> 1x1 conv] + shortcut -> ReLU -> GAP -> dense (logits)."""
    from keras import Input, Model, layers, utils

    utils.set_random_seed(32)
    inp = Input((8, 8, 3), name="image")
    s = layers.Conv2D(4, 3, padding="same", activation="relu", name="c1")(inp)
    y = layers.Conv2D(4, 3, padding="same", activation="relu", name="c2")(s)
    y = layers.Conv2D(4, 1, name="c3")(y)
    x = layers.Add(name="add")([s, y])
    x = layers.ReLU(name="relu")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    x = layers.Dense(3, name="fc")(x)
    model = _random_biases(Model(inp, x, name="residual_net"), 32)
    get = model.get_layer
    ref = ReferenceNet(
        [
            RefNode("image", "input"),
            RefNode("c1:pre", "conv", ("image",), conv_params(get("c1"))),
            RefNode("c1", "relu", ("c1:pre",)),
            RefNode("c2:pre", "conv", ("c1",), conv_params(get("c2"))),
            RefNode("c2", "relu", ("c2:pre",)),
            RefNode("c3", "conv", ("c2",), conv_params(get("c3"))),
            RefNode("add", "add", ("c1", "c3")),
            RefNode("relu", "relu", ("add",)),
            RefNode("gap", "gap", ("relu",)),
            RefNode("fc", "dense", ("gap",), dense_params(get("fc"))),
        ],
        (8, 8, 3),
    )
    return model, ref, "fc"


def _random_batchnorm(layer: Any, rng: np.random.Generator) -> None:
    n = layer.weights[0].shape[0]
    gamma = rng.uniform(0.5, 1.5, n) * np.where(np.arange(n) % 3 == 2, -1.0, 1.0)  # some negative gammas
    layer.set_weights(
        [a.astype("float32") for a in (gamma, rng.normal(0, 0.2, n), rng.normal(0, 0.2, n), rng.uniform(0.5, 2, n))]
    )


def bn_net():
    """conv -> BN -> ReLU -> conv -> BN -> + (ReLU'd shortcut) -> ReLU -> GAP -> dense: signed Add inputs."""
    from keras import Input, Model, layers, utils

    utils.set_random_seed(33)
    inp = Input((6, 6, 3), name="image")
    x = layers.Conv2D(4, 3, padding="same", name="c1")(inp)
    x = layers.BatchNormalization(name="bn1")(x)
    s = layers.ReLU(name="r1")(x)
    y = layers.Conv2D(4, 3, padding="same", name="c2")(s)
    y = layers.BatchNormalization(name="bn2")(y)
    x = layers.Add(name="add")([s, y])
    x = layers.ReLU(name="r2")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    x = layers.Dense(3, name="fc")(x)
    model = _random_biases(Model(inp, x, name="bn_net"), 33)
    rng = np.random.default_rng(33)
    for name in ("bn1", "bn2"):
        _random_batchnorm(model.get_layer(name), rng)
    get = model.get_layer
    ref = ReferenceNet(
        [
            RefNode("image", "input"),
            RefNode("c1:pre", "conv", ("image",), conv_params(get("c1"))),
            RefNode("bn1", "bn", ("c1:pre",), bn_params(get("bn1"))),
            RefNode("r1", "relu", ("bn1",)),
            RefNode("c2:pre", "conv", ("r1",), conv_params(get("c2"))),
            RefNode("bn2", "bn", ("c2:pre",), bn_params(get("bn2"))),
            RefNode("add", "add", ("r1", "bn2")),
            RefNode("r2", "relu", ("add",)),
            RefNode("gap", "gap", ("r2",)),
            RefNode("fc", "dense", ("gap",), dense_params(get("fc"))),
        ],
        (6, 6, 3),
    )
    return model, ref, "fc"


def exotic_net():
    """DepthwiseConv2D (ReLU6) -> SeparableConv2D (two steps) -> Conv2DTranspose -> dilated grouped conv -> 'same'
    avg-pool -> GAP -> dense."""
    from keras import Input, Model, layers, utils

    utils.set_random_seed(34)
    inp = Input((7, 7, 4), name="image")
    x = layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same", activation="relu6", name="dw")(inp)
    x = layers.SeparableConv2D(6, 3, activation="relu", name="sep")(x)
    x = layers.Conv2DTranspose(4, 2, strides=2, activation="relu", name="up")(x)
    x = layers.Conv2D(4, 3, dilation_rate=2, groups=2, activation="relu", name="dil")(x)
    x = layers.AveragePooling2D(3, strides=2, padding="same", name="avg")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    x = layers.Dense(3, name="fc")(x)
    model = _random_biases(Model(inp, x, name="exotic_net"), 34)
    get = model.get_layer
    dw_kernel, dw_bias = get("dw").get_weights()
    get("dw").set_weights([8.0 * dw_kernel, dw_bias])  # some pre-activations above 6: the cap is exercised
    ref = ReferenceNet(
        [
            RefNode("image", "input"),
            RefNode("dw:pre", "conv", ("image",), depthwise_params(get("dw"))),
            RefNode("dw", "relu6", ("dw:pre",)),
            RefNode("sep/dw", "conv", ("dw",), depthwise_params(get("sep"), "depthwise_kernel", bias=False)),
            RefNode("sep:pre", "conv", ("sep/dw",), pointwise_params(get("sep"))),
            RefNode("sep", "relu", ("sep:pre",)),
            RefNode("up:pre", "conv_transpose", ("sep",), conv_transpose_params(get("up"))),
            RefNode("up", "relu", ("up:pre",)),
            RefNode("dil:pre", "conv", ("up",), conv_params(get("dil"))),
            RefNode("dil", "relu", ("dil:pre",)),
            RefNode("avg", "avgpool", ("dil",), pool_params(get("avg"))),
            RefNode("gap", "gap", ("avg",)),
            RefNode("fc", "dense", ("gap",), dense_params(get("fc"))),
        ],
        (7, 7, 4),
    )
    return model, ref, "fc"


def conv1d3d_net():
    """Two branches on one 1-D input: Conv1D -> avg-pool, and a reshape to 3-D -> Conv3D -> 3-D max-pool -> ReLU."""
    from keras import Input, Model, layers, utils

    utils.set_random_seed(35)
    inp = Input((16, 2), name="signal")
    a = layers.Conv1D(3, 3, strides=2, padding="same", activation="relu", name="c1d")(inp)
    a = layers.AveragePooling1D(2, name="avg1d")(a)
    a = layers.Flatten(name="flat_a")(a)
    v = layers.Reshape((4, 4, 2, 1), name="vol")(inp)
    v = layers.Conv3D(3, 2, name="c3d")(v)
    v = layers.MaxPooling3D((3, 1, 1), name="mp3d")(v)
    v = layers.Activation("relu", name="r3d")(v)
    v = layers.Flatten(name="flat_v")(v)
    x = layers.Concatenate(name="cat")([a, v])
    x = layers.Dense(3, name="fc")(x)
    model = _random_biases(Model(inp, x, name="conv1d3d_net"), 35)
    get = model.get_layer
    ref = ReferenceNet(
        [
            RefNode("signal", "input"),
            RefNode("c1d:pre", "conv", ("signal",), conv_params(get("c1d"))),
            RefNode("c1d", "relu", ("c1d:pre",)),
            RefNode("avg1d", "avgpool", ("c1d",), pool_params(get("avg1d"))),
            RefNode("flat_a", "flatten", ("avg1d",)),
            RefNode("vol", "reshape", ("signal",), {"shape": (4, 4, 2, 1)}),
            RefNode("c3d", "conv", ("vol",), conv_params(get("c3d"))),
            RefNode("mp3d", "maxpool", ("c3d",), {"pool": (3, 1, 1), "strides": (3, 1, 1), "padding": "valid"}),
            RefNode("r3d", "relu", ("mp3d",)),
            RefNode("flat_v", "flatten", ("r3d",)),
            RefNode("cat", "concat", ("flat_a", "flat_v")),
            RefNode("fc", "dense", ("cat",), dense_params(get("fc"))),
        ],
        (16, 2),
    )
    return model, ref, "fc"
