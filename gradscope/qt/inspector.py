"""The right-hand panel: what the selected node is, which rule it gets, method presets and the plan."""

from __future__ import annotations

import dataclasses
import html
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from gradscope.app.session import Session
from gradscope.core.graph import NodeSpec
from gradscope.qt.reflow import ReflowGrid
from gradscope.rules.base import Rule, available_rules, rule_source
from gradscope.rules.methods import available_methods

_ACTIVATIONS = ("sigmoid", "relu", "tanh", "softplus", "elu", "selu", "gelu", "swish", "linear", "leaky_relu")
#: The rule a node starts with in the editor when the plan gives it none: the true gradient.
DEFAULT_RULES = ("identity", "true_gradient")
#: Order of the node-specific rules (those whose ``applies_to`` is narrower than "any node"): the methods of
#: RULES_SPEC.md first, in the order a user usually tries them; anything else (user rules) follows by name.
_PREFERRED = (
    "guided_backprop",
    "deconvnet",
    "backward_as",
    "substitute_activation",
    "straight_through",
    "mwp",
    "cmwp",
    "lrp_epsilon",
    "lrp_alpha_beta",
    "lrp_zplus",
)


def _is_specific(cls: type[Rule]) -> bool:
    """Whether the rule is meant for some node types only (it narrows ``Rule.applies_to``)."""
    func = getattr(cls.applies_to, "__func__", cls.applies_to)
    return func is not Rule.applies_to.__func__


def _applies(cls: type[Rule], node: NodeSpec) -> bool:
    try:
        return bool(cls.applies_to(node))
    except Exception:  # a user rule's broken applies_to must not break the editor
        return False


def rule_groups(rules: dict[str, type[Rule]], node: NodeSpec | None) -> list[tuple[str | None, list[str]]]:
    """The rule list of the editor for ``node``, in groups ``(header, names)``: the rules made for this kind
    of node first, then the rules for any node (the true gradient first), then those that do not apply here.
    Without a node: one group, the true gradient first."""

    def general_key(name: str) -> tuple[int, str]:
        return (DEFAULT_RULES.index(name) if name in DEFAULT_RULES else len(DEFAULT_RULES), name)

    if node is None:
        return [(None, sorted(rules, key=general_key))]
    specific, general, other = [], [], []
    for name, cls in rules.items():
        if not _applies(cls, node):
            other.append(name)
        elif _is_specific(cls):
            specific.append(name)
        else:
            general.append(name)
    specific.sort(key=lambda n: (_PREFERRED.index(n) if n in _PREFERRED else len(_PREFERRED), n))
    kind = node.op_type + (f" ({node.activation})" if node.activation else "")
    return [
        (f"— for {kind} —", specific),
        ("— any node —", sorted(general, key=general_key)),
        (f"— not for {node.op_type} —", sorted(other)),
    ]


def _fmt(x: float) -> str:
    return "–" if x != x else f"{x:.3g}"


