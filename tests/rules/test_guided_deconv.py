"""Guided backprop and deconvnet (RULES_SPEC §2.2) against the independent NumPy reference in reference.py."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import keras
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.methods import build_method
from gradscope.rules.plan import Plan
from tests.rules.reference import ReferenceNet, RefNode, conv_params, dense_params

ATOL = 1e-5
MODES = {"gradient": None, "guided": "guided_backprop", "deconvnet": "deconvnet"}


def _random_biases(model: keras.Model, seed: int) -> keras.Model:
    """Non-zero biases, so a bias that a rule drops or double-counts shows up."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if getattr(layer, "use_bias", False):
            kernel, bias = layer.get_weights()
            layer.set_weights([kernel, rng.normal(0, 0.1, bias.shape).astype("float32")])
    return model


def conv_pool_dense():
    """conv -> max-pool -> ReLU -> strided 'same' conv (asymmetric pad) -> 'valid' conv -> dense -> softmax.

    The max-pool reads the conv's pre-activations (continuous values), not ReLU outputs: windows of ReLU zeros
    would tie, and deconvnet (which ignores the forward mask) would then depend on tie-breaking.
    """
    keras.utils.set_random_seed(21)
    inp = keras.Input((16, 16, 3), name="image")
    x = keras.layers.Conv2D(5, 3, padding="same", name="conv1")(inp)
    x = keras.layers.MaxPooling2D(2, name="pool")(x)
    x = keras.layers.ReLU(name="relu1")(x)
    x = keras.layers.Conv2D(6, 3, strides=2, padding="same", activation="relu", name="conv2")(x)
    x = keras.layers.Conv2D(4, 3, padding="valid", activation="relu", name="conv3")(x)
    x = keras.layers.Flatten(name="flat")(x)
    x = keras.layers.Dense(10, activation="relu", name="fc")(x)
    x = keras.layers.Dense(4, activation="softmax", name="probs")(x)
    model = _random_biases(keras.Model(inp, x, name="conv_pool_dense"), 21)
    ref = ReferenceNet(
        [
            RefNode("image", "input"),
            RefNode("conv1", "conv2d", ("image",), conv_params(model.get_layer("conv1"))),
            RefNode("pool", "maxpool", ("conv1",)),
            RefNode("relu1", "relu", ("pool",)),
            RefNode("conv2:pre", "conv2d", ("relu1",), conv_params(model.get_layer("conv2"))),
            RefNode("conv2", "relu", ("conv2:pre",)),
            RefNode("conv3:pre", "conv2d", ("conv2",), conv_params(model.get_layer("conv3"))),
            RefNode("conv3", "relu", ("conv3:pre",)),
            RefNode("flat", "flatten", ("conv3",)),
            RefNode("fc:pre", "dense", ("flat",), dense_params(model.get_layer("fc"))),
            RefNode("fc", "relu", ("fc:pre",)),
            RefNode("probs", "dense", ("fc",), dense_params(model.get_layer("probs"))),  # logits
        ]
    )
    return model, ref, ("relu1", "conv2", "conv3", "fc")


def residual():
    """stem -> ReLU -> [conv(relu) -> 1x1 conv] + shortcut -> Activation(relu) -> GAP -> dense."""
    keras.utils.set_random_seed(22)
    inp = keras.Input((8, 8, 3), name="image")
    s = keras.layers.Conv2D(4, 3, padding="same", name="stem")(inp)
    s = keras.layers.ReLU(name="stem_relu")(s)
    y = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="a")(s)
    y = keras.layers.Conv2D(4, 1, name="b")(y)
    x = keras.layers.Add(name="add")([s, y])
    x = keras.layers.Activation("relu", name="post")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    x = keras.layers.Dense(3, name="logits")(x)
    model = _random_biases(keras.Model(inp, x, name="residual"), 22)
    ref = ReferenceNet(
        [
            RefNode("image", "input"),
            RefNode("stem", "conv2d", ("image",), conv_params(model.get_layer("stem"))),
            RefNode("stem_relu", "relu", ("stem",)),
            RefNode("a:pre", "conv2d", ("stem_relu",), conv_params(model.get_layer("a"))),
            RefNode("a", "relu", ("a:pre",)),
            RefNode("b", "conv2d", ("a",), conv_params(model.get_layer("b"))),
            RefNode("add", "add", ("stem_relu", "b")),
            RefNode("post", "relu", ("add",)),
            RefNode("gap", "gap", ("post",)),
            RefNode("logits", "dense", ("gap",), dense_params(model.get_layer("logits"))),
        ]
    )
    return model, ref, ("stem_relu", "a", "post")


