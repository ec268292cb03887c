"""Excitation Backprop (marginal winning probability, MWP) and contrastive MWP (RULES_SPEC §2.3, §2.4).

J. Zhang, Z. Lin, J. Brandt, X. Shen, S. Sclaroff, *Top-down Neural Attention by Excitation Backprop*,
ECCV 2016, arXiv 1608.00507. A neuron passes its winning probability to its children in proportion to their
excitatory contributions ``â_j·w_ji`` (``w_ji ≥ 0``); in VJP form, per linear layer::

    z    = f(x; W₊, b=0)             # bias dropped (Caffe, TorchRay)
    g_in = x ⊙ VJP_f(W₊, g ⊘ stab(z)) # stab: z + 1e-20, and 0 where z == 0

Signed inputs (an image layer with centred pixels, the pointwise step of a SeparableConv, anything after a
BatchNorm or a non-ReLU activation) follow ``signed_input``: ``mwp_split`` (default; zennit's
``ExcitationBackprop`` with the bias zeroed: a connection is excitatory when ``x_j·w_ji > 0``), ``torchray``
(raw x with W₊, Caffe/TorchRay) or ``clamp`` (``max(x, 0)``). All three equal the plain rule for x ≥ 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gradscope.core.errors import PlanError
from gradscope.core.graph import NodeSpec
from gradscope.rules.builtin.linear_ops import (
    LinearOp,
    divide_mwp,
    layer_op,
    negative,
    no_autograph,
    node_kind,
    pass_signal,
    pass_to_gated,
    pool_op,
    positive,
    redistribute,
    redistribute_sum,
    separable_ops,
)
from gradscope.rules.registry import Rule, register_rule

SIGNED_INPUT_MODES = ("mwp_split", "torchray", "clamp")
BATCHNORM_MODES = ("identity", "true_gradient")


def mwp_linear(op: LinearOp, x: Any, g: Any, signed_input: str = "mwp_split", negate: bool = False) -> Any:
    """MWP through one linear op (bias dropped), ``-W`` instead of ``W`` when ``negate`` (the c-MWP dual)."""
    if negate and op.positive:
        raise PlanError("Negated weights make no sense for a layer with fixed positive weights (a pool).")
    wp = op.weights(op.kernels if op.positive else op.clamped(+1, negate))

    def plain() -> Any:
        return redistribute(op, g, [(x, wp)], divide_mwp)

    if signed_input == "torchray":
        return plain()
    if signed_input == "clamp":
        return op.by_sign(x, plain, lambda: redistribute(op, g, [(positive(x), wp)], divide_mwp))

    def split() -> Any:
        terms = [(positive(x), wp)]
        if not op.positive:  # a pool's W₋ is 0: negative inputs get nothing
            terms.append((negative(x), op.weights(op.clamped(-1, negate))))
        return redistribute(op, g, terms, divide_mwp)

    return op.by_sign(x, plain, split)


@dataclass(frozen=True)
class MWPParams:
    signed_input: str = "mwp_split"  # mwp_split | torchray | clamp (RULES_SPEC §2.3, signed inputs)
    batchnorm: str = "identity"  # identity (Caffe, TorchRay) | true_gradient (zennit without a canonizer)

    def __post_init__(self) -> None:
        if self.signed_input not in SIGNED_INPUT_MODES:
            raise ValueError(f"signed_input must be one of {', '.join(SIGNED_INPUT_MODES)}")
        if self.batchnorm not in BATCHNORM_MODES:
            raise ValueError(
                f"batchnorm must be one of {', '.join(BATCHNORM_MODES)}; to fold BatchNorm into the layer below "
                "it, explain the folded copy from gradscope.engine.backward.canonize.fold_batchnorm(model) instead"
            )


class _MWPBase(Rule):
    Params = MWPParams
    relevance = True  # x ⊙ …: the signal passed down is a winning probability (relevance), not a gradient
    kinds: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return node_kind(node) in cls.kinds


@register_rule("mwp")
class ExcitationBackprop(_MWPBase):
    """Excitation Backprop / MWP (Zhang et al. 2016, arXiv 1608.00507): W₊, bias dropped, x ⊙ W₊ᵀ(g ⊘ z).

    Per layer (RULES_SPEC §2.3): Dense/Conv*/DepthwiseConv/Conv*Transpose as above; SeparableConv as its
    depthwise and pointwise steps (the pointwise input is signed); average pools ``x ⊙ fᵀ(g ⊘ f(x))``; Add
    ``x_k ⊙ g ⊘ Σx`` (positive parts under ``mwp_split``/``clamp``); BatchNorm pass-through (``batchnorm``);
    non-ReLU activations and elementwise rescaling pass-through; ``x * gate`` with a broadcast gate
    (squeeze-and-excitation) all to ``x``; ReLU, max pools, reshapes: true gradient.
    """

    kinds = frozenset(
        {
            "linear",
            "separable",
            "avg_pool",
            "sum",
            "gate",
            "batchnorm",
            "scale",
            "activation",
            "relu",
            "max_pool",
            "structural",
        }
    )

    @no_autograph
    def backward(self, ctx: Any, grad_outputs: list[Any]) -> list[Any]:
        g, mode = grad_outputs[0], self.params.signed_input
        kind = node_kind(ctx.node)
        if kind == "linear":
            return [mwp_linear(layer_op(ctx), ctx.inputs[0], g, mode)]
        if kind == "separable":
            dw, pw, h = separable_ops(ctx)
            g_h = mwp_linear(pw, h, g, mode)
            return [mwp_linear(dw, ctx.inputs[0], g_h, mode)]
        if kind == "avg_pool":
            return [mwp_linear(pool_op(ctx), ctx.inputs[0], g, mode)]
        if kind == "sum":
            if mode == "torchray":
                return redistribute_sum(ctx, g, divide_mwp)
            return redistribute_sum(ctx, g, divide_mwp, positive)
        if kind == "batchnorm" and self.params.batchnorm == "true_gradient":
            return ctx.vjp(grad_outputs)
        if kind == "gate":
            return pass_to_gated(ctx, grad_outputs)
        if kind in ("batchnorm", "scale", "activation"):
            return pass_signal(ctx, grad_outputs)
        return ctx.vjp(grad_outputs)  # ReLU, max pool, reshapes: the true gradient is the MWP rule


@register_rule("cmwp")
class ContrastiveMWP(_MWPBase):
    """Contrastive MWP on the classifier layer (Zhang et al. 2016, §3.2): MWP(W)(g) − MWP(−W)(g).

    The dual output unit has the classifier's weights negated; since MWP is linear in the signal below the
    classifier, subtracting the two signals here and running plain MWP further down is exactly the paper's
    two-pass contrastive procedure (Caffe ``eval_coco.py``, TorchRay ``contrastive_excitation_backprop``). The
    difference is not clamped; the map read-out keeps ``max(Σ_c, 0)``.
    """

    kinds = frozenset({"linear"})

    @no_autograph
    def backward(self, ctx: Any, grad_outputs: list[Any]) -> list[Any]:
        g, mode, x = grad_outputs[0], self.params.signed_input, ctx.inputs[0]
        op = layer_op(ctx)
        return [mwp_linear(op, x, g, mode) - mwp_linear(op, x, g, mode, negate=True)]
