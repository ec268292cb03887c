"""The monitor live in a notebook: a thread of its own reads the log folder the monitor writes and redraws one
output in place when ``every`` new records came, drawing at most ``DUTY`` of the time (the training log's display:
loss with spikes, the red line and the layer of the first NaN, the heat map, the last record's flow over the
first). The training thread only starts and stops it: no reading, no drawing on its path."""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path
from typing import Any

from gradscope.app.display.html import alerts, fragment

POLL_S = 1.0
GIVE_UP_S = 600.0  # a fit that died without on_train_end (an exception): stop watching after this long unchanged
#: the share of the time the watcher may spend drawing: after a drawing of d seconds it waits d * (1 / DUTY - 1).
#: Drawing at every record took 1 s a time on ResNet50 and, taking a core of two, made each step 2.1x plain
#: (1.12x without the live view): `benchmarks/bench_monitor.py --only resnet --live`.
DUTY = 0.05


class LiveTraining:
    """Watches ``folder``; ``display`` has ``update(html)`` (``notebook.LiveDisplay`` by default)."""

    def __init__(self, folder: str | Path, *, every: int = 1, display: Any = None, poll_s: float = POLL_S) -> None:
        from gradscope.app.display.notebook import LiveDisplay

        self.folder = Path(folder)
        self.every = max(1, int(every))
        self.display = display if display is not None else LiveDisplay()
        self.poll_s = poll_s
        self.drawn_records = -1
        self.draws = 0
        self.draw_seconds = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LiveTraining:
        if not getattr(self.display, "active", True):
            warnings.warn(
                "GradientMonitor(live=True) draws in a Jupyter notebook; outside one, read the log with "
                f"`gradscope train-report {self.folder}`, `gradscope report {self.folder}` or the window.",
                stacklevel=3,
            )
            return self
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, name="gradscope-live", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching and draw the log as it ended (called after the fit: off the training steps)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join()
        self._draw(final=True)

    def _watch(self) -> None:
        last_change, wait = time.monotonic(), self.poll_s
        while not self._stop.wait(wait):
            t0 = time.monotonic()
            if self._draw(final=False):
                last_change = time.monotonic()
                wait = max(self.poll_s, (last_change - t0) * (1.0 / DUTY - 1.0))  # drawing takes <= DUTY of the time
            elif time.monotonic() - last_change > GIVE_UP_S:
                return
            else:
                wait = self.poll_s

    def _draw(self, *, final: bool) -> bool:
        """Redraw when ``every`` records came since the last drawing (or at the end); True if it drew."""
        from gradscope.app.display.reports import training_body
        from gradscope.io.training_events import read_training_log

        t0 = time.perf_counter()
        try:
            log = read_training_log(self.folder)
        except Exception as exc:  # noqa: BLE001 - nothing written yet, or a record half written: next round
            if final:
                self.display.update(fragment(alerts([f"gradscope could not read {self.folder}: {exc}"])))
            return False
        n = len(log.records)
        due = n >= (1 if self.drawn_records < 0 else self.drawn_records + self.every)  # the first record, then every
        if not (final or due):
            return False
        self.display.update(fragment(training_body(log, live=not final)))
        self.drawn_records, self.draws = n, self.draws + 1
        self.draw_seconds += time.perf_counter() - t0
        return True
