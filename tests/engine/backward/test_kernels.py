"""A TensorFlow kernel this machine lacks reaches the user as one line naming the layer and the cause
(``engine.backward.kernels``), never as a traceback. Which kernels exist depends on the CPU: without oneDNN TensorFlow
has no eager ``Conv2DBackpropInput`` for dilation rates above 1, the forward op of a dilated Conv2DTranspose."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import keras, tf
from gradscope.core.errors import MissingKernelError
from gradscope.core.targets import Target
from gradscope.engine.backward.kernels import as_missing_kernel, missing_kernel_cause
from gradscope.engine.backward.runner import Engine
from tests.engine.fixtures import tape_input_gradient

CPU_MESSAGE = "Current CPU implementations do not yet support dilation rates larger than 1."


def _dilated_transpose_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="c1")(inp)
    h = keras.layers.Conv2DTranspose(4, 3, dilation_rate=2, padding="same", name="up")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inp, keras.layers.Dense(3, name="head")(h))


def _kernel_missing_here() -> str | None:
    layer = keras.layers.Conv2DTranspose(2, 3, dilation_rate=2, padding="same")
    try:
        layer(tf.zeros((1, 6, 6, 2)))
    except tf.errors.OpError as exc:
        return missing_kernel_cause(exc)
    return None


@pytest.mark.parametrize("mode", ["live", "compiled"])
def test_a_dilated_transpose_conv_is_the_tape_gradient_or_a_clear_error_naming_it(mode):
    model = _dilated_transpose_model()
    x = np.random.default_rng(0).random((2, 8, 8, 3)).astype("float32")
    engine = Engine(model)
    missing = _kernel_missing_here()
    if missing is None:  # oneDNN (or a GPU) has the kernel: the engine gives the tape's gradient
        result = engine.backward(x, Target(index=1), mode=mode)
        np.testing.assert_allclose(result.input_grads[0], tape_input_gradient(model, x, 1), rtol=1e-5, atol=1e-6)
        return
    with pytest.raises(MissingKernelError) as info:
        engine.backward(x, Target(index=1), mode=mode)
    message = str(info.value)
    assert "'up' (Conv2DTranspose)" in message and "dilation rates" in message and "Traceback" not in message
    assert info.value.node_id == "up"


def test_the_cause_is_recognised_and_other_errors_are_left_alone():
    text = f"{{{{function_node x}}}} {CPU_MESSAGE} [Op:Conv2DBackpropInput]"
    missing = tf.errors.InvalidArgumentError(None, None, text)
    assert missing_kernel_cause(missing) == CPU_MESSAGE.rstrip(".")
    assert missing_kernel_cause(tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [2] vs. [3]")) is None
    assert missing_kernel_cause(ValueError(CPU_MESSAGE)) is None  # only TensorFlow's op errors
    no_kernel = tf.errors.NotFoundError(None, None, "No OpKernel was registered to support Op 'Foo' used by node x")
    assert missing_kernel_cause(no_kernel) is not None


def test_a_graph_mode_error_is_named_by_its_op_name():
    engine = Engine(_dilated_transpose_model())
    exc = tf.errors.InvalidArgumentError(
        None, None, f"{CPU_MESSAGE}\n\t [[{{{{node functional/up/conv_transpose}}}}]] [Op:__inference_fn_123]"
    )
    error = as_missing_kernel(exc, engine.graph)
    assert error is not None and error.node_id == "up" and "Conv2DTranspose" in str(error)
    assert "__inference" not in str(error)  # the function's name is not an op the user could look up


def test_an_eager_forward_without_the_kernel_names_the_node_it_ran(monkeypatch):
    """Simulated on every CPU: the live forward runs node by node, so the node is known exactly. The op fails,
    not the Keras call: a lowered layer (``engine.backward.lowered``) calls the op without Keras."""
    model = _dilated_transpose_model()
    original = tf.nn.convolution

    def failing_convolution(x, *args, **kwargs):
        if tf.executing_eagerly() and x.shape[-1] == 3:  # c1's input (three channels)
            raise tf.errors.InvalidArgumentError(None, None, f"{CPU_MESSAGE} [Op:Conv2D]")
        return original(x, *args, **kwargs)

    monkeypatch.setattr(tf.nn, "convolution", failing_convolution)
    with pytest.raises(MissingKernelError) as info:
        Engine(model).backward(np.ones((1, 8, 8, 3), "float32"), Target(index=0), mode="live")
    assert info.value.node_id == "c1:pre" and "(op Conv2D)" in str(info.value)
