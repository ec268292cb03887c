"""Tiny seeded Keras models covering the graph shapes the engine must handle."""

from __future__ import annotations

import numpy as np

from gradscope.backend import keras, tf


def chain() -> keras.Model:
    keras.utils.set_random_seed(1)
    inp = keras.Input((10, 10, 3), name="image")
    x = keras.layers.Conv2D(4, 3, activation="relu", name="conv1")(inp)
    x = keras.layers.MaxPooling2D(name="pool")(x)
    x = keras.layers.Conv2D(6, 3, padding="same", name="conv2")(x)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.ReLU(name="relu2")(x)
    x = keras.layers.Flatten(name="flat")(x)
    x = keras.layers.Dropout(0.5, name="drop")(x)
    x = keras.layers.Dense(5, activation="softmax", name="probs")(x)
    return _randomize_bn(keras.Model(inp, x, name="chain"))


def residual() -> keras.Model:
    """Fan-out: one tensor feeds a branch and the shortcut of an Add."""
    keras.utils.set_random_seed(2)
    inp = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="stem")(inp)
    y = keras.layers.Conv2D(4, 3, padding="same", name="branch_a")(x)
    y = keras.layers.ReLU(name="branch_relu")(y)
    y = keras.layers.Conv2D(4, 1, name="branch_b")(y)
    x = keras.layers.Add(name="add")([x, y])
    x = keras.layers.Activation("relu", name="post")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    x = keras.layers.Dense(3, name="logits")(x)
    return keras.Model(inp, x, name="residual")


def concat() -> keras.Model:
    """Fan-in: two branches concatenated, plus a keras.ops node (x * 2)."""
    keras.utils.set_random_seed(3)
    inp = keras.Input((12,))
    a = keras.layers.Dense(6, activation="tanh", name="a")(inp)
    b = keras.layers.Dense(5, activation="relu", name="b")(inp)
    c = keras.layers.Concatenate(name="cat")([a, b * 2.0])
    out = keras.layers.Dense(4, name="out")(c)
    return keras.Model(inp, out, name="concat")


def nested() -> keras.Model:
    """A functional model and a Sequential model used as layers of an outer model."""
    keras.utils.set_random_seed(4)
    inner_in = keras.Input((6, 6, 4))
    h = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="inner_conv")(inner_in)
    h = keras.layers.Add(name="inner_add")([h, inner_in])
    block = keras.Model(inner_in, h, name="block")
    head = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu", name="h1"), keras.layers.Dense(3, name="h2")],
        name="head",
    )
    inp = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 1, name="proj")(inp)
    x = block(x)
    x = keras.layers.GlobalMaxPooling2D(name="gmp")(x)
    return keras.Model(inp, head(x), name="nested")


def shared() -> keras.Model:
    """One Dense layer called twice (two nodes), outputs combined."""
    keras.utils.set_random_seed(5)
    inp = keras.Input((7,))
    dense = keras.layers.Dense(7, activation="sigmoid", name="shared")
    x = dense(inp)
    x = dense(x)
    y = keras.layers.Dense(7, name="side")(inp)
    z = keras.layers.Multiply(name="mul")([x, y])
    return keras.Model(inp, keras.layers.Dense(3, name="out")(z), name="shared_model")


def sequential() -> keras.Model:
    keras.utils.set_random_seed(6)
    return keras.Sequential(
        [
            keras.Input((9, 9, 2)),
            keras.layers.Conv2D(3, 3, activation="relu", name="c"),
            keras.layers.AveragePooling2D(2, name="avg"),
            keras.layers.Flatten(name="f"),
            keras.layers.Dense(4, activation="softmax", name="d"),
        ],
        name="seq",
    )


def tiny_cnn(seed: int = 0) -> keras.Model:
    """A 12x12 CNN with a fused ReLU and a softmax head (the Session and GUI tests' model)."""
    keras.utils.set_random_seed(seed)
    i = keras.Input((12, 12, 3), name="img")
    h = keras.layers.Conv2D(4, 3, activation="relu", name="c1")(i)
    h = keras.layers.Conv2D(5, 3, name="c2")(h)
    h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
    o = keras.layers.Dense(3, activation="softmax", name="out")(h)
    return keras.Model(i, o, name="tiny")


FIXTURES = {
    "chain": chain,
    "residual": residual,
    "concat": concat,
    "nested": nested,
    "shared": shared,
    "sequential": sequential,
}


def _randomize_bn(model: keras.Model) -> keras.Model:
    """Give BatchNorm non-trivial statistics so inference BN is not the identity."""
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            n = layer.gamma.shape[0]
            layer.set_weights(
                [rng.uniform(0.5, 1.5, n), rng.normal(0, 0.2, n), rng.normal(0, 0.3, n), rng.uniform(0.5, 2.0, n)]
            )
    return model


def sample_input(model: keras.Model, batch: int, seed: int = 0) -> np.ndarray:
    shape = (batch,) + tuple(model.inputs[0].shape[1:])
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def logits_model(model: keras.Model) -> keras.Model:
    """A clone ending at the pre-softmax logits (an independent path: plain Keras, no gradscope code)."""
    last = model.layers[-1]

    def clone(layer):
        cfg = layer.get_config()
        if layer is last and cfg.get("activation") == "softmax":
            cfg["activation"] = "linear"
        return layer.__class__.from_config(cfg)

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    return copy


def tape_input_gradient(model: keras.Model, x: np.ndarray, index: int) -> np.ndarray:
    """d(sum over the batch of output ``index``)/d(input) with a plain tf.GradientTape (no gradscope code)."""
    xt = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        score = tf.reduce_sum(model(xt)[:, index])
    return tape.gradient(score, xt).numpy()
