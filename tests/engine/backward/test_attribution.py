"""SmoothGrad, integrated gradients and Grad-CAM against independent tf.GradientTape references on seeded tiny
nets, plus integrated gradients' completeness (what the method guarantees)."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.api import explain
from gradscope.backend import keras, tf
from gradscope.core.targets import Target
from gradscope.engine.backward.attribution import integrated_gradients, smoothgrad
from gradscope.engine.backward.runner import Engine
from gradscope.rules.plan import Plan
from tests.engine.fixtures import tape_input_gradient


@pytest.fixture(scope="module")
def smooth_net():
    """tanh everywhere: smooth, so integrated gradients converge fast and completeness is tight."""
    keras.utils.set_random_seed(3)
    inp = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, activation="tanh", name="conv")(inp)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    out = keras.layers.Dense(3, name="logits")(x)
    model = keras.Model(inp, out)
    return model, Engine(model)


def _x(seed=0):
    return np.random.default_rng(seed).uniform(0, 1, (1, 8, 8, 3)).astype("float32")


def test_smoothgrad_is_the_mean_tape_gradient_over_the_same_noisy_copies(smooth_net):
    model, engine = smooth_net
    x = _x()
    got = smoothgrad(engine, x, Target(index=2), samples=20, noise=0.2, seed=5)
    sigma = 0.2 * float(x.max() - x.min())
    copies = x + np.random.default_rng(5).normal(0.0, sigma, (20, 8, 8, 3)).astype("float32")
    expected = tape_input_gradient(model, copies, 2).mean(axis=0, keepdims=True)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)


def test_smoothgrad_fixes_the_top1_class_of_the_clean_input(smooth_net):
    model, engine = smooth_net
    x = _x(1)
    top = int(np.argmax(model(x).numpy()[0]))
    np.testing.assert_allclose(
        smoothgrad(engine, x, Target(), samples=4, seed=1),
        smoothgrad(engine, x, Target(index=top), samples=4, seed=1),
        rtol=1e-6,
    )


def test_integrated_gradients_match_the_tape_and_are_complete(smooth_net):
    model, engine = smooth_net
    x = _x(2)
    got = integrated_gradients(engine, x, Target(index=1), steps=64)
    alphas = ((np.arange(64) + 0.5) / 64).astype("float32").reshape(-1, 1, 1, 1)
    expected = x * tape_input_gradient(model, alphas * x, 1).mean(axis=0, keepdims=True)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    gap = float(model(x).numpy()[0, 1] - model(np.zeros_like(x)).numpy()[0, 1])
    assert abs(got.sum() - gap) <= 0.01 * abs(gap) + 1e-4  # completeness: attributions sum to f(x) - f(x0)


def test_sampling_runs_under_a_plan(smooth_net):
    _, engine = smooth_net
    x = _x(3)
    zero = Plan().with_entry("conv", "zero")
    assert np.all(smoothgrad(engine, x, Target(index=0), zero, samples=3) == 0)  # the plan's gradient is zero


def test_grad_cam_matches_the_numpy_formula(smooth_net):
    model, engine = smooth_net
    x = _x(4)
    e = explain(engine, (x[0] * 255).astype("uint8"), method="grad_cam", target=2)
    assert e.node == "conv"  # the last feature map under the classifier
    xin = (np.asarray((x[0] * 255).astype("uint8"), np.float32) / 255.0)[None]
    feature = keras.Model(model.input, model.get_layer("conv").output)
    head = keras.Sequential([model.get_layer("gap"), model.get_layer("logits")])
    a = tf.convert_to_tensor(feature(xin))
    with tf.GradientTape() as tape:
        tape.watch(a)
        score = tf.reduce_sum(head(a)[:, 2])
    g, a = tape.gradient(score, a).numpy()[0], a.numpy()[0]
    expected = np.maximum((g.mean(axis=(0, 1)) * a).sum(axis=-1), 0.0)
    np.testing.assert_allclose(e.saliency, expected, rtol=1e-4, atol=1e-6)


def test_sampling_passes_share_one_trace_report_progress_and_stop_when_cancelled():
    from gradscope.core.errors import Cancelled

    keras.utils.set_random_seed(8)
    inp = keras.Input((6, 6, 2))
    model = keras.Model(inp, keras.layers.Dense(3)(keras.layers.Flatten()(inp)))
    engine = Engine(model)
    seen = []
    before = engine.trace_count
    smoothgrad(engine, _x()[..., :2][:, :6, :6], Target(index=1), samples=40, progress=lambda d, t: seen.append((d, t)))
    assert engine.trace_count - before == 1  # 16 + 16 + 8 (padded to 16): one batch size, one trace
    assert seen == [(16, 40), (32, 40), (40, 40)]

    def stop(done, total):
        raise Cancelled("Cancelled.")

    with pytest.raises(Cancelled):
        integrated_gradients(engine, _x()[..., :2][:, :6, :6], Target(index=1), steps=64, progress=stop)
