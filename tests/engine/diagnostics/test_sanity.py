"""Sanity checks (issue 12): conservation of LRP relevance, the model-randomisation test and finite
differences, each on a seeded tiny net with a known answer, and each able to fail."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gradscope.backend import keras
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.engine.diagnostics.sanity import finite_differences, model_randomisation, sanity_checks, spearman
from gradscope.rules.methods import build_method
from gradscope.rules.plan import Plan


def relu_net(bias: bool) -> keras.Model:
    keras.utils.set_random_seed(21)
    inp = keras.Input((6,))
    h = keras.layers.Dense(8, activation="relu", use_bias=bias, name="d1")(inp)
    h = keras.layers.Dense(5, activation="relu", use_bias=bias, name="d2")(h)
    return keras.Model(inp, keras.layers.Dense(3, use_bias=bias, name="out")(h))


def _x(shape=(1, 6), seed=0):
    return np.abs(np.random.default_rng(seed).normal(size=shape)).astype("float32") + 0.1


def test_lrp_relevance_is_conserved_on_a_bias_free_relu_net_and_the_check_flags_biases():
    engine = Engine(relu_net(bias=False))
    x = _x()
    report = sanity_checks(
        engine, x, Target(), build_method("lrp_epsilon", engine.graph, epsilon=1e-9).plan, checks=("conservation",)
    )
    assert report.conservation and not any(r.flagged for r in report.conservation)
    inputs = [r for r in report.conservation if r.node == engine.graph.input_ids[0]]
    assert inputs[0].ratio_to_target == pytest.approx(1.0, rel=1e-4)  # all of f(x) reaches the input
    biased = Engine(relu_net(bias=True))
    for layer in biased.model.layers[1:]:
        layer.bias.assign(np.full(layer.bias.shape, 0.5, "float32"))  # relevance leaks into the biases
    report = sanity_checks(
        biased, x, Target(), build_method("lrp_epsilon", biased.graph, epsilon=1e-9).plan, checks=("conservation",)
    )
    assert any(r.flagged for r in report.conservation)


def test_spearman_known_values():
    a = np.arange(10.0)
    assert spearman(a, a * 3 + 1) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    assert spearman(np.array([1.0, 2, 3, 4]), np.array([1.0, 3, 2, 4])) == pytest.approx(0.8)


def test_model_randomisation_of_a_linear_model_has_the_known_correlation_and_restores_the_weights():
    keras.utils.set_random_seed(22)
    inp = keras.Input((30,))
    model = keras.Model(inp, keras.layers.Dense(2, use_bias=False, name="lin")(inp))
    engine = Engine(model)
    kernel = model.get_layer("lin").kernel
    before = kernel.numpy().copy()
    x = _x((1, 30))
    rows = model_randomisation(engine, x, Target(index=1), Plan(), seed=7)
    assert [r.layer for r in rows] == ["lin"]
    # the map of f = x . W[:, 1] is |W[:, 1]|: the same draw gives the expected correlation exactly
    redrawn = np.random.default_rng(7).normal(0.0, float(np.std(before)), before.shape)
    assert rows[0].rank_correlation == pytest.approx(spearman(np.abs(before[:, 1]), np.abs(redrawn[:, 1])), abs=1e-9)
    np.testing.assert_array_equal(kernel.numpy(), before)  # restored
    np.testing.assert_allclose(engine.backward(x, Target(index=1), Plan()).input_grad[0], before[:, 1], rtol=1e-6)


def test_finite_differences_agree_on_untouched_paths_and_flag_a_wrong_signal():
    keras.utils.set_random_seed(23)
    inp = keras.Input((5,))
    h = keras.layers.Dense(6, activation="tanh", name="t1")(inp)
    h = keras.layers.Dense(4, activation="tanh", name="t2")(h)
    engine = Engine(keras.Model(inp, keras.layers.Dense(3, name="out")(h)))
    x = _x((1, 5))
    rows = finite_differences(engine, x, Target(index=0), Plan())
    assert rows[0].node == "<input>" and all(not r.flagged for r in rows)
    plan = Plan().with_entry("t1", "scale", {"factor": 3.0})  # the input and t1 are below the rule
    rows = finite_differences(engine, x, Target(index=0), plan)
    checked = {r.node for r in rows}
    assert "<input>" not in checked and "t1" not in checked and "t2" in checked
    assert not any(r.flagged for r in rows)
    result = engine.backward(x, Target(index=0), plan, capture="all", mode="compiled")
    wrong = dict(result.node_grads)
    wrong["t2"] = wrong["t2"] * 1.5
    rows = finite_differences(engine, x, Target(index=0), plan, result=dataclasses.replace(result, node_grads=wrong))
    assert [r.node for r in rows if r.flagged] == ["t2"]


def test_the_report_reads_as_text_and_json():
    engine = Engine(relu_net(bias=False))
    report = sanity_checks(
        engine, _x(), Target(), build_method("guided_backprop", engine.graph).plan, method="guided_backprop"
    )
    text = report.to_text()
    assert "Model randomisation" in text and "Finite differences" in text and "guided_backprop" in text
    assert set(report.to_dict()) >= {"conservation", "randomisation", "finite_differences"}


def test_cli_sanity_prints_json_and_refuses_unknown_checks(capsys):
    import json

    from gradscope.cli import main

    assert main(["sanity", "--method", "lrp_epsilon", "--checks", "conservation", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["relevance"] == "signal" and report["conservation"] and not report["randomisation"]
    assert main(["sanity", "--checks", "nope"]) == 2


def test_the_session_runs_the_checks_on_its_worker_and_restores_the_weights():
    from gradscope.app.session import Session
    from gradscope.app.work.worker import InlineExecutor
    from tests.engine.fixtures import tiny_cnn

    s = Session(InlineExecutor())
    s.set_model(tiny_cnn(seed=2))
    s.fed.set_image(np.random.default_rng(0).uniform(0, 1, (12, 12, 3)))
    before = [w.copy() for w in s.document.engine.model.get_weights()]
    reports = []
    s.reports.sanity_ready.connect(reports.append)
    assert s.sanity_checks()
    assert reports and reports[0].randomisation and reports[0].finite_differences
    for a, b in zip(before, s.document.engine.model.get_weights()):
        np.testing.assert_array_equal(a, b)
