"""``gradscope report RUN --out report.html`` for an evaluation folder, a training log folder and a folder of
exported explanations: one self-contained page (no script, no address outside it, pictures embedded) with the
settings and versions, drawn by headless Chromium at 1280 px and at a phone's 390 px; ``show()`` outside a
notebook writes the same page; the live monitor's watcher draws every N records off the training thread."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

import gradscope as gs
from gradscope.cli import main
from gradscope.io.demo import demo_dir, demo_image_paths, demo_model_path
from tests.app.display.browser import assert_drawn, screenshot

keras = pytest.importorskip("keras")


def _self_contained(html: str) -> None:
    assert html.startswith("<!DOCTYPE html>")
    assert "<script" not in html
    assert not re.search(r'(src|href)="(?!data:)[^"]+"', html), "everything is inside the page"
    assert 'name="viewport"' in html  # a phone lays it out at its own width


@pytest.fixture(scope="module")
def training_log(tmp_path_factory):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(hidden), name="regressor")
    model.compile(keras.optimizers.SGD(0.5), "mse")
    x = np.random.default_rng(0).random((128, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True) * 1e8  # far too large for this learning rate: Inf within a few steps
    folder = tmp_path_factory.mktemp("log")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[gs.GradientMonitor(folder, every=1, histograms=0)])
    assert not all(r.finite for r in gs.read_training_log(folder).records)
    return folder


def test_a_training_log_report(training_log, tmp_path):
    out = tmp_path / "training.html"
    assert main(["report", str(training_log), "--out", str(out), "--quiet"]) == 0
    html = out.read_text(encoding="utf-8")
    _self_contained(html)
    for words in ("Gradient flow in training: regressor", "first NaN/Inf", "Settings", "recorded every", "keras"):
        assert words in html
    assert html.count("data:image/png;base64,") >= 3  # loss, heat map, flow
    assert_drawn(screenshot(out, tmp_path / "wide.png", 1280, 1200))
    assert_drawn(screenshot(out, tmp_path / "phone.png", 390, 1600))


def test_an_evaluation_report_and_its_display_agree(tmp_path):
    run = tmp_path / "eval"
    report = gs.evaluate(demo_model_path(), demo_dir() / "eval", methods=("gradient",), metrics=("pointing",), out=run)
    assert "pointing_difficult" in report.metrics  # scored with pointing; the demo has no difficult image
    out = tmp_path / "evaluation.html"
    assert main(["report", str(run), "--out", str(out), "--quiet"]) == 0
    html = out.read_text(encoding="utf-8")
    _self_contained(html)
    value = report.value("gradient", "pointing")
    assert f"{value:.3f} [" in html and f"{value:.3f} [" in report._repr_html_()  # the same numbers
    assert "<th>pointing_difficult" not in html and "no value for pointing_difficult" in html  # a note, not dashes
    assert "methods" in html and "images+masks" in html and "shapes_cnn.keras" in html  # the run's settings
    assert_drawn(screenshot(out, tmp_path / "evaluation.png", 1280, 900), min_colours=20)


def test_a_report_of_exported_explanations(tmp_path):
    folder = tmp_path / "exports"
    for image in demo_image_paths()[:2]:
        gs.explain(demo_model_path(), image, method="gradient").save(folder / f"{image.stem}.png", colorbar=True)
    out = tmp_path / "explanations.html"
    assert main(["report", str(folder), "--out", str(out), "--quiet"]) == 0
    html = out.read_text(encoding="utf-8")
    _self_contained(html)
    # maps over photographs as JPEG, in a grid of columns: six such maps made a 1.7 MB page of one column
    assert html.count("data:image/jpeg;base64,") == 2 and "shapes_cnn" in html and "gradient" in html
    assert '<div class="grid">' in html and len(html) < 120_000


def test_a_report_of_what_is_no_run_says_what_it_reads(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "evaluation folder" in err and "GradientMonitor log folder" in err
    assert not (tmp_path / "r.html").exists()
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r.png")]) == 2


def test_show_outside_a_notebook_writes_the_page(training_log, tmp_path, monkeypatch, capsys):
    opened = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or False)
    log = gs.read_training_log(training_log)
    path = log.show(tmp_path / "log.html")
    html = path.read_text(encoding="utf-8")
    _self_contained(html)
    assert log._repr_html_() in html  # the notebook's display, as a page
    assert opened == [path.resolve().as_uri()] and f"wrote {path}" in capsys.readouterr().out


def test_the_live_view_draws_every_n_records_from_its_own_thread(training_log):
    from gradscope.app.display.live import LiveTraining

    class Output:
        active = True

        def __init__(self):
            self.drawn, self.threads = [], set()

        def update(self, html):
            self.drawn.append(html)
            self.threads.add(threading.current_thread().name)

    output = Output()
    live = LiveTraining(training_log, every=2, display=output, poll_s=0.01).start()
    for _ in range(500):
        if output.drawn:
            break
        threading.Event().wait(0.01)
    live.stop()
    assert output.threads >= {"gradscope-live"}  # the watcher drew; the caller only drew the last one
    assert "updating while fit runs" in output.drawn[0] and "updating" not in output.drawn[-1]
    assert live.drawn_records == len(gs.read_training_log(training_log).records)


def test_live_is_off_outside_a_notebook_and_says_so(tmp_path):
    monitor = gs.GradientMonitor(tmp_path, live=None)
    assert monitor.live is False
    with pytest.raises(gs.GradscopeError, match="live must be"):
        gs.GradientMonitor(tmp_path, live="yes")
    from gradscope.app.display.live import LiveTraining

    with pytest.warns(UserWarning, match="draws in a Jupyter notebook"):
        LiveTraining(tmp_path).start()
