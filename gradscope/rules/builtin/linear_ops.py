"""The modified-layer VJP shared by Excitation Backprop and LRP (RULES_SPEC §1 and §3).

Every rule built on this module is *normalise and redistribute*::

    z    = Σ_k f(m_k(x); W_k, b_k)       # forward through modified copies of the layer
    s    = g ⊘ stab(z)
    g_in = Σ_k m_k(x) ⊙ VJP_f(W_k, s)

For a layer linear in ``x`` the VJP at modified weights is ``W_kᵀ s`` whatever ``x`` is, so one tape over the
modified forward gives both ``z_k`` and ``VJP_f(W_k, ·)`` (one forward per term instead of two).

``node_kind`` sorts a ``NodeSpec`` into the families the rules treat alike (linear, separable, average pool,
max pool, sum, batch norm, elementwise scale, activation, structural). Anything else is ``"unknown"``: the method
presets keep its true gradient and name it in their warnings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gradscope.backend import keras, tf
from gradscope.core.errors import RuleError
from gradscope.core.graph import NodeSpec

#: Layers linear in their input, with the weights a rule clamps (RULES_SPEC §3).
LINEAR_TYPES = frozenset(
    {
        "Dense",
        "EinsumDense",
        "Conv1D",
        "Conv2D",
        "Conv3D",
        "Conv1DTranspose",
        "Conv2DTranspose",
        "Conv3DTranspose",
        "DepthwiseConv1D",
        "DepthwiseConv2D",
    }
)
#: Depthwise then pointwise: two linear steps, the pointwise one with a signed input.
SEPARABLE_TYPES = frozenset({"SeparableConv1D", "SeparableConv2D"})
AVG_POOL_TYPES = frozenset(
    {
        "AveragePooling1D",
        "AveragePooling2D",
        "AveragePooling3D",
        "GlobalAveragePooling1D",
        "GlobalAveragePooling2D",
        "GlobalAveragePooling3D",
    }
)
#: Winner-take-all under every method: the true gradient routes the signal to the argmax.
MAX_POOL_TYPES = frozenset(
    {
        "MaxPooling1D",
        "MaxPooling2D",
        "MaxPooling3D",
        "GlobalMaxPooling1D",
        "GlobalMaxPooling2D",
        "GlobalMaxPooling3D",
    }
)
BATCHNORM_TYPES = frozenset({"BatchNormalization"})
#: Elementwise ``a·x + c`` with fixed a, c (preprocessing, ``x * 2.0``): the signal passes unchanged.
SCALE_TYPES = frozenset({"Rescaling", "Normalization"})
SCALE_OP_TYPES = frozenset({"Multiply", "Divide", "TrueDivide"})  # only with a single tensor input
SUM_TYPES = frozenset({"Add"})
#: Their true gradient copies, slices or reshapes the signal: it is already the right rule.
STRUCTURAL_TYPES = frozenset(
    {
        "Flatten",
        "Reshape",
        "Permute",
        "Dropout",
        "SpatialDropout1D",
        "SpatialDropout2D",
        "SpatialDropout3D",
        "GaussianNoise",
        "GaussianDropout",
        "AlphaDropout",
        "ActivityRegularization",
        "Identity",
        "ZeroPadding1D",
        "ZeroPadding2D",
        "ZeroPadding3D",
        "Cropping1D",
        "Cropping2D",
        "Cropping3D",
        "UpSampling1D",
        "UpSampling2D",
        "UpSampling3D",
        "RepeatVector",
        "Concatenate",
        "Transpose",
        "Squeeze",
        "ExpandDims",
        "GetItem",
        "RemovedLayer",  # what gradscope.engine.backward.canonize leaves where it folded a BatchNorm: an identity
    }
)
#: ``keras.ops`` activations called inside a functional model (no ``activation`` name on the node).
ELEMENTWISE_OP_TYPES = frozenset(
    {
        "Relu6",
        "LeakyRelu",
        "Sigmoid",
        "Tanh",
        "Silu",
        "Swish",
        "Gelu",
        "Elu",
        "Selu",
        "Celu",
        "Softplus",
        "Softsign",
        "HardSigmoid",
        "HardSilu",
        "HardTanh",
        "LogSigmoid",
        "Mish",
        "SparsePlus",
        "SparseSigmoid",
        "Squareplus",
        "TanhShrink",
        "SoftShrink",
        "HardShrink",
    }
)

KINDS = (
    "input",
    "linear",
    "separable",
    "avg_pool",
    "max_pool",
    "sum",
    "gate",
    "batchnorm",
    "scale",
    "relu",
    "activation",
    "structural",
    "unknown",
)


def node_kind(node: NodeSpec) -> str:
    """The family of ``node`` for the layer-wise rules (one of ``KINDS``)."""
    t = node.op_type
    n_in = len(node.input_shapes)
    if node.is_input:
        return "input"
    if node.activation == "relu" or t == "Relu":
        return "relu"  # the true gradient; ReLU6, LeakyReLU and capped ReLUs are "activation" (pass-through)
    if node.activation is not None or t in ELEMENTWISE_OP_TYPES:
        return "activation" if n_in == 1 else "unknown"
    if t in LINEAR_TYPES:
        return "linear" if n_in == 1 else "unknown"
    if t in SEPARABLE_TYPES:
        return "separable" if n_in == 1 else "unknown"
    if t in AVG_POOL_TYPES:
        return "avg_pool"
    if t in MAX_POOL_TYPES:
        return "max_pool"
    if t in SUM_TYPES:
        return "sum"
    if t in BATCHNORM_TYPES:
        return "batchnorm"
    if t in SCALE_TYPES or (t in SCALE_OP_TYPES and n_in == 1):
        return "scale"
    if t == "Multiply" and gate_input(node) is not None:
        return "gate"
    if t in STRUCTURAL_TYPES:
        return "structural"
    return "unknown"


#: Rules run while the engine traces its ``tf.function``; AutoGraph would re-parse every helper's source on each
#: trace (profiled on ResNet50 under MWP: the rules' backward took 17 s of a 40 s trace with AutoGraph, 3 s
#: without). These rules need no AutoGraph: their Python branches are on static values and the one
#: data-dependent branch is an explicit ``tf.cond``.
no_autograph = tf.autograph.experimental.do_not_convert


def gate_input(node: NodeSpec) -> int | None:
    """For ``x * gate`` with a broadcast gate (squeeze-and-excitation): the gate's input index, else None."""
    if len(node.input_shapes) != 2:
        return None
    full = [tuple(s) == tuple(node.output_shape) for s in node.input_shapes]
    if full.count(True) != 1:
        return None
    gate = full.index(False)
    return gate if _size(node.input_shapes[gate]) < _size(node.output_shape) else None


