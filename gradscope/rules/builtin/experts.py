"""Sparse mixture-of-experts blocks (keras_hub's ``MixtralSparseMoeBlock``, ``Qwen3SparseMoeBlock``,
``QwenSparseMoeBlock``) under AttnLRP and CP-LRP: the block re-run whole with the router held constant.

A block routes each token to its top-k experts and sums their outputs weighted by the router's probabilities:
``y = Σₑ pₑ(x) · expertₑ(x)``. LXT has no map for these families; gradscope holds the routing weights constant
(``pₑ`` is data, as CP-LRP holds attention probabilities), so all relevance passes through the experts, each a
gated MLP ``down(act(gate(x)) * up(x))`` ruled as the dense ones are: AttnLRP gives the activation the identity
rule and halves the product's gradient (uniform rule: done by halving the expert bank's output gradient, which
reaches both factors through the linear ``down``), CP-LRP holds the gate constant. The expert bank's own code
runs (its einsums, its float32 activation): only its activation and its router's output are replaced.

Qwen 2 MoE adds a shared expert every token passes through, ``sigmoid(shared_gate(x)) · shared(x)``: its sigmoid
gate is a weight like the router's probabilities (held constant) and ``shared`` a gated MLP ruled as the experts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gradscope.backend import keras, tf
from gradscope.core.errors import RuleError
from gradscope.core.graph import NodeSpec
from gradscope.rules.builtin.linear_ops import sign0
from gradscope.rules.builtin.transformer import half_gradient, rerun_gradient
from gradscope.rules.registry import Rule, register_rule

#: The sublayers' names in keras_hub's blocks (with or without a leading underscore).
ROUTER_NAMES = ("sparse_feedforward_gate_dense", "router", "gate")
BANK_NAMES = ("expert_bank", "experts")
SHARED_NAMES = ("shared_expert_dense", "shared_expert")
SHARED_GATE_NAMES = ("shared_expert_gate_dense", "shared_expert_gate")


def is_expert_mixture(node: NodeSpec) -> bool:
    return node.op_type.endswith("MoeBlock")


def identity_activation(fn, x):
    """``fn(x)`` whose gradient is ``g · fn(x)/x`` (AttnLRP's identity rule, LXT's ``identity_rule_implicit``)."""
    y = fn(x)
    ratio = tf.stop_gradient(y / (x + tf.cast(1e-12, x.dtype) * sign0(x)))
    return tf.stop_gradient(y) + (x - tf.stop_gradient(x)) * ratio


def constant_gate_activation(fn, x):
    """``fn(x)`` passing no gradient (CP-LRP: the gate is data)."""
    return fn(tf.stop_gradient(x))


def _sublayer(layer, names: tuple[str, ...]):
    for name in names:
        found = layer.__dict__.get(name) or layer.__dict__.get(f"_{name}")
        if isinstance(found, keras.layers.Layer):
            return found
    return None


@contextlib.contextmanager
def _replaced(layer, **attributes) -> Iterator[None]:
    """Attributes set for one re-run; afterwards the layer's own instance attributes are back (an expert bank's
    ``activation`` is one), or the class's where it had none."""
    missing = object()
    saved = {name: layer.__dict__.get(name, missing) for name in attributes}
    for name, value in attributes.items():
        object.__setattr__(layer, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                object.__delattr__(layer, name)
            else:
                object.__setattr__(layer, name, value)


def constant_router_mixture(ctx, xs: list, mode: str):
    """The block run whole on ``xs`` with its router's output held constant and its experts ruled (module doc)."""
    block = ctx.layer
    router, bank = _sublayer(block, ROUTER_NAMES), _sublayer(block, BANK_NAMES)
    if router is None or bank is None or not callable(getattr(bank, "activation", None)):
        raise RuleError(
            f"{ctx.node.id!r}: {type(block).__name__} has no router and expert bank with an activation where "
            "the experts rule looks (a Dense 'sparse_feedforward_gate_dense' and an 'expert_bank'), so it cannot "
            "hold the routing constant."
        )
    shared, shared_gate = _sublayer(block, SHARED_NAMES), _sublayer(block, SHARED_GATE_NAMES)
    if (shared is None) != (shared_gate is None) or not callable(getattr(shared or bank, "activation", None)):
        raise RuleError(
            f"{ctx.node.id!r}: {type(block).__name__} has a shared expert without its gate (or an activation where "
            "the experts rule looks), so it cannot rule it."
        )
    args, kwargs = ctx.call_arguments(xs)
    kwargs = {k: v for k, v in kwargs.items() if k != "training"}
    with contextlib.ExitStack() as stack:
        for gate in (router, shared_gate) if shared is not None else (router,):
            stack.enter_context(_replaced(gate, call=_constant_call(gate)))
        for mlp in (bank, shared) if shared is not None else (bank,):
            stack.enter_context(_replaced(mlp, **_ruled_mlp(mlp, mode)))
        out = block(*args, **kwargs)
    return keras.tree.flatten(out)[0]


def _constant_call(gate):
    def call(*args, **kwargs):
        return tf.stop_gradient(type(gate).call(gate, *args, **kwargs))

    return call


def _ruled_mlp(mlp, mode: str) -> dict:
    """A gated MLP's (the expert bank's, a shared expert's) ``call`` and ``activation`` under ``mode``'s rules."""
    activation = mlp.activation
    ruled = identity_activation if mode == "attnlrp" else constant_gate_activation

    def call(*args, **kwargs):
        out = type(mlp).call(mlp, *args, **kwargs)
        return half_gradient(out) if mode == "attnlrp" else out

    return {"call": call, "activation": lambda x: ruled(activation, x)}


class _ExpertMixtureRule(Rule):
    mode = ""

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return is_expert_mixture(node)

    def backward(self, ctx, grad_outputs):
        # the router logits (the block's second output) are constant under this rule: no gradient through them
        return rerun_gradient(ctx, grad_outputs, lambda xs: constant_router_mixture(ctx, xs, self.mode))


@register_rule("experts_lrp")
class ExpertsLRP(_ExpertMixtureRule):
    """AttnLRP on a mixture of experts: router constant, identity rule on the experts' activation, uniform rule
    on their gated product."""

    summary = "sparse mixture-of-experts blocks (Mixtral, Qwen 2 / 3 MoE)"
    mode = "attnlrp"


@register_rule("experts_cp")
class ExpertsCP(_ExpertMixtureRule):
    """CP-LRP on a mixture of experts: router and the experts' gates held constant."""

    summary = "sparse mixture-of-experts blocks (Mixtral, Qwen 2 / 3 MoE)"
    mode = "cp"
