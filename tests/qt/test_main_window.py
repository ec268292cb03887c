"""The GUI end to end, offscreen: open, select, set a rule, badges, exports, errors, responsiveness."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt, QTimer


def _open(window, qtbot, wait_idle, model_file, image_file=None):
    if image_file is not None:
        assert window.open_image(str(image_file))
    window.open_model(str(model_file))
    wait_idle(window)
    qtbot.waitUntil(lambda: window.session.catalog.ready, timeout=60_000)


def test_open_select_rule_badge_undo(window, qtbot, wait_idle, model_file, image_file):
    _open(window, qtbot, wait_idle, model_file, image_file)
    s, view = window.session, window.graph_view
    assert set(view.items_by_id) == set(s.graph.ids())
    assert window.windowTitle() == "gradscope — tiny.keras — input.png"
    # click the node in the graph: the selection drives the inspector
    item = view.items_by_id["c1"]
    view.centerOn(item)
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=view.mapFromScene(item.scenePos()))
    assert s.selected == "c1"
    assert "the output of layer c1" in window.inspector.info.toPlainText()  # the relu after c1:pre
    editor = window.inspector.rule_editor
    editor.select_rule("zero")
    baseline_grad = s.baseline.input_grad.copy()
    qtbot.mouseClick(editor.apply_node, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(
        lambda: s.jobs.busy is None and s.result is not None and s.result.rules == {"c1": "zero"}, timeout=60_000
    )
    assert view.items_by_id["c1"].rule == "zero"  # the badge
    assert view.items_by_id["c1:pre"].status == "zero"  # nothing flows below the zeroed activation
    assert np.all(s.result.input_grad == 0) and np.any(baseline_grad != 0)
    assert window.inspector.plan_table.table.rowCount() == 1
    assert "Backward rule: zero" in window.inspector.info.toPlainText()
    # the overlay shows the (now zero) map at the selected node's output, which still has a signal
    assert window.overlay.map_panel.pixmap() is not None
    window.undo_action.trigger()
    qtbot.waitUntil(lambda: s.jobs.busy is None and s.result is not None and not s.result.rules, timeout=60_000)
    assert view.items_by_id["c1"].rule is None
    assert window.inspector.plan_table.table.rowCount() == 0
    assert window.redo_action.isEnabled()


def test_apply_to_type_and_params_form(window, qtbot, wait_idle, model_file, image_file):
    _open(window, qtbot, wait_idle, model_file, image_file)
    s = window.session
    s.selection.select("c2")
    editor = window.inspector.rule_editor
    editor.select_rule("scale")
    factor = editor.params.editors["factor"][1]
    factor.setText("3.0")
    base = s.baseline.input_grad.copy()
    qtbot.mouseClick(editor.apply_type, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: s.jobs.busy is None and s.result is not None and len(s.result.rules) == 2, timeout=60_000)
    assert s.plan.entries[-1].select == "type:Conv2D" and s.plan.entries[-1].params == {"factor": 3.0}
    np.testing.assert_allclose(s.result.input_grad, 9.0 * base, rtol=1e-4, atol=1e-7)  # two scaled convs
    # a bad parameter is refused with a message, not a crash
    factor.setText("lots")
    with qtbot.waitSignal(window.error_shown, timeout=5_000) as sig:
        qtbot.mouseClick(editor.apply_node, Qt.MouseButton.LeftButton)
    assert "factor" in sig.args[1]
    # c1 is Conv2D(activation="relu")'s output, an Activation node: "all of type" means all relu activations
    # (issue 51: "all Activation" caught the softmax split off the classifier too)
    s.selection.select("c1")
    assert editor.apply_type.text() == "Apply to all relu activations"
    editor.select_rule("zero")
    qtbot.mouseClick(editor.apply_type, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: s.jobs.busy is None and s.plan.entries[-1].rule == "zero", timeout=60_000)
    assert s.plan.entries[-1].select == "activation:relu"
    zeroed = [n.id for n in s.graph.nodes if s.plan.entries[-1].matches(n)]
    assert zeroed == ["c1"] and s.graph.node("out").op_type == "Activation"  # not the softmax


def test_flow_plot_click_selects_and_exports(window, qtbot, wait_idle, model_file, image_file, tmp_path):
    from PIL import Image

    _open(window, qtbot, wait_idle, model_file, image_file)
    s = window.session
    flow = window.flow
    assert flow.node_ids == [n for n in s.graph.ids() if n in s.result.stats]
    flow.click_node("c2")
    assert s.selected == "c2" and window.graph_view.selected_id() == "c2"
    png = s.exports.overlay(tmp_path / "overlay.png")
    with Image.open(png) as im:
        im.verify()
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (512, 512)  # the 24x24 image, at least 512 px long
    assert png.with_suffix(".json").is_file()
    plot_png = flow.export_image(tmp_path / "flow.png")
    with Image.open(plot_png) as im:
        assert im.format == "PNG" and im.size[0] >= 800
    svg = flow.export_image(tmp_path / "flow.svg").read_text()
    assert "<svg" in svg
    csv_rows = s.exports.flow_csv(tmp_path / "flow.csv").read_text().splitlines()
    assert csv_rows[0].startswith("node,rule,status") and len(csv_rows) == 1 + len(flow.node_ids)


def test_corrupt_model_shows_error_and_app_keeps_working(window, qtbot, wait_idle, model_file, tmp_path):
    bad = tmp_path / "corrupt.keras"
    bad.write_bytes(b"PK\x03\x04 definitely not a keras archive" * 20)
    with qtbot.waitSignal(window.error_shown, timeout=60_000) as sig:
        window.open_model(str(bad))
    title, message = sig.args
    assert title == "Cannot open the model" and "corrupt.keras" in message
    assert "Traceback" not in message
    qtbot.waitUntil(lambda: window.session.jobs.busy is None, timeout=10_000)
    assert window.session.graph is None and not window.progress.isVisible()
    _open(window, qtbot, wait_idle, model_file)  # the window still works
    assert window.session.graph is not None


def test_unsafe_model_offers_explicit_opt_in(window, qtbot, wait_idle, tmp_path):
    _wait_for_tensorflow(window)
    import keras

    i = keras.Input((4,))
    o = keras.layers.Lambda(lambda t: t * 2.0, name="double")(i)
    o = keras.layers.Dense(2, name="d")(o)
    path = tmp_path / "lambda.keras"
    keras.Model(i, o).save(path)
    asked = []

    def confirm(p, message):
        asked.append((p, message))
        return True  # the user clicks "Open anyway (runs code from the file)"

    window.confirm_unsafe = confirm
    with qtbot.waitSignal(window.error_shown, timeout=60_000):
        window.open_model(str(path))
    wait_idle(window)
    assert asked and asked[0][0] == str(path)
    assert window.session.graph is not None and "double" in window.session.graph


def test_gui_stays_responsive_while_the_backward_pass_runs(window, qtbot, wait_idle, model_file, image_file):
    _open(window, qtbot, wait_idle, model_file, image_file)
    s = window.session
    engine = s.document.engine
    gui_thread = threading.get_ident()
    ran_on: list[int] = []
    real = engine.backward

    def spy(*args, **kwargs):
        ran_on.append(threading.get_ident())
        time.sleep(0.2)  # a pass that takes a while on any machine (the live path is fast on this tiny model)
        return real(*args, **kwargs)

    engine.backward = spy
    ticks = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(s.jobs.busy))
    timer.start(10)
    s.editor.add_rule("c2", "true_gradient")  # a new plan: traced afresh, which takes a while
    qtbot.waitUntil(
        lambda: s.jobs.busy is None and s.result is not None and s.result.rules == {"c2": "true_gradient"},
        timeout=60_000,
    )
    timer.stop()
    busy_ticks = [t for t in ticks if t is not None]
    assert len(busy_ticks) >= 3, ticks  # the event loop kept turning during the pass
    assert ran_on and gui_thread not in ran_on  # TensorFlow ran on the worker thread
    np.testing.assert_allclose(s.result.input_grad, s.baseline.input_grad, rtol=1e-5, atol=1e-8)


def test_nested_model_collapses(window, qtbot, wait_idle, tmp_path):
    _wait_for_tensorflow(window)
    import keras

    keras.utils.set_random_seed(0)
    inner = keras.Sequential(
        [keras.layers.Dense(5, activation="relu", name="dense"), keras.layers.Dense(4, name="dense_out")], name="inner"
    )
    i = keras.Input((3,))
    o = keras.layers.Dense(2, name="head")(inner(keras.layers.Dense(3, name="stem")(i)))
    path = tmp_path / "nested.keras"
    keras.Model(i, o).save(path)
    window.open_model(str(path))
    wait_idle(window)
    view = window.graph_view
    collapse, expand = window.graph_pane.group_buttons
    assert "inner/dense" in view.items_by_id and collapse.isVisibleTo(window)
    collapse.click()
    qtbot.waitUntil(lambda: "group:inner" in view.items_by_id, timeout=30_000)
    assert "inner/dense" not in view.items_by_id
    window.session.selection.select("inner/dense")  # a member of the collapsed box selects the box
    assert view.selected_id() == "group:inner"
    expand.click()
    qtbot.waitUntil(lambda: "inner/dense" in view.items_by_id, timeout=30_000)


def test_search_finds_and_selects(window, qtbot, wait_idle, model_file, image_file):
    _open(window, qtbot, wait_idle, model_file, image_file)
    view = window.graph_view
    view.focus_search()
    qtbot.keyClicks(view.search, "gap")
    assert window.session.selected == "gap" and view.items_by_id["gap"].matched
    view.zoom(2.0)
    before = view.transform().m11()
    view.fit_all()
    assert view.transform().m11() != before


def test_session_file_and_recent_models(window, qtbot, wait_idle, model_file, image_file, tmp_path):
    _open(window, qtbot, wait_idle, model_file, image_file)
    s = window.session
    s.editor.add_rule("c1", "zero")
    wait_idle(window)
    saved = s.save(tmp_path / "work")
    assert window._recent()[0] == str(model_file.resolve())
    s.editor.clear()
    wait_idle(window)
    window.open_path(str(saved))
    qtbot.waitUntil(
        lambda: s.jobs.busy is None and s.result is not None and s.result.rules == {"c1": "zero"}, timeout=60_000
    )
    assert window.inspector.plan_table.table.rowCount() == 1


def test_unknown_file_type_is_a_message(window, qtbot, tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello")
    with qtbot.waitSignal(window.error_shown, timeout=5_000) as sig:
        window.open_path(str(p))
    assert "not a model" in sig.args[1]


def test_cancel_button_drops_the_running_pass(window, qtbot, wait_idle, model_file, image_file):
    _open(window, qtbot, wait_idle, model_file, image_file)
    s = window.session
    shown = s.result
    s.editor.add_rule("c2", "scale", {"factor": 7.0})  # a new plan: a fresh trace, so it is still running
    assert window.cancel_button.isVisible() and window.progress.isVisible()
    qtbot.mouseClick(window.cancel_button, Qt.MouseButton.LeftButton)
    assert s.jobs.busy is None and not window.cancel_button.isVisible()
    assert window.status_label.text().startswith("Cancelled")
    assert s.plan == s.results.plan  # plan, map and labels describe the same (previous) result
    s.jobs.executor.wait_idle(60)  # the worker finishes the running call; its result must not be shown
    qtbot.wait(0)
    assert s.result is shown
    s.editor.undo()  # the cancelled edit is one undo away; it runs again and now shows
    qtbot.waitUntil(lambda: s.jobs.busy is None and s.result is not shown, timeout=60_000)
    assert s.result.rules == {"c2": "scale"}


def test_gui_modules_do_not_import_tensorflow():
    """The window shows before TensorFlow loads: that import happens on the worker (Session.start)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import gradscope.qt.main_window, gradscope.qt.app\n"
        "print('tensorflow' in sys.modules, 'keras' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_the_window_fits_a_1280x720_screen(window, qtbot, wait_idle, model_file, image_file):
    _open(window, qtbot, wait_idle, model_file, image_file)
    hint = window.minimumSizeHint()
    assert hint.width() <= 1280 and hint.height() <= 720, (hint.width(), hint.height())
    node = next(n for n in window.session.graph.nodes if n.fused_with is not None)
    assert node.label.splitlines()[0] == node.id  # the graph draws the id every file and command uses


