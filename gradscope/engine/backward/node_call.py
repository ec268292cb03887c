"""One node's call as a function of its tensors and weights: what rules, kernels and the runner all wrap.

A node's Keras call takes a structure of arguments (tensors, flags, masks). ``NodeCall`` splits it into the
float tensors (``xs``, in ``Step.in_keys`` order), the layer's variables and everything else (kept as is),
and rebuilds the call as ``forward(xs, weights)``: weights are mapped in with a ``StatelessScope`` so no
variable is read inside a wrapped or traced function (DESIGN.md pitfalls).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gradscope.backend import keras, tf
from gradscope.core.names import weight_names
from gradscope.engine.backward.keras_graph import Step, linear_activation
from gradscope.engine.backward.lowered import Lowered, lower


def call_arguments(step: Step, values: dict, training: bool = False) -> tuple[tuple, dict]:
    """The ``(args, kwargs)`` a step's operation is called with, filled from ``values``."""
    op = step.operation
    if step.kind == "activation":
        return (values[step.in_keys[0]],), {}
    if step.kind == "model":
        ins = [values[k] for k in step.in_keys]
        return (ins if len(ins) > 1 else ins[0],), {}
    args, kwargs = step.arguments.fill_in(values)
    # Like Keras' Functional: training=True at run time overrides the flag recorded when building.
    if getattr(op, "_call_has_training_arg", False) and (training or "training" not in kwargs):
        kwargs = {**kwargs, "training": training}
    return args, kwargs


def node_variables(step: Step) -> list[Any]:
    return [] if step.kind == "activation" else list(getattr(step.operation, "variables", []) or [])


@dataclass
class NodeCall:
    """A step's call split into tensors, weights and the rest; ``forward(xs, ws)`` re-runs it."""

    step: Step
    structure: tuple
    leaves: list[Any]
    positions: list[int]  # where the tensors sit among the flattened leaves
    variables: list[Any]
    lowered: Lowered | None = None  # the call as raw TF ops (``engine.backward.lowered``), when it is a plain case

    @classmethod
    def of(cls, step: Step, args: tuple, kwargs: dict) -> NodeCall:
        structure = (args, kwargs)
        leaves = keras.tree.flatten(structure)
        positions = [i for i, leaf in enumerate(leaves) if tf.is_tensor(leaf)]
        return cls(step, structure, leaves, positions, node_variables(step), lower(step, args, kwargs))

    def template(self) -> NodeCall:
        """The same call without its tensors (what a cached kernel may keep alive)."""
        holes = set(self.positions)
        leaves = [0 if i in holes else leaf for i, leaf in enumerate(self.leaves)]  # 0: a leaf to every tree
        structure = keras.tree.pack_sequence_as(self.structure, leaves)
        return NodeCall(self.step, structure, leaves, self.positions, self.variables, self.lowered)

    @property
    def xs(self) -> list[Any]:
        return [self.leaves[i] for i in self.positions]

    @property
    def weight_names(self) -> list[str]:
        return weight_names(self.step.operation, self.variables)

    def weights(self) -> list[Any]:
        return [v.value for v in self.variables]

    def pack(self, xs: Sequence[Any]) -> tuple[tuple, dict]:
        """The call's ``(args, kwargs)`` with ``xs`` in place of its tensors."""
        leaves = list(self.leaves)
        for i, x in zip(self.positions, xs):
            leaves[i] = x
        return keras.tree.pack_sequence_as(self.structure, leaves)

    def forward(self, xs: Sequence[Any], ws: Sequence[Any], variables: Sequence[Any] | None = None) -> list[Any]:
        """The node's outputs at inputs ``xs`` and weights ``ws`` (``variables``: whose values ``ws`` replace;
        another layer's variables when a kernel traced on one node runs for a node of the same config). A weight
        given as None is zero (a rule dropping a bias): a lowered layer skips it, a Keras call gets zeros."""
        if self.lowered is not None:  # the same ops as the Keras call, without its overhead
            return self.lowered.forward(xs, ws)
        step, op = self.step, self.step.operation
        if step.kind == "activation":
            return [op.activation(xs[0])]
        a, k = self.pack(xs)
        variables = self.variables if variables is None else list(variables)
        ws = [tf.zeros(v.shape, v.dtype) if w is None else w for v, w in zip(variables, ws)]
        with contextlib.ExitStack() as stack:
            if step.linear_call:
                stack.enter_context(linear_activation(op))
            if variables:
                stack.enter_context(keras.StatelessScope(state_mapping=list(zip(variables, ws))))
            return keras.tree.flatten(op(*a, **k))


def plain_call(step: Step, args: tuple, kwargs: dict) -> list[Any]:
    """Run a step as the model would (no wrapping)."""
    op = step.operation
    if step.kind == "activation":
        return [op.activation(args[0])]
    with linear_activation(op) if step.linear_call else contextlib.nullcontext():
        return keras.tree.flatten(op(*args, **kwargs))
