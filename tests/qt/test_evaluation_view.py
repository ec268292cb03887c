"""The Evaluation view in a real (offscreen) window: it scores the methods and the plan being edited, and shows
what results.csv says."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

from gradscope.io.demo import demo_model_path
from tests.app.evaluation.test_evaluation import SIZE, write_folder


def test_evaluation_view_scores_the_current_plan_and_shows_what_is_exported(window, qtbot, wait_idle, tmp_path):
    import numpy as np

    from gradscope.io.datasets import BACKGROUND
    from gradscope.io.synthetic import make_shapes_dataset

    images, labels, _, masks = make_shapes_dataset(6, 4321, size=SIZE)
    folder = write_folder(tmp_path / "shapes", images, np.where(masks, labels[:, None, None], BACKGROUND))
    window.open_model(str(demo_model_path()))
    wait_idle(window)
    window.session.editor.add_rule("type:ReLU", "guided_backprop")  # the plan being edited
    action = next(a for a in window.findChildren(type(window.undo_action)) if a.text() == "Evaluate on a folder…")
    action.trigger()
    assert window.evaluation_dock.isVisible() and action.shortcut().toString() == "Ctrl+Shift+E"
    panel = window.evaluation
    panel.data.setText(str(folder))
    panel.methods.setText("gradient,center")
    panel.metrics["insertion"].setChecked(True)
    panel.run_button.click()
    qtbot.waitUntil(lambda: window.session.evaluations.report is not None, timeout=180_000)
    report = window.session.evaluations.report
    plan = "plan: guided_backprop on type:ReLU"  # named by the plan (issue 51: "current plan" for every plan)
    assert report.methods == ["gradient", "center", plan] and report.images == 6
    assert report.settings["plan"]["entries"] == window.session.editor.plan.to_dict()["entries"]
    out = tmp_path / "shapes-evaluation"
    assert window.session.evaluations.out == out
    table = panel.table
    assert table.rowCount() == 3 and table.columnCount() == len(report.metrics)
    with (out / "results.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    methods = [table.verticalHeaderItem(i).text() for i in range(table.rowCount())]
    metrics = [table.horizontalHeaderItem(j).text().replace(" ", "_") for j in range(table.columnCount())]
    for row in rows:
        shown = table.item(methods.index(row["method"]), metrics.index(row["metric"])).text()
        if row["value"]:
            assert shown.startswith(f"{float(row['value']):.3f}")
        else:
            assert shown == "-"
    assert "6 of 6 images" in panel.summary.text() and panel.open_button.isEnabled()

    # a new plan, Evaluate again: a new evaluation beside the first (the window has no --out / --restart to give)
    first = (out / "results.csv").read_bytes()
    window.session.editor.clear()
    window.session.editor.add_rule("type:ReLU", "deconvnet")
    panel.run_button.click()
    qtbot.waitUntil(lambda: window.session.evaluations.out != out, timeout=180_000)
    again = window.session.evaluations.report
    assert window.session.evaluations.out == tmp_path / "shapes-evaluation-2" and again.images == 6
    assert again.settings["plan"]["entries"] == window.session.editor.plan.to_dict()["entries"]
    assert (out / "results.csv").read_bytes() == first  # the first one is kept as it was
    assert "shapes-evaluation-2" in panel.summary.text()
    assert again.methods[-1] == "plan: deconvnet on type:ReLU"
    with (tmp_path / "shapes-evaluation-2" / "results.csv").open() as fh:
        assert {r["method"] for r in csv.DictReader(fh)} >= {"plan: deconvnet on type:ReLU", "gradient"}


def test_the_shortcuts_list_is_read_from_the_menus(window, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    shown = []
    monkeypatch.setattr(QMessageBox, "information", lambda parent, title, text: shown.append(text))
    window._show_shortcuts()
    (text,) = shown
    assert "Ctrl+Shift+E\tEvaluate on a folder…" in text and "F5\tRe-run" in text and "Esc\tCancel" in text
    assert "Ctrl+Shift+L\tOpen training log…" in text and "Graph:" in text


def test_every_shortcut_does_one_thing(window):
    """Two actions on one key do nothing when it is pressed ("QAction::event: Ambiguous shortcut overload": Open
    checkpoint folder and Open session both had Ctrl+Shift+O)."""
    from PySide6.QtGui import QAction

    keys: dict[str, list[str]] = {}
    for action in window.findChildren(QAction):
        for key in {s.toString() for s in action.shortcuts() if not s.isEmpty()}:  # ZoomOut is Ctrl+- here too
            keys.setdefault(key, []).append(action.text())
    assert keys and {k: v for k, v in keys.items() if len(v) > 1} == {}
    assert keys["Ctrl+Shift+O"] == ["Open checkpoint &folder…"] and keys["Ctrl+Alt+O"] == ["Open session…"]


def test_the_evaluate_view_draws_curves_and_shows_each_image_with_every_methods_map(window, qtbot, wait_idle, tmp_path):
    """Curves per method (deletion solid, insertion dashed); the images sortable by a score or the methods'
    spread; a clicked image shows each method's map with its point (hit or miss as scored) and opens in the main
    view with that method and class."""
    from gradscope.core.resources import resource_path

    window.open_model(str(demo_model_path()))
    wait_idle(window)
    panel = window.evaluation
    window.evaluation_dock.show()
    panel.data.setText(str(resource_path("demo", "eval")))
    panel.out.setText(str(tmp_path / "eval"))
    panel.methods.setText("gradient,cmwp,center")
    panel.with_plan.setChecked(False)
    panel.metrics["insertion"].setChecked(True)
    panel.tolerance.setValue(4.0)
    panel.run_button.click()
    qtbot.waitUntil(lambda: window.session.evaluations.report is not None, timeout=180_000)
    report = window.session.evaluations.report
    wait_idle(window)

    lines = [i for i in panel.curves.getPlotItem().items if type(i).__name__ == "PlotDataItem"]
    assert len(lines) == 2 * 3  # deletion and insertion of each method
    first = lines[0].getData()[1]
    np.testing.assert_allclose(first, report.curves["deletion"]["gradient"], rtol=1e-6)

    browser = panel.browser
    assert browser.metric.currentText() == "pointing" and browser.table.rowCount() == 24
    heads = [browser.table.horizontalHeaderItem(j).text() for j in range(browser.table.columnCount())]
    assert heads == ["image", "class", "gradient", "cmwp", "center", "spread"]
    browser.table.sortItems(heads.index("spread"))  # the images where the methods disagree most first
    top = browser.table.item(0, heads.index("spread")).text()
    assert top == max((browser.table.item(i, 5).text() for i in range(24)), key=lambda t: -1 if t == "-" else float(t))
    browser.table.selectRow(0)
    key = browser.table.item(0, 0).text()
    qtbot.waitUntil(lambda: window.session.evaluations.inspection is not None, timeout=60_000)
    seen = window.session.evaluations.inspection
    assert seen.key == key and len(browser.panels) == 1 + 3  # the image with its mask, then each method
    scored = {r["method"]: r["pointing"] for r in report.per_image if r["key"] == key}
    for view, panel_ in zip(seen.views, browser.panels[1:]):
        assert panel_.caption.text() == f"{view.method}: {'hit' if scored[view.method] else 'miss'}"
    browser.open_method.setCurrentText("cmwp")
    browser.open_button.click()
    wait_idle(window)
    s = window.session
    assert s.fed.image_path == str(seen.path) and s.editor.method_name == "cmwp" and s.target.index == seen.cls


def test_the_bundled_data_is_never_evaluated_into_the_package(window, tmp_path, monkeypatch):
    """The demo folder lies inside gradscope's own resources (site-packages once installed): its results go to
    ~/gradscope/, a user's folder gets them beside it."""
    from pathlib import Path

    from gradscope.io.demo import demo_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    panel = window.evaluation
    panel.data.setText(str(demo_dir() / "eval"))
    assert panel.output_folder() == Path(tmp_path) / "gradscope" / "eval-evaluation"
    assert not panel.output_folder().resolve().is_relative_to(demo_dir().resolve().parent)
    panel.data.setText(str(tmp_path / "mine"))
    assert panel.output_folder() == tmp_path / "mine-evaluation"


