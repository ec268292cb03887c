"""Activation substitution with global semantics, and the straight-through estimator.

``backward_as`` (basic.py) swaps only the node's own derivative: the layers above are still differentiated at
the real forward values. ``substitute_activation`` swaps the activation for the whole backward pass: the layers
above see ``f2(x)`` as this node's output, so the gradient is exactly that of the model with ``f2`` in place of
the node's activation, while the predictions shown stay the real ones (the engine runs a plain forward for them).
"""

from __future__ import annotations

from dataclasses import dataclass

from gradscope.backend import tf
from gradscope.core.graph import NodeSpec
from gradscope.rules.builtin.basic import activation_fn
from gradscope.rules.registry import Rule, register_rule


def _derivative_vjp(fn, x, g):
    """g ⊙ fn'(x) for an elementwise ``fn`` (the VJP of ``fn`` at ``x``)."""
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x, output_gradients=g, unconnected_gradients="zero")


@dataclass(frozen=True)
class SubstituteParams:
    activation: str = "sigmoid"


@register_rule("substitute_activation")
class SubstituteActivation(Rule):
    """Differentiate the model as if this node's activation were ``activation`` (global semantics).

    The "backward with another activation" question of the gradscope design (forward ReLU, backward as if
    sigmoid, for the whole backward pass): the layers above receive ``f2(x)`` in the backward pass, and this
    node's backward is ``g ⊙ f2'(x)``; ``x`` is the node's input (its pre-activation). Also known as the
    surrogate-forward trick: the result equals the plain gradient of a copy of the model with ``f2`` in place.
    """

    Params = SubstituteParams

    def __init__(self, params=None) -> None:
        super().__init__(params)
        self.fn = activation_fn(self.params.activation)

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return node.activation is not None and node.activation != "softmax" and len(node.input_shapes) == 1

    def forward_override(self, ctx):
        return [self.fn(ctx.inputs[0])]

    def backward(self, ctx, grad_outputs):
        return [_derivative_vjp(self.fn, ctx.inputs[0], grad_outputs[0])]


@dataclass(frozen=True)
class StraightThroughParams:
    backward: str = "identity"


@register_rule("straight_through")
class StraightThrough(Rule):
    """Straight-through estimator: forward unchanged, backward as the derivative of ``backward`` (identity: g).

    Y. Bengio, N. Léonard, A. Courville, *Estimating or Propagating Gradients Through Stochastic Neurons for
    Conditional Computation*, arXiv 1308.3432 (2013). Runs on any one-input node whose output has its input's
    shape: activations, and ops such as ``keras.ops.round``/``sign`` whose true gradient is zero or None.
    """

    Params = StraightThroughParams

    def __init__(self, params=None) -> None:
        super().__init__(params)
        name = self.params.backward.strip().lower()
        self.fn = None if name in ("identity", "linear") else activation_fn(name)

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return (
            not node.is_input
            and len(node.input_shapes) == 1
            and len(node.output_shapes) == 1
            and tuple(node.input_shapes[0]) == tuple(node.output_shapes[0])
            and node.activation != "softmax"
        )

    def backward(self, ctx, grad_outputs):
        x, g = ctx.inputs[0], grad_outputs[0]
        if self.fn is None:
            return [tf.cast(g, x.dtype)]
        return [_derivative_vjp(self.fn, x, g)]
