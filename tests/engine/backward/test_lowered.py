"""Lowered layers (``engine.backward.lowered``) compute what the Keras call computes and what ``tape.gradient`` of the
Keras call gives, node by node; layers outside the plain cases are not lowered and still come out right."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import keras, tf
from gradscope.core.targets import Target
from gradscope.engine.backward.live import _LoweredVJP, _Recorded
from gradscope.engine.backward.node_call import call_arguments, plain_call
from gradscope.engine.backward.runner import Engine
from gradscope.rules.plan import Plan
from tests.engine.fixtures import tape_input_gradient

L = keras.layers


def _model(build, shape=(9, 9, 3)) -> keras.Model:
    keras.utils.set_random_seed(0)
    inp = keras.Input(shape)
    out = build(inp)
    model = keras.Model(inp, out)
    for layer in model.layers:  # moving statistics that are not 0 and 1: the BN formula is exercised
        if isinstance(layer, L.BatchNormalization):
            rng = np.random.default_rng(1)
            layer.moving_mean.assign(rng.normal(0, 1, layer.moving_mean.shape))
            layer.moving_variance.assign(rng.uniform(0.5, 2, layer.moving_variance.shape))
            if layer.scale:
                layer.gamma.assign(rng.normal(1, 0.3, layer.gamma.shape))
            if layer.center:
                layer.beta.assign(rng.normal(0, 0.3, layer.beta.shape))
    return model


def _forward(model: keras.Model):
    engine = Engine(model)
    x = np.random.default_rng(0).normal(size=(2, *model.input_shape[1:])).astype("float32")
    return engine, engine.live.forward([tf.constant(x)])


def _check_every_node(model: keras.Model) -> dict[str, str]:
    """Each node's value and VJP against its Keras call on the same inputs; returns node -> how it ran."""
    engine, fwd = _forward(model)
    rng = np.random.default_rng(2)
    how = {}
    for step in engine.exec.steps:
        if step.kind == "alias":
            continue
        args, kwargs = call_arguments(step, fwd.values)
        xs = fwd.calls[step.node_id].xs
        with tf.GradientTape(persistent=True) as tape:
            copies = [tf.identity(x) for x in xs]
            for c in copies:
                tape.watch(c)
            call = fwd.calls[step.node_id]
            reference = plain_call(step, *call.pack(copies))
        got = [fwd.values[k] for k in step.out_keys]
        for y, ref in zip(got, reference):
            np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=1e-6, atol=1e-6, err_msg=step.node_id)
        dys = [tf.constant(rng.normal(size=y.shape).astype("float32")) for y in got]
        expected = tape.gradient(reference, copies, output_gradients=dys)
        vjp = fwd.tapes[step.node_id]
        if vjp is not None:
            for g, e in zip(vjp.vjp(dys), expected):
                np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-6, err_msg=step.node_id)
        how[step.node_id] = "lowered" if isinstance(vjp, _LoweredVJP) else "keras"
    return how


LOWERED = {
    "conv same, bias, fused relu": lambda x: L.Conv2D(4, 3, padding="same", activation="relu", name="c")(x),
    "conv valid, strided, no bias": lambda x: L.Conv2D(5, 3, strides=2, use_bias=False, name="c")(x),
    "conv 1x1 strided same": lambda x: L.Conv2D(2, 1, strides=2, padding="same", name="c")(x),
    "batch norm": lambda x: L.BatchNormalization(name="bn")(x),
    "batch norm without scale/center": lambda x: L.BatchNormalization(center=False, scale=False, name="bn")(x),
    "add of three": lambda x: L.Add(name="add")([x, L.ReLU(name="r")(x), L.Activation("relu", name="a")(x)]),
    "add of a tensor and itself": lambda x: L.Add(name="add")([x, x]),
    "zero padding, uneven": lambda x: L.ZeroPadding2D(((1, 2), (0, 3)), name="pad")(x),
    "max pool valid": lambda x: L.MaxPooling2D(2, name="pool")(x),
    "max pool same, overlapping": lambda x: L.MaxPooling2D(3, strides=2, padding="same", name="pool")(x),
    "global average pool": lambda x: L.GlobalAveragePooling2D(name="gap")(x),
    "global average pool, keepdims": lambda x: L.GlobalAveragePooling2D(keepdims=True, name="gap")(x),
    "dense head, fused relu": lambda x: L.Dense(3, activation="relu", name="d")(L.Flatten(name="f")(x)),
    "dense without bias": lambda x: L.Dense(3, use_bias=False, name="d")(L.GlobalAveragePooling2D(name="g")(x)),
    "dense on a 4-d input": lambda x: L.Dense(2, name="d")(x),
    "dense on a sequence, fused relu": lambda x: L.Dense(3, activation="relu", name="d")(
        L.Reshape((-1, 3), name="f")(x)
    ),
}


