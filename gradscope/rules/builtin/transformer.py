"""Rules for transformers: AttnLRP (Achtibat et al., ICML 2024) and CP-LRP (Ali et al., ICML 2022).

They are written in gradient form (LXT's convention): each rule passes a modified gradient ``g`` such that the
relevance at any tensor is ``x ⊙ g`` (the presets read the map out times the input). In that form:

- a linear layer under the ε rule passes ``Wᵀ(g · z/(z + ε·sign z))`` (``epsilon_gx``; ε = 0 is the gradient);
- AttnLRP's softmax rule ``R_in = x ⊙ (R − s Σ R)`` *is* the softmax's gradient, so the softmax keeps it;
- the uniform rule on a product of two activations (``QKᵀ``, ``A·V``) gives each factor half of its gradient;
- the identity rule on an elementwise activation ``y = f(x)`` passes ``g · f(x)/x`` (relevance passes unchanged);
- LayerNorm/RMSNorm with the normaliser (σ, the RMS) held constant is linear in ``x``: its gradient then;
- CP-LRP holds the attention probabilities constant (``A`` is data, ``A·V`` linear in ``V``) and the normaliser
  of a LayerNorm: on a bias-free model with ReLU feed-forward blocks the relevances then sum to the logit;
- a gated MLP ``down(act(gate(x)) * up(x))`` (Llama, Gemma, Qwen): AttnLRP halves the product's gradient to both
  factors (uniform rule) and gives the activation the identity rule; CP-LRP passes none to the gate (LXT's
  ``cp_gated_mlp_forward``: the gate is data).

Attention layers are re-run with these changes (``rules.builtin.attention``); a re-run must give the layer's
output, else the rule says which layer it cannot handle (never a wrong map). Every rule is checked against a
NumPy reference in the relevance form of the papers (tests/rules), and the presets against LXT 2.1's own numbers
on language models converted from Hugging Face (tests/rules/test_lxt_reference.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gradscope.backend import keras, tf
from gradscope.core.errors import RuleError
from gradscope.core.graph import NodeSpec
from gradscope.rules.builtin.linear_ops import sign0
from gradscope.rules.registry import Rule, register_rule

LINEAR_TYPES = frozenset({"Dense", "EinsumDense", "Conv1D", "Conv2D", "Conv3D"})
#: Normalisation layers by class name: Keras's LayerNormalization / RMSNormalization and keras_hub's own
#: (LlamaLayerNorm, MistralLayerNormalization, QwenLayerNorm, Phi3LayerNorm, Gemma's RMSNormalization).
NORM_CLASS = re.compile(r"(LayerNorm|LayerNormalization|RMSNorm|RMSNormalization)$")
#: Elementwise activations the identity rule is for (ReLU-like ones need no rule: f(x)/x is their gradient), with
#: every variant Keras and keras_hub write: ``gelu_approximate`` is the tanh GELU of keras_hub's BERT and GPT-2
#: (Hugging Face's ``gelu_new`` / ``gelu_pytorch_tanh``), ``silu``/``swish`` the gate of Llama and Qwen.
SMOOTH_ACTIVATIONS = frozenset(
    {
        "gelu",
        "gelu_approximate",
        "gelu_new",
        "gelu_pytorch_tanh",
        "gelu_fast",
        "silu",
        "swish",
        "tanh",
        "sigmoid",
        "softplus",
        "elu",
        "selu",
        "mish",
    }
)


def is_norm(node: NodeSpec) -> bool:
    return bool(NORM_CLASS.search(node.op_type))


def scaled_gradient(z, factor):
    """``z`` itself, whose gradient is multiplied by ``factor`` (a constant)."""
    factor = tf.cast(factor, z.dtype)  # a float32 factor on a bfloat16/float16 model's tensor: one dtype
    return tf.stop_gradient(z) + (z - tf.stop_gradient(z)) * tf.stop_gradient(factor)


def epsilon_factor(z, eps: float):
    """``z / (z + ε·sign₀ z)``: the ε rule's damping of a layer's output relevance, in gradient form."""
    if eps <= 0:
        return tf.ones_like(z)
    return z / (z + eps * sign0(z))


def uniform_product(a, b, product):
    """``product(a, b)`` for a bilinear ``product``, each factor receiving half its gradient (uniform rule):
    one product of the factors with their gradients halved (half the work of two half-products)."""
    return product(half_gradient(a), half_gradient(b))


def half_gradient(z):
    """``z`` itself, passing half its gradient."""
    return 0.5 * z + 0.5 * tf.stop_gradient(z)


@dataclass(frozen=True)
class EpsilonParams:
    epsilon: float = 1e-6

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            raise ValueError(f"epsilon must be a finite number >= 0, got {self.epsilon}")


@register_rule("epsilon_gx")
class EpsilonGradient(Rule):
    """LRP-ε in gradient form: Wᵀ(g·z/(z+ε)), relevance = input x signal (AttnLRP's Dense rule)."""

    Params = EpsilonParams
    summary = "Dense, EinsumDense, Conv"

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return node.op_type in LINEAR_TYPES and node.fused_with is None

    def backward(self, ctx, grad_outputs):
        z = ctx.outputs[0]
        return ctx.vjp([grad_outputs[0] * epsilon_factor(z, self.params.epsilon)])


@register_rule("act_identity")
class ActivationIdentity(Rule):
    """AttnLRP's identity rule on an elementwise activation: relevance passes unchanged (g·f(x)/x)."""

    Params = EpsilonParams
    summary = "GELU, SiLU, tanh, sigmoid ... activations"

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return (node.activation or "").lower() in SMOOTH_ACTIVATIONS and len(node.input_shapes) <= 1

    def backward(self, ctx, grad_outputs):
        x, y = ctx.inputs[0], ctx.outputs[0]
        eps = max(self.params.epsilon, 1e-12)
        return [grad_outputs[0] * y / (x + eps * sign0(x))]


@register_rule("norm_constant")
class NormalizerConstant(Rule):
    """LayerNorm / RMSNorm with the normaliser (σ, RMS) held constant: linear in x (AttnLRP, CP-LRP)."""

    summary = "LayerNormalization, RMSNormalization"

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return is_norm(node)

    def backward(self, ctx, grad_outputs):
        x = tf.identity(ctx.inputs[0])
        with tf.GradientTape() as tape:
            tape.watch(x)
            with keras.StatelessScope(state_mapping=list(zip(ctx.layer.variables, ctx.weight_list))):
                y = normalize_with_constant_scale(ctx.layer, x, ctx.weights)
        _check_rerun(ctx, y)
        return [tape.gradient(y, x, output_gradients=grad_outputs[0])]


def normalize_with_constant_scale(layer, x, weights: dict):
    """The layer's output, with the normaliser behind ``tf.stop_gradient``. Keras's LayerNormalization and
    RMSNormalization by their formulas; a keras_hub RMS norm (``x·rsqrt(mean x²+ε)·w``, ``w`` its scale or
    ``1 + scale`` for Gemma's) by its effective per-channel scale, read off the layer itself (its output for an
    input of ones: ``w·rsqrt(1+ε)``): every family's variant, without knowing its parameterisation. The caller
    checks the re-run equals the layer (another kind of norm is refused there, naming its class)."""
    if not hasattr(layer, "axis"):
        return rms_with_constant_scale(layer, x)
    axis = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
    # in float32, as Keras computes a bfloat16/float16 norm (and LXT its statistics); its weights may be float32
    # variables under a mixed policy
    dtype, x = x.dtype, tf.cast(x, tf.float32)
    eps = tf.cast(layer.epsilon, tf.float32)
    weights = {k: tf.cast(v, tf.float32) for k, v in weights.items()}
    if type(layer).__name__ == "RMSNormalization" or getattr(layer, "rms_scaling", False):
        inv = tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=axis, keepdims=True) + eps)
        y = x * tf.stop_gradient(inv)
        scale = weights.get("scale", weights.get("gamma"))
        return tf.cast(y * scale if scale is not None else y, dtype)
    mean = tf.reduce_mean(x, axis=axis, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), axis=axis, keepdims=True)
    y = (x - mean) * tf.stop_gradient(tf.math.rsqrt(var + eps))
    if "gamma" in weights:
        y = y * weights["gamma"]
    if "beta" in weights:
        y = y + weights["beta"]
    return tf.cast(y, dtype)


