"""The Qt adapter of the core worker: results of the TensorFlow thread are delivered on the GUI thread.

The worker thread never touches a widget. When a job finishes it emits ``_Bridge.ready`` (safe from any thread:
Qt queues it to the bridge's thread, the GUI thread), and the GUI thread then runs the Session's callbacks.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, Signal

from gradscope.app.work.worker import ThreadExecutor


class _Bridge(QObject):
    ready = Signal()


class QtExecutor(ThreadExecutor):
    """A ``ThreadExecutor`` whose callbacks run in the Qt event loop of the thread that created it."""

    def __init__(self) -> None:
        self._bridge = _Bridge()
        self._bridge.ready.connect(self.poll, Qt.ConnectionType.QueuedConnection)
        super().__init__(notify=self._bridge.ready.emit)
