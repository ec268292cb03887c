"""What an evaluation found, to look at: the deletion / insertion curves per method, and the images one by one
(sortable by a method's score or by how far the methods disagree): each method's map of the chosen image with
the Pointing Game's point (green: a hit, red: a miss) beside the image with its mask, any of them opened in the
main view."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gradscope.app.evaluation.scoring import BASELINES
from gradscope.qt.map.panels import ImagePanel

COLOURS = ("#1565c0", "#e65100", "#2e7d32", "#6a1b9a", "#c62828", "#00838f", "#5d4037", "#455a64")


def method_colours(methods: Any) -> dict[str, str]:
    """Each method's colour in a curves plot (and wherever its curves are named)."""
    return {m: COLOURS[k % len(COLOURS)] for k, m in enumerate(methods)}


class CurvesPlot(pg.PlotWidget):
    """Mean deletion (solid) and insertion (dashed) curves: the class score as pixels go, per method."""

    def __init__(self) -> None:
        super().__init__(background="w")
        self.setObjectName("evaluation_curves")
        self.setLabel("bottom", "fraction of pixels deleted / inserted (most salient first)")
        self.setLabel("left", "class probability")
        self.legend = self.addLegend(offset=(-10, 8), labelTextSize="8pt")

    def show_report(self, report: Any) -> None:
        text = "morf" in report.curves
        self.setLabel(
            "bottom",
            "fraction of tokens removed (MoRF: most relevant first; LeRF: least)"
            if text
            else "fraction of pixels deleted / inserted (most salient first)",
        )
        self.setLabel("left", "target logit" if text else "class probability")
        self.show_curves(report.curves, ("morf", "lerf") if text else ("deletion", "insertion"))

    def show_curves(self, curves: dict, names: tuple[str, str], legend: bool = True) -> None:
        """``curves[name][method]``: the first name solid, the second dashed, a colour per method (``COLOURS``, in
        the order of each name's methods); without ``legend`` where the methods are named beside the plot."""
        self.clear()
        self.legend.clear()
        self.legend.setVisible(legend)
        for metric, style in zip(names, (Qt.PenStyle.SolidLine, Qt.PenStyle.DashLine)):
            colours = method_colours(curves.get(metric, {}))
            for method, curve in curves.get(metric, {}).items():
                y = np.asarray(curve, np.float64)
                pen = pg.mkPen(colours[method], width=2, style=style)
                self.plot(np.linspace(0, 1, len(y)), y, pen=pen, name=f"{method} ({metric})")


class _Number(QTableWidgetItem):
    """A cell that sorts by its number (NaN last), shown as text."""

    def __init__(self, value: float | None, text: str) -> None:
        super().__init__(text)
        self.value = math.inf if value is None or value != value else float(value)

    def __lt__(self, other: Any) -> bool:
        return self.value < getattr(other, "value", math.inf)


