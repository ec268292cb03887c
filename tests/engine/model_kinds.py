"""Small versions of the model kinds users bring, one builder each (the guide docs/models.md is checked against
what ``tests/engine/backward/test_model_kinds.py`` measures on these)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gradscope.backend import keras
from tests.engine import fixtures


@keras.saving.register_keras_serializable("gradscope_kinds")
class SubclassedNet(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.c1 = keras.layers.Conv2D(4, 3, activation="relu", name="c1")
        self.gap = keras.layers.GlobalAveragePooling2D(name="gap")
        self.head = keras.layers.Dense(3, name="head")

    def call(self, x):
        return self.head(self.gap(keras.ops.relu(self.c1(x)) * 0.5))


def subclassed() -> keras.Model:
    keras.utils.set_random_seed(11)
    model = SubclassedNet(name="subclassed")
    model(np.zeros((1, 8, 8, 3), "float32"))
    return model


def recurrent() -> keras.Model:
    keras.utils.set_random_seed(12)
    inp = keras.Input((6, 4))
    x = keras.layers.LSTM(5, return_sequences=True, name="lstm")(inp)
    x = keras.layers.Bidirectional(keras.layers.GRU(3), name="bigru")(x)
    return keras.Model(inp, keras.layers.Dense(3, name="out")(x), name="recurrent")


def text() -> keras.Model:
    keras.utils.set_random_seed(13)
    inp = keras.Input((7,), dtype="int32")
    x = keras.layers.Embedding(20, 4, name="emb")(inp)
    x = keras.layers.LSTM(5, name="lstm")(x)
    return keras.Model(inp, keras.layers.Dense(3, name="out")(x), name="text")


def transformer() -> keras.Model:
    keras.utils.set_random_seed(14)
    inp = keras.Input((5, 8))
    att = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")(inp, inp)
    x = keras.layers.LayerNormalization(name="ln")(keras.layers.Add(name="res")([inp, att]))
    x = keras.layers.Dense(8, activation="gelu", name="ffn")(x)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    return keras.Model(inp, keras.layers.Dense(3, name="out")(x), name="transformer")


@keras.saving.register_keras_serializable("gradscope_kinds")
class TransformerBlock(keras.layers.Layer):
    """keras.io's text-classification block (a Layer made of layers), with a causal mask."""

    def __init__(self, width: int = 8, heads: int = 2, hidden: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.width, self.heads, self.hidden = width, heads, hidden
        self.att = keras.layers.MultiHeadAttention(heads, width // heads, name="att")
        self.ffn = keras.Sequential(
            [keras.layers.Dense(hidden, activation="relu", name="ff1"), keras.layers.Dense(width, name="ff2")],
            name="ffn",
        )
        self.ln1 = keras.layers.LayerNormalization(epsilon=1e-6, name="ln1")
        self.ln2 = keras.layers.LayerNormalization(epsilon=1e-6, name="ln2")
        self.drop = keras.layers.Dropout(0.1, name="drop")

    def call(self, x, training=False):
        h = self.ln1(x + self.drop(self.att(x, x, use_causal_mask=True), training=training))
        return self.ln2(h + self.ffn(h))

    def get_config(self):
        return {**super().get_config(), "width": self.width, "heads": self.heads, "hidden": self.hidden}


def custom_block() -> keras.Model:
    keras.utils.set_random_seed(18)
    inp = keras.Input((5, 8))
    x = TransformerBlock(name="block")(inp)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    return keras.Model(inp, keras.layers.Dense(3, name="out")(x), name="custom_block")


def audio() -> keras.Model:
    keras.utils.set_random_seed(15)
    inp = keras.Input((32, 2))
    x = keras.layers.Conv1D(4, 5, activation="relu", name="c1")(inp)
    x = keras.layers.MaxPooling1D(2, name="pool")(x)
    x = keras.layers.Conv1D(4, 3, activation="relu", name="c2")(x)
    x = keras.layers.GlobalAveragePooling1D(name="gap")(x)
    return keras.Model(inp, keras.layers.Dense(3, name="out")(x), name="audio")


def multi_io() -> keras.Model:
    keras.utils.set_random_seed(16)
    a, b = keras.Input((6,), name="a"), keras.Input((4,), name="b")
    h = keras.layers.Concatenate(name="cat")([keras.layers.Dense(5, activation="relu", name="da")(a), b])
    out1 = keras.layers.Dense(3, name="out1")(h)
    out2 = keras.layers.Dense(2, name="out2")(h)
    return keras.Model([a, b], [out1, out2], name="multi_io")


def time_distributed() -> keras.Model:
    keras.utils.set_random_seed(17)
    inp = keras.Input((3, 6, 6, 1))
    x = keras.layers.TimeDistributed(keras.layers.Conv2D(2, 3, activation="relu"), name="td_conv")(inp)
    x = keras.layers.TimeDistributed(keras.layers.Flatten(), name="td_flat")(x)
    x = keras.layers.GRU(4, name="gru")(x)
    return keras.Model(inp, keras.layers.Dense(3, name="out")(x), name="time_distributed")


#: the guide's row name -> builder. Order = its table's order.
KINDS: dict[str, Callable[[], keras.Model]] = {
    "CNN (Sequential, BatchNorm, pooling)": fixtures.chain,
    "residual (ResNet-style Add)": fixtures.residual,
    "concatenation + keras.ops (DenseNet-style)": fixtures.concat,
    "nested functional / Sequential models": fixtures.nested,
    "shared layers (one layer, two calls)": fixtures.shared,
    "subclassed keras.Model (layers + keras.ops)": subclassed,
    "recurrent (LSTM, Bidirectional GRU)": recurrent,
    "text (Embedding + LSTM, integer input)": text,
    "Transformer block (MultiHeadAttention, LayerNorm, GELU)": transformer,
    "Transformer block as a custom Layer (keras.io style, causal mask)": custom_block,
    "1-D audio (Conv1D)": audio,
    "multi-input / multi-output": multi_io,
    "TimeDistributed + GRU": time_distributed,
}


def inputs_for(engine, batch: int = 2, seed: int = 0) -> list[np.ndarray]:
    """A seeded batch for each model input (token ids below 20 for integer inputs)."""
    rng = np.random.default_rng(seed)
    out = []
    for node_id in engine.graph.input_ids:
        node = engine.graph.node(node_id)
        shape = (batch, *node.output_shape[1:])
        integer = "int" in node.dtype
        out.append(
            rng.integers(0, 20, shape).astype("float32") if integer else rng.normal(size=shape).astype("float32")
        )
    return out
