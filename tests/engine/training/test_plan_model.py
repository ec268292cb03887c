"""Training with a plan: weight updates follow the plan's rules; the user's model is shared, not mutated."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradscope.backend import keras, tf
from gradscope.core.errors import PlanError
from gradscope.engine.diagnostics.paths import diagnose_model
from gradscope.engine.training.plan_model import PlanModel, plan_model
from gradscope.rules.plan import Plan
from tests.engine.diagnostics.test_paths import hypernet_examples

LR = 0.1
SIGMOID_BACKWARD = Plan().with_entry("activation:relu", "backward_as", {"activation": "sigmoid"})


def mlp() -> keras.Model:
    keras.utils.set_random_seed(21)
    inp = keras.Input((4,), name="x")
    h = keras.layers.Dense(6, activation="relu", name="h1")(inp)
    h = keras.layers.Dense(5, name="h2")(h)
    h = keras.layers.ReLU(name="relu2")(h)
    return keras.Model(inp, keras.layers.Dense(2, name="out")(h), name="mlp")


def batch():
    rng = np.random.default_rng(4)
    return rng.normal(size=(8, 4)).astype("float32"), rng.normal(size=(8, 2)).astype("float32")


def mlp_backward(weights, x, y, derivative) -> dict[str, np.ndarray]:
    """The MSE backward pass of ``mlp`` in float64, with ``derivative(z)`` in place of relu'(z): the input, the
    activations, and the signal dL/d(output) at each node (``h1:pre``, ``h1``, ``h2``, ``relu2``, ``out``)."""
    w1, b1, w2, b2, w3, b3 = [np.asarray(w, np.float64) for w in weights]
    x = x.astype(np.float64)
    z1 = x @ w1 + b1
    a1 = np.maximum(z1, 0)
    z2 = a1 @ w2 + b2
    a2 = np.maximum(z2, 0)
    p = a2 @ w3 + b3
    dp = 2 * (p - y) / p.size  # keras mse: mean over all elements (batch mean of the per-sample mean)
    da2 = dp @ w3.T
    dz2 = da2 * derivative(z2)
    da1 = dz2 @ w2.T
    dz1 = da1 * derivative(z1)
    return {"x": x, "a1": a1, "a2": a2, "h1:pre": dz1, "h1": da1, "h2": dz2, "relu2": da2, "out": dp}


def numpy_sgd_delta(weights, x, y, derivative):
    """-LR * dL/dW of the MSE for ``mlp`` in float64, with ``derivative(z)`` in place of relu'(z)."""
    b = mlp_backward(weights, x, y, derivative)
    dz1, dz2, dp = b["h1:pre"], b["h2"], b["out"]
    grads = [b["x"].T @ dz1, dz1.sum(0), b["a1"].T @ dz2, dz2.sum(0), b["a2"].T @ dp, dp.sum(0)]
    return [-LR * g for g in grads]


def relu_prime(z):
    return (z > 0).astype(np.float64)


def sigmoid_prime(z):
    s = 1 / (1 + np.exp(-z))
    return s * (1 - s)


def one_fit_step(model: keras.Model, x, y) -> list[np.ndarray]:
    before = [w.copy() for w in model.get_weights()]
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    return [np.asarray(a, np.float64) - b for a, b in zip(model.get_weights(), before)]


def test_sgd_step_follows_the_substituted_derivative():
    x, y = batch()
    plain = mlp()
    planned_base = mlp()
    weights = plain.get_weights()
    planned = plan_model(planned_base, SIGMOID_BACKWARD)
    assert planned.applied == {"h1": "backward_as", "relu2": "backward_as"}
    plain_delta = one_fit_step(plain, x, y)
    plan_delta = one_fit_step(planned, x, y)
    expected_plain = numpy_sgd_delta(weights, x, y, relu_prime)
    expected_plan = numpy_sgd_delta(weights, x, y, sigmoid_prime)
    for got, want in zip(plain_delta, expected_plain):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-7)
    for got, want in zip(plan_delta, expected_plan):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-7)
    # the output layer sees the same upstream signal either way; the layers below the ReLUs do not
    np.testing.assert_allclose(plan_delta[4], plain_delta[4], rtol=1e-5, atol=1e-8)
    assert not np.allclose(plan_delta[0], plain_delta[0], rtol=1e-2)
    # the planned update went into the user's model's own variables
    np.testing.assert_allclose(planned_base.get_weights()[0], weights[0] + plan_delta[0], rtol=1e-6, atol=1e-7)


