"""A training log being watched, as a small evented model: the Training view's state. Reading runs on the worker.

Owns: the log folder and its incremental reader, the ``TrainingLog`` read so far, its alerts, the selected cell
(step, node) with that step's per-layer flow and the node's histogram, and the checkpoints saved in the folder.
Emits: ``changed(TrainingLog)`` when new records arrived (or another folder opened), ``selected(step, node)``
when the selection's flow/histogram are ready.
A running ``fit`` keeps appending: ``refresh`` (the view calls it on a timer) reads only what is new.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradscope.app.models.feedback import Feedback
from gradscope.app.models.jobs import Jobs
from gradscope.core.events import Signal
from gradscope.core.training_log import tensorboard_tag


@dataclass(frozen=True)
class Checkpoint:
    path: str
    after_step: int  # the last training step whose update the file holds


class TrainingWatch:
    def __init__(self, jobs: Jobs, feedback: Feedback) -> None:
        self._jobs = jobs
        self._feedback = feedback
        self.folder: Path | None = None
        self.log: Any = None  # TrainingLog
        self.alerts: list[Any] = []
        self.step: int | None = None
        self.node: str | None = None
        self.flow: Any = None  # FlowReport of the selected step
        self.histogram: Any = None  # (buckets, 3) of the selected node at the selected step, or None
        self.changed = Signal("changed")  # (TrainingLog)
        self.selected = Signal("selected")  # (step, node)
        self._reader: Any = None

    # ------------------------------------------------------------------------------------------- reading
    def open(self, folder: str | Path) -> None:
        """Start watching ``folder`` (a GradientMonitor log_dir); the first read runs on the worker."""
        folder = Path(folder)

        def job(token: Any) -> Any:
            from gradscope.engine.training.report import training_alerts
            from gradscope.io.training_events import TrainingLogReader

            reader = TrainingLogReader(folder)
            reader.update()
            log = reader.log()
            return reader, log, training_alerts(log)

        def done(value: Any) -> None:
            self._reader, log, alerts = value
            self.folder = folder
            self.step = self.node = None
            self.flow = self.histogram = None
            self._adopt(log, alerts)
            if alerts and alerts[0].first_step in log.steps:  # open where it went wrong first
                self.select(alerts[0].first_step, alerts[0].node)
            bad = [a for a in alerts if a.kind == "nonfinite"]
            notes = [f"first NaN/Inf at step {bad[0].first_step}"] if bad else []
            if log.failure and not log.records:
                notes.append(f"nothing recorded: {log.failure}")
            if len(log.runs) > 1:
                notes.append(f"the latest of {len(log.runs)} runs in the folder (run {log.run_id})")
            if log.problems:
                notes.append(f"{len(log.problems)} damaged record(s) skipped")
            self._feedback.say(
                f"Training log {folder.name}: {len(log.records)} records, {len(alerts)} alert(s)"
                + "".join(f"; {n}" for n in notes)
            )

        self._jobs.submit("training", f"Reading the training log {folder.name}...", job, done)

    def refresh(self) -> None:
        """Read what the running training appended since the last read (quiet; nothing happens when idle)."""
        reader = self._reader
        if reader is None or self._jobs.running("training"):
            return

        def job(token: Any) -> Any:
            from gradscope.engine.training.report import training_alerts

            if not reader.update():
                return None
            log = reader.log()
            return log, training_alerts(log)

        def done(value: Any) -> None:
            if value is not None and reader is self._reader:
                self._adopt(*value)

        self._jobs.submit("training-refresh", "", job, done, quiet=True)

    def _adopt(self, log: Any, alerts: list) -> None:
        self.log, self.alerts = log, alerts
        self.changed.emit(log)

    # ------------------------------------------------------------------------------------------- selection
    def select(self, step: int, node: str | None = None) -> None:
        """A cell: that step's per-layer flow and ``node``'s histogram at that step (read on the worker)."""
        log, reader = self.log, self._reader
        if log is None:
            return
        node = node or self.node

        def job(token: Any) -> Any:
            from gradscope.engine.training.report import step_flow

            flow = step_flow(log, step)
            histogram = reader.histogram(tensorboard_tag("grad", node), step) if node else None
            return flow, histogram

        def done(value: Any) -> None:
            self.step, self.node = step, node
            self.flow, self.histogram = value
            self.selected.emit(step, node)

        self._jobs.submit("training-select", "", job, done, quiet=True)

    # ------------------------------------------------------------------------------------------- checkpoints
    def checkpoints(self) -> list[Checkpoint]:
        """The ``.keras`` files the monitor saw appear in the log folder (a ModelCheckpoint's), oldest first,
        each with the last step whose update it holds; files since deleted are left out."""
        if self.log is None or self.folder is None:
            return []
        found = [Checkpoint(str(self.folder / name), step) for name, step in self.log.checkpoints]
        return [c for c in found if Path(c.path).is_file()]

    def checkpoint_for(self, step: int) -> Checkpoint | None:
        """The newest checkpoint saved before ``step`` ran: the weights that step started from."""
        if self.log is None or step not in self.log.steps:
            return None
        before = [c for c in self.checkpoints() if c.after_step < step]
        return before[-1] if before else None
