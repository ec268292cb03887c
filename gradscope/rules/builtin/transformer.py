"""Rules for transformers: AttnLRP (Achtibat et al., ICML 2024) and CP-LRP (Ali et al., ICML 2022).

They are written in gradient form (LXT's convention): each rule passes a modified gradient ``g`` such that the
relevance at any tensor is ``x ⊙ g`` (the presets read the map out times the input). In that form:

- a linear layer under the ε rule passes ``Wᵀ(g · z/(z + ε·sign z))`` (``epsilon_gx``; ε = 0 is the gradient);
- AttnLRP's softmax rule ``R_in = x ⊙ (R − s Σ R)`` *is* the softmax's gradient, so the softmax keeps it;
- the uniform rule on a product of two activations (``QKᵀ``, ``A·V``) gives each factor half of its gradient;
- the identity rule on an elementwise activation ``y = f(x)`` passes ``g · f(x)/x`` (relevance passes unchanged);
- LayerNorm/RMSNorm with the normaliser (σ, the RMS) held constant is linear in ``x``: its gradient then;
- CP-LRP holds the attention probabilities constant (``A`` is data, ``A·V`` linear in ``V``) and the normaliser
  of a LayerNorm: on a bias-free model with ReLU feed-forward blocks the relevances then sum to the logit.

Composite layers (``MultiHeadAttention``) are re-run from their own sublayers and equations with these changes;
the re-run must give the layer's output (else the rule says which call it cannot handle, never a wrong map).
Every rule is checked against a NumPy reference in the relevance form of the papers (tests/rules).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

from gradscope.backend import keras, tf
from gradscope.core.errors import RuleError
from gradscope.core.graph import NodeSpec
from gradscope.rules.builtin.linear_ops import sign0
from gradscope.rules.registry import Rule, register_rule

LINEAR_TYPES = frozenset({"Dense", "EinsumDense", "Conv1D", "Conv2D", "Conv3D"})
NORM_TYPES = frozenset({"LayerNormalization", "RMSNormalization"})
#: Elementwise activations the identity rule is for (ReLU-like ones need no rule: f(x)/x is their gradient).
SMOOTH_ACTIVATIONS = frozenset({"gelu", "silu", "swish", "tanh", "sigmoid", "softplus", "elu", "selu", "mish"})


def scaled_gradient(z, factor):
    """``z`` itself, whose gradient is multiplied by ``factor`` (a constant)."""
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
        return node.op_type in NORM_TYPES

    def backward(self, ctx, grad_outputs):
        x = tf.identity(ctx.inputs[0])
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = normalize_with_constant_scale(ctx.layer, x, ctx.weights)
        _check_rerun(ctx, y)
        return [tape.gradient(y, x, output_gradients=grad_outputs[0])]


def normalize_with_constant_scale(layer, x, weights: dict):
    """The layer's output, with the normaliser behind ``tf.stop_gradient``."""
    axis = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
    eps = tf.cast(layer.epsilon, x.dtype)
    if type(layer).__name__ == "RMSNormalization" or getattr(layer, "rms_scaling", False):
        inv = tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=axis, keepdims=True) + eps)
        y = x * tf.stop_gradient(inv)
        scale = weights.get("scale", weights.get("gamma"))
        return y * scale if scale is not None else y
    mean = tf.reduce_mean(x, axis=axis, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), axis=axis, keepdims=True)
    y = (x - mean) * tf.stop_gradient(tf.math.rsqrt(var + eps))
    if "gamma" in weights:
        y = y * weights["gamma"]
    if "beta" in weights:
        y = y + weights["beta"]
    return y


class _AttentionRule(Rule):
    """``MultiHeadAttention`` re-run from its projections and equations with a rule's changes."""

    mode = ""

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return node.op_type == "MultiHeadAttention"

    def backward(self, ctx, grad_outputs):
        xs = [tf.identity(x) for x in ctx.inputs]  # one gradient per use, also for mha(x, x)
        floats = [x for x in xs if x.dtype.is_floating]
        call = attention_call(ctx, xs)
        with tf.GradientTape() as tape:
            for x in floats:
                tape.watch(x)
            with keras.StatelessScope(state_mapping=list(zip(ctx.layer.variables, ctx.weight_list))):
                y = attention(ctx.layer, call, self.mode, getattr(self.params, "epsilon", 0.0))
        _check_rerun(ctx, y)
        got = iter(tape.gradient(y, floats, output_gradients=grad_outputs[0], unconnected_gradients="zero"))
        return [next(got) if x.dtype.is_floating else None for x in xs]


