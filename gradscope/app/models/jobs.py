"""Jobs on the worker thread, as a small evented model: request ids (a result a newer request made stale is
dropped), the busy label, cancel by kind, and failures turned into messages (never a crash).

Owns: the executor (``app.work.worker``: the one TensorFlow thread), the latest request id per job kind, the jobs
that show a busy label, and when the current busy work started.
Emits: ``busy_changed(label or None)``; a failed job reaches ``Feedback.error`` (a quiet background job's
failure is only a status line; a cancelled one is silent).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gradscope.app.models.feedback import Feedback
from gradscope.app.work.worker import InlineExecutor, Job, Preview
from gradscope.core.errors import Cancelled, GradscopeError
from gradscope.core.events import Signal

#: The dialog title of a failed job, by kind.
FAILURE_TITLES = {
    "load": "Cannot open the model",
    "run": "The backward pass failed",
    "layout": "Layout failed",
    "diagnose": "Diagnostics failed",
    "sanity": "Sanity checks failed",
    "evaluate": "The evaluation failed",
    "vocab": "Cannot read the vocabulary",
    "rule_file": "Cannot load the rule file",
    "rule_plugins": "Cannot load the rule plugins",
}

#: Job kinds a new model does not make pointless (an exclusive job leaves them be).
MODEL_INDEPENDENT = {"vocab", "rule_file", "rule_plugins"}


class Jobs:
    def __init__(self, executor: Any, feedback: Feedback) -> None:
        self.executor = executor if executor is not None else InlineExecutor()
        self.feedback = feedback
        self.busy_since = time.monotonic()  # when the current busy work started (the GUI shows elapsed time)
        self.busy_changed = Signal("busy_changed")  # (label or None)
        self._request = 0
        self._latest: dict[str, int] = {}
        self._active: dict[str, str] = {}  # job kind -> what the status bar says
        self._lock = threading.Lock()

    @property
    def busy(self) -> str | None:
        return next(iter(self._active.values()), None)

    def running(self, kind: str) -> bool:
        """A job of ``kind`` that shows a busy label is queued or running."""
        return kind in self._active

    def submit(
        self,
        kind: str,
        label: str,
        fn: Callable[[Any], Any],
        on_done: Callable[[Any], None],
        *,
        quiet: bool = False,
        exclusive: bool = False,
        on_preview: Callable[[Any], None] | None = None,
        on_failed: Callable[[BaseException], str | None] | None = None,
    ) -> int:
        """Run ``fn(token)`` on the worker; ``on_done(value)`` runs on the owner's thread unless a newer job of
        the same kind made it stale. ``quiet``: background work that shows no busy bar and whose failure is only
        a status line; ``exclusive``: every other pending job becomes pointless (a new model); ``on_preview``
        receives what the job hands over early (``token.preview``); ``on_failed(exc)`` runs first on any failure,
        cancellation included, and may return a line to add to the error message."""
        rid = self._next_id()
        self._latest[kind] = rid
        if exclusive:
            for other in [k for k in self._latest if k != kind and k not in MODEL_INDEPENDENT]:
                self.cancel_kind(other)
                self._active.pop(other, None)

        def current() -> bool:
            return self._latest.get(kind) == rid

        def done(value: Any) -> None:
            if current():
                self._finish(kind)
                on_done(value)

        def failed(exc: BaseException) -> None:
            if not current():
                return
            self._finish(kind)
            extra = on_failed(exc) if on_failed is not None else None
            if isinstance(exc, Cancelled):
                return
            if quiet:
                self.feedback.say(f"Background {kind} stopped: {exc}")
                return
            # An unexpected bug still becomes a message, never a crash.
            message = str(exc) if isinstance(exc, GradscopeError) else f"{type(exc).__name__}: {exc}"
            self.feedback.error(FAILURE_TITLES.get(kind, "Error"), message + (f"\n\n{extra}" if extra else ""), exc)

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

    def cancel_kind(self, kind: str) -> None:
        """Make jobs of ``kind`` stale and stop the running one at its next check (a background compile
        stops between two nodes)."""
        self._latest[kind] = self._next_id()
        self.executor.cancel(kind)

    def cancel_all(self, grace: float, on_recovered: Callable[[], None]) -> bool:
        """Drop whatever runs or waits. A job that does not stop (a rule looping forever) is interrupted; if it
        still runs after ``grace`` seconds it is abandoned: nothing computes until it returns (one TensorFlow
        thread, never two), and ``on_recovered`` is called when it does. Returns True when it was abandoned."""
        for kind in [*self._active, "compile"]:
            self._latest[kind] = self._next_id()
        self.executor.cancel()
        abandoned = self._stop_running_job(grace, on_recovered)
        self._active.clear()
        self.busy_changed.emit(None)
        return abandoned

    def _stop_running_job(self, grace: float, on_recovered: Callable[[], None]) -> bool:
        interrupt = getattr(self.executor, "interrupt", None)
        if interrupt is None or not interrupt():
            return False
        if self.executor.wait_running(grace):
            return False
        self.executor.on_recovered = on_recovered
        self.executor.abandon()
        return True

    def _next_id(self) -> int:
        with self._lock:
            self._request += 1
            return self._request

    def _finish(self, kind: str) -> None:
        self._active.pop(kind, None)
        self.busy_changed.emit(self.busy)