def _size(shape: Sequence[int | None]) -> int:
    n = 1
    for d in shape[1:]:
        n *= d or 1
    return n


def pass_to_gated(ctx: Any, grad_outputs: Sequence[Any], gate: int | None = None) -> list[Any]:
    """Signal-take-all for ``x * gate`` (Arras et al. 2017, LRP for gated units): all of ``g`` to ``x``, none to
    the gate. It is the normalise-and-redistribute rule of a diagonal layer with the gate as fixed weights."""
    gate = gate_input(ctx.node) if gate is None else gate
    if gate is None:
        raise RuleError(f"Node {ctx.node.id!r}: cannot tell which input of the Multiply is the gate; set gate=0 or 1.")
    g = grad_outputs[0]
    return [tf.zeros_like(x) if i == gate else tf.cast(g, x.dtype) for i, x in enumerate(ctx.inputs)]


#: Activations whose output is a gate in (0, 1) (squeeze-and-excitation, GLU-like blocks).
GATE_ACTIVATIONS = ("sigmoid", "hard_sigmoid")


def gate_nodes(graph: Any) -> dict[str, int]:
    """Two-input Multiply nodes that gate a signal, with the gate's input index: the broadcast input (by shape),
    or else the single input produced by a sigmoid-like activation (an SE block at 1x1 spatial size)."""
    out: dict[str, int] = {}
    for n in graph.nodes:
        if n.op_type != "Multiply" or len(n.input_shapes) != 2 or len(set(n.inputs)) != 2:
            continue
        k = gate_input(n)
        if k is None and all(tuple(s) == tuple(n.output_shape) for s in n.input_shapes):
            gated = [
                graph.node(i).activation in GATE_ACTIVATIONS or graph.node(i).op_type == "Sigmoid" for i in n.inputs
            ]
            k = gated.index(True) if gated.count(True) == 1 else None
        if k is not None:
            out[n.id] = k
    return out


