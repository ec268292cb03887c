"""Excitation Backprop (MWP) and contrastive MWP (RULES_SPEC §2.3-2.4).

Checked against the independent NumPy reference (reference_lrp.py) on small seeded nets, and against
invariants that need no reference: MWP mass is 1 at every layer, c-MWP is MWP(W) − MWP(−W) computed on a model
copy with the classifier negated, and MWP is LRP-z⁺ without bias for non-negative inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import keras
from gradscope.core.errors import PlanError
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.methods import available_methods, build_method
from gradscope.rules.plan import Plan
from tests.rules import reference_lrp as ref_lrp

NETS = {
    "conv_net": ref_lrp.conv_net,
    "residual_net": ref_lrp.residual_net,
    "bn_net": ref_lrp.bn_net,
    "exotic_net": ref_lrp.exotic_net,
    "conv1d3d_net": ref_lrp.conv1d3d_net,
}


class Net:
    """A seeded Keras net, its engine and its reference, with two input batches (signed and non-negative)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.model, self.ref, self.classifier = NETS[name]()
        self.engine = Engine(self.model)
        shape = (3,) + tuple(self.model.inputs[0].shape[1:])
        rng = np.random.default_rng(11)
        self.signed = rng.normal(size=shape).astype("float32")
        self.nonneg = rng.uniform(0.05, 1.0, size=shape).astype("float32")
        self.input_id = self.ref.nodes[0].id
        # the node that runs the classifier layer: "<layer>:pre" when it has a fused activation (a softmax)
        self.classifier_node = next(
            n.id for n in self.engine.graph.nodes if n.layer_name == self.classifier and n.fused_with is None
        )

    def run(self, method: str, x: np.ndarray, **options):
        m = build_method(method, self.engine.graph, **options)
        return m, self.engine.backward(x, Target(), m.plan, capture="all")


_CACHE: dict[str, Net] = {}


def get_net(name: str) -> Net:
    if name not in _CACHE:
        _CACHE[name] = Net(name)
    return _CACHE[name]


def assert_matches_reference(net: Net, result, ref_grads: dict, rtol: float = 2e-4) -> int:
    """Every node both sides know, and the input signal; tolerance relative to the largest reference value."""
    n = len(result.input_grad)
    pairs = [(net.input_id, result.input_grad)] + [(k, v) for k, v in result.node_grads.items() if k in ref_grads]
    for node_id, got in pairs:
        want = ref_grads[node_id]
        scale = max(np.abs(want).max(), 1e-12)
        np.testing.assert_allclose(
            got.reshape(n, -1), want, rtol=rtol, atol=rtol * scale, err_msg=f"{net.name}: node {node_id}"
        )
    return len(pairs)


# ---------------------------------------------------------------------------------------------- reference
@pytest.mark.parametrize("name", sorted(NETS))
def test_reference_agrees_with_keras_and_autodiff(name):
    """The reference's forward is the model's (logits) and its plain backward is TF's gradient: it is trusted."""
    net = get_net(name)
    values = net.ref.forward(net.signed)
    _, result = net.run("gradient", net.signed)
    np.testing.assert_allclose(result.logits, values[net.ref.output], rtol=1e-5, atol=1e-5)
    grads = net.ref.backward(values, result.target_indices, "gradient")
    assert assert_matches_reference(net, result, grads, rtol=1e-5) >= 4


@pytest.mark.parametrize("name", sorted(NETS))
def test_mwp_matches_reference(name):
    """Default MWP (``mwp_split`` on signed inputs) at every node, on a signed input batch."""
    net = get_net(name)
    _, result = net.run("mwp", net.signed)
    grads = net.ref.backward(net.ref.forward(net.signed), result.target_indices, "mwp")
    assert assert_matches_reference(net, result, grads) >= 4


