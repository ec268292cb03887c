"""A node under its rule in the backward pass: what the rule sees of it (``RuleContext``) and, for the whole-plan
path, the node's call under its rule (``rule_call``): the node wrapped in ``tf.custom_gradient`` with its tensors and
weights as explicit inputs (the rule's backward runs in place of the node's VJP), or, for a rule that patches the
node's value (``Rule.patches_forward``), the node's own call followed by the rule's new value.

Pitfalls avoided (DESIGN.md): keyword arguments and closure-captured tensors get no gradient, so every tensor is
passed positionally; weights are read outside and mapped in with a StatelessScope, so no variable is read inside
the wrapped function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gradscope.backend import keras, tf
from gradscope.core.errors import GradscopeError, RuleError
from gradscope.core.graph import NodeSpec


@dataclass
class RuleContext:
    """The node being differentiated, its forward values and helpers to re-run it.

    Attributes:
        node: the node's ``NodeSpec`` (id, type, shapes, activation name).
        layer: the Keras layer/operation that runs the node (for a split activation: the layer it was fused in).
        inputs: forward input tensors (flattened, in call order).
        outputs: forward output tensors.
        weights: the layer's weights by short name (``kernel``, ``bias``, ``gamma``...), as tensors.
        weight_list: the same weights in ``layer.trainable_variables + non_trainable_variables`` order.
    """

    node: NodeSpec
    layer: Any
    inputs: list[Any]
    outputs: list[Any]
    weight_list: list[Any]
    weight_names: list[str]
    _forward: Callable[[Sequence[Any], Sequence[Any]], list[Any]]
    _pack: Callable[[Sequence[Any]], tuple[tuple, dict]] | None = None
    # ``(weights, dys) -> dxs``: the node's true VJP at its forward inputs, for any weights, without running the
    # node again (the live path's lowered ops: ``Conv2DBackpropInput`` alone, where a tape over the call runs the
    # convolution again and walks the tape)
    _true_vjp: Callable[[list[Any], list[Any]], list[Any]] | None = None
    #: what a value rule reads from another input: the node's value there, or their mean (None: none given)
    source: Any = None

    tf = tf
    ops = keras.ops

    def call_arguments(self, inputs: Sequence[Any] | None = None) -> tuple[tuple, dict]:
        """The ``(args, kwargs)`` the layer is called with, ``inputs`` (default: the forward inputs) in place of
        its tensors: which tensor is the query, which the attention mask, what the flags say."""
        if self._pack is None:
            from gradscope.core.errors import RuleError

            raise RuleError(f"Node {self.node.id!r}: its call's arguments are not available here.")
        return self._pack(list(self.inputs if inputs is None else inputs))

    @property
    def weights(self) -> dict[str, Any]:
        return dict(zip(self.weight_names, self.weight_list))

    @property
    def activation(self) -> str | None:
        return self.node.activation

    def _weights_with(self, overrides: dict[str, Any] | None) -> list[Any]:
        if not overrides:
            return list(self.weight_list)
        unknown = set(overrides) - set(self.weight_names)
        if unknown:
            from gradscope.core.errors import RuleError

            raise RuleError(f"Node {self.node.id!r} has no weight(s) {sorted(unknown)}; it has {self.weight_names}.")
        return [overrides.get(n, w) for n, w in zip(self.weight_names, self.weight_list)]

    def forward(self, inputs: Sequence[Any] | None = None, weights: dict[str, Any] | None = None) -> list[Any]:
        """Run the node again, optionally at other inputs and/or with some weights replaced (e.g. ``W+``)."""
        xs = list(self.inputs if inputs is None else inputs)
        return self._forward(xs, self._weights_with(weights))

    def vjp(
        self,
        grad_outputs: Sequence[Any],
        inputs: Sequence[Any] | None = None,
        weights: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Vector-Jacobian product of the node w.r.t. its inputs, at the given (or forward) inputs/weights."""
        if inputs is None and self._true_vjp is not None:
            got = self._true_vjp(self._weights_with(weights), list(grad_outputs))
            return [tf.zeros_like(x) if g is None else g for g, x in zip(got, self.inputs)]
        # tf.identity: one tensor given twice (self-attention, ``mha(x, x)``) must get one gradient per use,
        # not the sum of both for each (which the engine would then add up again)
        xs = [tf.identity(tf.convert_to_tensor(x)) for x in (self.inputs if inputs is None else inputs)]
        ws = self._weights_with(weights)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            for x in xs:
                if x.dtype.is_floating:  # TF ignores (and warns about) watching token ids or positions
                    tape.watch(x)
            ys = self._forward(xs, ws)
        return list(tape.gradient(ys, xs, output_gradients=list(grad_outputs), unconnected_gradients="zero"))

    def at_forward(self, x: Any) -> bool:
        """Whether ``x`` is the node's one forward input (then ``vjp`` at it needs no ``inputs``)."""
        return len(self.inputs) == 1 and x is self.inputs[0] and len(self.outputs) == 1

    def has_own(self, weights: dict[str, Any] | None) -> bool:
        """Whether ``weights`` replace none of the node's weights (the very tensors, or nothing)."""
        own = self.weights
        return all(name in own and w is own[name] for name, w in (weights or {}).items())

    @property
    def vjp_runs_forward(self) -> bool:
        """Whether ``vjp`` runs the node again (a tape over its call) rather than its VJP alone."""
        return self._true_vjp is None

    def weight_vjp(self, grad_outputs: Sequence[Any]) -> list[Any]:
        """True VJP w.r.t. the weights (what ``weight_gradients`` defaults to)."""
        ws = [tf.convert_to_tensor(w) for w in self.weight_list]
        if not ws:
            return []
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            for w in ws:
                if w.dtype.is_floating:  # an integer weight (a counter, positions) has no gradient: TF warns
                    tape.watch(w)
            ys = self._forward(self.inputs, ws)
        return list(tape.gradient(ys, ws, output_gradients=list(grad_outputs)))


