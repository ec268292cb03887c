"""Layers made of layers (a user's transformer block, keras_hub's encoder) open as their sublayers, so rules apply
inside them; the opened graph computes what the layer computes (identity plan = tape gradient), masks included;
a layer that cannot be opened stays one exact node and the graph says why."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import keras, tf
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.methods import build_method
from gradscope.rules.plan import Plan

T, D, V = 6, 8, 30


@keras.saving.register_keras_serializable("gradscope_composite")
class PaddedEncoder(keras.layers.Layer):
    """keras_hub's TransformerEncoder in small: the padding mask arrives as a keyword tensor and becomes the
    attention mask through keras.ops."""

    def __init__(self, bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.bias = bias
        self.att = keras.layers.MultiHeadAttention(2, D // 2, use_bias=bias, name="att")
        self.ln1 = keras.layers.LayerNormalization(center=bias, name="ln1")
        self.ff1 = keras.layers.Dense(16, activation="relu", use_bias=bias, name="ff1")
        self.ff2 = keras.layers.Dense(D, use_bias=bias, name="ff2")
        self.ln2 = keras.layers.LayerNormalization(center=bias, name="ln2")

    def call(self, x, padding_mask=None):
        mask = None if padding_mask is None else keras.ops.cast(padding_mask[:, None, :], "bool")
        h = self.ln1(x + self.att(x, x, attention_mask=mask))
        return self.ln2(h + self.ff2(self.ff1(h)))

    def get_config(self):
        return {**super().get_config(), "bias": self.bias}


def padded_model(bias: bool = True, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    ids = keras.Input((T,), dtype="int32", name="token_ids")
    pad = keras.Input((T,), dtype="int32", name="padding_mask")
    e = keras.layers.Embedding(V, D, name="embed")(ids)
    h = PaddedEncoder(bias=bias, name="encoder")(e, padding_mask=pad)
    p = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    return keras.Model([ids, pad], keras.layers.Dense(3, use_bias=bias, name="out")(p))


IDS = np.array([[3, 7, 1, 12, 0, 0]])
PAD = np.array([[1, 1, 1, 1, 0, 0]])


def test_a_composite_layer_opens_as_its_sublayers():
    engine = Engine(padded_model())
    ids = {n.id for n in engine.graph.nodes}
    assert {"encoder/att", "encoder/ln1", "encoder/ff1", "encoder/ff2", "encoder/ln2"} <= ids
    assert "encoder" in engine.graph.groups and not engine.graph.notes


def test_the_opened_layer_computes_the_layer_and_its_true_gradient(tmp_path):
    model = padded_model()
    path = tmp_path / "padded.keras"
    model.save(path)
    from gradscope.io.models import load_model

    model = load_model(path)  # as a user opens it: the layer class from its registration
    engine = Engine(model, strip_softmax=False)
    xs = [IDS.astype("float32"), PAD.astype("float32")]
    result = engine.backward(xs, Target(index=1), Plan(), capture=["embed"])
    np.testing.assert_allclose(result.logits, model([IDS, PAD]).numpy(), rtol=1e-5, atol=1e-6)
    e = model.get_layer("embed")(IDS)
    with tf.GradientTape() as tape:
        tape.watch(e)
        h = model.get_layer("encoder")(e, padding_mask=PAD)
        score = tf.reduce_sum(model.get_layer("out")(model.get_layer("pool")(h))[:, 1])
    np.testing.assert_allclose(result.node_grads["embed"], tape.gradient(score, e).numpy(), rtol=1e-5, atol=1e-6)
    # the mask matters: without it the output differs, so the equality above saw it
    assert not np.allclose(model([IDS, np.ones_like(PAD)]).numpy(), result.logits, atol=1e-4)


@pytest.mark.parametrize("preset", ["attnlrp", "cp_lrp"])
def test_transformer_rules_reach_inside_the_layer(preset):
    engine = Engine(padded_model())
    method = build_method(preset, engine.graph)
    assert {"encoder/att", "encoder/ln1", "encoder/ln2"} <= set(method.changed)
    result = engine.backward([IDS.astype("float32"), PAD.astype("float32")], Target(index=0), method.plan)
    assert {"encoder/att", "encoder/ln1"} <= set(result.rules) and not result.warnings()


def test_cp_lrp_is_conservative_through_a_masked_composite_layer():
    """Bias-free, ReLU feed-forward: the token relevances (signal x embedding at the embedding) sum to the
    logit, with the padding mask applied inside the opened layer."""
    model = padded_model(bias=False, seed=3)
    engine = Engine(model)
    plan = build_method("cp_lrp", engine.graph).plan
    xs = [IDS.astype("float32"), PAD.astype("float32")]
    logits = model([IDS, PAD]).numpy()[0]
    e = model.get_layer("embed")(IDS).numpy()
    for cls in range(3):
        g = engine.backward(xs, Target(index=cls), plan, capture=["embed"]).node_grads["embed"]
        assert float((g * e).sum()) == pytest.approx(float(logits[cls]), rel=1e-4, abs=1e-6)


@keras.saving.register_keras_serializable("gradscope_composite")
class RawTF(keras.layers.Layer):
    """A raw ``tf`` op in call(): runs in Keras's own (TensorFlow) shape inference, not on Keras tensors."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.d = keras.layers.Dense(4, name="d")

    def call(self, x):
        return tf.nn.relu(self.d(x))


