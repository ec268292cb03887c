"""AttnLRP and CP-LRP rules (issue 23, item 3) against slow NumPy references in the papers' relevance form, and
their guarantees: CP-LRP token relevances sum to the logit on a bias-free transformer with ReLU feed-forward
blocks; each rule's re-run equals the layer; the presets and the sanity checks run them."""

from __future__ import annotations

import numpy as np
import pytest

import gradscope.api as gs
from tests.rules import reference_transformer as ref

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

T, D, V = 6, 8, 30


def tiny_transformer(*, bias: bool, act: str, seed: int = 0) -> keras.Model:
    """Embedding -> self-attention + residual -> LayerNorm -> feed-forward + residual -> LayerNorm -> classifier."""
    keras.utils.set_random_seed(seed)
    i = keras.Input((T,), dtype="int32", name="tokens")
    e = keras.layers.Embedding(V, D, name="embed")(i)
    a = keras.layers.MultiHeadAttention(2, 4, use_bias=bias, name="mha")(e, e)
    h = keras.layers.LayerNormalization(center=bias, name="ln1")(keras.layers.Add(name="res1")([e, a]))
    f = keras.layers.Dense(16, activation=act, use_bias=bias, name="ff1")(h)
    f = keras.layers.Dense(D, use_bias=bias, name="ff2")(f)
    h = keras.layers.LayerNormalization(center=bias, name="ln2")(keras.layers.Add(name="res2")([h, f]))
    p = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    return keras.Model(i, keras.layers.Dense(3, use_bias=bias, name="out")(p))


@pytest.fixture(scope="module")
def mha():
    import gradscope.rules.builtin.transformer  # noqa: F401  (registers the rules)

    keras.utils.set_random_seed(5)
    layer = keras.layers.MultiHeadAttention(2, 4, name="mha")
    x = np.random.default_rng(0).standard_normal((1, T, D)).astype(np.float32)
    layer(x, x)
    for var in layer.variables:  # non-zero biases, so the ε rule's bias handling is exercised
        if "bias" in var.path:
            var.assign(np.random.default_rng(1).standard_normal(var.shape).astype(np.float32) * 0.3)
    return layer, x


def rule_relevance(layer, x, mode, eps, r_y, mask=None):
    """The rule's gradient form, turned into relevance: R_in = x ⊙ g_in with the seed g = R_y / y."""
    from gradscope.rules.builtin.attention import attention

    xs = [tf.constant(x), tf.constant(x)]
    with tf.GradientTape() as tape:
        for t in xs:
            tape.watch(t)
        y = attention(layer, {"query": xs[0], "value": xs[1], "attention_mask": mask}, mode, eps)
    seed = tf.constant((r_y / y.numpy()[0])[None], tf.float32)
    g = tape.gradient(y, xs, output_gradients=seed, unconnected_gradients="zero")
    return y.numpy()[0], [x[0] * gi.numpy()[0] for gi in g]


def test_the_reference_forward_is_keras_multi_head_attention(mha):
    layer, x = mha
    w = ref.mha_weights(layer)
    np.testing.assert_allclose(ref.mha_forward(w, x[0], x[0])["y"], layer(x, x).numpy()[0], rtol=1e-4, atol=1e-5)
    from gradscope.rules.builtin.attention import attention

    for mode in ("", "attnlrp", "cp"):  # every mode re-runs the same values; only the gradients differ
        y = attention(layer, {"query": x, "value": x}, mode, 1e-6)
        np.testing.assert_allclose(y.numpy(), layer(x, x).numpy(), atol=1e-5)