def test_the_point_and_the_mask_can_be_seen_on_any_map():
    """The cross has a black border and the mask's outline is white on the maps; the image's outline takes the
    colour that differs most from what it is drawn on (yellow on a yellow shape was invisible)."""
    from gradscope.qt.evaluation.browser import _edge, _marked, _outlined

    mask = np.zeros((32, 32), np.int64)
    mask[8:20, 8:20] = 3
    edge = _edge(mask, 3)
    assert edge.sum() == 4 * 11 and not edge[10:18, 10:18].any()
    green = np.zeros((32, 32, 3), np.uint8)
    green[...] = (0, 230, 118)  # a map the colour of a hit
    marked = _marked(green, (14, 14), True, edge)
    assert (marked[14, 14] == (0, 230, 118)).all()
    assert (marked[13, 11] == 0).all() and (marked[11, 13] == 0).all()  # the black border beside each arm
    assert (marked[8, 8] == 255).all()  # the outline
    picture = np.zeros((32, 32, 3), np.uint8)
    picture[...] = (90, 140, 220)  # a blue ground
    picture[mask == 3] = (255, 214, 0)  # a yellow shape: neither yellow nor cyan would show
    drawn = _outlined(picture, edge)
    assert (drawn[edge] == (255, 0, 255)).all()


