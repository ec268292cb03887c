"""The Qt binding keeps Python's reference counts: PySide6 6.12.0 on Python 3.11 dropped a reference to None on
every call of a void method (``widget.resize``, ``app.processEvents``), so a long session, or the test suite,
ended in "Fatal Python error: none_dealloc". pyproject excludes it; this test keeps it excluded."""

from __future__ import annotations

import gc
import sys

from PySide6.QtWidgets import QApplication, QWidget


def test_void_calls_keep_the_reference_count_of_none(qapp):
    w = QWidget()
    w.show()
    gc.collect()
    before = sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False)
    for i in range(500):
        w.resize(200 + (i % 7) * 60, 100)
        w.setEnabled(i % 2 == 0)
        QApplication.processEvents()
    gc.collect()
    after = sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False)
    w.close()
    lost = [b - a for a, b in zip(after, before)]
    assert max(lost) < 100, f"references lost over 500 void calls (None, True, False): {lost}"
