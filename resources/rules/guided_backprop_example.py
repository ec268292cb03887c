"""Guided backprop written as a user rule: an example rule file for gradscope.

Load it with ``gradscope explain MODEL IMAGE --rules resources/rules/guided_backprop_example.py --plan PLAN``,
from the GUI ("Load rule file..."), or in Python with ``gradscope.load_rule_file(path)``; then use the rule name
in a plan, e.g. ``Plan().with_entry("activation:relu", "example_guided_backprop")``.
It gives the same result as the built-in ``guided_backprop`` rule on ReLU nodes.
"""

from gradscope.rules.base import Rule, register_rule


@register_rule("example_guided_backprop")
class ExampleGuidedBackprop(Rule):
    """Guided backprop on ReLU: pass g where z > 0 and g > 0 (Springenberg et al. 2015, arXiv 1412.6806)."""

    @classmethod
    def applies_to(cls, node):
        return node.activation == "relu"  # plain ReLU nodes: layers, Activation("relu"), fused activation="relu"

    def backward(self, ctx, grad_outputs):
        tf = ctx.tf
        g, z = grad_outputs[0], ctx.inputs[0]  # upstream signal, and the ReLU's input (pre-activation)
        return [g * tf.cast(z > 0, g.dtype) * tf.cast(g > 0, g.dtype)]  # one gradient per input