def test_the_graph_pane_says_what_is_loading(window, qtbot, wait_idle, model_file):
    window.session.open_model(model_file)  # queued on the worker: the pane speaks at once
    texts = [i.toPlainText() for i in window.graph_view.scene().items() if hasattr(i, "toPlainText")]
    assert any("Loading" in t and model_file.name in t for t in texts), texts
    wait_idle(window)
    assert window.graph_view.layout_data is not None and window.graph_view.items_by_id


def test_the_flow_plot_has_a_legend_and_names_its_statistic(window, qtbot, wait_idle, model_file, image_file):
    _open(window, qtbot, wait_idle, model_file, image_file)
    flow = window.flow
    assert [label.text for _, label in flow.legend.items] == ["baseline (no rules)", "current plan"]
    assert "mean |g|" in flow.plot.getAxis("left").labelText
    window.session.open_model(model_file)  # while the next model loads, no stale bars
    assert flow.node_ids == [] and "loading" in flow.caption.text()
    wait_idle(window)
    assert flow.node_ids


def test_file_menu_exports_the_plan_as_a_python_script(
    window, qtbot, wait_idle, model_file, image_file, tmp_path, monkeypatch
):
    from PySide6.QtWidgets import QFileDialog

    _open(window, qtbot, wait_idle, model_file, image_file)
    window.session.editor.add_rule("c2", "scale", {"factor": 2.0})
    wait_idle(window)
    target = tmp_path / "train_fix.py"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), "Python (*.py)"))
    action = next(a for a in window.menuBar().actions()[0].menu().actions() if a.text() == "Export plan as Python…")
    action.trigger()
    text = target.read_text()
    assert "plan_model(model, PLAN)" in text and "'factor': 2.0" in text and str(model_file) in text
    compile(text, str(target), "exec")  # valid Python


