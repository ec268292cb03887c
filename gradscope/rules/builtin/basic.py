"""Basic rules: true gradient, stop, scale, clip, sign, and backward-as-another-activation."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gradscope.backend import keras, tf
from gradscope.core.errors import PlanError
from gradscope.core.graph import NodeSpec
from gradscope.rules.registry import Rule, register_rule


@register_rule("identity")
class Identity(Rule):
    """The true gradient (no interception: the engine does not wrap the node)."""

    passthrough = True


@register_rule("true_gradient")
class TrueGradient(Rule):
    """The true gradient, computed through the rule machinery (ctx.vjp); checks the wrapping itself."""

    def backward(self, ctx, grad_outputs):
        return ctx.vjp(grad_outputs)


@register_rule("zero")
class Zero(Rule):
    """Stop the gradient here: nothing flows to the node's inputs."""

    def backward(self, ctx, grad_outputs):
        return [tf.zeros_like(x) for x in ctx.inputs]


@dataclass(frozen=True)
class ScaleParams:
    factor: float = 1.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.factor):
            raise ValueError(f"factor must be a finite number, got {self.factor}")


@register_rule("scale")
class Scale(Rule):
    """Multiply the gradient leaving the node by ``factor`` (true VJP of factor * upstream)."""

    Params = ScaleParams

    def backward(self, ctx, grad_outputs):
        return ctx.vjp([g * self.params.factor for g in grad_outputs])


@dataclass(frozen=True)
class ClipParams:
    low: float = -1.0
    high: float = 1.0

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")


@register_rule("clip")
class Clip(Rule):
    """Clip the gradient leaving the node to [low, high] (elementwise, after the true VJP)."""

    Params = ClipParams

    def backward(self, ctx, grad_outputs):
        return [
            None if g is None else tf.clip_by_value(g, self.params.low, self.params.high) for g in ctx.vjp(grad_outputs)
        ]


@register_rule("sign")
class Sign(Rule):
    """Pass only the sign of the gradient leaving the node (after the true VJP)."""

    def backward(self, ctx, grad_outputs):
        return [None if g is None else tf.sign(g) for g in ctx.vjp(grad_outputs)]


def activation_fn(name: str):
    """A Keras activation by name, with a clear error for a typo."""
    try:
        return keras.activations.get(name)
    except (ValueError, TypeError):
        known = "relu, sigmoid, tanh, softplus, gelu, elu, selu, swish/silu, leaky_relu, relu6, hard_sigmoid, linear"
        raise PlanError(f"Unknown activation {name!r}; try one of: {known}.") from None


@dataclass(frozen=True)
class BackwardAsParams:
    activation: str = "sigmoid"


@register_rule("backward_as")
class BackwardAs(Rule):
    """Forward unchanged; backward uses the derivative of another activation at the same pre-activation.

    Local semantics: only this node's derivative is swapped (forward ReLU, backward as if sigmoid: the upstream
    gradient is multiplied by sigmoid'(x) instead of relu'(x)). Layers above are differentiated at the real
    forward values.
    """

    Params = BackwardAsParams

    def __init__(self, params=None) -> None:
        super().__init__(params)
        self.fn = activation_fn(self.params.activation)

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return node.activation is not None and node.activation != "softmax"

    def backward(self, ctx, grad_outputs):
        x = ctx.inputs[0]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(x)
            y = self.fn(x)
        return [tape.gradient(y, x, output_gradients=grad_outputs[0])]
