"""An overview of the whole graph in a corner of the graph view: the scene drawn small once (a cached picture,
redrawn when the graph or its colours change, not on every scroll: drawing 2,000 boxes per frame made panning
a large graph slow), the part the view shows as a rectangle; click or drag in it to move there. Shown only when
the graph does not fit the view, in a bottom corner that covers no box."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QPointF, QRect, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPen, QPixmap
from PySide6.QtWidgets import QGraphicsView, QWidget

SIZE = (180, 130)


class Minimap(QWidget):
    def __init__(self, main: QGraphicsView) -> None:
        super().__init__(main)
        self.main = main
        self.setObjectName("minimap")
        self.setFixedSize(*SIZE)
        self.setToolTip("Overview: click or drag to move the view")
        self._picture: QPixmap | None = None
        self._source = QRectF()  # the scene rectangle the picture shows
        self._target = QRectF()  # where it is drawn in this widget
        for bar in (main.horizontalScrollBar(), main.verticalScrollBar()):
            bar.valueChanged.connect(lambda *_: self.refresh())
        self.hide()

    def invalidate(self) -> None:
        """The graph or its colours changed: draw the picture again at the next refresh."""
        self._picture = None
        self.refresh()

    def refresh(self) -> None:
        """Place the map in a bottom corner where it covers no box, shown only when the graph overflows the view
        (and hidden when every corner holds a box)."""
        layout = self.main.layout_data
        if layout is None or not self.main.items_by_id:
            self.hide()
            return
        x0, y0, x1, y1 = layout.bounds
        bounds = QRectF(x0 - 20, y0 - 20, x1 - x0 + 40, y1 - y0 + 40)
        if self._visible_rect().contains(bounds.adjusted(20, 20, -20, -20)):
            self.hide()
            return
        if self._picture is None or self._source != bounds:
            self._draw_picture(bounds)
        port = self.main.viewport()
        taken = [self.main.legend.geometry()]
        if self.main.search.isVisible():
            taken.append(self.main.search.geometry())
        boxes = set(self.main.items_by_id.values())
        w, h = SIZE
        for x, y in ((port.width() - w - 10, port.height() - h - 10), (10, port.height() - h - 10)):
            spot = QRect(x, y, w, h)
            if x < 0 or y < 0 or any(spot.intersects(t) for t in taken):
                continue
            if any(item in boxes for item in self.main.items(spot.adjusted(-4, -4, 4, 4))):
                continue  # never over a box: the graph is what the user reads (it covered ResNet50's stages)
            self.move(x, y)
            self.show()
            self.update()
            return
        self.hide()

    def _draw_picture(self, bounds: QRectF) -> None:
        scale = min((SIZE[0] - 4) / bounds.width(), (SIZE[1] - 4) / bounds.height())
        w, h = bounds.width() * scale, bounds.height() * scale
        self._target = QRectF((SIZE[0] - w) / 2, (SIZE[1] - h) / 2, w, h)
        self._source = bounds
        picture = QPixmap(*SIZE)
        picture.fill(QColor("#ffffff"))
        painter = QPainter(picture)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.main.scene().render(painter, self._target, self._source)
        painter.end()
        self._picture = picture

    def _visible_rect(self) -> QRectF:
        return self.main.mapToScene(self.main.viewport().rect()).boundingRect()

    def _to_scene(self, point: QPointF) -> QPointF:
        t, s = self._target, self._source
        return QPointF(
            s.x() + (point.x() - t.x()) * s.width() / t.width(), s.y() + (point.y() - t.y()) * s.height() / t.height()
        )

    def _from_scene(self, rect: QRectF) -> QRectF:
        t, s = self._target, self._source
        k = t.width() / s.width()
        return QRectF(
            t.x() + (rect.x() - s.x()) * k, t.y() + (rect.y() - s.y()) * k, rect.width() * k, rect.height() * k
        )

    def paintEvent(self, event: Any) -> None:  # noqa: N802 (Qt naming)
        painter = QPainter(self)
        if self._picture is not None:
            painter.drawPixmap(0, 0, self._picture)
        painter.setPen(QPen(QColor("#90a4ae"), 1))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawRect(0, 0, SIZE[0] - 1, SIZE[1] - 1)
        painter.setPen(QPen(QColor("#e65100"), 1.5))
        painter.setBrush(QColor(255, 152, 0, 40))
        painter.drawRect(self._from_scene(self._visible_rect()).intersected(QRectF(0, 0, *SIZE)))
        painter.end()

    def _move_main(self, event: Any) -> None:
        if self._target.width() > 0:
            self.main.centerOn(self._to_scene(event.position()))

    def mousePressEvent(self, event: Any) -> None:  # noqa: N802
        self._move_main(event)

    def mouseMoveEvent(self, event: Any) -> None:  # noqa: N802
        if event.buttons() & Qt.MouseButton.LeftButton:
            self._move_main(event)