def test_run_menu_sanity_checks_show_a_report(window, qtbot, wait_idle, model_file, image_file):
    from PySide6.QtWidgets import QPlainTextEdit

    _open(window, qtbot, wait_idle, model_file, image_file)
    menus = {a.text().replace("&", ""): a.menu() for a in window.menuBar().actions()}
    action = next(a for a in menus["Run"].actions() if a.text() == "Sanity checks of this plan")
    action.trigger()
    wait_idle(window)
    qtbot.waitUntil(lambda: getattr(window, "sanity_dialog", None) is not None, timeout=30000)
    shown = window.sanity_dialog.findChild(QPlainTextEdit)
    text = shown.toPlainText()
    assert "Model randomisation" in text and "Conservation" in text
    assert shown.lineWrapMode() == QPlainTextEdit.LineWrapMode.NoWrap  # the table's rows stay rows
    widest = max(shown.fontMetrics().horizontalAdvance(line) for line in text.splitlines())
    assert window.sanity_dialog.width() >= min(widest, window.width() - 100)  # wide enough for them


def test_a_large_model_opens_as_its_blocks_and_expands_on_double_click(window, qtbot, wait_idle, tmp_path):
    _wait_for_tensorflow(window)
    import keras

    keras.utils.set_random_seed(0)
    x = i = keras.Input((4,), name="tokens")
    for stage in (1, 2, 3):
        for block in range(1, 7):
            name = f"s{stage}_block{block}"
            h = keras.layers.Dense(4, name=f"{name}_1_dense")(x)
            h = keras.layers.ReLU(name=f"{name}_1_relu")(h)
            h = keras.layers.Dense(4, name=f"{name}_2_dense")(h)
            x = keras.layers.Add(name=f"{name}_add")([x, h])
    path = tmp_path / "blocks.keras"
    keras.Model(i, keras.layers.Dense(3, name="head")(x)).save(path)
    window.open_model(str(path))
    wait_idle(window)
    view = window.graph_view
    assert len(window.session.graph) == 74 and set(view.items_by_id) == {
        "tokens",
        "group:s1",
        "group:s2",
        "group:s3",
        "head",
    }
    item = view.items_by_id["group:s2"]
    # a real double-click, near the view's edge: the first click must neither scroll the box away from under
    # the second one nor select a member the user never picked (both happened on ResNet50)
    view.ensureVisible(item, 0, 0)
    at = view.mapFromScene(item.sceneBoundingRect().center())
    before = (view.horizontalScrollBar().value(), view.verticalScrollBar().value())
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=at)
    assert window.session.selected is None
    assert (view.horizontalScrollBar().value(), view.verticalScrollBar().value()) == before
    qtbot.mouseDClick(view.viewport(), Qt.MouseButton.LeftButton, pos=at)
    qtbot.waitUntil(lambda: "group:s2/s2_block1" in view.items_by_id, timeout=30_000)
    assert "s2_block1_1_dense" not in view.items_by_id  # one level at a time
    # a graph this size is laid out at once, even while the worker is busy (issue 51: the first expand of a
    # ResNet50 block waited ~7 s behind the background compile)
    release = threading.Event()
    window.session.jobs.submit("hold", "Holding the worker…", lambda token: release.wait(30), lambda v: None)
    window.session.document.set_collapsed("s1", False)
    assert "group:s1/s1_block1" in view.items_by_id  # drawn before the worker is free
    release.set()
    window.graph_pane.group_buttons[1].click()  # Expand all
    qtbot.waitUntil(lambda: "s2_block1_1_dense" in view.items_by_id, timeout=30_000)
    # Find a node inside a collapsed block (issue 51: it lit the group only): the blocks holding it open, the
    # node is selected and shown, and the inspector names it; Esc closes the Find box
    window.graph_pane.group_buttons[0].click()  # Collapse all
    qtbot.waitUntil(lambda: "s3_block4_2_dense" not in view.items_by_id, timeout=30_000)
    view.focus_search()
    qtbot.keyClicks(view.search, "s3_block4_2_de")
    qtbot.waitUntil(lambda: "s3_block4_2_dense" in view.items_by_id, timeout=30_000)
    qtbot.waitUntil(lambda: window.session.selected == "s3_block4_2_dense", timeout=10_000)
    assert view.viewport().rect().contains(view.mapFromScene(view.items_by_id["s3_block4_2_dense"].scenePos()))
    assert "s3_block4_2_dense" in window.inspector.info.toPlainText()
    assert "group:s1" in view.items_by_id  # only what hid it opened
    qtbot.keyClick(view.search, Qt.Key.Key_Escape)
    assert not view.search.isVisible() and view.search.text() == ""