@pytest.mark.parametrize("eps", [1e-6, 0.05])
def test_attnlrp_attention_matches_the_relevance_form_reference(mha, eps):
    layer, x = mha
    r_y = np.random.default_rng(3).standard_normal((T, D))
    y, (r_q, r_v) = rule_relevance(layer, x, "attnlrp", eps, r_y)
    want_q, want_v = ref.attnlrp_mha_relevance(ref.mha_weights(layer), x[0].astype(np.float64), x[0], r_y, eps)
    np.testing.assert_allclose(r_q, want_q, rtol=2e-3, atol=2e-5)
    np.testing.assert_allclose(r_v, want_v, rtol=2e-3, atol=2e-5)


def random_mask(seed: int) -> np.ndarray:
    """(1, T, T) attention mask with some keys hidden from each query (every query sees at least one key)."""
    mask = np.random.default_rng(seed).random((1, T, T)) > 0.4
    mask[0, np.arange(T), np.arange(T)] = True
    return mask


@pytest.mark.parametrize("mode", ["attnlrp", "cp"])
def test_masked_attention_matches_the_reference_and_masked_keys_get_no_relevance(mha, mode):
    layer, x = mha
    mask = random_mask(11)
    np.testing.assert_allclose(  # the re-run is the layer's own masked output
        ref.mha_forward(ref.mha_weights(layer), x[0], x[0], mask[0])["y"],
        layer(x, x, attention_mask=mask).numpy()[0],
        rtol=1e-4,
        atol=1e-5,
    )
    r_y = np.random.default_rng(12).standard_normal((T, D))
    _, (r_q, r_v) = rule_relevance(layer, x, mode, 1e-6, r_y, mask)
    w, x64 = ref.mha_weights(layer), x[0].astype(np.float64)
    if mode == "attnlrp":
        want_q, want_v = ref.attnlrp_mha_relevance(w, x64, x[0], r_y, 1e-6, mask[0])
    else:
        want_q, want_v = ref.cp_mha_relevance(w, x64, x[0], r_y, mask[0])
    np.testing.assert_allclose(r_q, want_q, rtol=2e-3, atol=2e-5)
    np.testing.assert_allclose(r_v, want_v, rtol=2e-3, atol=2e-5)
    # a key no query may see passes relevance only through its own query path, never as a value
    hidden = random_mask(11)[0].copy()
    hidden[:, 2] = False
    hidden[2, 2] = False
    hidden[2, 3] = True
    _, (_, r_v_hidden) = rule_relevance(layer, x, "cp", 0.0, r_y, hidden[None])
    assert np.abs(r_v_hidden[2]).max() == 0.0


def test_cp_attention_matches_the_reference_and_gives_the_query_nothing():
    import gradscope.rules.builtin.transformer  # noqa: F401

    keras.utils.set_random_seed(6)
    layer = keras.layers.MultiHeadAttention(2, 4, use_bias=False, name="mha")
    x = np.random.default_rng(4).standard_normal((1, T, D)).astype(np.float32)
    layer(x, x)
    r_y = np.random.default_rng(5).standard_normal((T, D))
    y, (r_q, r_v) = rule_relevance(layer, x, "cp", 0.0, r_y)
    want_q, want_v = ref.cp_mha_relevance(ref.mha_weights(layer), x[0].astype(np.float64), x[0], r_y)
    np.testing.assert_allclose(r_q, want_q, atol=1e-7)
    np.testing.assert_allclose(r_v, want_v, rtol=2e-3, atol=2e-5)
    assert r_v.sum() == pytest.approx(r_y.sum(), rel=1e-3)  # bias-free and linear in V: conservative


def _node_backward(model, node, rule, g, **params):
    """A rule's backward on one node of ``model`` through the engine's own context (``RuleContext``)."""
    from gradscope.engine.backward.runner import Engine
    from gradscope.rules.base import get_rule_class

    engine = Engine(model)
    layer = model.get_layer(node)
    x = tf.constant(np.random.default_rng(7).standard_normal((1, T, D)).astype(np.float32))
    from gradscope.engine.backward.context import RuleContext

    weights = [v.value for v in layer.variables]
    names = [v.path.split("/")[-1] for v in layer.variables]

    def forward(xs, ws):
        with keras.StatelessScope(state_mapping=list(zip(layer.variables, ws))):
            return [layer(xs[0])]

    ctx = RuleContext(engine.graph.node(node), layer, [x], forward([x], weights), weights, names, forward)
    rule_class = get_rule_class(rule)
    out = rule_class(rule_class.Params(**params)).backward(ctx, [tf.constant(g)])
    return x.numpy(), ctx.outputs[0].numpy(), out[0].numpy()


