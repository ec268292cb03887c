"""The AttnLRP / CP-LRP rules on language-model pieces (issue 37), each against a slow NumPy reference
(``reference_lm``) inside the engine on a real keras_hub model, and their guarantees: the uniform product and the
identity rule pass relevance unchanged, CP-LRP token relevances sum to the logit on a bias-free Llama and Gemma,
a rule that meets a layer it cannot handle is one line naming the class, a block that stayed closed is named."""

from __future__ import annotations

import numpy as np
import pytest

import gradscope.api as gs
from gradscope.core.errors import RuleError
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.plan import Plan
from tests.engine.backward.language_models import feed, tiny_causal_lm
from tests.rules import reference_lm as ref

pytest.importorskip("keras_hub")
keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

IDS = [5, 17, 3, 9, 12, 1, 7, 2]


@pytest.fixture(scope="module")
def llama():
    model = tiny_causal_lm("llama3", seed=3)
    model(feed(IDS))
    return model, Engine(model)


def _signals(engine, plan, nodes, position=6, token=11):
    xs = [feed(IDS)[i] for i in engine.graph.input_ids]
    target = Target(kind="neuron", node=engine.graph.output_ids[0], neuron=(position, token))
    return engine.backward(xs, target, plan, capture=list(nodes))


@pytest.mark.parametrize(("rule", "factors"), [("attention_lrp", (0.25, 0.25, 0.5)), ("attention_cp", (0, 0, 1))])
def test_attention_rules_on_llama_attention_match_the_reference(llama, rule, factors):
    """Rotary embedding, 4 query heads on 2 key/value heads, causal mask: the rule's gradient at the attention's
    input equals the reference's hand-written backward with q, k, v scaled."""
    model, engine = llama
    block = f"{model.backbone.name}/transformer_layer_1"  # llama3_backbone, or _1 after another in this process
    attention, norm = f"{block}/self_attention", f"{block}/self_attention_layernorm"
    result = _signals(engine, Plan().with_entry(attention, rule), [attention, norm])
    layer = model.backbone.get_layer("transformer_layer_1")._self_attention_layer
    w = {
        "q": layer._query_dense.kernel.numpy(),
        "k": layer._key_dense.kernel.numpy(),
        "v": layer._value_dense.kernel.numpy(),
        "o": layer._output_dense.kernel.numpy(),
    }
    w = {k: v.astype(np.float64) for k, v in w.items()}
    x = result.node_values[norm][0].astype(np.float64)
    causal = np.tril(np.ones((len(IDS), len(IDS))))
    forward = ref.llama_attention(w, x, causal, layer.rope_max_wavelength)
    np.testing.assert_allclose(forward["y"], result.node_values[attention][0], rtol=1e-4, atol=1e-5)
    g = result.node_grads[attention][0].astype(np.float64)
    want = ref.llama_attention_backward(w, x, forward, g, factors, layer.rope_max_wavelength)
    np.testing.assert_allclose(result.node_grads[norm][0], want, rtol=1e-3, atol=1e-5 * np.abs(want).max())
    if rule == "attention_cp":  # q and k held: the probabilities are data, A·V linear in V (bias-free): conserved
        assert (x * result.node_grads[norm][0]).sum() == pytest.approx((forward["y"] * g).sum(), rel=1e-4)


@pytest.mark.parametrize("family", ["llama3", "gemma"])
def test_norm_constant_on_keras_hub_rms_norms_matches_the_reference(family):
    """Llama's ``x·s·w`` and Gemma's ``x·s·(1 + w)``: the normaliser constant, the scale read off the layer."""
    model = tiny_causal_lm(family, seed=4)
    model(feed(IDS))
    engine = Engine(model)
    norm = next(n for n in engine.graph.nodes if n.op_type.endswith(("LayerNorm", "Normalization")) and "/" in n.id)
    layer = engine.exec.operations[norm.id]
    layer.variables[0].assign(np.random.default_rng(5).normal(size=layer.variables[0].shape).astype(np.float32))
    result = _signals(engine, Plan().with_entry(norm.id, "norm_constant"), [norm.id, norm.inputs[0]])
    x = result.node_values[norm.inputs[0]][0].astype(np.float64)
    g = result.node_grads[norm.id][0].astype(np.float64)
    w = layer.variables[0].numpy().astype(np.float64)
    scale = 1.0 + w if family == "gemma" else w
    want = ref.rms_constant_vjp(x, g, scale, layer.epsilon)
    consumers = [n for n in engine.graph.nodes if norm.inputs[0] in n.inputs]
    if len(consumers) == 1:  # the norm's input feeds only the norm: its signal is the rule's output
        np.testing.assert_allclose(result.node_grads[norm.inputs[0]][0], want, rtol=1e-4, atol=1e-7)
    else:  # a residual also reads it: compare the rule's own contribution
        got = _rule_output(engine, norm.id, x, g)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


def _rule_output(engine, node_id, x, g):
    from gradscope.engine.backward.context import RuleContext
    from gradscope.rules.base import get_rule_class

    layer = engine.exec.operations[node_id]
    weights = [v.value for v in layer.variables]

    def forward(xs, ws):
        with keras.StatelessScope(state_mapping=list(zip(layer.variables, ws))):
            return [layer(xs[0])]

    xt = tf.constant(x[None], tf.float32)
    names = [v.path.split("/")[-1] for v in layer.variables]
    ctx = RuleContext(engine.graph.node(node_id), layer, [xt], forward([xt], weights), weights, names, forward)
    return get_rule_class("norm_constant")().backward(ctx, [tf.constant(g[None], tf.float32)])[0].numpy()[0]


