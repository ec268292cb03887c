"""The input, the map and the overlay as large pictures: each fits its panel, zooms with the wheel (about the
pointer), pans by dragging, returns to fit on a double-click, and says the value and position under the pointer.
Which of the three show is the user's choice (one shown alone fills the row); the row can also live in a window
of its own (``MapWindow``)."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QRectF, QSize, Qt, Signal
from PySide6.QtGui import QPainter, QPixmap
from PySide6.QtWidgets import (
    QFrame,
    QGraphicsPixmapItem,
    QGraphicsScene,
    QGraphicsView,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QStackedLayout,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from gradscope.qt.images import to_pixmap

PANELS = ("input", "map", "overlay")
DEFAULT_SHOWN = ("map", "overlay")  # the map is what the user came for; the input is inside the overlay
MAX_ZOOM = 64.0  # times the fitted size: one map cell becomes a large square


class ZoomPicture(QGraphicsView):
    """A picture fitted to the view (aspect kept) until the user zooms; ``hovered`` gives the picture's pixel
    under the pointer (x, y), or (-1, -1) when it leaves the picture."""

    hovered = Signal(int, int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setScene(QGraphicsScene(self))
        self._item = QGraphicsPixmapItem()
        self.scene().addItem(self._item)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # it pans by dragging instead
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setDragMode(QGraphicsView.DragMode.ScrollHandDrag)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, True)
        self.setMouseTracking(True)
        self.setStyleSheet("background:#eceff1; border:1px solid #cfd8dc")
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.zoomed = False  # the user zoomed: a resize or a new picture keeps the view

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(96, 96)

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(200, 200)  # preferred height counts in a scroll pane: larger made a 1024x640 window scroll

    def set_pixmap(self, pixmap: QPixmap, smooth: bool = True) -> None:
        same_size = not self._item.pixmap().isNull() and self._item.pixmap().size() == pixmap.size()
        mode = Qt.TransformationMode.SmoothTransformation if smooth else Qt.TransformationMode.FastTransformation
        self._item.setTransformationMode(mode)
        self._item.setPixmap(pixmap)
        self.scene().setSceneRect(QRectF(pixmap.rect()))
        if not (self.zoomed and same_size):  # a new plan on the same image keeps the user's zoom
            self.fit()

    def fit(self) -> None:
        self.zoomed = False
        if not self._item.pixmap().isNull():
            self.fitInView(self._item, Qt.AspectRatioMode.KeepAspectRatio)

    def fitted_scale(self) -> float:
        pix = self._item.pixmap()
        if pix.isNull():
            return 1.0
        return min(self.viewport().width() / pix.width(), self.viewport().height() / pix.height())

    def shown_size(self) -> QSize:
        """The picture's size on screen, in pixels, as far as the view shows it."""
        if self._item.pixmap().isNull():
            return QSize(0, 0)
        rect = self.mapFromScene(self._item.sceneBoundingRect()).boundingRect()
        return rect.intersected(self.viewport().rect()).size()

    def zoom(self, factor: float) -> None:
        current = self.transform().m11()
        lowest, highest = self.fitted_scale(), self.fitted_scale() * MAX_ZOOM
        factor = min(max(factor, lowest / current), highest / current)
        self.scale(factor, factor)
        self.zoomed = self.transform().m11() > lowest * 1.001

    def wheelEvent(self, event) -> None:  # noqa: N802
        delta = event.angleDelta().y()
        if delta:
            self.zoom(1.0015**delta)
        event.accept()

    def mouseDoubleClickEvent(self, event) -> None:  # noqa: N802
        self.fit()

    def mouseMoveEvent(self, event) -> None:  # noqa: N802
        super().mouseMoveEvent(event)
        point = self.mapToScene(event.position().toPoint())
        pix = self._item.pixmap()
        x, y = int(np.floor(point.x())), int(np.floor(point.y()))
        inside = not pix.isNull() and 0 <= x < pix.width() and 0 <= y < pix.height()
        self.hovered.emit(x if inside else -1, y if inside else -1)

    def leaveEvent(self, event) -> None:  # noqa: N802
        super().leaveEvent(event)
        self.hovered.emit(-1, -1)

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        if not self.zoomed:
            self.fit()


