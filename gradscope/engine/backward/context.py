"""What a rule sees of its node during the backward pass."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gradscope.backend import keras, tf
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