class ImageBrowser(QWidget):
    def __init__(self, session: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.metric = QComboBox()
        self.metric.setToolTip("The per-image score the table shows and sorts by")
        self.metric.currentIndexChanged.connect(lambda *_: self._fill())
        self.table = QTableWidget(0, 0)
        self.table.setObjectName("evaluation_images")
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QTableWidget.SelectionMode.SingleSelection)
        self.table.setSortingEnabled(True)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.itemSelectionChanged.connect(self._on_row)
        self.caption = QLabel("Evaluate, then click an image: each method's map of it, and where it points.")
        self.caption.setWordWrap(True)
        self.caption.setStyleSheet("color:#607d8b")
        self.pictures = QWidget()
        self._row = QHBoxLayout(self.pictures)
        self._row.setContentsMargins(0, 0, 0, 0)
        self.panels: list[ImagePanel] = []
        scroll = QScrollArea()
        scroll.setWidget(self.pictures)
        scroll.setWidgetResizable(True)
        self.open_method = QComboBox()
        self.open_method.setToolTip("Open the image in the main view with this method (its class as the target)")
        self.open_button = QPushButton("Open in the main view")
        self.open_button.setEnabled(False)
        self.open_button.clicked.connect(self.open_in_main_view)

        left = QWidget()
        lv = QVBoxLayout(left)
        lv.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        top.addWidget(QLabel("Score"))
        top.addWidget(self.metric, 1)
        lv.addLayout(top)
        lv.addWidget(self.table, 1)
        right = QWidget()
        rv = QVBoxLayout(right)
        rv.setContentsMargins(0, 0, 0, 0)
        bar = QHBoxLayout()
        bar.addWidget(self.caption, 1)
        bar.addWidget(self.open_method)
        bar.addWidget(self.open_button)
        rv.addLayout(bar)
        rv.addWidget(scroll, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setSizes([320, 700])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(split)
        self._rows: dict[str, dict] = {}
        self.report: Any = None
        self.unit = "images"
        session.evaluations.inspected.connect(self.show_inspection)

    def set_unit(self, unit: str) -> None:
        """ "images" or "texts": what the rows are and what a click shows."""
        self.unit = unit
        for widget in (self.open_method, self.open_button):  # a text is opened by typing it (File > Type tokens)
            widget.setVisible(unit != "texts")
        self.caption.setText(
            "Evaluate, then click a text: each method's token map beside its MoRF and LeRF curves."
            if unit == "texts"
            else "Evaluate, then click an image: each method's map of it, and where it points."
        )

    # ------------------------------------------------------------------------------------------- the table
    def show_report(self, report: Any) -> None:
        self.report = report
        rows: dict[str, dict] = {}
        for r in report.per_image:
            row = rows.setdefault(r["key"], {"class": r["class"], "scores": {}})
            row["scores"][r["method"]] = r
        self._rows = rows
        metrics = [m for m in report.metrics if m != "pointing_difficult"]
        self.metric.blockSignals(True)
        self.metric.clear()
        self.metric.addItems(metrics)
        self.metric.blockSignals(False)
        self._fill()

    def _fill(self) -> None:
        report = self.report
        metric = self.metric.currentText()
        if report is None or not metric:
            return
        methods = report.methods
        self.table.setSortingEnabled(False)
        self.table.clearContents()
        self.table.setColumnCount(3 + len(methods))
        texts = report.unit == "texts"
        self.table.setHorizontalHeaderLabels(["text" if texts else "image", "target" if texts else "class", *methods,
                                              "spread"])  # fmt: skip
        self.table.setRowCount(len(self._rows))
        for i, (key, row) in enumerate(self._rows.items()):
            values = [row["scores"].get(m, {}).get(metric) for m in methods]
            self.table.setItem(i, 0, QTableWidgetItem(key))
            self.table.setItem(i, 1, QTableWidgetItem(str(row["class"])))
            for j, v in enumerate(values):
                self.table.setItem(i, 2 + j, _Number(v, _score_text(metric, v)))
            finite = [v for v in values if v is not None and v == v]
            spread = max(finite) - min(finite) if finite else None
            self.table.setItem(i, 2 + len(methods), _Number(-spread if spread is not None else None, _fmt(spread)))
        self.table.setSortingEnabled(True)
        self.table.setToolTip(
            "Click a header to sort; spread: how far the methods' scores differ (sorts largest first)"
        )

    def _on_row(self) -> None:
        items = self.table.selectedItems()
        if not items:
            return
        key = self.table.item(items[0].row(), 0).text()
        if self.report is not None and self.report.unit == "texts":  # all in the report: nothing to compute
            self.show_text(key)
            return
        try:
            self.session.evaluations.inspect(key)
        except Exception as exc:  # no evaluation to look at: one message
            self.session.feedback.error("Cannot show the image", str(exc), exc)

    # ------------------------------------------------------------------------------------------- the pictures
    def show_inspection(self, seen: Any) -> None:
        self._clear()
        edge = _edge(seen.mask, seen.cls)
        image = ImagePanel("image, mask outlined")
        image.set_array(_outlined(seen.image, edge))
        self._add(image)
        for view in seen.views:
            verdict = {True: "hit", False: "miss", None: "no point"}[view.hit]
            panel = ImagePanel(f"{view.method}: {verdict}")
            panel.set_array(_marked(view.heat, view.point, view.hit, edge), values=view.saliency)
            self._add(panel)
        label = self.session.document.class_label(seen.cls)
        self.caption.setText(
            f"{seen.key}: the maps of class {label} (white: the mask's outline; the cross: the point, green a hit, "
            "red a miss)"
        )
        self.open_method.clear()
        self.open_method.addItems([v.method for v in seen.views if _is_preset(v.method)])
        self.open_button.setEnabled(seen.path is not None and self.open_method.count() > 0)

    def show_text(self, key: str) -> None:
        """Each method's token map of the text ``key`` (as the main view draws a token strip) and the text's MoRF
        (solid) and LeRF (dashed) curves of every method."""
        from gradscope.render.positions import token_strip

        report = self.report
        sample = next((s for s in report.samples if s["key"] == key), None)
        if sample is None:
            return
        self._clear()
        column = QWidget()
        cv = QVBoxLayout(column)
        cv.setContentsMargins(0, 0, 0, 0)
        colour = method_colours(sample["curves"].get("morf", {}))
        for method, scores in sample["maps"].items():
            panel = ImagePanel(f"{method}: token map")
            panel.caption.setStyleSheet(f"color:{colour.get(method, '#263238')}; font-weight:bold")
            panel.set_array(token_strip(sample["tokens"], scores, width=640), values=None)
            panel.setMinimumHeight(64)
            panel.setMaximumHeight(100)  # a strip is one row of tokens: every method's in view, not the first only
            cv.addWidget(panel)
            self.panels.append(panel)
        cv.addStretch(1)
        plot = CurvesPlot()
        plot.setObjectName("evaluation_text_curves")
        plot.setTitle("MoRF solid, LeRF dashed", size="8pt")
        plot.setLabel("bottom", "fraction of tokens removed")
        plot.setLabel("left", "target logit")
        plot.show_curves(sample["curves"], ("morf", "lerf"), legend=False)  # the maps' captions name the colours
        plot.setMinimumWidth(320)
        self._row.addWidget(column, 2)
        self._row.addWidget(plot, 1)
        self.caption.setText(f"{key}: target {sample.get('class')}; red tokens count for it, blue against")
        self.open_method.clear()
        self.open_button.setEnabled(False)

    def _clear(self) -> None:
        while self._row.count():
            widget = self._row.takeAt(0).widget()
            if widget is not None:
                widget.deleteLater()
        self.panels = []

    def _add(self, panel: ImagePanel) -> None:
        panel.setMinimumWidth(150)
        self._row.addWidget(panel, 1)
        self.panels.append(panel)

    def open_in_main_view(self) -> None:
        seen = self.session.evaluations.inspection
        method = self.open_method.currentText()
        if seen is None or seen.path is None or not method:
            return
        s = self.session
        if s.fed.open(str(seen.path)):
            if method != s.evaluations.plan_method:  # (the plan being edited is already the main view's)
                s.editor.apply_method(method.partition("@")[0])
            s.targeting.set_class(seen.cls)


def _is_preset(method: str) -> bool:
    return method not in BASELINES


def _fmt(v: float | None) -> str:
    return "-" if v is None or v != v else f"{v:.3f}"


def _score_text(metric: str, v: float | None) -> str:
    if metric == "pointing" and v is not None and v == v:
        return "hit" if v >= 1 else ("miss" if v <= 0 else f"{v:.2f}")
    return _fmt(v)


def _edge(mask: np.ndarray | None, cls: int) -> np.ndarray | None:
    """The boundary pixels of the class's region in ``mask`` (None without a mask)."""
    if mask is None:
        return None
    inside = mask == cls
    return inside & ~np.all(_neighbours(inside), axis=0)


def _neighbours(m: np.ndarray) -> np.ndarray:
    """``m`` shifted one pixel up, down, left and right (stacked)."""
    return np.stack([np.roll(m, 1, 0), np.roll(m, -1, 0), np.roll(m, 1, 1), np.roll(m, -1, 1)])


def _marked(heat: np.ndarray, point: tuple[int, int] | None, hit: bool | None, edge=None) -> np.ndarray:
    """The map with the mask's outline in white and a cross at the pointing point: green for a hit, red for a
    miss, white without a mask, drawn on a black border (a bare green cross vanished in the jet colour map)."""
    out = heat.copy()
    h, w = out.shape[:2]
    if edge is not None and edge.shape == (h, w):
        out[edge] = (255, 255, 255)
    if point is None:
        return out
    colour = {True: (0, 230, 118), False: (255, 23, 68), None: (255, 255, 255)}[hit]
    r, c = point
    arm = max(3, min(h, w) // 12)
    for width, paint in ((1, (0, 0, 0)), (0, colour)):
        for d in range(-arm - width, arm + width + 1):
            for t in range(-width, width + 1):
                for y, x in ((r + d, c + t), (r + t, c + d)):
                    if 0 <= y < h and 0 <= x < w:
                        out[y, x] = paint
    return out


def _outlined(image: np.ndarray, edge: np.ndarray | None) -> np.ndarray:
    """The image with the mask's outline in whichever of yellow, magenta and cyan stands out most from both the
    pixels it replaces and those around it (yellow on the demo's yellow shapes, or cyan on their blue ground,
    could not be seen)."""
    out = np.asarray(image, np.uint8).copy()
    if edge is None or edge.shape != out.shape[:2] or not edge.any():
        return out
    grown = edge | np.any(_neighbours(edge), axis=0)
    ground = [out[edge].astype(np.float32).mean(axis=0)]
    if (grown & ~edge).any():
        ground.append(out[grown & ~edge].astype(np.float32).mean(axis=0))
    choices = np.array([(255, 214, 0), (255, 0, 255), (0, 229, 255)], np.float32)
    contrast = np.min([np.abs(choices - g).sum(axis=1) for g in ground], axis=0)
    out[edge] = choices[int(np.argmax(contrast))].astype(np.uint8)
    return out