@pytest.mark.parametrize("name, mode", [("bn_net", "torchray"), ("conv_net", "clamp")])
def test_mwp_signed_input_options_match_reference(name, mode):
    net = get_net(name)
    _, result = net.run("mwp", net.signed, signed_input=mode)
    grads = net.ref.backward(net.ref.forward(net.signed), result.target_indices, "mwp", signed_input=mode)
    # torchray divides by W₊x of a signed x, which can be close to 0 (ill-conditioned, RULES_SPEC §2.3)
    assert_matches_reference(net, result, grads, rtol=2e-3 if mode == "torchray" else 2e-4)


def test_signed_input_modes_differ_on_signed_and_agree_on_nonneg_input():
    net = get_net("conv_net")
    split = net.run("mwp", net.signed)[1].input_grad
    torchray = net.run("mwp", net.signed, signed_input="torchray")[1].input_grad
    clamp = net.run("mwp", net.signed, signed_input="clamp")[1].input_grad
    assert not np.allclose(split, torchray) and not np.allclose(split, clamp)
    assert (split.reshape(3, -1).sum(1) > 0).all() and np.all(clamp[net.signed < 0] == 0)
    a = net.run("mwp", net.nonneg)[1].input_grad
    b = net.run("mwp", net.nonneg, signed_input="torchray")[1].input_grad
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("name", ["conv_net", "exotic_net"])
def test_cmwp_matches_reference(name):
    net = get_net(name)
    method, result = net.run("cmwp", net.signed)
    values = net.ref.forward(net.signed)
    grads = net.ref.backward(values, result.target_indices, "cmwp", classifier=net.classifier_node)
    assert_matches_reference(net, result, grads)
    assert method.reduction == "sum_clamped" and method.readout_node in result.node_grads


# ---------------------------------------------------------------------------------------------- invariants
def _mass(result, node_id: str) -> np.ndarray:
    return result.node_grads[node_id].reshape(len(result.input_grad), -1).sum(axis=1)


@pytest.mark.parametrize(
    "name, cut_nodes",
    [
        ("conv_net", None),  # a chain: every node below the logits is a cut
        ("residual_net", ("c1:pre", "c1", "add", "relu", "gap", "fc")),
        ("conv1d3d_net", ("cat", "fc")),
    ],
)
def test_mwp_mass_is_one_at_every_layer(name, cut_nodes):
    """x >= 0 and a one-hot seed: Σ MWP = 1 at every layer that all paths cross (RULES_SPEC §2.3).

    MWP drops biases, so mass that reaches a unit excited only by its bias is lost: the residual branch's last
    conv (no ReLU after it, so it can be positive through its bias alone) gets a zero bias here.
    """
    net = get_net(name)
    if name == "residual_net":
        net = Net(name)
        c3 = net.model.get_layer("c3")
        c3.set_weights([c3.get_weights()[0], np.zeros(4, "float32")])
    _, result = net.run("mwp", net.nonneg)
    nodes = cut_nodes or [n.id for n in net.engine.graph.nodes if not n.is_input and n.id != "fc2"]
    for node_id in nodes:
        np.testing.assert_allclose(_mass(result, node_id), 1.0, rtol=2e-5, err_msg=node_id)
    np.testing.assert_allclose(result.input_grad.reshape(3, -1).sum(1), 1.0, rtol=2e-5)
    assert (result.input_grad >= 0).all()
    if name == "residual_net":  # the two branches split the mass between them
        branch, shortcut = _mass(result, "c3"), _mass(result, "add") - _mass(result, "c3")
        assert (branch > 0).all() and (shortcut > 0).all()
        np.testing.assert_allclose(_mass(result, "c2"), branch, rtol=2e-5)


def test_mwp_split_mass_is_one_for_signed_input():
    """Under ``mwp_split`` a signed input still receives non-negative mass summing to 1 (z >= 0 by design)."""
    net = get_net("conv_net")
    _, result = net.run("mwp", net.signed)
    g = result.input_grad
    np.testing.assert_allclose(g.reshape(3, -1).sum(1), 1.0, rtol=2e-5)
    assert (g >= -1e-7).all()


