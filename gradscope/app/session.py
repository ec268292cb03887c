"""What one window shows, Qt-free: a composition of small evented models and the few flows that cross them.

Each model owns one part of the state and emits its own events (``docs/app_models.md`` lists them). Widgets
subscribe to the models they show and call their methods; the Session wires what crosses them: a new plan, target
or input runs the backward pass, a new input or target ends the comparison, a new model resets everything else.
Everything that touches TensorFlow runs as a job on the one worker thread; results come back as numpy on the
owner's thread, and a result a newer request made stale is dropped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.app.files import session_files
from gradscope.app.files.session_exports import Exporter
from gradscope.app.files.session_files import Restore
from gradscope.app.models.comparison import PlanComparison
from gradscope.app.models.document import ModelDocument
from gradscope.app.models.editing import PlanEditor
from gradscope.app.models.evaluations import Evaluations
from gradscope.app.models.feedback import Feedback
from gradscope.app.models.history import READOUT_FIELDS
from gradscope.app.models.inputs import Inputs
from gradscope.app.models.jobs import Jobs
from gradscope.app.models.reports import Reports
from gradscope.app.models.results import Results, readout_node, signal_of
from gradscope.app.models.rule_catalog import RuleCatalog
from gradscope.app.models.selection import Selection
from gradscope.app.models.targeting import Targeting
from gradscope.app.models.training_watch import TrainingWatch
from gradscope.app.models.viewing import Viewing
from gradscope.app.patching.model import Patching
from gradscope.app.rendering.comparison import Comparison
from gradscope.app.rendering.positions import position_images
from gradscope.app.rendering.view import OverlayImages, ViewSettings, overlay_images
from gradscope.app.work.running import RunOutput, background_job, generation_job, run_job, run_status, sampling_of
from gradscope.core.errors import GradscopeError
from gradscope.core.graph import LayerGraph
from gradscope.core.results import BackwardResult
from gradscope.core.targets import Target
from gradscope.rules.plan import Plan


class Session:
    """One open model and everything shown about it."""

    def __init__(self, executor: Any = None, *, auto_run: bool = True) -> None:
        self.auto_run = auto_run
        self.background_compile = True  # compile a live-answered plan after it is shown (see _on_run)
        self.prepared_presets: tuple[str, ...] | None = None  # presets it prepares next (None: the default set)
        self.feedback = Feedback()
        self.jobs = Jobs(executor, self.feedback)
        self.document = ModelDocument(self.jobs, self._on_model_ready)
        self.fed = Inputs(self.feedback, self.jobs.submit)
        self.viewing = Viewing(self.document)
        self.selection = Selection(self.document)
        self.targeting = Targeting(self.document, self.feedback)
        self.editor = PlanEditor(self.document, self.viewing, self.feedback)
        self.results = Results()
        self.ab = PlanComparison(self.results, self.jobs.submit, self.feedback)
        self.reports = Reports(self.jobs, self.feedback)
        self.catalog = RuleCatalog(self.jobs, self.feedback)
        self.training = TrainingWatch(self.jobs, self.feedback)  # a training log; independent of the model
        self.evaluations = Evaluations(self.document, self.editor, self.fed, self.jobs, self.feedback)
        self.patching = Patching(self.document, self.fed, self.targeting, self.jobs, self.feedback)
        self.exports = Exporter(self)
        self._restore: Restore | None = None
        self._holding_runs = 0
        # the flows that cross models
        self.editor.changed.connect(lambda plan: self._maybe_run())
        self.targeting.changed.connect(self._on_target)
        self.fed.changed.connect(self._on_input)
        self.patching.corrupt_changed.connect(lambda _corrupt: self.plan.entries and self._maybe_run())

    # ------------------------------------------------------------------------------------------- shortcuts
    @property
    def graph(self) -> LayerGraph | None:
        return self.document.graph

    @property
    def plan(self) -> Plan:
        return self.editor.plan

    @property
    def view(self) -> ViewSettings:
        return self.viewing.settings

    @property
    def target(self) -> Target:
        return self.targeting.target

    @property
    def selected(self) -> str | None:
        return self.selection.node

    @property
    def result(self) -> BackwardResult | None:
        return self.results.current

    @property
    def baseline(self) -> BackwardResult | None:
        return self.results.baseline

    @property
    def inputs(self) -> Any:
        return self.fed.batch

    # ------------------------------------------------------------------------------------------- opening
    def open_model(
        self, path: str | Path, *, safe_mode: bool = True, custom_objects_file: str | Path | None = None
    ) -> None:
        """Load a model file on the worker (``ModelDocument.open``); failures arrive as ``feedback.error_raised``."""
        self.document.open(
            path, safe_mode=safe_mode, custom_objects_file=custom_objects_file, on_failed=self._load_failed
        )

    def set_model(self, model: Any, path: str | None = None) -> None:
        """Use an in-memory ``keras.Model`` (tests, notebooks). The engine is still built on the worker."""
        self.document.set_model(model, path, on_failed=self._load_failed)

    def _load_failed(self, exc: BaseException) -> None:
        self._restore = None  # a session whose model failed must not restyle the next model opened

    def _on_model_ready(self) -> None:
        """A new model is adopted: everything that described the previous one is reset (or restored from the
        session file being opened), quietly; then the new state is announced, model first."""
        doc = self.document
        graph = doc.graph
        self.catalog.mark_ready()  # the load job imported the built-in rules on the worker
        self.ab.drop()
        self.results.clear()
        self.selection.reset()
        restore, self._restore = self._restore, None
        missing: list[str] = []
        if restore is not None:
            restore, missing = restore.fitted(graph)
            self.fed.preprocessing = restore.preprocessing  # checked when the file was read
            self.targeting.reset(restore.target)
            self.viewing.reset(restore.view)
            self.editor.reset(restore.method or "custom", sampling_of(restore.method, graph))
        else:  # a node the previous model's preset pinned means nothing here: read at the input
            self.targeting.reset()
            text = graph.token_input is not None
            self.viewing.take_readout("max_abs", False, text, None)  # token scores are signed: red for, blue against
            self.editor.reset()

        doc.loaded.emit(graph)
        self.reports.clear()
        doc.layout_changed.emit(doc.layout)
        name = Path(doc.path).name if doc.path else graph.model_name
        self.feedback.say(
            f"Opened {name}: {len(graph)} nodes (layout {doc.layout.seconds * 1000:.0f} ms)"
            + "".join(f". {note}" for note in graph.notes)
        )
        with self._runs_held():
            vocab = (restore.vocabulary if restore is not None else None) or (
                session_files.find_vocabulary(doc.path) if doc.path else None
            )
            if vocab is not None and self.fed.set_vocabulary(vocab):
                self.feedback.say(f"Token ids are shown as words from {Path(vocab).name}.")
            if restore is not None and self.editor.fits(restore.plan):
                self.editor.set_plan(restore.plan, record=False)
            else:
                self.editor.changed.emit(self.plan)
            self.targeting.changed.emit(self.target)
            if restore is not None:
                self.viewing.changed.emit(self.view)
                if restore.tokens:
                    self.fed.set_typed(restore.tokens)
                elif restore.image:
                    self.fed.open(restore.image)
                if restore.selected:
                    self.selection.select(restore.selected)
                if missing:
                    self.feedback.say(
                        f"The session names node(s) this model does not have, left out: {', '.join(missing)}."
                    )
        self._prepare_inputs()
        self._maybe_run()

    # ------------------------------------------------------------------------------------------- input, target
    def _on_input(self) -> None:
        if self.fed.loading_vocab:  # the typed text waits for its tokenizer, which says when it is there
            return
        self.ab.end("a new input")
        self._prepare_inputs()
        self._maybe_run()

    def _prepare_inputs(self) -> None:
        if self.graph is not None:
            self.fed.prepare(self.graph)
            if self.fed.problem:
                self.feedback.error("Cannot use the input", f"{self.fed.problem} Using a random input meanwhile.")

    def _on_target(self, target: Target) -> None:
        if not self._holding_runs:
            self.ab.end("a new target")
        self._maybe_run()

    # ------------------------------------------------------------------------------------------- running
    @contextlib.contextmanager
    def _runs_held(self) -> Iterator[None]:
        """Edits inside do not start a run (the caller runs once after, or shows a result it has)."""
        self._holding_runs += 1
        try:
            yield
        finally:
            self._holding_runs -= 1

    def _maybe_run(self) -> None:
        if self.auto_run and not self._holding_runs:
            self.run()

    def run(self) -> bool:
        """Compute the baseline (no rules, only when model/input/target changed) and the current plan."""
        engine, x = self.document.engine, self.inputs
        if engine is None or x is None:
            return False
        editor, target, plan, method = self.editor, self.target, self.plan, self.editor.method_name
        readout = {k: getattr(self.view, k) for k in READOUT_FIELDS}
        shown = [n for n in (self.readout, self.selected) if n is not None]  # copied to numpy on the worker
        self.jobs.cancel_kind("compile")  # a background compile of an older plan only competes with this one
        base_key = (id(engine), self.fed.version, target)
        base, other = self.results.baseline_for(base_key), self.patching.corrupt_batch  # value rules read `other`
        job = run_job(engine, x, target, plan, editor.method_sampling, base, shown, other)

        def done(out: tuple[BackwardResult, BackwardResult, float, bool]) -> None:
            result, base, seconds, retraced = out
            self._on_run(RunOutput(result, base, base_key, seconds, retraced, plan, method, readout))

        def failed(exc: BaseException) -> str | None:
            return "Undo (Ctrl+Z) goes back to the previous plan." if self.editor.can_undo else None

        self.jobs.submit("run", "Computing gradients...", job, done, on_failed=failed)
        return True

    def _on_run(self, out: RunOutput) -> None:
        self.results.show(
            out.result,
            out.baseline,
            plan=out.plan,
            method=out.method,
            readout=out.readout,
            seconds=out.seconds,
            baseline_key=out.baseline_key,
        )
        self.feedback.say(run_status(out))
        if self.ab.pinned is not None:
            self.ab.refresh()
        # copy the signals no view has read yet to numpy on the worker, after the result is shown (the copies
        # cost more than the backward pass itself on a large model; see ``LazyArrays``)
        lazy = [
            m for r in (out.result, out.baseline) for m in (r.node_grads, r.node_values) if getattr(m, "pending", 0)
        ]
        if lazy:
            self.jobs.submit(
                "materialize", "", lambda token: [m.materialize() for m in lazy], lambda _: None, quiet=True
            )
        if out.result.meta.get("mode") == "live" and self.background_compile:
            job = background_job(self.document.engine, self.inputs, self.target, out.plan, self.prepared_presets)
            self.jobs.submit("compile", "", job, lambda _done: None, quiet=True)

    def cancel(self, *, grace: float = 2.0) -> None:
        """Drop whatever is running or queued. The view keeps the last finished result, and the plan goes back
        to the one that result was computed with, so plan, map and labels describe the same result.

        A job that does not stop (a rule looping forever) is interrupted; if it is still running after
        ``grace`` seconds it is abandoned: the window stays usable (plans, views, saving), and computations are
        refused with a clear message until it returns (one TensorFlow thread, never two)."""
        was_running = self.jobs.running("run")
        abandoned = self.jobs.cancel_all(grace, self._on_worker_recovered)
        self.document.cancelled()
        note = (
            " The computation did not stop (a rule blocked inside native code?). TensorFlow runs on one thread, so "
            "nothing can compute until it returns: save your work and restart gradscope if it does not."
            if abandoned
            else ""
        )
        shown = self.results
        if was_running and self.result_is_stale and shown.plan is not None:
            self.editor.method_name = shown.method or self.editor.method_name
            with self._runs_held():
                self.editor.set_plan(shown.plan)  # its result is the one on screen; undo gives the cancelled one
            self.feedback.say("Cancelled: back to the plan of the result shown (Ctrl+Z undoes this)." + note)
            return
        self.feedback.say("Cancelled." + note)

    def _on_worker_recovered(self) -> None:
        self.feedback.say("The computation that did not stop has returned: gradscope computes again.")

    def generate(self, steps: int) -> bool:
        """A language model's generation attributed token by token, on the worker (``Results.generation``)."""
        engine, fed = self.document.engine, self.fed.fed
        if engine is None or fed is None or fed.kind != "tokens" or not engine.is_language_model():
            return False
        job = generation_job(engine, fed, steps, self.plan, self.fed.vocab, self.view.times_input)
        self.jobs.submit("generate", f"Generating {steps} tokens…", job, lambda out: self.results.set_generation(*out))
        return True

    def diagnose(self) -> bool:
        """Path diagnostics of the open model for the current target (``Reports.diagnose``)."""
        return self.reports.diagnose(self.document.engine, self.inputs, self.target)

    def sanity_checks(self) -> bool:
        """Sanity checks of the current plan on the current input (``Reports.sanity_checks``)."""
        return self.reports.sanity_checks(
            self.document.engine, self.inputs, self.target, self.plan, self.editor.method_name
        )

    # ------------------------------------------------------------------------------------------- A/B
    def swap_compare(self) -> bool:
        """B's plan becomes the current one (an undoable edit) and the result on screen becomes B."""
        old = self.ab.swap()
        if old is None:
            return False
        self.editor.method_name = old.method
        self.editor.set_plan(old.plan)
        self.ab.refresh()
        return True

    def comparison(self) -> Comparison | None:
        """A (the result on screen) and B (pinned), read out with the shown view at the current read-out."""
        return self.ab.comparison(self.shown_view, self.readout, self.fed.image, self.editor.method_name)

    # ------------------------------------------------------------------------------------------- what is shown
    @property
    def result_is_stale(self) -> bool:
        """True while the shown result belongs to another plan than the current one (a newer one computes)."""
        return self.results.is_stale(self.plan)

    @property
    def shown_view(self) -> ViewSettings:
        """The view the shown result is drawn with (``Results.view_for``)."""
        return self.results.view_for(self.view, self.plan)

    def result_caption(self) -> str:
        return self.results.caption(self.plan)

    @property
    def readout(self) -> str | None:
        """The node whose signal the overlay shows (None: the model input)."""
        return readout_node(self.shown_view, self.selected, self.graph)

    def signal(self, node: str | None = None, which: str = "current") -> np.ndarray:
        """The first sample's backward signal at ``node`` (None: the input), times input if the view says so."""
        return signal_of(self.results.of(which), node, self.shown_view)

    def overlay(self, node: str | None = ..., which: str = "current", *, width: int = 1024) -> OverlayImages:  # type: ignore[assignment]
        """The map at ``node`` (default: ``readout``): a heat map and blend over the image, or, for tokens and
        table rows, one score per position drawn ``width`` pixels wide (``app.rendering.positions``)."""
        node = self.readout if node is ... else node
        view = self.shown_view
        per_position = position_images(self.results.of(which), node, self.fed.fed, view, width=width)
        if per_position is not None:
            return per_position
        return overlay_images(self.signal(node, which), self.fed.image, view, node, blend=self.fed.note == "")

    # ------------------------------------------------------------------------------------------- files
    def to_dict(self) -> dict[str, Any]:
        return session_files.session_data(
            model=self.document.path,
            custom_objects=self.document.custom_objects_file,
            image=self.fed.image_path or self.fed.source,
            preprocessing=self.fed.preprocessing,
            target=self.target,
            method=self.editor.method_name,
            plan=self.plan,
            view=self.view,
            selected=self.selected,
            tokens=self.fed.typed,
            vocabulary=self.fed.vocab.source if self.fed.vocab is not None else None,
        )

    def save(self, path: str | Path) -> Path:
        return session_files.write_session_file(path, self.to_dict())

    def load(self, path: str | Path, *, allow_code: bool = False) -> bool:
        """Open a session file: its model loads on the worker, then plan, target, view and image apply. A session
        file is data: the custom-objects file it names is imported only with ``allow_code=True`` (the GUI asks,
        showing the path); without, the model loads without them, and if it needs them the error says so."""
        try:
            data = session_files.read_session_file(path)
        except GradscopeError as exc:
            self.feedback.error("Cannot open the session", str(exc), exc)
            return False
        objects = data.get("custom_objects") or None
        if objects and not allow_code:
            self.feedback.say(
                f"{Path(path).name} names the custom-objects file {objects}; it was not run (not allowed)."
            )
            objects = None
        self._restore = Restore.from_data(data)
        self.open_model(data["model"], custom_objects_file=objects)
        return True