def test_forward_is_the_model_and_the_model_is_not_mutated():
    model = mlp()
    config = json.dumps(model.get_config(), sort_keys=True, default=str)
    layers = list(model.layers)
    activations = [getattr(layer, "activation", None) for layer in layers]
    planned = plan_model(model, SIGMOID_BACKWARD)
    x, y = batch()
    np.testing.assert_allclose(planned(x), model(x), rtol=1e-6)
    one_fit_step(planned, x, y)
    assert json.dumps(model.get_config(), sort_keys=True, default=str) == config
    assert list(model.layers) == layers
    assert [getattr(layer, "activation", None) for layer in layers] == activations
    # shared, not copied: the wrapper trains exactly the model's variables
    assert len(planned.trainable_variables) == len(model.trainable_variables)
    assert all(a is b for a, b in zip(planned.trainable_variables, model.trainable_variables))
    np.testing.assert_allclose(planned(x), model(x), rtol=1e-6)
    with pytest.raises(NotImplementedError, match="save the original model"):
        planned.get_config()


def test_gradient_tape_loop_and_training_flag():
    keras.utils.set_random_seed(5)
    inp = keras.Input((6,))
    h = keras.layers.Dense(6, activation="relu", name="h")(inp)
    h = keras.layers.Dropout(0.5, name="drop")(h)
    model = keras.Model(inp, keras.layers.Dense(1, name="out")(h))
    planned = plan_model(model, Plan().with_entry("h", "scale", {"factor": 0.0}))
    x = np.ones((16, 6), "float32")
    np.testing.assert_allclose(planned(x, training=False), model(x, training=False), rtol=1e-6)
    assert not np.allclose(planned(x, training=True), planned(x, training=False))  # dropout is on in training
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(planned(x, training=True) ** 2)
    grads = dict(zip([v.path for v in planned.trainable_variables], tape.gradient(loss, planned.trainable_variables)))
    # the scale-0 rule on h's activation stops everything below it, and only that
    assert np.all(grads["h/kernel"].numpy() == 0) and np.any(grads["out/kernel"].numpy() != 0)


def test_plan_model_checks_its_arguments():
    with pytest.raises(PlanError, match="keras.Model"):
        plan_model("model.keras", Plan())
    with pytest.raises(PlanError, match="Plan"):
        plan_model(mlp(), {"entries": []})
    planned = plan_model(mlp(), Plan())
    assert isinstance(planned, PlanModel) and "no rule" in planned.warnings[0]
    with pytest.raises(PlanError, match="takes 1 input"):
        planned([np.ones((1, 4)), np.ones((1, 4))])


def _fit_steps(model, inputs, labels, epochs):
    return model.fit(inputs, labels, batch_size=16, epochs=epochs, shuffle=False, verbose=0).history["loss"]


def test_hypernet_with_tensor_weights_trains():
    be = hypernet_examples()
    model = be.build("tensor")
    inputs, labels = be.make_data(64)
    hyper = [v for v in model.trainable_variables if v.path.startswith("hyper_")]
    before = [v.numpy().copy() for v in hyper]
    losses = _fit_steps(model, inputs, labels, epochs=4)
    assert losses[-1] < losses[0] * 0.9
    assert all(not np.allclose(b, v.numpy()) for b, v in zip(before, hyper))


def test_hypernet_with_assign_does_not_train_its_hypernetwork():
    be = hypernet_examples()
    model = be.build("assign")
    report = diagnose_model(model)
    blocked = {v.path for v in report.by_status("blocked")}
    inputs, labels = be.make_data(64)
    hyper = {v.path: v.numpy().copy() for v in model.trainable_variables if v.path.startswith("hyper_")}
    assert blocked == set(hyper)
    with pytest.warns(UserWarning, match="Gradients do not exist"):
        _fit_steps(model, inputs, labels, epochs=1)
    assert all(np.array_equal(hyper[v.path], v.numpy()) for v in model.trainable_variables if v.path in hyper)
