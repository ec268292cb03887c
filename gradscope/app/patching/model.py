"""Activation patching from the window: the input shown (clean) against a second, corrupted one.

Owns: the corrupted input (``typed``: token ids or words; or ``path``: a file, an image) and the batch built from
it for the open model (``batch_for``); ``result``, the last ``PatchResult``.
Emits: ``corrupt_changed(described or None)``; ``finished(PatchResult)``, or ``finished(None)`` when a new model
or a new clean input makes the result shown stale.

The run is a job on the worker (progress in the busy label, Run ▸ Cancel stops it between batches). A cell of the
result becomes a plan entry (``cell_entry``): ``patch_value`` reading the corrupted input at that node and
position (or grid cell), so the window shows the patched output, its probability and its map as it shows any
plan's, undo included; the Session passes ``batch_for`` to every run as the other input value rules read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.errors import GradscopeError, InputError
from gradscope.core.events import Signal
from gradscope.core.graph import LayerGraph
from gradscope.io.model_inputs import INPUT_FILE_SUFFIXES, read_model_input, typed_input
from gradscope.rules.plan import Plan, PlanEntry


class Patching:
    def __init__(self, document: Any, inputs: Any, targeting: Any, jobs: Any, feedback: Any) -> None:
        """``jobs``: the Session's ``Jobs``; ``feedback``: its ``Feedback`` (the models this one sits below)."""
        self._document, self._inputs, self._targeting = document, inputs, targeting
        self._jobs, self._feedback = jobs, feedback
        self.typed: str | None = None
        self.path: str | None = None
        self.result: Any = None
        self.corrupt_changed = Signal("corrupt_changed")  # (described or None)
        self.finished = Signal("patching_finished")  # (PatchResult, or None: what was shown no longer holds)
        self._computed_on: tuple | None = None  # the clean input the result was computed on (``_clean_key``)
        document.loaded.connect(lambda _graph: self._stale())
        inputs.changed.connect(self._on_input)

    def _clean_key(self) -> tuple:
        fed = self._inputs
        return fed.described, id(fed.image), id(fed.vocab), fed.preprocessing

    def _on_input(self) -> None:
        """Another clean input makes the result stale; the same one announced again (a tokenizer that finished
        loading) does not."""
        if self._computed_on != self._clean_key():
            self._stale()

    def _stale(self) -> None:
        if self.result is not None:
            self.result = None
            self.finished.emit(None)

    @property
    def described(self) -> str | None:
        return self.path or (f"<typed: {self.typed}>" if self.typed else None)

    def set_typed(self, text: str) -> bool:
        """Token ids ("12 7 99") or words (with the input's vocabulary) as the corrupted input."""
        if not text.strip():
            return self.clear()
        graph = self._document.graph
        if graph is not None:
            try:
                self._check_length(typed_input(graph, text, self._inputs.vocab))
            except InputError as exc:
                self._feedback.error("Corrupted input refused", str(exc), exc)
                return False
        return self._take(typed=text)

    def _check_length(self, fed: Any) -> None:
        shown = self._inputs.fed
        counts = [f.ids.size for f in (fed, shown) if f is not None and f.ids is not None]
        if len(counts) == 2 and counts[0] != counts[1]:
            raise InputError(
                f"The corrupted input has {counts[0]} tokens, the input shown {counts[1]}: a patch puts one's value "
                "in the other's place, position by position (choose words that split alike)."
            )

    def open(self, path: str | Path) -> bool:
        """A file as the corrupted input: an image, or token ids / arrays by its suffix."""
        p = Path(path).expanduser()
        if not p.is_file():
            self._feedback.error("Cannot open the corrupted input", f"{p} is not a file.")
            return False
        return self._take(path=str(p))

    def clear(self) -> bool:
        return self._take()

    def _take(self, *, typed: str | None = None, path: str | None = None) -> bool:
        self._stale()
        self.typed, self.path = typed, path
        self.corrupt_changed.emit(self.described)
        return True

    def batch_for(self, graph: LayerGraph | None) -> Any:
        """The corrupted input as ``graph``'s batch (as ``Inputs.prepare`` builds the clean one), None without one;
        ``InputError`` when it does not fit the model."""
        if graph is None or (self.typed is None and self.path is None):
            return None
        if self.typed is not None:
            arrays = typed_input(graph, self.typed, self._inputs.vocab).arrays
        elif Path(self.path).suffix.lower() in INPUT_FILE_SUFFIXES:
            arrays = read_model_input(graph, self.path, vocab=self._inputs.vocab).arrays
        else:
            from gradscope.io.images import load_image, prepare_input

            shape = graph.node(graph.input_ids[0]).output_shape
            arrays = (prepare_input(load_image(self.path), shape, self._inputs.preprocessing),)
        return arrays[0] if len(arrays) == 1 else list(arrays)

    def corrupt_batch(self) -> Any:
        """``batch_for`` the open model; None without one or when it does not fit (a rule that reads it says so)."""
        try:
            return self.batch_for(self._document.graph)
        except InputError:
            return None

    def run(
        self,
        *,
        method: str = "atp",
        components: tuple[str, ...] = ("resid",),
        nodes: list[str] | None = None,
        metric: str = "logit",
        grid: int = 7,
        compare: bool = False,
    ) -> None:
        """Patching effects of the corrupted input on the input shown, for the target shown (on the worker;
        ``finished`` when done)."""
        from gradscope.engine.patching import patch_effects

        engine = self._document.engine
        if engine is None:
            raise GradscopeError("Open a model first.")
        corrupt = self.batch_for(engine.graph)
        if corrupt is None:
            raise GradscopeError("Give the corrupted input first: type it, or choose a file.")
        clean, target, labels = self._inputs.batch, self._targeting.target, self._inputs.labels
        computed_on = self._clean_key()
        decode = self._inputs.vocab.decode if self._inputs.vocab is not None else None

        def job(token: Any) -> Any:
            def progress(done: int, total: int) -> None:
                token.step(f"Patching: {done} of {total} patches...")

            return patch_effects(
                engine, clean, corrupt, target, metric=metric, components=components, nodes=nodes, method=method,
                grid=grid, compare=compare, labels=labels or None, decode=decode, progress=progress,
                should_stop=lambda: token.cancelled,
            )  # fmt: skip

        def done(result: Any) -> None:
            name = getattr(self._document.engine.model, "name", "model")
            result.sidecar.update(model=name, model_file=self._document.path,
                                  clean=self._inputs.described or "", corrupt=self.described or "")  # fmt: skip
            self.result, self._computed_on = result, computed_on
            self.finished.emit(result)
            self._feedback.say(f"Patching ({method}): {result.metric}, {result.seconds:.2f} s")

        self._jobs.submit("patch", f"Patching ({method})...", job, done)

    def cell_entry(self, component: str, block: int, unit: int) -> PlanEntry | None:
        """The plan entry that patches one cell of the result exactly (None for a query, key or value: they lie
        inside an attention layer, which a plan entry replaces whole)."""
        if self.result is None or component in ("q", "k", "v"):
            return None
        node = self.result.nodes[component][block]
        params: dict[str, Any] = {"source": "input"}
        if self.result.grid is None:
            params["positions"] = [unit]
        else:
            shape = self._document.graph.node(node).output_shape
            rows, cols = self.result.grid
            r, c = divmod(unit, cols)
            ys = np.linspace(0, shape[1], rows + 1).round().astype(int)
            xs = np.linspace(0, shape[2], cols + 1).round().astype(int)
            params["region"] = [int(ys[r]), int(xs[c]), int(ys[r + 1]), int(xs[c + 1])]
        return PlanEntry(node, "patch_value", params)


