"""Every weight of a node has its own name (its path inside the layer), so a rule can address each one:
MultiHeadAttention's four kernels used to collapse into one name."""

from __future__ import annotations

import numpy as np

from gradscope.backend import keras, tf
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.base import Rule, register_rule
from gradscope.rules.plan import Plan

seen: dict[str, list[str]] = {}


@register_rule("_zero_query_kernel", replace=True)
class ZeroQueryKernel(Rule):
    """Backward of the node with its query kernel set to zero (checks a weight can be addressed by name)."""

    def backward(self, ctx, grad_outputs):
        seen["names"] = list(ctx.weight_names)
        zero = {"query/kernel": tf.zeros_like(ctx.weights["query/kernel"])}
        return ctx.vjp(grad_outputs, weights=zero)[: len(ctx.inputs)]


def _attention_model():
    keras.utils.set_random_seed(0)
    inp = keras.Input((4, 6))
    x = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, name="mha")(inp, inp)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    return keras.Model(inp, keras.layers.Dense(2, name="out")(x))


def test_attention_weights_have_unique_names_a_rule_can_address():
    model = _attention_model()
    engine = Engine(model)
    x = np.random.default_rng(0).normal(size=(1, 4, 6)).astype("float32")
    plain = engine.backward(x, Target(index=0), mode="compiled").input_grad
    changed = engine.backward(x, Target(index=0), Plan().with_entry("mha", "_zero_query_kernel"), mode="compiled")
    names = seen["names"]
    assert len(names) == len(set(names)) == 8
    assert {"query/kernel", "key/kernel", "value/kernel", "attention_output/kernel"} <= set(names)
    assert not np.allclose(changed.input_grad, plain)
    # Independent reference: the upstream gradient at the attention output, pulled back through the same layer
    # with only its query kernel zeroed (Keras' own call, variables swapped and restored).
    mha, xt = model.get_layer("mha"), tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        y = mha(xt, xt)
        tape.watch(y)
        logit = model.get_layer("out")(model.get_layer("pool")(y))[:, 0]
    upstream = tape.gradient(logit, y)
    kernel = mha._query_dense.kernel
    saved = kernel.numpy()
    kernel.assign(np.zeros_like(saved))
    try:
        with tf.GradientTape() as tape:
            tape.watch(xt)
            y0 = mha(xt, xt)
        expected = tape.gradient(y0, xt, output_gradients=upstream).numpy()
    finally:
        kernel.assign(saved)
    np.testing.assert_allclose(changed.input_grad, expected, rtol=1e-4, atol=1e-6)


def test_simple_layers_keep_their_short_weight_names():
    from gradscope.core.names import weight_names

    dense = keras.layers.Dense(2, name="d")
    dense.build((None, 3))
    assert weight_names(dense, dense.weights) == ["kernel", "bias"]


def test_a_tensor_used_twice_gets_one_gradient_per_use():
    """Self-attention (``mha(x, x)``): the live sweep and rule VJPs counted the shared input twice (2x)."""
    model = _attention_model()
    engine = Engine(model)
    x = np.random.default_rng(1).normal(size=(1, 4, 6)).astype("float32")
    xt = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        score = model(xt)[:, 1]
    expected = tape.gradient(score, xt).numpy()
    for plan in (Plan(), Plan().with_entry("mha", "true_gradient")):
        for mode in ("live", "compiled"):
            got = engine.backward(x, Target(index=1), plan, mode=mode).input_grad
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6, err_msg=f"{mode} {plan}")
