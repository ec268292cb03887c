"""The application layer's models, each alone (no Session, no Qt): what it owns, what it emits, what it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.app.models.document import ModelDocument
from gradscope.app.models.editing import PlanEditor
from gradscope.app.models.feedback import Feedback
from gradscope.app.models.jobs import Jobs
from gradscope.app.models.reports import Reports
from gradscope.app.models.rule_catalog import RuleCatalog
from gradscope.app.models.selection import Selection
from gradscope.app.models.targeting import Targeting
from gradscope.app.models.viewing import Viewing
from gradscope.app.rendering.view import INPUT_KEY, ViewError
from gradscope.app.work.worker import InlineExecutor
from gradscope.core.errors import Cancelled, GradscopeError, GraphError
from gradscope.core.targets import Target
from gradscope.rules.plan import Plan
from tests.app.test_session import ManualExecutor
from tests.engine.fixtures import tiny_cnn

pytest.importorskip("keras")


class Told:
    """Everything a ``Feedback`` said."""

    def __init__(self) -> None:
        self.feedback = Feedback()
        self.said: list[str] = []
        self.errors: list[tuple] = []
        self.feedback.status_changed.connect(self.said.append)
        self.feedback.error_raised.connect(lambda *a: self.errors.append(a))


def events_of(signal) -> list[tuple]:
    got: list[tuple] = []
    signal.connect(lambda *a: got.append(a))
    return got


@pytest.fixture(scope="module")
def opened():
    """A document with the tiny CNN adopted, through its real load job (inline)."""
    told = Told()
    ready: list[bool] = []
    doc = ModelDocument(Jobs(InlineExecutor(), told.feedback), lambda: ready.append(True))
    loaded = events_of(doc.loading)
    doc.set_model(tiny_cnn(), "tiny.keras")
    assert ready == [True] and loaded == [("tiny.keras",)] and not told.errors
    return doc


# ------------------------------------------------------------------------------------------------ jobs
def test_jobs_drop_a_stale_result_and_show_the_newest_busy_label():
    told, ex = Told(), ManualExecutor()
    jobs = Jobs(ex, told.feedback)
    busy = events_of(jobs.busy_changed)
    done: list[str] = []
    jobs.submit("run", "first", lambda t: "old", done.append)
    jobs.submit("run", "second", lambda t: "new", done.append)
    assert jobs.busy == "second" and jobs.running("run") and busy[-1] == ("second",)
    ex.run_all()
    assert done == ["new"] and jobs.busy is None and busy[-1] == (None,)  # the stale one was dropped


def test_an_exclusive_job_makes_the_others_stale():
    told, ex = Told(), ManualExecutor()
    jobs = Jobs(ex, told.feedback)
    done: list[str] = []
    jobs.submit("run", "Computing", lambda t: "run", done.append)
    jobs.submit("load", "Loading", lambda t: "load", done.append, exclusive=True)
    assert jobs.busy == "Loading"
    ex.run_all()
    assert done == ["load"]


def test_job_failures_become_messages_never_crashes():
    told = Told()
    jobs = Jobs(InlineExecutor(), told.feedback)

    def boom(token):
        raise ValueError("bad shape")

    seen: list[BaseException] = []
    jobs.submit("run", "Computing", boom, lambda v: None, on_failed=lambda e: seen.append(e) or "Undo goes back.")
    ((title, message, exc),) = told.errors
    assert title == "The backward pass failed" and message == "ValueError: bad shape\n\nUndo goes back."
    assert isinstance(exc, ValueError) and seen == [exc] and jobs.busy is None
    jobs.submit("compile", "", boom, lambda v: None, quiet=True)  # background work: a status line only
    assert told.said == ["Background compile stopped: bad shape"] and len(told.errors) == 1

    def cancelled(token):
        raise Cancelled("Cancelled.")

    jobs.submit("layout", "Laying out", cancelled, lambda v: None)
    assert len(told.errors) == 1 and len(told.said) == 1  # a cancelled job is silent


def test_cancel_all_drops_what_waits():
    told, ex = Told(), ManualExecutor()
    jobs = Jobs(ex, told.feedback)
    done: list[str] = []
    jobs.submit("run", "Computing", lambda t: "run", done.append)
    assert jobs.cancel_all(0.1, lambda: None) is False  # nothing was stuck
    ex.run_all()
    assert done == [] and jobs.busy is None


# ------------------------------------------------------------------------------------------------ document
def test_weight_statistics_equal_float64_numpy_on_weights_far_from_zero():
    from gradscope.app.rendering.summaries import _moments

    rng = np.random.default_rng(0)
    for a in (
        rng.normal(1.0, 1e-3, size=(3000, 700)).astype(np.float32),  # BatchNorm variances: mean 1, spread 1e-3
        rng.normal(0.0, 0.05, size=(17, 5)).astype(np.float32),
        np.full((4, 4), 2.5, np.float32),
    ):
        mean, std = _moments(a, block=1 << 16)  # many blocks
        ref = a.astype(np.float64)
        assert mean == pytest.approx(ref.mean(), rel=1e-12, abs=1e-15)
        assert std == pytest.approx(ref.std(), rel=1e-7, abs=1e-12)


def test_the_document_owns_graph_layout_and_weights(opened):
    doc = opened
    assert doc.path == "tiny.keras" and "c1" in doc.graph and doc.layout is not None and doc.engine is not None
    assert sum(int(np.prod(w.shape)) for ws in doc.weight_info.values() for w in ws) == doc.graph.param_count()
    doc.class_names = ["cat", "dog"]
    assert doc.class_label(1) == "1 dog" and doc.class_label(2) == "2" and doc.class_label(np.int64(0)) == "0 cat"
    doc.class_names = []
    with pytest.raises(GraphError, match="'TB' .* or 'LR'"):
        doc.set_layout_direction("diagonal")
    layouts = events_of(doc.layout_changed)
    doc.set_layout_direction("LR")
    assert len(layouts) == 1 and doc.layout_direction == "LR"
    doc.set_layout_direction("LR")  # no change, no layout
    assert len(layouts) == 1
    doc.set_layout_direction("TB")


def test_a_loaded_model_is_frozen_out_of_full_collections_and_freed_when_replaced():
    """app.heap: after a load the model's objects are frozen (full collections skip them); a replaced model
    is released in the background job that follows the new one, so it is freed, not kept frozen."""
    import gc
    import weakref

    gc.unfreeze()
    try:
        doc = ModelDocument(Jobs(InlineExecutor(), Told().feedback), lambda: None)
        first = tiny_cnn()
        gone = weakref.ref(first)
        doc.set_model(first, "first.keras")
        assert gc.get_freeze_count() > 0
        gc.unfreeze()
        gc.freeze()  # everything frozen, like a long session: only release_replaced can free the first model
        del first
        doc.set_model(tiny_cnn(seed=1), "second.keras")
        assert gone() is None and doc.path == "second.keras"
    finally:
        gc.unfreeze()


def test_a_failed_load_is_withdrawn_and_reported():
    told = Told()
    doc = ModelDocument(Jobs(InlineExecutor(), told.feedback), lambda: pytest.fail("nothing was adopted"))
    failed: list[BaseException] = []
    doc.open("/nonexistent/model.keras", on_failed=failed.append)
    assert failed and told.errors[0][0] == "Cannot open the model" and doc.graph is None and not doc.previewing


# ------------------------------------------------------------------------------------------------ small models
def test_selection_ignores_nodes_the_model_lacks(opened):
    sel = Selection(opened)
    changed = events_of(sel.changed)
    sel.select("c2")
    sel.select("c2")
    sel.select("no such node")
    assert changed == [("c2",), (None,)] and sel.node is None


def test_targeting_refuses_a_class_the_model_does_not_have(opened):
    told = Told()
    aim = Targeting(opened, told.feedback)
    changed = events_of(aim.changed)
    assert not aim.set_class(3)  # the tiny CNN has classes 0..2
    assert told.errors[0][0] == "Bad target" and aim.target == Target() and changed == []
    assert aim.set_class(2) and aim.target.index == 2 and changed == [(aim.target,)]
    assert not aim.set_class(2)  # the same target: no event
    assert not aim.set_class(-1) and len(told.errors) == 2


def test_viewing_checks_every_change_and_follows_the_sign(opened):
    viewing = Viewing(opened)
    changed = events_of(viewing.changed)
    with pytest.raises(ViewError, match="Unknown view setting"):
        viewing.set(colour="red")
    with pytest.raises(ViewError, match="alpha"):
        viewing.set(alpha=2.0)
    with pytest.raises(ViewError, match="no such node"):
        viewing.set(readout_node="nope")
    assert changed == []
    assert viewing.set(readout_node="c2") and changed[-1][0].readout_node == "c2"
    viewing.take_readout("sum", True, True, None)  # a signed preset: diverging colours, read at the input
    s = viewing.settings
    assert (s.colormap, s.normalization, s.readout_node, s.reduction) == ("bwr", "signed_percentile", INPUT_KEY, "sum")
    assert len(changed) == 1  # quiet: the editor emits once after the whole preset
    viewing.restore_readout({"signed": False, "reduction": "max_abs", "readout_node": INPUT_KEY})
    assert (viewing.settings.colormap, viewing.settings.normalization) == ("jet", "minmax") and len(changed) == 2


# ------------------------------------------------------------------------------------------------ editor
def test_the_editor_records_rules_presets_and_their_read_out(opened):
    told = Told()
    viewing = Viewing(opened)
    editor = PlanEditor(opened, viewing, told.feedback)
    plans = events_of(editor.changed)
    assert editor.add_rule("c2", "scale", {"factor": 2.0}) and editor.method_name == "custom plan"
    assert editor.add_rule("c2", "zero")  # the same node: replaced, not piled up
    assert [(e.select, e.rule) for e in editor.plan.entries] == [("c2", "zero")]
    assert editor.rule_for("c2") == "zero" and editor.ruled_nodes() == {"c2": "zero"}
    assert editor.apply_method("guided_backprop")
    assert viewing.settings.reduction == editor._history.current.readout["reduction"]
    assert any("replaced the 1 hand-made plan entry" in s for s in told.said)
    assert editor.undo() and editor.plan.entries[0].rule == "zero" and editor.method_name == "custom plan"
    assert viewing.settings.readout_node == INPUT_KEY
    assert editor.redo() and editor.method_name == "guided_backprop" and not editor.redo()
    assert len(plans) == 5  # two rules, the preset, undo, redo
    assert editor.clear() and editor.plan == Plan() and editor.method_name == "gradient"


def test_the_editor_refuses_a_plan_that_does_not_fit(opened, tmp_path):
    told = Told()
    editor = PlanEditor(opened, Viewing(opened), told.feedback)
    plans = events_of(editor.changed)
    assert not editor.add_rule("c2", "no_such_rule")
    assert told.errors[-1][0] == "The rule cannot be used here" and editor.plan == Plan() and plans == []
    assert editor.method_name == "gradient"  # a refused edit leaves the caption as it was
    (tmp_path / "bad.json").write_text("{not json")
    assert not editor.import_plan(tmp_path / "bad.json") and told.errors[-1][0] == "Cannot read the plan"
    assert not editor.apply_method("no_such_method") and told.errors[-1][0] == "Method failed"
    with pytest.raises(GradscopeError, match="by its position"):
        editor.remove_entry("0")


# ------------------------------------------------------------------------------------------------ reports, rules
def test_reports_need_a_model_and_diagnose_on_the_worker(opened):
    told = Told()
    reports = Reports(Jobs(InlineExecutor(), told.feedback), told.feedback)
    assert not reports.diagnose(None, None, Target()) and told.errors[0][0] == "No model"
    got = events_of(reports.diagnosis_changed)
    x = np.zeros((1, 12, 12, 3), np.float32)
    assert reports.diagnose(opened.engine, x, Target())
    assert got and reports.diagnosis is got[0][0] and reports.diagnosis.ok
    assert told.said[-1].startswith("Diagnostics: all") and reports.highlight() == {}  # nothing cut: no marks
    reports.clear()
    assert reports.diagnosis is None and got[-1] == (None,)


def test_the_rule_catalog_loads_only_what_it_is_given(tmp_path):
    told = Told()
    catalog = RuleCatalog(Jobs(InlineExecutor(), told.feedback), told.feedback)
    changed = events_of(catalog.changed)
    catalog.mark_ready()
    catalog.mark_ready()
    assert catalog.ready and changed == [([],)]
    catalog.load_file(tmp_path / "missing.py")
    assert changed == [([],)] and told.errors[0][0] == "Cannot load the rule file"