# ---------------------------------------------------------------------------------------------- stabilisers
MWP_TINY = 1e-20  # TorchRay's additive stabiliser: representable in float32, 0/(0+1e-20) = 0


def divide_mwp(g: Any, z: Any) -> Any:
    """``g / (z + 1e-20)``, and 0 where ``z == 0`` (Caffe's rule), so an underflow can never give ``inf·0``."""
    # Python scalars: converted to z's dtype by the op (TF caches them); a tf.zeros([]) was an op per call
    s = tf.math.divide_no_nan(g, z + MWP_TINY)
    return tf.where(tf.equal(z, 0.0), 0.0, s)  # a broadcast scalar: no tensor of zeros written


def sign0(z: Any) -> Any:
    """The sign with ``sign₀(0) = +1`` (RULES_SPEC §1: a stabiliser never divides by zero)."""
    return tf.where(z >= 0, tf.ones([], z.dtype), -tf.ones([], z.dtype))  # broadcast scalars: nothing written


def divide_signeps(g: Any, z: Any, eps: float) -> Any:
    """zennit's ``stabilize``: ``g / (z + ε·sign₀(z))`` with ``sign₀(0) = +1``; 0 where that is still 0 (ε = 0)."""
    return tf.math.divide_no_nan(g, z + tf.cast(eps, z.dtype) * sign0(z))


def positive(x: Any) -> Any:
    # against a broadcast scalar 0, not a tensor of zeros (written and read again): 2.2x faster on a kernel of
    # 2.4M weights, and rules take W+ of every kernel on every cold sweep. A Python 0.0 (converted to x's dtype
    # from TF's scalar cache) costs 8 us a call against 50 us for tf.zeros([], dtype).
    return tf.maximum(x, 0.0)


def negative(x: Any) -> Any:
    return tf.minimum(x, 0.0)


def when_nonnegative(x: Any, nonneg_branch: Callable[[], Any], signed_branch: Callable[[], Any]) -> Any:
    """Run ``nonneg_branch`` when every entry of ``x`` is >= 0, else ``signed_branch`` (decided at run time).

    Callers pass two branches that give the same result for x >= 0 (the x₋ terms are then exactly zero), so this
    only skips work: after a ReLU most layers never pay for their negative-input terms.
    """
    return tf.cond(tf.reduce_min(x) >= 0, nonneg_branch, signed_branch)  # one read, no boolean tensor written


# ---------------------------------------------------------------------------------------------- linear ops
Weights = dict[str, Any]


