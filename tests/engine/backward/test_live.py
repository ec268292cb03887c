"""The live path (node-by-node sweep over cached forward values) gives what the compiled whole-plan path gives,
recomputes only what an edit changes, compiles its kernels on request and runs reloaded rule code."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.core.errors import Cancelled
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.base import load_rule_file
from gradscope.rules.methods import build_method
from gradscope.rules.plan import Plan
from tests.engine.fixtures import FIXTURES, sample_input

#: Every built-in rule that keeps the forward values, as (selector, rule, params) on the residual fixture.
RULE_CASES = [
    ("*", "true_gradient", {}),
    ("branch_relu", "zero", {}),
    ("branch_a", "scale", {"factor": -2.5}),
    ("stem:pre", "clip", {"low": -0.01, "high": 0.02}),
    ("branch_b", "sign", {}),
    ("activation:relu", "backward_as", {"activation": "sigmoid"}),
    ("activation:relu", "guided_backprop", {}),
    ("activation:relu", "deconvnet", {}),
    ("post", "straight_through", {"backward": "tanh"}),
]
PRESETS = ["guided_backprop", "deconvnet", "mwp", "cmwp", "lrp_epsilon", "lrp_alpha_beta", "lrp_zplus"]


def assert_same(live, compiled, nodes) -> None:
    np.testing.assert_allclose(live.input_grad, compiled.input_grad, rtol=1e-5, atol=1e-6)
    for n in nodes:
        np.testing.assert_allclose(live.node_grads[n], compiled.node_grads[n], rtol=1e-5, atol=1e-6)
        a, b = live.stats[n], compiled.stats[n]
        assert a.status == b.status, n
        if not a.is_none:
            np.testing.assert_allclose([a.norm, a.max_abs], [b.norm, b.max_abs], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(live.target_indices, compiled.target_indices)
    assert live.meta["mode"] == "live" and compiled.meta["mode"] == "compiled"


@pytest.fixture(scope="module")
def residual_engine():
    model = FIXTURES["residual"]()
    return Engine(model), sample_input(model, 2, seed=3)


@pytest.mark.parametrize("select,rule,params", RULE_CASES, ids=[c[1] for c in RULE_CASES])
def test_live_equals_compiled_for_every_builtin_rule(residual_engine, select, rule, params):
    engine, x = residual_engine
    plan = Plan().with_entry(select, rule, params)
    live = engine.backward(x, Target(index=1), plan, capture="all", mode="live")
    compiled = engine.backward(x, Target(index=1), plan, capture="all", mode="compiled")
    assert_same(live, compiled, engine.stat_nodes)


@pytest.mark.parametrize("fixture", ["chain", "concat", "nested", "shared"])
@pytest.mark.parametrize("preset", PRESETS)
def test_live_equals_compiled_for_presets(fixture, preset):
    engine = _engine(fixture)
    x = np.abs(sample_input(engine.model, 2, seed=5))
    plan = build_method(preset, engine.graph).plan
    live = engine.backward(x, Target(), plan, capture="all", mode="live")
    compiled = engine.backward(x, Target(), plan, capture="all", mode="compiled")
    assert_same(live, compiled, engine.stat_nodes)


_ENGINES: dict[str, Engine] = {}


def _engine(name: str) -> Engine:
    if name not in _ENGINES:
        _ENGINES[name] = Engine(FIXTURES[name]())
    return _ENGINES[name]


def test_neuron_and_channel_targets_live(residual_engine):
    engine, x = residual_engine
    for target in (
        Target(kind="neuron", node="branch_a", neuron=(2, 3, 1)),
        Target(kind="channel", node="add", channel=2),
    ):
        plan = Plan().with_entry("activation:relu", "guided_backprop")
        assert_same(
            engine.backward(x, target, plan, capture=["stem:pre"], mode="live"),
            engine.backward(x, target, plan, capture=["stem:pre"], mode="compiled"),
            ["stem:pre"],
        )


def test_switching_targets_on_one_input_follows_the_target(residual_engine):
    """The target's seed is kept per input and target: switching class and back gives each class's gradient."""
    engine, x = residual_engine
    plan = Plan().with_entry("branch_a", "scale", {"factor": 2.0})
    for target in (Target(index=0), Target(index=2), Target(index=0), Target(kind="channel", node="add", channel=1)):
        live = engine.backward(x, target, plan, capture=["stem:pre"], mode="live")
        assert_same(live, engine.backward(x, target, plan, capture=["stem:pre"], mode="compiled"), ["stem:pre"])


def test_a_one_node_edit_recomputes_only_that_node_and_the_nodes_below():
    model = FIXTURES["residual"]()
    engine, x = Engine(model), sample_input(model, 2, seed=3)
    target = Target(index=0)
    first = engine.backward(x, target, Plan(), mode="live")
    assert first.meta["recomputed_nodes"] == len(engine.stat_nodes)  # fresh input: every node
    edit = Plan().with_entry("branch_relu", "scale", {"factor": 3.0})
    again = engine.backward(x, target, edit, mode="live")
    # branch_relu and what feeds it (branch_a, stem, stem:pre); not logits, gap, post, add, branch_b above it
    assert again.meta["recomputed_nodes"] == 4
    expected = engine.backward(x, target, edit, mode="compiled")
    np.testing.assert_allclose(again.input_grad, expected.input_grad, rtol=1e-5, atol=1e-6)
    # the same plan again: nothing to recompute; a new target: everything
    assert engine.backward(x, target, edit, mode="live").meta["recomputed_nodes"] == 0
    assert engine.backward(x, Target(index=2), edit, mode="live").meta["recomputed_nodes"] == len(engine.stat_nodes)


def test_warm_compiles_the_kernels_and_results_do_not_change(residual_engine):
    engine, x = residual_engine
    plan = Plan().with_entry("activation:relu", "guided_backprop").with_entry("branch_a", "scale", {"factor": 2.0})
    target = Target(index=1)
    eager = engine.backward(x, Target(index=2), plan, capture="all", mode="live")  # different target: full sweep
    eager = engine.backward(x, target, plan, capture="all", mode="live")
    rules = plan.resolve(engine.graph).rule_by_node
    engine.live.warm(rules)
    assert engine.live.pending_kernels(rules) == 0
    engine.backward(x, Target(index=2), plan, mode="live")  # invalidate the memo
    warm = engine.backward(x, target, plan, capture="all", mode="live")
    assert warm.meta["recomputed_nodes"] == len(engine.stat_nodes)
    assert warm.meta["compiled_nodes"] + warm.meta["lowered_nodes"] == len(engine.stat_nodes)
    assert warm.meta["compiled_nodes"] >= 2 and warm.meta["eager_nodes"] == 0  # the two ruled nodes at least
    assert_same(warm, engine.backward(x, target, plan, capture="all", mode="compiled"), engine.stat_nodes)
    np.testing.assert_allclose(warm.input_grad, eager.input_grad, rtol=1e-5, atol=1e-7)


def test_auto_answers_live_first_and_compiles_when_the_plan_comes_back(residual_engine):
    engine, x = residual_engine
    plan = Plan().with_entry("branch_b", "scale", {"factor": 0.25})
    assert engine.backward(x, Target(index=0), plan, stats=False).meta["mode"] == "live"
    assert engine.backward(x, Target(index=0), plan, stats=False).meta["mode"] == "compiled"
    # every node's signal and statistics: a trace of 6-10 live answers is never made on the caller's time
    full = Plan().with_entry("branch_b", "scale", {"factor": 0.5})
    modes = [engine.backward(x, Target(index=0), full, capture="all").meta["mode"] for _ in range(3)]
    assert modes == ["live", "live", "live"]
    engine.compile(x, Target(index=0), full)
    assert engine.backward(x, Target(index=0), full, capture="all").meta["mode"] == "compiled"
    # forward-changing rules and loss targets always take the whole-plan path
    sub = Plan().with_entry("post", "substitute_activation", {"activation": "softplus"})
    assert engine.backward(x, Target(index=0), sub, mode="live").meta["mode"] == "compiled"


def test_compile_can_be_cancelled_and_then_completes(residual_engine):
    engine, x = residual_engine
    plan = Plan().with_entry("add", "scale", {"factor": 7.0})
    with pytest.raises(Cancelled):
        engine.compile(x, Target(index=0), plan, should_stop=lambda: True)
    assert not engine.is_compiled(plan, Target(index=0))
    assert engine.compile(x, Target(index=0), plan) is True
    assert engine.is_compiled(plan, Target(index=0))
    traces = engine.trace_count
    r = engine.backward(x, Target(index=0), plan, capture="all")
    assert r.meta["mode"] == "compiled" and engine.trace_count == traces


RULE_FILE = '''
from gradscope import Rule, register_rule

@register_rule("times_k")
class TimesK(Rule):
    """Multiply the upstream signal by a constant written in the file."""

    def backward(self, ctx, grad_outputs):
        return ctx.vjp([{k} * g for g in grad_outputs])
'''


def test_reloading_an_edited_rule_file_runs_the_new_code(residual_engine, tmp_path):
    engine, x = residual_engine
    path = tmp_path / "times_k.py"
    plan = Plan().with_entry("branch_b", "times_k")
    results = {}
    for k in (2.0, 3.0):
        path.write_text(RULE_FILE.format(k=k))
        load_rule_file(path)
        results[k] = {
            m: engine.backward(x, Target(index=0), plan, capture=["stem:pre"], mode=m) for m in ("live", "compiled")
        }
    cut = Plan().with_entry("branch_b", "zero")
    base = engine.backward(x, Target(index=0), cut, capture=["stem:pre"], mode="compiled")
    unit = engine.backward(x, Target(index=0), Plan(), capture=["stem:pre"], mode="compiled")
    # the branch's share of the signal at stem is linear in k: (k=3 - base) == 1.5 * (k=2 - base)
    for m in ("live", "compiled"):
        d2 = results[2.0][m].node_grads["stem:pre"] - base.node_grads["stem:pre"]
        d3 = results[3.0][m].node_grads["stem:pre"] - base.node_grads["stem:pre"]
        np.testing.assert_allclose(d3, 1.5 * d2, rtol=1e-4, atol=1e-7)
        assert np.abs(d2).max() > 0
    d1 = unit.node_grads["stem:pre"] - base.node_grads["stem:pre"]
    np.testing.assert_allclose(
        results[2.0]["live"].node_grads["stem:pre"] - base.node_grads["stem:pre"], 2 * d1, rtol=1e-4, atol=1e-7
    )


def test_cold_nodes_use_their_recorded_vjp_even_when_a_tensor_is_used_twice():
    """Cold nodes run the VJP recorded during the forward (no second layer call); a node that reads the same
    tensor twice (x * x, x + x) must still get one gradient per use, as the compiled path does."""
    from gradscope.backend import keras

    inp = keras.Input((5,))
    h = keras.layers.Dense(4, activation="tanh", name="h")(inp)
    sq = keras.layers.Multiply(name="square")([h, h])
    twice = keras.layers.Add(name="twice")([sq, sq])
    out = keras.layers.Dense(3, name="logits")(twice)
    engine = Engine(keras.Model(inp, out))
    x = sample_input(engine.model, 2, seed=7)
    live = engine.backward(x, Target(index=1), Plan(), capture="all", mode="live")
    assert live.meta["eager_nodes"] + live.meta["lowered_nodes"] == len(engine.stat_nodes)  # every node ran cold
    tapes = engine.live._forward.tapes
    assert type(tapes["square"]).__name__ == "_Recorded" and type(tapes["twice"]).__name__ == "_LoweredVJP"
    compiled = engine.backward(x, Target(index=1), Plan(), capture="all", mode="compiled")
    assert_same(live, compiled, engine.stat_nodes)
    # independent check through the chain rule: d/dh sum_j W[j,1] * 2 h_j^2 = 4 h W[:,1]
    w = engine.model.get_layer("logits").kernel.numpy()[:, 1]
    hv = keras.Model(engine.model.input, engine.model.get_layer("h").output)(x).numpy()
    assert "h" in engine.stat_nodes  # the signal at tanh's output
    np.testing.assert_allclose(live.node_grads["h"], 4 * hv * w, rtol=1e-5, atol=1e-6)