class NodeInfo(QTextBrowser):
    """Type, shapes, configuration, weight and gradient statistics of one node (rich text)."""

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.setOpenLinks(False)
        self.setMinimumHeight(150)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)

    def show_node(self, node_id: str | None) -> None:
        s = self.session
        if s.graph is None:
            self.setHtml("<p style='color:#607d8b'>No model open.</p>")
            return
        if node_id is None:
            g = s.graph
            self.setHtml(
                f"<h3 style='margin:0'>{html.escape(g.model_name)}</h3>"
                f"<p>{len(g)} nodes, {g.param_count():,} parameters in {g.compute_dtype}, "
                f"{len(g.groups)} nested model(s) or layer(s) opened.</p>"
                "<p style='color:#607d8b'>Click a node in the graph (or a bar in the flow plot) to inspect it "
                "and give it a backward rule.</p>"
            )
            return
        n = s.graph.node(node_id)

        def shape(t: tuple) -> str:
            return "(" + ", ".join("None" if d is None else str(d) for d in t) + ")"

        rows = [
            *([("layer name", html.escape(n.layer_name))] if n.layer_name and n.layer_name != n.id else []),
            ("type", html.escape(n.op_type) + (f" ({html.escape(n.activation)})" if n.activation else "")),
            ("inputs", ", ".join(shape(t) for t in n.input_shapes) or "–"),
            ("output", ", ".join(shape(t) for t in n.output_shapes)),
            ("parameters", f"{n.params:,}"),
        ]
        if n.fused_with is not None:
            rows.append(
                (
                    "is",
                    f"the output of layer {html.escape(n.layer_name or n.id)}; its linear part before "
                    f"the {html.escape(n.activation or '')} is node {html.escape(n.fused_with)}",
                )
            )
        elif n.fused_activation is not None:
            after = next((m.id for m in s.graph.nodes if m.fused_with == n.id), "")
            rows.append(
                (
                    "is",
                    f"the linear part of layer {html.escape(n.layer_name or n.id)}, before its fused "
                    f"{html.escape(n.fused_activation)}; the layer's output is node {html.escape(after)}",
                )
            )
        if n.group:
            rows.append(("nested in", html.escape(n.group)))
        if n.inputs:
            rows.append(("fed by", ", ".join(html.escape(i) for i in n.inputs)))
        cfg = {k: v for k, v in n.config.items() if v not in (None, "", [], {}) and not k.endswith("_regularizer")}
        cfg = {k: v for k, v in cfg.items() if not k.endswith("_constraint") and not k.endswith("_initializer")}
        if cfg:
            text = ", ".join(f"{k}={v}" for k, v in list(cfg.items())[:12])
            rows.append(("config", f"<span style='color:#455a64'>{html.escape(text)}</span>"))
        out = [f"<h3 style='margin:0'>{html.escape(n.id)}</h3>"]  # the id every file and command uses
        out.extend(_diagnosis_lines(s.reports.diagnosis, n.id))  # first: when a path is cut here, that is the news
        out.append("<table cellspacing='2'>")
        out += [f"<tr><td style='color:#607d8b'>{k}</td><td>{v}</td></tr>" for k, v in rows]
        out.append("</table>")
        weights = s.document.weight_info.get(n.id, [])
        if weights:
            out.append("<p style='margin:4px 0 0 0'><b>Weights</b></p><table cellspacing='2'>")
            out.append(
                "<tr style='color:#607d8b'><td>name</td><td>shape</td><td>mean</td><td>std</td><td>min</td>"
                "<td>max</td></tr>"
            )
            for w in weights:
                dims = "x".join(str(d) for d in w.shape)
                out.append(
                    f"<tr><td>{html.escape(w.name)}</td><td>{dims}</td><td>{_fmt(w.mean)}</td>"
                    f"<td>{_fmt(w.std)}</td><td>{_fmt(w.min)}</td><td>{_fmt(w.max)}</td></tr>"
                )
            out.append("</table>")
        cur, base = s.results.stats("current").get(n.id), s.results.stats("baseline").get(n.id)
        if n.is_input and s.result is not None:
            cur = s.result.meta.get("input_stats")
            base = s.baseline.meta.get("input_stats") if s.baseline else None
        if cur is not None or base is not None:
            out.append("<p style='margin:4px 0 0 0'><b>Gradient at the output</b></p><table cellspacing='2'>")
            out.append("<tr style='color:#607d8b'><td></td><td>plan</td><td>baseline</td></tr>")
            for label, attr in (
                ("mean |g|", "mean_abs"),
                ("max |g|", "max_abs"),
                ("norm", "norm"),
                ("zeros", "zero_fraction"),
            ):
                c = getattr(cur, attr) if cur else float("nan")
                b = getattr(base, attr) if base else float("nan")
                out.append(f"<tr><td style='color:#607d8b'>{label}</td><td>{_fmt(c)}</td><td>{_fmt(b)}</td></tr>")
            out.append("</table>")
            if cur is not None and cur.status != "ok":
                msg = {
                    "none": "No gradient reaches this node: the path to the target is cut.",
                    "zero": "The gradient here is exactly zero.",
                    "nan": f"NaN/Inf in the gradient ({cur.nan_count} NaN, {cur.inf_count} Inf).",
                }[cur.status]
                out.append(f"<p style='color:#c2185b'><b>{msg}</b></p>")
        rule = s.editor.rule_for(n.id)
        out.append(f"<p style='margin:4px 0 0 0'>Backward rule: <b>{html.escape(rule or 'true gradient')}</b></p>")
        self.setHtml("".join(out))


