"""The two shortcuts the live sweep takes through TensorFlow's eager gradients: convolutions without their
unused filter gradient (``input_only_conv_gradients``) and ``tape_vjp``. Both must give exactly what the
public ``tape.gradient`` gives, and leave TensorFlow as they found it."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import gradient_function, input_only_conv_gradients, tape_vjp, tf
from gradscope.engine.backward.kernels import missing_kernel_cause, missing_kernel_op

CONVS = [
    dict(strides=1, padding="SAME", dilations=1),
    dict(strides=2, padding="VALID", dilations=1),
    dict(strides=1, padding="SAME", dilations=2),
]


def _conv(kind: str, x, w, cfg):
    if kind == "conv":
        return tf.nn.conv2d(x, w, strides=cfg["strides"], padding=cfg["padding"], dilations=cfg["dilations"])
    return tf.nn.depthwise_conv2d(
        x, w, strides=[1, cfg["strides"], cfg["strides"], 1], padding=cfg["padding"], dilations=[cfg["dilations"]] * 2
    )


def _registered(name: str):
    from tensorflow.python.framework import ops as tf_ops

    return tf_ops._gradient_registry.lookup(name)


def _swapped(name: str) -> bool:
    return "_input_only" in _registered(name).__qualname__


@pytest.mark.parametrize("kind", ["conv", "depthwise"])
@pytest.mark.parametrize("cfg", CONVS, ids=lambda c: f"s{c['strides']}-{c['padding']}-d{c['dilations']}")
def test_input_gradient_is_tape_gradient_and_the_filter_one_is_kept_when_asked(kind, cfg):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((2, 9, 9, 3)), tf.float32)
    w = tf.constant(rng.standard_normal((3, 3, 3, 4 if kind == "conv" else 2)), tf.float32)

    def grads(with_filter: bool):
        with tf.GradientTape() as tape:
            tape.watch(x)
            if with_filter:
                tape.watch(w)
            y = _conv(kind, x, w, cfg)
        dy = tf.reshape(tf.sin(tf.range(tf.size(y), dtype=tf.float32)), y.shape)
        return tape.gradient(y, [x, w] if with_filter else [x], output_gradients=dy)

    try:
        plain_x, plain_w = grads(True)
    except tf.errors.OpError as exc:
        cause = missing_kernel_cause(exc)
        if cause is None:
            raise
        pytest.skip(f"this CPU's TensorFlow has no {missing_kernel_op(exc)} kernel for it (oneDNN off?): {cause}")
    name = "Conv2D" if kind == "conv" else "DepthwiseConv2dNative"
    original = _registered(name)  # TF's, or the swapped one while an abandoned job still sweeps (stuck-rule test)
    with input_only_conv_gradients():
        assert _swapped(name)
        (only_x,) = grads(False)
        both_x, both_w = grads(True)
    assert _registered(name) is original  # and is undone
    np.testing.assert_array_equal(only_x.numpy(), plain_x.numpy())
    np.testing.assert_array_equal(both_x.numpy(), plain_x.numpy())
    np.testing.assert_array_equal(both_w.numpy(), plain_w.numpy())


def test_the_swap_is_undone_after_an_error_and_nests():
    original = _registered("Conv2D")
    with pytest.raises(RuntimeError), input_only_conv_gradients():
        with input_only_conv_gradients():
            pass
        assert _swapped("Conv2D")  # the outer block still holds it
        raise RuntimeError("boom")
    assert _registered("Conv2D") is original


def test_graph_mode_gradients_are_unchanged():
    x = tf.ones((1, 5, 5, 2))
    w = tf.ones((3, 3, 2, 3))

    @tf.function
    def both():
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = tf.nn.conv2d(x, w, 1, "SAME")
        return tape.gradient(y, [x, w])

    plain = both()
    with input_only_conv_gradients():
        inside = tf.function(both.python_function)()
    for a, b in zip(plain, inside, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_tape_vjp_is_tape_gradient():
    a = tf.constant([1.0, 2.0, 3.0])
    b = tf.constant([0.5, -1.0, 2.0])
    unused = tf.constant([4.0])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([a, b, unused])
        y1 = a * b
        y2 = tf.reduce_sum(tf.square(a))
    dys = [tf.constant([1.0, -2.0, 0.5]), tf.constant(3.0)]
    want = tape.gradient([y1, y2], [a, b, unused], output_gradients=dys)
    got = tape_vjp(tape, [y1, y2], [a, b, unused], dys)
    assert got[2] is None and want[2] is None
    for g, w in zip(got[:2], want[:2], strict=True):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    assert gradient_function is not None


def test_a_cold_live_sweep_computes_no_filter_gradient(monkeypatch):
    """The point of the swap: a never-seen plan answered live runs no Conv2DBackpropFilter at all, and its
    input gradient is still the tape's."""
    from tensorflow.python.ops import gen_nn_ops

    from gradscope.core.targets import Target
    from gradscope.engine.backward.runner import Engine
    from gradscope.rules.plan import Plan
    from tests.engine.fixtures import tiny_cnn

    model = tiny_cnn()
    x = np.random.default_rng(0).random((2, 12, 12, 3), dtype=np.float32)
    calls = []
    real = gen_nn_ops.conv2d_backprop_filter
    monkeypatch.setattr(gen_nn_ops, "conv2d_backprop_filter", lambda *a, **k: calls.append(1) or real(*a, **k))
    result = Engine(model).backward(x, Target(index=1), Plan(), mode="live")
    assert result.meta["mode"] == "live" and calls == []

    xt = tf.constant(x)
    c1, c2, gap, out = (model.get_layer(n) for n in ("c1", "c2", "gap", "out"))
    with tf.GradientTape() as tape:
        tape.watch(xt)
        logits = tf.matmul(gap(c2(c1(xt))), out.kernel) + out.bias  # the engine explains the pre-softmax logit
        score = tf.reduce_sum(logits[:, 1])
    np.testing.assert_allclose(result.input_grad, tape.gradient(score, xt).numpy(), rtol=1e-5, atol=1e-6)
    w = tf.constant(c1.kernel.numpy())
    with tf.GradientTape() as tape:
        tape.watch([xt, w])
        score = tf.reduce_sum(tf.nn.conv2d(xt, w, 1, "VALID"))
    tape.gradient(score, [xt, w])
    assert calls  # outside a sweep a filter gradient that is asked for is computed
