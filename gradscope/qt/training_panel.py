"""The Training view: a GradientMonitor log as a node x step heatmap, updating while ``fit`` writes it.

Rows are the model's nodes in graph order, columns the recorded steps, the colour log10 of the chosen statistic
(mean |g| by default) of the signal at each node's output; a cell whose signal had a NaN/Inf is marked with a
red x, a node an alert names with a red box at the step the alert starts. Clicking a cell (or an alert) shows
that step's per-layer flow beside the heatmap (the same rows; flagged nodes red) and the node's histogram at that
step; "Open checkpoint" opens, in the main view, the newest .keras file the training saved before that step.
All reading runs on the worker (``app.models.training_watch.TrainingWatch``); a timer asks it for new records every 2 s.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from gradscope.app.session import Session
from gradscope.render.charts import RED

STATISTICS = {
    "mean |g|": "grad_mean_abs",
    "max |g|": "grad_max_abs",
    "norm": "grad_norm",
    "zero fraction": "grad_zero_fraction",
}
REFRESH_MS = 2000
_MAX_ROW_LABELS = 60  # at most this many node names on the axis: every k-th is shown
_ROW_LABEL_PIXELS = 18  # the height one name needs


#: Behind the heat map, where its cell is transparent: a zero white and a NaN/Inf red, as the HTML report and the
#: notebook draw them (a zero drawn as the lowest level read as the smallest gradient, not as none).
ZERO_RGBA, NONFINITE_RGBA = (255, 255, 255, 255), (*RED, 255)
LEGEND = (
    "white: 0 (no gradient) · red (x): NaN/Inf · red square: where an alert starts · orange dashed line: a loss spike"
)


def heat_values(matrix: np.ndarray, statistic: str) -> tuple[np.ndarray, tuple[float, float]]:
    """What the heatmap draws: log10 of the statistic (zero fraction as is); a zero and a NaN/Inf are NaN, left
    transparent over ``behind_cells``. Returns the values and their (low, high) levels."""
    m = np.asarray(matrix, np.float64)
    if statistic == "grad_zero_fraction":
        values = np.where(np.isfinite(m), m, 0.0)
        return values, (0.0, 1.0)
    good = np.isfinite(m) & (m > 0)
    logs = np.full(m.shape, np.nan)
    logs[good] = np.log10(m[good])
    if not good.any():
        return logs, (0.0, 1.0)
    lo, hi = float(np.nanmin(logs)), float(np.nanmax(logs))
    if hi <= lo:
        hi = lo + 1.0
    return logs, (lo, hi)


def behind_cells(matrix: np.ndarray, statistic: str) -> np.ndarray:
    """(rows, steps, 4) uint8 drawn behind the heat map: white where the statistic is 0, red where it is NaN/Inf,
    transparent elsewhere."""
    m = np.asarray(matrix, np.float64)
    out = np.zeros((*m.shape, 4), np.uint8)
    if statistic != "grad_zero_fraction":
        out[np.isfinite(m) & (m <= 0)] = ZERO_RGBA
    out[~np.isfinite(m)] = NONFINITE_RGBA
    return out


class _Heatmap(pg.ImageItem):
    def __init__(self, on_click: Any) -> None:
        super().__init__()
        self._on_click = on_click

    def mouseClickEvent(self, event: Any) -> None:  # noqa: N802 (pyqtgraph naming)
        if event.button() == Qt.MouseButton.LeftButton:
            pos = event.pos()
            self._on_click(int(math.floor(pos.x())), int(math.floor(pos.y())))
            event.accept()


class TrainingPanel(QWidget):
    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.watch = session.training
        self.open_log: Any = None  # set by the window: opens a folder dialog
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)

        bar = QHBoxLayout()
        self.open_button = QPushButton("Open log…")
        self.open_button.setToolTip("A folder GradientMonitor writes (its log_dir)")
        self.open_button.clicked.connect(lambda: self.open_log() if self.open_log else None)
        self.folder_label = QLabel("No training log. model.fit(..., callbacks=[gradscope.GradientMonitor(DIR)])")
        self.folder_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.alone_note = QLabel(
            "The log alone: its model is not the one open. File ▸ Open model (its .keras file) shows the graph and "
            "maps beside it."
        )
        self.alone_note.setWordWrap(True)
        self.alone_note.setStyleSheet("color:#607d8b")
        self.alone_note.hide()
        self.statistic = QComboBox()
        self.statistic.addItems(list(STATISTICS))
        self.statistic.setToolTip("The statistic of each node's signal the heatmap shows (log10)")
        self.statistic.currentIndexChanged.connect(lambda *_: self._draw())
        self.live = QCheckBox("Live")
        self.live.setChecked(True)
        self.live.setToolTip(f"Read new records every {REFRESH_MS / 1000:g} s while the training writes them")
        bar.addWidget(self.open_button)
        bar.addWidget(self.folder_label, 1)
        bar.addWidget(self.statistic)
        bar.addWidget(self.live)
        lay.addLayout(bar)
        lay.addWidget(self.alone_note)

        pg.setConfigOptions(antialias=True, background="w", foreground="#37474f")
        self.heat_plot = pg.PlotWidget()
        self.heat_plot.setObjectName("training_heatmap")
        self.heat_plot.invertY(True)
        self.heat_plot.setLabel("bottom", "step")
        self.heat_plot.setMouseEnabled(x=True, y=True)
        self.heat = _Heatmap(self._cell_clicked)
        self.heat.setColorMap(pg.colormap.get("viridis"))
        self.no_value = pg.ImageItem()  # behind the heatmap, where its cell is transparent: 0 white, NaN/Inf red
        self.no_value.setZValue(-10)
        self.heat_plot.addItem(self.no_value)
        self.heat_plot.addItem(self.heat)
        self.colorbar = pg.ColorBarItem(colorMap=self.heat.getColorMap(), interactive=False, width=12)
        self.colorbar.setImageItem(self.heat, insert_in=self.heat_plot.getPlotItem())  # what a colour means
        self.nan_marks = pg.ScatterPlotItem(symbol="x", size=9, pen=pg.mkPen("#d50000", width=2), brush=None)
        self.alert_marks = pg.ScatterPlotItem(symbol="s", size=13, pen=pg.mkPen("#d50000", width=2), brush=None)
        self.cursor = pg.ScatterPlotItem(symbol="s", size=15, pen=pg.mkPen("#ffffff", width=2), brush=None)
        for item in (self.nan_marks, self.alert_marks, self.cursor):
            item.sigClicked.connect(self._mark_clicked)  # a click on a red x is its cell's (the x took it: lost)
            self.heat_plot.addItem(item)
        self.spike_lines: list[pg.InfiniteLine] = []  # loss spikes: a dashed line at the step, between records

        self.flow_plot = pg.PlotWidget()
        self.flow_plot.setObjectName("training_flow")
        self.flow_plot.invertY(True)  # linking the range does not link the direction
        self.flow_plot.setYLink(self.heat_plot)
        self.flow_plot.setLabel("bottom", "mean |g| at the step (log10)")
        self.flow_plot.getAxis("left").setStyle(showValues=False)
        self.flow_plot.setMaximumWidth(260)

        self.alert_list = QListWidget()
        self.alert_list.setObjectName("training_alerts")
        self.alert_list.setWordWrap(True)
        self.alert_list.itemClicked.connect(self._alert_clicked)
        self.hist_plot = pg.PlotWidget()
        self.hist_plot.setObjectName("training_histogram")
        self.hist_plot.setLabel("bottom", "signal value")
        self.hist_plot.setLabel("left", "count")
        self.hist_note = QLabel(self.hist_plot)  # over an empty plot: why it is empty (its 0-1 axes said nothing)
        self.hist_note.setWordWrap(True)
        self.hist_note.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.hist_note.setStyleSheet("color:#546e7a; background: rgba(255, 255, 255, 200)")
        self.hist_note.hide()
        self.cell_label = QLabel("Click a cell: that step's per-layer flow and the node's histogram.")
        self.cell_label.setWordWrap(True)
        self.checkpoint_button = QPushButton("Open checkpoint")
        self.checkpoint_button.setEnabled(False)
        self.checkpoint_button.setToolTip("Open the model as saved before this step (a .keras file in the log folder)")
        self.checkpoint_button.clicked.connect(self._open_checkpoint)

        side = QWidget()
        side_lay = QVBoxLayout(side)
        side_lay.setContentsMargins(0, 0, 0, 0)
        side_lay.addWidget(QLabel("Alerts"))
        side_lay.addWidget(self.alert_list, 2)
        side_lay.addWidget(self.cell_label)
        side_lay.addWidget(self.hist_plot, 2)
        side_lay.addWidget(self.checkpoint_button)
        self.legend = QLabel(LEGEND)
        self.legend.setWordWrap(True)
        self.legend.setStyleSheet("color:#546e7a")
        heat = QWidget()
        heat_lay = QVBoxLayout(heat)
        heat_lay.setContentsMargins(0, 0, 0, 0)
        heat_lay.addWidget(self.heat_plot, 1)
        heat_lay.addWidget(self.legend)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(heat)
        split.addWidget(self.flow_plot)
        split.addWidget(side)
        split.setSizes([620, 220, 360])
        split.setStretchFactor(0, 1)
        lay.addWidget(split, 1)

        self.timer = QTimer(self)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self._tick)
        self.timer.start()
        self.watch.changed.connect(lambda *_: self._draw())
        self.watch.selected.connect(lambda *_: self._show_cell())

    # ------------------------------------------------------------------------------------------- drawing
    def _tick(self) -> None:
        if self.live.isChecked() and self.isVisible():
            self.watch.refresh()

    def _draw(self) -> None:
        log = self.watch.log
        if log is None:
            return
        self.folder_label.setText(
            f"{log.folder} — {log.model_name}, {len(log.nodes)} nodes, {len(log.records)} records "
            f"(every {log.every} steps)"
        )
        statistic = STATISTICS[self.statistic.currentText()]
        matrix = log.matrix(statistic)
        values, levels = heat_values(matrix, statistic)
        n_nodes, n_steps = values.shape
        if n_steps:
            self.heat.setImage(values.T, levels=levels, autoLevels=False)  # pyqtgraph: image[x, y]
            self.heat.setRect(0, 0, n_steps, n_nodes)
            self.no_value.setImage(behind_cells(matrix, statistic).transpose(1, 0, 2), autoLevels=False)
            self.no_value.setRect(0, 0, n_steps, n_nodes)
            self.colorbar.setLevels(levels)
            name = self.statistic.currentText()
            self.colorbar.axis.setLabel(name if statistic == "grad_zero_fraction" else f"log10 {name}")
        self._row_ticks()
        steps = log.steps
        every_step = max(1, math.ceil(len(steps) / 12))
        self.heat_plot.getAxis("bottom").setTicks(
            [[(j + 0.5, str(s)) for j, s in enumerate(steps) if j % every_step == 0], []]
        )
        bad = (log.matrix("grad_nan") + log.matrix("grad_inf") + log.matrix("value_nonfinite", 0.0)) > 0
        ys, xs = np.nonzero(bad)
        self.nan_marks.setData(x=xs + 0.5, y=ys + 0.5)
        column = {s: j for j, s in enumerate(steps)}
        index = {n.id: i for i, n in enumerate(log.nodes)}
        marks = [
            (column[a.first_step] + 0.5, index[a.node] + 0.5)
            for a in self.watch.alerts
            if a.node in index and a.first_step in column
        ]
        self.alert_marks.setData(x=[m[0] for m in marks], y=[m[1] for m in marks])
        self._mark_spikes(steps)
        self.alert_list.clear()
        for a in self.watch.alerts:
            where = f" at {a.node}" if a.node else ""
            item = QListWidgetItem(f"[{a.kind}] step {a.first_step}{where}: {a.detail}")
            item.setData(Qt.ItemDataRole.UserRole, (a.first_step, a.node))
            if a.kind == "nonfinite":
                item.setForeground(pg.mkColor("#c62828"))
            elif a.kind == "spike":
                item.setForeground(pg.mkColor("#e65100"))
            self.alert_list.addItem(item)
        if not self.watch.alerts and log.records:
            self.alert_list.addItem("No alerts: every record is finite; no layer vanishes, explodes or dies.")

    def _mark_spikes(self, steps: list[int]) -> None:
        """A dashed orange line per loss spike, where its step falls between the recorded columns."""
        for line in self.spike_lines:
            self.heat_plot.removeItem(line)
        self.spike_lines = []
        if not steps:
            return
        for a in self.watch.alerts:
            if a.kind != "spike":
                continue
            x = float(np.interp(a.first_step, steps, np.arange(len(steps)))) + 0.5
            line = pg.InfiniteLine(pos=x, angle=90, pen=pg.mkPen("#e65100", width=2, style=Qt.PenStyle.DashLine))
            line.setToolTip(f"loss spike at step {a.first_step}: {a.detail}")
            self.heat_plot.addItem(line)
            self.spike_lines.append(line)

    def _row_ticks(self) -> None:
        """Node names on the left, as many as fit without overlapping (every k-th row)."""
        log = self.watch.log
        if log is None:
            return
        rows = max(1, len(log.nodes))
        fit = max(2, min(_MAX_ROW_LABELS, self.heat_plot.height() // _ROW_LABEL_PIXELS))
        every = max(1, math.ceil(rows / fit))
        self.heat_plot.getAxis("left").setTicks(
            [[(i + 0.5, n.id) for i, n in enumerate(log.nodes) if i % every == 0], []]
        )

    def resizeEvent(self, event: Any) -> None:  # noqa: N802 (Qt naming)
        super().resizeEvent(event)
        self._row_ticks()

    def _cell_clicked(self, column: int, row: int) -> None:
        log = self.watch.log
        if log is None or not (0 <= column < len(log.records)) or not (0 <= row < len(log.nodes)):
            return
        self.watch.select(log.records[column].step, log.nodes[row].id)

    def _mark_clicked(self, _item: Any, points: Any, _event: Any = None) -> None:
        if len(points):
            at = points[0].pos()
            self._cell_clicked(int(math.floor(at.x())), int(math.floor(at.y())))

    def _alert_clicked(self, item: QListWidgetItem) -> None:
        data = item.data(Qt.ItemDataRole.UserRole)
        log = self.watch.log
        if data and log is not None and log.records:
            step, node = data
            if step not in log.steps:  # a spike between records: the record nearest it
                step = min(log.steps, key=lambda s: abs(s - step))
            self.watch.select(step, node)

    def _show_cell(self) -> None:
        watch, log = self.watch, self.watch.log
        flow, step, node = watch.flow, watch.step, watch.node
        if log is None or flow is None or step is None:
            return
        column = log.steps.index(step) if step in log.steps else None
        index = {n.id: i for i, n in enumerate(log.nodes)}
        if column is not None and node in index:
            self.cursor.setData(x=[column + 0.5], y=[index[node] + 0.5])
        self.flow_plot.clear()
        values = [r.grad_mean_abs for r in flow.rows]
        finite = [math.log10(v) for v in values if v and math.isfinite(v) and v > 0]
        floor = math.floor(min(finite)) - 1 if finite else -1
        for r in flow.rows:
            v = r.grad_mean_abs
            if not (v and math.isfinite(v) and v > 0):
                continue
            color = "#d84315" if r.flags else "#5c6bc0"
            bar = pg.BarGraphItem(
                x0=[floor], y=[index[r.node] + 0.5], height=[0.8], width=[math.log10(v) - floor], brush=color
            )
            self.flow_plot.addItem(bar)
        row = next((r for r in flow.rows if r.node == node), None)
        text = f"Step {step}, loss {flow.loss_value:.4g}."
        if row is not None:
            text += (
                f" {node}: mean|g| {row.grad_mean_abs:.3g}, max|g| {row.grad_max_abs:.3g}, "
                f"zero {row.grad_zero_fraction:.0%}" + (f"; {' '.join(row.flags)}." if row.flags else ".")
            )
        self.hist_plot.clear()
        hist = watch.histogram
        why = ""
        if hist is not None and len(hist) and hist[:, 2].sum() > 0:
            self.hist_plot.addItem(
                pg.BarGraphItem(x0=hist[:, 0], x1=hist[:, 1], height=hist[:, 2], y0=0, brush="#5c6bc0")
            )
        elif hist is not None and len(hist):
            why = f"The histogram of {node} is empty: its signal has NaN/Inf at this step."
        elif node:
            why = (
                f"No histogram of {node} at step {step}: histograms are written every few records "
                "(GradientMonitor's histograms=N)."
            )
        else:
            why = "Click a cell of the heatmap: that node's histogram at that step."
        text += f" {why}" if why and node else ""
        self._show_hist_note(why)
        checkpoint = watch.checkpoint_for(step)
        self.checkpoint_button.setEnabled(checkpoint is not None)
        self.checkpoint_button.setText(
            f"Open checkpoint {checkpoint.path.rsplit('/', 1)[-1]}" if checkpoint else "No checkpoint before this step"
        )
        self._checkpoint = checkpoint
        self.cell_label.setText(text)

    def _show_hist_note(self, text: str) -> None:
        self.hist_note.setText(text)
        self.hist_note.setVisible(bool(text))
        if text:
            self.hist_note.setGeometry(self.hist_plot.rect().adjusted(40, 10, -10, -40))
            self.hist_note.raise_()

    def _open_checkpoint(self) -> None:
        checkpoint = getattr(self, "_checkpoint", None)
        if checkpoint is not None:
            self.session.open_model(checkpoint.path)
