"""The graph pane: the layer graph with its tool row (title, colour-by, Fit, Find, Diagnose, Collapse/Expand),
kept in step with the Session's model: a message while the first model loads, the new model's graph (not yet
clickable) while its weights load, the current model back if that load fails or is cancelled."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

from gradscope.qt.diagnostics_panel import graph_marks
from gradscope.qt.graph.view import EMPTY_MESSAGE, GraphView
from gradscope.render.graph_layout import display_groups


class GraphPane(QWidget):
    def __init__(self, session: Any, diagnose: Callable[[], None]) -> None:
        super().__init__()
        self.session = session
        self.view = GraphView()
        self.view.setObjectName("graph_view")
        self.title = QLabel("<b>Layer graph</b>")
        self.title.setWordWrap(True)  # "Layer graph — resnet50, 178 nodes" wraps on a narrow window
        self.title.setMinimumWidth(120)
        self.color_by = QComboBox()
        self.color_by.addItems(["plan", "baseline", "diagnosis"])
        self.color_by.setToolTip(
            "Colour nodes by the gradient under the current plan, by the plain gradient, or only by the path "
            "diagnostics (red: the op that cuts a gradient path and the nodes on that path)"
        )
        self.color_by.currentIndexChanged.connect(lambda *_: self.update_state())
        # two rows (title and view buttons; colouring and group buttons): the pane fits a third of a laptop screen
        tools = QHBoxLayout()
        tools.setContentsMargins(6, 4, 6, 0)
        tools.addWidget(self.title, 1)
        second = QHBoxLayout()
        second.setContentsMargins(6, 0, 6, 0)
        second.addWidget(QLabel("colour by"))
        second.addWidget(self.color_by)
        second.addStretch(1)
        self.group_buttons: list[QToolButton] = []  # shown when the graph has groups
        for text, tip, slot in (
            ("Fit", "Fit the whole graph (F)", self.view.fit_all),
            ("Find", "Find a node by name (Ctrl+F)", self.view.focus_search),
            ("Diagnose", "Find where gradients stop: the op that cuts each variable's path (Ctrl+D)", diagnose),
            ("Collapse", "Collapse every block and nested model into one box", lambda: self._collapse(True)),
            ("Expand", "Expand every block and nested model", lambda: self._collapse(False)),
        ):
            b = QToolButton()
            b.setText(text)
            b.setToolTip(tip)
            b.clicked.connect(slot)
            (second if text in ("Collapse", "Expand") else tools).addWidget(b)
            if text in ("Collapse", "Expand"):
                b.setVisible(False)
                self.group_buttons.append(b)
        box = QVBoxLayout(self)
        box.setContentsMargins(0, 0, 0, 0)
        box.setSpacing(2)
        box.addLayout(tools)
        box.addLayout(second)
        box.addWidget(self.view, 1)

        self.view.node_clicked.connect(session.selection.select)
        self.view.group_toggled.connect(session.document.set_collapsed)
        self.view.reveal_requested.connect(session.document.reveal)
        session.document.loading.connect(self._on_model_loading)
        session.document.previewed.connect(self._on_preview)
        session.document.loaded.connect(self._on_model_loaded)
        session.document.layout_changed.connect(self._on_layout)
        session.selection.changed.connect(self.view.select_node)
        session.results.changed.connect(lambda *_: self.update_state())
        session.editor.changed.connect(lambda *_: self.update_state())
        session.feedback.error_raised.connect(lambda *_: self._placeholder_if_empty())

    # ------------------------------------------------------------------------------------------- model
    def _on_model_loading(self, name: object) -> None:
        """An empty pane says what is loading; a shown graph stays until the new one is drawn (if the load
        fails, the current model is kept, and so is its graph)."""
        if self.view.layout_data is None:
            self.view.show_message(f"Loading {Path(str(name)).name}…")

    def _on_preview(self, graph: Any, layout: Any) -> None:
        if layout is None:  # the load that showed it failed or was cancelled
            self.view.setInteractive(True)
            if self.session.document.layout is not None:
                self._on_model_loaded(self.session.graph)
                self.view.set_layout(self.session.document.layout)
                self.update_state()
            else:
                self.view.show_message(EMPTY_MESSAGE)
                self.title.setText("<b>Layer graph</b>")
            return
        self.view.set_layout(layout)
        self.view.set_node_state({}, {}, "loading the weights…", frozenset())
        self.view.setInteractive(False)  # its nodes belong to a model the Session does not hold yet
        self._show_title(graph, " — loading the weights…")

    def _on_model_loaded(self, graph: Any) -> None:
        self.view.setInteractive(True)
        has_groups = bool(display_groups(graph).paths)
        for b in self.group_buttons:
            b.setVisible(has_groups)
        self._show_title(graph)

    def _show_title(self, graph: Any, note: str = "") -> None:
        self.title.setText(f"<b>Layer graph</b> — {graph.model_name}, {len(graph)} nodes{note}")

    def _on_layout(self, layout: Any) -> None:
        previous = self.view.layout_data
        keep = previous is not None and bool(layout.collapsed or previous.collapsed)
        self.view.set_layout(layout, keep_view=keep)
        self.update_state()

    def _placeholder_if_empty(self) -> None:
        if self.session.graph is None and not self.session.document.previewing:
            self.view.show_message(EMPTY_MESSAGE)

    def _collapse(self, collapse: bool) -> None:
        self.session.document.collapse_all(collapse)

    # ------------------------------------------------------------------------------------------- colours
    def update_state(self) -> None:
        s = self.session
        if s.document.previewing:
            return  # the Session's statistics describe the model still held, not the one drawn
        mode = self.color_by.currentText()
        which = "baseline" if mode == "baseline" else "current"
        stats = dict(s.results.stats(which))
        res = s.result if which == "current" else s.baseline
        if res is not None and s.graph is not None and "input_stats" in res.meta:
            for i in s.graph.input_ids:
                stats[i] = res.meta["input_stats"]
        caption = "mean |g|, log scale" + (" (baseline)" if which == "baseline" else "")
        if mode == "diagnosis":
            caption = "path diagnostics" if s.reports.diagnosis is not None else "path diagnostics: not run (Ctrl+D)"
        self.view.set_node_state(
            stats, s.editor.ruled_nodes(), caption, s.results.skipped_nodes(s.graph), magnitude=mode != "diagnosis"
        )

    def show_diagnosis(self, report: Any) -> None:
        self.view.set_diagnosis(*graph_marks(report))
        # A cut path is drawn on neutral boxes, so its red is not read as "a large gradient".
        wanted = "diagnosis" if report is not None and not report.ok else None
        if wanted is None and self.color_by.currentText() == "diagnosis" and report is None:
            wanted = "plan"
        if wanted is not None and self.color_by.currentText() != wanted:
            self.color_by.setCurrentText(wanted)  # repaints through currentIndexChanged
        else:
            self.update_state()
        if report is not None:
            # after the diagnostics dock has taken its share of the window, so the fit uses the new size
            QTimer.singleShot(0, self.view.show_diagnosis)
