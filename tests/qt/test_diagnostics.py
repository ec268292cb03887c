"""The diagnostics panel end to end, offscreen, on the hypernetwork examples (assign cuts the gradient vs
predicted weights passed as tensors), and opening a model that needs a custom-objects file."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt

from gradscope.core.resources import resource_path
from gradscope.qt.diagnostics_panel import COLUMNS, CUT_COLUMN

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

HYPERNET = resource_path("hypernet")
LAYERS = HYPERNET / "hyperlayers.py"


def _tape_connected(path: Path) -> dict[str, bool]:
    """Independent reference on a separate copy of the model: which trainable variables get a (non-None)
    GradientTape gradient of the top-1 output (the softmax of the top logit: same paths as the logit)."""
    from gradscope.io.models import load_custom_objects_file, load_model

    model = load_model(path, custom_objects=load_custom_objects_file(LAYERS))
    rng = np.random.default_rng(0)
    xs = [tf.constant(rng.standard_normal((1, *i.shape[1:])).astype(np.float32)) for i in model.inputs]
    with tf.GradientTape() as tape:
        y = model(xs)
        picked = y[0, int(np.argmax(y[0]))]
    grads = tape.gradient(picked, model.trainable_variables)
    return {v.path: g is not None for v, g in zip(model.trainable_variables, grads)}


def _open_and_diagnose(window, qtbot, wait_idle, path: Path):
    window.open_model(str(path), custom_objects_file=str(LAYERS))
    wait_idle(window)
    s = window.session
    gui_thread = threading.get_ident()
    ran_on: list[int] = []
    import gradscope.engine.diagnostics.paths as diagnose

    real = diagnose.diagnose_model

    def spy(*args, **kwargs):
        ran_on.append(threading.get_ident())
        return real(*args, **kwargs)

    diagnose.diagnose_model = spy
    try:
        panel = window.diagnostics
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
        assert not panel.run_button.isEnabled()  # running: the GUI thread is free, the button says so
        qtbot.waitUntil(lambda: s.reports.diagnosis is not None and s.jobs.busy is None, timeout=120_000)
    finally:
        diagnose.diagnose_model = real
    assert ran_on and gui_thread not in ran_on  # TensorFlow work ran on the worker
    assert window.diagnostics_dock.isVisible() and panel.run_button.isEnabled()
    return s.reports.diagnosis


def _cell(panel, row: int, column: str) -> str:
    return panel.table.item(row, COLUMNS.index(column)).text()


def _pixel(view, node_id: str):
    """The colour drawn near the left edge of a node's box (clear of its text)."""
    item = view.items_by_id[node_id]
    view.centerOn(item)
    image = view.viewport().grab().toImage()
    pos = view.mapFromScene(item.scenePos().x() - item.box.w / 2 + 4, item.scenePos().y())
    return image.pixelColor(pos)