def _diagnosis_lines(report: Any, node_id: str) -> list[str]:
    """What the path diagnostics say about this node: a cut it makes, or its variables that get no gradient."""
    if report is None:
        return []
    out = []
    for cut, blocked in report.cuts():
        if cut.node == node_id:
            out.append(
                f"<p style='color:#b71c1c;margin:2px 0'><b>✂ Cuts the gradient</b> of {len(blocked)} "
                f"variable(s) at op <code>{html.escape(cut.op_name)}</code> ({html.escape(cut.op_type)}). "
                "See the Diagnostics panel for why and the fix.</p>"
            )
    mine = [v for v in report.problems if v.node == node_id]
    if mine:
        names = ", ".join(f"{html.escape(v.path)} ({v.status.replace('_', ' ')})" for v in mine)
        out.append(f"<p style='color:#b71c1c;margin:2px 0'>No gradient reaches: {names}</p>")
    return out


#: Lines of a rule's description shown (the rest in its tooltip) and parameter rows shown (more scroll): fixed, so
#: the rule editor's and the plan's buttons never move with the rule chosen.
DESCRIPTION_LINES = 3
PARAM_ROWS_SHOWN = 2


class ParamsForm(QWidget):
    """A form generated from a rule's ``Params`` dataclass fields."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.form = QFormLayout(self)
        self.form.setContentsMargins(0, 0, 0, 0)
        self.editors: dict[str, tuple[str, QWidget]] = {}
        self.params_cls: type | None = None

    def set_params_class(self, params_cls: type, values: dict[str, Any] | None = None) -> None:
        if params_cls is self.params_cls and self.editors:
            # Same rule again (the plan changed, the node did not): refill in place, the widgets stay.
            for f in dataclasses.fields(params_cls):
                kind, editor = self.editors[f.name]
                default = (values or {}).get(f.name, f.default if f.default is not dataclasses.MISSING else None)
                _set_editor(kind, editor, default)
            return
        self.params_cls = params_cls
        while self.form.rowCount():
            self.form.removeRow(0)
        self.editors = {}
        values = values or {}
        for f in dataclasses.fields(params_cls):
            kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            default = values.get(f.name, f.default if f.default is not dataclasses.MISSING else None)
            editor: QWidget
            if kind == "bool":
                editor = QCheckBox()
                editor.setChecked(bool(default))
            elif kind == "int":
                editor = QSpinBox()
                editor.setRange(-(10**9), 10**9)
                editor.setValue(int(default or 0))
            elif kind == "str" and "activation" in f.name:
                editor = QComboBox()
                editor.setEditable(True)
                editor.addItems(list(_ACTIVATIONS))
                editor.setCurrentText(str(default or ""))
            else:  # floats as text: stabilisers like 1e-9 do not fit a spin box
                editor = QLineEdit("" if default is None else repr(default) if kind == "float" else str(default))
            editor.setObjectName(f"param_{f.name}")
            editor.setToolTip(f"{f.name} ({kind}); default {f.default!r}")
            self.form.addRow(f.name, editor)
            self.editors[f.name] = (kind, editor)
        if not self.editors:
            self.form.addRow(QLabel("<i style='color:#78909c'>no parameters</i>"))

    def values(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, (kind, editor) in self.editors.items():
            if isinstance(editor, QCheckBox):
                out[name] = editor.isChecked()
            elif isinstance(editor, QSpinBox):
                out[name] = editor.value()
            elif isinstance(editor, QComboBox):
                out[name] = editor.currentText()
            elif kind == "float":
                try:
                    out[name] = float(editor.text())
                except ValueError:
                    out[name] = editor.text()  # make_params refuses it with a message naming the parameter
            else:
                out[name] = editor.text()
        return out


def _set_editor(kind: str, editor: QWidget, value: Any) -> None:
    if isinstance(editor, QCheckBox):
        editor.setChecked(bool(value))
    elif isinstance(editor, QSpinBox):
        editor.setValue(int(value or 0))
    elif isinstance(editor, QComboBox):
        editor.setCurrentText(str(value or ""))
    elif isinstance(editor, QLineEdit):
        editor.setText("" if value is None else repr(value) if kind == "float" else str(value))


def type_selector(node: NodeSpec) -> tuple[str, str]:
    """(selector, label) of "every node like this one": its type, or for an activation its function, split off a
    layer's ``activation=`` or standalone (a ``Conv2D(activation="relu")``'s output is an Activation node: "all
    Activation" caught every sigmoid and tanh too)."""
    if node.op_type == "Activation" and node.activation:
        return f"activation:{node.activation}", f"{node.activation} activations"
    return f"type:{node.op_type}", node.op_type