def _wait_for_tensorflow(window) -> None:
    """TensorFlow imports on the worker at start: importing keras here at the same time registers its
    gradients twice (a KeyError from TensorFlow), so a test that builds a model waits for it first."""
    from PySide6.QtWidgets import QApplication

    deadline = time.monotonic() + 60
    while not window.session.catalog.ready and time.monotonic() < deadline:
        QApplication.processEvents()
        time.sleep(0.01)


def _open_tall_chain(window, wait_idle, tmp_path):
    """A chain of 51 nodes: flat (under the grouping threshold) and too tall to fit legibly."""
    _wait_for_tensorflow(window)
    import keras

    x = i = keras.Input((3,), name="first")
    for k in range(50):
        x = keras.layers.Dense(3, name=f"d{k}")(x)
    path = tmp_path / "tall.keras"
    keras.Model(i, x).save(path)
    window.open_model(str(path))
    wait_idle(window)


def test_fit_keeps_a_tall_graph_legible_and_shows_its_top(window, qtbot, wait_idle, tmp_path):

    from gradscope.qt.graph.view import LEGIBLE_ZOOM

    _open_tall_chain(window, wait_idle, tmp_path)
    view = window.graph_view
    view.fit_all()
    assert view.transform().m11() >= LEGIBLE_ZOOM  # not a one-pixel line
    top = view.items_by_id["first"]
    assert view.mapToScene(view.viewport().rect()).boundingRect().intersects(top.sceneBoundingRect())
    shown = view.mapFromScene(top.sceneBoundingRect()).boundingRect()
    assert shown.top() > view.legend.geometry().bottom()  # below the colour legend, not under it
    window.resize(1920, 1080)
    qtbot.wait(50)
    view.zoom(3.0)  # a user's zoom: no refit on resize; F fits the whole short graph below the legend
    view.fit_all()
    for item in view.items_by_id.values():
        box = view.mapFromScene(item.sceneBoundingRect()).boundingRect()
        if box.intersects(view.viewport().rect()):
            assert not box.intersects(view.legend.geometry()), item.box.title


