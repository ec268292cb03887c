"""Session (Qt-free): state, events, undo/redo, stale results, worker thread, maps, exports, session files."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from gradscope.app.files.session_files import SESSION_SCHEMA, SessionFileError, read_session_file
from gradscope.app.rendering.view import INPUT_KEY, to_map
from gradscope.app.session import Session
from gradscope.app.work.worker import InlineExecutor, Job, ThreadExecutor
from gradscope.core.errors import Cancelled, ModelLoadError, PlanError
from gradscope.core.resources import resource_path
from gradscope.core.targets import Target
from gradscope.render.graph_layout import compute_layout
from gradscope.rules.plan import Plan
from tests.engine.fixtures import tiny_cnn
from tests.io.test_model_steps import with_damaged_weights

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")


_cnn = tiny_cnn


@pytest.fixture(scope="module")
def model():
    return _cnn()


@pytest.fixture(scope="module")
def image():
    return (np.random.default_rng(1).random((20, 16, 3)) * 255).astype(np.uint8)


class Recorder:
    """Collects every event a session emits."""

    def __init__(self, session: Session) -> None:
        self.events: list[tuple[str, tuple]] = []
        s = session
        for name, signal in (
            ("model_loaded", s.document.loaded),
            ("result_changed", s.results.changed),
            ("error_raised", s.feedback.error_raised),
            ("plan_changed", s.editor.changed),
            ("busy_changed", s.jobs.busy_changed),
            ("selection_changed", s.selection.changed),
            ("view_changed", s.viewing.changed),
            ("target_changed", s.targeting.changed),
            ("layout_changed", s.document.layout_changed),
        ):
            signal.connect(lambda *a, name=name: self.events.append((name, a)))
        self.status: list[str] = []
        session.feedback.status_changed.connect(self.status.append)

    def names(self) -> list[str]:
        return [n for n, _ in self.events]

    def errors(self) -> list[tuple]:
        return [a for n, a in self.events if n == "error_raised"]

    def statuses(self) -> list[str]:
        return list(self.status)


class ManualExecutor:
    """Holds jobs until the test runs them, in any order (to test request ids without threads)."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []

    def submit(self, job: Job) -> None:
        self.jobs.append(job)

    def run(self, job: Job) -> None:
        self.jobs.remove(job)
        if job.token.cancelled or not job.is_current():
            job.on_error(Cancelled("skipped"))
            return
        try:
            value = job.fn(job.token)
        except BaseException as exc:  # noqa: BLE001
            job.on_error(exc)
            return
        job.on_done(value)

    def run_all(self) -> None:
        while self.jobs:
            self.run(self.jobs[0])

    def cancel(self, kind=None) -> None:
        for j in self.jobs:
            j.token.cancel()


@pytest.fixture(scope="module")
def loaded(model, image):
    s = Session(InlineExecutor())
    s.set_model(model)
    s.fed.set_image(image)
    return s


def _tape_logit_grad(model, x, cls):
    """Independent reference: GradientTape on the pre-softmax logit (Dense 'out' without its softmax)."""
    logits_model = keras.Model(model.input, model.get_layer("out").output)
    dense = model.get_layer("out")
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        feats = keras.Model(model.input, model.get_layer("gap").output)(x)
        z = tf.matmul(feats, dense.kernel) + dense.bias
        picked = z[:, cls]
    del logits_model
    return tape.gradient(picked, x).numpy()


def test_baseline_is_the_true_logit_gradient(loaded, model):
    s = loaded
    assert s.result is not None and s.baseline is not None
    assert s.inputs.shape == (1, 12, 12, 3)  # the 20x16 image was resized to the model's input
    cls = int(s.baseline.target_indices[0])
    assert cls == int(np.argmax(s.baseline.logits[0]))
    ref = _tape_logit_grad(model, s.inputs, cls)
    np.testing.assert_allclose(s.baseline.input_grad, ref, rtol=1e-4, atol=1e-6)
    # capture="all": every non-input node's signal is there, so any node's map needs no new pass
    assert set(s.baseline.node_grads) == {n.id for n in s.graph.nodes if not n.is_input}
    top = s.results.top_k(3)
    assert [i for i, _ in top] == list(np.argsort(-s.baseline.predictions[0])[:3])