class RuleEditor(QGroupBox):
    """Choose a rule and its parameters for the selected node, or for every node of its type."""

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__("Backward rule", parent)
        self.session = session
        self.node_id: str | None = None
        lay = QVBoxLayout(self)
        self.rule_combo = QComboBox()
        self.rule_combo.setObjectName("rule_combo")
        self.rule_combo.setToolTip("The rule that replaces this node's backward pass")
        self.rule_combo.currentIndexChanged.connect(self._on_rule_chosen)
        self.description = QLabel()
        self.description.setWordWrap(True)
        self.description.setStyleSheet("color:#546e7a")
        self.description.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        # A fixed height (the whole text in the tooltip) and a fixed box for the parameters: the buttons below
        # stay where they are whatever the rule (a first click landed on empty space when they moved).
        self.description.setFixedHeight(self.description.fontMetrics().lineSpacing() * DESCRIPTION_LINES + 4)
        self.params = ParamsForm()
        self.params_area = QScrollArea()
        self.params_area.setWidget(self.params)
        self.params_area.setWidgetResizable(True)
        self.params_area.setFrameShape(QFrame.Shape.NoFrame)
        self.params_area.setFixedHeight((QLineEdit().sizeHint().height() + 6) * PARAM_ROWS_SHOWN)
        self.apply_node = QPushButton("Apply to node")
        self.apply_node.setObjectName("apply_node")
        self.apply_node.setToolTip("Give only the selected node this rule")
        self.apply_type = QPushButton("Apply to all of type")
        self.apply_type.setToolTip("Give every node of the selected node's type this rule (a type: selector)")
        self.reset_node = QPushButton("True gradient")
        self.reset_node.setToolTip("Remove the selected node's own rule entry")
        self.load_file = QPushButton("Load rule file…")
        self.load_file.setToolTip("Import a Python file of @register_rule classes (it runs as code)")
        self.apply_node.clicked.connect(lambda: self._apply(False))
        self.apply_type.clicked.connect(lambda: self._apply(True))
        self.reset_node.clicked.connect(self._reset)
        self.load_file.clicked.connect(self._load_file)
        lay.addWidget(self.rule_combo)
        buttons = (self.apply_node, self.apply_type, self.reset_node, self.load_file)
        lay.addWidget(ReflowGrid(buttons, max_columns=2, min_columns=1))
        lay.addWidget(self.description)
        lay.addWidget(self.params_area)
        if session.catalog.ready:
            self.refresh_rules()
        self.set_node(None)

    def refresh_rules(self) -> None:
        if not self.session.catalog.ready:
            return
        current = self.rule_combo.currentText()
        self._fill_combo(self._node())
        if not self._select_index(current):
            self._select_default()
        self._on_rule_chosen()

    def _node(self) -> NodeSpec | None:
        g = self.session.graph
        return g.node(self.node_id) if self.node_id is not None and g is not None and self.node_id in g else None

    def _fill_combo(self, node: NodeSpec | None) -> None:
        """List the rules for ``node``: the ones made for it first, under disabled group headers."""
        rules = available_rules()
        combo = self.rule_combo
        combo.blockSignals(True)
        combo.clear()
        model = combo.model()
        for header, names in rule_groups(rules, node):
            if not names:
                continue
            if header is not None:
                combo.addItem(header)
                item = model.item(combo.count() - 1)
                item.setFlags(Qt.ItemFlag.NoItemFlags)  # a label, not a choice
                item.setForeground(QBrush(QColor("#78909c")))
            for name in names:
                combo.addItem(name)
                src = rule_source(name)
                tip = rules[name].describe() + ("" if src == "builtin" else f"\n(from {src})")
                combo.setItemData(combo.count() - 1, tip, Qt.ItemDataRole.ToolTipRole)
        combo.blockSignals(False)

    def rule_names(self) -> list[str]:
        """The rules in the combo, in their listed order (group headers left out)."""
        model = self.rule_combo.model()
        return [
            self.rule_combo.itemText(i)
            for i in range(self.rule_combo.count())
            if model.item(i).flags() & Qt.ItemFlag.ItemIsEnabled
        ]

    def _select_index(self, name: str) -> bool:
        idx = self.rule_combo.findText(name) if name else -1
        if idx < 0 or not self.rule_combo.model().item(idx).flags() & Qt.ItemFlag.ItemIsEnabled:
            return False
        self.rule_combo.blockSignals(True)
        self.rule_combo.setCurrentIndex(idx)
        self.rule_combo.blockSignals(False)
        return True

    def _select_default(self) -> None:
        for name in (*DEFAULT_RULES, *self.rule_names()[:1]):
            if self._select_index(name):
                return

    def set_node(self, node_id: str | None) -> None:
        """Show ``node_id``'s rule: the one the plan gives it (by any selector, with its parameters), else the
        true gradient; the rules made for this kind of node are listed first."""
        self.node_id = node_id
        s = self.session
        enabled = node_id is not None and s.graph is not None and not s.graph.node(node_id).is_input
        for w in (self.apply_node, self.apply_type, self.reset_node, self.rule_combo, self.params):
            w.setEnabled(enabled)
        if not s.catalog.ready:
            self._on_rule_chosen()
            return
        node = s.graph.node(node_id) if enabled else None
        self._fill_combo(node)
        if node is not None:
            self.apply_type.setText(f"Apply to all {type_selector(node)[1]}")
            entry = s.editor.rule_entry_for(node.id)
            if entry is not None and self._select_index(entry.rule):
                self._on_rule_chosen(dict(entry.params))
                return
        self._select_default()
        self._on_rule_chosen()

    def select_rule(self, name: str, params: dict[str, Any] | None = None) -> None:
        if self._select_index(name):
            self._on_rule_chosen(params)

    def _on_rule_chosen(self, params: Any = None) -> None:
        if not self.session.catalog.ready:
            self.description.setText("Loading rules…")
            return
        name = self.rule_combo.currentText()
        rules = available_rules()
        if name not in rules:
            return
        cls = rules[name]
        note = cls.describe()
        if self.node_id and self.session.graph is not None:
            node = self.session.graph.node(self.node_id)
            if not cls.applies_to(node):
                note += f"\n⚠ Not applicable to {node.op_type} nodes."
        self.description.setText(note)
        self.description.setToolTip(note)
        self.params.set_params_class(cls.Params, params if isinstance(params, dict) else None)

    def _apply(self, by_type: bool) -> None:
        if self.node_id is None or self.session.graph is None:
            return
        rule = self.rule_combo.currentText()
        node = self.session.graph.node(self.node_id)
        select = type_selector(node)[0] if by_type else self.node_id
        self.session.editor.add_rule(select, rule, self.params.values())

    def _reset(self) -> None:
        if self.node_id is None:
            return
        plan = self.session.plan
        keep = [i for i, e in enumerate(plan.entries) if e.select in (self.node_id, f"node:{self.node_id}")]
        if keep:
            new = plan
            for i in reversed(keep):
                new = new.without(i)
            self.session.editor.set_plan(new)
        elif self.session.editor.rule_for(self.node_id):
            self.session.editor.add_rule(self.node_id, "identity")

    def _load_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Load rule file", "", "Python files (*.py)")
        if path:
            self.session.catalog.load_file(path)