def with_cell(plan: Plan, entry: PlanEntry) -> Plan:
    """``plan`` with the cell ``entry`` patches in place of any cell patched before (one cell at a time; the rest of
    the plan, value rules of the user's own included, stays)."""
    kept = [e for e in plan.entries if not (e.rule == "patch_value" and e.params.get("source") == "input")]
    return Plan((*kept, entry), plan.name, plan.schema)


def plan_effect(result: Any, baseline: Any, target_index: int | None) -> str:
    """What the current plan's value substitutions do to the output, in words: the target's logit (and, for a
    language model or classifier, its probability) with the plan against without it."""
    if result is None or baseline is None or result.logits is None or baseline.logits is None:
        return ""
    patched, clean = np.asarray(result.logits, np.float64)[0], np.asarray(baseline.logits, np.float64)[0]
    if patched.ndim == 2:  # a language model: the next token after the last position
        patched, clean = patched[-1], clean[-1]
    index = int(clean.argmax()) if target_index is None else int(target_index)

    def probability(z: np.ndarray) -> float:
        e = np.exp(z - z.max())
        return float(e[index] / e.sum())

    change = patched[index] - clean[index]
    return (
        f"with the plan's values: logit of {index} {patched[index]:.4g} (without: {clean[index]:.4g}, "
        f"{change:+.4g}); p = {probability(patched):.3g} (without: {probability(clean):.3g})"
    )