def rms_with_constant_scale(layer, x):
    """``x · stop_gradient(rsqrt(mean(x², -1) + ε)) · w`` with ``w`` the layer's effective scale (see above)."""
    eps = getattr(layer, "epsilon", None)
    if eps is None:
        raise RuleError(f"norm_constant cannot run on {type(layer).__name__} {layer.name!r}: it has no epsilon.")
    xf = tf.cast(x, tf.float32)
    probe = tf.ones([1, xf.shape[-1]], x.dtype)
    scale = tf.cast(type(layer).call(layer, probe), tf.float32)[0] * tf.sqrt(1.0 + tf.cast(eps, tf.float32))
    inv = tf.math.rsqrt(tf.reduce_mean(tf.square(xf), axis=-1, keepdims=True) + tf.cast(eps, tf.float32))
    return tf.cast(xf * tf.stop_gradient(inv) * scale, x.dtype)


def activation_of(graph, node_id: str, through: tuple[str, ...] = ("Cast", "Dropout", "Identity")) -> str | None:
    """The activation a node's value comes from, looking through casts and dropouts (Llama's gate is
    ``cast(silu(cast(gate)))``); None when it is not an activation."""
    node = graph.node(node_id)
    while node.op_type in through and len(node.inputs) == 1:
        node = graph.node(node.inputs[0])
    return node.activation