@register_rule("attention_lrp")
class AttentionLRP(_AttentionRule):
    """AttnLRP on MultiHeadAttention: ε on the projections, uniform rule on QKᵀ and A·V, softmax gradient."""

    Params = EpsilonParams
    summary = "MultiHeadAttention"
    mode = "attnlrp"


@register_rule("attention_cp")
class AttentionCP(_AttentionRule):
    """CP-LRP on MultiHeadAttention: the attention probabilities are held constant (A·V is linear in V)."""

    summary = "MultiHeadAttention"
    mode = "cp"


def attention_call(ctx, xs) -> dict:
    """The tensors and flags of a ``MultiHeadAttention`` call, ``xs`` in place of its tensors."""
    args, kwargs = ctx.call_arguments(xs)
    try:
        bound = inspect.signature(ctx.layer.call).bind(*args, **kwargs)
    except TypeError as exc:
        raise RuleError(f"{ctx.node.id!r}: a MultiHeadAttention call this rule cannot read ({exc}).") from exc
    call = dict(bound.arguments)
    if call.get("return_attention_scores"):
        raise RuleError(f"{ctx.node.id!r}: calls that return the attention scores are not supported yet.")
    return call


def attention(layer, call: dict, mode: str, eps: float = 0.0):
    """``layer(**call)`` re-computed from its sublayers (no dropout) under ``mode``: "attnlrp", "cp" or "" (the
    plain computation). The attention mask (``attention_mask``, ``value_mask``/``key_mask``, the causal flag) is
    Keras's own, applied to the scores as the layer applies it: masked positions get no probability, hence no
    relevance. (Keras reads the query's mask from its Keras mask, whatever ``query_mask`` says; a call with
    Keras masks on its inputs is not reproduced here, and ``_check_rerun`` refuses it.)"""
    query, value = call["query"], call["value"]
    key = value if call.get("key") is None else call["key"]
    mask = layer._compute_attention_mask(
        query,
        value,
        value_mask=call.get("value_mask"),
        key_mask=call.get("key_mask"),
        attention_mask=call.get("attention_mask"),
        use_causal_mask=bool(call.get("use_causal_mask", False)),
    )

    def project(dense, x):
        z = dense(x)
        return scaled_gradient(z, epsilon_factor(z, eps)) if mode == "attnlrp" else z

    q = project(layer._query_dense, query) * tf.cast(1.0 / math.sqrt(float(layer._key_dim)), query.dtype)
    k = project(layer._key_dense, key)
    v = project(layer._value_dense, value)

    def scores_of(k_, q_):
        return keras.ops.einsum(layer._dot_product_equation, k_, q_)

    def combine(a_, v_):
        return keras.ops.einsum(layer._combine_equation, a_, v_)

    if mode == "attnlrp":
        scores = uniform_product(k, q, scores_of)
        scores = scaled_gradient(scores, epsilon_factor(scores, eps))
    else:
        scores = scores_of(k, q)
    probs = layer._masked_softmax(scores, mask)
    if mode == "cp":
        probs = tf.stop_gradient(probs)
    if mode == "attnlrp":
        out = uniform_product(probs, v, combine)
        out = scaled_gradient(out, epsilon_factor(out, eps))
    else:
        out = combine(probs, v)
    return project(layer._output_dense, out)


def _check_rerun(ctx, y) -> None:
    """The re-run must be the layer's own output; a call it does not reproduce is an error, not a wrong map."""
    ref = ctx.outputs[0]
    scale = tf.reduce_max(tf.abs(ref)) + 1e-6
    tf.debugging.assert_less_equal(
        tf.reduce_max(tf.abs(y - ref)) / scale,
        tf.constant(1e-3, ref.dtype),
        message=f"{ctx.node.id}: the rule's re-run of {ctx.node.op_type} differs from the layer's output "
        "(a mask, dropout or option it does not handle yet)",
    )
