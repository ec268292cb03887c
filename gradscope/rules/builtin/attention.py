"""Attention under AttnLRP and CP-LRP: the layer re-run with the rule's changes, checked against its output.

- Keras's ``MultiHeadAttention`` is re-computed from its projections and equations (``attention``): ε on the
  projections and the scores, the uniform rule on ``QKᵀ`` and ``A·V``, the softmax's own gradient (AttnLRP); the
  probabilities held constant (CP-LRP).
- Every other attention layer (keras_hub's ``LlamaAttention``, ``CachedMistralAttention``, ``QwenAttention``,
  ``CachedGemmaAttention``, ``CachedGemma3Attention``, ``Phi3Attention``, GPT-2's ``CachedMultiHeadAttention``)
  is run whole, as LXT's ``efficient`` mode patches Hugging Face's attention: the outputs of its query, key and
  value projections pass ¼, ¼ and ½ of their gradient (the uniform rule on both products, the softmax between
  them passing its own gradient), or for CP-LRP none through query and key; a query/key norm inside it (Gemma 3)
  has its normaliser held constant. Rotary embeddings, grouped key/value heads, scaling, masks, sliding windows
  and soft-capping are the layer's own code, all linear in q, k and v or passing their own gradient.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Iterator

from gradscope.backend import keras, tf
from gradscope.core.errors import RuleError
from gradscope.core.graph import NodeSpec
from gradscope.rules.builtin.transformer import (
    EpsilonParams,
    epsilon_factor,
    normalize_with_constant_scale,
    rerun_gradient,
    scaled_gradient,
    uniform_product,
)
from gradscope.rules.registry import Rule, register_rule

#: How much of its gradient each projection's output passes (query, key, value), per mode.
HOOK_FACTORS = {"attnlrp": (0.25, 0.25, 0.5), "cp": (0.0, 0.0, 1.0)}


def is_attention(node: NodeSpec) -> bool:
    return node.op_type.endswith("Attention")


class _AttentionRule(Rule):
    """``MultiHeadAttention`` re-run from its projections and equations with a rule's changes."""

    mode = ""

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return is_attention(node)

    def backward(self, ctx, grad_outputs):
        def rerun(xs):
            if type(ctx.layer) is keras.layers.MultiHeadAttention:
                call = attention_call(ctx, xs)
                return attention(ctx.layer, call, self.mode, getattr(self.params, "epsilon", 0.0))
            return hooked_attention(ctx, xs, self.mode)

        return rerun_gradient(ctx, grad_outputs, rerun)


@register_rule("attention_lrp")
class AttentionLRP(_AttentionRule):
    """AttnLRP on attention: uniform rule on QKᵀ and A·V, softmax gradient (ε on MultiHeadAttention's products)."""

    Params = EpsilonParams
    summary = "MultiHeadAttention, keras_hub attention layers"
    mode = "attnlrp"


@register_rule("attention_cp")
class AttentionCP(_AttentionRule):
    """CP-LRP on attention: the attention probabilities are held constant (A·V is linear in V)."""

    summary = "MultiHeadAttention, keras_hub attention layers"
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


#: Other names keras_hub's families give a role (Qwen 3's per-head query/key norms).
_ROLE_NAMES = {
    "query_norm": ("query_dense_layer_norm",),
    "key_norm": ("key_dense_layer_norm",),
    "query_dense": ("q_proj",),  # SmolLM3 keeps Hugging Face's names
    "key_dense": ("k_proj",),
    "value_dense": ("v_proj",),
}


def softmax_sublayer(layer):
    """The ``keras.layers.Softmax`` an attention layer computes its probabilities with (keras_hub's families on
    TensorFlow all do: ``_softmax`` or ``softmax``), or None."""
    return next((v for v in vars(layer).values() if isinstance(v, keras.layers.Softmax)), None)


def sublayer(layer, role: str):
    """The layer's ``query_dense`` (or ``_query_dense``), ``key_norm``...; None when it has none. A norm missed
    here is not held constant: Qwen 3's AttnLRP was 31 % off LXT's until its names were known."""
    for base in (role, *_ROLE_NAMES.get(role, ())):
        found = layer.__dict__.get(base) or layer.__dict__.get(f"_{base}")
        if isinstance(found, keras.layers.Layer):
            return found
    return None


@contextlib.contextmanager
def calls_replaced(replacements: list) -> Iterator[None]:
    """Sublayers' ``call`` replaced for one re-run (an instance attribute, removed afterwards)."""
    for layer, call in replacements:
        object.__setattr__(layer, "call", call)
    try:
        yield
    finally:
        for layer, _ in replacements:
            object.__delattr__(layer, "call")


def hooked_attention(ctx, xs: list, mode: str):
    """The attention layer run whole on ``xs`` with its projections' gradients scaled (``HOOK_FACTORS``) and its
    query/key norms' normalisers held constant."""
    layer = ctx.layer
    factors = dict(zip(("query_dense", "key_dense", "value_dense"), HOOK_FACTORS[mode]))
    projections = {role: sublayer(layer, role) for role in factors}
    missing = [role for role, found in projections.items() if found is None]
    if missing:
        raise RuleError(
            f"{ctx.node.id!r}: {type(layer).__name__} has no {', '.join(missing)} sublayer, so the "
            f"attention_{'lrp' if mode == 'attnlrp' else 'cp'} rule cannot reach its query, key and value."
        )

    def scaled(sub, factor):
        def call(*args, **kwargs):
            out = type(sub).call(sub, *args, **kwargs)
            return tf.stop_gradient(out) if factor == 0 else scaled_gradient(out, factor)

        return call

    def constant_norm(sub):
        def call(x, *args, **kwargs):
            return normalize_with_constant_scale(sub, x, {})

        return call

    replacements = [(projections[role], scaled(projections[role], f)) for role, f in factors.items()]
    replacements += [(n, constant_norm(n)) for n in (sublayer(layer, "query_norm"), sublayer(layer, "key_norm")) if n]
    args, kwargs = ctx.call_arguments(xs)
    kwargs = {k: v for k, v in kwargs.items() if k != "training"}
    with calls_replaced(replacements):
        out = layer(*args, **kwargs)
    return keras.tree.flatten(out)[0]