def test_rule_changes_result_and_keeps_baseline(model, image):
    s = Session(InlineExecutor())
    rec = Recorder(s)
    s.set_model(model)
    s.fed.set_image(image)
    base_grad = s.baseline.input_grad.copy()
    assert s.editor.add_rule("c1", "zero")
    assert s.result.rules == {"c1": "zero"}
    assert s.result.stats["c1:pre"].status == "zero"  # nothing flows below the zeroed activation
    assert np.all(s.result.input_grad == 0)
    np.testing.assert_array_equal(s.baseline.input_grad, base_grad)  # baseline untouched
    assert s.editor.ruled_nodes() == {"c1": "zero"}
    assert rec.names().count("result_changed") >= 2
    assert not rec.errors()


def test_scale_rule_scales_the_signal_below(loaded):
    s = loaded
    s.editor.clear()
    base = s.baseline.input_grad.copy()
    s.editor.add_rule("c2", "scale", {"factor": 3.0})
    np.testing.assert_allclose(s.result.input_grad, 3.0 * base, rtol=1e-5, atol=1e-7)
    s.editor.clear()


def test_undo_redo_and_replacing_a_node_entry(loaded):
    s = loaded
    s.editor.clear()
    start = s.plan
    s.editor.add_rule("c2", "scale", {"factor": 2.0})
    s.editor.add_rule("c2", "scale", {"factor": 5.0})  # same selector: replaced, not piled up
    assert [e.params["factor"] for e in s.plan.entries] == [5.0]
    s.editor.add_rule("type:Conv2D", "zero")
    assert len(s.plan.entries) == 2
    assert s.editor.undo() and s.plan.entries[-1].params == {"factor": 5.0}
    assert s.editor.undo() and s.plan.entries[0].params == {"factor": 2.0}
    assert s.editor.redo() and s.plan.entries[0].params == {"factor": 5.0}
    s.editor.add_rule("gap", "zero")  # a new change drops the redo branch
    assert not s.editor.can_redo
    assert s.editor.remove_entry(0) and [e.select for e in s.plan.entries] == ["gap"]
    while s.editor.can_undo:
        s.editor.undo()
    assert s.plan == Plan() and start == Plan() or s.plan == start
    s.editor.clear()


def test_rule_that_cannot_run_is_refused_with_a_message(loaded):
    s = loaded
    rec = Recorder(s)
    before = s.plan
    assert not s.editor.add_rule("gap", "backward_as", {"activation": "sigmoid"})  # not an activation node
    assert s.plan == before
    ((title, message, exc),) = rec.errors()
    assert isinstance(exc, PlanError) and "gap" in message
    assert not s.editor.add_rule("c2", "scale", {"factor": "lots"})
    assert "factor" in rec.errors()[-1][1]


def test_stale_results_are_dropped():
    s = Session(ManualExecutor())
    s.set_model(_cnn())
    s.jobs.executor.run_all()
    s.fed.set_image(np.full((12, 12, 3), 128, np.uint8))
    first = s.jobs.executor.jobs[-1]
    s.editor.add_rule("c1", "zero")
    second = s.jobs.executor.jobs[-1]
    assert first is not second and first.kind == second.kind == "run"
    s.jobs.executor.run(second)  # the newer request finishes first
    assert s.result.rules == {"c1": "zero"}
    shown = s.result
    s.jobs.executor.run(first)  # the older one arrives late: dropped (skipped before running)
    assert s.result is shown and s.jobs.busy is None


