"""Subclassed models open as graphs of their own layers (their call() traced on symbolic inputs), or as one
exact opaque node with a note when call() cannot run symbolically (issue 12, item 1)."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import keras, tf
from gradscope.core.errors import GraphError
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.io.models import load_model
from gradscope.rules.methods import build_method
from gradscope.rules.plan import Plan


@keras.saving.register_keras_serializable("gradscope_tests")
class SmallNet(keras.Model):
    """A research-style model: layers as attributes, keras.ops in call()."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.c1 = keras.layers.Conv2D(4, 3, activation="relu", name="c1")
        self.c2 = keras.layers.Conv2D(4, 3, name="c2")
        self.gap = keras.layers.GlobalAveragePooling2D(name="gap")
        self.head = keras.layers.Dense(3, name="head")

    def call(self, x):
        return self.head(self.gap(keras.ops.relu(self.c2(self.c1(x)))))


def functional_twin(model: SmallNet) -> keras.Model:
    """The same network written as a functional model with its own layers and the subclassed model's weights."""
    i = keras.Input((10, 10, 3))
    h = keras.layers.Conv2D(4, 3, activation="relu", name="c1")(i)
    h = keras.layers.Conv2D(4, 3, name="c2")(h)
    h = keras.layers.ReLU(name="relu")(h)
    o = keras.layers.Dense(3, name="head")(keras.layers.GlobalAveragePooling2D(name="gap")(h))
    twin = keras.Model(i, o)
    for name in ("c1", "c2", "head"):
        twin.get_layer(name).set_weights(getattr(model, name).get_weights())
    return twin


@pytest.fixture(scope="module")
def saved_net(tmp_path_factory):
    keras.utils.set_random_seed(4)
    model = SmallNet(name="small_net")
    x = np.random.default_rng(4).normal(size=(2, 10, 10, 3)).astype("float32")
    model(x)
    path = tmp_path_factory.mktemp("sub") / "small_net.keras"
    model.save(path)
    return path, x


def test_a_saved_subclassed_model_opens_as_its_layers_and_the_identity_plan_is_the_tape_gradient(saved_net):
    path, x = saved_net
    model = load_model(path)  # the safe path: the class is registered, nothing else runs
    engine = Engine(model)
    ids = [n.id for n in engine.graph.nodes]
    assert {"c1:pre", "c1", "c2", "gap", "head"} <= set(ids) and len(ids) == 7
    assert "traced on symbolic inputs" in engine.graph.notes[0]
    xt = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = tf.reduce_sum(model(xt)[:, 2])
    expected = tape.gradient(y, xt).numpy()
    for mode in ("live", "compiled"):
        got = engine.backward(x, Target(index=2), Plan(), mode=mode).input_grad
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("preset", ["guided_backprop", "lrp_epsilon"])
def test_rules_on_a_subclassed_model_equal_the_same_rules_on_its_functional_twin(saved_net, preset):
    path, x = saved_net
    model = load_model(path)
    engine, twin = Engine(model), Engine(functional_twin(model))
    method, twin_method = build_method(preset, engine.graph), build_method(preset, twin.graph)
    assert len(method.changed) == len(twin_method.changed) >= 2  # the fused ReLU and the keras.ops.relu node
    a = engine.backward(x, Target(index=1), method.plan).input_grad
    b = twin.backward(x, Target(index=1), twin_method.plan).input_grad
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


class RawTFNet(keras.Model):
    """call() uses a raw TensorFlow op, which cannot run on Keras' symbolic inputs."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(3)

    def build(self, input_shape):
        self.dense.build(input_shape)

    def call(self, x):
        return self.dense(tf.math.softplus(x))


def test_a_call_that_cannot_run_symbolically_is_one_exact_node_with_a_note():
    keras.utils.set_random_seed(1)
    model = RawTFNet(name="raw_tf")
    x = np.random.default_rng(1).normal(size=(2, 5)).astype("float32")
    model(x)
    engine = Engine(model)
    assert [n.id for n in engine.graph.nodes] == ["input", "raw_tf"]
    assert "one node" in engine.graph.notes[0] and "rules cannot be set inside it" in engine.graph.notes[0]
    xt = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = tf.reduce_sum(model(xt)[:, 0])
    np.testing.assert_allclose(
        engine.backward(x, Target(index=0), Plan()).input_grad, tape.gradient(y, xt).numpy(), rtol=1e-5, atol=1e-7
    )


def test_a_subclassed_model_that_was_never_built_is_a_clear_error():
    with pytest.raises(GraphError, match="never built"):
        Engine(SmallNet(name="unbuilt"))