@pytest.mark.parametrize("name", ["residual_net", "exotic_net"])
def test_cmwp_equals_mwp_minus_mwp_of_negated_classifier(name):
    """One pass with the cmwp rule == MWP(W) − MWP(−W), the second run on a copy with the classifier negated."""
    net = get_net(name)
    twin = keras.models.clone_model(net.model)
    twin.set_weights(net.model.get_weights())
    top = twin.get_layer(net.classifier)
    top.set_weights([-w if w.ndim > 1 else w for w in top.get_weights()])  # MWP drops the bias anyway
    dual_engine = Engine(twin)
    target = Target(index=1)  # the same class on both models (their predictions differ)

    def run(engine, method):
        return engine.backward(net.signed, target, build_method(method, engine.graph).plan, capture="all")

    both, plain, dual = run(net.engine, "cmwp"), run(net.engine, "mwp"), run(dual_engine, "mwp")
    below = [k for k in both.node_grads if k not in (net.classifier, net.classifier + ":pre")]
    assert len(below) >= 5
    for k in below:
        want = plain.node_grads[k] - dual.node_grads[k]
        np.testing.assert_allclose(both.node_grads[k], want, rtol=1e-5, atol=1e-6 * np.abs(want).max(), err_msg=k)
    want = plain.input_grad - dual.input_grad
    np.testing.assert_allclose(both.input_grad, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    assert not np.allclose(both.input_grad, plain.input_grad)


@pytest.mark.parametrize("name", ["conv_net", "exotic_net"])
def test_mwp_equals_lrp_zplus_without_bias_for_nonneg_input(name):
    """RULES_SPEC §2.3: MWP with the bias dropped and x >= 0 is LRP-z⁺ (α1β0) without bias (2e-6).

    Also through SeparableConv's signed intermediate (z⁺'s x₋W₋ term is ``mwp_split``). Not on residual_net,
    whose Add has a signed input: MWP gives mass to its positive part only, LRP's Norm to the raw value. The
    stabilisers differ (z + 1e-20 vs z + 1e-6): the depthwise and 1-D convs have sums z ~ 1e-4 after a ReLU,
    where that is 1 % apart, so those nets also run z⁺ with MWP's stabiliser.
    """
    net = get_net(name)
    _, mwp = net.run("mwp", net.nonneg)
    for stabilizer in (1e-6,) if name == "conv_net" else (1e-20,):
        _, zplus = net.run("lrp_zplus", net.nonneg, bias=False, stabilizer=stabilizer)
        for k, g in [*mwp.node_grads.items(), ("input", mwp.input_grad)]:
            got = zplus.input_grad if k == "input" else zplus.node_grads[k]
            np.testing.assert_allclose(got, g, rtol=2e-5, atol=2e-6 * np.abs(g).max(), err_msg=f"{k} {stabilizer}")


def test_separable_two_steps_reproduce_the_layer():
    """The rules' depthwise-then-pointwise split of SeparableConv2D is the layer's own (linear) forward."""
    from gradscope.engine.backward.context import RuleContext
    from gradscope.rules.builtin.linear_ops import separable_ops

    net = get_net("exotic_net")
    layer = net.model.get_layer("sep")
    x = keras.ops.convert_to_tensor(np.random.default_rng(2).normal(size=(2, 7, 7, 8)).astype("float32"))
    names = [v.path.split("/")[-1] for v in layer.weights]
    ctx = RuleContext(net.engine.graph.node("sep"), layer, [x], [], [v.value for v in layer.weights], names, None)
    _, pw, h = separable_ops(ctx)
    y = pw.apply(h, pw.weights(pw.kernels, pw.bias))
    linear = keras.layers.SeparableConv2D.from_config({**layer.get_config(), "activation": None})
    linear.build(x.shape)
    linear.set_weights(layer.get_weights())
    np.testing.assert_allclose(np.asarray(y), np.asarray(linear(x)), rtol=1e-5, atol=1e-6)
    assert np.asarray(h).min() < 0  # the intermediate is signed: why the pointwise step needs the split rule


# ---------------------------------------------------------------------------------------------- presets
def test_presets_are_registered():
    methods = available_methods()
    for name in ("mwp", "cmwp", "lrp_epsilon", "lrp_alpha_beta", "lrp_zplus", "gradient"):
        assert name in methods


def test_mwp_preset_changes_the_layers_it_should():
    graph = get_net("bn_net").engine.graph
    m = build_method("mwp", graph)
    assert set(m.changed) == {"c1", "bn1", "c2", "bn2", "add", "gap", "fc"}  # not the ReLUs
    assert m.reduction == "sum" and m.readout_node is None and not m.warnings
    assert m.plan.resolve(graph).skipped == {} and m.plan.resolve(graph).unmatched == []
    without_bn = build_method("mwp", graph, batchnorm="true_gradient")
    assert "bn1" not in without_bn.changed and "c1" in without_bn.changed
    again = Plan.from_json(m.plan.to_json())
    assert again.key() == m.plan.key()


def test_cmwp_preset_classifier_and_readout():
    graph = get_net("conv_net").engine.graph
    m = build_method("cmwp", graph)
    assert m.plan.resolve(graph).rules["fc2:pre"].entry.rule == "cmwp"
    assert m.readout_node == "avg"  # the input of the Flatten above the last conv block
    assert "fc2" not in m.changed  # the stripped final softmax is not on the path
    graph = get_net("residual_net").engine.graph
    assert build_method("cmwp", graph).readout_node == "relu"  # the input of the global pool
    assert build_method("cmwp", graph, readout="c2").readout_node == "c2"


def test_cmwp_without_linear_classifier_is_a_clear_error():
    inp = keras.Input((4, 4, 2))
    out = keras.layers.GlobalMaxPooling2D()(keras.layers.Conv2D(3, 3, padding="same")(inp))
    graph = Engine(keras.Model(inp, out)).graph
    with pytest.raises(PlanError, match="linear classifier"):
        build_method("cmwp", graph)


def test_bad_options_are_plan_errors():
    graph = get_net("conv_net").engine.graph
    with pytest.raises(PlanError, match="signed_input"):
        build_method("mwp", graph, signed_input="abs")
    with pytest.raises(PlanError, match="batchnorm"):
        build_method("mwp", graph, batchnorm="fold")
    with pytest.raises(PlanError):
        build_method("mwp", graph, colour="red")


def test_unhandled_layers_are_reported_by_node_id_and_keep_their_gradient():
    keras.utils.set_random_seed(3)
    inp = keras.Input((6,), name="x")
    a = keras.layers.Dense(5, activation="relu", name="d1")(inp)
    b = keras.layers.Dense(5, activation="tanh", name="gate")(inp)  # not a sigmoid gate: an unknown product
    y = keras.layers.Multiply(name="mul")([a, b])
    y = keras.layers.LayerNormalization(name="ln")(y)
    out = keras.layers.Dense(3, name="out")(y)
    engine = Engine(keras.Model(inp, out))
    for name in ("mwp", "cmwp", "lrp_epsilon", "lrp_alpha_beta", "lrp_zplus"):
        m = build_method(name, engine.graph)
        text = " ".join(m.warnings)
        assert "mul" in text and "ln" in text and "Multiply" in text and "LayerNormalization" in text, name
        assert "mul" not in m.changed and "ln" not in m.changed and {"d1:pre", "gate", "out"} <= set(m.changed)
        if name in ("mwp", "lrp_epsilon"):
            r = engine.backward(np.ones((1, 6), "float32"), Target(index=0), m.plan)
            assert np.isfinite(r.input_grad).all() and np.abs(r.input_grad).sum() > 0


def test_mwp_on_folded_batchnorm_equals_identity_batchnorm_for_positive_scales():
    """Folding BN (W' = a·W) before clamping: with the bias dropped, MWP is unchanged where a > 0 (a·W₊ = (aW)₊
    and the a cancels in x ⊙ (aW₊)ᵀ(g ⊘ a·z)), and changes where a < 0 (there (aW)₊ = a·W₋)."""
    from gradscope.engine.backward.canonize import fold_batchnorm

    results = {}
    for positive_gamma in (True, False):
        model, _, _ = ref_lrp.bn_net()
        if positive_gamma:
            for name in ("bn1", "bn2"):
                bn = model.get_layer(name)
                gamma, *rest = bn.get_weights()
                bn.set_weights([np.abs(gamma), *rest])
        folded, folds = fold_batchnorm(model)
        assert folds == {"bn1": "c1", "bn2": "c2"}
        pair = []
        for m in (model, folded):
            engine = Engine(m)
            method = build_method("mwp", engine.graph)
            assert not method.warnings  # the RemovedLayer left by the canonizer is an identity
            pair.append(engine.backward(get_net("bn_net").signed, Target(index=0), method.plan).input_grad)
        results[positive_gamma] = pair
    np.testing.assert_allclose(results[True][1], results[True][0], rtol=1e-4, atol=1e-7)
    assert not np.allclose(results[False][1], results[False][0], rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("size", [6, 1])
def test_squeeze_excitation_gate_takes_no_signal(size):
    """``x * gate``: MWP/LRP pass everything to x (mass stays 1), nothing to the gate. The gate is the broadcast
    input (size 6), or at 1x1 spatial size, where the shapes agree, the sigmoid-produced one."""
    keras.utils.set_random_seed(5)
    inp = keras.Input((size, size, 3), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv")(inp)
    s = keras.layers.GlobalAveragePooling2D(keepdims=True, name="squeeze")(x)
    s = keras.layers.Conv2D(8, 1, activation="sigmoid", name="excite")(s)
    y = keras.layers.Multiply(name="gate")([x, s])
    y = keras.layers.GlobalAveragePooling2D(name="gap")(y)
    out = keras.layers.Dense(3, name="fc")(y)
    engine = Engine(keras.Model(inp, out))
    x_in = np.random.default_rng(0).uniform(0.05, 1, (2, size, size, 3)).astype("float32")
    for name in ("mwp", "lrp_zplus"):
        m = build_method(name, engine.graph, **({"bias": False} if name == "lrp_zplus" else {}))
        assert m.plan.resolve(engine.graph).rules["gate"].entry.rule == "signal_take_all" and not m.warnings
        r = engine.backward(x_in, Target(), m.plan, capture="all")  # top-1: its logit has excitatory inputs
        assert np.all(r.node_grads["excite"] == 0) and np.all(r.node_grads["squeeze"] == 0)
        np.testing.assert_allclose(r.node_grads["gate"].reshape(2, -1).sum(1), 1.0, rtol=1e-4)  # z⁺: 1e-6 stab
        np.testing.assert_allclose(r.node_grads["conv"], r.node_grads["gate"], rtol=1e-6)
        np.testing.assert_allclose(r.input_grad.reshape(2, -1).sum(1), 1.0, rtol=1e-4)


def test_default_readouts_are_never_a_too_coarse_map():
    """Issue 12: c-MWP read the demo at a 4x4 node (pointing game 18 %); the default is now the last map whose
    sides are at least readout_min_size (8x8 there), and an explicit min_size is honoured."""
    from gradscope.io.demo import demo_model_path
    from gradscope.io.models import load_model
    from gradscope.rules.builtin.linear_ops import readout_min_size

    graph = Engine(load_model(demo_model_path())).graph
    assert readout_min_size(graph) == 7
    for name in ("cmwp", "grad_cam"):
        node = graph.node(build_method(name, graph).readout_node)
        assert min(node.output_shape[1:3]) >= 7 and not node.op_type.startswith("ZeroPadding"), name
    finer = graph.node(build_method("cmwp", graph, min_size=16).readout_node)
    assert min(finer.output_shape[1:3]) >= 16
