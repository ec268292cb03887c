"""Layer-wise Relevance Propagation: the ε, αβ and z⁺ rules (RULES_SPEC §2.5, §2.6).

S. Bach, A. Binder, G. Montavon, F. Klauschen, K.-R. Müller, W. Samek, *On Pixel-Wise Explanations for
Non-Linear Classifier Decisions by Layer-Wise Relevance Propagation*, PLoS ONE 10(7), 2015 (ε and αβ);
G. Montavon, S. Lapuschkin, A. Binder, W. Samek, K.-R. Müller, *Explaining nonlinear classification decisions
with deep Taylor decomposition*, Pattern Recognition 65, 2017 (z⁺). Formulas and stabilisers follow zennit 0.5.1
(``Epsilon``, ``AlphaBeta``, ``ZPlus``, ``Norm``, ``Pass``; ``stabilize`` = ``z + ε·sign₀(z)``).

Per layer kind: Dense/Conv*/DepthwiseConv/Conv*Transpose and both SeparableConv steps get the rule; average
pools and Add get ``Norm`` (ε = 1e-6, or the αβ/z⁺ rule's ``stabilizer``); BatchNorm is a diagonal affine layer
under the ε rule (the rule's ε for LRP-ε, the stabiliser otherwise: the same as folding it into the layer below,
up to the stabilisers); non-ReLU activations and elementwise rescaling pass the relevance through, and so
does ``x * gate`` with a broadcast gate to ``x`` (signal-take-all, Arras et al. 2017; the gate gets none); ReLU
and max pools keep the true gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gradscope.core.graph import NodeSpec
from gradscope.rules.builtin.linear_ops import (
    LinearOp,
    divide_signeps,
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

NORM_EPS = 1e-6  # zennit's default stabiliser (Norm, ZPlus, AlphaBeta)

LinearRule = Callable[[LinearOp, Any, Any], Any]


def _signeps(eps: float) -> Callable[[Any, Any], Any]:
    return lambda g, z: divide_signeps(g, z, eps)


def _bias(op: LinearOp, keep: bool, part: Callable[[Any], Any] | None = None) -> Any:
    if not keep or op.bias is None:
        return "zero"
    return op.bias if part is None else part(op.bias)


def lrp_epsilon_linear(op: LinearOp, x: Any, g: Any, eps: float, bias: bool = True) -> Any:
    """``x ⊙ VJP_f(W, g ⊘ (z + ε·sign₀(z)))`` with ``z = f(x; W, b)`` (zennit ``Epsilon``)."""
    return redistribute(op, g, [(x, op.weights(op.kernels, _bias(op, bias)))], _signeps(eps))


def lrp_alpha_beta_linear(
    op: LinearOp, x: Any, g: Any, alpha: float, beta: float, bias: bool = True, eps: float = NORM_EPS
) -> Any:
    """αβ (zennit ``AlphaBeta``; z⁺ is α=1, β=0): positive and negative contributions normalised apart.

    ``zp = f(x₊; W₊, b₊) + f(x₋; W₋, 0)``, ``zn = f(x₊; W₋, b₋) + f(x₋; W₊, 0)`` (RULES_SPEC §2.6).
    """
    wp, wn = op.clamped(+1), op.clamped(-1)
    div = _signeps(eps)

    def nonneg() -> Any:  # x₋ = 0: its terms vanish exactly
        out = alpha * redistribute(op, g, [(x, op.weights(wp, _bias(op, bias, positive)))], div)
        if beta:
            out -= beta * redistribute(op, g, [(x, op.weights(wn, _bias(op, bias, negative)))], div)
        return out

    def signed() -> Any:
        xp, xn = positive(x), negative(x)
        pos = [(xp, op.weights(wp, _bias(op, bias, positive))), (xn, op.weights(wn))]
        out = alpha * redistribute(op, g, pos, div)
        if beta:
            neg = [(xp, op.weights(wn, _bias(op, bias, negative))), (xn, op.weights(wp))]
            out -= beta * redistribute(op, g, neg, div)
        return out

    return op.by_sign(x, nonneg, signed)


class _LRPRule(Rule):
    """Dispatch by node kind; subclasses give the linear-layer rule and the BatchNorm ε."""

    relevance = True

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return node_kind(node) not in ("input", "unknown")

    def linear(self, op: LinearOp, x: Any, g: Any) -> Any:
        raise NotImplementedError

    def norm_eps(self) -> float:
        """Stabiliser of the Norm steps (average pools, Add)."""
        return NORM_EPS

    def batchnorm_eps(self) -> float:
        return self.norm_eps()

    @no_autograph
    def backward(self, ctx: Any, grad_outputs: list[Any]) -> list[Any]:
        g = grad_outputs[0]
        kind = node_kind(ctx.node)
        if kind == "linear":
            return [self.linear(layer_op(ctx), ctx.inputs[0], g)]
        if kind == "separable":
            dw, pw, h = separable_ops(ctx)
            return [self.linear(dw, ctx.inputs[0], self.linear(pw, h, g))]
        if kind == "avg_pool":
            return [redistribute(pool_op(ctx), g, [(ctx.inputs[0], {})], _signeps(self.norm_eps()))]
        if kind == "sum":
            return redistribute_sum(ctx, g, _signeps(self.norm_eps()))
        if kind == "batchnorm":
            # A diagonal affine layer y = a·x + c under the ε rule, shift included like a bias.
            affine = LinearOp(lambda x, w: ctx.forward([x])[0], {}, node=ctx)
            return [redistribute(affine, g, [(ctx.inputs[0], {})], _signeps(self.batchnorm_eps()))]
        if kind == "gate":
            return pass_to_gated(ctx, grad_outputs)
        if kind in ("scale", "activation"):
            return pass_signal(ctx, grad_outputs)
        return ctx.vjp(grad_outputs)  # ReLU, max pool (winner takes all), reshapes


@dataclass(frozen=True)
class EpsilonParams:
    epsilon: float = 0.1
    bias: bool = True

    def __post_init__(self) -> None:
        if not (self.epsilon >= 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"epsilon must be a finite number >= 0, got {self.epsilon}")


@register_rule("lrp_epsilon")
class LRPEpsilon(_LRPRule):
    """LRP-ε (Bach et al. 2015): x ⊙ Wᵀ(g ⊘ (z + ε·sign₀(z))), z with the bias; ε = 0 is LRP-0."""

    Params = EpsilonParams

    def linear(self, op: LinearOp, x: Any, g: Any) -> Any:
        return lrp_epsilon_linear(op, x, g, self.params.epsilon, self.params.bias)

    def batchnorm_eps(self) -> float:
        return self.params.epsilon


def _check_stabilizer(value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"stabilizer must be a finite number > 0, got {value}")


@dataclass(frozen=True)
class AlphaBetaParams:
    alpha: float = 2.0
    beta: float = 1.0
    bias: bool = True
    stabilizer: float = NORM_EPS  # ε of z + ε·sign₀(z) in both normalisations (zennit ``stabilizer``)

    def __post_init__(self) -> None:
        if self.beta < 0 or not math.isclose(self.alpha - self.beta, 1.0, abs_tol=1e-9):
            raise ValueError(f"need alpha - beta = 1 and beta >= 0, got alpha={self.alpha}, beta={self.beta}")
        _check_stabilizer(self.stabilizer)


@register_rule("lrp_alpha_beta")
class LRPAlphaBeta(_LRPRule):
    """LRP-αβ (Bach et al. 2015): α·(positive part, normalised) − β·(negative part, normalised), α − β = 1."""

    Params = AlphaBetaParams

    def linear(self, op: LinearOp, x: Any, g: Any) -> Any:
        p = self.params
        return lrp_alpha_beta_linear(op, x, g, p.alpha, p.beta, p.bias, p.stabilizer)

    def norm_eps(self) -> float:
        return self.params.stabilizer


@dataclass(frozen=True)
class ZPlusParams:
    bias: bool = True  # zennit keeps b₊ in z; False is the classic DTD z⁺ (= MWP for x >= 0)
    stabilizer: float = NORM_EPS

    def __post_init__(self) -> None:
        _check_stabilizer(self.stabilizer)


@register_rule("lrp_zplus")
class LRPZPlus(_LRPRule):
    """LRP-z⁺ = α1β0 (Montavon et al. 2017, deep Taylor decomposition): only positive contributions."""

    Params = ZPlusParams

    def linear(self, op: LinearOp, x: Any, g: Any) -> Any:
        return lrp_alpha_beta_linear(op, x, g, 1.0, 0.0, self.params.bias, self.params.stabilizer)

    def norm_eps(self) -> float:
        return self.params.stabilizer


@dataclass(frozen=True)
class GateParams:
    gate: int = -1  # index of the gate input; -1: the broadcast one

    def __post_init__(self) -> None:
        if self.gate not in (-1, 0, 1):
            raise ValueError(f"gate must be -1 (the broadcast input), 0 or 1, got {self.gate}")


@register_rule("signal_take_all")
class SignalTakeAll(Rule):
    """``x * gate``: all of the signal to ``x``, none to the gate (Arras et al. 2017, *Explaining recurrent
    neural network predictions in sentiment analysis*, WASSA; used for squeeze-and-excitation gates)."""

    Params = GateParams

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return node.op_type == "Multiply" and len(node.input_shapes) == 2

    @no_autograph
    def backward(self, ctx: Any, grad_outputs: list[Any]) -> list[Any]:
        return pass_to_gated(ctx, grad_outputs, None if self.params.gate < 0 else self.params.gate)
