"""Memory stays bounded over many never-seen plans: traces the engine evicts are freed, and so is what TF
registers while tracing custom gradients."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from gradscope.core.targets import Target
from gradscope.engine.backward import live, runner
from gradscope.engine.backward.runner import Engine
from gradscope.rules.plan import Plan
from tests.engine.fixtures import tiny_cnn


def _traced_graphs() -> int:
    from tensorflow.python.framework.func_graph import FuncGraph

    gc.collect()
    return sum(isinstance(o, FuncGraph) and o.name == "fn" for o in gc.get_objects())


def _custom_gradients() -> int:
    from tensorflow.python.framework import ops

    return sum(name.startswith("CustomGradient-") for name in ops._gradient_registry._registry)


def test_evicted_whole_plan_traces_are_freed():
    engine = Engine(tiny_cnn())
    x = np.random.default_rng(0).uniform(0, 1, (1, 12, 12, 3)).astype("float32")
    graphs_before, registered_before = _traced_graphs(), _custom_gradients()
    n = runner._CACHE_SIZE + 6
    for i in range(n):
        plan = Plan().with_entry("c1", "scale", {"factor": 1.0 + i})
        result = engine.backward(x, Target(), plan, capture="all", mode="compiled")
        assert result.meta["mode"] == "compiled"
    assert engine.trace_count >= n
    assert len(engine._cache) <= runner._CACHE_SIZE
    # Every node's signal is a gradient source and they lie on one chain: with a GradientTape, TF 2.21 kept each
    # such trace alive after the engine dropped it.
    assert _traced_graphs() - graphs_before <= runner._CACHE_SIZE
    assert _custom_gradients() == registered_before


@pytest.mark.slow
def test_soak_500_session_edits_hold_memory():
    """Issue 11: 500 plan edits through the Session (live answer + background compile each) stay within
    +300 MB of the RSS after the first 50, with a bounded number of traced graphs."""
    from gradscope.app.session import Session
    from tests.app.test_session import ManualExecutor

    def rss_mb() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    s = Session(ManualExecutor())
    s.set_model(tiny_cnn())
    s.jobs.executor.run_all()
    s.fed.set_image(np.full((12, 12, 3), 90, np.uint8))
    s.jobs.executor.run_all()
    after_50 = graphs_50 = 0
    for i in range(1, 501):
        s.editor.add_rule("c1", "scale", {"factor": 1.0 + i / 1000})
        s.jobs.executor.run_all()
        if i == 50:
            gc.collect()
            after_50, graphs_50 = rss_mb(), _traced_graphs()
    assert s.result.meta["mode"] in ("live", "compiled")
    gc.collect()
    assert rss_mb() - after_50 < 300
    # traced graphs: at most the compiled kernels plus the whole-plan traces, whatever the number of edits
    assert _traced_graphs() <= live._COMPILED_KERNELS + runner._CACHE_SIZE + graphs_50 // 8
