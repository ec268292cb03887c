"""Closing the window while the worker is inside a TensorFlow call exits cleanly with status 0 (it used to
abort with SIGABRT: the interpreter was finalised under the running worker thread)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication
    from gradscope.qt import app as qt_app

    def close_when_busy():
        for w in QApplication.topLevelWidgets():
            s = getattr(w, "session", None)
            if s is not None and s.jobs.busy and s.graph is not None:
                def stall(token):  # a job that is still running when the window closes
                    import tensorflow as tf
                    end = time.monotonic() + 5
                    while time.monotonic() < end:
                        tf.constant(1.0).numpy()
                s.jobs.submit("run", "Stalling...", stall, lambda _: None)
                QTimer.singleShot(200, w.close)
                print("closing", flush=True)
                return
        QTimer.singleShot(50, close_when_busy)

    application = QApplication(sys.argv[:1])
    QTimer.singleShot(50, close_when_busy)
    sys.exit(qt_app.main([]))
    """
)


def test_closing_during_a_computation_exits_with_status_0():
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert "closing" in out.stdout, out.stderr[-2000:]
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