def test_while_a_new_plan_computes_the_previous_result_keeps_its_own_read_out():
    """After Apply mwp the old gradient map was redrawn with mwp's "sum" reduction: a picture of no result."""
    s = Session(ManualExecutor())
    s.set_model(_cnn())
    s.fed.set_image(np.full((12, 12, 3), 100, np.uint8))
    s.jobs.executor.run_all()
    before = s.overlay().heat.copy()
    assert s.view.reduction == "max_abs"
    s.editor.apply_method("mwp")  # queued, not run: the shown result is the plain gradient's
    assert s.view.reduction == "sum" and s.result_is_stale
    assert s.shown_view.reduction == "max_abs"
    np.testing.assert_array_equal(s.overlay().heat, before)
    s.jobs.executor.run_all()
    assert not s.result_is_stale and s.shown_view == s.view and s.results.method == "mwp"


def test_a_preset_that_replaces_hand_made_entries_says_so():
    s = Session(InlineExecutor())
    rec = Recorder(s)
    s.set_model(_cnn())
    s.editor.add_rule("c1", "zero")
    s.editor.add_rule("c2", "sign")
    assert s.editor.apply_method("guided_backprop")
    assert any("replaced the 2 hand-made plan entries (Ctrl+Z brings them back)" in m for m in rec.statuses())
    rec.status.clear()
    assert s.editor.apply_method("gradient") and not any("replaced" in m for m in rec.statuses())  # a preset's plan
    s.editor.undo()
    s.editor.undo()
    assert [e.select for e in s.plan.entries] == ["c1", "c2"] and s.editor.method_name == "custom plan"


def test_cancel_drops_the_running_request():
    s = Session(ManualExecutor())
    rec = Recorder(s)
    s.set_model(_cnn())
    s.jobs.executor.run_all()  # loads, then runs once on a random input (no image yet)
    before = s.result
    s.fed.set_image(np.full((12, 12, 3), 100, np.uint8))
    assert s.jobs.busy is not None
    job = s.jobs.executor.jobs[-1]
    s.cancel()
    assert s.jobs.busy is None and rec.events[-1] == ("busy_changed", (None,))
    s.jobs.executor.run(job)
    assert s.result is before  # the cancelled request's result never reached the view


def test_tensorflow_runs_only_on_the_worker_thread(model, image):
    ex = ThreadExecutor()
    try:
        s = Session(ex)
        threads: set[int] = set()
        s.set_model(model)
        assert ex.wait_idle(120)
        engine = s.document.engine
        real = engine.backward

        def spy(*a, **k):
            threads.add(threading.get_ident())
            return real(*a, **k)

        engine.backward = spy
        s.fed.set_image(image)
        s.editor.add_rule("c1", "zero")
        assert ex.wait_idle(120)
        assert s.result is not None and s.result.rules == {"c1": "zero"}
        assert threads and threading.get_ident() not in threads
        assert ex.thread_ids == threads
    finally:
        ex.shutdown()


def test_thread_executor_skips_stale_jobs_and_reports_progress():
    ex = ThreadExecutor()
    gate = threading.Event()
    done: list[int] = []
    progress: list[str] = []
    latest = {"id": 0}
    try:

        def blocker(token):
            gate.wait(10)
            token.report("halfway")
            return 0

        ex.submit(Job("k", 0, blocker, done.append, lambda e: None, on_progress=progress.append))
        for i in (1, 2, 3):
            latest["id"] = i
            ex.submit(
                Job("k", i, lambda t, i=i: i, done.append, lambda e: None, is_current=lambda i=i: latest["id"] == i)
            )
        gate.set()
        assert ex.wait_idle(10)
        assert done == [0, 3] and ex.jobs_skipped == 2
        assert progress == ["halfway"]
    finally:
        ex.shutdown()


