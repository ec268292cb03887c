"""The Training view in a real (offscreen) window: heatmap, alerts, a clicked cell, live updates, a checkpoint."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tests.engine.training.test_monitor import _demo


@pytest.fixture(scope="module")
def blowup_log(tmp_path_factory):
    folder = tmp_path_factory.mktemp("blowup_gui")
    _demo("blowup", folder, epochs=1, images=256, every=2)  # before any window: TF import on this thread
    return folder


def test_training_view_shows_the_log_and_follows_it(window, qtbot, blowup_log, tmp_path):
    (events,) = blowup_log.glob("events.out.tfevents.*")
    data = events.read_bytes()
    growing = tmp_path / events.name
    growing.write_bytes(data[: len(data) // 2])
    for checkpoint in blowup_log.glob("*.keras"):
        shutil.copy2(checkpoint, tmp_path / checkpoint.name)  # with its time: "saved before step N" reads it
    watch, panel = window.session.training, window.training
    window.open_training_log(str(tmp_path))
    qtbot.waitUntil(lambda: watch.log is not None, timeout=60_000)
    assert window.training_dock.isVisible()
    # no model open: the log alone takes the window (no graph or map of another model beside it), and says so
    assert not window.centralWidget().isVisible() and panel.alone_note.isVisible()
    assert window.training_dock.height() > 0.7 * window.height()
    first = len(watch.log.records)
    image = panel.heat.image
    assert image.shape == (first, len(watch.log.nodes))  # image[x = record, y = node]
    with growing.open("ab") as f:  # the training goes on: the view's timer reads the rest
        f.write(data[len(data) // 2 :])
    qtbot.waitUntil(lambda: len(watch.log.records) > first, timeout=20_000)
    assert panel.heat.image.shape[0] == len(watch.log.records)
    alert = panel.alert_list.item(0).text()
    assert alert.startswith("[nonfinite] step")
    assert len(panel.nan_marks.data) > 0 and len(panel.alert_marks.data) > 0
    assert panel.colorbar.levels() == pytest.approx(panel.heat.getLevels())  # the colour scale is the heatmap's
    assert panel.colorbar.axis.labelText == "log10 mean |g|"

    log = watch.log
    row = next(i for i, n in enumerate(log.nodes) if n.id == "conv1:pre")
    panel._cell_clicked(0, row)  # what a click on the first column, that row, does
    qtbot.waitUntil(lambda: watch.step == 0 and watch.node == "conv1:pre", timeout=20_000)
    bars = [item for item in panel.flow_plot.getPlotItem().items if type(item).__name__ == "BarGraphItem"]
    assert len(bars) == sum(1 for r in watch.flow.rows if r.grad_mean_abs > 0)
    assert panel.hist_plot.getPlotItem().items  # step 0 has histograms
    assert "Step 0" in panel.cell_label.text() and "conv1:pre" in panel.cell_label.text()

    last = log.steps[-1]
    panel._cell_clicked(len(log.steps) - 1, row)
    qtbot.waitUntil(lambda: watch.step == last, timeout=20_000)
    assert panel.checkpoint_button.isEnabled()
    panel.checkpoint_button.click()
    qtbot.waitUntil(
        lambda: window.session.document.path is not None and window.session.jobs.busy is None, timeout=60_000
    )
    assert str(window.session.document.path).endswith(".keras")
    assert window.centralWidget().isVisible() and not panel.alone_note.isVisible()  # a model: its panes are back
    assert str(window.session.document.path).startswith(str(tmp_path))
    statistic = log.matrix("grad_mean_abs").T  # image[x = record, y = node]
    image = panel.heat.image
    assert np.isfinite(image[np.isfinite(statistic)]).all()
    assert np.isnan(image[~np.isfinite(statistic)]).all()  # NaN/Inf: no colour of the scale (grey under its x)


def test_a_click_on_a_nan_cell_selects_it_and_an_empty_histogram_says_why(window, qtbot, blowup_log):
    """Issue 51: the red x drawn on a NaN/Inf cell took the click (nothing happened); the step shown at open drew
    an empty 0-1 histogram without a word."""
    from PySide6.QtCore import QPointF, Qt

    watch, panel = window.session.training, window.training
    window.resize(1024, 640)  # a short window: the log alone still takes it (a dock placed while the log loaded
    qtbot.wait(50)  # was floated off the window, which then showed nothing)
    window.open_training_log(str(blowup_log))
    qtbot.waitUntil(lambda: watch.log is not None and len(panel.nan_marks.data) > 0, timeout=60_000)
    qtbot.waitUntil(lambda: watch.step is not None, timeout=20_000)
    qtbot.wait(100)
    assert not window.training_dock.isFloating() and window.training_dock.height() > 0.7 * window.height()
    window.resize(1400, 900)
    if not panel.hist_plot.getPlotItem().items or watch.node is None:
        assert panel.hist_note.isVisible() and panel.hist_note.text()  # a word instead of an empty plot
    x, y = panel.nan_marks.data[0]["x"], panel.nan_marks.data[0]["y"]
    log = watch.log
    step, node = log.steps[int(x)], log.nodes[int(y)].id
    window.training_dock.resize(1200, 700)
    qtbot.wait(50)
    plot = panel.heat_plot
    plot.getPlotItem().vb.setRange(xRange=(x - 3, x + 3), yRange=(y - 3, y + 3), padding=0)
    qtbot.wait(50)
    at = plot.mapFromScene(plot.getPlotItem().vb.mapViewToScene(QPointF(x, y)))
    qtbot.mouseClick(plot.viewport(), Qt.MouseButton.LeftButton, pos=at)
    qtbot.waitUntil(lambda: (watch.step, watch.node) == (step, node), timeout=20_000)
    assert f"Step {step}" in panel.cell_label.text() and node in panel.cell_label.text()


def test_the_window_exports_the_training_report_it_shows(window, qtbot, blowup_log, tmp_path, monkeypatch):
    """File ▸ Export training report (HTML): the page `gradscope report` writes of the open log; with no log open,
    one message and no file dialog."""
    from PySide6.QtWidgets import QFileDialog

    from gradscope.qt.menus import export_report

    asked, errors = [], []
    monkeypatch.setattr(window, "_on_error", lambda title, message, exc: errors.append(message))
    out = tmp_path / "training.html"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: asked.append(a) or (str(out), ""))
    export_report(window, "evaluation")  # no evaluation has run in this window
    assert errors == ["Run an evaluation first."] and not asked
    window.open_training_log(str(blowup_log))
    qtbot.waitUntil(lambda: window.session.training.log is not None, timeout=60_000)
    export_report(window, "training")
    html = out.read_text(encoding="utf-8")
    assert "first NaN/Inf" in html and "<script" not in html
    assert window.status_label.text() == f"Wrote {out}"


def test_the_heat_map_draws_a_zero_white_and_a_nan_red_as_the_report_does():
    """A mean |g| of exactly 0 was drawn as the lowest level (the smallest gradient, not none); the report and the
    notebook draw it white and a NaN/Inf red: the window now does too, and says so under the map."""
    from gradscope.qt.training_panel import LEGEND, NONFINITE_RGBA, ZERO_RGBA, behind_cells, heat_values
    from gradscope.render.charts import heatmap_picture

    m = np.array([[0.0, 1e-3, np.nan], [1e-2, np.inf, 0.0]])
    values, levels = heat_values(m, "grad_mean_abs")
    assert levels == (-3.0, -2.0) and np.isnan(values[[0, 0, 1, 1], [0, 2, 1, 2]]).all() and values[0, 1] == -3.0
    behind = behind_cells(m, "grad_mean_abs")
    assert [tuple(behind[i, j]) for i, j in ((0, 0), (1, 2))] == [ZERO_RGBA] * 2
    assert [tuple(behind[i, j]) for i, j in ((0, 2), (1, 1))] == [NONFINITE_RGBA] * 2 and behind[0, 1, 3] == 0
    report = heatmap_picture(m, ["a", "b"], [1, 2, 3], title="t")  # the report's picture of the same matrix
    colours = {tuple(int(v) for v in c) for c in report.reshape(-1, 3)}
    assert NONFINITE_RGBA[:3] in colours and "white: 0" in LEGEND and "red square" in LEGEND