def rule_call(call: Any, rule: Any, spec: Any, source: Any = None) -> list[Any]:
    """The outputs of ``call``'s node (a ``node_call.NodeCall``) under ``rule``. ``source``: what a value rule reads
    from another input (the node's value there, or their mean), None when it reads none."""
    xs, weights, names = call.xs, call.weights(), call.weight_names
    n_x = len(xs)

    def make_ctx(xs_: list, ys: list, ws_: list) -> RuleContext:
        return RuleContext(spec, call.step.operation, xs_, ys, ws_, names, call.forward, call.pack, source=source)

    if type(rule).patches_forward:  # a new value in the forward pass: plain autodiff through it
        ys = call.forward(list(xs), list(weights))
        return list(guarded(rule, spec, "forward_override", make_ctx(list(xs), ys, list(weights))))

    @tf.custom_gradient
    def wrapped(*flat: Any) -> Any:
        xs_, ws_ = list(flat[:n_x]), list(flat[n_x:])
        ys = call.forward(xs_, ws_)
        shown = ys
        if type(rule).overrides_forward():
            shown = list(guarded(rule, spec, "forward_override", make_ctx(xs_, ys, ws_)) or ys)

        def grad_fn(*dys: Any) -> list[Any]:
            dys = [tf.zeros_like(y) if d is None else d for d, y in zip(dys, shown)]
            ctx = make_ctx(xs_, ys, ws_)
            gx = checked_grads(rule, spec, guarded(rule, spec, "backward", ctx, dys), xs_)
            gw: Any = None
            if ws_:
                gw = guarded(rule, spec, "weight_gradients", ctx, dys)
                gw = list(gw) if gw is not None else ctx.weight_vjp(dys)
            return gx + (gw or [])

        return (shown[0] if len(shown) == 1 else list(shown)), grad_fn

    out = wrapped(*xs, *weights)
    return [out] if tf.is_tensor(out) else list(out)


def guarded(rule: Any, spec: Any, method: str, *args: Any) -> Any:
    """``rule.method(*args)``, any failure but a ``GradscopeError`` one ``RuleError`` naming the rule and node."""
    try:
        return getattr(rule, method)(*args)
    except GradscopeError:
        raise
    except (Exception, SystemExit) as exc:  # sys.exit() in a rule must not end the app
        raise RuleError(
            f"Rule {rule.name!r} failed in {method}() on node {spec.id!r} ({spec.op_type}): {type(exc).__name__}: {exc}"
        ) from exc


def checked_grads(rule: Any, spec: Any, gx: Any, xs: list) -> list[Any]:
    """A rule's gradients checked against the node's inputs: one each (None allowed), shapes that fit, a float
    dtype (cast to the input's)."""
    if tf.is_tensor(gx):
        gx = [gx]
    gx = list(gx) if gx is not None else []
    if len(gx) != len(xs):
        raise RuleError(
            f"Rule {rule.name!r} on node {spec.id!r} returned {len(gx)} gradient(s); the node has "
            f"{len(xs)} input tensor(s)."
        )
    checked = []
    for i, (g, x) in enumerate(zip(gx, xs)):
        if g is None or not x.dtype.is_floating:
            checked.append(None)
            continue
        g = tf.convert_to_tensor(g)
        if not g.shape.is_compatible_with(x.shape):
            raise RuleError(
                f"Rule {rule.name!r} on node {spec.id!r}: gradient {i} has shape {g.shape}, input has shape {x.shape}."
            )
        if g.dtype != x.dtype:
            if not g.dtype.is_floating:
                raise RuleError(
                    f"Rule {rule.name!r} on node {spec.id!r}: gradient {i} has dtype {g.dtype.name}, "
                    f"input is {x.dtype.name}."
                )
            g = tf.cast(g, x.dtype)
        checked.append(g)
    return checked
