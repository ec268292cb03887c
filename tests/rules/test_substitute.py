"""Activation substitution: local (backward_as), global (substitute_activation) and straight-through.

References: a float64 NumPy net whose backward is itself checked by central finite differences, and, for the
global semantics, the plain tape gradient of a *clone* of the model with the activation really replaced.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import keras, tf
from gradscope.core.errors import PlanError
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.plan import Plan

K = 2  # the class explained


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


ACTS = {
    "relu": (lambda z: np.maximum(z, 0), lambda z: (z > 0).astype(float)),
    "sigmoid": (sigmoid, lambda z: sigmoid(z) * (1 - sigmoid(z))),
    "softplus": (lambda z: np.logaddexp(0, z), sigmoid),
    "tanh": (np.tanh, lambda z: 1 - np.tanh(z) ** 2),
    "identity": (lambda z: z, np.ones_like),
    "round": (np.round, np.zeros_like),
}


def mlp(first: str = "relu") -> keras.Model:
    """x -> Dense(8, first) -> Dense(6, tanh) -> Dense(4) with non-zero biases; ``first`` may be 'round'."""
    keras.utils.set_random_seed(31)
    inp = keras.Input((5,), name="x")
    if first == "round":
        h = keras.ops.round(keras.layers.Dense(8, name="h1")(inp))
    else:
        h = keras.layers.Dense(8, activation=first, name="h1")(inp)
    h = keras.layers.Dense(6, activation="tanh", name="h2")(h)
    model = keras.Model(inp, keras.layers.Dense(4, name="out")(h), name=f"mlp_{first}")
    rng = np.random.default_rng(31)
    for name in ("h1", "h2", "out"):
        k, b = model.get_layer(name).get_weights()
        model.get_layer(name).set_weights([2.0 * k, rng.normal(0, 0.3, b.shape).astype("float32")])
    return model


def numpy_mlp(model, x, first="relu", *, forward_first=None, backward_first=None):
    """Float64 logits and d logit_K / dx of ``mlp``; the first activation's forward/derivative can be swapped."""
    (w1, b1), (w2, b2), (w3, b3) = (model.get_layer(n).get_weights() for n in ("h1", "h2", "out"))
    f1, d1 = ACTS[forward_first or first]  # a swapped forward brings its own derivative...
    d1 = ACTS[backward_first][1] if backward_first else d1  # ...unless the backward is swapped too
    x = np.asarray(x, np.float64)
    z1 = x @ w1 + b1
    z2 = f1(z1) @ w2 + b2
    out = np.tanh(z2) @ w3 + b3
    g_z2 = np.broadcast_to(w3[:, K], z2.shape) * (1 - np.tanh(z2) ** 2)
    g_z1 = (g_z2 @ w2.T) * d1(z1)
    return out, g_z1 @ w1.T


def central_differences(f, x, eps=1e-6):
    """d sum(f(x)[:, K]) / dx in float64, one coordinate at a time."""
    x = np.asarray(x, np.float64)
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        g[idx] = (f(xp)[:, K].sum() - f(xm)[:, K].sum()) / (2 * eps)
    return g


@pytest.fixture(scope="module")
def relu_mlp():
    model = mlp("relu")
    x = np.random.default_rng(7).normal(size=(4, 5)).astype("float32")
    return model, Engine(model), x


def test_numpy_reference_backward_matches_finite_differences(relu_mlp):
    """The hand-built backward is right before its ReLU derivative is swapped (float64, central differences)."""
    model, _, x = relu_mlp
    for fwd in ("relu", "sigmoid", "softplus"):
        _, grad = numpy_mlp(model, x, forward_first=fwd)
        fd = central_differences(lambda v, fwd=fwd: numpy_mlp(model, v, forward_first=fwd)[0], x)
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-7)


def test_backward_as_is_local(relu_mlp):
    """backward_as(sigmoid): only h1's derivative is sigmoid'; h2 and out are differentiated at the real forward."""
    model, engine, x = relu_mlp
    plan = Plan().with_entry("h1", "backward_as", {"activation": "sigmoid"})
    result = engine.backward(x, Target(index=K), plan)
    _, expected = numpy_mlp(model, x, backward_first="sigmoid")
    np.testing.assert_allclose(result.input_grad, expected, rtol=1e-5, atol=1e-6)
    _, plain = numpy_mlp(model, x)
    _, global_ = numpy_mlp(model, x, forward_first="sigmoid")
    assert not np.allclose(expected, plain, atol=1e-3) and not np.allclose(expected, global_, atol=1e-3)


def _swap_activation_clone(model: keras.Model, old: str, new: str) -> keras.Model:
    """An independent copy with activation ``old`` replaced by ``new`` everywhere (fused, Activation, ReLU)."""

    def clone(layer):
        cfg = layer.get_config()
        if isinstance(layer, keras.layers.ReLU) and old == "relu":
            return keras.layers.Activation(new, name=layer.name)
        if cfg.get("activation") == old:
            cfg["activation"] = new
        if cfg.get("activation") == "softmax" and layer is model.layers[-1]:
            cfg["activation"] = "linear"  # the engine explains logits
        return layer.__class__.from_config(cfg)

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    return copy