def test_overlay_map_is_the_channel_reduction_of_the_signal(loaded):
    s = loaded
    s.editor.clear()
    s.viewing.set(reduction="max_abs", times_input=False, readout_node=INPUT_KEY)
    ov = s.overlay()
    g = s.result.input_grad[0]
    np.testing.assert_allclose(ov.saliency, np.max(np.abs(g), axis=-1), rtol=1e-6)
    assert ov.spatial and ov.heat.shape == s.fed.image.shape and ov.blend.shape == s.fed.image.shape
    assert ov.heat.dtype == np.uint8
    s.viewing.set(times_input=True, reduction="sum")
    ov = s.overlay()
    np.testing.assert_allclose(ov.saliency, np.sum(g * s.result.inputs[0][0], axis=-1), rtol=1e-5, atol=1e-7)
    s.viewing.set(readout_node=None, times_input=False, reduction="max_abs")
    s.selection.select("c2")
    ov = s.overlay()
    assert ov.node == "c2"
    np.testing.assert_allclose(ov.saliency, np.max(np.abs(s.result.node_grads["c2"][0]), axis=-1), rtol=1e-6)
    s.selection.select("gap")  # (batch, 5): not spatial, shown as a strip
    ov = s.overlay()
    assert not ov.spatial and ov.saliency.shape == (1, 5)
    s.selection.select(None)


def test_to_map_shapes():
    rng = np.random.default_rng(0)
    m, spatial = to_map(rng.standard_normal((4, 5, 3)), "l2")
    assert spatial and m.shape == (4, 5)
    m, spatial = to_map(rng.standard_normal((7,)), "max_abs")
    assert not spatial and m.shape == (1, 7)


def test_method_sets_view_defaults(loaded):
    s = loaded
    assert s.editor.apply_method("gradient_x_input")
    assert s.view.times_input and s.view.signed and s.view.reduction == "sum"
    assert s.editor.apply_method("gradient")
    assert not s.view.times_input and s.view.normalization == "minmax"


def test_target_class_change_reruns(loaded):
    s = loaded
    s.editor.clear()
    other = [i for i, _ in s.results.top_k(3)][-1]
    s.targeting.set_class(other)
    assert int(s.result.target_indices[0]) == other
    s.targeting.set(Target())


def test_non_image_model_gets_a_random_input():
    keras.utils.set_random_seed(3)
    i = keras.Input((6,))
    o = keras.layers.Dense(2, name="d")(keras.layers.Dense(4, activation="tanh", name="h")(i))
    s = Session(InlineExecutor())
    s.set_model(keras.Model(i, o))
    assert s.result is not None and "random" in s.fed.note
    assert s.result.input_grad.shape == (1, 6)


def test_corrupt_model_reports_and_session_keeps_working(tmp_path, model):
    bad = tmp_path / "broken.keras"
    bad.write_bytes(b"this is not a zip file at all" * 10)
    s = Session(InlineExecutor())
    rec = Recorder(s)
    s.open_model(bad)
    ((title, message, exc),) = rec.errors()
    assert isinstance(exc, ModelLoadError) and message == str(exc) and s.graph is None and s.jobs.busy is None
    good = tmp_path / "good.keras"
    model.save(good)
    s.open_model(good)
    assert s.graph is not None and s.document.path == str(good)


def test_a_model_is_drawn_while_its_weights_load_and_withdrawn_if_they_fail(tmp_path, model):
    good = tmp_path / "good.keras"
    model.save(good)
    bad = with_damaged_weights(good, tmp_path / "bad.keras")
    s = Session(InlineExecutor())
    rec = Recorder(s)
    seen: list[tuple] = []
    s.document.previewed.connect(lambda graph, layout: seen.append(("preview", graph, layout, s.graph)))
    s.document.loaded.connect(lambda graph: seen.append(("loaded", graph)))
    s.open_model(good)
    (kind, graph, layout, held), (kind2, loaded) = seen
    assert (kind, kind2) == ("preview", "loaded") and held is None  # the Session took the model only at the end
    assert loaded is graph and s.document.layout is layout and not s.document.previewing

    seen.clear()
    s.open_model(bad)  # its graph is drawn, then its weights fail: back to the model held
    assert [event[0] for event in seen] == ["preview", "preview"] and seen[0][3] is graph
    assert seen[1][1:3] == (None, None) and s.graph is graph and not s.document.previewing
    ((_, message, exc),) = rec.errors()
    assert isinstance(exc, ModelLoadError) and "bad.keras" in message

    s.document._preview({"graph": graph, "layout": layout})  # as a load drawing its graph would; then Esc
    s.cancel()
    assert seen[-1][1:3] == (None, None) and not s.document.previewing and s.graph is graph


