"""A Keras layer's name means that layer's output as Keras defines it (after its fused activation), at every
place a user names one: Grad-CAM's ``layer=``, captures ("map at"), neuron and channel targets; the linear part
before the activation is ``<name>:pre``. Checked against Keras' own ``layer.output`` on a saved and loaded model."""

from __future__ import annotations

import json

import numpy as np
import pytest

import gradscope as gs
from gradscope.backend import keras, tf
from gradscope.core.errors import GraphError
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.plan import Plan

FUSED = {"feat": "relu", "feat2": "tanh"}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    keras.utils.set_random_seed(5)
    inputs = keras.Input((12, 12, 3), name="image")
    a = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="feat")(inputs)
    b = keras.layers.Conv2D(6, 3, padding="same", activation="tanh", name="feat2")(a)
    g = keras.layers.GlobalAveragePooling2D(name="gap")(b)
    out = keras.layers.Dense(4, activation="softmax", name="probs")(g)
    path = tmp_path_factory.mktemp("fused") / "fused.keras"
    keras.Model(inputs, out, name="fused").save(path)
    return keras.saving.load_model(path, safe_mode=True)


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(3).uniform(0, 1, (2, 12, 12, 3)).astype("float32")


def keras_output(model, name, x):
    return keras.Model(model.inputs, model.get_layer(name).output)(x).numpy()


def logits_from(model, name, a):
    """The logits computed from layer ``name``'s output ``a`` by the model's own layers (softmax left off)."""
    h = a
    for layer in model.layers[model.layers.index(model.get_layer(name)) + 1 :]:
        if layer.name == "probs":
            kernel, bias = layer.kernel, layer.bias
            return tf.matmul(h, kernel) + bias
        h = layer(h)
    raise AssertionError("no classifier")


def test_both_nodes_are_in_the_graph_and_the_name_is_the_output(model):
    graph = Engine(model).graph
    for name, act in FUSED.items():
        out, pre = graph.node(name), graph.node(name + ":pre")
        assert out.activation == act and out.fused_with == pre.id and out.inputs == (pre.id,)
        assert pre.op_type == "Conv2D" and pre.params == model.get_layer(name).count_params()
    assert graph.param_count() == model.count_params()


def test_captured_values_and_signals_are_those_of_keras_layer_output(model, x):
    engine = Engine(model)
    result = engine.backward(x, Target(index=1), Plan(), capture=["feat", "feat:pre", "feat2"])
    for name in FUSED:
        np.testing.assert_allclose(result.node_values[name], keras_output(model, name, x), rtol=1e-5, atol=1e-6)
        a = tf.constant(keras_output(model, name, x))
        with tf.GradientTape() as tape:
            tape.watch(a)
            logit = logits_from(model, name, a)[:, 1]
        np.testing.assert_allclose(result.node_grads[name], tape.gradient(logit, a).numpy(), rtol=1e-4, atol=1e-6)
    # the linear part is the convolution before its ReLU: the ReLU of it is the layer's output
    pre = result.node_values["feat:pre"]
    assert (pre < 0).any()
    np.testing.assert_allclose(np.maximum(pre, 0), result.node_values["feat"], rtol=1e-6, atol=1e-7)


def test_grad_cam_at_a_named_layer_is_grad_cam_on_keras_layer_output(model, x):
    image = (x[0] * 255).round().astype("uint8")
    explained = gs.explain(model, image, method="grad_cam", layer="feat", target=2)
    x0 = explained.result.inputs[0][:1]
    a = tf.constant(keras_output(model, "feat", x0))
    with tf.GradientTape() as tape:
        tape.watch(a)
        logit = logits_from(model, "feat", a)[:, 2]
    grad = tape.gradient(logit, a).numpy()[0]
    weights = grad.mean(axis=(0, 1))  # Selvaraju et al.: alpha_c = mean over positions of dy/dA_c
    cam = np.maximum((weights * a.numpy()[0]).sum(-1), 0)
    assert explained.node == "feat"
    np.testing.assert_allclose(explained.saliency, cam, rtol=1e-4, atol=1e-6)
    before = gs.explain(model, image, method="grad_cam", layer="feat:pre", target=2)
    assert not np.allclose(before.saliency, explained.saliency)  # the pre-activation is another map


def test_neuron_and_channel_targets_read_the_layer_output(model, x):
    engine = Engine(model)
    inner = keras.Model(model.inputs, model.get_layer("feat").output)
    xt = tf.constant(x)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(xt)
        a = inner(xt)
        channel = tf.reduce_sum(a[..., 3], axis=(1, 2))
        neuron = a[:, 5, 6, 2]
    for target, y in (
        (Target(kind="channel", node="feat", channel=3), channel),
        (Target(kind="neuron", node="feat", neuron=[5, 6, 2]), neuron),
    ):
        got = engine.backward(x, target, Plan()).input_grad
        np.testing.assert_allclose(got, tape.gradient(y, xt).numpy(), rtol=1e-4, atol=1e-6)


def test_rules_on_a_fused_layer_keep_working_on_both_parts(model, x):
    engine = Engine(model)
    zero_act = engine.backward(x, Target(index=0), Plan().with_entry("feat", "zero"))
    zero_pre = engine.backward(x, Target(index=0), Plan().with_entry("feat:pre", "zero"))
    assert not zero_act.input_grad.any() and not zero_pre.input_grad.any()
    guided = engine.backward(x, Target(index=0), Plan().with_entry("type:Activation", "guided_backprop"))
    assert set(guided.rules) == {"feat"}  # the ReLU only: tanh is not ReLU-like, the softmax is stripped


def test_plans_and_sessions_of_the_first_id_scheme_are_read_with_their_meaning(model, tmp_path):
    graph = Engine(model).graph
    old = Plan.from_dict(
        {
            "schema": 1,
            "entries": [
                {"select": "type:Conv2D", "rule": "identity"},
                {"select": "feat:act", "rule": "zero"},
                {"select": "node:feat2", "rule": "scale", "params": {"factor": 2}},
            ],
        }
    )
    new = old.upgraded(graph)
    assert [e.select for e in new.entries] == ["type:Conv2D", "feat", "node:feat2:pre"] and new.schema == 2
    assert set(old.resolve(graph).rules) == {"feat", "feat2:pre"}
    assert json.loads(new.to_json())["schema"] == 2 and json.loads(old.to_json())["schema"] == 1
    with pytest.raises(GraphError, match="now 'feat'.*'feat:pre'"):
        Plan().with_entry("feat:act", "zero").resolve(graph)
