"""The Session's jobs on the worker thread: request ids (a stale result is dropped), the busy label, cancel
by kind, and failures turned into messages (never a crash)."""

from __future__ import annotations

import threading
import time
from typing import Any

from gradscope.app.worker import Job, Preview
from gradscope.core.errors import Cancelled, GradscopeError


class JobsMixin:
    """Job bookkeeping for ``Session``. The Session provides ``executor``, the signals ``busy_changed``,
    ``status_changed`` and ``error_raised``, ``can_undo`` and ``last_error``."""

    executor: Any
    busy_changed: Any
    status_changed: Any
    error_raised: Any
    last_error: str | None
    busy_since: float
    _restore: Any

    def _init_jobs(self) -> None:
        self._request = 0
        self._latest: dict[str, int] = {}
        self._active: dict[str, str] = {}  # job kind -> what the status bar says
        self._lock = threading.Lock()

    def _cancel_kind(self, kind: str) -> None:
        """Make jobs of ``kind`` stale and stop the running one at its next check (a background compile
        stops between two nodes)."""
        self._latest[kind] = self._next_id()
        self.executor.cancel(kind)

    @property
    def busy(self) -> str | None:
        return next(iter(self._active.values()), None)

    def _next_id(self) -> int:
        with self._lock:
            self._request += 1
            return self._request

    def _submit(
        self, kind: str, label: str, fn: Any, on_done: Any, *, quiet: bool = False, on_preview: Any = None
    ) -> int:
        """Run ``fn(token)`` on the worker; ``quiet``: background work that shows no busy bar and whose
        failure is only a status message (a cancelled background compile is normal); ``on_preview`` receives
        what the job hands over early with ``token.preview``."""
        rid = self._next_id()
        self._latest[kind] = rid
        if kind == "load":  # a new model makes every pending pass on the old one pointless
            for other in [k for k in self._latest if k != "load"]:
                self._cancel_kind(other)
                self._active.pop(other, None)

        def current() -> bool:
            return self._latest.get(kind) == rid

        def done(value: Any) -> None:
            if not current():
                return
            self._finish(kind)
            on_done(value)

        def failed(exc: BaseException) -> None:
            if not current():
                return
            self._finish(kind)
            if kind == "load":
                self._withdraw_preview()
            if isinstance(exc, Cancelled):
                return
            if quiet:
                self.status_changed.emit(f"Background {kind} stopped: {exc}")
                return
            self._job_failed(kind, exc)

        def progress(message: Any) -> None:
            if isinstance(message, Preview):
                if current() and on_preview is not None:
                    on_preview(message.value)
            elif current() and kind in self._active:
                self._active[kind] = message
                self.busy_changed.emit(self.busy)

        if not quiet:
            self._active[kind] = label
            self.busy_changed.emit(self.busy)
            self.busy_since = time.monotonic()
        self.executor.submit(Job(kind, rid, fn, done, failed, label, current, progress))
        return rid

    def _finish(self, kind: str) -> None:
        self._active.pop(kind, None)
        self.busy_changed.emit(self.busy)

    def _job_failed(self, kind: str, exc: BaseException) -> None:
        titles = {
            "load": "Cannot open the model",
            "run": "The backward pass failed",
            "layout": "Layout failed",
            "diagnose": "Diagnostics failed",
            "sanity": "Sanity checks failed",
        }
        # An unexpected bug still becomes a message, never a crash.
        message = str(exc) if isinstance(exc, GradscopeError) else f"{type(exc).__name__}: {exc}"
        if kind == "load":
            self._restore = None  # a session whose model failed must not restyle the next model opened
        if kind == "run":
            self.last_error = message
            if self.can_undo:
                message += "\n\nUndo (Ctrl+Z) goes back to the previous plan."
        self._error(titles.get(kind, "Error"), message, exc)

    def _error(self, title: str, message: str, exc: BaseException | None) -> None:
        self.error_raised.emit(title, message, exc)
