"""A grid of controls that takes as many columns as its width holds: a form that stacks on a narrow dock.

Qt's layouts keep a fixed column count, so a row of four labelled combos forces the window to be at least four
combos wide (the window could not shrink below 1,155 px). ``ReflowGrid`` re-places its cells when resized, from
``max_columns`` down to ``min_columns``, and asks its parent only for the narrowest arrangement's width.
``VerticalScroll`` holds a pane that may scroll vertically on a short window but is never cut at its side.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtWidgets import QFrame, QGridLayout, QLayout, QScrollArea, QSizePolicy, QWidget


class ReflowGrid(QWidget):
    def __init__(
        self,
        cells: Sequence[QWidget | tuple[QWidget, int]],
        *,
        max_columns: int,
        min_columns: int = 1,
        even: bool = False,
        parent: QWidget | None = None,
    ) -> None:
        """``even``: only column counts that divide ``max_columns`` (four buttons as 4x1 or 2x2, never 3+1)."""
        super().__init__(parent)
        self._cells = [(c, 1) if isinstance(c, QWidget) else c for c in cells]
        self._min_columns, self._max_columns = min_columns, max_columns
        counts = range(max_columns, min_columns - 1, -1)
        self._counts = [n for n in counts if not even or max_columns % n == 0]
        self._grid = QGridLayout(self)
        self._grid.setContentsMargins(0, 0, 0, 0)
        self._grid.setHorizontalSpacing(6)
        self._grid.setVerticalSpacing(3)
        self._grid.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.columns = 0
        self._arrange(max_columns)

    def _column_width(self) -> int:
        return max(-(-w.minimumSizeHint().width() // span) for w, span in self._cells)

    def _width_for(self, columns: int) -> int:
        return columns * self._column_width() + (columns - 1) * self._grid.horizontalSpacing()

    def _arrange(self, columns: int) -> None:
        if columns == self.columns:
            return
        self.columns = columns
        for w, _ in self._cells:
            self._grid.removeWidget(w)
        for k in range(self._max_columns):
            self._grid.setColumnStretch(k, 1 if k < columns else 0)
        row = col = 0
        for w, span in self._cells:
            span = min(span, columns)
            if col + span > columns:
                row, col = row + 1, 0
            self._grid.addWidget(w, row, col, 1, span)
            col += span
        self.updateGeometry()

    def columns_for(self, width: int) -> int:
        """The most columns whose minimum width fits ``width``."""
        for columns in self._counts:
            if self._width_for(columns) <= width:
                return columns
        return self._min_columns

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self._arrange(self.columns_for(event.size().width()))
        super().resizeEvent(event)

    def sizeHint(self):  # noqa: N802
        hint = self._grid.sizeHint()
        hint.setHeight(self._grid.minimumSize().height())
        return hint

    def minimumSizeHint(self):  # noqa: N802
        size = self._grid.minimumSize()
        size.setWidth(self._width_for(self._min_columns))
        return size


class VerticalScroll(QScrollArea):
    """Scrolls its widget vertically only, and is never narrower than the widget needs: a pane that a short
    window shrinks in height, never cut at its right edge."""

    def __init__(self, widget: QWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidget(widget)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        widget.installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802
        # a scroll area does not pass its widget's new minimum on: ask the layout above to read it again
        if watched is self.widget() and event.type() == QEvent.Type.LayoutRequest:
            self.updateGeometry()
        return super().eventFilter(watched, event)

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        bar = self.verticalScrollBar().sizeHint().width()
        return QSize(self.widget().minimumSizeHint().width() + bar, 120)

    def sizeHint(self) -> QSize:  # noqa: N802
        bar = self.verticalScrollBar().sizeHint().width()
        hint = self.widget().sizeHint()
        return QSize(hint.width() + bar, hint.height())