@pytest.fixture
def text_files(tmp_path):
    """A text classifier, its vocabulary beside it and four texts, made before the window starts its worker (two
    threads importing TensorFlow at once break it)."""
    keras = pytest.importorskip("keras")
    words = ["[PAD]", "[UNK]", "[MASK]", "the", "movie", "was", "great", "bad", "plot", "acting", "!"]
    keras.utils.set_random_seed(1)
    i = keras.Input((None,), dtype="int32")
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(len(words), 8, name="embed")(i))
    keras.Model(i, keras.layers.Dense(2, name="out")(h)).save(tmp_path / "clf.keras")
    (tmp_path / "clf.vocab.txt").write_text("\n".join(words))
    lines = ["the movie was great !", "the plot was bad", "great acting", "bad movie !"]
    (tmp_path / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    return tmp_path


def test_a_text_model_is_evaluated_over_texts_with_token_strips_beside_their_curves(
    text_files, window, qtbot, wait_idle
):
    """Issue 63 in the window: a model that reads token ids offers the text metrics; the texts are read with the
    window's vocabulary; the curves are MoRF (solid) and LeRF (dashed); a clicked text shows each method's token map
    beside its own curves, all from the report (results.json holds the same)."""
    tmp_path = text_files
    window.open_model(str(tmp_path / "clf.keras"))
    wait_idle(window)
    panel = window.evaluation
    window.evaluation_dock.show()
    assert panel.text and not panel.metrics["pointing"].isVisibleTo(panel) and panel.data_label.text() == "Texts"
    panel.data.setText(str(tmp_path / "texts.jsonl"))
    panel.methods.setText("gradient_x_input,gradient,random")
    panel.with_plan.setChecked(False)
    panel.baseline.setCurrentText("pad")
    panel.run_button.click()
    qtbot.waitUntil(lambda: window.session.evaluations.report is not None, timeout=180_000)
    report = window.session.evaluations.report
    wait_idle(window)
    assert report.images == 4 and report.settings["baseline"] == "pad"
    assert window.session.evaluations.out == tmp_path / "texts-evaluation"
    assert "4 of 4 texts" in panel.summary.text()
    lines_drawn = [i for i in panel.curves.getPlotItem().items if type(i).__name__ == "PlotDataItem"]
    assert len(lines_drawn) == 2 * 3
    np.testing.assert_allclose(lines_drawn[0].getData()[1], report.curves["morf"]["gradient_x_input"], rtol=1e-6)
    browser = panel.browser
    heads = [browser.table.horizontalHeaderItem(j).text() for j in range(browser.table.columnCount())]
    assert heads[:2] == ["text", "target"] and browser.metric.currentText() == "abpc"
    browser.table.selectRow(0)
    key = browser.table.item(0, 0).text()
    assert [p.caption.text() for p in browser.panels] == [f"{m}: token map" for m in report.methods]
    assert browser.caption.text().startswith(f"{key}: target")
    plot = browser.findChild(type(panel.curves), "evaluation_text_curves")
    drawn = [i for i in plot.getPlotItem().items if type(i).__name__ == "PlotDataItem"]
    rec = next(json.loads(p.read_text()) for p in sorted((window.session.evaluations.out / "batches").glob("*.json")))
    first = next(r for r in rec["images"] if r["key"] == key)
    np.testing.assert_allclose(drawn[0].getData()[1], first["scores"]["gradient_x_input"]["morf"], rtol=1e-6)
    # no legend over the curves: each map's caption is in its method's curve colour
    assert not plot.legend.isVisible()
    for strip, line in zip(browser.panels, drawn[: len(report.methods)]):
        assert line.opts["pen"].color().name() in strip.caption.styleSheet()
    if os.environ.get("GRADSCOPE_SHOTS"):
        panel.tabs.setCurrentWidget(browser)
        wait_idle(window)
        window.grab().save(os.path.join(os.environ["GRADSCOPE_SHOTS"], "evaluate_texts.png"))