def test_a_language_model_opens_with_its_main_path_in_sight_at_1280x720(window, qtbot, wait_idle):
    """Wider than the graph pane at a legible zoom: centred on its bounds, GPT-2 opened with its token embedding
    and its attention mask both cut; the column most boxes are in is shown whole instead."""
    window.resize(1280, 720)
    window.open_path("demo:tiny_gpt2")
    wait_idle(window)
    view = window.graph_view
    # the graph is drawn from the config first, then again once the weights are in: measure the second
    qtbot.waitUntil(lambda: window.session.result is not None and window.session.jobs.busy is None, timeout=60_000)
    qtbot.wait(100)
    view.fit_all()
    x0, _, x1, _ = view.layout_data.bounds
    assert (x1 - x0) * view.transform().m11() > view.viewport().width()  # the case: it does not fit across
    shown = view.viewport().rect()
    for node in ("token_ids", "gpt2_backbone/token_embedding"):
        item = view.items_by_id.get(node) or next(i for k, i in view.items_by_id.items() if k.endswith(node))
        assert shown.contains(view.mapFromScene(item.sceneBoundingRect()).boundingRect()), node


def test_view_menu_lays_the_graph_out_left_to_right(window, qtbot, wait_idle, model_file, image_file):
    _open(window, qtbot, wait_idle, model_file, image_file)
    window.lr_action.trigger()
    qtbot.waitUntil(lambda: window.graph_view.layout_data.direction == "LR", timeout=30_000)
    boxes = window.graph_view.layout_data.boxes
    assert boxes["c2"].x > boxes["c1:pre"].x
    window.lr_action.trigger()
    qtbot.waitUntil(lambda: window.graph_view.layout_data.direction == "TB", timeout=30_000)


