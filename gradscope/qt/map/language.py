"""A language model's controls beside its token strip: which next token is explained (the top five with their
probabilities; a contrast token; the position), a Generate button, and the generation's matrix, one row per
generated token (click a row, or Up/Down on the focused matrix: that token's map in the main view)."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPen, QPixmap
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from gradscope.app.session import Session
from gradscope.qt.images import to_pixmap
from gradscope.qt.reflow import ReflowGrid
from gradscope.render.positions import MATRIX_CELL, matrix_row_at, matrix_row_top

TOP = 5


class GenerationMatrix(QLabel):
    """The drawn matrix, whose rows are the choices: a click on a row (its label or its cells), or Up/Down once
    focused, emits ``row_chosen``; the chosen row is framed."""

    row_chosen = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("generation_matrix")
        self.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setToolTip("Click a generated token's row (or Up/Down): its map, with the tokens before it as input")
        self._base: QPixmap | None = None
        self.rows = 0
        self.current = -1

    def set_matrix(self, image: np.ndarray, rows: int) -> None:
        self._base, self.rows, self.current = to_pixmap(image), rows, -1
        self.setPixmap(self._base)

    def row_at(self, y: float) -> int | None:
        return None if self._base is None else matrix_row_at(self._base.height(), self.rows, y)

    def choose(self, row: int) -> None:
        if not 0 <= row < self.rows or self._base is None:
            return
        self.current = row
        framed = QPixmap(self._base)
        painter = QPainter(framed)
        painter.setPen(QPen(QColor("#263238"), 2))
        top = matrix_row_top(self._base.height(), self.rows, row)
        painter.drawRect(1, top, framed.width() - 3, MATRIX_CELL - 1)
        painter.end()
        self.setPixmap(framed)
        self.row_chosen.emit(row)

    def mousePressEvent(self, event) -> None:  # noqa: N802 - Qt's name
        row = self.row_at(event.position().y())
        if row is not None:
            self.setFocus()
            self.choose(row)
        super().mousePressEvent(event)

    def keyPressEvent(self, event) -> None:  # noqa: N802 - Qt's name
        step = {Qt.Key.Key_Up: -1, Qt.Key.Key_Down: 1}.get(event.key())
        if step is None or not self.rows:
            super().keyPressEvent(event)
            return
        self.choose(min(max(self.current + step, 0), self.rows - 1))


class LanguagePanel(QWidget):
    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.next_token = QComboBox()
        self.next_token.setObjectName("next_token_combo")
        self.next_token.setToolTip("The next token explained: the most likely, or one of the top five")
        self.contrast = QComboBox()
        self.contrast.setObjectName("contrast_combo")
        self.contrast.setToolTip("Explain the next token rather than this one (logit A - logit B)")
        self.position = QSpinBox()
        self.position.setRange(-1, 100_000)
        self.position.setSpecialValueText("last")
        self.position.setValue(-1)
        self.position.setToolTip("The position whose next token is explained (last: the last real token)")
        self.steps = QSpinBox()
        self.steps.setRange(1, 512)
        self.steps.setValue(8)
        self.steps.setToolTip("How many tokens to generate (greedy), each attributed to the tokens before it")
        self.generate_button = QPushButton("Generate")
        self.generate_button.setObjectName("generate_button")
        self.generate_button.setToolTip("Decode tokens greedily and attribute each (one backward pass per token)")
        self.summary = QLabel()
        self.summary.setStyleSheet("color:#37474f")
        self.summary.setWordWrap(True)
        self.matrix = GenerationMatrix()

        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        # Four labelled groups that reflow (4x1, 2x2, 1x4): in one row they made the map pane wider than a
        # 1280x720 window gives it, and every control in the pane was cut at its right.
        groups = []
        for widgets in (
            (QLabel("Next token"), self.next_token),
            (QLabel("rather than"), self.contrast),
            (QLabel("after"), self.position),
            (self.steps, self.generate_button),
        ):
            group = QWidget()
            row = QHBoxLayout(group)
            row.setContentsMargins(0, 0, 0, 0)
            for w in widgets:
                row.addWidget(w)
            groups.append(group)
        lay.addWidget(ReflowGrid(groups, max_columns=4, even=True))
        lay.addWidget(self.summary)
        lay.addWidget(self.matrix)
        self.matrix.hide()

        self.next_token.activated.connect(lambda _: self._on_target_chosen())
        self.contrast.activated.connect(lambda _: self._on_target_chosen())
        self.position.editingFinished.connect(self._on_target_chosen)
        self.generate_button.clicked.connect(lambda: session.generate(self.steps.value()))
        self.matrix.row_chosen.connect(self._on_row)
        session.results.changed.connect(lambda *_: self.refresh())
        session.results.generation_changed.connect(lambda *_: self._on_generation())
        session.document.loaded.connect(lambda *_: self._on_generation())

    def _label(self, token: int) -> str:
        vocab = self.session.fed.vocab
        return f"{token} {vocab.decode([token])[0]!r}" if vocab is not None else str(token)

    def refresh(self) -> None:
        """The top five next tokens at the explained position, the explained one and its probability."""
        s = self.session
        top = s.results.top_k(TOP)
        target = s.target
        res = s.result
        explained = target.index
        if explained is None and res is not None and res.target_indices.size:
            explained = int(res.target_indices[0])
        for combo, none in ((self.next_token, "most likely"), (self.contrast, "(none)")):
            chosen = target.index if combo is self.next_token else target.contrast
            combo.blockSignals(True)
            combo.clear()
            combo.addItem(none, None)
            for token, p in top:
                if combo is self.contrast and token == explained:
                    continue  # a token rather than itself is no contrast (choosing it failed in the backward)
                combo.addItem(f"{self._label(token)}   p={p:.3f}", token)
            if chosen is not None:
                if combo.findData(chosen) < 0:
                    combo.addItem(self._label(chosen), chosen)
                combo.setCurrentIndex(combo.findData(chosen))
            combo.blockSignals(False)
        self.position.blockSignals(True)
        self.position.setValue(-1 if target.position is None else target.position)
        self.position.blockSignals(False)
        if res is None or "token_position" not in res.meta or not res.target_indices.size:
            self.summary.setText("")
            return
        token = int(res.target_indices[0])
        p = dict(top).get(token)
        where = res.meta["token_position"]
        likely = f" (p = {p:.3f})" if p is not None else ""
        rather = f" rather than {self._label(target.contrast)}" if target.contrast is not None else ""
        self.summary.setText(f"Explaining next token {self._label(token)}{likely}{rather} after position {where}.")

    def _on_target_chosen(self) -> None:
        position = self.position.value()
        self.session.targeting.set_token(
            self.next_token.currentData(),
            contrast=self.contrast.currentData(),
            position=None if position < 0 else position,
        )

    def _on_generation(self) -> None:
        from gradscope.render.positions import token_matrix

        g, labels = self.session.results.generation, self.session.results.generation_labels
        shown = g is not None
        self.matrix.setVisible(shown)
        if shown:
            start = g.prompt.size
            rows = [f"{labels[start + i]} (p = {p:.2f})" for i, p in enumerate(g.probabilities)]
            self.matrix.set_matrix(token_matrix(labels[: g.matrix.shape[1]], rows, g.matrix), len(rows))

    def _on_row(self, row: int) -> None:
        """Generated token ``row``: the tokens before it become the input, and it the next token explained."""
        g = self.session.results.generation
        if g is None or row < 0:
            return
        context = np.concatenate([g.prompt, g.generated[:row]])
        self.session.fed.set_typed(" ".join(str(int(i)) for i in context))
        self.session.targeting.set_token(int(g.generated[row]))
