"""The plan being edited, as a small evented model: rules on nodes, method presets with their read-out, and
undo/redo of both (``app.models.history``).

Owns: the ``PlanHistory`` (``plan`` is its current step), ``method_name`` (the preset the plan came from, or
"custom plan") and ``method_sampling`` (SmoothGrad / IG: how the input gradient is averaged). A preset also sets
the view's read-out (``Viewing``), and an undo step gives it back.
Emits: ``changed(plan)`` after every edit, undo and redo (the composition runs the new plan); a plan that does
not fit the model is refused through ``Feedback.error``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gradscope.app.models.document import ModelDocument
from gradscope.app.models.feedback import Feedback
from gradscope.app.models.history import READOUT_FIELDS, Edit, PlanHistory
from gradscope.app.models.viewing import Viewing
from gradscope.core.errors import GradscopeError, PlanError
from gradscope.core.events import Signal
from gradscope.rules.plan import Plan


class PlanEditor:
    def __init__(self, document: ModelDocument, viewing: Viewing, feedback: Feedback) -> None:
        self._document = document
        self._viewing = viewing
        self._feedback = feedback
        self.method_name = "gradient"
        #: (kind, options) when the method averages the input gradient over copies (SmoothGrad, IG), else None
        self.method_sampling: tuple[str, dict[str, Any]] | None = None
        self.changed = Signal("plan_changed")  # (plan)
        self._history = PlanHistory(self._edit(Plan()))

    @property
    def plan(self) -> Plan:
        return self._history.current.plan

    @property
    def can_undo(self) -> bool:
        return self._history.can_undo

    @property
    def can_redo(self) -> bool:
        return self._history.can_redo

    def reset(self, method: str = "gradient", sampling: tuple[str, dict[str, Any]] | None = None) -> None:
        """A new model: no rules and no history (quiet: the composition announces the new model)."""
        self.method_name, self.method_sampling = method, sampling
        self._history = PlanHistory(self._edit(Plan()))

    def _edit(self, plan: Plan) -> Edit:
        view = self._viewing.settings
        return Edit(plan, self.method_name, {k: getattr(view, k) for k in READOUT_FIELDS}, self.method_sampling)

    def set_plan(self, plan: Plan, *, record: bool = True) -> bool:
        """Make ``plan`` current (undoable, with the method and read-out now set). Returns False, and reports
        why, if it does not fit the model."""
        graph = self._document.graph
        if graph is not None:
            plan = plan.upgraded(graph)  # a plan file of the first id scheme (plan schema 1)
        if not self.fits(plan):
            return False
        if record and plan == self.plan:
            self._history.replace(self._edit(plan))  # same plan, maybe a new method's read-out
            return True
        (self._history.record if record else self._history.replace)(self._edit(plan))
        self.changed.emit(self.plan)
        return True

    def add_rule(self, select: str, rule: str, params: dict[str, Any] | None = None) -> bool:
        """Append ``select -> rule(params)`` to the plan (later entries win). An entry with the same selector
        is replaced, so re-choosing a rule for a node does not pile up entries."""
        entries = [e for e in self.plan.entries if e.select.removeprefix("node:") != select.removeprefix("node:")]
        return self._manual_edit(Plan(tuple(entries), self.plan.name).with_entry(select, rule, params))

    def remove_entry(self, index: int) -> bool:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise PlanError(f"A plan entry is removed by its position (an integer), not {index!r}.")
        if not 0 <= index < len(self.plan.entries):
            return False
        return self._manual_edit(self.plan.without(index))

    def _manual_edit(self, plan: Plan) -> bool:
        """A hand edit: the plan is no longer the preset's, so the caption stops naming the preset."""
        method, sampling = self.method_name, self.method_sampling
        self.method_name = "custom plan" if plan.entries else "gradient"
        if sampling is not None and plan.entries:  # SmoothGrad / IG of a custom plan: say so
            self.method_name = f"{sampling[0]} of a custom plan"
        if not self.set_plan(plan):
            self.method_name = method
            return False
        return True

    def clear(self) -> bool:
        """No rules: the plain gradient, read at the model input."""
        self.method_name, self.method_sampling = "gradient", None
        self._viewing.take_readout("max_abs", False, False, None)
        ok = self.set_plan(Plan())
        self._viewing.changed.emit(self._viewing.settings)
        return ok

    def undo(self) -> bool:
        if not self.can_undo:
            return False
        self._restore(self._history.undo())
        return True

    def redo(self) -> bool:
        if not self.can_redo:
            return False
        self._restore(self._history.redo())
        return True

    def _restore(self, edit: Edit) -> None:
        self.method_name, self.method_sampling = edit.method, edit.sampling
        self._viewing.restore_readout(edit.readout)
        self.changed.emit(self.plan)

    def apply_method(self, name: str, **options: Any) -> bool:
        """Fill the plan from a method preset and take its read-out defaults (reduction, x input, signed)."""
        from gradscope.rules.methods import build_method

        graph = self._document.graph
        if graph is None:
            self._feedback.error("No model", "Open a model first.")
            return False
        try:
            method = build_method(name, graph, **options)
        except GradscopeError as exc:
            self._feedback.error("Method failed", str(exc), exc)
            return False
        self.method_name = name
        self._viewing.take_readout(
            method.reduction, method.times_input, method.signed, method.readout_node, grad_cam=method.grad_cam
        )
        self.method_sampling = (method.sampling, dict(method.options)) if method.sampling else None
        replaced = self.plan.entries if self._history.current.method.endswith("custom plan") else ()
        plan = Plan(method.plan.entries, method.plan.name or name)
        ok = self.set_plan(plan)
        self._viewing.changed.emit(self._viewing.settings)
        for w in method.warnings:
            self._feedback.say(w)
        if ok and plan == self.plan and not method.warnings:
            self._feedback.say(f"Method {name}: {len(method.changed)} node(s) with rules.")
        if ok and replaced:
            n = len(replaced)
            self._feedback.say(
                f"Method {name} replaced the {n} hand-made plan entr{'y' if n == 1 else 'ies'} (Ctrl+Z brings "
                f"{'it' if n == 1 else 'them'} back)."
            )
        return ok

    def import_plan(self, path: str | Path) -> bool:
        """Make the plan file at ``path`` current (an undoable edit); False, and why, when it cannot be."""
        try:
            plan = Plan.load(path)
        except GradscopeError as exc:
            self._feedback.error("Cannot read the plan", str(exc), exc)
            return False
        return self.set_plan(plan)

    def fits(self, plan: Plan) -> bool:
        """True when ``plan`` resolves on the open model (else the reason is told)."""
        if self._document.graph is None:
            return True
        try:
            plan.resolve(self._document.graph)
        except GradscopeError as exc:
            self._feedback.error("The rule cannot be used here", str(exc), exc)
            return False
        return True

    # ------------------------------------------------------------------------------------------- read
    def rule_for(self, node_id: str) -> str | None:
        """The rule the current plan puts on ``node_id`` (None: the true gradient)."""
        entry = self.rule_entry_for(node_id)
        return entry.rule if entry is not None else None

    def rule_entry_for(self, node_id: str) -> Any:
        """The plan entry that decides ``node_id``'s rule, whatever its selector (None: the true gradient)."""
        r = self._resolved().get(node_id)
        return r.entry if r else None

    def ruled_nodes(self) -> dict[str, str]:
        return {k: v.entry.rule for k, v in self._resolved().items()}

    def _resolved(self) -> dict[str, Any]:
        graph = self._document.graph
        if graph is None or not self.plan.entries:
            return {}
        try:
            return self.plan.resolve(graph).rules
        except GradscopeError:
            return {}
