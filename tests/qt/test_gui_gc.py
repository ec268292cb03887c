"""Cyclic garbage holding Qt objects is collected on the GUI thread, never on the worker that happens to
allocate (that crashed the suite: the worker was "Garbage-collecting" inside a Keras load)."""

from __future__ import annotations

import gc
import threading
import weakref

from PySide6.QtCore import QObject

from gradscope.qt import gui_gc


def _cyclic_qt_garbage(record: list[str]) -> None:
    holder: dict = {"obj": QObject()}
    holder["self"] = holder  # a reference cycle: only the cyclic collector frees it
    weakref.finalize(holder["obj"], lambda: record.append(threading.current_thread().name))


def test_a_worker_allocating_never_finalises_qt_garbage(qtbot):
    assert not gc.isenabled()  # the window (here: the suite's fixture) holds automatic collection off
    gc.collect()
    finalised_on: list[str] = []
    _cyclic_qt_garbage(finalised_on)

    kept: list = []  # what the worker builds stays alive (a loaded model): the counts stay above threshold

    def allocate() -> None:  # enough container allocations to trigger every generation many times over
        for i in range(300_000):
            kept.append([i])

    worker = threading.Thread(target=allocate, name="worker")
    worker.start()
    worker.join()
    assert finalised_on == []  # the worker's allocations collected nothing
    qtbot.waitUntil(lambda: bool(finalised_on), timeout=5000)  # the GUI thread's timer did
    assert finalised_on == [threading.main_thread().name]


def test_windows_share_it_and_the_last_gives_automatic_collection_back():
    users = gui_gc._state["users"]
    gui_gc.start()
    assert gui_gc._state["users"] == users + 1 and not gc.isenabled()
    gui_gc.stop()
    assert gui_gc._state["users"] == users and not gc.isenabled()  # the fixture's start still holds
