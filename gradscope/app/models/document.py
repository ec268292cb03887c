"""The open model, as a small evented model: loading it on the worker (graph drawn while the weights load),
its engine, its graph's layout (collapsed groups, direction) and its weights summary.

Owns: ``path``, ``graph``, ``engine`` (touched only inside jobs), ``layout`` with ``collapsed`` and
``layout_direction``, ``weight_info``, ``class_names`` (from a description file beside the model),
``custom_objects_file``, ``load_request`` (what the last open asked for: a front end retries it with one thing
changed) and ``previewing`` (a loading model's graph is on screen).
Emits: ``loading(path)``; ``previewed(graph, layout)`` while the weights load, ``(None, None)`` when that load
failed; ``loaded(graph)`` (emitted by the composition once everything else was reset for the new model);
``layout_changed(layout)``; ``weights_ready(node id -> [WeightInfo])``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gradscope.app.files.session_files import find_class_names
from gradscope.app.models.jobs import Jobs
from gradscope.app.rendering.summaries import WeightInfo, weight_info
from gradscope.app.work.heap import release_replaced, settle_after_load
from gradscope.core.errors import GraphError
from gradscope.core.events import Signal
from gradscope.core.graph import LayerGraph

#: Graphs laid out on the owner's thread when a group is expanded or collapsed (larger ones on the worker).
INLINE_LAYOUT_NODES = 300


class ModelDocument:
    def __init__(self, jobs: Jobs, on_ready: Callable[[], None]) -> None:
        """``on_ready()``: called once a model has been adopted (the composition resets what described the
        previous model, then emits ``loaded``)."""
        self._jobs = jobs
        self._on_ready = on_ready
        self.path: str | None = None
        self.graph: LayerGraph | None = None
        self.engine: Any = None
        self.layout: Any = None
        self.collapsed: set[str] = set()
        self.layout_direction = "TB"  # "TB" top to bottom, "LR" left to right
        self.weight_info: dict[str, list[WeightInfo]] = {}
        self.class_names: list[str] = []
        self.custom_objects_file: str | None = None
        self.load_request: dict[str, Any] | None = None
        self.previewing = False
        self.loading = Signal("model_loading")  # (path)
        self.previewed = Signal("model_previewed")  # (graph, layout) or (None, None)
        self.loaded = Signal("model_loaded")  # (graph)
        self.layout_changed = Signal("layout_changed")  # (GraphLayout)
        self.weights_ready = Signal("weights_ready")  # (node id -> [WeightInfo])

    def open(
        self,
        path: str | Path,
        *,
        safe_mode: bool = True,
        custom_objects_file: str | Path | None = None,
        on_failed: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Load a ``.keras``/``.h5`` file on the worker. An ``UnsafeModelError`` means the file runs code when
        loaded and needs ``safe_mode=False``; a ``CustomObjectError`` means it uses custom layers: pass the Python
        file defining them as ``custom_objects_file`` (it is imported, i.e. run, on the worker)."""
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
            built = self._build(model, token)
            token.preview(built)  # the graph is drawn while the weights load
            token.report("Loading the weights...")

            def weights_read(done: int, total: int) -> None:
                token.check()  # Cancel stops between two tensors of a large folder
                token.report(f"Loading the weights... {_size(done)} of {_size(total)}")

            load_weights(weights_read)
            token.check()
            return {**built, "custom_objects_file": objects_file}

        self._start_load(path, path, f"Loading {Path(path).name}...", load, on_failed)

    def set_model(self, model: Any, path: str | None = None, on_failed: Any = None) -> None:
        """Use an in-memory ``keras.Model`` (tests, notebooks). The engine is still built on the worker."""
        shown = path or getattr(model, "name", "model")
        self._start_load(shown, path, "Building the engine...", lambda t: self._build(model, t), on_failed)

    def _start_load(self, shown: str, path: str | None, label: str, job: Any, on_failed: Any) -> None:
        def failed(exc: BaseException) -> None:
            self._withdraw_preview()
            if on_failed is not None:
                on_failed(exc)

        def load_and_settle(token: Any) -> dict[str, Any]:
            out = job(token)
            settle_after_load()  # the next full collections skip the model's objects (see app.heap)
            return out

        self.loading.emit(shown)
        self._jobs.submit(
            "load",
            label,
            load_and_settle,
            lambda out: self._adopt(out, path),
            exclusive=True,  # a new model makes every pending pass on the old one pointless
            on_preview=self._preview,
            on_failed=failed,
        )

    def _build(self, model: Any, token: Any) -> dict[str, Any]:
        from gradscope.engine.backward.runner import Engine
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

    def _preview(self, out: dict[str, Any]) -> None:
        """The new model's graph, shown (not yet usable) while its weights load; the document still holds the
        current model until the load finishes."""
        self.previewing = True
        self.previewed.emit(out["graph"], out["layout"])

    def _withdraw_preview(self) -> None:
        """A load that showed its graph failed or was cancelled: the views go back to the current model."""
        if self.previewing:
            self.previewing = False
            self.previewed.emit(None, None)

    def _adopt(self, out: dict[str, Any], path: str | None) -> None:
        self.previewing = False
        replaced = self.engine is not None
        self.engine, self.graph, self.layout = out["engine"], out["graph"], out["layout"]
        self.collapsed = set(out.get("collapsed", ()))
        self.path = path
        self.custom_objects_file = out.get("custom_objects_file")
        self.class_names = find_class_names(path) if path else []
        self.weight_info = {}
        engine = self.engine
        self._on_ready()
        # weight statistics (0.2 s on ResNet50, 0.4 s on BERT-base) queued after the first run, not before it;
        # when they arrive, a replaced model is freed (its objects were frozen with it: see app.heap). On this
        # thread, not the worker's: a full collection finalises whatever garbage there is, Qt objects included,
        # and one on the worker hung against Qt painting on this thread (a GUI test, in gc.collect).

        def weights_done(info: dict[str, list[WeightInfo]]) -> None:
            if replaced:
                release_replaced()
            self._on_weights(info)

        self._jobs.submit("weights", "", lambda token: weight_info(engine), weights_done, quiet=True)

    def _on_weights(self, info: dict[str, list[WeightInfo]]) -> None:
        self.weight_info = info
        self.weights_ready.emit(info)

    def cancelled(self) -> None:
        """Everything was cancelled: a load that showed its graph is withdrawn."""
        self._withdraw_preview()

    # ------------------------------------------------------------------------------------------- layout
    def set_collapsed(self, group: str, collapsed: bool) -> None:
        """Collapse or expand a group (nested model or block) in the graph view (laid out off this thread)."""
        changed = (group in self.collapsed) != collapsed
        (self.collapsed.add if collapsed else self.collapsed.discard)(group)
        if changed and self.graph is not None:
            self._relayout()

    def reveal(self, node_id: str) -> bool:
        """Expand every collapsed group holding ``node_id`` (Find on a node inside a block), in one layout.
        False when none hides it."""
        from gradscope.render.graph_layout import groups_holding

        if self.graph is None or node_id not in self.graph:
            return False
        hiding = [g for g in groups_holding(self.graph, node_id) if g in self.collapsed]
        if not hiding:
            return False
        self.collapsed.difference_update(hiding)
        self._relayout()
        return True

    def set_layout_direction(self, direction: str) -> None:
        """Lay the graph out top to bottom ("TB") or left to right ("LR")."""
        if direction not in ("TB", "LR"):
            raise GraphError(f"A layout runs 'TB' (top to bottom) or 'LR' (left to right), not {direction!r}.")
        if direction != self.layout_direction:
            self.layout_direction = direction
            if self.graph is not None:
                self._relayout()

    def collapse_all(self, collapse: bool) -> None:
        """Collapse every group (nested models and name blocks) or expand them all, in one layout."""
        if self.graph is None:
            return
        from gradscope.render.graph_layout import display_groups

        wanted = set(display_groups(self.graph).paths) if collapse else set()
        if wanted != self.collapsed:
            self.collapsed = wanted
            self._relayout()

    def _relayout(self) -> None:
        """A new layout: at once for a graph of up to ``INLINE_LAYOUT_NODES`` nodes (pure Python: ResNet50's 178
        nodes in 3-6 ms with its blocks collapsed, 80 ms all expanded; DenseNet121's 430 all expanded 0.28 s, so
        on the worker), else on the worker. Queued there behind the background compile, the first expand of a
        ResNet50 block took ~7 s ("Laying out the graph…")."""
        from gradscope.render.graph_layout import compute_layout

        graph, collapsed, direction = self.graph, frozenset(self.collapsed), self.layout_direction
        if len(graph) <= INLINE_LAYOUT_NODES:
            self._jobs.cancel_kind("layout")  # an older layout still queued is stale
            self._on_layout(compute_layout(graph, collapsed, direction=direction))
            return

        def job(token: Any) -> Any:
            return compute_layout(graph, collapsed, should_stop=lambda: token.cancelled, direction=direction)

        self._jobs.submit("layout", "Laying out the graph...", job, self._on_layout)

    def _on_layout(self, layout: Any) -> None:
        self.layout = layout
        self.layout_changed.emit(layout)

    def class_label(self, index: int) -> str:
        """``"3 cat"`` when the model's description file names class 3, else ``"3"``."""
        names = self.class_names
        known = isinstance(index, numbers.Integral) and 0 <= index < len(names)
        return f"{index} {names[index]}" if known else str(index)


def _size(nbytes: int) -> str:
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.1f} GB"
    return f"{nbytes / 2**20:.0f} MB" if nbytes >= 100 * 2**20 else f"{nbytes / 2**20:.1f} MB"