def test_the_minimap_shows_when_the_graph_overflows_and_moves_the_view(window, qtbot, wait_idle, tmp_path):
    from PySide6.QtCore import QPointF
    from PySide6.QtGui import QMouseEvent

    window.resize(1920, 1080)  # a graph pane wide enough for a corner beside the column
    _open_tall_chain(window, wait_idle, tmp_path)
    view, minimap = window.graph_view, window.graph_view.minimap
    view.fit_all()
    qtbot.waitUntil(minimap.isVisible, timeout=5_000)  # 51 boxes in a column do not fit at a legible zoom
    boxes = set(view.items_by_id.values())
    assert not any(item in boxes for item in view.items(minimap.geometry()))  # beside the column, not over it
    before = view.mapToScene(view.viewport().rect().center())
    bottom = minimap._from_scene(view.items_by_id["d49"].sceneBoundingRect()).center()
    event = QMouseEvent(
        QMouseEvent.Type.MouseButtonPress,
        QPointF(bottom),
        QPointF(bottom),
        Qt.MouseButton.LeftButton,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    minimap.mousePressEvent(event)
    after = view.mapToScene(view.viewport().rect().center())
    assert after.y() > before.y() + 500  # the view moved down to the last layers
    view.zoom(0.05)  # everything fits: no overview
    assert not minimap.isVisible()
    window.resize(700, 500)  # a narrow pane: every corner holds a box of the column, so no overview
    view.fit_all()
    qtbot.wait(50)
    assert not minimap.isVisible() or not any(item in boxes for item in view.items(minimap.geometry()))


def test_the_flow_plot_draws_lines_when_bars_would_alias_and_names_the_node_under_the_mouse(
    window, qtbot, wait_idle, model_file, image_file
):
    _open(window, qtbot, wait_idle, model_file, image_file)
    flow = window.flow
    flow.plot.resize(2000, 300)
    flow.refresh()
    assert not flow.as_lines  # a few nodes: bars
    flow.plot.resize(100, 300)  # (100 - 90) px for the nodes: thinner than MIN_BAR_PIXELS each
    flow.refresh()
    assert flow.as_lines
    labels = [item[1].text for item in flow.legend.items]
    assert "baseline (no rules)" in labels and any(t.startswith("current plan") for t in labels)
    vb = flow.plot.getPlotItem().getViewBox()
    index = flow.node_ids.index("c2")
    centre = vb.mapSceneToView(vb.sceneBoundingRect().center())
    centre.setX(index)
    flow._on_hover(vb.mapViewToScene(centre))
    assert "<b>c2</b>" in flow.plot.toolTip() and "plan:" in flow.plot.toolTip()


def test_compare_two_plans_side_by_side_swap_and_export(
    window, qtbot, wait_idle, model_file, image_file, tmp_path, monkeypatch
):
    from PySide6.QtCore import QPointF
    from PySide6.QtWidgets import QFileDialog

    _open(window, qtbot, wait_idle, model_file, image_file)
    overlay, flow, s = window.overlay, window.flow, window.session
    assert not overlay.swap_button.isEnabled()
    overlay.pin_button.click()
    s.editor.add_rule("c2", "scale", {"factor": 2.0})
    wait_idle(window)
    assert overlay.input_panel.caption.text().startswith("A: custom plan")
    assert overlay.map_panel.caption.text() == "B: gradient (pinned)"
    assert overlay.blend_panel.caption.text().startswith("A − B")
    assert "map cosine 1.000" in overlay.compare_label.text()
    flow.metric.setCurrentText("A/B norm ratio")
    # the caption says what A and B are and names the least aligned node; ticks are powers of ten; the hover
    # reads A and B, not "plan" and "baseline" (issue 51)
    qtbot.waitUntil(lambda: "least aligned: " in flow.caption.text(), timeout=30_000)
    assert flow.caption.text().startswith("|g| of A (custom plan) over B (gradient)")
    assert not flow.legend.items and flow.plot.getAxis("left").labelText == "|g| A / B"
    assert [t for _, t in flow.plot.getAxis("left")._tickLevels[0]] == ["0.1", "1", "10"]
    vb = flow.plot.getPlotItem().getViewBox()
    flow._on_hover(vb.mapViewToScene(QPointF(flow.node_ids.index("c1"), 0.0)))
    assert "A |g|: " in flow.plot.toolTip() and "B |g|: " in flow.plot.toolTip() and "plan:" not in flow.plot.toolTip()
    target = tmp_path / "ab.png"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), "PNG (*.png)"))
    overlay.export_compare_button.click()
    assert target.is_file() and target.with_suffix(".json").is_file()
    overlay.swap_button.click()
    wait_idle(window)
    assert not s.plan.entries and s.ab.pinned.plan.entries
    overlay.unpin_button.click()
    assert overlay.input_panel.caption.text() == "Input" and not overlay.swap_button.isEnabled()