@dataclass
class LinearOp:
    """``y = f(x; W) + b`` with ``f`` linear in ``x``, run through modified copies of its weights.

    ``apply(x, weights)`` computes the layer with a full set of (possibly modified) weights by name;
    ``kernels`` are the weights the rules clamp (``W₊``/``W₋``), ``bias_name`` the weight that is dropped or
    split. ``positive``: the weights are fixed and positive (average pools), so ``W₊ = W`` and ``W₋ = 0``.
    """

    apply: Callable[[Any, Weights], Any]
    kernels: Weights
    bias_name: str | None = None
    bias: Any = None
    positive: bool = False
    #: Always run the signed-input form instead of branching on the sign of x at run time. Set for depthwise
    #: convolutions: with oneDNN on (the TF 2.21 CPU default), a depthwise conv and its VJP inside a ``tf.cond``
    #: branch make Grappler log "Node ... has an empty op name" errors. The results are right (checked against
    #: the NumPy reference); the log is noise, and this avoids it for MWP. LRP-αβ/z⁺ with a depthwise bias still
    #: trigger it (gone with TF_ENABLE_ONEDNN_OPTS=0).
    branch_free: bool = False
    #: The rule context of the node ``apply`` runs. At the node's forward input, ``z`` with its own weights is its
    #: forward output, and the VJP is the node's own where that runs without the forward (the live path's lowered
    #: ops): no convolution run again and no tape walked (LRP-ε: 5.8x -> 3.6x a plain gradient on ResNet50).
    node: Any = None

    def by_sign(self, x: Any, nonneg_branch: Callable[[], Any], signed_branch: Callable[[], Any]) -> Any:
        """``signed_branch()``, or ``nonneg_branch()`` when every x >= 0 (both must agree there)."""
        if self.branch_free:
            return signed_branch()
        return when_nonnegative(x, nonneg_branch, signed_branch)

    def weights(self, kernels: Weights, bias: Any = "zero") -> Weights:
        """A full weight override: ``kernels`` plus the bias (``"zero"``: dropped, given as None: a node's
        forward runs without it, no zeros written and added; a tensor: that bias)."""
        out = dict(kernels)
        if self.bias_name is not None:
            out[self.bias_name] = None if isinstance(bias, str) else bias
        return out

    def forward_vjp(self, x: Any, weights: Weights) -> tuple[Any, Callable[[Any], Any]]:
        """``z = f(x; weights)`` and ``s -> VJP_f(weights, s)`` from one tape (one forward pass)."""
        node = self.node
        if node is not None and node.at_forward(x):
            if node.has_own(weights):
                return node.outputs[0], lambda s: node.vjp([s])[0]
            if not node.vjp_runs_forward:
                return self.apply(x, weights), lambda s: node.vjp([s], weights=weights)[0]
        x = tf.convert_to_tensor(x)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(x)
            z = self.apply(x, weights)
        return z, lambda s: tape.gradient(z, x, output_gradients=s, unconnected_gradients="zero")

    def clamped(self, sign: int, negate: bool = False) -> Weights:
        """``W₊`` (sign=+1) or ``W₋`` (sign=-1) of the kernels (of ``-W`` when ``negate``)."""
        out = {}
        for name, w in self.kernels.items():
            w = -w if negate else w
            out[name] = positive(w) if sign > 0 else negative(w)
        return out


def redistribute(op: LinearOp, g: Any, terms: Sequence[tuple[Any, Weights]], divide: Callable) -> Any:
    """``Σ_k x_k ⊙ VJP_f(W_k, g ⊘ stab(Σ_k f(x_k; W_k)))`` (RULES_SPEC §1); ``divide(g, z)`` stabilises."""
    zs, vjps = [], []
    for x_k, w_k in terms:
        z_k, vjp_k = op.forward_vjp(x_k, w_k)
        zs.append(z_k)
        vjps.append(vjp_k)
    z = _sum(zs)
    s = divide(g, z)
    return _sum([x_k * vjp_k(s) for (x_k, _), vjp_k in zip(terms, vjps)])


def _sum(ts: Sequence[Any]) -> Any:
    # Plain adds, not tf.add_n: an AddN inside a tf.cond branch trips Grappler's MLIR hook ("empty op name").
    out = ts[0]
    for t in ts[1:]:
        out = out + t
    return out


def _kernel_names(ctx: Any) -> list[str]:
    names = [n for n in ctx.weight_names if n in ("kernel", "depthwise_kernel", "pointwise_kernel")]
    if not names:
        raise RuleError(
            f"Node {ctx.node.id!r} ({ctx.node.op_type}) has no kernel weight (it has {ctx.weight_names}); "
            "the layer-wise rules need a plain float kernel (quantised or LoRA layers are not supported)."
        )
    return names


def layer_op(ctx: Any) -> LinearOp:
    """The node's own layer as a ``LinearOp`` (Dense, Conv*, DepthwiseConv*, Conv*Transpose)."""
    weights = ctx.weights
    kernels = {n: weights[n] for n in _kernel_names(ctx)}
    bias_name = "bias" if "bias" in weights else None

    def apply(x: Any, w: Weights) -> Any:
        return ctx.forward([x], weights=w)[0]

    bias = weights.get(bias_name) if bias_name else None
    depthwise = ctx.node.op_type.startswith("DepthwiseConv")
    return LinearOp(apply, kernels, bias_name, bias, branch_free=depthwise, node=ctx)


