"""The diagnostics panel: which trainable variables get a gradient of the target, and where a path is cut.

"Run diagnostics" asks the Session for ``diagnose_model`` on the worker thread; the report comes back as plain
dataclasses (``gradscope.engine.diagnostics.paths.DiagnosisReport``), so nothing here imports TensorFlow. One row per
trainable variable; clicking a row selects its node in the graph (the "cut at" cell selects the node of the
op that cuts the path), and the text beside the table says why and how to fix it.
"""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from gradscope.app.session import Session

STATUS_LABELS = {"connected": "connected", "blocked": "blocked", "unused": "unused", "never_read": "never read"}
STATUS_COLORS = {"connected": "#2e7d32", "blocked": "#c62828", "unused": "#ef6c00", "never_read": "#616161"}
COLUMNS = ("variable", "shape", "status", "node (layer)", "cut at")
CUT_COLUMN = COLUMNS.index("cut at")


def graph_marks(report: Any) -> tuple[dict[str, str], list[tuple[str, ...]], dict[str, str]]:
    """What the graph view draws for a report: node roles, the node paths to the cuts, and a note (the op
    type) for each cutting node. Empty for None or a report without problems."""
    if report is None:
        return {}, [], {}
    roles = report.highlight()
    paths = [tuple(v.path_nodes) for v in report.problems if len(v.path_nodes) > 1]
    notes = {cut.node: cut.op_type for cut, _ in report.cuts() if cut.node}
    return roles, paths, notes


def _where(node: str | None, layer: str | None) -> str:
    if node is None:
        return "–"
    return node if not layer or layer == node else f"{node} ({layer})"


def _cut_node(v: Any) -> str | None:
    return v.cut.node if v.cut is not None else None


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


