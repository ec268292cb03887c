"""The event file a ``GradientMonitor`` writes: one summary op per event, flushed from Python, never inside the
train step; a write that fails (a full disk, a log folder removed) turns recording off with one warning and
leaves ``fit`` running, as TensorBoard's own callback would not.

Every record is on disk within ``FLUSH_WITHIN_S`` of its step, whether or not another step follows (a fit stopped
by Ctrl-C, a notebook kernel restarted after it, a stalled input pipeline): a timer thread flushes, and only between
steps (``MonitorLog.step`` holds a lock through each), so a reader never finds half a record.

Every run gets an id (written in its meta event) so that two runs logging into one folder stay apart when read.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import socket
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gradscope.backend import tf, write_summary
from gradscope.core.errors import GradscopeError
from gradscope.engine.training.replicas import replica_local_variable

#: The writer never flushes by the clock inside a write op (a flush there fails the step on a full disk);
#: ``MonitorLog`` does it from Python, at most ``FLUSH_WITHIN_S`` after a step queued events.
_NEVER_MS = 2**31 - 1
FLUSH_WITHIN_S = 1.0
#: Events queued before the writer flushes on its own (inside a write op): far more than a record of ResNet50
#: (~1,200 events with histograms) between two Python flushes.
MAX_QUEUE = 1_000_000


class MonitorWarning(UserWarning):
    """The monitor stopped recording (or never started) while training went on."""


class MonitorLog:
    """The monitor's file writer, its ``recording`` switch (a variable the compiled step reads) and its run."""

    def __init__(self, folder: Path, strategy: Any = None) -> None:
        self.folder = folder
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise GradscopeError(f"Cannot create the log folder {folder}: {exc.strerror or exc}.") from None
        if not folder.is_dir():
            raise GradscopeError(f"The log folder {folder} is a file; give GradientMonitor a folder.")
        self.run = {
            "id": uuid.uuid4().hex[:12],
            "started": time.time(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        try:
            self._writer = tf.summary.create_file_writer(str(folder), max_queue=MAX_QUEUE, flush_millis=_NEVER_MS)
        except tf.errors.OpError as exc:  # a folder that exists but cannot be written (permissions, read-only)
            raise GradscopeError(f"Cannot write the log in {folder}: {_reason(exc)}.") from None
        self.recording = replica_local_variable(strategy, True, "gradscope_recording")
        self.failure: str | None = None
        self._stepping = threading.Lock()  # held through a train step: no flush lands inside one
        self._timer: threading.Timer | None = None
        self._timer_lock = threading.Lock()
        # Events still queued when the process ends (a fit stopped by Ctrl-C) are written then, not lost.
        ref = weakref.ref(self)
        self._at_exit = lambda: (log := ref()) is not None and log.flush()
        atexit.register(self._at_exit)

    # ------------------------------------------------------------------------------------------- events
    def event(self, tag: str, tensor: Any, step: Any, metadata: bytes) -> Any:
        """Queue one event (in the compiled step or eagerly)."""
        return write_summary(self._writer, tag, tensor, tf.cast(step, tf.int64), metadata)

    def write_json(self, tag: str, value: Any, step: int, metadata: bytes) -> None:
        """A JSON event (meta, alert, checkpoint) written and flushed now, from Python."""
        if self.failure is not None:
            return
        try:
            self.event(tag, tf.constant(json.dumps(value)), step, metadata)
        except tf.errors.OpError as exc:
            self.fail(exc)
            return
        self.flush()

    @contextmanager
    def step(self) -> Iterator[None]:
        """Around one train step: the timer's flush waits for its end."""
        with self._stepping:
            yield

    def queued(self) -> None:
        """A step queued events: they are flushed within ``FLUSH_WITHIN_S`` (one timer at a time)."""
        with self._timer_lock:
            if self._timer is not None or self.failure is not None:
                return
            self._timer = threading.Timer(FLUSH_WITHIN_S, self._flush_between_steps)
            self._timer.daemon = True
            self._timer.start()

    def _flush_between_steps(self) -> None:
        with self._timer_lock:
            self._timer = None
        with self._stepping:
            self.flush()

    def flush(self) -> None:
        """Write what is queued to the file; a failure stops recording."""
        if self.failure is not None:
            return
        try:
            self._writer.flush()
        except tf.errors.OpError as exc:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        """Stop recording for good, with one warning naming the cause; training goes on."""
        if self.failure is not None:
            return
        self.failure = _reason(exc)
        self.recording.assign(False)
        warnings.warn(
            f"GradientMonitor: writing the log in {self.folder} failed ({self.failure}); recording stopped, "
            "training goes on. The records written before are kept.",
            MonitorWarning,
            stacklevel=2,
        )

    def close(self) -> None:
        atexit.unregister(self._at_exit)
        with self._timer_lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        try:
            self._writer.close()
        except tf.errors.OpError as exc:
            self.fail(exc)


def is_write_failure(exc: BaseException) -> bool:
    """Whether a failed step failed in the log's writer (a flush when its queue filled, on a full disk)."""
    text = str(exc)
    return isinstance(exc, tf.errors.OpError) and any(
        word in text for word in ("SummaryWriter", "WriteSummary", "events file", "tfevents")
    )


def _reason(exc: BaseException) -> str:
    """TensorFlow's message without its decorations: "{{function_node ...}} Could not flush events file. : File
    too large [Op:FlushSummaryWriter]" -> "Could not flush events file: File too large"."""
    lines = str(getattr(exc, "message", None) or exc).strip().splitlines()
    first = next((line for line in lines if line and not line.startswith(("Graph execution", "Detected at"))), "")
    first = re.sub(r"\{\{[^}]*\}\}|\[Op:[^\]]*\]", "", first).replace(". :", ":").strip()
    return first[:200] or type(exc).__name__