def _tape_gradient(model: keras.Model, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    xt = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        out = model(xt, training=False)
        score = tf.reduce_sum(out[:, k])
    return tape.gradient(score, xt).numpy(), out.numpy()


def test_substitute_activation_is_global_on_mlp(relu_mlp):
    model, engine, x = relu_mlp
    plan = Plan().with_entry("h1", "substitute_activation", {"activation": "sigmoid"})
    result = engine.backward(x, Target(index=K), plan)
    copy = _swap_activation_clone(model, "relu", "sigmoid")
    expected, copy_out = _tape_gradient(copy, x, K)
    np.testing.assert_allclose(result.input_grad, expected, rtol=1e-5, atol=1e-6)
    # the clone's gradient is the true gradient of the sigmoid model (float64 finite differences)
    fd = central_differences(lambda v: numpy_mlp(model, v, forward_first="sigmoid")[0], x)
    np.testing.assert_allclose(expected, fd, rtol=1e-4, atol=1e-5)
    # the predictions shown are the real model's, not the substituted one's
    real = model(x, training=False).numpy()
    np.testing.assert_allclose(result.predictions, real, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(result.logits, real, rtol=1e-6, atol=1e-6)
    assert not np.allclose(real, copy_out, atol=1e-2)


def conv_net() -> keras.Model:
    keras.utils.set_random_seed(32)
    inp = keras.Input((9, 9, 2), name="image")
    x = keras.layers.Conv2D(4, 3, activation="relu", name="c1")(inp)
    x = keras.layers.ReLU(name="r")(keras.layers.Conv2D(5, 3, padding="same", name="c2")(x))
    x = keras.layers.MaxPooling2D(name="pool")(x)
    x = keras.layers.Flatten(name="flat")(x)
    x = keras.layers.Dense(6, activation="relu", name="h")(x)
    return keras.Model(inp, keras.layers.Dense(5, activation="softmax", name="probs")(x), name="conv_net")


def test_substitute_activation_everywhere_equals_clone_and_keeps_real_predictions():
    """Every ReLU (fused, split, layer) replaced by softplus for the backward pass; top-1 target."""
    model = conv_net()
    engine = Engine(model)
    x = np.random.default_rng(8).normal(size=(12, 9, 9, 2)).astype("float32")
    plan = Plan().with_entry("activation:relu", "substitute_activation", {"activation": "softplus"})
    result = engine.backward(x, Target(), plan)  # each sample's top-1 class
    assert set(result.rules) == {"c1", "r", "h"}
    real = model(x, training=False).numpy()
    np.testing.assert_allclose(result.predictions, real, rtol=1e-6, atol=1e-6)
    # top-1 means the class the user is shown: the real model's, not the substituted model's
    np.testing.assert_array_equal(result.target_indices, real.argmax(-1))
    copy = _swap_activation_clone(model, "relu", "softplus")
    copy_logits = copy(x, training=False).numpy()
    xt = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        picked = tf.gather(copy(xt, training=False), real.argmax(-1), axis=1, batch_dims=1)
        score = tf.reduce_sum(picked)
    expected = tape.gradient(score, xt).numpy()
    np.testing.assert_allclose(result.input_grad, expected, rtol=1e-5, atol=1e-6)
    # the test can tell: the substituted model's top-1 differs on some samples, and local != global here
    assert (copy_logits.argmax(-1) != real.argmax(-1)).any()
    local_plan = Plan().with_entry("activation:relu", "backward_as", {"activation": "softplus"})
    local = engine.backward(x, Target(), local_plan)
    assert not np.allclose(local.input_grad, expected, atol=1e-4)


def test_straight_through_identity_passes_gradient_unchanged(relu_mlp):
    model, engine, x = relu_mlp
    result = engine.backward(x, Target(index=K), Plan().with_entry("h1", "straight_through"))
    _, expected = numpy_mlp(model, x, backward_first="identity")
    np.testing.assert_allclose(result.input_grad, expected, rtol=1e-5, atol=1e-6)
    sig = engine.backward(x, Target(index=K), Plan().with_entry("h1", "straight_through", {"backward": "sigmoid"}))
    _, expected_sig = numpy_mlp(model, x, backward_first="sigmoid")
    np.testing.assert_allclose(sig.input_grad, expected_sig, rtol=1e-5, atol=1e-6)


def test_straight_through_makes_round_differentiable():
    """keras.ops.round has a zero/None gradient; the straight-through estimator passes g through it."""
    model = mlp("round")
    engine = Engine(model)
    x = np.random.default_rng(9).normal(size=(3, 5)).astype("float32")
    round_id = next(n.id for n in engine.graph.nodes if n.op_type == "Round")
    plain = engine.backward(x, Target(index=K))
    assert np.abs(plain.input_grad).max() == 0.0
    result = engine.backward(x, Target(index=K), Plan().with_entry(round_id, "straight_through"))
    out, expected = numpy_mlp(model, x, "round", backward_first="identity")
    assert np.abs(expected).max() > 1e-3
    np.testing.assert_allclose(result.input_grad, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.logits, out, rtol=1e-5, atol=1e-5)  # forward really rounds


def test_substitution_rules_refuse_nodes_they_cannot_run_on(relu_mlp):
    _, engine, _ = relu_mlp
    with pytest.raises(PlanError, match="cannot run on node 'h2:pre'"):
        Plan().with_entry("h2:pre", "substitute_activation").resolve(engine.graph)
    with pytest.raises(PlanError, match="Unknown activation"):
        Plan().with_entry("h1", "substitute_activation", {"activation": "nope"}).resolve(engine.graph)
    with pytest.raises(PlanError, match="cannot run on node 'h2:pre'"):  # Dense 6 -> 4: shape changes
        Plan().with_entry("h2:pre", "straight_through").resolve(engine.graph)