def relu_variants():
    """ReLU6 (layer and fused), LeakyReLU (layer, own slope), keras.ops.relu, Activation('relu') on inputs."""
    keras.utils.set_random_seed(23)
    inp = keras.Input((6,), name="x")
    x = keras.layers.Activation("relu", name="in_relu")(inp)  # sees exact zeros of the input: z == 0
    x = keras.layers.Dense(12, name="d1")(x)
    x = keras.layers.ReLU(max_value=6.0, name="r6")(x)
    x = keras.layers.Dense(10, activation="relu6", name="d2")(x)
    x = keras.layers.Dense(9, name="d3")(x)
    x = keras.layers.LeakyReLU(negative_slope=0.3, name="leaky")(x)
    x = keras.layers.Dense(8, name="d4")(x)
    x = keras.ops.relu(x)
    x = keras.layers.Dense(3, name="out")(x)
    model = _random_biases(keras.Model(inp, x, name="relu_variants"), 23)
    op_relu = next(op.name for op in model.operations if type(op).__name__ == "Relu")  # "relu", "relu_1"...
    # Scale d1/d2 so that some pre-activations exceed 6 and the ReLU6 cap is really exercised.
    for name in ("d1", "d2"):
        k, b = model.get_layer(name).get_weights()
        model.get_layer(name).set_weights([6.0 * k, b])
    ref = ReferenceNet(
        [
            RefNode("x", "input"),
            RefNode("in_relu", "relu", ("x",)),
            RefNode("d1", "dense", ("in_relu",), dense_params(model.get_layer("d1"))),
            RefNode("r6", "relu6", ("d1",)),
            RefNode("d2:pre", "dense", ("r6",), dense_params(model.get_layer("d2"))),
            RefNode("d2", "relu6", ("d2:pre",)),
            RefNode("d3", "dense", ("d2",), dense_params(model.get_layer("d3"))),
            RefNode("leaky", "leaky_relu", ("d3",), {"alpha": 0.3}),
            RefNode("d4", "dense", ("leaky",), dense_params(model.get_layer("d4"))),
            RefNode(op_relu, "relu", ("d4",)),
            RefNode("out", "dense", (op_relu,), dense_params(model.get_layer("out"))),
        ]
    )
    return model, ref, ("in_relu", "r6", "d2", "leaky", op_relu)


NETS = {"conv_pool_dense": conv_pool_dense, "residual": residual, "relu_variants": relu_variants}


@pytest.fixture(scope="module", params=sorted(NETS))
def net(request):
    model, ref, relu_ids = NETS[request.param]()
    engine = Engine(model)
    shape = (3,) + tuple(model.inputs[0].shape[1:])
    x = np.random.default_rng(5).normal(size=shape).astype("float32")
    if request.param == "relu_variants":
        x[:, ::2] = 0.0  # exact zeros in front of a ReLU: guided/gradient pass nothing there, deconvnet does
        x *= 3.0  # large enough that some pre-activations pass the ReLU6 cap
    return request.param, model, engine, ref, relu_ids, x


