"""Run long work (model loading, TensorFlow passes, layouts) on ONE background thread, Qt-free.

TensorFlow work stays on one thread (the engine's traced functions and Keras state are not meant to be driven
from several threads at once). Jobs carry a request id and a ``CancelToken``; a job whose request is stale by
the time it starts is skipped, and results of cancelled jobs are dropped by the owner. Results are delivered
on the owner's thread: ``ThreadExecutor.poll()`` runs the callbacks there, and ``notify`` (called from the
worker thread) tells a GUI event loop to call ``poll()`` soon (see ``gradscope.qt.worker``).
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gradscope.core.errors import Cancelled


class CancelToken:
    """Checked by jobs between steps; a TensorFlow call itself cannot be interrupted, its result is dropped."""

    def __init__(self, report: Callable[[str], None] | None = None) -> None:
        self._event = threading.Event()
        self._report = report

    def report(self, message: str) -> None:
        """Tell the owner what the job is doing now ("tracing the plan..."); shown in the status bar."""
        if self._report is not None and not self.cancelled:
            self._report(message)

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled("Cancelled.")


@dataclass
class Job:
    kind: str  # "load", "run", "layout", ...: a newer job of the same kind makes older ones stale
    request_id: int
    fn: Callable[[CancelToken], Any]
    on_done: Callable[[Any], None]
    on_error: Callable[[BaseException], None]
    label: str = ""
    is_current: Callable[[], bool] = lambda: True
    on_progress: Callable[[str], None] | None = None
    token: CancelToken = field(default_factory=CancelToken)
    seconds: float = 0.0


class InlineExecutor:
    """Runs each job at once on the calling thread (scripts and tests that need no thread)."""

    def __init__(self) -> None:
        self.jobs_run = 0

    def submit(self, job: Job) -> None:
        if not job.is_current() or job.token.cancelled:
            return
        self.jobs_run += 1
        job.token._report = job.on_progress
        t0 = time.perf_counter()
        try:
            value = job.fn(job.token)
        except BaseException as exc:  # noqa: BLE001  (delivered to the owner, who shows it)
            job.seconds = time.perf_counter() - t0
            job.on_error(exc)
            return
        job.seconds = time.perf_counter() - t0
        job.on_done(value)

    def cancel(self, kind: str | None = None) -> None:
        pass

    def poll(self) -> int:
        return 0

    def wait_idle(self, timeout: float | None = None) -> bool:
        return True

    @property
    def busy(self) -> bool:
        return False

    def shutdown(self) -> None:
        pass


class ThreadExecutor:
    """One daemon worker thread; callbacks run on whichever thread calls ``poll()``."""

    def __init__(self, notify: Callable[[], None] | None = None, name: str = "gradscope-worker") -> None:
        self._notify = notify
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._outbox: collections.deque[tuple[Job, bool | None, Any]] = collections.deque()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0  # submitted and not yet delivered
        self._running: Job | None = None
        self.jobs_run = 0
        self.jobs_skipped = 0
        self.thread_ids: set[int] = set()  # threads jobs actually ran on (tests check it is not the GUI's)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------------- owner side
    def submit(self, job: Job) -> None:
        with self._lock:
            self._pending += 1
        if job.on_progress is not None:
            job.token._report = lambda message, job=job: self._progress(job, message)
        self._queue.put(job)

    def cancel(self, kind: str | None = None) -> None:
        """Cancel the running job and every queued one (of ``kind``, or all)."""
        with self._lock:
            running = self._running
            if running is not None and (kind is None or running.kind == kind):
                running.token.cancel()
            for job in list(self._queue.queue):
                if job is not None and (kind is None or job.kind == kind):
                    job.token.cancel()

    def poll(self) -> int:
        """Deliver finished jobs' callbacks on this thread; returns how many were delivered."""
        delivered = 0
        while True:
            try:
                job, ok, value = self._outbox.popleft()
            except IndexError:
                break
            if ok is None:  # a progress message, not a result
                if not job.token.cancelled and job.on_progress is not None:
                    job.on_progress(value)
                continue
            try:
                if job.token.cancelled:
                    pass  # the owner already moved on
                elif ok:
                    job.on_done(value)
                else:
                    job.on_error(value)
            finally:
                delivered += 1
                with self._lock:
                    self._pending -= 1
                    self._idle.notify_all()
        return delivered

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every submitted job has run and been delivered (polls while waiting)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.poll()
            with self._lock:
                if self._pending == 0:
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(0.05 if left is None else min(left, 0.05))

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._pending > 0

    def shutdown(self, timeout: float = 2.0) -> None:
        """Cancel everything and stop the worker; a job inside a TensorFlow call may outlive ``timeout``
        (``alive`` then stays True and the process should exit without finalising: see qt.app.main)."""
        self.cancel()
        self._queue.put(None)
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------------------------------- worker side
    def _loop(self) -> None:
        self.thread_ids.add(threading.get_ident())
        while True:
            job = self._queue.get()
            if job is None:
                return
            if job.token.cancelled or not job.is_current():
                self.jobs_skipped += 1
                self._finish(job, False, Cancelled("Skipped: a newer request replaced it."))
                continue
            with self._lock:
                self._running = job
            t0 = time.perf_counter()
            try:
                value, ok = job.fn(job.token), True
            except BaseException as exc:  # noqa: BLE001  (delivered to the owner, who shows it)
                value, ok = exc, False
            job.seconds = time.perf_counter() - t0
            with self._lock:
                self._running = None
                self.jobs_run += 1
            self._finish(job, ok, value)

    def _progress(self, job: Job, message: str) -> None:
        self._outbox.append((job, None, message))
        if self._notify is not None:
            self._notify()

    def _finish(self, job: Job, ok: bool, value: Any) -> None:
        self._outbox.append((job, ok, value))
        if self._notify is not None:
            self._notify()
        else:
            with self._lock:
                self._idle.notify_all()
