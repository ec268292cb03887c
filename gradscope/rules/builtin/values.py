"""A node's *value* replaced: the founding question "use another value a2 as this node's activation during
backprop" (RULES_SPEC §10), in its two readings.

- ``substitute_value`` (backward at a2): the forward keeps a1, so the outputs, predictions and loss shown are the
  model's own; every derivative at and after the node is taken as if the node had output a2: the layers above are
  differentiated on the forward recomputed from a2, and the node's own derivative, where it can be written in its
  output (ReLU, sigmoid, tanh, ELU...), is evaluated at a2 (elsewhere it is the node's derivative at its inputs).
- ``patch_value`` (forward and backward at a2): activation patching; the model runs with the node's value replaced
  and outputs, loss and gradients all follow (plain autodiff through the new value).

a2 is, where the mask says: ``zero`` (ablation), ``constant`` (``value``), ``scale`` (``factor`` x a1), ``mean``
(over the batch of the other input given to the run, else of this batch: mean ablation), ``input`` (the node's
value on another input of the same shape: a corrupted or counterfactual input) or ``function`` (a function a rule
file registers with ``@register_value``: ``fn(a1, source) -> a2``). The mask: all of it, or chosen ``positions``
(axis 1: tokens), ``channels`` (the last axis) and a ``region`` (``y0, x0, y1, x1`` on axes 1 and 2, half-open).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gradscope.backend import tf
from gradscope.core.errors import PlanError, RuleError
from gradscope.core.graph import NodeSpec
from gradscope.rules.registry import Rule, register_rule, value_function

SOURCES = ("zero", "constant", "scale", "mean", "input", "function")
#: Sources that read another input given to the run (the engine computes the node's value there first; a function
#: gets None without one).
READS_ANOTHER_INPUT = ("input", "mean", "function")


@dataclass(frozen=True)
class ValueParams:
    source: str = "zero"
    value: float = 0.0  # source "constant"
    factor: float = 1.0  # source "scale"
    function: str = ""  # source "function": a name registered with @register_value
    positions: tuple = ()  # indices on axis 1 (tokens); () all
    channels: tuple = ()  # indices on the last axis; () all
    region: tuple = ()  # y0, x0, y1, x1 on axes 1 and 2 (half-open); () all

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise PlanError(f"A value's source is one of {', '.join(SOURCES)}; got {self.source!r}.")
        if self.source == "function" and not self.function:
            raise PlanError("Source 'function' names the function: function='name' (registered by a rule file).")
        for name in ("positions", "channels", "region"):
            items = getattr(self, name)
            if not isinstance(items, (list, tuple)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in items
            ):
                raise PlanError(f"{name} is a list of whole numbers; got {items!r}.")
            object.__setattr__(self, name, tuple(items))
        y0, x0, y1, x1 = self.region if len(self.region) == 4 else (0, 0, 0, 0)
        if self.region and not (y0 < y1 and x0 < x1):
            raise PlanError(f"region is y0, x0, y1, x1 with y0 < y1 and x0 < x1; got {list(self.region)}.")

    def describe(self) -> str:
        what = {"constant": f"{self.value:g}", "scale": f"{self.factor:g} x the value", "function": self.function}
        where = [f"{n} {list(getattr(self, n))}" for n in ("positions", "channels", "region") if getattr(self, n)]
        return f"{what.get(self.source, self.source)}" + (f" at {', '.join(where)}" if where else "")


class _ValueRule(Rule):
    Params = ValueParams

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        return not node.is_input and bool(node.output_shapes)

    def new_value(self, ctx: Any) -> Any:
        """a2 where the mask says, a1 elsewhere, in a1's dtype."""
        a1 = ctx.outputs[0]
        if not a1.dtype.is_floating:
            raise RuleError(f"{self.name} replaces a float value; node {ctx.node.id!r} outputs {a1.dtype.name}.")
        a2 = _source_value(self.params, a1, ctx.source, ctx.node.id, self.name)
        mask = _mask(self.params, a1)
        return a2 if mask is None else tf.where(mask, a2, a1)

    def forward_override(self, ctx):
        return [self.new_value(ctx), *ctx.outputs[1:]]


@register_rule("substitute_value")
class SubstituteValue(_ValueRule):
    """Backward as if this node had output another value a2 (the forward keeps its own): the layers above are
    differentiated at a2, and the node's own derivative, where its activation's can be written in its output, at
    a2 too. RULES_SPEC §10; the founding question of gradscope's design."""

    summary = "any node; a2: zero, a constant, a scale, a mean, another input, a function"

    def backward(self, ctx, grad_outputs):
        true = ctx.vjp(grad_outputs)
        derivative = _output_form(ctx)
        if derivative is None or len(ctx.inputs) != 1:
            return true
        a2 = self.new_value(ctx)
        at_a2 = grad_outputs[0] * tf.cast(derivative(a2), grad_outputs[0].dtype)
        mask = _mask(self.params, ctx.outputs[0])
        return [at_a2 if mask is None else tf.where(mask, at_a2, true[0])]