def test_a_checkpoint_folder_is_drawn_before_its_weights_are_read_and_shows_how_much_is_read():
    folder = Path(__file__).resolve().parents[1] / "data" / "hf" / "llama"
    s = Session(InlineExecutor())
    rec = Recorder(s)
    seen: list[tuple] = []
    s.document.previewed.connect(lambda graph, layout: seen.append(("preview", graph is not None)))
    s.document.loaded.connect(lambda graph: seen.append(("loaded", graph is not None)))
    busy: list[str] = []
    s.jobs.busy_changed.connect(lambda label: busy.append(label))
    s.open_model(folder)
    assert seen == [("preview", True), ("loaded", True)] and not rec.errors()
    read = [m for m in busy if m and m.startswith("Loading the weights... ") and " of " in m]
    done, total = read[-1].removeprefix("Loading the weights... ").split(" of ")
    assert len(read) > 3 and done.endswith(" MB") and float(done[:-3]) >= 0.9 * float(total[:-3]) > 0


def test_exports_and_session_file_round_trip(tmp_path, model, image):
    from PIL import Image

    good = tmp_path / "m.keras"
    model.save(good)
    img_path = tmp_path / "in.png"
    Image.fromarray(image).save(img_path)
    s = Session(InlineExecutor())
    s.open_model(good)
    assert s.fed.open(img_path)
    s.editor.add_rule("c1", "scale", {"factor": 0.5})
    s.targeting.set_class(1)
    s.viewing.set(colormap="hot", alpha=0.3, readout_node=None)  # map at the selected node
    s.selection.select("c2")

    png = s.exports.overlay(tmp_path / "ov.png")
    with Image.open(png) as im:
        h, w = image.shape[:2]
        scale = max(512, h, w) / max(h, w)  # the image's aspect, at least 512 px on the long side
        assert im.format == "PNG" and im.size == (round(w * scale), round(h * scale))
    side = json.loads(png.with_suffix(".json").read_text())
    assert side["plan"]["entries"][0]["rule"] == "scale" and side["readout_node"] == "c2"

    csv_path = s.exports.flow_csv(tmp_path / "flow.csv")
    rows = csv_path.read_text().strip().splitlines()
    assert len(rows) == 1 + len(s.result.stats)
    assert Plan.load(s.exports.plan(tmp_path / "plan.json")) == s.plan

    saved = s.save(tmp_path / "work")
    assert saved.name == "work.gradscope.json"
    data = read_session_file(saved)
    assert data["schema"] == SESSION_SCHEMA and data["model"] == str(good)

    t = Session(InlineExecutor())
    assert t.load(saved)
    assert t.plan == s.plan and t.target == s.target and t.view == s.view
    assert t.fed.image_path == str(img_path) and t.selected == "c2"
    assert t.result is not None and t.result.rules == {"c1": "scale"}


def test_a_session_file_of_the_first_id_scheme_opens_with_its_meaning(tmp_path, model):
    """Schema 1 called a fused layer's activation "c1:act" and its linear part "c1": both are renamed on load."""
    good = tmp_path / "m.keras"
    model.save(good)
    p = tmp_path / "old.gradscope.json"
    plan = {"schema": 1, "entries": [{"select": "c1:act", "rule": "zero"}, {"select": "c1", "rule": "sign"}]}
    p.write_text(
        json.dumps(
            {
                "schema": 1,
                "model": str(good),
                "plan": plan,
                "selected": "c1:act",
                "target": {"kind": "channel", "node": "c1", "channel": 0},
                "view": {"readout_node": "c1:act"},
            }
        )
    )
    s = Session(InlineExecutor())
    assert s.load(p)
    assert [e.select for e in s.plan.entries] == ["c1", "c1:pre"] and s.plan.schema == 2
    assert s.selected == "c1" and s.target.node == "c1:pre" and s.view.readout_node == "c1"
    assert s.result is not None and s.result.rules == {"c1": "zero", "c1:pre": "sign"}
    assert read_session_file(s.save(tmp_path / "new"))["plan"]["schema"] == 2