def test_a_loading_model_is_drawn_unclickable_and_the_current_one_returns_if_it_fails(
    window, qtbot, wait_idle, model_file, tmp_path
):
    from tests.io.test_model_steps import functional, saved, with_damaged_weights

    window.open_model(str(model_file))
    wait_idle(window)
    shown = set(window.graph_view.items_by_id)
    other = tmp_path / "other.keras"
    saved(functional(), other)
    bad = with_damaged_weights(other, tmp_path / "bad.keras")
    previews: list[tuple] = []
    window.session.document.previewed.connect(
        lambda graph, layout: previews.append(
            (graph is not None, window.graph_view.isInteractive(), set(window.graph_view.items_by_id))
        )
    )
    errors: list[str] = []
    window.error_shown.connect(lambda title, message: errors.append(message))
    window.open_model(str(bad))
    qtbot.waitUntil(lambda: bool(errors), timeout=60_000)
    (drawn, clickable, items), (withdrawn, clickable_after, items_after) = previews
    assert drawn and not clickable and "bn" in items and items != shown  # the new graph, not clickable yet
    assert not withdrawn and clickable_after and items_after == shown  # the model still held is back
    assert window.session.document.path == str(model_file) and "bad.keras" in errors[0]
    assert "tiny" in window.graph_pane.title.text()


def test_a_headless_screenshot_with_a_bad_file_never_waits_for_a_click(tmp_path, model_file):
    """`gui MODEL x.npy --screenshot` used to wait forever on a modal "not an image" dialog. Headless, errors
    are printed and the exit status is 2; the screenshot is still written (of a random input)."""
    import subprocess
    import sys

    bad = tmp_path / "x.npy"
    np.save(bad, np.zeros((2, 3), np.float32))
    shot = tmp_path / "shot.png"
    cmd = [
        sys.executable,
        "-m",
        "gradscope",
        "gui",
        str(model_file),
        str(bad),
        "--screenshot",
        str(shot),
        "--size",
        "800x600",
        "--select",
        "c9",  # no such node: an error too, not a silently unselected screenshot
    ]
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 2, out.stderr
    assert (
        "gradscope gui: error: Cannot use the input: Input 'img' takes shape (None, 12, 12, 3); x.npy holds (2, 3)"
        in (out.stderr)
    )
    assert "gradscope gui: error: Cannot select the node: --select: No node 'c9'" in out.stderr
    assert shot.is_file()