def test_layernorm_with_its_scale_held_constant_matches_the_reference():
    keras.utils.set_random_seed(8)
    i = keras.Input((T, D))
    model = keras.Model(i, keras.layers.LayerNormalization(name="ln")(i))
    model.get_layer("ln").gamma.assign(np.linspace(0.5, 2.0, D).astype(np.float32))
    g = np.random.default_rng(9).standard_normal((1, T, D)).astype(np.float32)
    x, _, got = _node_backward(model, "ln", "norm_constant", g)
    gamma = model.get_layer("ln").gamma.numpy()
    want = ref.layernorm_constant_scale_vjp(x.astype(np.float64), g, gamma, model.get_layer("ln").epsilon)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert np.abs(got.sum(axis=-1)).max() < 1e-4  # centering: the signal sums to zero over the features


def test_the_identity_rule_passes_relevance_through_an_activation_unchanged():
    i = keras.Input((T, D))
    model = keras.Model(i, keras.layers.Activation("gelu", name="act")(i))
    g = np.random.default_rng(10).standard_normal((1, T, D)).astype(np.float32)
    x, y, got = _node_backward(model, "act", "act_identity", g, epsilon=0.0)
    np.testing.assert_allclose(x * got, y * g, rtol=1e-4, atol=1e-6)  # R_in = R_out


def test_the_epsilon_rule_in_gradient_form_is_lrp_epsilon():
    keras.utils.set_random_seed(11)
    i = keras.Input((T, D))
    model = keras.Model(i, keras.layers.Dense(5, name="dense")(i))
    model.get_layer("dense").bias.assign(np.full(5, 0.3, np.float32))
    g = np.random.default_rng(12).standard_normal((1, T, 5)).astype(np.float32)
    x, z, got = _node_backward(model, "dense", "epsilon_gx", g, epsilon=0.1)
    w = model.get_layer("dense").kernel.numpy().astype(np.float64)
    r_out = z * g  # relevance at the output; ε rule in relevance form: R_in = x ⊙ Wᵀ(R / stab(z))
    want = x * np.einsum("btk,dk->btd", r_out / ref.stab(z, 0.1), w)
    np.testing.assert_allclose(x * got, want, rtol=1e-4, atol=1e-6)


def test_cp_lrp_token_relevances_sum_to_the_logit_on_a_bias_free_relu_transformer():
    model = tiny_transformer(bias=False, act="relu")
    ids = np.array([3, 7, 1, 12, 29, 4])
    logits = model(ids[None]).numpy()[0]
    for cls in range(3):
        ex = gs.explain(model, ids, target=cls, method="cp_lrp")
        assert set(ex.result.rules) == {"mha", "ln1", "ln2"}
        assert ex.saliency.sum() == pytest.approx(float(logits[cls]), rel=1e-4, abs=1e-6)
    plain = gs.explain(model, ids, target=0)  # gradient x input is not conservative here (softmax, LayerNorm)
    assert abs(plain.saliency.sum() - logits[0]) > 1e-3