def test_broken_hypernetwork_shows_the_assign_cut(window, qtbot, wait_idle):
    path = HYPERNET / "hypernet_assign.keras"
    report = _open_and_diagnose(window, qtbot, wait_idle, path)
    s, panel, view = window.session, window.diagnostics, window.graph_view
    expect = _tape_connected(path)
    assert not all(expect.values())
    # one row per trainable variable, its status as the tape sees it
    rows = {_cell(panel, r, "variable"): r for r in range(panel.table.rowCount())}
    assert set(rows) == set(expect)
    for name, connected in expect.items():
        assert _cell(panel, rows[name], "status") == ("connected" if connected else "blocked"), name
    blocked = [n for n, ok in expect.items() if not ok]
    for name in blocked:
        cut_text = _cell(panel, rows[name], "cut at")
        assert "AssignVariableOp" in cut_text and "target_dense" in cut_text
    assert all(_cell(panel, rows[n], "cut at") == "" for n, ok in expect.items() if ok)
    assert "AssignVariableOp" in panel.summary.text() and f"{len(blocked)} of {len(expect)}" in panel.summary.text()
    # clicking the cut cell selects the node that cuts the path; the text says why and how to fix it
    row = rows[blocked[0]]
    panel.table.setCurrentCell(row, CUT_COLUMN)
    assert s.selected == "target_dense" and view.selected_id() == "target_dense"
    details = panel.details.toPlainText()
    assert "AssignVariableOp" in details and "Why:" in details and "stateless_call" in details
    assert "target_dense/target/kernel" in details  # the variable the assign writes
    assert "Cuts the gradient" in window.inspector.info.toPlainText()
    # any other cell selects the variable's own node
    panel.table.setCurrentCell(row, COLUMNS.index("variable"))
    assert s.selected == report.variables[row].node in ("hyper_hidden:pre", "hyper_head")  # the node holding it
    # the graph: the cut node and the nodes on its path are red, the rest neutral
    assert view.items_by_id["target_dense"].diag_role == "cut"
    for node in ("hyper_hidden", "hyper_head"):
        assert view.items_by_id[node].diag_role in ("blocked", "path")
    assert view.items_by_id["classifier"].diag_role is None
    assert window.color_by.currentText() == "diagnosis"
    s.selection.select(None)
    cut, on_path, plain = (_pixel(view, n) for n in ("target_dense", "hyper_head", "classifier"))
    assert cut.red() > 150 and cut.green() < 90 and cut.blue() < 90, cut.name()
    assert on_path.red() > on_path.green() + 30 and on_path.red() > on_path.blue() + 30, on_path.name()
    assert abs(plain.red() - plain.green()) < 20 and abs(plain.red() - plain.blue()) < 20, plain.name()
    edge = view.edge_items[("hyper_head", "target_dense")].pen().color()
    assert edge.red() > 150 and edge.green() < 60
    # a layout change (collapse/expand) keeps the marks
    view.set_layout(s.document.layout, keep_view=True)
    assert view.items_by_id["target_dense"].diag_role == "cut"


def test_correct_hypernetwork_reports_all_connected(window, qtbot, wait_idle):
    path = HYPERNET / "hypernet_tensor.keras"
    report = _open_and_diagnose(window, qtbot, wait_idle, path)
    panel, view = window.diagnostics, window.graph_view
    expect = _tape_connected(path)
    assert all(expect.values()) and report.ok
    statuses = {_cell(panel, r, "variable"): _cell(panel, r, "status") for r in range(panel.table.rowCount())}
    assert statuses == {name: "connected" for name in expect}
    assert f"All {len(expect)} trainable variable(s) receive a gradient" in panel.summary.text()
    assert all(item.diag_role is None for item in view.items_by_id.values())
    assert window.color_by.currentText() == "plan"  # nothing to mark: the magnitudes stay
    # opening another model clears the report, the table and the marks
    window.open_model(str(HYPERNET / "hypernet_assign.keras"), custom_objects_file=str(LAYERS))
    wait_idle(window)
    assert window.session.reports.diagnosis is None and panel.table.rowCount() == 0


def test_custom_object_error_offers_a_file_and_retries(window, qtbot, wait_idle, monkeypatch):
    registry = keras.saving.get_custom_objects()
    for name in [n for n in registry if n.startswith("gradscope_hypernet>")]:
        monkeypatch.delitem(registry, name)  # as in a fresh process: the layers are unknown
    asked = []

    def choose(path, message):
        asked.append((path, message))
        return str(LAYERS)  # the user picks the file in the dialog

    window.choose_custom_objects = choose
    path = HYPERNET / "hypernet_assign.keras"
    with qtbot.waitSignal(window.error_shown, timeout=60_000) as sig:
        window.open_model(str(path))
    assert "AssignedDense" in sig.args[1]
    wait_idle(window)
    s = window.session
    assert asked == [(str(path), sig.args[1])]
    assert s.graph is not None and "target_dense" in s.graph and s.document.custom_objects_file == str(LAYERS)


def test_giving_up_on_custom_objects_leaves_the_window_usable(window, qtbot, wait_idle, monkeypatch, model_file):
    registry = keras.saving.get_custom_objects()
    for name in [n for n in registry if n.startswith("gradscope_hypernet>")]:
        monkeypatch.delitem(registry, name)
    window.choose_custom_objects = lambda path, message: None  # the user cancels the dialog
    with qtbot.waitSignal(window.error_shown, timeout=60_000):
        window.open_model(str(HYPERNET / "hypernet_tensor.keras"))
    qtbot.waitUntil(lambda: window.session.jobs.busy is None, timeout=10_000)
    assert window.session.graph is None
    window.open_model(str(model_file))
    wait_idle(window)
    assert window.session.graph is not None
