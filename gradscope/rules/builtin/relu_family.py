"""Guided backprop and deconvnet: rules for ReLU-like nodes (RULES_SPEC §2.2).

Every other layer keeps its true VJP; only the ReLU-like nodes change. The rules work on any ReLU-like node:
standalone ``ReLU``/``LeakyReLU`` layers, ``Activation("relu")``, fused ``activation="relu"`` split off into
``<id>`` nodes (after ``<id>:pre``), ``ReLU(max_value=6)``/``relu6`` and ``keras.ops.relu`` calls in functional models.
"""

from __future__ import annotations

from gradscope.backend import tf
from gradscope.core.graph import NodeSpec
from gradscope.rules.registry import Rule, register_rule

#: ``NodeSpec.activation`` names of ReLU-like nodes (``relu_custom``: ReLU with a threshold or another cap).
RELU_ACTIVATIONS = ("relu", "relu6", "leaky_relu", "relu_custom")
#: ``NodeSpec.op_type`` of ``keras.ops.relu``/``relu6``/``leaky_relu`` called inside a functional model.
RELU_OP_TYPES = ("Relu", "Relu6", "LeakyRelu")


def is_relu_like(node: NodeSpec) -> bool:
    return node.activation in RELU_ACTIVATIONS or node.op_type in RELU_OP_TYPES


def relu_selectors() -> tuple[str, ...]:
    """Plan selectors that together match every ReLU-like node (what the presets use)."""
    return ("activation:" + ",".join(RELU_ACTIVATIONS), "type:" + ",".join(RELU_OP_TYPES))


class _ReluRule(Rule):
    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return is_relu_like(node) and len(node.input_shapes) == 1


@register_rule("guided_backprop")
class GuidedBackprop(_ReluRule):
    """Guided backprop: pass g ⊙ f'(z) only where the upstream signal is positive (Springenberg et al. 2015).

    J. T. Springenberg, A. Dosovitskiy, T. Brox, M. Riedmiller, *Striving for Simplicity: The All Convolutional
    Net*, ICLR workshop 2015, arXiv 1412.6806. For ReLU this is ``g ⊙ 1[z>0] ⊙ 1[g>0]`` (zennit's
    ``ReLUGuidedBackprop``: nothing passes at z == 0); ReLU6 uses its own mask ``0<z<6`` and LeakyReLU its slope:
    in general ``g ⊙ f'(z) ⊙ 1[g>0]``.
    """

    def backward(self, ctx, grad_outputs):
        # f is elementwise, so its true VJP of max(g, 0) is max(g, 0) ⊙ f'(z): the node's own forward mask.
        return ctx.vjp([tf.nn.relu(grad_outputs[0])])


@register_rule("deconvnet")
class Deconvnet(_ReluRule):
    """Deconvnet: pass max(g, 0), ignoring the forward mask (Zeiler & Fergus 2014).

    M. D. Zeiler, R. Fergus, *Visualizing and Understanding Convolutional Networks*, ECCV 2014, arXiv 1311.2901:
    the reconstruction is passed through a ReLU on the way down. Same as zennit ``ReLUDeconvNet``, TorchRay
    ``DeConvNetReLU`` and Caffe ``Backward_dc``; ReLU6 and LeakyReLU nodes are treated the same way.
    """

    def backward(self, ctx, grad_outputs):
        return [tf.nn.relu(grad_outputs[0])]
