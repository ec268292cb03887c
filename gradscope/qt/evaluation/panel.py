"""The Evaluation view: score the open model's methods and the plan being edited over a folder of images, or for a
model that reads token ids over a text dataset (ABPC, comprehensiveness, sufficiency, token pointing).

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
    QComboBox,
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
TEXT_METRIC_LABELS = {  # a model that reads token ids: its token maps scored over a text dataset
    "abpc": "ABPC",
    "comprehensiveness": "Comprehensiveness",
    "sufficiency": "Sufficiency",
    "token_pointing": "Token pointing",
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
        self.out.setPlaceholderText("results folder (default: <data>-evaluation beside the data)")
        self.out.setToolTip("Empty: <data>-evaluation beside the images or texts; for the bundled demo ~/gradscope/")
        self.methods = QLineEdit("gradient,random")
        self.methods.setToolTip("Presets, PRESET@NODE, center, random (comma-separated)")
        self.with_plan = QCheckBox('and the plan being edited (named "plan: ..." by its preset or first rule)')
        self.with_plan.setChecked(True)
        self.metrics = {m: QCheckBox(label) for m, label in METRIC_LABELS.items()}
        self.metrics["pointing"].setChecked(True)
        self.metrics["deletion"].setChecked(True)
        self.text_metrics = {m: QCheckBox(label) for m, label in TEXT_METRIC_LABELS.items()}
        for name in ("abpc", "comprehensiveness", "sufficiency"):
            self.text_metrics[name].setChecked(True)
        self.baseline = QComboBox()
        self.baseline.addItems(["zero", "pad", "mask"])
        self.baseline.setToolTip("What replaces a removed token's input embedding: zeros, the pad or the mask token's")
        self.baseline_label = QLabel("removed tokens")
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
        self.tolerance_label = QLabel("hit distance")
        metric_row.addWidget(self.tolerance_label)
        metric_row.addWidget(self.tolerance)
        for box in self.text_metrics.values():
            metric_row.addWidget(box)
        metric_row.addWidget(self.baseline_label)
        metric_row.addWidget(self.baseline)
        metric_row.addStretch(1)
        folder_row.addWidget(QLabel("Results"))
        folder_row.addWidget(self.out, 1)
        method_row = QHBoxLayout()
        method_row.addWidget(self.methods, 1)
        method_row.addWidget(self.with_plan)
        form = QFormLayout()  # three rows: the results below get the room
        self.data_label = QLabel("Images")
        form.addRow(self.data_label, folder_row)
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
        session.document.loaded.connect(lambda graph: self.for_model(graph.token_input is not None))
        self.for_model(False)

    def for_model(self, text: bool) -> None:
        """The image metrics for an image model, the text metrics and their data for a model that reads tokens."""
        self.text = text  # the open model reads token ids: its maps are scored over a text dataset
        for box in self.metrics.values():
            box.setVisible(not text)
        for widget in (self.tolerance_label, self.tolerance):
            widget.setVisible(not text)
        for widget in (*self.text_metrics.values(), self.baseline_label, self.baseline):
            widget.setVisible(text)
        self.data_label.setText("Texts" if text else "Images")
        self.data.setPlaceholderText(
            'a .jsonl file ({"text": ...} a line), a .csv with a text column, or a folder of .txt files'
            if text
            else "a folder of images (masks/<stem>.png for the Pointing Game)"
        )
        self.browser.set_unit("texts" if text else "images")
        self.tabs.setTabText(self.tabs.indexOf(self.browser), "Texts" if text else "Images")

    def choose_folder(self) -> None:
        if self.text:
            path, _ = QFileDialog.getOpenFileName(
                self, "Texts to evaluate on", self.data.text(), "Text datasets (*.jsonl *.csv);;All files (*)"
            )
        else:
            path = QFileDialog.getExistingDirectory(self, "Images to evaluate on", self.data.text())
        if path:
            self.data.setText(path)

    def output_folder(self) -> Path:
        data = Path(self.data.text().strip()).expanduser()
        text = self.out.text().strip()
        if text:
            return Path(text).expanduser()
        from gradscope.core.resources import is_bundled, user_folder

        name = data.stem if data.suffix in (".jsonl", ".csv") else data.name
        if is_bundled(data):  # never into the installed package
            return user_folder() / f"{name}-evaluation"
        return data.parent / f"{name}-evaluation"

    def start(self) -> None:
        data = self.data.text().strip()
        if not data:
            what = "a text dataset" if self.text else "a folder of images"
            self.session.feedback.error("Nothing to evaluate", f"Choose {what} first.")
            return
        boxes = self.text_metrics if self.text else self.metrics
        metrics = [m for m, box in boxes.items() if box.isChecked()]
        options = {"baseline": self.baseline.currentText()} if self.text else {"tolerance": self.tolerance.value()}
        try:
            self.session.evaluations.start(
                data,
                self.output_folder(),
                methods=self.methods.text(),
                metrics=metrics,
                with_plan=self.with_plan.isChecked(),
                **options,
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
        bad = f"; {len(report.bad)} could not be used (bad_data.csv)" if report.bad else ""
        out = self.session.evaluations.out
        where = f" In {out.name}." if out is not None else ""
        self.summary.setText(
            f"{report.images} of {report.total} {report.unit}{state}{bad}. 95 % bootstrap intervals.{where}"
        )
        self.open_button.setEnabled(True)
        self.curves.show_report(report)
        self.browser.show_report(report)

    def open_results(self) -> None:
        out = self.session.evaluations.out
        if out is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(out)))
