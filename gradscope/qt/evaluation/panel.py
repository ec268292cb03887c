"""The Evaluation view: score the open model's methods and the plan being edited over a folder of images.

What it shows is ``session.evaluations``' report (the same as ``results.csv`` in the output folder); the run is a
worker job (progress in the status bar, Run > Cancel stops it after the batch in flight).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from gradscope.qt.evaluation.browser import CurvesPlot, ImageBrowser

METRIC_LABELS = {
    "pointing": "Pointing Game",
    "deletion": "Deletion",
    "insertion": "Insertion",
    "mufidelity": "MuFidelity",
}


class EvaluationPanel(QWidget):
    def __init__(self, session: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.data = QLineEdit()
        self.data.setPlaceholderText("a folder of images (masks/<stem>.png for the Pointing Game)")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self.choose_folder)
        self.out = QLineEdit()
        self.out.setPlaceholderText("results folder (default: <images>-evaluation beside the images)")
        self.out.setToolTip("Empty: <images>-evaluation beside the images; for the bundled demo images ~/gradscope/")
        self.methods = QLineEdit("gradient,random")
        self.methods.setToolTip("Presets, PRESET@NODE, center, random (comma-separated)")
        self.with_plan = QCheckBox('and the plan being edited (named "plan: ..." by its preset or first rule)')
        self.with_plan.setChecked(True)
        self.metrics = {m: QCheckBox(label) for m, label in METRIC_LABELS.items()}
        self.metrics["pointing"].setChecked(True)
        self.metrics["deletion"].setChecked(True)
        self.tolerance = QDoubleSpinBox()
        self.tolerance.setRange(0.5, 500.0)
        self.tolerance.setValue(15.0)
        self.tolerance.setSuffix(" px")
        self.tolerance.setToolTip("Pointing Game: a hit lies this close to the class mask (15 px at ~224 px images)")
        self.run_button = QPushButton("Evaluate")
        self.run_button.setToolTip("Score every method over the folder (a second run with the same folders resumes)")
        self.run_button.clicked.connect(self.start)
        self.open_button = QPushButton("Open results folder")
        self.open_button.setEnabled(False)
        self.open_button.clicked.connect(self.open_results)
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.table = QTableWidget(0, 0)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)

        folder_row = QHBoxLayout()
        folder_row.addWidget(self.data, 1)
        folder_row.addWidget(browse)
        metric_row = QHBoxLayout()
        for box in self.metrics.values():
            metric_row.addWidget(box)
        metric_row.addWidget(QLabel("hit distance"))
        metric_row.addWidget(self.tolerance)
        metric_row.addStretch(1)
        folder_row.addWidget(QLabel("Results"))
        folder_row.addWidget(self.out, 1)
        method_row = QHBoxLayout()
        method_row.addWidget(self.methods, 1)
        method_row.addWidget(self.with_plan)
        form = QFormLayout()  # three rows: the results below get the room
        form.addRow("Images", folder_row)
        form.addRow("Methods", method_row)
        form.addRow("Metrics", metric_row)
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.open_button)
        buttons.addWidget(self.summary, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        self.curves = CurvesPlot()
        self.browser = ImageBrowser(session)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.table, "Scores")
        self.tabs.addTab(self.curves, "Curves")
        self.tabs.addTab(self.browser, "Images")
        layout.addWidget(self.tabs, 1)
        session.evaluations.finished.connect(self.show_report)

    def choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Images to evaluate on", self.data.text())
        if path:
            self.data.setText(path)

    def output_folder(self) -> Path:
        data = Path(self.data.text().strip()).expanduser()
        text = self.out.text().strip()
        if text:
            return Path(text).expanduser()
        from gradscope.core.resources import is_bundled, user_folder

        if is_bundled(data):  # never into the installed package
            return user_folder() / f"{data.name}-evaluation"
        return data.parent / f"{data.name}-evaluation"

    def start(self) -> None:
        data = self.data.text().strip()
        if not data:
            self.session.feedback.error("Nothing to evaluate", "Choose a folder of images first.")
            return
        metrics = [m for m, box in self.metrics.items() if box.isChecked()]
        try:
            self.session.evaluations.start(
                data,
                self.output_folder(),
                methods=self.methods.text(),
                metrics=metrics,
                with_plan=self.with_plan.isChecked(),
                tolerance=self.tolerance.value(),
            )
        except Exception as exc:  # a bad method name, no model: one message, never a crash
            self.session.feedback.error("Cannot evaluate", str(exc), exc)

    def show_report(self, report: Any) -> None:
        methods, metrics = report.methods, report.metrics
        self.table.setRowCount(len(methods))
        self.table.setColumnCount(len(metrics))
        self.table.setVerticalHeaderLabels(methods)
        self.table.setHorizontalHeaderLabels([m.replace("_", " ") for m in metrics])
        cells = {(r["method"], r["metric"]): r for r in report.table}
        for i, method in enumerate(methods):
            for j, metric in enumerate(metrics):
                row = cells.get((method, metric))
                text = "-"
                if row is not None and row["value"] is not None:
                    text = f"{row['value']:.3f}"
                    if row["ci_low"] is not None:
                        text += f"  [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
                self.table.setItem(i, j, QTableWidgetItem(text))
        state = "" if report.complete else " — stopped: Evaluate again to resume"
        bad = f"; {len(report.bad)} image(s) could not be used (bad_data.csv)" if report.bad else ""
        out = self.session.evaluations.out
        where = f" In {out.name}." if out is not None else ""
        self.summary.setText(f"{report.images} of {report.total} images{state}{bad}. 95 % bootstrap intervals.{where}")
        self.open_button.setEnabled(True)
        self.curves.show_report(report)
        self.browser.show_report(report)

    def open_results(self) -> None:
        out = self.session.evaluations.out
        if out is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(out)))