def test_a_session_naming_nodes_the_model_lacks_opens_without_them_and_says_so(tmp_path, model):
    good = tmp_path / "m.keras"
    model.save(good)
    p = tmp_path / "stale.gradscope.json"
    p.write_text(
        json.dumps(
            {
                "model": str(good),
                "selected": "conv9",
                "view": {"readout_node": "gone"},
                "target": {"kind": "channel", "node": "c9", "channel": 0},
            }
        )
    )
    s = Session(InlineExecutor())
    rec = Recorder(s)
    assert s.load(p) and not rec.errors()
    assert s.selected is None and s.view.readout_node == "<input>" and s.target == Target()
    assert any("conv9, gone, c9" in m for m in rec.statuses()), rec.statuses()
    assert s.result is not None  # the rest of the session applied and computed


def test_bad_session_files(tmp_path):
    p = tmp_path / "x.gradscope.json"
    p.write_text("{nope")
    with pytest.raises(SessionFileError, match="not valid JSON"):
        read_session_file(p)
    p.write_text(json.dumps({"schema": 99, "model": "m.keras"}))
    with pytest.raises(SessionFileError, match="schema 99"):
        read_session_file(p)
    p.write_text(json.dumps({"schema": 1, "model": "m.keras", "plan": {"entries": [{"select": "x"}]}}))
    with pytest.raises(SessionFileError, match="rule"):
        read_session_file(p)
    s = Session(InlineExecutor())
    rec = Recorder(s)
    assert not s.load(p) and rec.errors()


def test_layout_invariants(loaded):
    g = loaded.graph
    lay = compute_layout(g)
    assert set(lay.boxes) == set(g.ids())
    for a, b in g.edges():  # top to bottom: every edge goes down
        assert lay.boxes[b].y > lay.boxes[a].y
    boxes = list(lay.boxes.values())
    for i, p in enumerate(boxes):  # no two boxes overlap
        for q in boxes[i + 1 :]:
            assert abs(p.x - q.x) >= p.w - 1e-6 or abs(p.y - q.y) >= p.h - 1e-6
    fallback = compute_layout(g, use_grandalf=False)
    assert fallback.engine == "layered" and set(fallback.boxes) == set(g.ids())
    for a, b in g.edges():
        assert fallback.boxes[b].y > fallback.boxes[a].y


def test_layout_collapses_nested_models():
    keras.utils.set_random_seed(0)
    inner = keras.Sequential([keras.layers.Dense(5, activation="relu"), keras.layers.Dense(4)], name="inner")
    i = keras.Input((3,))
    o = keras.layers.Dense(2, name="head")(inner(keras.layers.Dense(3, name="stem")(i)))
    s = Session(InlineExecutor(), auto_run=False)
    s.set_model(keras.Model(i, o))
    g = s.graph
    assert "inner" in g.groups
    lay = compute_layout(g)
    assert [f.id for f in lay.frames] == ["inner"]
    members = {n.id for n in g.nodes if n.group == "inner"}
    col = compute_layout(g, {"inner"})
    assert "group:inner" in col.boxes and set(col.boxes["group:inner"].members) == members
    assert not members & set(col.boxes) and not col.frames
    assert {(e.src, e.dst) for e in col.edges} == {
        (g.input_ids[0], "stem"),
        ("stem", "group:inner"),
        ("group:inner", "head"),
    }
    assert col.box_of(next(iter(members))).id == "group:inner"
    seen = []
    s.document.layout_changed.connect(seen.append)
    s.document.set_collapsed("inner", True)
    assert seen and "group:inner" in seen[-1].boxes