class DiagnosticsPanel(QWidget):
    """The table of trainable variables and the explanation of the selected one (or of the whole report)."""

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.report: Any = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 4, 6, 4)
        top = QHBoxLayout()
        self.run_button = QPushButton("Run diagnostics")
        self.run_button.setObjectName("run_diagnostics")
        self.run_button.setToolTip(
            "Trace the forward pass and find, for every trainable variable, whether the target's gradient "
            "reaches it, and if not, the op that cuts the path (Ctrl+D)"
        )
        self.run_button.clicked.connect(self.run)
        self.summary = QLabel("Open a model, then run the diagnostics to find where gradients stop.")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        top.addWidget(self.run_button)
        top.addWidget(self.summary, 1)
        lay.addLayout(top)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("diagnostics_table")
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(CUT_COLUMN, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 8)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setToolTip("Click a row to select its node; click the 'cut at' cell to select the cutting node")
        self.table.currentCellChanged.connect(lambda row, col, *_: self._on_cell(row, col))
        self.table.cellClicked.connect(self._on_cell)
        self.details = QTextBrowser()
        self.details.setObjectName("diagnostics_details")
        self.details.setOpenLinks(False)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.table)
        split.addWidget(self.details)
        split.setSizes([640, 560])
        lay.addWidget(split, 1)

        session.reports.diagnosis_changed.connect(self.show_report)
        session.selection.changed.connect(self._on_selection_changed)
        session.jobs.busy_changed.connect(lambda *_: self._update_button())
        session.document.loaded.connect(lambda *_: self._update_button())
        self._update_button()

    # ------------------------------------------------------------------------------------------- actions
    def run(self) -> bool:
        started = self.session.diagnose()
        self._update_button()
        return started

    def _update_button(self) -> None:
        running = self.session.reports.diagnosing
        self.run_button.setEnabled(self.session.graph is not None and not running)
        self.run_button.setText("Diagnosing…" if running else "Run diagnostics")

    # ------------------------------------------------------------------------------------------- showing
    def show_report(self, report: Any) -> None:
        self.report = report
        self.table.blockSignals(True)
        self.table.clearSelection()
        self.table.setRowCount(0)
        if report is None:
            self.table.blockSignals(False)
            self.summary.setText(
                "Run the diagnostics to find which trainable variables get no gradient, and why."
                if self.session.graph is not None
                else "Open a model, then run the diagnostics to find where gradients stop."
            )
            self.details.clear()
            return
        self.table.setRowCount(len(report.variables))
        for row, v in enumerate(report.variables):
            color = QColor(STATUS_COLORS.get(v.status, "#263238"))
            cut = v.cut
            cells = (
                v.path,
                _shape(v.shape),
                STATUS_LABELS.get(v.status, v.status),
                _where(v.node, v.layer),
                f"{cut.op_type} in {_where(cut.node, cut.layer)}" if cut is not None else "",
            )
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(v.message())
                if col == 2:
                    item.setForeground(QBrush(color))
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                if col == CUT_COLUMN and cut is not None:
                    item.setForeground(QBrush(QColor(STATUS_COLORS["blocked"])))
                self.table.setItem(row, col, item)
        self.table.blockSignals(False)
        self.summary.setText(self._summary_html(report))
        self.details.setHtml(self._overview_html(report))

    def _summary_html(self, report: Any) -> str:
        n = len(report.variables)
        if report.ok:
            return (
                f"<span style='color:{STATUS_COLORS['connected']}'><b>All {n} trainable variable(s) receive a "
                f"gradient</b></span> of {html.escape(report.target)}."
            )
        counts = ", ".join(
            f"{len(report.by_status(s))} {STATUS_LABELS[s]}" for s in STATUS_LABELS if report.by_status(s)
        )
        cuts = report.cuts()
        head = f"<b style='color:{STATUS_COLORS['blocked']}'>{len(report.problems)} of {n} trainable variable(s) "
        head += "get no gradient</b>"
        if cuts:
            cut = cuts[0][0]
            more = f" (and {len(cuts) - 1} more)" if len(cuts) > 1 else ""
            head += f": the path is cut by <code>{html.escape(cut.op_type)}</code> in {html.escape(cut.where())}{more}"
        return f"{head}. <span style='color:#546e7a'>({counts}; target: {html.escape(report.target)})</span>"

    def _overview_html(self, report: Any) -> str:
        out = []
        if report.level1_error:
            out.append(f"<p style='color:#c62828'><b>tape.gradient failed:</b> {html.escape(report.level1_error)}</p>")
        if report.ok:
            out.append(
                f"<p style='color:{STATUS_COLORS['connected']}'><b>OK:</b> every trainable variable receives a "
                f"gradient of {html.escape(report.target)}. No op cuts a gradient path.</p>"
            )
        for cut, blocked in report.cuts():
            out.append(self._cut_html(cut))
            names = ", ".join(f"<code>{html.escape(v.path)}</code>" for v in blocked)
            out.append(f"<p><b>Blocks {len(blocked)} variable(s):</b> {names}</p>")
            longest = max(blocked, key=lambda v: len(v.path_nodes))
            if len(longest.path_nodes) > 1:
                out.append(f"<p><b>Path:</b> {html.escape(' → '.join(longest.path_nodes))}</p>")
        for status in ("unused", "never_read"):
            group = report.by_status(status)
            if group:
                out.append(
                    f"<p><b style='color:{STATUS_COLORS[status]}'>{STATUS_LABELS[status].capitalize()}:</b> "
                    + ", ".join(f"<code>{html.escape(v.path)}</code>" for v in group)
                    + "</p>"
                )
        out.extend(f"<p style='color:#546e7a'>Note: {html.escape(n)}</p>" for n in report.notes)
        out.append(
            f"<p style='color:#78909c'>{report.n_ops} graph ops walked in {report.seconds:.2f} s. Click a row for "
            "one variable's story.</p>"
        )
        return "".join(out)

    @staticmethod
    def _cut_html(cut: Any) -> str:
        red = STATUS_COLORS["blocked"]
        return (
            f"<p style='margin-bottom:2px'><b style='color:{red}'>✂ Cut at op</b> <code>{html.escape(cut.op_name)}"
            f"</code> ({html.escape(cut.op_type)}) in {html.escape(cut.where())}.</p>"
            f"<p style='margin:2px 0'><b>Why:</b> {html.escape(cut.reason)}</p>"
            f"<p style='margin:2px 0 8px 0'><b>Fix:</b> {html.escape(cut.fix)}</p>"
        )

    def _variable_html(self, v: Any) -> str:
        color = STATUS_COLORS.get(v.status, "#263238")
        out = [
            f"<h3 style='margin:0'>{html.escape(v.path)} <span style='color:#607d8b'>[{_shape(v.shape)}]</span></h3>",
            f"<p>Status: <b style='color:{color}'>{STATUS_LABELS.get(v.status, v.status)}</b>; "
            f"owned by node {html.escape(_where(v.node, v.layer))}.</p>",
        ]
        if v.cut is not None:
            out.append(self._cut_html(v.cut))
            if len(v.path_nodes) > 1:
                out.append(f"<p><b>Path:</b> {html.escape(' → '.join(v.path_nodes))}</p>")
            if v.other_cuts:
                out.append(f"<p><b>Other cuts:</b> {html.escape(', '.join(v.other_cuts))}</p>")
        else:
            out.append(f"<p>{html.escape(v.message())}</p>")
        if v.note and v.cut is not None:
            out.append(f"<p style='color:#546e7a'>{html.escape(v.note)}</p>")
        return "".join(out)

    def _on_cell(self, row: int, col: int) -> None:
        if self.report is None or not 0 <= row < len(self.report.variables):
            return
        v = self.report.variables[row]
        self.details.setHtml(self._variable_html(v))
        node = v.cut.node if col == CUT_COLUMN and v.cut is not None and v.cut.node else v.node
        if node is not None:
            self.session.selection.select(node)

    def _on_selection_changed(self, node_id: str | None) -> None:
        """A node selected elsewhere shows its story here: the first variable it owns or whose path it cuts."""
        if self.report is None or node_id is None:
            return
        current = self.table.currentRow()
        variables = self.report.variables
        if 0 <= current < len(variables) and node_id in (variables[current].node, _cut_node(variables[current])):
            return  # the row the user clicked selected this node
        rows = [i for i, v in enumerate(variables) if _cut_node(v) == node_id]
        rows += [i for i, v in enumerate(variables) if v.node == node_id and not v.connected]
        rows += [i for i, v in enumerate(variables) if v.node == node_id]
        if not rows:
            return
        self.table.blockSignals(True)
        self.table.setCurrentCell(rows[0], 0)
        self.table.blockSignals(False)
        self.details.setHtml(self._variable_html(variables[rows[0]]))

    def row_of(self, variable_path: str) -> int:
        """The table row of a variable (-1 if not listed)."""
        if self.report is None:
            return -1
        return next((i for i, v in enumerate(self.report.variables) if v.path == variable_path), -1)
