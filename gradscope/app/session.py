"""The GUI's state and its events, Qt-free: model, input, target, plan (with undo), view settings, results.

Widgets never talk to each other or to TensorFlow: they call Session methods and subscribe to its ``Signal``s.
Everything that touches TensorFlow (loading a model, building the engine, backward passes, reading weights)
runs as a job on the executor's single worker thread; results come back as numpy and are delivered on the
owner's thread. Every job has a request id: a result that a newer request made stale is dropped, so a slow
pass never overwrites the view of a newer plan.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.app.compare import Comparison, compare
from gradscope.app.comparing import PlanComparison
from gradscope.app.editing import PlanEditingMixin
from gradscope.app.exporting import ExportingMixin
from gradscope.app.history import READOUT_FIELDS, PlanHistory
from gradscope.app.inputs import Inputs
from gradscope.app.jobs import JobsMixin
from gradscope.app.loading import ModelLoadingMixin
from gradscope.app.results import Results, RunOutput, signal_of
from gradscope.app.session_files import SESSION_SCHEMA, SESSION_SUFFIX, Restore, read_session_file
from gradscope.app.summaries import WeightInfo, with_input_stats
from gradscope.app.view import (
    INPUT_KEY,
    NORMALIZATIONS,
    PREPROCESSINGS,
    REDUCTIONS,
    OverlayImages,
    ViewError,
    ViewSettings,
    colormaps,
    overlay_images,
)
from gradscope.app.worker import InlineExecutor
from gradscope.core.errors import GradscopeError, GraphError, TargetError
from gradscope.core.events import Signal
from gradscope.core.files import write_text_atomic
from gradscope.core.graph import LayerGraph
from gradscope.core.results import BackwardResult, NodeStats
from gradscope.core.targets import Target, whole_number
from gradscope.engine.attribution import with_sampled_input
from gradscope.rules.plan import Plan

# Re-exported: the front ends take the view's choices and the session-file names from here.
__all__ = [
    "INPUT_KEY",
    "NORMALIZATIONS",
    "PREPROCESSINGS",
    "REDUCTIONS",
    "SESSION_SCHEMA",
    "SESSION_SUFFIX",
    "OverlayImages",
    "Session",
    "ViewSettings",
    "WeightInfo",
    "colormaps",
]


# ------------------------------------------------------------------------------------------------ session
class Session(PlanEditingMixin, ModelLoadingMixin, ExportingMixin, JobsMixin):
    """One open model and everything shown about it."""

    def __init__(self, executor: Any = None, *, auto_run: bool = True) -> None:
        self.executor = executor if executor is not None else InlineExecutor()
        self.auto_run = auto_run
        self.background_compile = True  # compile a live-answered plan after it is shown (see _on_run)
        self.busy_since = time.monotonic()  # when the current busy work started (the GUI shows elapsed time)
        # state
        self.model_path: str | None = None
        self.fed = Inputs()  # the image, its scaling and the batch built from them (app.inputs)
        self.graph: LayerGraph | None = None
        self.layout: Any = None
        self.previewing = False  # a loading model's graph is on screen (``model_previewed``)
        self.weight_info: dict[str, list[WeightInfo]] = {}
        self.target = Target()
        self.method_name = "gradient"
        #: (kind, options) when the method averages the input gradient over copies (SmoothGrad, IG), else None
        self.method_sampling: tuple[str, dict[str, Any]] | None = None
        self.view = ViewSettings()
        self.selected: str | None = None
        self.results = Results()  # what was computed and is shown (app.results): widgets subscribe to it
        self.last_error: str | None = None
        self.collapsed: set[str] = set()
        self.layout_direction = "TB"  # graph view: "TB" top to bottom, "LR" left to right
        self.class_names: list[str] = []  # from a description file beside the model, if there is one
        self.custom_objects_file: str | None = None  # the .py file the open model's custom layers came from
        #: What the last ``open_model`` asked for (path, safe_mode, custom_objects_file): a front end retries it
        #: with one thing changed when loading fails for want of a custom-objects file or of unsafe mode.
        self.load_request: dict[str, Any] | None = None
        self.diagnosis: Any = None  # the DiagnosisReport of the open model (None: not run since it opened)
        self._engine: Any = None  # touched only inside jobs (the worker thread)
        self._history = PlanHistory(self._edit(Plan()))
        self._restore: Restore | None = None
        self._init_jobs()
        # events (all emitted on the owner's thread)
        self.model_loading = Signal("model_loading")  # (path)
        self.model_loaded = Signal("model_loaded")  # (graph)
        # (graph, layout) of a model whose weights still load; (None, None): back to the current model
        self.model_previewed = Signal("model_previewed")
        self.layout_changed = Signal("layout_changed")  # (GraphLayout)
        self.image_changed = self.fed.image_changed  # (image or None)
        self.plan_changed = Signal("plan_changed")  # (plan)
        self.target_changed = Signal("target_changed")  # (target)
        self.view_changed = Signal("view_changed")  # (ViewSettings)
        self.selection_changed = Signal("selection_changed")  # (node id or None)
        self.result_changed = self.results.changed  # (result, baseline)
        self.weights_ready = Signal("weights_ready")  # (node id -> [WeightInfo]) after a model opened
        # the A/B comparison (app.comparing): B pinned, A changed, cosines ready -> (Pinned or None)
        self.ab = PlanComparison(self.results, self._submit)
        self.compare_changed = self.ab.changed
        self.busy_changed = Signal("busy_changed")  # (label or None)
        self.status_changed = Signal("status_changed")  # (message)
        self.error_raised = Signal("error_raised")  # (title, message, exception)
        self.rules_changed = Signal("rules_changed")  # (names of newly loaded rules)
        self.diagnosis_changed = Signal("diagnosis_changed")  # (DiagnosisReport or None)
        self.sanity_ready = Signal("sanity_ready")  # (SanityReport) of the plan on screen
        self.rules_ready = False  # built-in rules imported (they import TensorFlow: done on the worker)

    def start(self) -> None:
        """Import TensorFlow and the built-in rules on the worker, so the window shows at once; the rule
        lists fill in (``rules_changed``) when it is done. Jobs submitted meanwhile queue behind it."""
        if self.rules_ready:
            return

        def warm_up(token: Any) -> list[str]:
            token.report("Starting TensorFlow...")
            import gradscope.engine.runner  # noqa: F401
            from gradscope.rules.base import available_rules

            return list(available_rules())

        self._submit("warmup", "Starting TensorFlow...", warm_up, self._on_rules_ready)

    def _on_rules_ready(self, names: list[str]) -> None:
        self.rules_ready = True
        self.rules_changed.emit([])

    # ------------------------------------------------------------------------------------------- target, view
    def set_target(self, target: Target) -> None:
        if target == self.target:
            return
        try:
            target.check_class(self.graph.class_count() if self.graph is not None else None)
        except TargetError as exc:
            self._error("Bad target", str(exc), exc)
            return
        self.target = target
        self._unpin_for("a new target")
        self.target_changed.emit(target)
        self._maybe_run()

    def set_target_class(self, index: int | None) -> None:
        try:
            target = Target(index=index)
        except TargetError as exc:
            self._error("Bad target", str(exc), exc)
            return
        self.set_target(target)

    def set_view(self, **changes: Any) -> None:
        if self._set_view_quiet(**changes):
            self.view_changed.emit(self.view)

    def _set_view_quiet(self, **changes: Any) -> bool:
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(ViewSettings)})
        if unknown:
            raise ViewError(
                f"Unknown view setting(s) {', '.join(unknown)}; valid: {', '.join(ViewSettings().to_dict())}."
            )
        new = dataclasses.replace(self.view, **changes)
        new.check()  # a bad value is refused here, not at the next export
        readout = new.readout_node
        if readout not in (None, INPUT_KEY) and (self.graph is None or readout not in self.graph):
            raise ViewError(f"Cannot read the map at {readout!r}: no such node in this model.")
        if new == self.view:
            return False
        self.view = new
        return True

    def select(self, node_id: str | None) -> None:
        if node_id is not None and self.graph is not None and node_id not in self.graph:
            node_id = None
        if node_id == self.selected:
            return
        self.selected = node_id
        self.selection_changed.emit(node_id)

    def set_collapsed(self, group: str, collapsed: bool) -> None:
        """Collapse or expand a group (nested model or block) in the graph view (laid out off this thread)."""
        changed = (group in self.collapsed) != collapsed
        (self.collapsed.add if collapsed else self.collapsed.discard)(group)
        if changed and self.graph is not None:
            self._submit_layout()

    def set_layout_direction(self, direction: str) -> None:
        """Lay the graph out top to bottom ("TB") or left to right ("LR")."""
        if direction not in ("TB", "LR"):
            raise GraphError(f"A layout runs 'TB' (top to bottom) or 'LR' (left to right), not {direction!r}.")
        if direction != self.layout_direction:
            self.layout_direction = direction
            if self.graph is not None:
                self._submit_layout()

    def collapse_all(self, collapse: bool) -> None:
        """Collapse every group (nested models and name blocks) or expand them all, in one layout."""
        if self.graph is None:
            return
        from gradscope.render.graph_layout import display_groups

        wanted = set(display_groups(self.graph).paths) if collapse else set()
        if wanted != self.collapsed:
            self.collapsed = wanted
            self._submit_layout()

    def set_preprocessing(self, mode: str) -> None:
        try:
            if not self.fed.set_preprocessing(mode):
                return
        except ViewError:
            self._error("Unknown preprocessing", f"Choose one of {', '.join(PREPROCESSINGS)}.", None)
            return
        self._unpin_for("a new input scaling")
        self._prepare_inputs()
        self._maybe_run()

    # ------------------------------------------------------------------------------------------- image
    def open_image(self, path: str | Path, *, run: bool = True) -> bool:
        return self._take_image(lambda: self.fed.open(path), "Cannot open the image", run)

    def set_image(self, image: np.ndarray, path: str | None = None, *, run: bool = True) -> bool:
        return self._take_image(lambda: self.fed.set_image(image, path), "Cannot use the image", run)

    def _take_image(self, change: Any, title: str, run: bool) -> bool:
        try:
            change()
        except GradscopeError as exc:
            self._error(title, str(exc), exc)
            return False
        self._unpin_for("a new input")
        self._prepare_inputs()
        if run:
            self._maybe_run()
        return True

    def _prepare_inputs(self) -> None:
        if self.graph is not None:
            self.fed.prepare(self.graph)

    # What the model is fed lives in ``self.fed`` (app.inputs.Inputs); these read it.
    @property
    def image(self) -> np.ndarray | None:
        return self.fed.image

    @property
    def image_path(self) -> str | None:
        return self.fed.image_path

    @property
    def inputs(self) -> Any:
        return self.fed.batch

    @property
    def input_note(self) -> str:
        return self.fed.note

    @property
    def preprocessing(self) -> str:
        return self.fed.preprocessing

    @preprocessing.setter
    def preprocessing(self, mode: str) -> None:  # before a model opens (session files, --preprocessing)
        self.fed.set_preprocessing(mode)

    # ------------------------------------------------------------------------------------------- running
    def _maybe_run(self) -> None:
        if self.auto_run:
            self.run()

    def run(self) -> bool:
        """Compute the baseline (no rules, only when model/input/target changed) and the current plan."""
        if self._engine is None or self.inputs is None:
            return False
        engine, x, target, plan, method = self._engine, self.inputs, self.target, self.plan, self.method_name
        sampling = self.method_sampling
        readout = {k: getattr(self.view, k) for k in READOUT_FIELDS}
        shown = [n for n in (self.readout, self.selected) if n is not None]  # copied to numpy on the worker
        self._cancel_kind("compile")  # a background compile of an older plan only competes with this one
        base_key = (id(engine), self.fed.version, target)
        old_base = self.results.baseline_for(base_key)

        def job(token: Any) -> RunOutput:
            t0 = time.perf_counter()
            traces = engine.trace_count
            base = old_base
            if base is None:
                token.report("Baseline (plain gradient)...")
                base = with_input_stats(engine.backward(x, target, Plan(), capture="all"))
                token.check()
            result = base
            if plan.entries and not plan.is_identity:
                token.report(f"Running the plan ({len(plan.entries)} entries)...")
                result = with_input_stats(engine.backward(x, target, plan, capture="all"))
            if sampling is not None:
                token.report(f"{sampling[0]}: averaging the input gradient over copies...")
                result = with_input_stats(with_sampled_input(engine, x, target, plan, result, sampling, token))
            for res in (result, base):
                for node in shown:
                    if node in res.node_grads:
                        res.node_grads[node], res.node_values.get(node)
            seconds = time.perf_counter() - t0
            return RunOutput(result, base, base_key, seconds, engine.trace_count != traces, plan, method, readout)

        self._submit("run", "Computing gradients...", job, self._on_run)
        return True

    def _on_run(self, out: RunOutput) -> None:
        self.last_error = None
        self.results.show(
            out.result,
            out.baseline,
            plan=out.plan,
            method=out.method,
            readout=out.readout,
            seconds=out.seconds,
            baseline_key=out.baseline_key,
        )
        mode = out.result.meta.get("mode", "compiled")
        how = {
            "live": f"live, {out.result.meta.get('recomputed_nodes', 0)} node(s) recomputed",
            "compiled": "traced" if out.retraced else "compiled",
        }.get(mode, mode)
        warnings = out.result.warnings()
        self.status_changed.emit(
            f"Gradients in {out.seconds:.2f} s ({how}); {len(out.result.rules)} node(s) with rules"
            + (f". Warning: {'; '.join(warnings)}." if warnings else "")
        )
        if self.pinned is not None:
            self.ab.refresh()
        self._materialize_in_background(out.result, out.baseline)
        if mode == "live" and self.background_compile:
            self._compile_in_background(out.plan)

    def _materialize_in_background(self, *results: BackwardResult) -> None:
        """Copy the signals no view has read yet to numpy on the worker, after the result is shown (the copies
        cost more than the backward pass itself on a large model; see ``LazyArrays``)."""
        lazy = [m for r in results for m in (r.node_grads, r.node_values) if getattr(m, "pending", 0)]
        if lazy:
            self._submit("materialize", "", lambda token: [m.materialize() for m in lazy], lambda _: None, quiet=True)

    def _compile_in_background(self, plan: Plan) -> None:
        """After a live answer: compile the plan's kernels and the whole plan, so the next edit and the next
        image are fast. A newer run cancels it (between nodes); it never changes what is shown."""
        engine, x, target = self._engine, self.inputs, self.target

        def job(token: Any) -> bool:
            return engine.compile(x, target, plan, should_stop=lambda: token.cancelled)

        self._submit("compile", "", job, lambda _done: None, quiet=True)

    # The results on screen live in ``self.results`` (app.results.Results); these read it.
    @property
    def result(self) -> BackwardResult | None:
        return self.results.current

    @property
    def baseline(self) -> BackwardResult | None:
        return self.results.baseline

    @property
    def result_plan(self) -> Plan | None:
        return self.results.plan

    @property
    def result_method(self) -> str | None:
        return self.results.method

    @property
    def last_run_seconds(self) -> float | None:
        return self.results.seconds

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

    # ------------------------------------------------------------------------------------------- A/B comparison
    @property
    def pinned(self) -> Any:
        return self.ab.pinned

    @property
    def node_cosine(self) -> dict[str, float]:
        return self.ab.node_cosine

    def pin_for_compare(self) -> bool:
        """Keep the result on screen as B (what the next plans are compared with)."""
        if not self.ab.pin(self.method_name):
            self._error("Nothing to pin", "Wait for a result, then pin it to compare the next plan with it.", None)
            return False
        self.status_changed.emit(f"Pinned {self.pinned.method} as B: the next plans are compared with it.")
        return True

    def unpin(self) -> None:
        self.ab.unpin()

    def _unpin_for(self, why: str) -> None:
        """B compares plans on one input and target: another one makes it meaningless."""
        if self.pinned is not None:
            self.ab.unpin()
            self.status_changed.emit(f"Comparison ended: {why} (pin again to compare on it).")

    def swap_compare(self) -> bool:
        """B's plan becomes the current one (an undoable edit) and the result on screen becomes B."""
        old = self.ab.swap(self.method_name)
        if old is None:
            return False
        self.method_name = old.method
        self.set_plan(old.plan)
        self.ab.refresh()
        return True

    def comparison(self) -> Comparison | None:
        """A (the result on screen) and B (pinned), read out with the current view at the current read-out."""
        if self.pinned is None or self.result is None:
            return None
        node = self.readout
        try:
            a, b = self._signal_from(self.result, node), self._signal_from(self.pinned.result, node)
        except GraphError:
            return None
        labels = (self.result_method or self.method_name, self.pinned.method)
        stats = (self.result.stats, self.pinned.result.stats)
        return compare(a, b, self.image, self.shown_view, node, labels, stats)

    # ------------------------------------------------------------------------------------------- diagnostics
    def diagnose(self) -> bool:
        """Path diagnostics of the open model for the current target, on the worker: which trainable
        variables get a gradient and, for those that don't, the op that cuts the path (``diagnosis_changed``).
        Only the input's shapes matter: the forward pass is traced, not run, so no variable changes."""
        if self._engine is None:
            self._error("No model", "Open a model first, then run the diagnostics.", None)
            return False
        engine, x, target = self._engine, self.inputs, self.target

        def job(token: Any) -> Any:
            from gradscope.engine.paths import diagnose_model

            token.report("Diagnostics: tracing the forward pass and walking its ops...")
            return diagnose_model(engine, x, target)

        self._submit("diagnose", "Running diagnostics...", job, self._on_diagnosis)
        return True

    def sanity_checks(self) -> bool:
        """Conservation, model randomisation and finite differences for the current plan and input, on the
        worker (``engine.sanity``), with progress and cancel; the report arrives with ``sanity_ready``."""
        if self._engine is None or self.inputs is None:
            self._error("No model", "Open a model first, then run the sanity checks.", None)
            return False
        engine, x, target, plan, method = self._engine, self.inputs, self.target, self.plan, self.method_name

        def job(token: Any) -> Any:
            from gradscope.engine.sanity import sanity_checks

            return sanity_checks(engine, x, target, plan, method=method, progress=token.step)

        def done(report: Any) -> None:
            self.status_changed.emit(f"Sanity checks of {report.method} done.")
            self.sanity_ready.emit(report)

        self._submit("sanity", "Running sanity checks...", job, done)
        return True

    def _on_diagnosis(self, report: Any) -> None:
        self.diagnosis = report
        self.diagnosis_changed.emit(report)
        n = len(report.variables)
        if report.ok:
            self.status_changed.emit(f"Diagnostics: all {n} trainable variable(s) receive a gradient.")
            return
        cuts = report.cuts()
        where = f"; cut at {cuts[0][0].op_type} in {cuts[0][0].where()}" if cuts else ""
        self.status_changed.emit(
            f"Diagnostics: {len(report.problems)} of {n} trainable variable(s) get no gradient{where}."
        )

    @property
    def diagnosing(self) -> bool:
        return "diagnose" in self._active

    def diagnosis_highlight(self) -> dict[str, str]:
        """Node id -> role ("cut", "blocked", "path", "unused", "never_read") for the graph view."""
        return self.diagnosis.highlight() if self.diagnosis is not None else {}

    def cancel(self, *, grace: float = 2.0) -> None:
        """Drop whatever is running or queued. The view keeps the last finished result, and the plan goes back
        to the one that result was computed with, so plan, map and labels describe the same result.

        A job that does not stop (a rule looping forever) is interrupted; if it is still running after
        ``grace`` seconds it is abandoned: the window stays usable (plans, views, saving), and computations are
        refused with a clear message until it returns (one TensorFlow thread, never two)."""
        was_running = "run" in self._active
        for kind in list(self._active) + ["compile"]:
            self._latest[kind] = self._next_id()
        self.executor.cancel()
        self._withdraw_preview()
        abandoned = self._stop_running_job(grace)
        self._active.clear()
        self.busy_changed.emit(None)
        note = (
            " The computation did not stop (a rule blocked inside native code?). TensorFlow runs on one thread, so "
            "nothing can compute until it returns: save your work and restart gradscope if it does not."
            if abandoned
            else ""
        )
        if was_running and self.result_is_stale and self.result_plan is not None:
            self.method_name = self.result_method or self.method_name
            self.set_plan(self.result_plan, run=False)  # its result is the one on screen
            self.status_changed.emit("Cancelled: back to the plan of the result shown (Ctrl+Z undoes this)." + note)
            return
        self.status_changed.emit("Cancelled." + note)

    def _stop_running_job(self, grace: float) -> bool:
        """Interrupt the running job; abandon it if it has not stopped in ``grace`` (see ``ThreadExecutor.abandon``:
        the worker stays the one TensorFlow thread, so nothing computes until the job returns)."""
        interrupt = getattr(self.executor, "interrupt", None)
        if interrupt is None or not interrupt():
            return False
        if self.executor.wait_running(grace):
            return False
        self.executor.on_recovered = self._on_worker_recovered
        self.executor.abandon()
        return True

    def _on_worker_recovered(self) -> None:
        self.status_changed.emit("The computation that did not stop has returned: gradscope computes again.")

    # ------------------------------------------------------------------------------------------- rule files
    def load_rule_file(self, path: str | Path) -> list[str]:
        """Import a user's rule file (it is code: only files the user chose). Returns the new rule names."""
        from gradscope.rules.base import load_rule_file

        return self._load_rules(lambda: load_rule_file(path), "the rule file", f"from {Path(path).name}")

    def load_rule_plugins(self) -> list[str]:
        """Import the rule plugins installed packages offer (the user's explicit choice). Returns new names."""
        from gradscope.rules.base import load_rule_plugins

        return self._load_rules(load_rule_plugins, "the rule plugins", "from the installed plugins")

    def _load_rules(self, load: Any, what: str, where: str) -> list[str]:
        try:
            names = load()
        except GradscopeError as exc:
            self._error(f"Cannot load {what}", str(exc), exc)
            return []
        self.rules_changed.emit(names)
        self.status_changed.emit(f"Loaded rule(s) {', '.join(names) or '(none new)'} {where}")
        return names

    # ------------------------------------------------------------------------------------------- derived views
    @property
    def readout(self) -> str | None:
        """The node whose signal the overlay shows (None: the model input)."""
        node = self.shown_view.readout_node or self.selected
        if (
            node is None
            or node == INPUT_KEY
            or self.graph is None
            or node not in self.graph
            or self.graph.node(node).is_input
        ):
            return None
        return node

    def skipped_nodes(self) -> set[str]:
        """Nodes the target does not reach by design: the final softmax when the logits are explained."""
        res = self.result or self.baseline
        if res is not None and self.graph is not None and res.meta.get("softmax_stripped"):
            return {self.graph.output_ids[0]}
        return set()

    def stats(self, which: str = "current") -> dict[str, NodeStats]:
        return self.results.stats(which)

    def class_label(self, index: int) -> str:
        known = isinstance(index, (int, np.integer)) and 0 <= index < len(self.class_names)
        return f"{index} {self.class_names[index]}" if known else str(index)

    def top_k(self, k: int = 5) -> list[tuple[int, float]]:
        """The model's top-k classes for the first sample: (index, probability or score)."""
        res = self.result or self.baseline
        k = whole_number(k, "number of classes") or 0
        if res is None or res.predictions.ndim != 2 or k < 1:
            return []
        p = res.predictions[0]
        order = np.argsort(-p, kind="stable")[:k]
        return [(int(i), float(p[i])) for i in order]

    def signal(self, node: str | None = None, which: str = "current") -> np.ndarray:
        """The first sample's backward signal at ``node`` (None: the input), times input if the view says so."""
        return self._signal_from(self.results.of(which), node)

    def _signal_from(self, res: BackwardResult | None, node: str | None) -> np.ndarray:
        return signal_of(res, node, self.shown_view)

    def overlay(self, node: str | None = ..., which: str = "current") -> OverlayImages:  # type: ignore[assignment]
        """The saliency map at ``node`` (default: ``readout``) as heat map and blend over the image."""
        node = self.readout if node is ... else node
        view = self.shown_view
        return overlay_images(self.signal(node, which), self.image, view, node, blend=self.input_note == "")

    def flow_rows(self, which: str = "current") -> list[dict[str, Any]]:
        return self.results.flow_rows(which)

    def import_plan(self, path: str | Path) -> bool:
        try:
            plan = Plan.load(path)
        except GradscopeError as exc:
            self._error("Cannot read the plan", str(exc), exc)
            return False
        return self.set_plan(plan)

    # ------------------------------------------------------------------------------------------- session files
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SESSION_SCHEMA,
            "model": self.model_path,
            "custom_objects": self.custom_objects_file,
            "image": self.image_path,
            "preprocessing": self.preprocessing,
            "target": self.target.to_dict(),
            "method": self.method_name,
            "plan": self.plan.to_dict(),
            "view": self.view.to_dict(),
            "selected": self.selected,
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        if not path.name.endswith(SESSION_SUFFIX):
            path = path.with_name(path.name.removesuffix(".json") + SESSION_SUFFIX)
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def load(self, path: str | Path, *, allow_code: bool = False) -> bool:
        """Open a session file: its model loads on the worker, then plan, target, view and image apply.

        A session file is data, and may come from someone else: the custom-objects Python file it names is
        imported only with ``allow_code=True`` (the GUI asks first, showing the path; ``session_code_files``
        says what a file names). Without it the model loads without custom objects, and if it needs them the
        error says so."""
        try:
            data = read_session_file(path)
        except GradscopeError as exc:
            self._error("Cannot open the session", str(exc), exc)
            return False
        objects = data.get("custom_objects") or None
        if objects and not allow_code:
            self.status_changed.emit(
                f"{Path(path).name} names the custom-objects file {objects}; it was not run (not allowed)."
            )
            objects = None
        self._restore = Restore(
            Plan.from_dict(data.get("plan") or {}),
            Target.from_dict(data.get("target") or {}),
            ViewSettings.from_dict(data.get("view") or {}),
            data.get("image"),
            data.get("selected"),
            data.get("method"),
            data.get("preprocessing") or "unit",
            data.get("schema", SESSION_SCHEMA),
        )
        self.open_model(data["model"], custom_objects_file=objects)
        return True
