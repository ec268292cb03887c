"""Editing the Session's plan: rules on nodes, method presets with their read-out, undo/redo of both."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscope.app.history import READOUT_FIELDS, Edit
from gradscope.app.view import INPUT_KEY
from gradscope.core.errors import GradscopeError, PlanError
from gradscope.rules.plan import Plan


class PlanEditingMixin:
    """Plan edits for ``Session`` (which provides ``_history``, ``view``, ``graph``, the signals and
    ``_maybe_run``)."""

    @property
    def plan(self) -> Plan:
        return self._history.current.plan

    @property
    def can_undo(self) -> bool:
        return self._history.can_undo

    @property
    def can_redo(self) -> bool:
        return self._history.can_redo

    def _edit(self, plan: Plan) -> Edit:
        return Edit(plan, self.method_name, {k: getattr(self.view, k) for k in READOUT_FIELDS}, self.method_sampling)

    def set_plan(self, plan: Plan, *, record: bool = True, run: bool = True) -> bool:
        """Make ``plan`` current (undoable, with the method and read-out now set). Returns False, and reports
        why, if it does not fit the model. ``run=False``: do not compute it (the caller shows its result)."""
        if self.graph is not None:
            plan = plan.upgraded(self.graph)  # a plan file of the first id scheme (plan schema 1)
        if not self._validate(plan):
            return False
        if record:
            if plan == self.plan:
                self._history.replace(self._edit(plan))  # same plan, maybe a new method's read-out
                return True
            self._history.record(self._edit(plan))
        else:
            self._history.replace(self._edit(plan))
        self._plan_updated(run)
        return True

    def add_rule(self, select: str, rule: str, params: dict[str, Any] | None = None) -> bool:
        """Append ``select -> rule(params)`` to the plan (later entries win). An entry with the same selector
        is replaced, so re-choosing a rule for a node does not pile up entries."""
        entries = [e for e in self.plan.entries if e.select.removeprefix("node:") != select.removeprefix("node:")]
        new = Plan(tuple(entries), self.plan.name).with_entry(select, rule, params)
        return self._manual_edit(new)

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

    def clear_plan(self) -> bool:
        """No rules: the plain gradient, read at the model input."""
        self.method_name = "gradient"
        self.method_sampling = None
        self._take_readout("max_abs", False, False, None)
        ok = self.set_plan(Plan())
        self.view_changed.emit(self.view)
        return ok

    def undo(self) -> bool:
        if not self.can_undo:
            return False
        self._restore_edit(self._history.undo())
        return True

    def redo(self) -> bool:
        if not self.can_redo:
            return False
        self._restore_edit(self._history.redo())
        return True

    def _restore_edit(self, edit: Edit) -> None:
        self.method_name = edit.method
        self.method_sampling = edit.sampling
        changes = dict(edit.readout)
        if changes.get("signed") != self.view.signed:  # colours follow the sign, as apply_method sets them
            changes.update(colormap="bwr", normalization="signed") if changes.get("signed") else changes.update(
                colormap="jet", normalization="minmax"
            )
        if self._set_view_quiet(**changes):
            self.view_changed.emit(self.view)
        self._plan_updated()

    def rule_for(self, node_id: str) -> str | None:
        """The rule the current plan puts on ``node_id`` (None: the true gradient)."""
        entry = self.rule_entry_for(node_id)
        return entry.rule if entry is not None else None

    def rule_entry_for(self, node_id: str) -> Any:
        """The plan entry that decides ``node_id``'s rule, whatever its selector (None: the true gradient)."""
        if self.graph is None or not self.plan.entries:
            return None
        try:
            res = self.plan.resolve(self.graph)
        except GradscopeError:
            return None
        r = res.rules.get(node_id)
        return r.entry if r else None

    def ruled_nodes(self) -> dict[str, str]:
        if self.graph is None or not self.plan.entries:
            return {}
        try:
            return {k: v.entry.rule for k, v in self.plan.resolve(self.graph).rules.items()}
        except GradscopeError:
            return {}

    def apply_method(self, name: str, **options: Any) -> bool:
        """Fill the plan from a method preset and take its read-out defaults (reduction, x input, signed)."""
        from gradscope.rules.methods import build_method

        if self.graph is None:
            self._error("No model", "Open a model first.", None)
            return False
        try:
            method = build_method(name, self.graph, **options)
        except GradscopeError as exc:
            self._error("Method failed", str(exc), exc)
            return False
        self.method_name = name
        self._take_readout(
            method.reduction, method.times_input, method.signed, method.readout_node, grad_cam=method.grad_cam
        )
        self.method_sampling = (method.sampling, dict(method.options)) if method.sampling else None
        replaced = self.plan.entries if self._history.current.method.endswith("custom plan") else ()
        plan = Plan(method.plan.entries, method.plan.name or name)
        ok = self.set_plan(plan)
        self.view_changed.emit(self.view)
        for w in method.warnings:
            self.status_changed.emit(w)
        if ok and plan == self.plan and not method.warnings:
            self.status_changed.emit(f"Method {name}: {len(method.changed)} node(s) with rules.")
        if ok and replaced:
            n = len(replaced)
            self.status_changed.emit(
                f"Method {name} replaced the {n} hand-made plan entr{'y' if n == 1 else 'ies'} (Ctrl+Z brings "
                f"{'it' if n == 1 else 'them'} back)."
            )
        return ok

    def _take_readout(
        self, reduction: str, times_input: bool, signed: bool, node: str | None, *, grad_cam: bool = False
    ) -> None:
        """A method's read-out: its node (else the model input, never a node an earlier preset pinned), its
        reduction and sign; a signed map gets a diverging colormap, and loses it again after."""
        changes: dict[str, Any] = {
            "reduction": reduction,
            "times_input": times_input,
            "signed": signed,
            "readout_node": node or INPUT_KEY,
            "grad_cam": grad_cam,
        }
        if signed:
            changes.update(colormap="bwr", normalization="signed")
        elif self.view.signed:
            changes.update(colormap="jet", normalization="minmax")
        self._set_view_quiet(**changes)

    def _validate(self, plan: Plan) -> bool:
        if self.graph is None:
            return True
        try:
            plan.resolve(self.graph)
        except GradscopeError as exc:
            self._error("The rule cannot be used here", str(exc), exc)
            return False
        return True

    def _plan_updated(self, run: bool = True) -> None:
        self.plan_changed.emit(self.plan)
        if run:
            self._maybe_run()
