"""The ``Results`` model alone (no Session, no Qt): what is shown, what it was computed with, its events."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.app.models.results import Results, signal_of
from gradscope.app.rendering.view import ViewSettings
from gradscope.core.errors import GraphError
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.plan import Plan
from tests.engine.fixtures import tiny_cnn


@pytest.fixture(scope="module")
def computed():
    engine = Engine(tiny_cnn())
    x = np.random.default_rng(0).uniform(size=(1, 12, 12, 3)).astype("float32")
    plan = Plan().with_entry("c1", "zero")
    base = engine.backward(x, Target(), Plan(), capture="all")
    return engine.backward(x, Target(), plan, capture="all"), base, plan


def test_show_emits_and_keeps_what_the_result_was_computed_with(computed):
    current, base, plan = computed
    results, events = Results(), []
    results.changed.connect(lambda *a: events.append(a))
    assert results.caption(plan) == "" and results.stats() == {} and results.flow_rows() == []
    results.show(
        current,
        base,
        plan=plan,
        method="custom plan",
        readout={"reduction": "sum"},
        seconds=0.1,
        baseline_key=("engine", 0, Target()),
    )
    assert events == [(current, base)]
    assert results.caption(plan) == "custom plan, 1 plan entry" and not results.is_stale(plan)
    assert results.stats("baseline") is base.stats and len(results.flow_rows()) == len(current.stats)
    assert results.baseline_for(("engine", 0, Target())) is base and results.baseline_for(("other",)) is None
    results.clear()
    assert results.current is None and results.readout == {} and len(events) == 1  # clearing is quiet


def test_a_stale_result_is_drawn_with_its_own_read_out(computed):
    current, base, plan = computed
    results = Results()
    results.show(
        current, base, plan=plan, method="custom plan", readout={"reduction": "max_abs"}, seconds=0.1, baseline_key=()
    )
    newer = plan.with_entry("c2", "sign")
    view = ViewSettings(reduction="sum")
    assert results.is_stale(newer) and results.view_for(view, newer).reduction == "max_abs"
    assert results.view_for(view, plan) is view  # not stale: the view as it is
    assert results.caption(newer).endswith("(previous plan; the new one is computing)")


def test_signal_of_reads_the_input_or_a_captured_node(computed):
    current, _, _ = computed
    view = ViewSettings()
    np.testing.assert_array_equal(signal_of(current, None, view), current.input_grads[0][0])
    np.testing.assert_array_equal(signal_of(current, "c1", view), current.node_grads["c1"][0])
    times = signal_of(current, "c1", ViewSettings(times_input=True))
    np.testing.assert_allclose(times, current.node_grads["c1"][0] * current.node_values["c1"][0])
    with pytest.raises(GraphError, match="No result yet"):
        signal_of(None, None, view)
    with pytest.raises(GraphError, match="No signal was captured at 'nope'"):
        signal_of(current, "nope", view)


def test_a_plan_comparison_pins_swaps_and_computes_cosines_through_the_worker(computed):
    from gradscope.app.models.comparison import PlanComparison
    from gradscope.app.models.feedback import Feedback

    current, base, plan = computed
    results, jobs, events, told = Results(), [], [], Feedback()
    ab = PlanComparison(results, lambda kind, label, job, done, quiet: jobs.append((kind, job, done, quiet)), told)
    ab.changed.connect(events.append)
    said, errors = [], []
    told.status_changed.connect(said.append)
    told.error_raised.connect(lambda *a: errors.append(a))
    assert not ab.pin() and ab.pinned is None  # nothing computed yet
    assert errors and errors[0][0] == "Nothing to pin"
    results.show(base, base, plan=Plan(), method="gradient", readout={}, seconds=0.1, baseline_key=())
    assert ab.pin() and said[-1].startswith("Pinned gradient as B")
    assert ab.pinned.method == "gradient" and events == [ab.pinned] and ab.node_cosine == {}
    ((kind, job, done, quiet),) = jobs
    assert kind == "compare" and quiet
    done(job(None))  # as the worker would: A == B, so every cosine is 1
    assert ab.node_cosine and all(c == pytest.approx(1.0) for c in ab.node_cosine.values() if c == c)
    results.show(current, base, plan=plan, method="custom plan", readout={}, seconds=0.1, baseline_key=())
    old = ab.swap()
    assert old.method == "gradient" and ab.pinned.plan == plan  # the caller makes old.plan current
    ab.end("a new input")
    assert ab.pinned is None and ab.node_cosine == {} and events[-1] is None
    assert said[-1] == "Comparison ended: a new input (pin again to compare on it)."
