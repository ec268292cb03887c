"""Python's cyclic garbage collection on the GUI thread only, while a window lives.

Automatic collection runs in whichever thread happens to allocate: the worker (loading a model, running
TensorFlow) then finalised cyclic garbage that held Qt objects made on the GUI thread, and Qt crashed the
process (a segfault in the test suite, worker "Garbage-collecting" inside a Keras load). pyqtgraph's
``GarbageCollector`` is the known remedy: automatic collection off, collections on a GUI-thread timer. It is
reference-counted so nested windows share it, and the last one gives automatic collection back."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from pyqtgraph.util.garbage_collector import GarbageCollector

_state: dict[str, object] = {"users": 0, "collector": None, "was_enabled": True}


def start() -> None:
    """Collect on the GUI thread from now on (call on the GUI thread, with a QApplication)."""
    if _state["users"] == 0:
        _state["was_enabled"] = gc.isenabled()
        _state["collector"] = GarbageCollector(interval=0.5)  # disables automatic collection
    _state["users"] = int(_state["users"]) + 1


def stop() -> None:
    """Undo one ``start``; the last one collects everything here, on the GUI thread, and re-enables gc."""
    if int(_state["users"]) == 0:
        return
    _state["users"] = int(_state["users"]) - 1
    if _state["users"] == 0:
        collector = _state["collector"]
        collector.timer.stop()  # type: ignore[attr-defined]
        _state["collector"] = None
        gc.collect()
        if _state["was_enabled"]:
            gc.enable()


@contextmanager
def on_gui_thread() -> Iterator[None]:
    start()
    try:
        yield
    finally:
        stop()