@pytest.mark.parametrize("mode", sorted(MODES))
def test_relu_rules_match_numpy_reference(net, mode):
    name, model, engine, ref, relu_ids, x = net
    method = "gradient" if MODES[mode] is None else MODES[mode]
    plan = build_method(method, engine.graph).plan
    k = 1
    result = engine.backward(x, Target(index=k), plan, capture=relu_ids)
    values = ref.forward(x)
    np.testing.assert_allclose(result.logits, values[ref.output], rtol=1e-4, atol=ATOL)
    expected = ref.backward(values, class_index=k, relu_mode=mode)
    scale = np.abs(expected[ref.nodes[0].id]).max()
    assert scale > 1e-3, "the net passes (almost) nothing back: the test would be vacuous"
    assert np.allclose(result.input_grad, expected[ref.nodes[0].id], rtol=1e-4, atol=ATOL * max(1.0, scale))
    for node_id in relu_ids:  # the signal arriving at each ReLU output, not only at the input
        np.testing.assert_allclose(
            result.node_grads[node_id], expected[node_id], rtol=1e-4, atol=ATOL, err_msg=f"{name}: {node_id}"
        )


def test_modes_really_differ(net):
    """Guards the reference comparison: on these nets the three ReLU backward modes give different maps."""
    name, model, engine, ref, relu_ids, x = net
    values = ref.forward(x)
    maps = {m: ref.backward(values, 0, relu_mode=m)[ref.nodes[0].id] for m in MODES}
    for a, b in (("gradient", "guided"), ("gradient", "deconvnet"), ("guided", "deconvnet")):
        assert not np.allclose(maps[a], maps[b], atol=1e-3), f"{name}: {a} == {b}"
    got = engine.backward(x, Target(index=0), build_method("guided_backprop", engine.graph).plan).input_grad
    assert not np.allclose(got, maps["gradient"], atol=1e-3)


def test_single_node_override_matches_reference():
    """Guided on one node only (node selector), the true gradient everywhere else."""
    model, ref, relu_ids = conv_pool_dense()
    engine = Engine(model)
    x = np.random.default_rng(9).normal(size=(2, 16, 16, 3)).astype("float32")
    plan = Plan().with_entry("conv2", "guided_backprop").with_entry("fc", "deconvnet")
    result = engine.backward(x, Target(index=3), plan)
    expected = ref.backward(ref.forward(x), 3, modes={"conv2": "guided", "fc": "deconvnet"})
    np.testing.assert_allclose(result.input_grad, expected["image"], rtol=1e-4, atol=ATOL)


def test_presets_select_every_relu_like_node():
    for build in NETS.values():
        model, _, relu_ids = build()
        graph = Engine(model).graph
        for name in ("guided_backprop", "deconvnet"):
            method = build_method(name, graph)
            assert set(method.changed) == set(relu_ids)
            assert method.reduction == "max_abs"
            assert method.warnings == ()
            resolution = method.plan.resolve(graph)
            assert {r.entry.rule for r in resolution.rules.values()} == {name}
            assert resolution.unmatched == []


def test_presets_warn_when_nothing_matches():
    keras.utils.set_random_seed(24)
    inp = keras.Input((5,))
    x = keras.layers.Dense(4, activation="tanh", name="t")(inp)
    x = keras.layers.Activation("sigmoid", name="s")(x)
    model = keras.Model(inp, keras.layers.Dense(2, name="o")(x))
    engine = Engine(model)
    for name in ("guided_backprop", "deconvnet"):
        method = build_method(name, engine.graph)
        assert method.changed == ()
        assert len(method.warnings) == 1 and "no ReLU-like node" in method.warnings[0]
        x_in = np.random.default_rng(0).normal(size=(2, 5)).astype("float32")
        plain = engine.backward(x_in, Target(index=0)).input_grad
        np.testing.assert_allclose(engine.backward(x_in, Target(index=0), method.plan).input_grad, plain, rtol=1e-5)


def test_rules_skip_non_relu_nodes_under_broad_selectors():
    model, _, relu_ids = conv_pool_dense()
    graph = Engine(model).graph
    resolution = Plan().with_entry("*", "guided_backprop").resolve(graph)
    assert set(resolution.rules) == set(relu_ids)
    assert "conv1" in resolution.skipped["*"] and "pool" in resolution.skipped["*"]
