"""Loss targets on multi-output models: one chosen output, or the compiled loss over all outputs (as fit)."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import keras, tf
from gradscope.core.errors import TargetError
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from tests.engine.model_kinds import multi_io


@pytest.fixture(scope="module")
def model_and_inputs():
    model = multi_io()
    rng = np.random.default_rng(3)
    xs = [rng.normal(size=(4, 6)).astype("float32"), rng.normal(size=(4, 4)).astype("float32")]
    return model, xs


def _tape(model, xs, loss_fn):
    ts = [tf.convert_to_tensor(x) for x in xs]
    with tf.GradientTape() as tape:
        for t in ts:
            tape.watch(t)
        loss = loss_fn(model(ts))
    return [g.numpy() for g in tape.gradient(loss, ts)]


def test_a_loss_on_one_chosen_output(model_and_inputs):
    model, xs = model_and_inputs
    engine = Engine(model)
    labels = np.array([0, 1, 1, 0])
    result = engine.backward(xs, Target(kind="loss", loss="crossentropy", node="out2"), labels=labels)
    expected = _tape(
        model,
        xs,
        lambda outs: tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, outs[1], from_logits=True)),
    )
    for got, want in zip(result.input_grads, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert "output 'out2'" in result.meta["loss"]
    mse_labels = np.ones((4, 3), "float32")
    mse = engine.backward(xs, Target(kind="loss", loss="mse", node="out1"), labels=mse_labels)
    expected = _tape(model, xs, lambda outs: tf.reduce_mean(tf.square(outs[0] - mse_labels)))
    np.testing.assert_allclose(mse.input_grads[0], expected[0], rtol=1e-5, atol=1e-7)


def test_the_compiled_loss_covers_every_output(model_and_inputs):
    _, xs = model_and_inputs
    model = multi_io()
    model.compile(loss=[keras.losses.MeanSquaredError(), keras.losses.SparseCategoricalCrossentropy(from_logits=True)])
    engine = Engine(model)
    labels = [np.full((4, 3), 0.5, "float32"), np.array([1, 0, 1, 1])]
    result = engine.backward(xs, Target(kind="loss"), labels=labels)  # auto = compiled
    expected = _tape(model, xs, lambda outs: model.compute_loss(x=None, y=labels, y_pred=outs, training=False))
    for got, want in zip(result.input_grads, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    with pytest.raises(TargetError, match="list of 2 labels"):
        engine.backward(xs, Target(kind="loss"), labels=labels[1])


def test_an_uncompiled_multi_output_loss_must_name_its_output(model_and_inputs):
    model, xs = model_and_inputs
    engine = Engine(model)
    with pytest.raises(TargetError, match="out1, out2"):
        engine.backward(xs, Target(kind="loss", loss="crossentropy"), labels=np.zeros(4))
    with pytest.raises(TargetError, match="not a model output"):
        engine.backward(xs, Target(kind="loss", loss="mse", node="da"), labels=np.zeros((4, 3)))
    assert Target.parse("loss:mse:out1") == Target(kind="loss", loss="mse", node="out1")