class MethodPanel(QGroupBox):
    """Method presets: build a whole plan by layer type (guided backprop, MWP, LRP...)."""

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__("Method preset", parent)
        self.session = session
        lay = QHBoxLayout(self)
        self.combo = QComboBox()
        self.combo.setObjectName("method_combo")
        self.apply = QPushButton("Apply")
        self.apply.setToolTip("Replace the plan with this method's plan (undo with Ctrl+Z)")
        self.apply.clicked.connect(lambda: self.session.editor.apply_method(self.combo.currentText()))
        self.combo.currentIndexChanged.connect(lambda i: self.apply.setEnabled(i >= 0))
        lay.addWidget(self.combo, 1)
        lay.addWidget(self.apply)
        self.refresh()

    def refresh(self) -> None:
        if not self.session.catalog.ready:  # listing methods imports the rules (TensorFlow): worker first
            return
        current = self.combo.currentText()
        self.combo.clear()
        for name, summary in available_methods().items():
            self.combo.addItem(name)
            self.combo.setItemData(self.combo.count() - 1, summary, Qt.ItemDataRole.ToolTipRole)
        idx = self.combo.findText(self.session.editor.method_name)
        if idx < 0 and self.session.plan.entries:  # a hand-made plan (or one undone back to): no preset named
            self.combo.setPlaceholderText(self.session.editor.method_name or "custom plan")
        elif idx < 0:
            idx = max(self.combo.findText(current), 0)
        self.combo.setCurrentIndex(idx)


