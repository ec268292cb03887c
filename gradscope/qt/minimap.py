"""An overview of the whole graph in a corner of the graph view: the same scene drawn small, the part the view
shows as a rectangle; click or drag in it to move there. Shown only when the graph does not fit the view."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QFrame, QGraphicsView

SIZE = (180, 130)


class Minimap(QGraphicsView):
    def __init__(self, main: QGraphicsView) -> None:
        super().__init__(main)
        self.main = main
        self.setScene(main.scene())
        self.setObjectName("minimap")
        self.setFixedSize(*SIZE)
        self.setFrameShape(QFrame.Shape.Box)
        self.setStyleSheet("QGraphicsView#minimap { border: 1px solid #90a4ae; background: #ffffff; }")
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setInteractive(False)  # clicks move the main view; nothing in here is selectable
        self.setRenderHints(QPainter.RenderHint.Antialiasing)
        self.setToolTip("Overview: click or drag to move the view")
        for bar in (main.horizontalScrollBar(), main.verticalScrollBar()):
            bar.valueChanged.connect(lambda *_: self.refresh())
        self.hide()

    def refresh(self) -> None:
        """Fit the scene, place the map in the bottom-right corner, show it only when the graph overflows."""
        scene_rect = self.main.sceneRect()
        layout = self.main.layout_data
        if layout is None or not self.main.items_by_id:
            self.hide()
            return
        x0, y0, x1, y1 = layout.bounds
        self.setVisible(not self.visible_rect().contains(QRectF(x0, y0, x1 - x0, y1 - y0)))
        if not self.isVisible():
            return
        self.fitInView(scene_rect, Qt.AspectRatioMode.KeepAspectRatio)
        port = self.main.viewport()
        self.move(port.width() - SIZE[0] - 10, port.height() - SIZE[1] - 10)
        self.viewport().update()

    def visible_rect(self) -> QRectF:
        return self.main.mapToScene(self.main.viewport().rect()).boundingRect()

    def drawForeground(self, painter: QPainter, rect: QRectF) -> None:  # noqa: N802 (Qt naming)
        painter.setPen(QPen(QColor("#e65100"), 0))
        painter.setBrush(QColor(255, 152, 0, 40))
        painter.drawRect(self.visible_rect())

    def _move_main(self, event: Any) -> None:
        self.main.centerOn(self.mapToScene(event.position().toPoint()))
        self.viewport().update()

    def mousePressEvent(self, event: Any) -> None:  # noqa: N802
        self._move_main(event)

    def mouseMoveEvent(self, event: Any) -> None:  # noqa: N802
        if event.buttons() & Qt.MouseButton.LeftButton:
            self._move_main(event)

    def wheelEvent(self, event: Any) -> None:  # noqa: N802 - the overview does not zoom
        event.accept()