@register_rule("patch_value")
class PatchValue(_ValueRule):
    """Activation patching: the model runs with this node's value replaced by a2 (outputs, loss and gradients are
    the patched model's)."""

    summary = "any node; a2: zero, a constant, a scale, a mean, another input, a function"
    patches_forward = True


def reads_another_input(rule: Any) -> bool:
    """Whether a rule of a plan reads the node's value on another input given to the run."""
    return isinstance(rule, _ValueRule) and rule.params.source in READS_ANOTHER_INPUT


def _source_value(params: ValueParams, a1: Any, source: Any, node: str, rule: str) -> Any:
    kind = params.source
    if kind == "zero":
        return tf.zeros_like(a1)
    if kind == "constant":
        return tf.fill(tf.shape(a1), tf.cast(params.value, a1.dtype))
    if kind == "scale":
        return a1 * tf.cast(params.factor, a1.dtype)
    if kind == "mean":
        of = a1 if source is None else tf.cast(source, a1.dtype)
        return tf.broadcast_to(tf.reduce_mean(of, axis=0, keepdims=True), tf.shape(a1))
    if kind == "function":
        out = tf.convert_to_tensor(value_function(params.function)(a1, source))
        if not out.shape.is_compatible_with(a1.shape):
            raise RuleError(f"The value function {params.function!r} returned shape {out.shape} for {a1.shape}.")
        return tf.cast(out, a1.dtype)
    if source is None:
        raise RuleError(
            f"{rule} on node {node!r} takes its value from another input: give one (alternate= in Python, "
            "--alternate on the command line, the corrupted input of the window's Patching view)."
        )
    source = tf.cast(source, a1.dtype)
    if not source.shape[1:].is_compatible_with(a1.shape[1:]):
        raise RuleError(
            f"{rule} on node {node!r}: the other input gives this node shape {tuple(source.shape)}, this input "
            f"{tuple(a1.shape)}; give an input of the same shape (for text: as many tokens)."
        )
    return tf.broadcast_to(source, tf.shape(a1))  # one other sample serves a whole batch


def _mask(params: ValueParams, a1: Any) -> Any:
    """Where a2 replaces a1 (a boolean tensor that broadcasts to a1), None for all of it."""
    rank = a1.shape.rank
    mask = None

    def along(axis: int, keep: Any) -> Any:
        shape = [1] * rank
        shape[axis] = -1
        return tf.reshape(keep, shape)

    def chosen(axis: int, indices: tuple) -> Any:
        size = tf.shape(a1)[axis]
        picked = tf.math.floormod(tf.constant(indices, tf.int32), size)  # -1: the last
        return along(axis, tf.reduce_any(tf.equal(tf.range(size)[:, None], picked[None, :]), axis=1))

    parts = []
    if params.positions:
        if rank < 3:
            raise RuleError(f"positions pick along axis 1 of a (batch, sequence, ...) value; this one has rank {rank}.")
        parts.append(chosen(1, params.positions))
    if params.channels:
        parts.append(chosen(rank - 1, params.channels))
    if params.region:
        if rank != 4:
            raise RuleError(f"A region is on the rows and columns of a (batch, H, W, C) value, not of rank {rank}.")
        y0, x0, y1, x1 = params.region
        rows, cols = tf.range(tf.shape(a1)[1]), tf.range(tf.shape(a1)[2])
        parts.append(along(1, (rows >= y0) & (rows < y1)))
        parts.append(along(2, (cols >= x0) & (cols < x1)))
    for part in parts:
        mask = part if mask is None else tf.logical_and(mask, part)
    return mask


def _output_form(ctx: Any) -> Any:
    """The derivative of the node's activation written in its output y (``f'(x) = d(y)``), or None."""
    name = ctx.node.activation
    layer = ctx.layer
    if name == "relu":
        return lambda y: tf.cast(y > 0, y.dtype)
    if name == "relu6":
        return lambda y: tf.cast((y > 0) & (y < 6), y.dtype)
    if name == "leaky_relu":
        slope = float(getattr(layer, "negative_slope", getattr(layer, "alpha", 0.2)))
        return lambda y: tf.where(y > 0, tf.ones_like(y), tf.fill(tf.shape(y), tf.cast(slope, y.dtype)))
    if name == "elu":
        alpha = float(getattr(layer, "alpha", 1.0)) if type(layer).__name__ == "ELU" else 1.0
        return lambda y: tf.where(y > 0, tf.ones_like(y), y + tf.cast(alpha, y.dtype))
    if name == "sigmoid":
        return lambda y: y * (1 - y)
    if name == "tanh":
        return lambda y: 1 - y * y
    if name == "softplus":
        return lambda y: -tf.math.expm1(-y)
    if name == "exponential":
        return lambda y: y
    if name == "linear":
        return tf.ones_like
    return None