class PlanTable(QGroupBox):
    """The plan as a table: selector, rule, parameters. Later rows win."""

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__("Plan (later entries win)", parent)
        self.session = session
        lay = QVBoxLayout(self)
        self.table = QTableWidget(0, 3)
        self.table.setObjectName("plan_table")
        self.table.setHorizontalHeaderLabels(["selector", "rule", "params"])
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setMinimumHeight(110)
        self.table.setToolTip("Select a row and press Delete (or Remove) to drop it")
        self.remove = QPushButton("Remove")
        self.clear = QPushButton("Clear")
        self.undo = QPushButton("Undo")
        self.redo = QPushButton("Redo")
        self.undo.setToolTip("Undo the last plan change (Ctrl+Z)")
        self.redo.setToolTip("Redo (Ctrl+Shift+Z)")
        self.remove.clicked.connect(self._remove_selected)
        self.clear.clicked.connect(self.session.editor.clear)
        self.undo.clicked.connect(self.session.editor.undo)
        self.redo.clicked.connect(self.session.editor.redo)
        # above the table, so they are in sight however long the dock (they sat below its fold)
        buttons = (self.remove, self.clear, self.undo, self.redo)
        lay.addWidget(ReflowGrid(buttons, max_columns=4, min_columns=2, even=True))
        lay.addWidget(self.table)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setStyleSheet("color:#546e7a")
        lay.addWidget(self.summary)
        self.show_plan()

    def show_plan(self) -> None:
        plan = self.session.plan
        self.table.setRowCount(len(plan.entries))
        for i, e in enumerate(plan.entries):
            params = ", ".join(f"{k}={v}" for k, v in e.params.items())
            for j, text in enumerate((e.select, e.rule, params)):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                self.table.setItem(i, j, item)
        self.undo.setEnabled(self.session.editor.can_undo)
        self.redo.setEnabled(self.session.editor.can_redo)
        self.remove.setEnabled(bool(plan.entries))
        self.clear.setEnabled(bool(plan.entries))
        n = len(self.session.editor.ruled_nodes())
        self.summary.setText(
            "Empty plan: every node uses its true gradient." if not plan.entries else f"{n} node(s) get a rule."
        )

    def _remove_selected(self) -> None:
        rows = sorted({i.row() for i in self.table.selectedIndexes()}, reverse=True)
        if not rows and self.table.rowCount():
            rows = [self.table.rowCount() - 1]
        plan = self.session.plan
        for r in rows:
            plan = plan.without(r)
        self.session.editor.set_plan(plan)

    def keyPressEvent(self, event) -> None:  # noqa: N802
        if event.key() in (Qt.Key.Key_Delete, Qt.Key.Key_Backspace):
            self._remove_selected()
            return
        super().keyPressEvent(event)


class InspectorWidget(QWidget):
    """Node info + rule editor + method preset + plan, kept in step with the Session."""

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        self.info = NodeInfo(session)
        self.rule_editor = RuleEditor(session)
        self.methods = MethodPanel(session)
        self.plan_table = PlanTable(session)
        lay.addWidget(self.info, 3)
        lay.addWidget(self.rule_editor)
        lay.addWidget(self.methods)
        lay.addWidget(self.plan_table, 2)
        session.selection.changed.connect(self._on_selection_changed)
        session.editor.changed.connect(self._on_plan_changed)
        session.results.changed.connect(lambda *_: self.info.show_node(session.selected))
        session.document.loaded.connect(self._on_model_loaded)
        session.catalog.changed.connect(self._on_rules_changed)
        session.reports.diagnosis_changed.connect(lambda *_: self.info.show_node(session.selected))
        session.document.weights_ready.connect(lambda *_: self.info.show_node(session.selected))
        self.info.show_node(None)

    def _on_rules_changed(self, names: Any) -> None:
        self.rule_editor.refresh_rules()
        self.methods.refresh()
        self._on_selection_changed(self.session.selected)
        if names:
            self.rule_editor.select_rule(names[0])

    def _on_model_loaded(self, graph: Any) -> None:
        self.methods.refresh()
        self.plan_table.show_plan()
        self._on_selection_changed(self.session.selected)

    def _on_selection_changed(self, node_id: str | None) -> None:
        self.info.show_node(node_id)
        self.rule_editor.set_node(node_id)

    def _on_plan_changed(self, plan: Any) -> None:
        self.plan_table.show_plan()
        self.rule_editor.set_node(self.session.selected)  # the editor shows the rule the plan now gives it
        self.info.show_node(self.session.selected)
        self.methods.refresh()
