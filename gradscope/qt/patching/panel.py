"""The Patching view: the input shown (clean) against a corrupted one, each component x position (or an image's grid
cell) as a heat map; a click on a cell patches that one exactly, as a plan entry, so the map, the output and its
probability shown are the patched model's (Ctrl+Z undoes it).

What it shows is ``session.patching``'s result (the picture ``gradscope patch`` writes); the run is a worker job
(progress in the status bar, Run ▸ Cancel stops it between batches).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from gradscope.app.files.patches import patch_picture, patch_title
from gradscope.app.patching.model import plan_effect, with_cell
from gradscope.qt.images import to_pixmap
from gradscope.render.patch_grid import grid_layout, row_labels

COMPONENT_TIPS = {
    "resid": "the residual stream after each block",
    "attn": "each attention module's output (after its output projection)",
    "mlp": "each MLP's output projection",
    "q": "each attention layer's queries (all heads) at a position",
    "k": "each attention layer's keys at a position",
    "v": "each attention layer's values at a position",
}


class PatchGrid(QLabel):
    """The heat map; a click on a cell reports it (``on_cell(component, block, unit)``)."""

    def __init__(self, on_cell: Any) -> None:
        super().__init__()
        self.on_cell = on_cell
        self.layout_ = None
        self.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setToolTip("Click a cell: patch that value exactly (a plan entry; Ctrl+Z undoes it)")

    def show_result(self, result: Any) -> None:
        if result is None:
            self.layout_ = None
            self.clear()
            self.setText("No patching result yet: give a corrupted input and Run.")
            return
        rows = {c: [f"{i} {n.rsplit('/', 1)[-1]}" for i, n in enumerate(nodes)] for c, nodes in result.nodes.items()}
        self.layout_ = grid_layout(result.by_component, result.units, row_labels(result.by_component, rows),
                                   patch_title(result))  # fmt: skip
        self.setPixmap(to_pixmap(patch_picture(result)))

    def mousePressEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        cell = self.layout_.cell_at(event.position().x(), event.position().y()) if self.layout_ else None
        if cell is not None:
            self.on_cell(*cell)


class PatchingPanel(QWidget):
    def __init__(self, session: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        model = session.patching
        self.corrupt = QLineEdit()
        self.corrupt.setPlaceholderText("corrupted input: token ids or words, as many tokens as the input shown")
        self.corrupt.returnPressed.connect(lambda: model.set_typed(self.corrupt.text()))
        copy = QPushButton("From the input")
        copy.setToolTip("Start from the input shown (its text or ids): change a token or two to make the corrupted one")
        copy.clicked.connect(self.copy_input)
        browse = QPushButton("File…")
        browse.setToolTip("An image or a file of token ids / arrays as the corrupted input")
        browse.clicked.connect(self.choose_file)
        self.method = QComboBox()
        self.method.addItems(["atp", "atp_star", "exact"])
        self.method.setToolTip("atp: one backward pass; atp_star: AtP* (QK fix, GradDrop; magnitudes); exact")
        self.components = {c: QCheckBox(c) for c in COMPONENT_TIPS}
        for c, box in self.components.items():
            box.setToolTip(COMPONENT_TIPS[c])
        self.components["resid"].setChecked(True)
        self.nodes = QLineEdit()
        self.nodes.setPlaceholderText("nodes (any model): comma-separated ids; empty: the selected node")
        self.grid = QSpinBox()
        self.grid.setRange(1, 64)
        self.grid.setValue(7)
        self.grid.setPrefix("grid ")
        self.grid.setToolTip("Image models: cells a side")
        self.metric = QComboBox()
        self.metric.addItems(["logit", "probability", "loss"])
        self.compare = QCheckBox("compare with exact")
        self.run_button = QPushButton("Run patching")
        self.run_button.clicked.connect(self.start)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.effect = QLabel("")
        self.effect.setWordWrap(True)
        self.picture = PatchGrid(self.patch_cell)
        self.picture.show_result(None)
        scroll = QScrollArea()
        scroll.setWidget(self.picture)
        scroll.setWidgetResizable(True)

        row1 = QHBoxLayout()
        row1.addWidget(self.corrupt, 1)
        row1.addWidget(copy)
        row1.addWidget(browse)
        row2 = QHBoxLayout()
        row2.addWidget(self.method)
        for box in self.components.values():
            row2.addWidget(box)
        row2.addWidget(self.metric)
        row2.addStretch(1)
        row3 = QHBoxLayout()
        row3.addWidget(self.nodes, 1)
        row3.addWidget(self.grid)
        row3.addWidget(self.compare)
        row3.addWidget(self.run_button)
        layout = QVBoxLayout(self)
        for row in (row1, row2, row3):
            layout.addLayout(row)
        layout.addWidget(self.status)
        layout.addWidget(self.effect)
        layout.addWidget(scroll, 1)

        model.corrupt_changed.connect(self._on_corrupt)
        model.finished.connect(self._on_finished)
        session.results.changed.connect(self._on_result)
        session.document.loaded.connect(self._on_model)

    def copy_input(self) -> None:
        fed = self.session.fed
        ids = fed.fed.ids if fed.fed is not None else None
        self.corrupt.setText(fed.typed or (" ".join(str(int(i)) for i in ids) if ids is not None else ""))
        self.corrupt.setFocus()

    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Corrupted input", "", "Inputs (*.png *.jpg *.jpeg *.bmp *.webp "
                                              "*.tif *.tiff *.txt *.json *.npy *.npz);;All files (*)")  # fmt: skip
        if path:
            self.session.patching.open(path)

    def start(self) -> None:
        s = self.session
        typed_now = self.corrupt.text().strip() and self.corrupt.text() != (s.patching.typed or "")
        if typed_now and not s.patching.set_typed(self.corrupt.text()):  # typed but not yet taken (no Enter)
            return
        components = tuple(c for c, box in self.components.items() if box.isChecked()) or ("resid",)
        typed = [n.strip() for n in self.nodes.text().split(",") if n.strip()]
        selected = [s.selected] if s.selected else None
        nodes = typed or (None if self._is_transformer() else selected)  # a CNN: the node selected in the graph
        try:
            s.patching.run(method=self.method.currentText(), components=components, nodes=nodes,
                           metric=self.metric.currentText(), grid=self.grid.value(),
                           compare=self.compare.isChecked())  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a refusal is a message
            s.feedback.error("Cannot run patching", str(exc), exc)

    def patch_cell(self, component: str, block: int, unit: int) -> None:
        s = self.session
        result = s.patching.result
        entry = s.patching.cell_entry(component, block, unit)
        value = result.by_component[component][block, unit]
        where = f"{component} of block {block} at {result.units[unit]!r}"
        if entry is None:
            self.status.setText(f"{where}: {result.method} {value:+.4g} (a query, key or value is not a plan entry)")
            return
        self.status.setText(f"{where}: {result.method} {value:+.4g}; patching it exactly (undo: Ctrl+Z)…")
        s.editor.set_plan(with_cell(s.plan, entry))

    def _is_transformer(self) -> bool:
        from gradscope.engine.patching import blocks

        graph = self.session.graph
        return graph is not None and bool(blocks(graph))

    def _on_model(self, graph: Any) -> None:
        transformer = graph is not None and self._is_transformer()
        for box in self.components.values():
            box.setEnabled(transformer)
        self.grid.setEnabled(graph is not None and graph.token_input is None)

    def _on_corrupt(self, described: str | None) -> None:
        self.status.setText(f"Corrupted input: {described}" if described else "No corrupted input.")

    def _on_finished(self, result: Any) -> None:
        self.picture.show_result(result)
        if result is not None:
            notes = [f"{c}: correlation with exact {a.correlation:.3f}" for c, a in result.agreement.items()]
            self.status.setText("; ".join([f"{result.method} in {result.seconds:.2f} s", *notes]))

    def _on_result(self, current: Any, baseline: Any) -> None:
        plan = self.session.plan
        patched = any(e.rule in ("patch_value", "substitute_value") for e in plan.entries)
        index = getattr(self.session.target, "index", None)
        self.effect.setText(plan_effect(current, baseline, index) if patched else "")