def test_class_names_from_a_description_beside_the_model(tmp_path):
    from gradscope.app.files.session_files import find_class_names

    model = tmp_path / "net.keras"
    model.write_bytes(b"")
    assert find_class_names(model) == []
    (tmp_path / "other_meta.json").write_text(json.dumps({"name": "other", "class_names": ["x"]}))
    assert find_class_names(model) == []  # describes another model
    (tmp_path / "zz_meta.json").write_text(json.dumps({"name": "net", "class_names": ["cat", "dog"]}))
    assert find_class_names(model) == ["cat", "dog"]
    s = Session(InlineExecutor())
    s.document.class_names = ["cat", "dog"]
    assert s.document.class_label(1) == "1 dog" and s.document.class_label(5) == "5"


def test_session_imports_without_qt_or_tensorflow():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for m in ('PySide6', 'tensorflow', 'keras'): sys.modules[m] = None\n"
        "import gradscope.app.session, gradscope.app.work.worker, gradscope.render.graph_layout\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_user_rule_file_loads_and_runs(loaded, tmp_path):
    rule_file = tmp_path / "my_rules.py"
    rule_file.write_text(
        "from gradscope.rules.base import Rule, register_rule\n\n"
        "@register_rule('halve_session_test')\n"
        "class Halve(Rule):\n"
        "    '''Half of the true VJP.'''\n\n"
        "    def backward(self, ctx, grad_outputs):\n"
        "        return ctx.vjp([0.5 * g for g in grad_outputs])\n"
    )
    s = loaded
    s.editor.clear()
    seen = []
    s.catalog.changed.connect(seen.append)
    s.catalog.load_file(rule_file)
    assert seen == [["halve_session_test"]]
    s.editor.add_rule("c2", "halve_session_test")
    np.testing.assert_allclose(s.result.input_grad, 0.5 * s.baseline.input_grad, rtol=1e-5, atol=1e-8)
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    rec = Recorder(s)
    s.catalog.load_file(broken)
    assert seen == [["halve_session_test"]] and "boom" in rec.errors()[0][1]
    s.editor.clear()


# ------------------------------------------------------------------------------------------------ diagnostics
HYPERNET = resource_path("hypernet")


def _stop_gradient_model():
    """x -> a -> stop_gradient -+-> b;  x -> c -+ : a's weights get no gradient, b's and c's do."""
    keras.utils.set_random_seed(4)
    i = keras.Input((5,), name="x")
    held = keras.ops.stop_gradient(keras.layers.Dense(4, name="a")(i))
    o = keras.layers.Dense(3, name="b")(keras.layers.Dense(4, name="c")(i) + held)
    return keras.Model(i, o, name="sg")


def _tape_connected(model, x) -> dict[str, bool]:
    """Independent reference: which trainable variables get a (non-None) gradient of the top-1 output."""
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        y = model(x)
        picked = y[0, int(np.argmax(y[0]))]
    grads = tape.gradient(picked, model.trainable_variables)
    return {v.path: g is not None for v, g in zip(model.trainable_variables, grads)}


@pytest.fixture
def no_hypernet_classes(monkeypatch):
    """Forget the hypernetwork layers other tests registered, so loading needs the custom-objects file."""
    registry = keras.saving.get_custom_objects()
    for name in [n for n in registry if n.startswith("gradscope_hypernet>")]:
        monkeypatch.delitem(registry, name)


