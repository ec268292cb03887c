"""Rules that use the layer's weights: an example rule file for gradscope (the C-MWP use case).

The TF1 way was ``gradient_override_map`` plus walking ``op.inputs`` to find the kernel; a gradscope rule is
given the layer and its weights directly: ``ctx.layer``, ``ctx.weights["kernel"]``, ``ctx.weights["bias"]``.
``ctx.vjp(g, weights=...)`` is the true VJP of the node's own op at modified weights, and ``ctx.forward(weights=...)``
re-runs the node with them (bias included if present: pass ``weights={"bias": zeros}`` to drop it).

Load with ``gradscope.load_rule_file(path)`` (or ``--rules`` on the command line, or the GUI), then e.g.
``Plan().with_entry("type:Dense,Conv2D", "example_positive_weights")``.
"""

from gradscope.rules.base import Rule, register_rule

LINEAR_TYPES = ("Dense", "Conv1D", "Conv2D", "Conv3D")


class _LinearRule(Rule):
    @classmethod
    def applies_to(cls, node):
        return node.op_type in LINEAR_TYPES


@register_rule("example_positive_weights")
class PositiveWeights(_LinearRule):
    """Backprop through the excitatory connections only: g_in = W₊ᵀ g with W₊ = max(W, 0)."""

    def backward(self, ctx, grad_outputs):
        w_plus = ctx.tf.maximum(ctx.weights["kernel"], 0.0)
        return ctx.vjp(grad_outputs, weights={"kernel": w_plus})


@register_rule("example_excitation_backprop")
class ExampleExcitationBackprop(_LinearRule):
    """One Excitation Backprop (MWP) step: g_in = x ⊙ W₊ᵀ (g ⊘ z), z = f(x; W₊, no bias).

    Zhang et al., *Top-down Neural Attention by Excitation Backprop*, ECCV 2016, arXiv 1608.00507: the winning
    probability of a neuron is split among its inputs in proportion to x_j·w⁺_ji. Assumes x ≥ 0 (post-ReLU
    inputs). A signal reaching a neuron with z = 0 is dropped (Caffe's convention).
    """

    def backward(self, ctx, grad_outputs):
        tf = ctx.tf
        mod = {"kernel": tf.maximum(ctx.weights["kernel"], 0.0)}
        if "bias" in ctx.weights:
            mod["bias"] = tf.zeros_like(ctx.weights["bias"])
        (z,) = ctx.forward(weights=mod)  # the node's own op with W₊ and no bias
        g = grad_outputs[0]
        s = tf.where(z > 0, g / tf.where(z > 0, z, tf.ones_like(z)), tf.zeros_like(g))
        (back,) = ctx.vjp([s], weights=mod)
        return [ctx.inputs[0] * back]
