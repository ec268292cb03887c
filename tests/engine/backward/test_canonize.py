"""Canonizers: views of a model that never modify it (split activations, strip softmax, fold BatchNorm)."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import keras, tf
from gradscope.core.targets import Target
from gradscope.engine.backward.canonize import (
    RemovedLayer,
    final_softmax,
    fold_batchnorm,
    foldable_batchnorms,
    split_activations,
    strip_softmax,
)
from gradscope.engine.backward.runner import Engine
from tests.engine.fixtures import FIXTURES, sample_input


def _snapshot(model: keras.Model) -> tuple[list[np.ndarray], dict[str, object]]:
    weights = [np.array(w, copy=True) for w in model.get_weights()]
    acts = {layer.path: getattr(layer, "activation", None) for layer in _all_layers(model)}
    return weights, acts


def _all_layers(model: keras.Model) -> list:
    out = []
    for layer in model.layers:
        out.append(layer)
        if isinstance(layer, keras.Model):
            out.extend(_all_layers(layer))
    return out


def _assert_unchanged(model: keras.Model, snapshot) -> None:
    weights, acts = snapshot
    now = model.get_weights()
    assert len(now) == len(weights)
    for a, b in zip(weights, now):
        np.testing.assert_array_equal(a, b)
    assert {layer.path: getattr(layer, "activation", None) for layer in _all_layers(model)} == acts


# ------------------------------------------------------------------------------------------ split activations
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_split_graph_forward_is_bit_exact(name):
    """The node-by-node run with fused activations split off equals model(x) bit for bit (same execution mode)."""
    model = FIXTURES[name]()
    engine = Engine(model)
    x = tf.convert_to_tensor(sample_input(model, 3, seed=4))
    values, node_values = engine._run([x], {})
    np.testing.assert_array_equal(values[engine.exec.output_keys[0]].numpy(), model(x, training=False).numpy())
    # inside tf.function (what Engine.backward runs) against the model traced the same way
    traced = tf.function(lambda t: model(t, training=False))(x).numpy()
    np.testing.assert_array_equal(engine.backward(x.numpy(), Target(index=0), mode="compiled").predictions, traced)
    # the live path runs the same nodes eagerly: bit-exact against the eager model
    live = engine.backward(x.numpy(), Target(index=0), mode="live").predictions
    np.testing.assert_array_equal(live, model(x, training=False).numpy())


def test_split_activation_nodes_carry_the_layer_output():
    model = FIXTURES["chain"]()
    graph = split_activations(model)
    assert graph.node("conv1:pre").activation is None and graph.node("conv1").activation == "relu"
    assert graph.node("conv1").inputs == ("conv1:pre",)
    engine = Engine(model)
    x = tf.convert_to_tensor(sample_input(model, 2, seed=5))
    _, node_values = engine._run([x], {})
    conv1 = model.get_layer("conv1")
    np.testing.assert_array_equal(node_values["conv1"][0].numpy(), keras.Model(model.inputs, conv1.output)(x))
    pre = tf.nn.conv2d(x, conv1.kernel, 1, "VALID") + conv1.bias  # the linear part, computed independently
    np.testing.assert_allclose(node_values["conv1:pre"][0].numpy(), pre.numpy(), rtol=1e-5, atol=1e-5)
    assert conv1.activation is keras.activations.relu


# ------------------------------------------------------------------------------------------ softmax
def _softmax_models() -> dict[str, keras.Model]:
    keras.utils.set_random_seed(41)
    inp = keras.Input((6,))
    h = keras.layers.Dense(5, activation="relu", name="h")(inp)
    fused = keras.Model(inp, keras.layers.Dense(3, activation="softmax", name="p")(h), name="fused")
    layer = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(4, name="d"), keras.layers.Softmax(name="sm")], name="layer"
    )
    inp2 = keras.Input((6,))
    act = keras.Model(inp2, keras.layers.Activation("softmax", name="a")(keras.layers.Dense(3, name="d")(inp2)))
    return {"fused": fused, "softmax_layer": layer, "activation": act}


@pytest.mark.parametrize("kind", ["fused", "softmax_layer", "activation"])
def test_strip_softmax_gives_the_logits_the_engine_explains(kind):
    model = _softmax_models()[kind]
    snap = _snapshot(model)
    engine = Engine(model)
    x = np.random.default_rng(1).normal(size=(4, 6)).astype("float32")
    stripped, node_id = strip_softmax(model)
    assert node_id == final_softmax(engine.graph) and node_id is not None
    assert stripped is not model
    logits = stripped(x, training=False).numpy()
    # independent check: softmax of the stripped model's output is the original output
    np.testing.assert_allclose(tf.nn.softmax(logits).numpy(), model(x, training=False).numpy(), rtol=1e-5, atol=1e-6)
    result = engine.backward(x, Target(index=1))
    np.testing.assert_allclose(result.logits, logits, rtol=1e-5, atol=1e-6)
    plain = Engine(stripped, strip_softmax=False).backward(x, Target(index=1))
    np.testing.assert_allclose(result.input_grad, plain.input_grad, rtol=1e-5, atol=1e-7)
    assert final_softmax(split_activations(stripped)) is None
    _assert_unchanged(model, snap)


def test_strip_softmax_without_softmax_returns_the_model():
    model = FIXTURES["residual"]()
    assert strip_softmax(model) == (model, None)


# ------------------------------------------------------------------------------------------ fold BatchNorm
def bn_zoo() -> keras.Model:
    """BN after Conv2D (no bias), DepthwiseConv2D, SeparableConv2D, Conv2DTranspose, Dense; one unfoldable."""
    keras.utils.set_random_seed(42)
    inp = keras.Input((10, 10, 3), name="image")
    x = keras.layers.Conv2D(4, 3, use_bias=False, name="c1")(inp)
    x = keras.layers.BatchNormalization(name="bn1")(x)
    x = keras.layers.ReLU(name="r1")(x)
    x = keras.layers.DepthwiseConv2D(3, depth_multiplier=2, name="dw")(x)
    x = keras.layers.BatchNormalization(name="bn2", center=False)(x)
    x = keras.layers.SeparableConv2D(5, 3, name="sep")(x)
    x = keras.layers.BatchNormalization(name="bn3", scale=False)(x)
    x = keras.layers.Conv2DTranspose(3, 3, strides=2, name="tr")(x)
    x = keras.layers.BatchNormalization(name="bn4", epsilon=0.01)(x)
    x = keras.layers.Conv2D(3, 3, activation="relu", name="c_act")(x)
    x = keras.layers.BatchNormalization(name="bn5")(x)  # after an activation: not foldable
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    x = keras.layers.Dense(6, name="d")(x)
    x = keras.layers.BatchNormalization(name="bn6")(x)
    x = keras.layers.Dense(3, activation="softmax", name="p")(x)
    return _randomize_bn(keras.Model(inp, x, name="bn_zoo"))


def _randomize_bn(model: keras.Model, seed: int = 0) -> keras.Model:
    """Non-trivial BN statistics (inference BN is otherwise the identity), also with center/scale off."""
    rng = np.random.default_rng(seed)
    draw = {
        "gamma": lambda n: rng.uniform(0.5, 1.5, n),
        "beta": lambda n: rng.normal(0, 0.2, n),
        "moving_mean": lambda n: rng.normal(0, 0.3, n),
        "moving_variance": lambda n: rng.uniform(0.5, 2.0, n),
    }
    for layer in _all_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.set_weights([draw[v.name](v.shape[0]) for v in layer.weights])
    return model


def _numpy_bn(x: np.ndarray, bn: keras.layers.BatchNormalization) -> np.ndarray:
    w = dict(zip((v.name for v in bn.weights), bn.get_weights()))
    a = w.get("gamma", 1.0) / np.sqrt(w["moving_variance"] + bn.epsilon)
    return (x - w["moving_mean"]) * a + w.get("beta", 0.0)


def test_numpy_bn_reference_matches_keras():
    model = bn_zoo()
    bn = model.get_layer("bn6")
    x = np.random.default_rng(2).normal(size=(5, 6)).astype("float32")
    np.testing.assert_allclose(_numpy_bn(x, bn), bn(x, training=False).numpy(), rtol=1e-5, atol=1e-6)


def test_fold_batchnorm_preserves_the_function_and_the_users_model():
    model = bn_zoo()
    snap = _snapshot(model)
    x = np.random.default_rng(3).normal(size=(4, 10, 10, 3)).astype("float32")
    before = model(x, training=False).numpy()
    folded, mapping = fold_batchnorm(model)
    assert mapping == {"bn1": "c1", "bn2": "dw", "bn3": "sep", "bn4": "tr", "bn6": "d"}
    assert foldable_batchnorms(model)[1].keys() == {"bn5"}
    _assert_unchanged(model, snap)
    np.testing.assert_array_equal(model(x, training=False).numpy(), before)
    np.testing.assert_allclose(folded(x, training=False).numpy(), before, rtol=1e-5, atol=1e-5)
    # same node ids; folded BNs are pass-through stand-ins, the unfoldable one is still a BatchNorm
    graph, fgraph = split_activations(model), split_activations(folded)
    assert [n.id for n in graph.nodes if not n.is_input] == [n.id for n in fgraph.nodes if not n.is_input]
    for bn_id in mapping:
        assert fgraph.node(bn_id).op_type == "RemovedLayer"
        assert folded.get_layer(bn_id).was == "BatchNormalization"
    assert fgraph.node("bn5").op_type == "BatchNormalization"
    assert folded.get_layer("c1").use_bias  # a bias was added to hold beta - a*mu
    # the copy shares no variable with the original
    folded.get_layer("d").kernel.assign(np.zeros_like(folded.get_layer("d").get_weights()[0]))
    _assert_unchanged(model, snap)


def test_folded_weights_match_the_formula():
    """W' = a W, b' = a (b - mu) + beta with a = gamma / sqrt(var + eps), checked on the Dense + BN pair."""
    model = bn_zoo()
    folded, _ = fold_batchnorm(model)
    w, b = model.get_layer("d").get_weights()
    bn = model.get_layer("bn6")
    wf, bf = folded.get_layer("d").get_weights()
    x = np.random.default_rng(4).normal(size=(3, w.shape[0]))
    np.testing.assert_allclose(x @ wf + bf, _numpy_bn(x @ w + b, bn), rtol=1e-5, atol=1e-5)


def test_folded_model_has_the_same_gradients():
    model = bn_zoo()
    folded, _ = fold_batchnorm(model)
    x = np.random.default_rng(5).normal(size=(2, 10, 10, 3)).astype("float32")
    a = Engine(model).backward(x, Target(index=2))
    b = Engine(folded).backward(x, Target(index=2))
    assert np.abs(a.input_grad).max() > 0
    np.testing.assert_allclose(b.input_grad, a.input_grad, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(b.predictions, a.predictions, rtol=1e-5, atol=1e-6)


def test_fold_batchnorm_inside_nested_and_sequential_models():
    keras.utils.set_random_seed(43)
    block = keras.Sequential(
        [
            keras.Input((6, 6, 3)),
            keras.layers.Conv2D(4, 3, padding="same", name="bc"),
            keras.layers.BatchNormalization(name="bbn"),
            keras.layers.ReLU(name="br"),
        ],
        name="block",
    )
    inp = keras.Input((6, 6, 3))
    x = block(inp)
    x = keras.layers.Flatten(name="f")(x)
    x = keras.layers.Dense(3, name="o")(x)
    model = _randomize_bn(keras.Model(inp, x, name="outer"), seed=6)
    snap = _snapshot(model)
    folded, mapping = fold_batchnorm(model)
    assert mapping == {"block/bbn": "block/bc"}
    x = np.random.default_rng(7).normal(size=(3, 6, 6, 3)).astype("float32")
    np.testing.assert_allclose(folded(x, training=False).numpy(), model(x, training=False).numpy(), atol=1e-5)
    _assert_unchanged(model, snap)


def test_unfoldable_batchnorms_are_reported_and_kept():
    keras.utils.set_random_seed(44)
    inp = keras.Input((8,))
    h = keras.layers.Dense(4, name="h")(inp)
    a = keras.layers.BatchNormalization(name="bn")(h)
    model = keras.Model(inp, keras.layers.Add(name="add")([a, h]))  # h also feeds the Add
    folded, mapping = fold_batchnorm(model)
    assert folded is model and mapping == {}
    assert "also used elsewhere" in foldable_batchnorms(model)[1]["bn"]


def test_removed_layer_round_trips_through_keras_saving(tmp_path):
    model = bn_zoo()
    folded, _ = fold_batchnorm(model)
    path = tmp_path / "folded.keras"
    folded.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.get_layer("bn1"), RemovedLayer)
    x = np.random.default_rng(8).normal(size=(2, 10, 10, 3)).astype("float32")
    np.testing.assert_allclose(loaded(x).numpy(), folded(x).numpy(), rtol=1e-6, atol=1e-6)
