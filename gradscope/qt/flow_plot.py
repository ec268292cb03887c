"""Gradient flow along the graph (pyqtgraph): per-node mean|g| / max|g| / norm, baseline vs plan, log scale.

Click a bar to select its node; the lower plot is the histogram of the selected node's gradient.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QCoreApplication, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from gradscope.app.rendering.comparison import norm_ratio
from gradscope.app.session import Session

METRICS = {"mean |g|": "mean_abs", "max |g|": "max_abs", "norm": "norm", "A/B norm ratio": "ratio"}
_PLAN_BRUSH = pg.mkBrush("#e8710a")
_BASE_BRUSH = pg.mkBrush("#9aa5b1")
MIN_BAR_PIXELS = 4.0  # below this per node, bars alias: the plot draws lines


class _LogAxis(pg.AxisItem):
    """Y axis of log10 values labelled as powers of ten."""

    def tickStrings(self, values, scale, spacing):  # noqa: N802  (pyqtgraph naming)
        return [f"1e{v:.0f}" if abs(v - round(v)) < 1e-6 else "" for v in values]


class FlowPlot(QWidget):
    node_clicked = Signal(str)

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.node_ids: list[str] = []
        pg.setConfigOptions(antialias=True, background="w", foreground="#37474f")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        bar = QHBoxLayout()
        self.metric = QComboBox()
        self.metric.addItems(list(METRICS))
        self.metric.setToolTip("Statistic of the gradient arriving at each node's output")
        self.metric.currentIndexChanged.connect(lambda *_: self.refresh())
        self.show_baseline = QCheckBox("baseline")
        self.show_baseline.setChecked(True)
        self.show_baseline.setToolTip("Also show the plain gradient (no rules), grey, left of each plan bar")
        self.show_baseline.toggled.connect(lambda *_: self.refresh())
        self.caption = QLabel()
        self.caption.setStyleSheet("color:#546e7a")
        self.caption.setMinimumWidth(0)  # a long caption is cut, never widens the window (1280x720 screens)
        self.caption.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        bar.addWidget(QLabel("Gradient flow"))
        bar.addWidget(self.metric)
        bar.addWidget(self.show_baseline)
        bar.addStretch(1)
        bar.addWidget(self.caption)
        lay.addLayout(bar)
        split = QSplitter(Qt.Orientation.Vertical)
        self.plot = pg.PlotWidget(axisItems={"left": _LogAxis("left")})
        self.plot.setObjectName("flow_plot")
        self.plot.setMenuEnabled(False)
        self.plot.showGrid(x=False, y=True, alpha=0.25)
        self.plot.setLabel("left", "mean |g|")  # the ticks say log (1e-2, 1e0): "(log)" was cut on a short plot
        self.legend = self.plot.addLegend(offset=(-10, 8), labelTextSize="8pt", brush=pg.mkBrush(255, 255, 255, 210))
        self.plot.getPlotItem().getViewBox().setMouseEnabled(x=True, y=False)
        self.plot.getPlotItem().getViewBox().sigResized.connect(lambda *_: self._fit_y())  # its true height
        self.plot.scene().sigMouseClicked.connect(self._on_click)
        self.plot.scene().sigMouseMoved.connect(self._on_hover)
        self.as_lines = False
        self._y_range: tuple[float, float] | None = None  # the bars' log range (before the legend's headroom)
        self.plot.setToolTip("Orange: current plan, grey: baseline. × marks: no / zero / NaN gradient. Click a bar.")
        self.hist = pg.PlotWidget()
        self.hist.setMenuEnabled(False)
        self.hist.setLabel("left", "count")  # short enough for a short pane (the ticks are 1, 1e2, 1e4...)
        self.hist.setLogMode(x=False, y=True)
        self.hist.setToolTip("Histogram of the selected node's gradient (orange: plan, grey: baseline)")
        self._empty_histogram()
        self.hist.getPlotItem().getViewBox().sigResized.connect(lambda *_: self._hist_ticks())
        split.addWidget(self.plot)
        split.addWidget(self.hist)
        split.setSizes([300, 120])
        lay.addWidget(split, 1)
        self.selected_line = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen("#1a73e8", width=2))
        session.results.changed.connect(lambda *_: self.refresh())
        session.ab.changed.connect(lambda *_: self.refresh() if self._ratio_mode() else None)
        session.selection.changed.connect(lambda *_: self._on_selection())
        session.document.loaded.connect(lambda *_: self.refresh())
        session.document.loading.connect(lambda *_: self._clear("loading the model…"))

    # ------------------------------------------------------------------------------------------- drawing
    def _clear(self, caption: str) -> None:
        """No bars (the previous model's would be read as this one's)."""
        self.plot.clear()
        self.legend.clear()
        self.legend.setVisible(True)  # _fit_y hides it on a very short plot
        self._y_range = None
        self.plot.getAxis("bottom").setTicks(None)
        self.node_ids = []
        self.caption.setText(caption)
        self._empty_histogram()

    def refresh(self) -> None:
        s = self.session
        self.plot.clear()
        self.legend.clear()
        self.legend.setVisible(True)  # _fit_y hides it on a very short plot
        self.plot.getAxis("left").setTicks(None)  # (the ratio's own ticks, when it was shown)
        self._y_range = None
        key = METRICS[self.metric.currentText()]
        self.plot.setLabel("left", self.metric.currentText())
        cur = s.results.stats("current")
        base = s.results.stats("baseline")
        self.node_ids = [n for n in (s.graph.ids() if s.graph else []) if n in cur or n in base]
        if not self.node_ids:
            self.caption.setText("no result yet")
            self._on_selection()
            return
        if self._ratio_mode():
            self._draw_ratio()
            return
        x = np.arange(len(self.node_ids), dtype=float)

        def logs(stats: dict) -> np.ndarray:
            out = np.full(len(self.node_ids), np.nan)
            for i, n in enumerate(self.node_ids):
                st = stats.get(n)
                v = getattr(st, key) if st is not None else math.nan
                if st is not None and st.status == "ok" and v > 0:
                    out[i] = math.log10(v)
            return out

        lc, lb = logs(cur), logs(base)
        both = np.concatenate([lc, lb if self.show_baseline.isChecked() else lc])
        finite = both[np.isfinite(both)]
        floor = float(np.floor(finite.min()) - 0.5) if finite.size else -1.0
        top = float(np.ceil(finite.max()) + 0.3) if finite.size else 1.0
        self.as_lines = self._pixels_per_node() < MIN_BAR_PIXELS
        if self.as_lines:
            self._draw_lines(x, lc, lb)
        else:
            self._draw_bars(x, lc, lb, floor)
        skipped = s.results.skipped_nodes(s.graph)
        bad = [i for i, n in enumerate(self.node_ids) if n in cur and cur[n].status != "ok" and n not in skipped]
        if bad:
            self.plot.addItem(
                pg.ScatterPlotItem(
                    x=x[bad],
                    y=np.full(len(bad), floor + 0.15),
                    symbol="x",
                    size=9,
                    brush=pg.mkBrush("#d81b60"),
                    pen=pg.mkPen("#d81b60"),
                )
            )
        self._y_range = (floor, top)
        self._fit_y()
        self.plot.setXRange(-0.8, len(self.node_ids) - 0.2, padding=0)
        self._name_ticks()
        ruled = sum(1 for n in self.node_ids if s.result is not None and n in s.result.rules)
        n_bad = len(bad)
        self.caption.setText(
            f"{len(self.node_ids)} nodes{' (lines: too many for bars)' if self.as_lines else ''}, {ruled} with rules"
            + (f", {n_bad} cut/zero/NaN" if n_bad else "")
        )
        self._on_selection()

    def _ratio_mode(self) -> bool:
        return METRICS[self.metric.currentText()] == "ratio"

    def _draw_ratio(self) -> None:
        """Per node, |g| of the plan on screen (A) over the pinned plan's (B), log scale: 1e0 where they agree;
        the caption names the least aligned node by the cosine of the two signals."""
        s = self.session
        if s.ab.pinned is None or s.result is None:
            self.caption.setText("pin a result as B (overlay pane) to compare plans node by node")
            self._on_selection()
            return
        ratio = norm_ratio(s.result.stats, s.ab.pinned.result.stats)
        values = np.array([ratio.get(n, math.nan) for n in self.node_ids], dtype=float)
        logs = np.where(np.isfinite(values) & (values > 0), np.log10(np.where(values > 0, values, 1.0)), np.nan)
        x = np.arange(len(self.node_ids), dtype=float)
        ok = np.isfinite(logs)
        bars = pg.BarGraphItem(x=x[ok], y0=0.0, height=logs[ok], width=0.8, brush=_PLAN_BRUSH, pen=pg.mkPen(None))
        self.plot.addItem(bars)  # no legend over the bars: the caption says what A and B are
        self.plot.setLabel("left", "|g| A / B")  # ("A/B norm ratio" was cut to "A/B norm rat")
        self.plot.addItem(pg.InfiniteLine(pos=0.0, angle=0, pen=pg.mkPen("#546e7a", width=1)))
        span = math.ceil(float(np.nanmax(np.abs(logs)))) if ok.any() else 1
        span = max(span, 1)
        self.plot.setYRange(-span - 0.1, span + 0.1, padding=0)  # at least 0.1 .. 10
        step = max(1, span // 3)  # a tick a power of ten (one tick, 1e0, was all a short plot showed)
        self.plot.getAxis("left").setTicks([[(k, f"{10.0**k:g}") for k in range(-span, span + 1, step)], []])
        self.plot.setXRange(-0.8, len(self.node_ids) - 0.2, padding=0)
        self._name_ticks()
        self.as_lines = False
        finite = {n: c for n, c in s.ab.node_cosine.items() if c == c}
        worst = min(finite, key=finite.get) if finite else None
        a, b = s.results.method or s.editor.method_name, s.ab.pinned.method
        if worst:
            aligned = f"; least aligned: {worst} (cosine {finite[worst]:.3f})"
        else:
            aligned = "; node cosines: computing…" if not s.ab.node_cosine else ""
        self.caption.setText(
            f"|g| of A ({a}) over B ({b}): {int((np.abs(logs[ok]) > 0.01).sum())} of {int(ok.sum())} nodes differ"
            + aligned
        )
        self._on_selection()

    def _pixels_per_node(self) -> float:
        return max(1, self.plot.width() - 90) / max(1, len(self.node_ids))

    def _draw_bars(self, x: np.ndarray, lc: np.ndarray, lb: np.ndarray, floor: float) -> None:
        width = 0.4 if self.show_baseline.isChecked() else 0.8
        if self.show_baseline.isChecked():
            ok = np.isfinite(lb)
            base_bars = pg.BarGraphItem(
                x=x[ok] - 0.21, y0=floor, height=lb[ok] - floor, width=width, brush=_BASE_BRUSH, pen=pg.mkPen(None)
            )
            self.plot.addItem(base_bars)
            self.legend.addItem(base_bars, "baseline (no rules)")
        ok = np.isfinite(lc)
        shift = 0.21 if self.show_baseline.isChecked() else 0
        plan_bars = pg.BarGraphItem(
            x=x[ok] + shift, y0=floor, height=lc[ok] - floor, width=width, brush=_PLAN_BRUSH, pen=pg.mkPen(None)
        )
        self.plot.addItem(plan_bars)
        self.legend.addItem(plan_bars, "current plan")

    def _draw_lines(self, x: np.ndarray, lc: np.ndarray, lb: np.ndarray) -> None:
        """Bars thinner than a few pixels alias into blocks that look like differences: two lines instead,
        the plan's drawn over the baseline's, so where they agree only the plan's shows."""
        if self.show_baseline.isChecked():
            base = pg.PlotDataItem(x, lb, pen=pg.mkPen("#9aa5b1", width=3), connect="finite")
            self.plot.addItem(base)
            self.legend.addItem(base, "baseline (no rules)")
        plan = pg.PlotDataItem(x, lc, pen=pg.mkPen("#e8710a", width=1.4), connect="finite")
        self.plot.addItem(plan)
        self.legend.addItem(plan, "current plan")  # short: a legend wider than the plot was cut at its left

    def _on_hover(self, pos: Any) -> None:
        """The node under the mouse, its statistic under the plan and the baseline, as the plot's tooltip."""
        vb = self.plot.getPlotItem().getViewBox()
        if not self.node_ids or not vb.sceneBoundingRect().contains(pos):
            return
        i = int(round(vb.mapSceneToView(pos).x()))
        if not 0 <= i < len(self.node_ids):
            return
        node, key = self.node_ids[i], METRICS[self.metric.currentText()]
        parts = [f"<b>{node}</b>"]
        sources = [
            ("plan", self.session.results.stats("current")),
            ("baseline", self.session.results.stats("baseline")),
        ]
        pinned = self.session.ab.pinned
        if key == "ratio":
            cosine = self.session.ab.node_cosine.get(node)
            parts.append("cosine A·B: " + ("not computed yet" if cosine is None else f"{cosine:.4f}"))
            key = "norm"
            sources = [("A |g|", sources[0][1]), ("B |g|", pinned.result.stats if pinned is not None else {})]
        for label, stats in sources:
            st = stats.get(node)
            value = "none" if st is None else (f"{getattr(st, key):.3g}" if st.status == "ok" else st.status)
            parts.append(f"{label}: {value}")
        self.plot.setToolTip("<br>".join(parts))

    def _fit_y(self) -> None:
        """The bars' range, with headroom above them for the legend, so the legend never covers a bar. On a short
        plot the legend takes one row, and on a very short one it hides (the tooltip says what the colours are):
        headroom for two rows in 70 px squeezed the bars to a sliver or left them under the legend."""
        if self._y_range is None:
            return
        floor, top = self._y_range
        view_px = self.plot.getPlotItem().getViewBox().height()
        rows = len(self.legend.items)
        self.legend.setColumnCount(2 if rows == 2 and view_px < 160 else 1)
        drawn = self.legend.boundingRect().height() if rows else 0.0  # its height as laid out (font, DPI)
        legend_px = drawn + 10 if rows else 0.0
        self.legend.setVisible(rows > 0 and legend_px <= 0.45 * view_px)
        if self.legend.isVisible():
            top += (top - floor) * legend_px / max(view_px - legend_px, 1.0)
        self.plot.setYRange(floor, top, padding=0)

    def _name_ticks(self) -> None:
        """Node names under the bars, one per ~100 px (a 13-character name's width) and centred in their stretch
        (a name at the very first bar was cut by the axis: 24 nodes showed one name)."""
        n = len(self.node_ids)
        step = max(1, math.ceil(n * 100 / max(120, self.plot.width() - 60)))
        ticks = [(i, _short(self.node_ids[i])) for i in range(step // 2, n, step)]
        self.plot.getAxis("bottom").setTicks([ticks, []])

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        if self.node_ids and self.as_lines != (self._pixels_per_node() < MIN_BAR_PIXELS):
            self.refresh()  # bars <-> lines
        if self.node_ids and not self._ratio_mode():
            self._name_ticks()
            self._fit_y()

    def _on_selection(self) -> None:
        s = self.session
        node = s.selected
        if self.selected_line.scene() is not None:
            self.plot.removeItem(self.selected_line)
        if node in self.node_ids:
            self.selected_line.setValue(self.node_ids.index(node))
            self.plot.addItem(self.selected_line)
        self._draw_histogram(node)

    def _hist_ticks(self) -> None:
        """Decade ticks only (log10 units; pyqtgraph's minor log ticks pile up when short), as many as fit 14 px
        apart: a laptop-sized window leaves the histogram ~30 px tall. Redone when it is resized."""
        decades = self._hist_decades
        room = max(1, int(self.hist.getPlotItem().getViewBox().height() // 14))
        step = max(1, int(np.ceil(decades / room)))
        ticks = [(float(k), "1" if k == 0 else f"1e{k}") for k in range(0, decades + 1, step)]
        self.hist.getAxis("left").setTicks([ticks, []])

    def _empty_histogram(self) -> None:
        """No curve: one decade on the axis (pyqtgraph's own log ticks of an empty plot pile up unreadably)."""
        self.hist.clear()
        self._hist_decades = 1
        self._hist_ticks()
        self.hist.setYRange(0.0, 1.0, padding=0.05)
        self.hist.setTitle(None)

    def _draw_histogram(self, node: str | None) -> None:
        self.hist.clear()
        s = self.session
        if s.result is None:
            self._empty_histogram()
            return
        try:
            cur = (
                s.result.signal(node).ravel()
                if node and not s.graph.node(node).is_input
                else s.result.input_grad.ravel()
            )
            base = (
                s.baseline.signal(node).ravel()
                if node and not s.graph.node(node).is_input
                else s.baseline.input_grad.ravel()
            )
        except Exception:  # a node without a captured signal: nothing to show
            return
        both = np.concatenate([cur[np.isfinite(cur)], base[np.isfinite(base)]])
        if both.size == 0:
            return
        lo, hi = float(both.min()), float(both.max())
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        bins = np.linspace(lo, hi, 61)
        top = 1
        for values, color in ((base, "#9aa5b1"), (cur, "#e8710a")):
            counts, edges = np.histogram(values[np.isfinite(values)], bins=bins)
            self.hist.plot(edges, counts + 1, stepMode="center", pen=pg.mkPen(color, width=1.6))
            top = max(top, int(counts.max()) + 1)
        self._hist_decades = max(1, int(np.ceil(np.log10(top))))
        self._hist_ticks()
        self.hist.setYRange(0.0, float(self._hist_decades), padding=0.05)
        self.hist.setTitle(f"<span style='font-size:9pt'>gradient at {node or 'input'}</span>")

    # ------------------------------------------------------------------------------------------- input
    def _on_click(self, event) -> None:
        if not self.node_ids:
            return
        vb = self.plot.getPlotItem().getViewBox()
        if not vb.sceneBoundingRect().contains(event.scenePos()):
            return
        i = int(round(vb.mapSceneToView(event.scenePos()).x()))
        if 0 <= i < len(self.node_ids):
            self.node_clicked.emit(self.node_ids[i])

    def click_node(self, node_id: str) -> None:
        """What a click on ``node_id``'s bar does (used by tests and keyboard navigation)."""
        if node_id in self.node_ids:
            self.node_clicked.emit(node_id)

    # ------------------------------------------------------------------------------------------- export
    def export_image(self, path: str | Path) -> Path:
        """PNG (or SVG when the name ends in .svg) of the flow plot, titled with the model, statistic and plan."""
        path = Path(path)
        item = self.plot.getPlotItem()
        s = self.session
        model = s.graph.model_name if s.graph is not None else "no model"
        plan = "no result" if s.result is None else (s.results.method or s.editor.method_name)
        item.setTitle(f"{model}: {self.metric.currentText()} per node, {plan} vs baseline", size="9pt")
        QCoreApplication.processEvents()  # let the plot make room for the title before it is drawn
        try:
            self._export(path, item)
        finally:
            item.setTitle(None)  # the title is for the file; on screen the pane's header says it
            QCoreApplication.processEvents()
        return path

    def _export(self, path: Path, item: Any) -> None:
        import pyqtgraph.exporters as exporters

        if path.suffix.lower() == ".svg":
            # pyqtgraph's SVGExporter fails on some Qt 6 paths; Qt's own SVG painter draws the widget as is.
            from PySide6.QtCore import QRect, QSize
            from PySide6.QtGui import QPainter
            from PySide6.QtSvg import QSvgGenerator

            gen = QSvgGenerator()
            gen.setFileName(str(path))
            size = self.plot.size()
            gen.setSize(QSize(size.width(), size.height()))
            gen.setViewBox(QRect(0, 0, size.width(), size.height()))
            gen.setTitle("gradscope gradient flow")
            painter = QPainter(gen)
            try:
                self.plot.render(painter)
            finally:
                painter.end()
        else:
            exp = exporters.ImageExporter(item)
            exp.parameters()["width"] = max(800, int(self.plot.width()))
            exp.export(str(path))


def _short(node_id: str, n: int = 13) -> str:
    """Elide in the middle: layer names differ at both ends (conv3_block1_add vs conv3_block2_out)."""
    name = node_id.split("/")[-1]
    if len(name) <= n:
        return name
    head = (n - 1) // 2 + 1
    return name[:head] + "…" + name[-(n - 1 - head) :]
