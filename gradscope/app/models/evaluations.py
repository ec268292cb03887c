"""Evaluating the open model's methods (and the plan being edited) over a folder of images or a text dataset (read
with the window's vocabulary), from the window.

Owns: the last ``EvalReport`` and the folder it was written to.
Emits: ``finished(EvalReport)`` when a run ends (also when it was stopped: the report covers what is done, and
the same run started again resumes).

The run is a job on the worker (the one TensorFlow thread): while it runs, other work waits; the busy label
shows the images done and the time left, and cancelling stops it after the batch in flight.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradscope.app.models.feedback import Feedback
from gradscope.app.models.jobs import Jobs
from gradscope.core.errors import GradscopeError
from gradscope.core.events import Signal


def plan_label(method_name: str | None, plan: Any) -> str:
    """The name the plan being edited is evaluated under: its preset's name, else its first rule and where it
    sits ("plan: zero on c1 +2"). Two evaluations of two plans were both "current plan" in the scores table and
    results.csv."""
    if method_name and method_name not in ("custom plan", "gradient"):
        return f"plan: {method_name}"
    if not plan.entries:
        return "plan: gradient"
    first, more = plan.entries[0], len(plan.entries) - 1
    return f"plan: {first.rule} on {first.select}" + (f" +{more}" if more else "")


class Evaluations:
    def __init__(self, document: Any, editor: Any, inputs: Any, jobs: Jobs, feedback: Feedback) -> None:
        self._document, self._editor, self._inputs = document, editor, inputs
        self._jobs, self._feedback = jobs, feedback
        self.report: Any = None
        self.out: Path | None = None
        self.finished = Signal("finished")  # (EvalReport)
        self.inspected = Signal("inspected")  # (ImageInspection)
        self.inspection: Any = None  # the image looked at last (``inspect``)
        self._scored: tuple | None = None  # (engine, source, settings) of the report shown, to look at its images
        self.plan_method: str | None = None  # what the plan being edited was evaluated as (``plan_label``)

    def start(
        self,
        data: str | Path,
        out: str | Path,
        *,
        methods: list[str],
        metrics: list[str],
        with_plan: bool = True,
        restart: bool = False,
        **options: Any,
    ) -> None:
        """Evaluate ``methods`` (and the current plan when ``with_plan``) on the images in ``data`` into ``out``."""
        from gradscope.app.evaluation.run import evaluation_settings, run_evaluation, source_of
        from gradscope.app.evaluation.scoring import OtherEvaluationError

        engine = self._document.engine
        if engine is None:
            raise GradscopeError("Open a model first: the evaluation scores its maps.")
        plan = None
        edited = self._editor.plan
        same = not edited.entries or edited.is_identity or self._editor.method_name in methods
        if with_plan and same:  # the plain gradient, or a preset already listed: a second, identical row
            self._feedback.say("The plan being edited is one of the methods listed (or the gradient): scored once.")
        if with_plan and not same:
            import dataclasses

            plan = dataclasses.replace(self._editor.plan, name=plan_label(self._editor.method_name, self._editor.plan))
        settings = evaluation_settings(methods, metrics, plan, **options)
        names = self._document.class_names
        source = source_of(
            engine,
            data,
            settings,
            preprocessing=self._inputs.preprocessing,
            class_names=names,
            vocab=self._inputs.vocab,  # a text dataset is read as the typed input is
        )
        unit = "texts" if settings.text else "images"
        out = Path(out)
        model = self._document.path or ""

        def job(token: Any) -> Any:
            def progress(done: int, total: int, left: float) -> None:
                eta = f", about {left:.0f} s left" if left == left else ""  # NaN before the first batch
                token.step(f"Evaluating: {done} of {total} {unit}{eta}...")

            # the window has no --out to change: a run with other settings (a new plan, other metrics) goes into
            # the next free folder beside the old one, which stays as it was
            for folder in _folders(out):
                try:
                    return folder, run_evaluation(
                        engine,
                        source,
                        settings,
                        folder,
                        model=model,
                        restart=restart,
                        progress=progress,
                        should_stop=lambda: token.cancelled,
                    )[1]
                except OtherEvaluationError:
                    continue
            raise GradscopeError(f"{out} and the 99 folders beside it hold other evaluations: choose another.")

        def done(result: Any) -> None:
            folder, report = result
            self.report, self.out = report, folder
            self.plan_method = plan.name if plan is not None else None
            self._scored = (engine, source, settings)
            self.finished.emit(report)
            stopped = "" if report.complete else " (stopped: start it again to resume)"
            bad = f"; {len(report.bad)} could not be used" if report.bad else ""
            self._feedback.say(f"Evaluation: {report.images} of {report.total} {unit} scored{stopped}{bad}; {folder}")

        self._jobs.submit("evaluate", f"Evaluating on {Path(data).name}...", job, done)

    def inspect(self, key: str, cls: int | None = None) -> None:
        """Each method's map of the evaluated image ``key`` with its pointing point (on the worker; ``inspected``
        when ready)."""
        if self._scored is None:
            raise GradscopeError("Evaluate first: the images are those of the last evaluation.")
        engine, source, settings = self._scored

        def job(token: Any) -> Any:
            from gradscope.app.evaluation.inspect import inspect_image

            return inspect_image(engine, source, settings, key, cls)

        def done(inspection: Any) -> None:
            self.inspection = inspection
            self.inspected.emit(inspection)

        self._jobs.submit("inspect", f"Maps of {key}...", job, done)


def _folders(out: Path):
    """``out``, then ``out-2`` ... ``out-100``."""
    yield out
    for k in range(2, 101):
        yield out.with_name(f"{out.name}-{k}")