def test_the_attnlrp_preset_puts_a_rule_on_every_transformer_part():
    model = tiny_transformer(bias=True, act="gelu")
    ids = np.array([3, 7, 1, 12, 29, 4])
    ex = gs.explain(model, ids, target=1, method="attnlrp")
    rules = {"mha": "attention_lrp", "ln1": "norm_constant", "ln2": "norm_constant", "ff1": "act_identity"}
    assert ex.result.rules == rules  # linear layers plain, as LXT leaves them
    with_epsilon = gs.explain(model, ids, target=1, method="attnlrp", method_options={"epsilon": 1e-6})
    assert with_epsilon.result.rules == {**rules, "ff1:pre": "epsilon_gx", "ff2": "epsilon_gx", "out": "epsilon_gx"}
    assert ex.method.times_input and ex.method.signed and not ex.warnings and np.isfinite(ex.saliency).all()
    again = gs.explain(model, ids, target=1, method="attnlrp")  # deterministic
    np.testing.assert_array_equal(ex.saliency, again.saliency)


def test_the_sanity_checks_cover_the_transformer_presets():
    from gradscope.engine.backward.runner import Engine
    from gradscope.engine.diagnostics.sanity import sanity_checks
    from gradscope.rules.methods import build_method

    model = tiny_transformer(bias=False, act="relu")
    engine = Engine(model)
    x = np.array([[3, 7, 1, 12, 29, 4]])
    for name in ("cp_lrp", "attnlrp"):
        report = sanity_checks(engine, x, gs.Target(index=0), build_method(name, engine.graph).plan, method=name)
        assert report.conservation and report.randomisation is not None, name
        assert "Traceback" not in report.to_text()


def tiny_vit(seed: int = 0) -> keras.Model:
    """32x32 images in 8x8 patches: 16 tokens (a 4x4 grid), one transformer block, 3 classes."""
    keras.utils.set_random_seed(seed)
    i = keras.Input((32, 32, 3), name="image")
    h = keras.layers.Reshape((16, 16), name="tokens")(keras.layers.Conv2D(16, 8, strides=8, name="patches")(i))
    a = keras.layers.MultiHeadAttention(2, 8, name="mha")(h, h)
    h = keras.layers.LayerNormalization(name="block")(keras.layers.Add(name="res")([h, a]))
    p = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    return keras.Model(i, keras.layers.Dense(3, name="out")(p))


def test_an_image_transformer_gets_a_map_per_patch_and_grad_cam_on_its_token_grid():
    model = tiny_vit()
    image = (np.random.default_rng(13).random((32, 32, 3)) * 255).astype(np.uint8)
    ex = gs.explain(model, image, method="grad_cam", layer="block", target=2)
    assert ex.saliency.shape == (4, 4) and ex.node == "block"
    # Selvaraju's formula on the block's tokens laid out as the 4x4 grid of patches they come from
    x = tf.constant(image[None].astype(np.float32) / 255.0)
    tokens = keras.Model(model.input, model.get_layer("block").output)
    head = keras.Model(model.get_layer("block").output, model.output)
    a = tokens(x)
    with tf.GradientTape() as tape:
        tape.watch(a)
        logit = head(a)[0, 2]
    g = tape.gradient(logit, a).numpy()[0]
    cam = np.maximum((g.mean(axis=0) * a.numpy()[0]).sum(axis=-1), 0).reshape(4, 4)
    np.testing.assert_allclose(ex.saliency, cam, rtol=1e-4, atol=1e-6)
    shown = ex.images()
    assert shown.spatial and shown.blend is not None and shown.blend.shape == (32, 32, 3)
    attn = gs.explain(model, image, method="attnlrp", target=2)  # at the input: a map per pixel, as for a CNN
    assert attn.saliency.shape == (32, 32) and np.isfinite(attn.saliency).all()


def test_tokens_form_a_grid_only_when_they_are_one():
    from gradscope.render import token_grid

    tokens = np.arange(17 * 2, dtype=np.float32).reshape(17, 2)  # a class token, then 16 patches
    grid = token_grid(tokens)
    assert grid.shape == (4, 4, 2) and grid[0, 0, 0] == tokens[1, 0]  # the class token is left out
    assert token_grid(tokens[1:]).shape == (4, 4, 2) and token_grid(tokens[:7]) is None
    assert token_grid(np.zeros((16,))) is None