def gated_products(graph) -> dict[str, int]:
    """The products of a gated MLP (``act(gate(x)) * up(x)``), with the input index of the gate: two-input
    Multiply nodes of which exactly one input comes from an elementwise activation."""
    out = {}
    for n in graph.nodes:
        if n.op_type != "Multiply" or len(n.inputs) != 2:
            continue
        smooth = [(activation_of(graph, i) or "") in SMOOTH_ACTIVATIONS for i in n.inputs]
        if smooth.count(True) == 1:
            out[n.id] = smooth.index(True)
    return out


def _two_factor_product(node: NodeSpec) -> bool:
    return node.op_type == "Multiply" and len(node.input_shapes) == 2 and len(set(node.inputs)) == 2


@register_rule("product_uniform")
class ProductUniform(Rule):
    """The uniform rule on a product of two activations (AttnLRP): each factor receives half the gradient, so
    each gets half the relevance (a gated MLP's ``act(gate) * up``)."""

    summary = "Multiply of two tensors"

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return _two_factor_product(node)

    def backward(self, ctx, grad_outputs):
        return ctx.vjp([0.5 * grad_outputs[0]])


@dataclass(frozen=True)
class GateParams:
    gate: int = 0  # which input of the product is the gate

    def __post_init__(self) -> None:
        if self.gate not in (0, 1):
            raise ValueError(f"gate must be 0 or 1 (the input of the product that gates), got {self.gate}")


@register_rule("product_gate_constant")
class ProductGateConstant(Rule):
    """A gated product with the gate held constant (CP-LRP, LXT's ``cp_gated_mlp_forward``): the gradient
    passes to the gated input times the gate, none to the gate."""

    Params = GateParams
    summary = "Multiply of a gate and a signal"

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return _two_factor_product(node)

    def backward(self, ctx, grad_outputs):
        grads = list(ctx.vjp(grad_outputs))
        grads[self.params.gate] = tf.zeros_like(ctx.inputs[self.params.gate])
        return grads


def rerun_gradient(ctx, grad_outputs, rerun) -> list:
    """The gradient of a layer re-run whole with a rule's changes: ``rerun(xs)`` (on fresh copies of the inputs,
    one gradient per use, also for ``mha(x, x)``; the layer's own weights) must give the layer's output
    (``_check_rerun``); ``grad_outputs[0]`` flows back through it (a second output, e.g. a router's logits, is
    constant under the rule), None for integer inputs."""
    xs = [tf.identity(x) for x in ctx.inputs]
    floats = [x for x in xs if x.dtype.is_floating]
    with tf.GradientTape() as tape:
        for x in floats:
            tape.watch(x)
        with keras.StatelessScope(state_mapping=list(zip(ctx.layer.variables, ctx.weight_list))):
            y = rerun(xs)
    _check_rerun(ctx, y)
    got = iter(tape.gradient(y, floats, output_gradients=grad_outputs[0], unconnected_gradients="zero"))
    return [next(got) if x.dtype.is_floating else None for x in xs]


def _check_rerun(ctx, y) -> None:
    """The re-run must be the layer's own output; a call it does not reproduce is an error naming the layer's
    class, never a wrong map (one line when run eagerly; inside a compiled kernel TensorFlow's assert)."""
    ref = tf.cast(ctx.outputs[0], tf.float32)  # compared in float32: a bfloat16 difference rounds to its ulps
    scale = tf.reduce_max(tf.abs(ref)) + 1e-6
    off = tf.reduce_max(tf.abs(tf.cast(y, tf.float32) - ref)) / scale
    tolerance = rerun_tolerance(ctx.outputs[0].dtype)
    message = (
        f"{ctx.node.id}: the rule's re-run of {ctx.node.op_type} differs from the layer's output (a form, mask, "
        f"dropout or option the rule does not handle): no rule for this {ctx.node.op_type} yet"
    )
    if tf.executing_eagerly():
        if float(off) > tolerance:
            raise RuleError(f"{message} (off by {float(off):.2g} of its scale).")
        return
    tf.debugging.assert_less_equal(off, tf.constant(tolerance, tf.float32), message=message)


def rerun_tolerance(dtype) -> float:
    """How far a rule's re-run of a layer may be from the layer's own output, as a fraction of its largest value:
    1e-3 in float32; in a low precision four units of its last place (the layer and the re-run round their own
    intermediate values: a bfloat16 LayerNorm re-run was 0.0057 off, float16's unit is 2**-10, bfloat16's 2**-7)."""
    bits = {"bfloat16": 7, "float16": 10}.get(tf.as_dtype(dtype).name)
    return 1e-3 if bits is None else max(1e-3, 4 * 2.0**-bits)
