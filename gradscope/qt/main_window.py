"""The main window: graph (centre), inspector + rule editor (right), overlay and gradient flow (bottom), and a
diagnostics dock (where gradients stop) below everything.

It only wires widgets to the Session. TensorFlow work happens in Session jobs on the worker thread; this module
never imports TensorFlow.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QFontDatabase
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QDockWidget,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QVBoxLayout,
)

from gradscope.app.files.session_files import SESSION_SUFFIX, session_code_files
from gradscope.app.session import Session
from gradscope.core.errors import CustomObjectError, UnsafeModelError
from gradscope.qt import gui_gc
from gradscope.qt.consent_dialogs import ask_custom_objects, ask_unsafe
from gradscope.qt.diagnostics_panel import DiagnosticsPanel
from gradscope.qt.evaluation.panel import EvaluationPanel
from gradscope.qt.flow_plot import FlowPlot
from gradscope.qt.graph.pane import GraphPane
from gradscope.qt.inspector import InspectorWidget
from gradscope.qt.map.view import OverlayView
from gradscope.qt.menus import build_menus
from gradscope.qt.patching.panel import PatchingPanel
from gradscope.qt.reflow import VerticalScroll
from gradscope.qt.tokens_dialog import TypeTokensDialog
from gradscope.qt.training_panel import TrainingPanel
from gradscope.qt.wheel_guard import WheelOnlyWhenFocused
from gradscope.qt.worker import QtExecutor

MODEL_FILTER = "Keras models (*.keras *.h5 *.hdf5)"
IMAGE_FILTER = (
    "Inputs (*.png *.jpg *.jpeg *.bmp *.webp *.tif *.tiff *.npy *.npz *.csv *.txt *.json);;"
    "Images (*.png *.jpg *.jpeg *.bmp *.webp *.tif *.tiff);;Arrays (*.npy *.npz);;A table row (*.csv);;"
    "Token ids (*.txt *.json)"
)
VOCABULARY_FILTER = "Vocabularies (*.txt *.json)"
CUSTOM_OBJECTS_FILTER = "Python files (*.py)"
MODEL_SUFFIXES = (".keras", ".h5", ".hdf5")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
_MAX_RECENT = 8


#: px the central panes need to stay readable when a bottom dock opens: the graph's two tool rows and ~200 px of
#: graph, the flow plot's 120 px and the splitter.
CENTRAL_MIN = 400
#: px each dock's contents need (the evaluation: its table, curves and a row of maps), and its share of the height.
DOCK_MIN = {"diagnostics_dock": 180, "training_dock": 300, "evaluation_dock": 380, "patching_dock": 320}
DOCK_SHARE = {"diagnostics_dock": 0.3, "training_dock": 0.45, "evaluation_dock": 0.6, "patching_dock": 0.55}


class MainWindow(QMainWindow):
    #: (title, message): every error the user is shown (tests listen here instead of clicking dialogs).
    error_shown = Signal(str, str)

    def __init__(
        self,
        session: Session | None = None,
        *,
        settings: QSettings | None = None,
        modal_errors: bool = True,
    ) -> None:
        super().__init__()
        gui_gc.start()  # cyclic garbage is collected on this thread only while the window lives (see gui_gc)
        self._gc_started = True
        self.session = session or Session(QtExecutor())
        self.settings = settings or QSettings("gradscope", "gradscope")
        self.modal_errors = modal_errors
        self._errors_shown = 0  # errors shown so far (when_idle: a run that met one has no result to wait for)
        self._chosen_dir: str | None = None  # where this window's last file was chosen (dialogs start there)
        #: Called with (path, message) for a model that needs unsafe loading; returns True to open anyway.
        self.confirm_unsafe = lambda path, message: self.modal_errors and ask_unsafe(self, message)
        #: Called with (model path, message) when a model needs custom objects; returns the .py file that
        #: defines them (the load is retried with it), or None to give up.
        self.choose_custom_objects = lambda path, message: (
            ask_custom_objects(self, path, message, CUSTOM_OBJECTS_FILTER) if self.modal_errors else None
        )
        self.setWindowTitle("gradscope")
        self.setAcceptDrops(True)
        self._wheel_guard = WheelOnlyWhenFocused(self)
        QApplication.instance().installEventFilter(self._wheel_guard)
        self.resize(1560, 960)
        self._build_widgets()
        build_menus(self)
        self._build_status_bar()
        self._connect_session()
        self.session.catalog.start()

    # ------------------------------------------------------------------------------------------- layout
    def _bottom_dock(self, title: str, name: str, widget: Any) -> QDockWidget:
        """A hidden dock at the bottom (movable to the right) holding ``widget``; its View menu entry shows it,
        placed by ``place_dock`` however it is opened."""
        dock = QDockWidget(title, self)
        dock.setObjectName(name)  # saveState() finds it by name
        dock.setWidget(widget)
        dock.setAllowedAreas(Qt.DockWidgetArea.BottomDockWidgetArea | Qt.DockWidgetArea.RightDockWidgetArea)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, dock)
        dock.hide()
        dock.visibilityChanged.connect(lambda shown: shown and QTimer.singleShot(0, lambda: self.place_dock(dock)))
        return dock

    def place_dock(self, dock: QDockWidget) -> None:
        """A bottom dock just opened takes its share of the height, but never the room the graph, the flow plot
        and the map need (``CENTRAL_MIN``: the Diagnostics dock left the graph ~110 px at 1024x640, the
        Evaluation dock only its legend); where the window is too short for both, it opens as a window of its
        own over the map and inspector, the graph left in sight (a cut path it draws red stays visible)."""
        if dock.isFloating() or not dock.isVisible() or not self.centralWidget().isVisible():
            return  # the user's own placement, or a training log alone (it has the window)
        if dock is self.training_dock and self._log_opening:
            return  # its log still loading: whether it has the window alone is not known yet (it was floated)
        if self.dockWidgetArea(dock) != Qt.DockWidgetArea.BottomDockWidgetArea:
            return
        name = dock.objectName()
        avail = self.height() - self.menuBar().height() - self.statusBar().height()
        room = avail - CENTRAL_MIN
        least = DOCK_MIN.get(name, 180)
        if room >= least:
            height = min(max(int(avail * DOCK_SHARE.get(name, 0.3)), least), room)
            self.resizeDocks([dock], [height], Qt.Orientation.Vertical)
            QTimer.singleShot(0, self._favour_graph)
            return
        dock.setFloating(True)
        graph_right = self.main_split.widget(0).mapTo(self, self.main_split.widget(0).rect().topRight()).x()
        width = max(self.width() - graph_right, min(self.width(), 700))
        top_left = self.mapToGlobal(self.rect().topLeft())
        dock.setGeometry(top_left.x() + self.width() - width, top_left.y() + 40, width, max(least, int(avail * 0.8)))

    def _build_widgets(self) -> None:
        s = self.session
        self.inspector = InspectorWidget(s)
        self.overlay = OverlayView(s)
        self.flow = FlowPlot(s)
        self.diagnostics = DiagnosticsPanel(s)
        self.diagnostics_dock = self._bottom_dock(
            "Diagnostics: where gradients stop", "diagnostics_dock", self.diagnostics
        )
        self.training = TrainingPanel(s)
        self.training.open_log = self.open_training_log_dialog
        self.training_dock = self._bottom_dock("Training: gradient flow over steps", "training_dock", self.training)
        s.training.changed.connect(self._on_training_log)
        self._log_opening = False  # a log being read: its dock is placed when it is (see place_dock)
        self.training_dock.visibilityChanged.connect(self._on_training_dock_shown)
        self.evaluation = EvaluationPanel(s)
        self.evaluation_dock = self._bottom_dock(
            "Evaluation: methods scored over a dataset", "evaluation_dock", self.evaluation
        )
        self.patching = PatchingPanel(s)
        self.patching_dock = self._bottom_dock("Patching: clean vs corrupted input", "patching_dock", self.patching)

        self.graph_pane = GraphPane(s, self.diagnose)
        self.graph_view = self.graph_pane.view
        self.color_by = self.graph_pane.color_by

        # three columns: the graph over the gradient flow (both per node), the map (what the user came for: the
        # tallest pane), the inspector and rule editor
        overlay_scroll = self.overlay_scroll = VerticalScroll(self.overlay)  # a short window scrolls the controls
        overlay_scroll.setObjectName("overlay_scroll")
        overlay_scroll.setMinimumWidth(300)
        left = QSplitter(Qt.Orientation.Vertical)
        self.graph_pane.setMinimumHeight(150)  # whatever docks open, the graph stays usable
        self.flow.setMinimumHeight(120)
        left.addWidget(self.graph_pane)
        left.addWidget(self.flow)
        left.setSizes([600, 300])
        left.setStretchFactor(0, 2)  # a dock that shortens the column takes from both (from the graph alone, it
        left.setStretchFactor(1, 1)  # left the graph 76 px at 1024x640)
        self.left_split = left
        self._split_placed = False
        scroll = QScrollArea()
        scroll.setWidget(self.inspector)
        scroll.setWidgetResizable(True)
        scroll.setMinimumWidth(300)
        main = QSplitter(Qt.Orientation.Horizontal)
        main.addWidget(left)
        main.addWidget(overlay_scroll)
        main.addWidget(scroll)
        main.setChildrenCollapsible(False)
        main.setStretchFactor(0, 2)
        main.setStretchFactor(1, 3)  # a wider window widens the map most
        main.setStretchFactor(2, 0)
        self.main_split = main
        self._columns_moved = False  # the user dragged a divider: a resize keeps their proportions
        for split in (main, left):
            split.splitterMoved.connect(lambda *_: setattr(self, "_columns_moved", True))
        self.setCentralWidget(main)
        self.overlay.panels_box.set_shown(tuple(_as_list(self.settings.value("map_panels", []))))
        self.overlay.panels_box.shown_changed.connect(lambda names: self.settings.setValue("map_panels", list(names)))
        self.flow.node_clicked.connect(self.session.selection.select)

    def showEvent(self, event) -> None:  # noqa: N802
        super().showEvent(event)
        if not self._split_placed:  # once, at the first show: the columns in proportion to the window
            self._split_placed = True
            self.place_columns()

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        if self._split_placed and not self._columns_moved:
            self.place_columns()

    def place_columns(self) -> None:
        """The inspector as wide as its controls need (300-420 px), of the rest 40 % for the graph and flow,
        60 % for the map; the flow a third of its column's height."""
        total = sum(self.main_split.sizes()) or self.width()
        inspector = min(max(int(total * 0.24), 300), 420)
        graph = max(int((total - inspector) * 0.4), 200)
        self.main_split.setSizes([graph, total - inspector - graph, inspector])
        height = sum(self.left_split.sizes())
        self.left_split.setSizes([height - height // 3, height // 3])

    def _favour_graph(self) -> None:
        """A short left column gives the flow plot its least height (120 px) and the graph the rest."""
        height = sum(self.left_split.sizes())
        if height < 560 and not self._columns_moved:
            least = self.flow.minimumHeight()
            self.left_split.setSizes([height - least, least])

    def _build_status_bar(self) -> None:
        sb = self.statusBar()
        self.status_label = QLabel("Ready")
        self._last_status, self._showing_busy = "Ready", False  # what to show again when busy work ends
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)
        self.progress.setFixedWidth(140)
        self.progress.setVisible(False)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Cancel the running work (Esc)")
        self.cancel_button.setVisible(False)
        self.cancel_button.clicked.connect(self.session.cancel)
        sb.addWidget(self.status_label, 1)
        sb.addPermanentWidget(self.progress)
        sb.addPermanentWidget(self.cancel_button)

    def _connect_session(self) -> None:
        s = self.session
        s.document.loaded.connect(self._on_model_loaded)
        s.editor.changed.connect(self._on_plan_changed)
        s.jobs.busy_changed.connect(self._on_busy)
        self._elapsed_timer = QTimer(self)  # elapsed time of long work, in the status bar
        self._elapsed_timer.timeout.connect(self._show_elapsed)
        s.feedback.status_changed.connect(self._on_status)
        s.feedback.error_raised.connect(self._on_error)
        s.fed.changed.connect(self._update_title)
        s.reports.diagnosis_changed.connect(self._on_diagnosis)
        s.reports.sanity_ready.connect(self._show_sanity)
        for sig in (
            s.document.loaded,
            s.results.changed,
            s.editor.changed,
            s.selection.changed,
            s.viewing.changed,
            s.reports.diagnosis_changed,
        ):
            sig.on_error = self._on_subscriber_error

    # ------------------------------------------------------------------------------------------- session events
    def _on_training_log(self, log: Any) -> None:
        """A log of another model (or with none open) takes the whole window: graph, map and inspector would
        describe a model the log is not about. Opening a model, or closing the view, brings them back."""
        self._log_opening = False
        self.training_dock.show()
        graph = self.session.graph
        self._show_model_panes(graph is not None and graph.model_name == log.model_name)
        QTimer.singleShot(0, lambda: self.place_dock(self.training_dock))  # now that the panes' fate is known

    def _on_training_dock_shown(self, shown: bool) -> None:
        if not shown:  # closed: the model's panes come back, and a log that failed to open no longer waits
            self._show_model_panes(True)
            self._log_opening = False

    def _show_model_panes(self, shown: bool) -> None:
        central = self.centralWidget()
        if central.isVisibleTo(self) != shown:
            central.setVisible(shown)
            self.training.alone_note.setVisible(not shown)

    def _on_model_loaded(self, graph: Any) -> None:
        self._show_model_panes(True)  # the user chose a model: show it (beside a log, if one is open)
        path = self.session.document.path
        if path:
            self._add_recent(path)
        self._update_title()

    def _on_plan_changed(self, plan: Any) -> None:
        self.undo_action.setEnabled(self.session.editor.can_undo)
        self.redo_action.setEnabled(self.session.editor.can_redo)

    def _on_diagnosis(self, report: Any) -> None:
        self.graph_pane.show_diagnosis(report)
        if report is not None:
            self._show_diagnostics_dock()

    def _show_sanity(self, report: Any) -> None:
        """The sanity report as monospace text (copyable), non-modal so the map stays usable beside it."""
        dialog = QDialog(self)
        dialog.setObjectName("sanity_dialog")
        dialog.setWindowTitle(f"Sanity checks: {report.method}")
        report_text = report.to_text()
        text = QPlainTextEdit(report_text)
        text.setReadOnly(True)
        text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)  # a wrapped "<- not conserved" broke the table
        layout = QVBoxLayout(dialog)
        layout.addWidget(text)
        widest = max((text.fontMetrics().horizontalAdvance(line) for line in report_text.splitlines()), default=0)
        dialog.resize(min(widest + 60, max(self.width() - 40, 400)), 420)  # the table's width, within the window
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.sanity_dialog = dialog
        dialog.show()

    def diagnose(self) -> None:
        """Show the diagnostics panel and run the path diagnostics on the worker."""
        self._show_diagnostics_dock()
        self.diagnostics_dock.raise_()
        self.diagnostics.run()

    def _show_diagnostics_dock(self) -> None:
        if not self.diagnostics_dock.isVisible():
            self.diagnostics_dock.show()  # placed by place_dock

    def _on_busy(self, label: str | None) -> None:
        self.progress.setVisible(label is not None)
        self.cancel_button.setVisible(label is not None)
        if label is not None:
            self.status_label.setText(label)
            self._elapsed_timer.start(250)
        else:
            self._elapsed_timer.stop()
            if self._showing_busy:  # work ended without a message of its own: no stale "Laying out..." stays
                self.status_label.setText(self._last_status)
        self._showing_busy = label is not None

    def _show_elapsed(self) -> None:
        label = self.session.jobs.busy
        if label is not None:
            self.status_label.setText(f"{label}  {time.monotonic() - self.session.jobs.busy_since:.1f} s")

    def _on_status(self, message: str) -> None:
        self.status_label.setText(message)
        self._last_status, self._showing_busy = message, False

    def _on_subscriber_error(self, exc: BaseException) -> None:
        self._on_error("Display error", f"{type(exc).__name__}: {exc}", exc)

    def _on_error(self, title: str, message: str, exc: BaseException | None) -> None:
        self._errors_shown += 1
        self._on_status(f"{title}: {message.splitlines()[0]}")
        request = self.session.document.load_request
        if isinstance(exc, UnsafeModelError) and request:
            self.error_shown.emit(title, message)
            if self.confirm_unsafe(request["path"], message):
                self.session.open_model(
                    request["path"], safe_mode=False, custom_objects_file=request["custom_objects_file"]
                )
            return
        if isinstance(exc, CustomObjectError) and request:
            self.error_shown.emit(title, message)
            chosen = self.choose_custom_objects(request["path"], message)
            if chosen:
                self._remember_dir(chosen)
                self.session.open_model(request["path"], safe_mode=request["safe_mode"], custom_objects_file=chosen)
            return
        self.error_shown.emit(title, message)
        if self.modal_errors:
            QMessageBox.warning(self, title, message)

    # ------------------------------------------------------------------------------------------- files
    def open_model(self, path: str, *, safe_mode: bool = True, custom_objects_file: str | None = None) -> None:
        self.session.open_model(path, safe_mode=safe_mode, custom_objects_file=custom_objects_file)

    def open_model_with_custom_objects_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open model", self._last_dir(), MODEL_FILTER)
        if not path:
            return
        self._remember_dir(path)
        objects, _ = QFileDialog.getOpenFileName(
            self, "Python file defining the custom objects", str(Path(path).parent), CUSTOM_OBJECTS_FILTER
        )
        if objects:
            self.open_model(path, custom_objects_file=objects)

    def open_image(self, path: str) -> bool:
        return self.session.fed.open(path)

    def open_model_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open model", self._last_dir(), MODEL_FILTER)
        if path:
            self._remember_dir(path)
            self.open_model(path)

    def open_checkpoint_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open checkpoint folder", self._last_dir())
        if path:
            self._remember_dir(str(Path(path) / "x"))  # the next dialog starts in this folder
            self.open_model(path)

    def open_image_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open input", self._last_dir(), IMAGE_FILTER)
        if path:
            self._remember_dir(path)
            self.open_image(path)

    def type_tokens_dialog(self) -> TypeTokensDialog:
        """Opens the dialog (window-modal, not blocking) and returns it; OK sets the typed input."""
        fed = self.session.fed
        how = "words or token ids" if fed.vocab is not None else "token ids such as 12 7 99 (words need a vocabulary)"
        dialog = TypeTokensDialog(how, fed.typed or "", self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: fed.set_typed(dialog.text()))
        dialog.open()
        return dialog

    def open_vocabulary_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open vocabulary", self._last_dir(), VOCABULARY_FILTER)
        if path:
            self._remember_dir(path)
            self.session.fed.set_vocabulary(path)

    def open_training_log_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open training log (GradientMonitor's log_dir)", self._last_dir())
        if path:
            self._remember_dir(path)
            self.open_training_log(path)

    def open_training_log(self, folder: str) -> None:
        self._log_opening = True  # placed once the log is read (``_on_training_log``): it may take the window
        self.training_dock.show()
        self.session.training.open(folder)

    def open_session_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open session", self._last_dir(), f"Sessions (*{SESSION_SUFFIX})")
        if path:
            self.load_session(path)

    def load_rule_plugins_dialog(self) -> None:
        from gradscope.rules.base import rule_plugins

        plugins = rule_plugins()
        if not plugins:
            QMessageBox.information(self, "Rule plugins", "No installed package offers gradscope rules.")
            return
        answer = QMessageBox.question(
            self,
            "Load rule plugins?",
            "These installed packages offer rules. Loading imports (runs) their code:\n\n"
            + "\n".join(p.describe() for p in plugins),
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.No,
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.session.catalog.load_plugins()

    def load_session(self, path: str) -> None:
        """Open a session file; if it names Python code (custom objects), show the paths and ask first."""
        code = session_code_files(path)
        allow = False
        if code and self.modal_errors:  # headless: nobody to ask, so the code is not run (the status says so)
            answer = QMessageBox.question(
                self,
                "Run code from this session?",
                f"{Path(path).name} asks to import this Python file to load its model's custom layers:\n\n"
                + "\n".join(code)
                + "\n\nImporting runs the code. Run it only if you trust the file. Without it the model loads "
                "without custom objects (and fails if it needs them).",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                QMessageBox.StandardButton.No,
            )
            allow = answer == QMessageBox.StandardButton.Yes
        self.session.load(path, allow_code=allow)

    def save_session_dialog(self) -> None:
        if self.session.document.path is None:
            self._on_error("Nothing to save", "Open a model file first (an in-memory model cannot be saved).", None)
            return
        path, _ = QFileDialog.getSaveFileName(
            self, "Save session", self._default_name(SESSION_SUFFIX), f"Sessions (*{SESSION_SUFFIX})"
        )
        if path:
            self._guard(lambda: self.session.save(path), "Cannot save the session")

    def _export_dialog(self, title: str, suffix: str, filters: str, write: Any, failure: str) -> None:
        """Ask where to write (named after the image or model, in the last folder used), then ``write(path)``."""
        path, _ = QFileDialog.getSaveFileName(self, title, self._default_name(suffix), filters)
        if path:
            self._guard(lambda: write(path), failure)

    def export_overlay_dialog(self) -> None:
        s = self.session
        self._export_dialog(
            "Export overlay", "_overlay.png", "PNG (*.png)", s.exports.overlay, "Cannot export the overlay"
        )

    def export_flow_image_dialog(self) -> None:
        filters = "PNG (*.png);;SVG (*.svg)"
        self._export_dialog("Export flow plot", "_flow.png", filters, self.flow.export_image, "Cannot export the plot")

    def export_flow_csv_dialog(self) -> None:
        s = self.session
        self._export_dialog("Export flow CSV", "_flow.csv", "CSV (*.csv)", s.exports.flow_csv, "Cannot export the CSV")

    def export_map_dialog(self) -> None:
        write = lambda path: self.session.exports.overlay(path, map_only=True)  # noqa: E731
        self._export_dialog("Export map only", "_map.png", "PNG (*.png)", write, "Cannot export the map")

    def export_signal_dialog(self) -> None:
        s = self.session
        self._export_dialog(
            "Export signal", "_signal.npy", "NumPy (*.npy)", s.exports.signal, "Cannot export the signal"
        )

    def export_snippet_dialog(self) -> None:
        write, failure = self.session.exports.plan_snippet, "Cannot export the plan"
        self._export_dialog("Export plan as Python", "_train_with_plan.py", "Python (*.py)", write, failure)

    def export_plan_dialog(self) -> None:
        s = self.session
        self._export_dialog("Export plan", "_plan.json", "JSON (*.json)", s.exports.plan, "Cannot export the plan")

    def import_plan_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import plan", self._last_dir(), "JSON (*.json)")
        if path:
            self.session.editor.import_plan(path)

    def _guard(self, fn: Any, title: str) -> Any:
        try:
            out = fn()
        except Exception as exc:  # a failed export is a message, never a crash
            self._on_error(title, str(exc) or type(exc).__name__, exc)
            return None
        if out is not None:
            self.status_label.setText(f"Wrote {out}")
        return out

    def open_path(self, path: str) -> None:
        """Open whatever was dropped or passed: model, image, session or rule file, by extension (``demo:NAME``: a
        bundled one)."""
        from gradscope.core.resources import bundled

        path = str(bundled(path))
        low = path.lower()
        if low.endswith(SESSION_SUFFIX):
            self.load_session(path)
        elif low.endswith(MODEL_SUFFIXES):
            self.open_model(path)
        elif low.endswith(IMAGE_SUFFIXES):
            self.open_image(path)
        elif low.endswith(".py"):
            self.session.catalog.load_file(path)
        elif Path(path).is_dir():  # a checkpoint folder (opening says so when it is none)
            self.open_model(path)
        else:
            self._on_error(
                "Cannot open this file",
                f"{Path(path).name}: not a model (.keras, .h5), image, session ({SESSION_SUFFIX}) or rule file (.py).",
                None,
            )

    def dragEnterEvent(self, event) -> None:  # noqa: N802
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802
        for url in event.mimeData().urls():
            if url.isLocalFile():
                self.open_path(url.toLocalFile())
        event.acceptProposedAction()

    # ------------------------------------------------------------------------------------------- settings
    def _recent(self) -> list[str]:
        value = self.settings.value("recent_models", [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in (value or [])]

    def _add_recent(self, path: str) -> None:
        path = str(Path(path).resolve())
        items = [path] + [p for p in self._recent() if p != path]
        self.settings.setValue("recent_models", items[:_MAX_RECENT])
        self._refresh_recent()

    def _refresh_recent(self) -> None:
        self.recent_menu.clear()
        items = self._recent()
        for p in items:
            a = self.recent_menu.addAction(Path(p).name)
            a.setToolTip(p)
            a.triggered.connect(lambda _=False, p=p: self.open_model(p))
        self.recent_menu.setEnabled(bool(items))

    def _last_dir(self) -> str:
        """Where a file dialog starts: where this window's last file was chosen, else beside the open model, else
        the last folder of an earlier run, else ~/gradscope. Never among gradscope's own files (the bundled demo's
        folder is inside the installed package: Enter in a save dialog would write there)."""
        from gradscope.core.resources import is_bundled, user_folder

        model = self.session.document.path
        earlier = self.settings.value("last_dir", None)
        beside = str(Path(model).parent) if model else None
        for folder in (self._chosen_dir, beside, earlier if isinstance(earlier, str) else None):
            if folder and Path(folder).is_dir() and not is_bundled(folder):
                return folder
        try:  # a dialog shown a folder that does not exist starts elsewhere, and Enter writes there
            user_folder().mkdir(exist_ok=True)
        except OSError:
            return str(Path.home())
        return str(user_folder())

    def _remember_dir(self, path: str) -> None:
        self._chosen_dir = str(Path(path).parent)
        self.settings.setValue("last_dir", self._chosen_dir)

    def _default_name(self, suffix: str) -> str:
        stem = Path(self.session.fed.image_path or self.session.document.path or "gradscope").stem
        return str(Path(self._last_dir()) / f"{stem}{suffix}")

    # ------------------------------------------------------------------------------------------- misc
    def _toggle_direction(self) -> None:
        self.session.document.set_layout_direction("LR" if self.lr_action.isChecked() else "TB")

    def _update_title(self) -> None:
        s = self.session
        parts = ["gradscope"]
        if s.document.path or s.graph is not None:
            parts.append(Path(s.document.path).name if s.document.path else s.graph.model_name)
        shown = s.fed.image_path or s.fed.source
        if shown or s.fed.typed:
            parts.append(Path(shown).name if shown else "typed tokens")
        self.setWindowTitle(" — ".join(parts))

    def _show_shortcuts(self) -> None:
        """Every menu action's shortcut, read from the actions (so the list never drifts), and the graph's keys."""
        keys = [f"{a.shortcut().toString()}\t{a.text().replace('&', '')}" for a in self.findChildren(QAction)]
        menus = "\n".join(dict.fromkeys(k for k in keys if not k.startswith("\t")))
        graph = (
            "Graph: wheel or Ctrl+= / Ctrl+- zoom · drag to pan · F fit · Ctrl+F find · double-click a nested model's"
        )
        QMessageBox.information(
            self, "Keyboard shortcuts", f"{menus}\n\n{graph} title to collapse it, a box to expand it"
        )

    def _show_about(self) -> None:
        QMessageBox.about(self, "About gradscope", "gradscope: a visual debugger for gradients of Keras 3 models.")

    def closeEvent(self, event) -> None:  # noqa: N802
        # A TensorFlow call cannot be interrupted: cancel, wait briefly, and let main() leave without
        # finalising the interpreter under a running worker (that aborted with SIGABRT).
        executor = self.session.jobs.executor
        if hasattr(executor, "shutdown"):
            executor.shutdown(timeout=2.0)
        if self._gc_started:
            self._gc_started = False
            gui_gc.stop()
        super().closeEvent(event)

    def when_idle(self, callback: Any, timeout_ms: int = 600_000) -> None:
        """Call ``callback`` once no work is pending and a result is shown (screenshots)."""
        waited = {"ms": 0}

        def check() -> None:
            waited["ms"] += 100
            s = self.session
            # an error shown (a target the model lacks) means no result is coming: a headless run must end
            settled = s.result is not None or s.graph is None or self._errors_shown
            if (s.jobs.busy is None and settled) or waited["ms"] > timeout_ms:
                timer.stop()
                QTimer.singleShot(400, callback)

        timer = QTimer(self)
        timer.timeout.connect(check)
        timer.start(100)


def _as_list(value: Any) -> list[str]:
    """A QSettings list (a lone string when it held one item; None or junk when never set or hand-edited)."""
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []
