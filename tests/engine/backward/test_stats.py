"""In-graph per-node statistics against NumPy on the captured signals."""

from __future__ import annotations

import numpy as np

from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.plan import Plan
from tests.engine.fixtures import FIXTURES, sample_input


def test_stats_match_numpy_for_every_node():
    model = FIXTURES["chain"]()
    engine = Engine(model)
    result = engine.backward(sample_input(model, 3), Target(index=0), capture="all")
    assert set(result.stats) == set(engine.stat_nodes)
    assert [n for n, s in result.stats.items() if s.is_none] == ["probs"]  # stripped softmax
    for node_id, s in result.stats.items():
        if s.is_none:
            continue
        g = result.node_grads[node_id].astype(np.float64)
        assert np.isclose(s.norm, np.sqrt((g**2).sum()), rtol=1e-4)
        assert np.isclose(s.mean_abs, np.abs(g).mean(), rtol=1e-4)
        assert np.isclose(s.max_abs, np.abs(g).max(), rtol=1e-5)
        assert np.isclose(s.zero_fraction, (g == 0).mean())
        assert s.nan_count == 0 and s.inf_count == 0


def test_stopped_gradient_shows_as_zero_and_softmax_is_not_on_the_path():
    model = FIXTURES["chain"]()
    engine = Engine(model)
    result = engine.backward(sample_input(model, 2), plan=Plan().with_entry("relu2", "zero"))
    assert result.stats["bn"].status == "zero"
    assert result.stats["conv1"].status == "zero"
    assert result.stats["probs:pre"].status == "ok"
    # A final softmax is stripped: the class target reads the logits, so no gradient reaches its output.
    assert result.stats["probs"].status == "none"
    assert result.meta["softmax_stripped"] is True
    assert np.all(result.input_grad == 0)


def test_without_stats_only_captured_nodes_are_sources():
    model = FIXTURES["residual"]()
    engine = Engine(model)
    x = sample_input(model, 2)
    full = engine.backward(x, Target(index=1), capture=["add"])
    bare = engine.backward(x, Target(index=1), capture=["add"], stats=False)
    assert bare.stats == {} and len(full.stats) == len(engine.stat_nodes)
    np.testing.assert_array_equal(bare.input_grad, full.input_grad)
    np.testing.assert_array_equal(bare.node_grads["add"], full.node_grads["add"])


def test_host_rows_equal_the_in_graph_rows():
    """The live sweep's eager nodes take their row from NumPy; the compiled kernels from the graph."""
    from gradscope.backend import tf
    from gradscope.engine.backward.stats import host_stats_row, stats_rows

    rng = np.random.default_rng(0)
    relu = np.maximum(rng.normal(size=(3, 40, 40, 8)), 0).astype("float32")  # about half zeros
    cases = {
        "relu": relu,
        "big then small": np.concatenate([rng.normal(size=50_000), rng.normal(size=10)]).astype("float32"),
        "zeros": np.zeros((4, 5), "float32"),
        "negative zeros": np.array([-0.0, 0.0, 1.0, -0.0, -2.0], "float32"),
        "empty": np.zeros((0, 3), "float32"),
        "with inf": np.array([1.0, -np.inf, 0.0, 2.0], "float32"),
        "with nan and inf": np.array([1.0, np.nan, np.inf, 0.0, -3.0], "float32"),
        "float16": rng.normal(size=(7, 3)).astype("float16"),
        "float64": rng.normal(size=(7, 3)),
    }
    for name, a in cases.items():
        host = host_stats_row(tf.constant(a))
        graph = stats_rows([tf.constant(a)])[0].numpy()
        np.testing.assert_allclose(host, graph, rtol=1e-5, atol=1e-7, equal_nan=True, err_msg=name)
    assert np.isnan(host_stats_row(tf.constant(cases["with nan and inf"]))[:4]).all()
    np.testing.assert_array_equal(host_stats_row(tf.constant(cases["with inf"]))[4:], [0, 1])
    assert host_stats_row(tf.constant(cases["negative zeros"]))[3] == np.float32(0.6)  # -0.0 is a zero