def value_text(values: np.ndarray, x: int, y: int, width: int, height: int) -> str:
    """'x, y: value' of ``values`` (H, W) or (H, W, C) at the picture pixel (x, y) of a width x height picture
    drawn from it (the picture may be larger: each value is a block of pixels)."""
    h, w = values.shape[:2]
    row, col = min(y * h // max(height, 1), h - 1), min(x * w // max(width, 1), w - 1)
    value = values[row, col]
    if np.ndim(value) == 0:
        text = f"{float(value):.4g}"
    else:
        text = "(" + ", ".join(f"{float(v):.4g}" for v in np.ravel(value)[:4]) + ")"
    return f"x {col}, y {row}: {text}"


class ImagePanel(QWidget):
    """A captioned zoomable picture, with a line that says the value under the pointer."""

    def __init__(self, caption: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.setSpacing(2)
        self.caption = QLabel(caption)
        self.caption.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.caption.setWordWrap(True)  # a long caption (scores per token at a node) wraps, never widens the pane
        self.caption.setStyleSheet("color:#455a64; font-weight:600")
        # two lines for every panel's caption, so side-by-side pictures start level when one title wraps
        # ("B: gradient (pinned)" pushed B 8 px below A at 1024x640); the full text in the tooltip
        self.caption.setFixedHeight(self.caption.fontMetrics().lineSpacing() * 2 + 2)
        self.caption.setAlignment(Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignBottom)
        self.view = ZoomPicture()
        self.placeholder = QLabel()
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setWordWrap(True)  # "No image: File ▸ Open input" wraps in a narrow panel
        self.placeholder.setMinimumSize(96, 96)
        self.placeholder.setStyleSheet("background:#eceff1; border:1px solid #cfd8dc; color:#78909c")
        self.placeholder.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        stack_box = QWidget()
        self._stack = QStackedLayout(stack_box)
        self._stack.addWidget(self.placeholder)
        self._stack.addWidget(self.view)
        self.readout = QLabel()  # the value under the pointer; one line, its height kept so nothing jumps
        self.readout.setStyleSheet("color:#546e7a")
        self.readout.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.readout.setFixedHeight(self.readout.fontMetrics().height())
        self.readout.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        lay.addWidget(self.caption)
        lay.addWidget(stack_box, 1)
        lay.addWidget(self.readout)
        self._pixmap: QPixmap | None = None
        self._values: np.ndarray | None = None
        self.view.hovered.connect(self._on_hover)

    def set_array(
        self, array: np.ndarray | None, placeholder: str = "", smooth: bool = True, values: np.ndarray | None = None
    ) -> None:
        """Show ``array`` (uint8 RGB); ``values`` (default: the array) are what hovering reads out."""
        if array is None:
            self._pixmap, self._values = None, None
            self.placeholder.setText(placeholder)
            self._stack.setCurrentWidget(self.placeholder)
            self.readout.clear()
            return
        self._pixmap = to_pixmap(array)
        self._values = np.asarray(array if values is None else values)
        self._stack.setCurrentWidget(self.view)
        self.view.set_pixmap(self._pixmap, smooth)

    def pixmap(self) -> QPixmap | None:
        return self._pixmap

    def _on_hover(self, x: int, y: int) -> None:
        if x < 0 or self._values is None or self._pixmap is None or self._values.ndim < 2:
            self.readout.clear()
            return
        self.readout.setText(value_text(self._values, x, y, self._pixmap.width(), self._pixmap.height()))


class PanelRow(QWidget):
    """Input, map and overlay side by side, each shown or hidden by its toggle (at least one shows; one alone
    fills the row). ``shown_changed`` gives the names shown, for the window to keep the choice."""

    shown_changed = Signal(tuple)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        bar = QHBoxLayout()
        bar.setContentsMargins(0, 0, 0, 0)
        bar.setSpacing(3)
        self.toggles: dict[str, QToolButton] = {}
        for name in PANELS:
            button = QToolButton()
            button.setText(name.capitalize())
            button.setCheckable(True)
            button.setToolTip(f"Show the {name} (wheel: zoom · drag: pan · double-click: fit)")
            button.toggled.connect(lambda on, n=name: self._on_toggle(n, on))
            bar.addWidget(button)
            self.toggles[name] = button
        self.bar = bar
        bar.addStretch(1)
        lay.addLayout(bar)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        self.panels = {
            "input": ImagePanel("Input"),
            "map": ImagePanel("Map"),
            "overlay": ImagePanel("Overlay"),
        }
        for panel in self.panels.values():
            row.addWidget(panel, 1)
        lay.addLayout(row, 1)
        self._chosen: tuple[str, ...] = DEFAULT_SHOWN
        self._all = False
        self._apply()

    @property
    def shown(self) -> tuple[str, ...]:
        return self._chosen

    def set_shown(self, names: tuple[str, ...] | list[str]) -> None:
        chosen = tuple(n for n in PANELS if n in names) or DEFAULT_SHOWN
        if chosen != self._chosen:
            self._chosen = chosen
            self._apply()
            self.shown_changed.emit(chosen)

    def show_all(self, on: bool) -> None:
        """All three, whatever was chosen (a comparison fills them with A, B and A - B); the toggles wait."""
        if on != self._all:
            self._all = on
            self._apply()

    def _on_toggle(self, name: str, on: bool) -> None:
        if self._all:
            return
        names = set(self._chosen) | {name} if on else set(self._chosen) - {name}
        if not names:  # the last one stays
            self.toggles[name].setChecked(True)
            return
        self.set_shown(tuple(names))

    def _apply(self) -> None:
        shown = PANELS if self._all else self._chosen
        for name, panel in self.panels.items():
            panel.setVisible(name in shown)
            button = self.toggles[name]
            button.blockSignals(True)
            button.setChecked(name in shown)
            button.setEnabled(not self._all)
            button.blockSignals(False)


class MapWindow(QWidget):
    """The panels in a window of their own (View ▸ Map in a window), drawn from the same result as the main
    window's; closing it changes nothing else."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, Qt.WindowType.Window)
        self.setWindowTitle("gradscope — map")
        self.resize(900, 640)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        self.row = PanelRow()
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color:#607d8b")
        lay.addWidget(self.row, 1)
        lay.addWidget(self.note)