def test_a_headless_screenshot_of_a_session_whose_token_target_does_not_fit_ends(tmp_path):
    """The session's target fails in the backward pass, so no result ever comes: the run used to idle forever
    waiting for one. It ends with exit 2 and the error, as ``--tokens`` with the same id does."""
    import json
    import subprocess
    import sys

    from gradscope.backend import keras

    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32", name="tokens")
    lm = keras.Model(ids, keras.layers.Dense(64)(keras.layers.Embedding(64, 8)(ids)))
    lm.save(tmp_path / "lm.keras")
    session = tmp_path / "s.gradscope.json"
    target = {"kind": "token", "index": 99}  # a vocabulary of 64 (a position of 10**30 ends the same way)
    session.write_text(json.dumps({"model": str(tmp_path / "lm.keras"), "tokens": "1 2 3", "target": target}))
    cmd = [sys.executable, "-m", "gradscope", "gui", str(session), "--screenshot", str(tmp_path / "shot.png")]
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run([*cmd, "--size", "800x600"], capture_output=True, text=True, timeout=170, env=env)
    assert out.returncode == 2, out.stderr
    assert "gradscope gui: error: The backward pass failed:" in out.stderr and "does not exist" in out.stderr


def test_after_undoing_a_preset_the_preset_box_no_longer_names_it(window, qtbot, wait_idle, model_file, image_file):
    _open(window, qtbot, wait_idle, model_file, image_file)
    s, methods = window.session, window.inspector.methods
    s.editor.add_rule("c1", "zero")
    wait_idle(window)
    assert methods.combo.currentIndex() == -1 and methods.combo.placeholderText() == "custom plan"
    assert not methods.apply.isEnabled()
    methods.combo.setCurrentText("guided_backprop")
    assert methods.apply.isEnabled()
    methods.apply.click()
    qtbot.waitUntil(lambda: s.jobs.busy is None and s.results.method == "guided_backprop", timeout=60_000)
    assert methods.combo.currentText() == "guided_backprop"
    s.editor.undo()
    assert methods.combo.currentIndex() == -1 and [e.select for e in s.plan.entries] == ["c1"]


def test_a_finished_job_leaves_no_stale_busy_text(window, qtbot, wait_idle, model_file, image_file):
    _open(window, qtbot, wait_idle, model_file, image_file)
    s = window.session
    s.feedback.status_changed.emit("Gradients in 0.1 s")
    s.document.set_layout_direction("LR")  # a layout job: it ends without a status message of its own
    qtbot.waitUntil(lambda: s.jobs.busy is None, timeout=30_000)
    assert "Laying out" not in window.status_label.text()
    assert window.status_label.text() == "Gradients in 0.1 s"


def test_fit_left_to_right_shows_as_many_boxes_as_stay_legible(window, qtbot, wait_idle, tmp_path):
    from gradscope.qt.graph.view import LEGIBLE_ZOOM

    _open_tall_chain(window, wait_idle, tmp_path)
    window.lr_action.trigger()
    view = window.graph_view
    qtbot.waitUntil(lambda: view.layout_data.direction == "LR", timeout=30_000)
    view.fit_all()
    assert view.transform().m11() == pytest.approx(LEGIBLE_ZOOM)  # not the 1.2x zoom that showed four boxes
    shown = view.mapToScene(view.viewport().rect()).boundingRect()
    visible = [n for n, item in view.items_by_id.items() if shown.contains(item.sceneBoundingRect())]
    assert "first" in visible and len(visible) >= view.viewport().width() / (2 * 180 * LEGIBLE_ZOOM)


def test_save_dialogs_never_start_inside_the_installed_package(window, qtbot, wait_idle, tmp_path, monkeypatch):
    """With the bundled demo open, File > Export overlay offered resources/demo (inside site-packages for a wheel)
    with a name filled in: Enter wrote there. The dialog starts in ~/gradscope instead, made if missing."""
    from gradscope.core.resources import resource_root
    from gradscope.io.demo import demo_image_paths, demo_model_path

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    _open(window, qtbot, wait_idle, demo_model_path(), demo_image_paths()[0])
    offered = Path(window._default_name("_overlay.png"))
    assert not offered.resolve().is_relative_to(resource_root().resolve())
    assert offered.parent == tmp_path / "home" / "gradscope" and offered.parent.is_dir()
    window._remember_dir(str(tmp_path / "mine" / "x.png"))  # a folder the user chose: kept (once it exists)
    (tmp_path / "mine").mkdir()
    assert Path(window._default_name("_overlay.png")).parent == tmp_path / "mine"