@pytest.mark.parametrize("case", LOWERED)
def test_a_lowered_layer_computes_its_keras_call_and_true_vjp(case):
    how = _check_every_node(_model(LOWERED[case]))
    assert {n for n, h in how.items() if h == "keras"} <= {"f"}, how  # Flatten is not lowered


NOT_LOWERED = {
    "dilated conv": lambda x: L.Conv2D(2, 3, dilation_rate=2, name="x")(x),
    "conv with a sigmoid": lambda x: L.Conv2D(2, 3, activation="sigmoid", name="x")(x),
    "relu6": lambda x: L.ReLU(max_value=6.0, name="x")(x),
    "leaky relu layer": lambda x: L.ReLU(negative_slope=0.1, name="x")(x),
    "batch norm over axis 1": lambda x: L.BatchNormalization(axis=1, name="x")(x),
    "add with broadcasting": lambda x: L.Add(name="x")([x, L.GlobalAveragePooling2D(keepdims=True, name="g")(x)]),
    "subclassed conv": lambda x: type("MyConv", (L.Conv2D,), {})(2, 3, name="x")(x),
}


@pytest.mark.parametrize("case", NOT_LOWERED)
def test_other_configurations_run_through_keras_and_stay_exact(case):
    how = _check_every_node(_model(NOT_LOWERED[case]))
    assert how["x"] == "keras"


def test_mixed_precision_layers_are_not_lowered():
    keras.utils.set_random_seed(0)
    inp = keras.Input((6,))
    out = L.Dense(3, dtype="mixed_float16", name="x")(inp)
    engine, fwd = _forward(keras.Model(inp, out))
    assert isinstance(fwd.tapes["x"], _Recorded)


def test_the_live_identity_plan_equals_the_tape_gradient_on_a_lowered_resnet_block():
    """Every node lowered (conv, BN, ReLU, add, padding, pooling, dense): the map equals tape.gradient."""

    def block(x):
        h = L.ZeroPadding2D(1, name="pad")(x)
        h = L.Conv2D(4, 3, strides=2, name="conv")(h)
        h = L.BatchNormalization(name="bn")(h)
        h = L.ReLU(name="relu")(h)
        s = L.Conv2D(4, 1, strides=2, name="short")(x)
        h = L.Add(name="add")([h, s])
        h = L.MaxPooling2D(2, padding="same", name="pool")(h)
        h = L.Activation("relu", name="act")(h)
        return L.Dense(3, name="head")(L.GlobalAveragePooling2D(name="gap")(h))

    model = _model(block, (10, 10, 3))
    engine = Engine(model)
    x = np.random.default_rng(0).normal(size=(2, 10, 10, 3)).astype("float32")
    result = engine.backward(x, Target(index=1), Plan(), mode="live")
    fwd = engine.live._forward
    assert all(isinstance(v, _LoweredVJP) for v in fwd.tapes.values()), fwd.tapes
    np.testing.assert_allclose(result.input_grad, tape_input_gradient(model, x, 1), rtol=1e-5, atol=1e-7)