def pool_op(ctx: Any) -> LinearOp:
    """An average pool as a ``LinearOp`` with fixed positive weights (no kernels to modify)."""
    return LinearOp(lambda x, w: ctx.forward([x])[0], {}, positive=True, node=ctx)


def separable_ops(ctx: Any) -> tuple[LinearOp, LinearOp, Any]:
    """SeparableConv as its two linear steps (RULES_SPEC §2.3): depthwise (no bias), pointwise (+ bias).

    Returns ``(depthwise, pointwise, h)`` with ``h`` the true intermediate (depthwise output, often signed).
    """
    layer, w = ctx.layer, ctx.weights
    if "depthwise_kernel" not in w or "pointwise_kernel" not in w:
        raise RuleError(f"Node {ctx.node.id!r} ({ctx.node.op_type}) lacks depthwise/pointwise kernels.")
    ops = keras.ops
    fmt = layer.data_format

    def depthwise(x: Any, k: Weights) -> Any:
        return ops.depthwise_conv(
            x,
            k["depthwise_kernel"],
            strides=layer.strides,
            padding=layer.padding,
            dilation_rate=layer.dilation_rate,
            data_format=fmt,
        )

    def pointwise(h: Any, k: Weights) -> Any:
        y = ops.conv(h, k["pointwise_kernel"], strides=1, padding="valid", data_format=fmt)
        if k.get("bias") is not None:
            rank = len(y.shape) - 2
            shape = (1,) * (rank + 1) + (-1,) if fmt == "channels_last" else (1, -1) + (1,) * rank
            y = y + ops.reshape(k["bias"], shape)
        return y

    dw = LinearOp(depthwise, {"depthwise_kernel": w["depthwise_kernel"]}, branch_free=True)
    pw = LinearOp(
        pointwise, {"pointwise_kernel": w["pointwise_kernel"]}, "bias" if "bias" in w else None, w.get("bias")
    )
    h = depthwise(ctx.inputs[0], dw.kernels)
    return dw, pw, h


def pass_signal(ctx: Any, grad_outputs: Sequence[Any]) -> list[Any]:
    """The upstream signal unchanged (pass-through: zennit ``Pass``), for shape-preserving single-input nodes."""
    g = grad_outputs[0]
    x = ctx.inputs[0]
    if g.shape.rank is not None and x.shape.rank is not None and g.shape.rank != x.shape.rank:
        raise RuleError(f"Node {ctx.node.id!r}: a pass-through needs equal input and output shapes.")
    return [tf.cast(g, x.dtype)] + [None] * (len(ctx.inputs) - 1)


def redistribute_sum(ctx: Any, g: Any, divide: Callable, modifier: Callable[[Any], Any] | None = None) -> list[Any]:
    """``x_k ⊙ g ⊘ stab(Σ_m x_m)`` for an Add node (broadcasting handled by the node's own VJP)."""
    xs = [tf.convert_to_tensor(x) for x in ctx.inputs]
    if modifier is not None:
        xs = [modifier(x) for x in xs]
    if all(x.shape.is_fully_defined() and x.shape == g.shape for x in xs):
        # nothing broadcast: the sum's VJP hands s to every input unchanged (no tape to walk)
        z = ctx.outputs[0] if modifier is None and len(ctx.outputs) == 1 else ctx.forward(xs)[0]  # the forward's sum
        s = divide(g, z)
        return [x * s for x in xs]
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        for x in xs:
            tape.watch(x)
        z = ctx.forward(xs)[0]
    s = divide(g, z)
    vs = tape.gradient(z, xs, output_gradients=s, unconnected_gradients="zero")
    return [x * v for x, v in zip(xs, vs)]


