"""Live editing in the Session: what is shown is always what was computed, Cancel returns to a consistent
state, and a live answer is compiled in the background (cancelled by a newer edit)."""

from __future__ import annotations

import json

import numpy as np

from gradscope.app.session import Session
from gradscope.rules.methods import build_method
from gradscope.rules.plan import Plan
from tests.app.test_session import ManualExecutor
from tests.engine.fixtures import tiny_cnn


def _session(model=None) -> Session:
    s = Session(ManualExecutor())
    s.set_model(model or tiny_cnn())
    s.jobs.executor.run_all()
    s.fed.set_image(np.full((12, 12, 3), 90, np.uint8))
    s.jobs.executor.run_all()
    return s


def test_while_a_new_plan_computes_the_old_result_keeps_its_own_labels(tmp_path):
    s = _session()
    assert s.results.plan == Plan() and not s.result_is_stale
    s.editor.add_rule("c1", "zero")
    assert s.result_is_stale and "previous plan" in s.result_caption()
    s.exports.overlay(tmp_path / "during.png")
    sidecar = json.loads((tmp_path / "during.json").read_text())
    assert sidecar["plan"]["entries"] == []  # the picture on screen is the old plan's, and so is its sidecar
    run = next(j for j in s.jobs.executor.jobs if j.kind == "run")
    s.jobs.executor.run(run)
    assert not s.result_is_stale and s.result.rules == {"c1": "zero"}
    assert "1 plan entry" in s.result_caption()
    s.exports.overlay(tmp_path / "after.png")
    assert json.loads((tmp_path / "after.json").read_text())["plan"]["entries"][0]["rule"] == "zero"


def test_cancel_goes_back_to_the_plan_of_the_result_shown():
    s = _session()
    shown = s.result
    s.editor.add_rule("c1", "zero")
    assert s.plan != s.results.plan
    s.cancel()
    assert s.plan == s.results.plan == Plan() and s.result is shown and s.jobs.busy is None
    assert s.editor.can_undo  # the cancelled edit is one undo away


def test_a_live_answer_is_compiled_in_the_background_and_a_new_edit_cancels_that():
    s = _session()
    engine = s.document.engine
    s.editor.add_rule("c1", "scale", {"factor": 2.0})
    run = next(j for j in s.jobs.executor.jobs if j.kind == "run")
    s.jobs.executor.run(run)
    assert s.result.meta["mode"] == "live"
    compile_job = next(j for j in s.jobs.executor.jobs if j.kind == "compile")
    assert s.jobs.busy is None  # background work shows no busy bar
    s.editor.add_rule("c1", "scale", {"factor": 3.0})  # a newer edit: the old compile is pointless
    assert compile_job.token.cancelled
    s.jobs.executor.run_all()
    assert s.result.meta["mode"] == "live" and s.results.plan == s.plan
    assert engine.is_compiled(s.plan, s.target)  # the newest plan was compiled after its live answer


def test_the_background_step_then_prepares_the_presets_block_kernels():
    from tests.engine.backward.test_segments import blocks_cnn

    s = _session(blocks_cnn())
    s.prepared_presets = ("guided_backprop", "lrp_epsilon")
    engine = s.document.engine
    s.editor.add_rule("b1_conv1", "scale", {"factor": 2.0})
    s.jobs.executor.run_all()  # the run, then the background step
    assert engine.is_compiled(s.plan, s.target)
    for name in s.prepared_presets:
        plan = build_method(name, engine.graph).plan
        assert engine.live._in_block_kernels(plan.resolve(engine.graph).rule_by_node)
        assert engine.prepare(plan, s.target) == 0  # nothing left to compile
    s.editor.set_plan(build_method("guided_backprop", engine.graph).plan)
    s.jobs.executor.run_all()
    assert s.result.meta["mode"] == "live" and s.result.meta["compiled_nodes"] > 0
