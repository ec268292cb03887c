"""LRP-ε, LRP-αβ and LRP-z⁺ (RULES_SPEC §2.5-2.6) against the NumPy reference and two identities:
LRP-0 on a bias-free ReLU net is gradient × input divided by the logit, and the BatchNorm ε rule is BN folded
into the conv below it (up to the stabilisers)."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import keras
from gradscope.core.errors import PlanError
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.methods import build_method
from tests.rules import reference_lrp as ref_lrp
from tests.rules.test_excitation import Net, assert_matches_reference, get_net

CASES = [
    ("conv_net", "lrp_epsilon", {}),
    ("residual_net", "lrp_epsilon", {}),
    ("bn_net", "lrp_epsilon", {"epsilon": 0.05}),
    ("exotic_net", "lrp_epsilon", {}),
    ("conv1d3d_net", "lrp_epsilon", {}),
    ("conv_net", "lrp_epsilon", {"epsilon": 0.01, "bias": False}),
    ("conv_net", "lrp_alpha_beta", {}),
    ("bn_net", "lrp_alpha_beta", {}),
    ("exotic_net", "lrp_alpha_beta", {}),
    ("residual_net", "lrp_alpha_beta", {"alpha": 1.5, "beta": 0.5, "bias": False}),
    ("bn_net", "lrp_zplus", {}),
    ("exotic_net", "lrp_zplus", {}),
]


@pytest.mark.parametrize("name, method, options", CASES, ids=[f"{n}-{m}-{o}" for n, m, o in CASES])
def test_lrp_matches_reference(name, method, options):
    net = get_net(name)
    _, result = net.run(method, net.signed, **options)
    grads = net.ref.backward(net.ref.forward(net.signed), result.target_indices, method, **options)
    assert assert_matches_reference(net, result, grads) >= 4


@pytest.mark.parametrize("builder", ["conv_net", "residual_net"])
def test_lrp0_is_gradient_times_input_over_the_logit(builder):
    """RULES_SPEC §2.5: on a bias-free ReLU net, LRP-0 with a one-hot seed is x ⊙ ∂logit_t/∂x / logit_t.

    The residue is the 1e-6 stabiliser of the average pools (Norm); the Add's Norm likewise.
    """
    if builder == "conv_net":
        model = ref_lrp.conv_net(use_bias=False)[0]
    else:
        model = ref_lrp.residual_net()[0]
        for layer in model.layers:
            if getattr(layer, "use_bias", False):
                layer.set_weights([layer.get_weights()[0], np.zeros_like(layer.get_weights()[1])])
    engine = Engine(model)
    x = np.random.default_rng(4).normal(size=(4,) + tuple(model.inputs[0].shape[1:])).astype("float32")
    lrp0 = engine.backward(x, Target(), build_method("lrp_epsilon", engine.graph, epsilon=0.0).plan)
    grad = engine.backward(x, Target(), build_method("gradient", engine.graph).plan)
    logit = lrp0.logits[np.arange(4), lrp0.target_indices]
    assert (np.abs(logit) > 1e-2).all()
    want = x * grad.input_grad / logit.reshape(-1, *([1] * (x.ndim - 1)))
    np.testing.assert_allclose(lrp0.input_grad, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # ... and it conserves: the input relevance sums to 1 (no bias absorbs any)
    np.testing.assert_allclose(lrp0.input_grad.reshape(4, -1).sum(1), 1.0, rtol=1e-4)


def test_batchnorm_epsilon_rule_is_folding_it_into_the_conv():
    """conv -> BN (ε rule on a ≠ 0 diagonal) -> ReLU equals the folded conv -> ReLU under LRP-ε, small ε."""
    keras.utils.set_random_seed(8)
    inp = keras.Input((6, 6, 3), name="image")
    x = keras.layers.Conv2D(4, 3, name="conv")(inp)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.ReLU(name="relu")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    out = keras.layers.Dense(3, name="fc")(x)
    model = ref_lrp._random_biases(keras.Model(inp, out), 8)
    ref_lrp._random_batchnorm(model.get_layer("bn"), np.random.default_rng(8))
    bn = ref_lrp.bn_params(model.get_layer("bn"))
    kernel, bias = model.get_layer("conv").get_weights()

    y = keras.layers.Conv2D(4, 3, name="conv")(inp)
    y = keras.layers.ReLU(name="relu")(y)
    y = keras.layers.GlobalAveragePooling2D(name="gap")(y)
    folded = keras.Model(inp, keras.layers.Dense(3, name="fc")(y))
    folded.get_layer("conv").set_weights([kernel * bn["scale"], bias * bn["scale"] + bn["shift"]])
    folded.get_layer("fc").set_weights(model.get_layer("fc").get_weights())

    x = np.random.default_rng(9).normal(size=(3, 6, 6, 3)).astype("float32")
    results = []
    for m in (model, folded):
        engine = Engine(m)
        results.append(
            engine.backward(x, Target(index=0), build_method("lrp_epsilon", engine.graph, epsilon=1e-5).plan)
        )
    np.testing.assert_allclose(results[0].logits, results[1].logits, rtol=1e-4, atol=1e-5)
    a, b = results[0].input_grad, results[1].input_grad
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4 * np.abs(b).max())


def test_lrp_presets_and_their_options():
    graph = get_net("bn_net").engine.graph
    for name in ("lrp_epsilon", "lrp_alpha_beta", "lrp_zplus"):
        m = build_method(name, graph)
        assert m.signed and m.reduction == "sum" and m.readout_node is None and not m.warnings
        assert set(m.changed) == {"c1", "bn1", "c2", "bn2", "add", "gap", "fc"}
        assert {e.rule for e in m.plan.entries} == {name}
    assert build_method("lrp_epsilon", graph, epsilon=0.5).plan.entries[0].params["epsilon"] == 0.5
    with pytest.raises(PlanError, match="alpha - beta = 1"):
        build_method("lrp_alpha_beta", graph, alpha=2.0, beta=2.0)
    with pytest.raises(PlanError, match="epsilon"):
        build_method("lrp_epsilon", graph, epsilon=-1.0)
    with pytest.raises(PlanError, match="stabilizer"):
        build_method("lrp_zplus", graph, stabilizer=0.0)


def test_alpha_beta_differs_from_zplus_and_epsilon_on_signed_input():
    """The three rules are different rules (a wiring mix-up would make two of them agree)."""
    net: Net = get_net("bn_net")
    maps = {m: net.run(m, net.signed)[1].input_grad for m in ("lrp_epsilon", "lrp_alpha_beta", "lrp_zplus")}
    assert not np.allclose(maps["lrp_epsilon"], maps["lrp_alpha_beta"], atol=1e-6)
    assert not np.allclose(maps["lrp_alpha_beta"], maps["lrp_zplus"], atol=1e-6)
    assert (maps["lrp_alpha_beta"] < 0).any() and (maps["lrp_epsilon"] < 0).any()
