"""Offscreen Qt for the GUI tests: set the platform before anything imports Qt."""

from __future__ import annotations

import os

os.environ["QT_QPA_PLATFORM"] = "offscreen"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")


@pytest.fixture(autouse=True)
def gc_on_the_gui_thread(qapp):
    """As the app does while a window lives: no cyclic garbage holding Qt objects is ever collected on a worker
    thread (that crashed the suite; see gradscope.qt.gui_gc)."""
    from gradscope.qt import gui_gc

    with gui_gc.on_gui_thread():
        yield


@pytest.fixture(scope="session")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny.keras"
    from tests.engine.fixtures import tiny_cnn

    tiny_cnn().save(path)
    return path


@pytest.fixture(scope="session")
def image_file(tmp_path_factory):
    from PIL import Image

    path = tmp_path_factory.mktemp("images") / "input.png"
    Image.fromarray((np.random.default_rng(2).random((24, 24, 3)) * 255).astype(np.uint8)).save(path)
    return path


@pytest.fixture
def window(qtbot, tmp_path):
    from PySide6.QtCore import QSettings

    from gradscope.qt.main_window import MainWindow

    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(settings=settings, modal_errors=False)
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    yield w
    w.session.jobs.executor.shutdown()


@pytest.fixture
def wait_idle(qtbot):
    """Wait (turning the event loop) until a window's session is idle with a result."""

    def wait(window, timeout=120_000):
        s = window.session
        qtbot.waitUntil(lambda: s.jobs.busy is None and s.result is not None, timeout=timeout)

    return wait
