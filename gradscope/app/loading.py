"""Opening a model in the Session: loading on the worker, building the engine and the first layout, then
resetting (or restoring from a session file) everything that described the previous model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradscope.app.history import PlanHistory
from gradscope.app.session_files import find_class_names
from gradscope.app.summaries import weight_info
from gradscope.core.targets import Target
from gradscope.rules.plan import Plan


class ModelLoadingMixin:
    """Model lifecycle for ``Session`` (which provides the state, the signals and ``_submit``)."""

    def open_model(
        self, path: str | Path, *, safe_mode: bool = True, custom_objects_file: str | Path | None = None
    ) -> None:
        """Load a ``.keras``/``.h5`` file on the worker. Failures arrive as ``error_raised``; an
        ``UnsafeModelError`` means the file runs code when loaded and needs ``safe_mode=False``; a
        ``CustomObjectError`` means it uses custom layers: pass the Python file defining them as
        ``custom_objects_file`` (it is imported, i.e. run, on the worker)."""
        path = str(path)
        objects_file = None if custom_objects_file is None else str(custom_objects_file)
        self.load_request = {"path": path, "safe_mode": safe_mode, "custom_objects_file": objects_file}

        def load(token: Any) -> dict[str, Any]:
            from gradscope.io.models import load_custom_objects_file, load_model_in_steps

            objects = None
            if objects_file is not None:
                token.report(f"Importing custom objects from {Path(objects_file).name}...")
                objects = load_custom_objects_file(objects_file)
            token.report(f"Loading {Path(path).name}...")
            model, load_weights = load_model_in_steps(path, safe_mode=safe_mode, custom_objects=objects)
            token.check()
            built = self._build_engine(model, token)
            token.preview(built)  # the graph is drawn while the weights load
            token.report("Loading the weights...")
            load_weights()
            token.check()
            return {**built, "custom_objects_file": objects_file}

        self.model_loading.emit(path)
        self._submit(
            "load",
            f"Loading {Path(path).name}...",
            load,
            lambda out: self._on_model_ready(out, path),
            on_preview=self._on_model_preview,
        )

    def set_model(self, model: Any, path: str | None = None) -> None:
        """Use an in-memory ``keras.Model`` (tests, notebooks). The engine is still built on the worker."""
        self.model_loading.emit(path or getattr(model, "name", "model"))
        self._submit(
            "load",
            "Building the engine...",
            lambda t: self._build_engine(model, t),
            lambda out: self._on_model_ready(out, path),
        )

    def _build_engine(self, model: Any, token: Any) -> dict[str, Any]:
        from gradscope.engine.runner import Engine
        from gradscope.render.graph_layout import compute_layout, default_collapsed
        from gradscope.rules.base import available_rules

        available_rules()  # import the built-in rules here, not on the GUI thread
        token.report("Reading the graph...")
        engine = Engine(model)
        token.check()
        token.report("Laying out the graph...")
        collapsed = default_collapsed(engine.graph)  # a large graph opens as its blocks (expand on click)
        layout = compute_layout(
            engine.graph, collapsed, should_stop=lambda: token.cancelled, direction=self.layout_direction
        )
        return {"engine": engine, "graph": engine.graph, "layout": layout, "collapsed": collapsed}

    def _on_model_preview(self, out: dict[str, Any]) -> None:
        """The new model's graph, shown (not yet usable) while its weights load; the Session itself still
        holds the current model until the load finishes."""
        self.previewing = True
        self.model_previewed.emit(out["graph"], out["layout"])

    def _withdraw_preview(self) -> None:
        """A load that showed its graph failed or was cancelled: the views go back to the current model."""
        if self.previewing:
            self.previewing = False
            self.model_previewed.emit(None, None)

    def _on_weights(self, info: dict[str, Any]) -> None:
        """Weight statistics (0.4 s on ResNet50) arrive after the graph is on screen, not before it."""
        self.weight_info = info
        self.weights_ready.emit(info)

    def _on_model_ready(self, out: dict[str, Any], path: str | None) -> None:
        if not self.rules_ready:  # the load job imported them on the worker
            self.rules_ready = True
            self.rules_changed.emit([])
        self.previewing = False
        self._engine = out["engine"]
        self.graph = out["graph"]
        self.weight_info = {}
        engine = out["engine"]
        self._submit("weights", "", lambda token: weight_info(engine), self._on_weights, quiet=True)
        self.layout = out["layout"]
        self.model_path = path
        self.custom_objects_file = out.get("custom_objects_file")
        self.class_names = find_class_names(path) if path else []
        self.diagnosis = None
        self.collapsed = set(out.get("collapsed", ()))
        self.ab.pinned, self.ab.node_cosine = None, {}  # a comparison belongs to the previous model (quiet)
        self.results.clear()
        self.selected = None
        self.method_name = "gradient"
        self.method_sampling = None
        self.target = Target()
        restore, self._restore = self._restore, None
        missing: list[str] = []
        if restore is not None:
            restore, missing = restore.fitted(self.graph)
            self.preprocessing = restore.preprocessing
            self.target = restore.target
            self.view = restore.view
            self.method_name = restore.method or "custom"
            self.method_sampling = _sampling_of(restore.method, self.graph)
        else:  # a node the previous model's preset pinned means nothing here: read at the input
            self._take_readout("max_abs", False, False, None)
        self._history = PlanHistory(self._edit(Plan()))
        self.model_loaded.emit(self.graph)
        self.diagnosis_changed.emit(None)
        self.layout_changed.emit(self.layout)
        self.status_changed.emit(
            f"Opened {Path(path).name if path else self.graph.model_name}: {len(self.graph)} nodes "
            f"(layout {self.layout.seconds * 1000:.0f} ms)" + "".join(f". {note}" for note in self.graph.notes)
        )
        if restore is not None:
            if self._validate(restore.plan):
                self._history.replace(self._edit(restore.plan))
            self.plan_changed.emit(self.plan)
            self.target_changed.emit(self.target)
            self.view_changed.emit(self.view)
            if restore.image:
                self.open_image(restore.image, run=False)
            if restore.selected:
                self.select(restore.selected)
            if missing:
                self.status_changed.emit(
                    f"The session names node(s) this model does not have, left out: {', '.join(missing)}."
                )
        else:
            self.plan_changed.emit(self.plan)
            self.target_changed.emit(self.target)
        self._prepare_inputs()
        self._maybe_run()

    def _submit_layout(self) -> None:
        from gradscope.render.graph_layout import compute_layout

        graph, collapsed, direction = self.graph, frozenset(self.collapsed), self.layout_direction

        def job(token: Any) -> Any:
            return compute_layout(graph, collapsed, should_stop=lambda: token.cancelled, direction=direction)

        self._submit("layout", "Laying out the graph...", job, self._on_layout)

    def _on_layout(self, layout: Any) -> None:
        self.layout = layout
        self.layout_changed.emit(layout)


def _sampling_of(method: str | None, graph: Any) -> tuple[str, dict[str, Any]] | None:
    """The sampling of a restored session's method preset (SmoothGrad, IG), with its default options."""
    from gradscope.rules.methods import available_methods, build_method

    if not method or method not in available_methods():
        return None
    try:
        m = build_method(method, graph)
    except Exception:  # noqa: BLE001 - a preset that does not fit this model simply has no sampling
        return None
    return (m.sampling, dict(m.options)) if m.sampling else None