WEIGHTED = ["conv same, bias, fused relu", "conv valid, strided, no bias", "batch norm", "dense on a 4-d input"]


@pytest.mark.parametrize("case", WEIGHTED)
def test_a_lowered_vjp_holds_for_other_weights_at_the_forward_inputs(case):
    """What ``RuleContext.vjp(weights=...)`` relies on: at the forward inputs, the lowered VJP with modified
    weights (``W+``, a dropped bias) is the tape gradient of the call with those weights."""
    engine, fwd = _forward(_model(LOWERED[case]))
    rng = np.random.default_rng(4)
    checked = 0
    for step in engine.exec.steps:
        call = fwd.calls.get(step.node_id)
        if step.kind == "alias" or call is None or call.lowered is None or not call.variables:
            continue
        ws = [
            tf.maximum(w, 0.0) if w.shape.rank > 1 else tf.constant(rng.uniform(0.5, 2, w.shape), w.dtype)
            for w in map(tf.convert_to_tensor, call.weights())
        ]
        xs = [tf.identity(x) for x in call.xs]
        with tf.GradientTape() as tape:
            tape.watch(xs)
            ys = call.forward(xs, ws)
        dys = [tf.constant(rng.normal(size=y.shape).astype("float32")) for y in ys]
        expected = tape.gradient(ys, xs, output_gradients=dys)
        got = call.lowered.vjp(call.xs, [fwd.values[k] for k in step.out_keys], ws, dys)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-6, err_msg=step.node_id)
        checked += 1
    assert checked >= 1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "mixed_bfloat16"])
@pytest.mark.parametrize("tied", [True, False])
def test_a_language_models_head_runs_in_chunks_as_keras_computes_it(dtype, tied, monkeypatch):
    """``ReversibleEmbedding(x, reverse=True)`` (a causal LM's head) is lowered in any float dtype: its logits and
    its VJP in chunks of the vocabulary equal the Keras call and ``tape.gradient`` (in the dtype's precision); a
    soft-capped head runs through Keras."""
    from gradscope.engine.backward import lowered

    monkeypatch.setattr(lowered, "HEAD_CHUNK_ROWS", 7)  # 50 rows: eight products, the last one short
    keras.utils.set_random_seed(0)
    layer = L.ReversibleEmbedding(50, 12, tie_weights=tied, dtype=dtype)
    layer.build((None, None))
    if not tied:
        layer.reverse_embeddings.assign(np.random.default_rng(3).normal(0, 0.3, (12, 50)))
    x = tf.cast(tf.constant(np.random.default_rng(4).normal(size=(2, 5, 12)), "float32"), layer.compute_dtype)
    step = type("Step", (), {"operation": layer, "kind": "call", "linear_call": False})()
    low = lowered.lower(step, (x,), {"reverse": True})
    assert low is not None
    ws = [v.value for v in layer.variables]
    tolerance = {"float32": 1e-5, "bfloat16": 2e-2, "mixed_bfloat16": 2e-2}[dtype]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        want = layer(x, reverse=True)
    got = low.forward([x], ws)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=tolerance, atol=tolerance)
    dense = np.random.default_rng(5).normal(size=want.shape)
    one_position = np.zeros(want.shape)  # a next-token target: the VJP multiplies only the seeded rows
    one_position[1, 3] = dense[1, 3]
    for seed in (dense, one_position):
        dy = tf.cast(tf.constant(seed), want.dtype)
        for traced in (False, True):  # a traced plan keeps the whole product
            vjp = tf.function(low.vjp) if traced else low.vjp
            np.testing.assert_allclose(
                np.float32(vjp([x], [want], ws, [dy])[0]),
                np.float32(tape.gradient(want, x, output_gradients=dy)),
                rtol=tolerance,
                atol=tolerance * 10,
            )
    capped = L.ReversibleEmbedding(50, 12, logit_soft_cap=30.0)
    capped.build((None, None))
    step.operation = capped
    assert lowered.lower(step, (tf.cast(x, "float32"),), {"reverse": True}) is None
