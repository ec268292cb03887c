"""Path diagnostics and sanity checks of the open model, as a small evented model. Both run on the worker.

Owns: ``diagnosis`` (the ``DiagnosisReport`` of the open model for the target it was run with; None: not run
since the model opened).
Emits: ``diagnosis_changed(report or None)``; ``sanity_ready(SanityReport)`` for the plan on screen.
"""

from __future__ import annotations

from typing import Any

from gradscope.app.models.feedback import Feedback
from gradscope.app.models.jobs import Jobs
from gradscope.core.events import Signal


class Reports:
    def __init__(self, jobs: Jobs, feedback: Feedback) -> None:
        self._jobs = jobs
        self._feedback = feedback
        self.diagnosis: Any = None
        self.diagnosis_changed = Signal("diagnosis_changed")  # (DiagnosisReport or None)
        self.sanity_ready = Signal("sanity_ready")  # (SanityReport)

    @property
    def diagnosing(self) -> bool:
        return self._jobs.running("diagnose")

    def diagnose(self, engine: Any, x: Any, target: Any) -> bool:
        """Which trainable variables get a gradient and, for those that don't, the op that cuts the path. Only
        the input's shapes matter: the forward pass is traced, not run, so no variable changes."""
        if engine is None:
            self._feedback.error("No model", "Open a model first, then run the diagnostics.")
            return False

        def job(token: Any) -> Any:
            from gradscope.engine.diagnostics.paths import diagnose_model

            token.report("Diagnostics: tracing the forward pass and walking its ops...")
            return diagnose_model(engine, x, target)

        self._jobs.submit("diagnose", "Running diagnostics...", job, self._on_diagnosis)
        return True

    def _on_diagnosis(self, report: Any) -> None:
        self.diagnosis = report
        self.diagnosis_changed.emit(report)
        n = len(report.variables)
        if report.ok:
            self._feedback.say(f"Diagnostics: all {n} trainable variable(s) receive a gradient.")
            return
        cuts = report.cuts()
        where = f"; cut at {cuts[0][0].op_type} in {cuts[0][0].where()}" if cuts else ""
        self._feedback.say(f"Diagnostics: {len(report.problems)} of {n} trainable variable(s) get no gradient{where}.")

    def clear(self) -> None:
        """A new model: its diagnosis is not run yet (the event tells the panel)."""
        self.diagnosis = None
        self.diagnosis_changed.emit(None)

    def highlight(self) -> dict[str, str]:
        """Node id -> role ("cut", "blocked", "path", "unused", "never_read") for the graph view."""
        return self.diagnosis.highlight() if self.diagnosis is not None else {}

    def sanity_checks(self, engine: Any, x: Any, target: Any, plan: Any, method: str) -> bool:
        """Conservation, model randomisation and finite differences for ``plan`` (``engine.diagnostics.sanity``), with
        progress and cancel."""
        if engine is None or x is None:
            self._feedback.error("No model", "Open a model first, then run the sanity checks.")
            return False

        def job(token: Any) -> Any:
            from gradscope.engine.diagnostics.sanity import sanity_checks

            return sanity_checks(engine, x, target, plan, method=method, progress=token.step)

        def done(report: Any) -> None:
            self._feedback.say(f"Sanity checks of {report.method} done.")
            self.sanity_ready.emit(report)

        self._jobs.submit("sanity", "Running sanity checks...", job, done)
        return True
