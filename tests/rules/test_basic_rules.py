"""Basic rules against an independent NumPy forward/backward of the `concat` fixture."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.core.errors import PlanError, RuleError
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.base import Rule, register_rule
from gradscope.rules.plan import Plan
from tests.engine.fixtures import FIXTURES, sample_input


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def numpy_backward(model, x, k, *, a_rule=None, b_rule=None):
    """out = Dense([tanh(x Wa + ba), 2 * relu(x Wb + bb)]); d out_k / dx with per-node overrides.

    ``a_rule(g, za)`` returns the signal leaving node ``a`` given the signal arriving at it;
    ``b_rule(g, zb)`` the same for ``b``. None = the true derivative.
    """
    wa, ba = model.get_layer("a").get_weights()
    wb, bb = model.get_layer("b").get_weights()
    wo, _ = model.get_layer("out").get_weights()
    x = x.astype(np.float64)
    za, zb = x @ wa + ba, x @ wb + bb
    g_c = np.broadcast_to(wo[:, k], (x.shape[0], wo.shape[0]))
    g_a, g_b = g_c[:, :6], 2.0 * g_c[:, 6:]
    d_za = a_rule(g_a, za) if a_rule else g_a * (1 - np.tanh(za) ** 2)
    d_zb = b_rule(g_b, zb) if b_rule else g_b * (zb > 0)
    return d_za @ wa.T + d_zb @ wb.T


@pytest.fixture(scope="module")
def concat():
    model = FIXTURES["concat"]()
    return model, Engine(model), sample_input(model, 4, seed=11)


CASES = {
    "plain": (Plan(), {}),
    "backward_as_sigmoid": (
        Plan().with_entry("b", "backward_as", {"activation": "sigmoid"}),
        {"b_rule": lambda g, z: g * sigmoid(z) * (1 - sigmoid(z))},
    ),
    "backward_as_by_activation_selector": (
        Plan().with_entry("activation:relu", "backward_as", {"activation": "softplus"}),
        {"b_rule": lambda g, z: g * sigmoid(z)},  # softplus' = sigmoid
    ),
    "zero": (Plan().with_entry("b", "zero"), {"b_rule": lambda g, z: 0 * g}),
    "scale": (
        Plan().with_entry("a", "scale", {"factor": 3.0}),
        {"a_rule": lambda g, z: 3.0 * g * (1 - np.tanh(z) ** 2)},
    ),
    "clip": (
        Plan().with_entry("a", "clip", {"low": -0.05, "high": 0.02}),
        {"a_rule": lambda g, z: np.clip(g * (1 - np.tanh(z) ** 2), -0.05, 0.02)},
    ),
    "sign": (Plan().with_entry("a", "sign"), {"a_rule": lambda g, z: np.sign(g * (1 - np.tanh(z) ** 2))}),
    "later_entry_wins": (
        Plan()
        .with_entry("*", "zero")
        .with_entry("type:Dense,InputLayer,Concatenate,Multiply", "identity")
        .with_entry("a", "identity"),
        {"b_rule": lambda g, z: 0 * g},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_basic_rule_matches_numpy(concat, name):
    model, engine, x = concat
    plan, overrides = CASES[name]
    result = engine.backward(x, Target(index=2), plan)
    expected = numpy_backward(model, x, 2, **overrides)
    np.testing.assert_allclose(result.input_grad, expected, rtol=2e-5, atol=1e-6)


def test_rule_on_node_it_cannot_handle_is_a_clear_error(concat):
    _, engine, x = concat
    with pytest.raises(PlanError, match="cannot run on node 'cat'"):
        engine.backward(x, plan=Plan().with_entry("cat", "backward_as"))


def test_unknown_node_rule_and_params_are_clear_errors(concat):
    _, engine, x = concat
    from gradscope.core.errors import GraphError

    with pytest.raises(GraphError, match="No node 'nope'"):
        engine.backward(x, plan=Plan().with_entry("nope", "zero"))
    with pytest.raises(PlanError, match="Unknown rule 'guided'"):
        engine.backward(x, plan=Plan().with_entry("a", "guided"))
    with pytest.raises(PlanError, match="no parameter"):
        engine.backward(x, plan=Plan().with_entry("a", "scale", {"factr": 2}))
    with pytest.raises(PlanError, match="must not exceed"):
        engine.backward(x, plan=Plan().with_entry("a", "clip", {"low": 1, "high": 0}))


def test_broad_selector_skips_and_reports(concat):
    _, engine, x = concat
    result = engine.backward(x, plan=Plan().with_entry("*", "backward_as").with_entry("type:Conv2D", "zero"))
    assert set(result.rules) == {"a", "b"}
    assert "cat" in result.skipped["*"]
    assert result.unmatched == ["type:Conv2D"]


@register_rule("_test_raises")
class _Raises(Rule):
    def backward(self, ctx, grad_outputs):
        raise ZeroDivisionError("boom")


@register_rule("_test_wrong_count")
class _WrongCount(Rule):
    def backward(self, ctx, grad_outputs):
        return [grad_outputs[0], grad_outputs[0]]


@register_rule("_test_wrong_shape")
class _WrongShape(Rule):
    def backward(self, ctx, grad_outputs):
        return [ctx.tf.zeros([3, 3])]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("_test_raises", "ZeroDivisionError: boom"),
        ("_test_wrong_count", "returned 2 gradient"),
        ("_test_wrong_shape", "has shape"),
    ],
)
def test_failing_rules_raise_rule_error_and_leave_model_unchanged(rule, message):
    model = FIXTURES["chain"]()
    before = [w.copy() for w in model.get_weights()]
    activations = {layer.name: getattr(layer, "activation", None) for layer in model.layers}
    engine = Engine(model)
    x = sample_input(model, 2)
    with pytest.raises(RuleError, match=message):
        engine.backward(x, plan=Plan().with_entry("conv1", rule))
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert {layer.name: getattr(layer, "activation", None) for layer in model.layers} == activations
    # The engine keeps working after a failed plan.
    assert np.isfinite(engine.backward(x).input_grad).all()


def test_model_unchanged_after_runs():
    model = FIXTURES["chain"]()
    before = [w.copy() for w in model.get_weights()]
    engine = Engine(model)
    x = sample_input(model, 2)
    ref = model(x).numpy()
    engine.backward(x, plan=Plan().with_entry("*", "true_gradient"), weight_grads=True)
    engine.backward(x, plan=Plan().with_entry("activation:relu", "backward_as"))
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(model(x).numpy(), ref)
    assert model.get_layer("conv1").activation.__name__ == "relu"


def test_weight_gradients_through_wrapped_nodes_equal_tape():
    model = FIXTURES["chain"]()
    engine = Engine(model)
    x = sample_input(model, 2)
    plain = engine.backward(x, Target(index=1), weight_grads=True).meta["weight_grads"]
    wrapped = engine.backward(x, Target(index=1), Plan().with_entry("*", "true_gradient"), weight_grads=True)
    assert set(plain) == {v.path for v in model.trainable_variables}
    for path, g in plain.items():
        np.testing.assert_allclose(wrapped.meta["weight_grads"][path], g, rtol=1e-5, atol=1e-6)


def test_plan_change_back_reuses_trace(concat):
    _, engine, x = concat
    p1, p2 = Plan().with_entry("a", "zero"), Plan().with_entry("a", "sign")
    engine.backward(x, plan=p1, mode="compiled")
    engine.backward(x, plan=p2, mode="compiled")
    again = engine.backward(x, Target(index=3), plan=Plan.from_json(p1.to_json()), mode="compiled")
    assert again.meta["retraced"] is False
