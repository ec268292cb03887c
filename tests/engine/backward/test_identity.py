"""With every node on the identity rule the engine's gradient must equal a plain tf.GradientTape gradient."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import tf
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.plan import Plan
from tests.engine.fixtures import FIXTURES, logits_model, sample_input


def tape_gradient(model, x: np.ndarray, class_index: int) -> np.ndarray:
    xt = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        out = logits_model(model)(xt, training=False)
        score = tf.reduce_sum(out[:, class_index])
    return tape.gradient(score, xt).numpy()


@pytest.fixture(scope="module", params=sorted(FIXTURES))
def case(request):
    model = FIXTURES[request.param]()
    return model, Engine(model)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize(
    "plan",
    [Plan(), Plan().with_entry("*", "identity"), Plan().with_entry("*", "true_gradient")],
    ids=["no-plan", "identity", "wrapped-true-gradient"],
)
@pytest.mark.parametrize("mode", ["live", "compiled"])
def test_identity_plan_equals_tape_gradient(case, batch, plan, mode):
    model, engine = case
    x = sample_input(model, batch, seed=batch)
    expected = tape_gradient(model, x, class_index=1)
    result = engine.backward(x, Target(index=1), plan, mode=mode)
    assert result.meta["mode"] == mode
    assert np.abs(expected).max() > 0  # the fixture really propagates a gradient
    np.testing.assert_allclose(result.input_grad, expected, rtol=1e-5, atol=1e-6)


def test_wrapped_plan_really_wraps_every_node(case):
    model, engine = case
    result = engine.backward(sample_input(model, 2), Target(index=0), Plan().with_entry("*", "true_gradient"))
    assert set(result.rules) == set(engine.stat_nodes)


def test_node_loop_forward_equals_model(case):
    model, engine = case
    x = sample_input(model, 3, seed=7)
    result = engine.backward(x, Target(index=0))
    np.testing.assert_allclose(result.predictions, model(x, training=False).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(result.logits, logits_model(model)(x, training=False).numpy(), rtol=1e-5, atol=1e-5)


def test_node_signals_equal_tape_gradients_at_intermediate_tensors():
    """The signal captured at a node's output is d(target)/d(output), checked against a split model."""
    model = FIXTURES["residual"]()
    engine = Engine(model)
    x = sample_input(model, 2)
    result = engine.backward(x, Target(index=2), capture=["stem", "add"])
    # Independent: feed the 'add' output into the rest of the model and differentiate there.
    add_out = model.get_layer("add").output
    import keras

    upper = keras.Model(add_out, model.output)
    lower = keras.Model(model.input, add_out)
    a = tf.convert_to_tensor(lower(x))
    with tf.GradientTape() as tape:
        tape.watch(a)
        score = tf.reduce_sum(upper(a)[:, 2])
    np.testing.assert_allclose(result.node_grads["add"], tape.gradient(score, a).numpy(), rtol=1e-5, atol=1e-6)
    assert result.node_grads["stem"].shape == (2, 8, 8, 4)


def test_top1_target_picks_argmax_per_sample():
    model = FIXTURES["concat"]()
    engine = Engine(model)
    x = sample_input(model, 5, seed=3)
    result = engine.backward(x)
    np.testing.assert_array_equal(result.target_indices, model(x).numpy().argmax(-1))
    expected = np.stack([tape_gradient(model, x[i : i + 1], int(result.target_indices[i]))[0] for i in range(5)])
    np.testing.assert_allclose(result.input_grad, expected, rtol=1e-5, atol=1e-6)


def test_neuron_and_channel_targets():
    model = FIXTURES["residual"]()
    engine = Engine(model)
    x = sample_input(model, 2)
    import keras

    branch = keras.Model(model.input, model.get_layer("branch_b").output)
    xt = tf.convert_to_tensor(x)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(xt)
        out = branch(xt)
        neuron = tf.reduce_sum(out[:, 3, 4, 1])
        channel = tf.reduce_sum(out[..., 2])
    r1 = engine.backward(x, Target(kind="neuron", node="branch_b", neuron=(3, 4, 1)))
    r2 = engine.backward(x, Target(kind="channel", node="branch_b", channel=2))
    np.testing.assert_allclose(r1.input_grad, tape.gradient(neuron, xt).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r2.input_grad, tape.gradient(channel, xt).numpy(), rtol=1e-5, atol=1e-6)