def test_diagnose_names_the_cut_and_agrees_with_the_tape():
    m = _stop_gradient_model()
    s = Session(InlineExecutor())
    seen = []
    s.reports.diagnosis_changed.connect(seen.append)
    s.set_model(m)
    assert seen == [None]  # a new model has no report yet
    assert s.diagnose() and seen[-1] is s.reports.diagnosis
    report = s.reports.diagnosis
    expect = _tape_connected(m, s.inputs)
    assert {v.path for v in report.variables} == set(expect)
    assert {v.path: v.connected for v in report.variables} == expect
    assert not all(expect.values()) and any(expect.values())
    ((cut, blocked),) = report.cuts()
    assert cut.op_type == "StopGradient" and cut.node in s.graph
    assert {v.path for v in blocked} == {p for p, ok in expect.items() if not ok}
    roles = s.reports.highlight()
    assert roles[cut.node] == "cut" and roles["a"] == "blocked" and "b" not in roles and "c" not in roles
    s.set_model(_cnn())
    assert s.reports.diagnosis is None and seen[-1] is None and s.reports.highlight() == {}


def test_diagnose_without_a_model_is_a_message():
    s = Session(InlineExecutor())
    rec = Recorder(s)
    assert not s.diagnose()
    assert "Open a model" in rec.errors()[0][1]


def test_a_new_model_drops_a_pending_diagnosis():
    s = Session(ThreadExecutor())
    try:
        seen = []
        s.reports.diagnosis_changed.connect(seen.append)
        s.set_model(_stop_gradient_model())
        assert s.jobs.executor.wait_idle(120)
        assert s.diagnose() and s.reports.diagnosing
        s.set_model(_cnn())  # before the report is delivered: it belongs to the old model
        assert s.jobs.executor.wait_idle(120)
        assert s.reports.diagnosis is None and seen == [None, None] and not s.reports.diagnosing
        assert s.graph.model_name == "tiny"
    finally:
        s.jobs.executor.shutdown()


def test_custom_objects_file_opens_the_hypernetwork_and_round_trips(tmp_path, no_hypernet_classes):
    from gradscope.core.errors import CustomObjectError

    broken, layers = HYPERNET / "hypernet_assign.keras", HYPERNET / "hyperlayers.py"
    s = Session(InlineExecutor())
    rec = Recorder(s)
    s.open_model(broken)
    ((_, message, exc),) = rec.errors()
    assert isinstance(exc, CustomObjectError) and "AssignedDense" in message and s.graph is None
    assert s.document.load_request == {"path": str(broken), "safe_mode": True, "custom_objects_file": None}
    s.open_model(broken, custom_objects_file=layers)
    assert s.graph is not None and "target_dense" in s.graph and s.document.custom_objects_file == str(layers)
    assert s.diagnose()
    (cut, blocked), *_ = s.reports.diagnosis.cuts()
    assert cut.op_type == "AssignVariableOp" and cut.node == "target_dense"
    assert {v.node for v in blocked} == {"hyper_hidden:pre", "hyper_head"}  # the nodes holding the weights
    saved = s.save(tmp_path / "hyper")
    assert read_session_file(saved)["custom_objects"] == str(layers)
    registry = keras.saving.get_custom_objects()
    for name in [n for n in registry if n.startswith("gradscope_hypernet>")]:
        del registry[name]  # the session file alone must bring the layers back
    u = Session(InlineExecutor())  # without consent the file is not run: the model cannot load
    rec_u = Recorder(u)
    u.load(saved)
    assert u.graph is None and isinstance(rec_u.errors()[0][2], CustomObjectError)
    assert not [n for n in registry if n.startswith("gradscope_hypernet>")]
    t = Session(InlineExecutor())
    assert t.load(saved, allow_code=True) and t.graph is not None and t.document.custom_objects_file == str(layers)


def test_a_bad_custom_objects_file_is_a_message(tmp_path):
    from gradscope.core.errors import CustomObjectError

    bad = tmp_path / "layers.py"
    bad.write_text("raise ValueError('no layers here')\n")
    s = Session(InlineExecutor())
    rec = Recorder(s)
    s.open_model(HYPERNET / "hypernet_tensor.keras", custom_objects_file=bad)
    ((_, message, exc),) = rec.errors()
    assert isinstance(exc, CustomObjectError) and "layers.py" in message and "no layers here" in message
    assert s.graph is None and s.jobs.busy is None