# ---------------------------------------------------------------------------------------------- presets
def rule_selectors(graph: Any, node_ids: Sequence[str]) -> list[str]:
    """Compact plan selectors matching exactly ``node_ids``: ``type:`` for op types whose every node is listed,
    ``activation:`` for activation names likewise, and single node ids for the rest."""
    wanted = set(node_ids)
    nodes = [n for n in graph.nodes if n.id in wanted]
    types = sorted(
        {n.op_type for n in nodes if n.op_type != "Activation"} - {n.op_type for n in graph.nodes if n.id not in wanted}
    )
    covered = {n.id for n in nodes if n.op_type in types}
    rest = [n for n in nodes if n.id not in covered and n.activation is not None]
    acts = sorted({n.activation for n in rest} - {n.activation for n in graph.nodes if n.id not in wanted})
    covered |= {n.id for n in rest if n.activation in acts}
    selectors = []
    if types:
        selectors.append("type:" + ",".join(types))
    if acts:
        selectors.append("activation:" + ",".join(acts))
    selectors += [n.id for n in nodes if n.id not in covered]
    return selectors


def unhandled_warnings(graph: Any, method: str, skip: Sequence[str] = ()) -> tuple[str, ...]:
    """One warning per op type whose nodes no layer-wise rule handles (they keep the true gradient)."""
    by_type: dict[str, list[str]] = {}
    for n in graph.nodes:
        if n.id not in skip and node_kind(n) == "unknown":
            by_type.setdefault(n.op_type, []).append(n.id)
    return tuple(
        f"{method}: no rule for {t} node(s) {', '.join(ids)}; they keep their true gradient, so the result is "
        "not a pure " + method + " map there."
        for t, ids in by_type.items()
    )


def stripped_softmax_ids(graph: Any) -> set[str]:
    """Final softmax nodes: the engine explains their input (the logits), so no rule is needed there."""
    return {i for i in graph.output_ids if graph.node(i).activation == "softmax"}


def logits_node(graph: Any) -> NodeSpec:
    """The node whose output the engine explains for a class target (the input of a final softmax)."""
    out = graph.node(graph.output_ids[0])
    if out.activation == "softmax" and out.inputs:
        return graph.node(out.inputs[0])
    return out


def classifier_node(graph: Any) -> NodeSpec | None:
    """The last linear layer producing the logits, through reshapes/dropout (None if there is none)."""
    node = logits_node(graph)
    while True:
        kind = node_kind(node)
        if kind == "linear":
            return node
        if kind in ("structural", "scale") and len(node.inputs) == 1:
            node = graph.node(node.inputs[0])
            continue
        return None


def readout_min_size(graph: Any) -> int:
    """The smallest spatial side a default read-out may have: 7 (the 7x7 of the Excitation Backprop and
    Grad-CAM papers on 224x224 inputs), or 1/8 of a smaller input's side, and never 1 (a 1x1 map is no map)."""
    shape = graph.node(graph.input_ids[0]).output_shape
    sides = [d for d in shape[1:3] if d] if len(shape) >= 4 else []
    return max(2, min(7, min(sides) // 8)) if sides else 2


def large_enough_map(graph: Any, node: NodeSpec, min_size: int) -> NodeSpec:
    """``node``, or the first node above it (towards the input) whose spatial map is at least ``min_size`` on
    each side: the demo's 4x4 last feature map gave an 18 % pointing game, its 8x8 one 98.5 %."""
    current = node
    while len(current.output_shape) >= 4 and current.inputs:
        h, w = current.output_shape[1:3]
        padding = current.op_type.startswith(("ZeroPadding", "Cropping"))  # the next conv's, not a block output
        if not padding and (h is None or w is None or min(h, w) >= min_size):
            return current
        parent = graph.node(current.inputs[0])
        if parent.is_input:
            return current
        current = parent
    return current if len(current.output_shape) >= 4 else node


def feature_map_node(graph: Any, below: NodeSpec) -> NodeSpec | None:
    """The output of the last spatial block under ``below``: the input of the global pool or flatten found
    walking up from ``below``'s input, or the first node there with a spatial output."""
    node = graph.node(below.inputs[0]) if below.inputs else None
    while node is not None and not node.is_input:
        if node.op_type.startswith("Global") or node.op_type == "Flatten":
            src = graph.node(node.inputs[0])
            return None if src.is_input else src
        if len(node.output_shape) >= 3:
            return node
        if len(node.inputs) != 1:
            return None
        node = graph.node(node.inputs[0])
    return None
