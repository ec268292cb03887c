"""Run long work (model loading, TensorFlow passes, layouts) on ONE background thread, Qt-free.

TensorFlow work stays on one thread (the engine's traced functions and Keras state are not meant to be driven
from several threads at once). Jobs carry a request id and a ``CancelToken``; a job whose request is stale by
the time it starts is skipped, and results of cancelled jobs are dropped by the owner. Results are delivered
on the owner's thread: ``ThreadExecutor.poll()`` runs the callbacks there, and ``notify`` (called from the
worker thread) tells a GUI event loop to call ``poll()`` soon (see ``gradscope.qt.worker``).
"""

from __future__ import annotations

import collections
import ctypes
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gradscope.core.errors import Cancelled, WorkerStuckError


class CancelToken:
    """Checked by jobs between steps; a TensorFlow call itself cannot be interrupted, its result is dropped."""

    def __init__(self, report: Callable[[str], None] | None = None) -> None:
        self._event = threading.Event()
        self._report = report

    def report(self, message: str) -> None:
        """Tell the owner what the job is doing now ("tracing the plan..."); shown in the status bar."""
        if self._report is not None and not self.cancelled:
            self._report(message)

    def preview(self, value: Any) -> None:
        """Hand the owner a first part of the result before the job ends (the graph of a model whose weights
        are still loading); delivered on the owner's thread like a progress message, as a ``Preview``."""
        if self._report is not None and not self.cancelled:
            self._report(Preview(value))

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled("Cancelled.")

    def step(self, message: str) -> None:
        """Between two steps of long work: say what comes next, stop here if cancelled (a ``progress``
        callback for the engine's sanity checks and sampling methods)."""
        self.report(message)
        self.check()


@dataclass(frozen=True)
class Preview:
    """A job's early, partial result (see ``CancelToken.preview``); the job's result still follows."""

    value: Any


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
        self.abandoned = 0  # jobs given up on (see ``abandon``)
        self.stuck: Job | None = None  # an abandoned job still running on the worker thread
        self.on_recovered: Callable[[], None] | None = None  # called (owner's thread) when it returns
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------------- owner side
    def submit(self, job: Job) -> None:
        with self._lock:
            self._pending += 1
            stuck = self.stuck is not None
        if stuck:
            self._finish(job, False, self._stuck_error())
            return
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

    def interrupt(self) -> bool:
        """Raise ``Cancelled`` inside the running job (a rule looping in Python stops at its next bytecode; a
        call blocked in C, e.g. a TensorFlow op, only when it returns). Returns whether a job was running."""
        with self._lock:
            job, thread = self._running, self._thread
        if job is None or thread.ident is None:
            return False
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(Cancelled))
        return True

    def wait_running(self, timeout: float) -> bool:
        """Wait until no job is running (True) or ``timeout`` passed (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._running is None:
                    return True
            time.sleep(0.02)
        with self._lock:
            return self._running is None

    def abandon(self) -> Job | None:
        """Give up on a job that does not stop: it is reported cancelled, the queued jobs are dropped, and
        whatever it returns later is dropped too. No second thread is started: TensorFlow and Keras state are not
        safe to drive from two threads (a second worker beside a stuck sweep crashed the process), so until the
        stuck job returns every job fails at once with ``WorkerStuckError``; when it returns, the same thread
        carries on and ``on_recovered`` is called on the owner's thread. Returns the abandoned job."""
        with self._lock:
            stuck = self._running
            if stuck is None:
                return None
            stuck.token.cancel()
            self.stuck = stuck
            self.abandoned += 1
            dropped = []
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    dropped.append(job)
        self._finish(stuck, False, Cancelled("Abandoned: it did not stop when cancelled."))
        for job in dropped:
            self._finish(job, False, self._stuck_error())
        return stuck

    def _stuck_error(self) -> WorkerStuckError:
        stuck = self.stuck
        what = (stuck.label or stuck.kind) if stuck is not None else "a computation"
        return WorkerStuckError(
            f"Still waiting for a computation that did not stop ({what}: a rule blocked inside native code?). "
            "TensorFlow runs on one thread, so nothing else can compute until it returns. Save your work and "
            "restart gradscope if it does not."
        )

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
            if ok == "recovered":  # an abandoned job returned at last (it was already delivered as cancelled)
                if self.on_recovered is not None:
                    self.on_recovered()
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
        """Whether the worker thread is still running (after ``shutdown``: a job that outlived its timeout)."""
        return self._thread.is_alive()

    # ------------------------------------------------------------------------------------------- worker side
    def _loop(self) -> None:
        self.thread_ids.add(threading.get_ident())
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._run_one(job)
            except Cancelled:  # an interrupt that arrived just after the job returned: deliver it as cancelled
                with self._lock:
                    self._running = None
                if not self._recovered(job) and not job.seconds:
                    self._finish(job, False, Cancelled("Cancelled."))

    def _run_one(self, job: Job) -> None:
        if job.token.cancelled or not job.is_current():
            self.jobs_skipped += 1
            self._finish(job, False, Cancelled("Skipped: a newer request replaced it."))
            return
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
        if not self._recovered(job):
            self._finish(job, ok, value)

    def _recovered(self, job: Job) -> bool:
        """Whether ``job`` was abandoned (then its result belongs to nobody, and the worker is free again)."""
        with self._lock:
            if job is not self.stuck:
                return False
            self.stuck = None
        self._outbox.append((job, "recovered", None))
        if self._notify is not None:
            self._notify()
        return True

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