@keras.saving.register_keras_serializable("gradscope_composite")
class MaskTaker(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.d = keras.layers.Dense(4, name="d")

    def call(self, x, mask=None):
        out = self.d(x)
        return out if mask is None else out * keras.ops.cast(mask[..., None], out.dtype)


def test_a_layer_that_cannot_open_stays_one_exact_node_and_the_graph_says_why():
    keras.utils.set_random_seed(4)
    inp = keras.Input((5,))
    raw = keras.Model(inp, keras.layers.Dense(2, name="out")(RawTF(name="raw")(inp)))
    engine = Engine(raw, strip_softmax=False)
    assert engine.graph.node("raw").op_type == "RawTF"
    assert any("'raw'" in note and "symbolic" in note for note in engine.graph.notes)
    x = np.random.default_rng(0).standard_normal((2, 5)).astype("float32")
    np.testing.assert_allclose(engine.backward([x], Target(index=1), Plan()).logits, raw(x).numpy(), rtol=1e-6)


def test_a_layer_given_a_keras_mask_opens_with_the_mask_as_a_node():
    """Keras 3 records an Embedding's ``mask_zero`` mask as an op in the graph and passes it as ``mask=``."""
    keras.utils.set_random_seed(5)
    ids = keras.Input((T,), dtype="int32")
    masked = keras.layers.Embedding(V, D, mask_zero=True, name="embed")(ids)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(MaskTaker(name="taker")(masked))
    model = keras.Model(ids, keras.layers.Dense(2, name="out")(pooled))
    engine = Engine(model, strip_softmax=False)
    assert "taker/d" in engine.graph and not engine.graph.notes
    result = engine.backward([IDS.astype("float32")], Target(index=1), Plan(), capture=["embed"])
    np.testing.assert_allclose(result.logits, model(IDS).numpy(), rtol=1e-5, atol=1e-6)
    e = model.get_layer("embed")(IDS)
    with tf.GradientTape() as tape:
        tape.watch(e)
        h = model.get_layer("taker")(e, mask=tf.not_equal(IDS, 0))
        score = tf.reduce_sum(model.get_layer("out")(model.get_layer("pool")(h))[:, 1])
    np.testing.assert_allclose(result.node_grads["embed"], tape.gradient(score, e).numpy(), rtol=1e-5, atol=1e-6)
    assert np.abs(result.node_grads["embed"][0, 4:]).max() == 0.0  # the padded positions were masked out


def test_token_ids_explain_a_bert_style_model_with_the_padding_mask_derived():
    """Typed ids feed a model that also takes a padding mask (keras_hub's convention): the mask is made from
    them, and CP-LRP's token scores sum to the logit computed with that mask."""
    import gradscope.api as gs

    model = padded_model(bias=False, seed=3)
    logits = model([IDS, PAD]).numpy()[0]
    ex = gs.explain(model, np.array([3, 7, 1, 12]), method="cp_lrp", target=2)
    assert ex.node == "embed" and ex.saliency.shape[0] >= 4
    assert float(ex.saliency.sum()) == pytest.approx(float(logits[2]), rel=1e-4, abs=1e-6)


def test_a_layer_keras_would_hand_an_unrecorded_mask_stays_whole():
    """Where a Keras records no ``mask=`` in the call (older 3.x), a symbolic run of call() would drop the
    mask: such a layer is not opened."""
    from types import SimpleNamespace

    from gradscope.engine.backward.keras_graph import _has_implicit_mask

    masked = SimpleNamespace(_keras_mask=object())
    node = SimpleNamespace(arguments=SimpleNamespace(kwargs={}), input_tensors=[masked])
    assert _has_implicit_mask(MaskTaker(), node)
    given = SimpleNamespace(arguments=SimpleNamespace(kwargs={"mask": object()}), input_tensors=[masked])
    assert not _has_implicit_mask(MaskTaker(), given)
    assert not _has_implicit_mask(RawTF(), node)  # its call takes no mask
