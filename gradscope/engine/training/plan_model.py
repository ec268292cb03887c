"""Train with a plan: a Keras model whose forward pass is the user's model and whose gradients follow the plan.

    planned = plan_model(model, Plan().with_entry("activation:relu", "backward_as", {"activation": "sigmoid"}))
    planned.compile(optimizer="sgd", loss="mse")
    planned.fit(x, y)          # trains ``model``'s own variables with ReLU forward, sigmoid' backward

The wrapper runs the engine's node loop (``Engine._run``) with the plan's rules wrapped around their nodes, so
what ``model.fit`` differentiates is exactly what the debugger shows. Weight gradients of a wrapped node come
from the rule's ``weight_gradients`` (None: the true VJP of the node's weights for the rule's upstream signal).

Sharing, not copying: the wrapper holds the user's model as a sub-model and uses *its* variables, so training
the wrapper trains the model (that is the point) and the model stays usable on its own; nothing else of the
model changes (no layer attribute is modified, no activation replaced; fused activations are switched off only
for the duration of one call, always restored). Save the original ``model``, not the wrapper.

Limits: a node wrapped by a rule runs its layer in a stateless scope, so a BatchNormalization node *with a rule*
does not update its moving statistics in training (nodes without rules behave exactly as in ``model.fit``).
Rules with ``forward_override`` (global substitution) change what the layers above compute, so the model's
outputs and the loss are computed from the substituted values (``PlanModel.warnings`` says so).
"""

from __future__ import annotations

import contextlib
from typing import Any

from gradscope.backend import keras
from gradscope.core.errors import PlanError
from gradscope.rules.plan import Plan


class _Frozen:
    """Holds Python objects out of Keras' attribute tracking (an Engine is not a layer or a variable)."""

    def __init__(self, **items: Any) -> None:
        self.__dict__.update(items)


class PlanModel(keras.Model):
    """``model``'s forward pass with ``plan``'s rules in the backward pass; shares ``model``'s variables."""

    def __init__(self, model: Any, plan: Plan, *, name: str | None = None, **kwargs: Any) -> None:
        from gradscope.engine.backward.runner import Engine

        super().__init__(name=name or f"{model.name}_planned", **kwargs)
        self.inner = model  # tracked: trainable_variables are the inner model's own
        engine = Engine(model, strip_softmax=False)  # the real outputs: training sees the model as it is
        resolution = plan.resolve(engine.graph)
        rules = resolution.rule_by_node
        warnings = []
        if not rules:
            warnings.append("the plan assigns no rule to any node: this trains like the plain model")
        overriding = sorted(nid for nid, r in rules.items() if type(r).changes_values())
        if overriding:
            warnings.append(
                f"rules that substitute values on {', '.join(overriding)}: the outputs and the loss are computed "
                "from the substituted values"
            )
        self._gs = _Frozen(engine=engine, plan=plan, rules=rules, resolution=resolution, warnings=warnings)

    @property
    def plan(self) -> Plan:
        return self._gs.plan

    @property
    def engine(self) -> Any:
        return self._gs.engine

    @property
    def applied(self) -> dict[str, str]:
        """Node id -> rule name for every node whose backward pass the plan changes."""
        return {nid: r.entry.rule for nid, r in self._gs.resolution.rules.items()}

    @property
    def warnings(self) -> list[str]:
        return list(self._gs.warnings)

    def call(self, inputs: Any, training: bool = False) -> Any:
        engine = self._gs.engine
        values, _ = engine._run(inputs_in_graph_order(engine.graph, inputs), self._gs.rules, training=bool(training))
        outs = [values[k] for k in engine.exec.output_keys]
        return outs[0] if len(outs) == 1 else outs

    def get_config(self) -> dict:
        raise NotImplementedError(
            "A PlanModel is a training wrapper: save the original model (its variables are the ones trained) "
            "and the plan (plan.save(path))."
        )


def inputs_in_graph_order(graph: Any, inputs: Any) -> list[Any]:
    """A model's inputs as the engine's node loop takes them: a dict by input name, else in the model's order."""
    if isinstance(inputs, dict):
        names = [graph.node(i).name for i in graph.input_ids]
        missing = [n for n in names if n not in inputs]
        if missing:
            raise PlanError(f"Inputs are missing {missing}; the model takes {names}.")
        return [keras.ops.convert_to_tensor(inputs[n]) for n in names]
    xs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    if len(xs) != len(graph.input_ids):
        raise PlanError(f"The model takes {len(graph.input_ids)} input(s); got {len(xs)}.")
    return [keras.ops.convert_to_tensor(x) for x in xs]


def plan_model(model: Any, plan: Plan | Any) -> PlanModel:
    """A Keras model to ``compile`` / ``fit`` whose gradients follow ``plan`` (a ``Plan`` or a ``Method``).

    The user's ``model`` is not copied: training updates its variables (see the module docstring). A compiled
    ``model`` hands on its compile settings (loss, metrics, a fresh optimizer of the same configuration), so
    ``plan_model(model, plan).fit(...)`` runs as ``model.fit(...)`` would; ``compile`` again to change them.
    """
    if not isinstance(model, keras.Model):
        raise PlanError(f"plan_model needs a keras.Model, got {type(model).__name__}.")
    plan = getattr(plan, "plan", plan)  # a method preset carries its plan
    if not isinstance(plan, Plan):
        raise PlanError(f"Expected a Plan (or a method preset), got {type(plan).__name__}.")
    planned = PlanModel(model, plan)
    if getattr(model, "compiled", False):
        config = model.get_compile_config()
        if config:  # (a custom loss that cannot be rebuilt from its config: compile the planned model yourself)
            with contextlib.suppress(Exception):
                planned.compile_from_config(config)
    return planned