def test_gated_products_uniform_and_gate_constant_match_the_reference(llama):
    model, engine = llama
    product = f"{model.backbone.name}/transformer_layer_0/multiply"
    node = engine.graph.node(product)
    for rule, params in (("product_uniform", {}), ("product_gate_constant", {"gate": 1})):
        result = _signals(engine, Plan().with_entry(product, rule, params), [product, *node.inputs])
        a, b = (result.node_values[i][0].astype(np.float64) for i in node.inputs)
        g = result.node_grads[product][0].astype(np.float64)
        if rule == "product_uniform":
            want = [0.5 * g * b, 0.5 * g * a]
            relevance = a * want[0] + b * want[1]
            np.testing.assert_allclose(relevance, a * b * g, rtol=1e-5, atol=1e-9)  # R_a + R_b = R_y
        else:  # input 1 is the gate, cast(silu(gate)): it gets nothing, the up projection all of g·gate
            want = [g * b, np.zeros_like(g)]
        for i, w in zip(node.inputs, want):
            consumers = [n for n in engine.graph.nodes if i in n.inputs]
            assert consumers == [node]
            np.testing.assert_allclose(result.node_grads[i][0], w, rtol=1e-4, atol=1e-6 * (np.abs(w).max() + 1e-12))


def test_the_identity_rule_covers_keras_hub_gelu_approximate():
    """keras_hub's BERT and GPT-2 use the tanh GELU: the preset's identity rule once missed it (issue 37)."""
    from keras_hub.src.utils.keras_utils import gelu_approximate

    i = keras.Input((4, 8))
    model = keras.Model(i, keras.layers.Dense(8, activation=gelu_approximate, name="ff")(i))
    engine = Engine(model)
    assert engine.graph.node("ff").activation == "gelu_approximate"
    plan = gs.build_method("attnlrp", engine.graph).plan
    assert plan.resolve(engine.graph).rules["ff"].rule.name == "act_identity"


@pytest.mark.parametrize("family", ["llama3", "gemma", "mistral"])
def test_cp_lrp_token_relevances_sum_to_the_logit_on_bias_free_language_models(family):
    """No bias anywhere (Llama, Mistral, Gemma), the probabilities and normalisers constant, the gate held:
    every rule conserves, so the token relevances add up to the target logit."""
    model = tiny_causal_lm(family, seed=6)
    inputs = feed(IDS)
    logits = model(inputs).numpy()[0]
    engine = Engine(model)
    for position, token in ((7, int(np.argmax(logits[7]))), (3, 5)):
        target = Target(kind="neuron", node=engine.graph.output_ids[0], neuron=(position, token))
        ex = gs.explain(engine, np.array(IDS), method="cp_lrp", target=target)
        assert ex.saliency.sum() == pytest.approx(float(logits[position, token]), rel=1e-4, abs=1e-6)
        assert not ex.warnings


def test_a_rule_meeting_a_layer_it_cannot_handle_names_the_class():
    class LpRMSNorm(keras.layers.Layer):  # named like an RMS norm, but a norm the rule does not reproduce
        def build(self, shape):
            self.epsilon = 1e-6
            self.scale = self.add_weight(shape=(shape[-1],), initializer="ones")

        def call(self, x):
            return x / (keras.ops.mean(keras.ops.abs(x), axis=-1, keepdims=True) + self.epsilon) * self.scale

    class TinyAttention(keras.layers.Layer):  # an attention without query/key/value projections
        def call(self, x):
            return keras.ops.softmax(keras.ops.einsum("btd,bsd->bts", x, x)) @ x

    i = keras.Input((4, 8))
    model = keras.Model(i, TinyAttention(name="att")(LpRMSNorm(name="lp")(i)))
    engine = Engine(model)
    x = np.random.default_rng(1).normal(size=(1, 4, 8)).astype(np.float32)
    for node, rule, says in (("lp", "norm_constant", "LpRMSNorm"), ("att", "attention_lrp", "TinyAttention")):
        with pytest.raises(RuleError, match=says) as err:
            engine.backward(x, Target(kind="neuron", node="att", neuron=(0, 0)), Plan().with_entry(node, rule))
        assert "\n" not in str(err.value).split(". ")[0]


def test_a_block_that_stays_closed_is_named_by_the_presets():
    class Opaque(keras.layers.Layer):  # a composite whose call cannot run on Keras tensors: one node
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.norm = keras.layers.LayerNormalization()
            self.dense = keras.layers.Dense(8)

        def call(self, x):
            return tf.nn.relu(self.dense(self.norm(x)))  # a raw TensorFlow op

    i = keras.Input((4, 8))
    model = keras.Model(i, keras.layers.Dense(2, name="out")(Opaque(name="block")(i)[:, 0]))
    engine = Engine(model)
    for method in ("attnlrp", "cp_lrp"):
        warnings = gs.build_method(method, engine.graph).warnings
        assert any("'block' (Opaque) stayed one node" in w and "plain gradient" in w for w in warnings)
