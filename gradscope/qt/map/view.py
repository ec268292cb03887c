"""Input image, saliency map and blend, with the read-out controls (target, colormap, alpha, normalisation)."""

from __future__ import annotations

from typing import Any

import numpy as np
from PySide6.QtCore import QPoint, QSize, Qt, QTimer
from PySide6.QtGui import QColor, QPainter, QPen, QPixmap
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSlider,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from gradscope.app.rendering.view import (
    INPUT_KEY,
    NORMALIZATIONS,
    PREPROCESSINGS,
    REDUCTIONS,
    colormaps,
    concentration_note,
    degenerate_note,
)
from gradscope.app.session import Session
from gradscope.core.errors import GradscopeError
from gradscope.qt.images import to_pixmap
from gradscope.qt.map.language import LanguagePanel
from gradscope.qt.map.panels import MapWindow, PanelRow
from gradscope.qt.map.token_finder import TokenFinder
from gradscope.qt.reflow import ReflowGrid
from gradscope.render.positions import FONT_SIZE, PAD, token_boxes


class _Picture(QLabel):
    """A label whose picture is scaled to it: it never asks for the picture's own width (a wide token strip
    would otherwise widen the whole window)."""

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(96, 96)


class PositionsPanel(QWidget):
    """A captioned per-token / per-feature picture at its own size (1:1, so words stay readable): a long text
    makes it taller, and the overlay pane scrolls. Over a token strip, a ``TokenFinder`` frames a token found by
    its text or by its score and scrolls it into view."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.setSpacing(2)
        self.caption = QLabel()
        self.caption.setWordWrap(True)
        self.caption.setStyleSheet("color:#455a64; font-weight:600")
        self.finder = TokenFinder(self._frame)
        self.finder.hide()
        self.picture = _Picture()
        self.picture.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        lay.addWidget(self.caption)
        lay.addWidget(self.finder)
        lay.addWidget(self.picture)
        lay.addStretch(1)
        self._pixmap: QPixmap | None = None
        self._labels: tuple[str, ...] = ()
        self.framed: int | None = None  # the token framed on the strip

    def set_array(self, array: np.ndarray, tokens: tuple[str, ...] = (), scores: np.ndarray | None = None) -> None:
        """The picture; with ``tokens`` and their ``scores`` it is a token strip the finder navigates."""
        self._pixmap = to_pixmap(array)
        self._labels = tuple(tokens)
        self.finder.setVisible(bool(tokens))
        self.picture.setMinimumHeight(self._pixmap.height())
        self.framed = None
        self.picture.setPixmap(self._pixmap)
        if tokens and scores is not None:
            self.finder.set_tokens(tokens, scores)  # frames again a token it framed, if the tokens are the same

    def pixmap(self) -> QPixmap | None:
        return self._pixmap  # without the frame: what an export writes

    def _frame(self, index: int | None, scroll: bool = True) -> None:
        """Frame token ``index`` (None: no frame) and, with ``scroll``, scroll the pane to it."""
        self.framed = index
        if self._pixmap is None or index is None or index >= len(self._labels):
            if self._pixmap is not None:
                self.picture.setPixmap(self._pixmap)
            return
        boxes, _ = token_boxes(self._labels, self._pixmap.width())
        x, y, w, _text = boxes[index]
        h = FONT_SIZE + 2 * PAD
        framed = QPixmap(self._pixmap)
        painter = QPainter(framed)
        painter.setPen(QPen(QColor("#ff6f00"), 3))
        painter.drawRect(x - 2, y - 2, w + 3, h + 3)
        painter.end()
        self.picture.setPixmap(framed)
        area = _scroll_area_of(self) if scroll else None
        if area is not None and area.widget() is not None:
            at = self.picture.mapTo(area.widget(), QPoint(x, y))
            area.ensureVisible(at.x(), at.y(), 60, 3 * h)


def _scroll_area_of(widget: QWidget) -> QScrollArea | None:
    parent = widget.parentWidget()
    while parent is not None and not isinstance(parent, QScrollArea):
        parent = parent.parentWidget()
    return parent


class OverlayView(QWidget):
    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self._updating = False
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)

        self.target = QComboBox()
        self.target.setObjectName("target_combo")
        self.target.setToolTip("What is explained: the top-1 class, or one of the model's top-5 predictions")
        self.target.setMinimumContentsLength(14)
        self.target.activated.connect(self._on_target_chosen)
        self.other_class = QSpinBox()
        self.other_class.setRange(-1, 100000)
        self.other_class.setSpecialValueText("auto")
        self.other_class.setValue(-1)
        self.other_class.setToolTip("Any class index (auto: each sample's top-1)")
        self.other_class.editingFinished.connect(self._on_other_class)
        self.readout = QComboBox()
        self.readout.addItem("model input", INPUT_KEY)
        self.readout.addItem("selected node", None)
        self.readout.setToolTip(
            "Where the map is read: the model input (default: every rule's effect shows), the node selected in "
            "the graph (the signal arriving at its output, i.e. above its own rule), or the node a method chose"
        )
        self.readout.activated.connect(self._on_readout)
        self.which = QComboBox()
        self.which.addItems(["plan", "baseline"])
        self.which.setToolTip("Show the current plan's map or the baseline (plain gradient, no rules)")
        self.which.activated.connect(lambda *_: self.refresh())

        self.cmap = QComboBox()
        self.cmap.addItems(list(colormaps()))
        self.cmap.setToolTip("Colormap of the map")
        self.cmap.activated.connect(lambda *_: self.session.viewing.set(colormap=self.cmap.currentText()))
        self.alpha = QSlider(Qt.Orientation.Horizontal)
        self.alpha.setRange(0, 100)
        self.alpha.setFixedWidth(60)
        self.alpha.setToolTip("Opacity of the map over the image")
        self.alpha.valueChanged.connect(lambda v: self._updating or self.session.viewing.set(alpha=v / 100.0))
        self.style = QComboBox()
        self.style.addItems(["caffe", "alpha"])
        self.style.setToolTip(
            "How the map is laid over the image. caffe: the map's strength sets its opacity, so weak evidence "
            "shows the image (the Excitation Backprop demo); alpha: one opacity everywhere (the Alpha slider)"
        )
        self.style.activated.connect(lambda *_: self.session.viewing.set(style=self.style.currentText()))
        self.norm = QComboBox()
        self.norm.addItems(list(NORMALIZATIONS))
        self.norm.setToolTip("How the map is scaled to [0, 1] (signed: centred on zero, for a diverging colormap)")
        self.norm.activated.connect(lambda *_: self.session.viewing.set(normalization=self.norm.currentText()))
        self.reduction = QComboBox()
        self.reduction.addItems(list(REDUCTIONS))
        self.reduction.setToolTip("How channels are reduced to one map (max_abs for gradients, sum for MWP/LRP)")
        self.reduction.activated.connect(lambda *_: self.session.viewing.set(reduction=self.reduction.currentText()))
        self.times_input = QCheckBox("× input")
        self.times_input.setToolTip("Multiply the signal by the forward value (gradient × input)")
        self.times_input.toggled.connect(lambda v: self._updating or self.session.viewing.set(times_input=v))
        self.preprocessing = QComboBox()
        self.preprocessing.addItems(list(PREPROCESSINGS))
        self.preprocessing.setToolTip(
            "How image pixels are scaled for the model (caffe: keras.applications ResNet/VGG)"
        )
        self.preprocessing.activated.connect(
            lambda *_: self.session.fed.set_preprocessing(self.preprocessing.currentText())
        )

        def cell(label: str, w: QWidget) -> QWidget:
            box = QWidget()
            h = QHBoxLayout(box)
            h.setContentsMargins(0, 0, 0, 0)
            h.setSpacing(3)
            lab = QLabel(label)
            lab.setStyleSheet("color:#546e7a")
            h.addWidget(lab)
            h.addWidget(w, 1)
            return box

        for combo in (
            self.target,
            self.preprocessing,
            self.readout,
            self.which,
            self.reduction,
            self.cmap,
            self.norm,
            self.style,
        ):
            # combos may shrink below their longest item: the controls must fit a 1280-pixel-wide screen
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(4)
        self.target.setMinimumContentsLength(8)
        # four columns where they fit, three or two on a narrow window (the rows reflow, nothing is cut)
        self.controls = ReflowGrid(
            [
                (cell("Target", self.target), 2),
                cell("class", self.other_class),
                cell("Pixels", self.preprocessing),
                cell("Map at", self.readout),
                cell("Show", self.which),
                cell("Channels", self.reduction),
                self.times_input,
                cell("Colormap", self.cmap),
                cell("Alpha", self.alpha),
                cell("Norm", self.norm),
                cell("Blend", self.style),
            ],
            max_columns=4,
            min_columns=2,
        )
        lay.addWidget(self.controls)
        lay.addWidget(self._compare_bar())
        self.panels_box = PanelRow()  # input, map and overlay: the user's choice of them, large and zoomable
        self.input_panel = self.panels_box.panels["input"]
        self.map_panel = self.panels_box.panels["map"]
        self.blend_panel = self.panels_box.panels["overlay"]
        self.detach_button = QToolButton()
        self.detach_button.setText("Window")
        self.detach_button.setToolTip("The map in a window of its own, kept up to date (Ctrl+Shift+M)")
        self.detach_button.clicked.connect(self.open_map_window)
        self.panels_box.bar.addWidget(self.detach_button)
        self.map_window: MapWindow | None = None
        lay.addWidget(self.panels_box, 1)
        # text and tabular inputs: one wide picture of the scores per token / feature, in place of the three
        self.positions_panel = PositionsPanel()
        self.positions_panel.hide()
        lay.addWidget(self.positions_panel, 1)
        self.language_panel = LanguagePanel(session)  # a language model's next token and generation
        self.language_panel.hide()
        lay.addWidget(self.language_panel)
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color:#607d8b")
        lay.addWidget(self.note)

        session.results.changed.connect(lambda *_: self._on_result())
        session.ab.changed.connect(lambda *_: self.refresh())
        session.editor.changed.connect(lambda *_: self.refresh())  # the caption marks a result of an older plan
        session.viewing.changed.connect(lambda *_: self._sync_controls() or self.refresh())
        session.selection.changed.connect(lambda *_: self.refresh())
        session.fed.changed.connect(self.refresh)
        session.targeting.changed.connect(lambda *_: self._fill_targets())
        session.document.loaded.connect(lambda *_: self._on_model())
        self._sync_controls()
        self.refresh()

    # ------------------------------------------------------------------------------------------- syncing
    def _sync_controls(self) -> None:
        v = self.session.view
        self._updating = True
        try:
            if self.cmap.findText(v.colormap) < 0:
                self.cmap.addItem(v.colormap)
            self.cmap.setCurrentText(v.colormap)
            self.alpha.setValue(round(v.alpha * 100))
            self.style.setCurrentText(v.style)
            self.alpha.setEnabled(v.style == "alpha")  # the caffe blend takes its opacity from the map
            self.norm.setCurrentText(v.normalization)
            if self.reduction.findText(v.reduction) < 0:
                self.reduction.addItem(v.reduction)
            self.reduction.setCurrentText(v.reduction)
            self.times_input.setChecked(v.times_input)
            while self.readout.count() > 2:  # a method's node from an earlier preset
                self.readout.removeItem(2)
            if v.readout_node not in (INPUT_KEY, None):
                self.readout.addItem(f"{v.readout_node} (method)", v.readout_node)
            self.readout.setCurrentIndex(self.readout.findData(v.readout_node) if v.readout_node is not None else 1)
            self.preprocessing.setCurrentText(self.session.fed.preprocessing)
        finally:
            self._updating = False

    def _on_model(self) -> None:
        graph = self.session.graph
        text = graph is not None and graph.token_input is not None
        # no gradient reaches token ids: "the input" of a text model is read at its embedding (Session.readout)
        self.readout.setItemText(0, "embedding" if text else "model input")  # as short: the combo stays narrow
        self.readout.setItemData(
            0,
            "Token ids get no gradient: the map is read at the embedding" if text else "",
            Qt.ItemDataRole.ToolTipRole,
        )
        self._sync_controls()
        self._fill_targets()
        self.refresh()

    def _on_result(self) -> None:
        self._fill_targets()
        self.refresh()

    def _fill_targets(self) -> None:
        s = self.session
        self.target.blockSignals(True)
        self.target.clear()
        top = s.results.top_k(5)
        predicted = int(s.result.target_indices[0]) if s.result is not None and s.result.target_indices.size else None
        kind = "token" if s.graph is not None and s.graph.is_language_model else "class"  # an LM: its next token
        auto = f" → {kind} {s.document.class_label(predicted)}" if predicted is not None else ""
        self.target.addItem("top-1 (auto)" + auto, None)
        for idx, p in top:
            self.target.addItem(f"{kind} {s.document.class_label(idx)}   p={p:.3f}", idx)
        if s.target.kind in ("class", "token") and s.target.index is not None:
            i = self.target.findData(s.target.index)
            if i < 0:
                self.target.addItem(f"{kind} {s.document.class_label(s.target.index)}", s.target.index)
                i = self.target.count() - 1
            self.target.setCurrentIndex(i)
        if kind == "token" and s.target.contrast is not None:  # the pair explained, as the CLI says it
            i = self.target.currentIndex()
            self.target.setItemText(i, f"{self.target.itemText(i)} rather than {s.target.contrast}")
        self.target.blockSignals(False)
        self.other_class.blockSignals(True)
        self.other_class.setValue(-1 if s.target.index is None else int(s.target.index))
        self.other_class.blockSignals(False)

    def _on_target_chosen(self, index: int) -> None:
        self.session.targeting.set_class(self.target.itemData(index))

    def _on_other_class(self) -> None:
        v = self.other_class.value()
        self.session.targeting.set_class(None if v < 0 else v)

    def _on_readout(self, index: int) -> None:
        self.session.viewing.set(readout_node=self.readout.itemData(index))

    # ------------------------------------------------------------------------------------------- compare
    def _compare_bar(self) -> QWidget:
        self.pin_button = QPushButton("Pin as B")
        self.pin_button.setShortcut("Ctrl+B")
        self.pin_button.setToolTip("Keep this result as B and compare the next plans with it (Ctrl+B)")
        self.pin_button.clicked.connect(self.session.ab.pin)
        self.swap_button = QPushButton("Swap A/B")
        self.swap_button.setToolTip("Make B's plan current again and pin the result on screen (undoable)")
        self.swap_button.clicked.connect(self.session.swap_compare)
        self.unpin_button = QPushButton("Unpin")
        self.unpin_button.clicked.connect(self.session.ab.unpin)
        self.export_compare_button = QPushButton("Export A|B…")
        self.export_compare_button.setToolTip("A, B and their difference side by side as PNG + JSON")
        self.export_compare_button.clicked.connect(self._export_comparison)
        self.compare_label = QLabel("Compare plans: pin a result as B, then change the plan")
        self.compare_label.setStyleSheet("color:#607d8b")
        self.compare_label.setWordWrap(True)  # a long A/B caption wraps instead of being cut
        buttons = (self.pin_button, self.swap_button, self.unpin_button, self.export_compare_button)
        # the caption on a row of its own, as tall as its wrapped lines (in the buttons' grid its second line
        # was cut at 1024x640)
        bar = QWidget()
        column = QVBoxLayout(bar)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        column.addWidget(ReflowGrid(buttons, max_columns=4, min_columns=2, even=True))
        column.addWidget(self.compare_label)
        return bar

    def _export_comparison(self) -> None:
        from PySide6.QtWidgets import QFileDialog, QMessageBox

        path, _ = QFileDialog.getSaveFileName(self, "Export comparison", "comparison.png", "PNG (*.png)")
        if path:
            try:
                self.session.exports.comparison(path)
            except GradscopeError as exc:
                QMessageBox.warning(self, "Cannot export the comparison", str(exc))

    def _refresh_compare(self) -> bool:
        """With a pinned B: A, B and A - B in the three panels. Returns whether it drew them."""
        s = self.session
        pinned = s.ab.pinned is not None
        for w in (self.swap_button, self.unpin_button, self.export_compare_button):
            w.setEnabled(pinned)
        comparison = s.comparison() if pinned else None
        for row in self._rows():
            row.show_all(comparison is not None)
        if comparison is None:
            if not pinned:
                self.compare_label.setText("Compare plans: pin a result as B, then change the plan")
            self._caption("input", "Input")
            self._caption("overlay", "Overlay")
            return False
        where = comparison.a.node or "model input"
        self._caption("input", f"A: {comparison.a_label}")
        self._caption("map", f"B: {comparison.b_label} (pinned)")
        self._caption("overlay", f"A − B at {where}")
        self._draw("input", comparison.a.picture, smooth=comparison.a.spatial, values=comparison.a.saliency)
        self._draw("map", comparison.b.picture, smooth=comparison.b.spatial, values=comparison.b.saliency)
        self._draw("overlay", comparison.difference, smooth=False, values=comparison.difference_values)
        finite = [v for v in s.ab.node_cosine.values() if v == v]
        agree = f"; lowest node cosine {min(finite):.3f}" if finite else ""
        self.compare_label.setText(f"A vs B: map cosine {comparison.map_cosine:.3f}{agree} (red: A stronger)")
        self.compare_label.setToolTip(self.compare_label.text())  # the pane may be too narrow for all of it
        return True

    # ------------------------------------------------------------------------------------------- map window
    def open_map_window(self) -> None:
        """The panels in a window of their own, drawn from every result from now on."""
        if self.map_window is None:
            self.map_window = MapWindow(self)
            self.map_window.row.set_shown(self.panels_box.shown)
        self.map_window.show()
        self.map_window.raise_()
        self.refresh()

    def _rows(self) -> list[PanelRow]:
        window = self.map_window
        return [self.panels_box] + ([window.row] if window is not None and window.isVisible() else [])

    def _draw(self, name: str, array: Any, placeholder: str = "", smooth: bool = True, values: Any = None) -> None:
        for row in self._rows():
            row.panels[name].set_array(array, placeholder, smooth=smooth, values=values)

    def _caption(self, name: str, text: str) -> None:
        for row in self._rows():
            row.panels[name].caption.setText(text)
            row.panels[name].caption.setToolTip(text)  # (two lines shown: a longer one is cut)

    def _set_note(self, text: str) -> None:
        self.note.setText(text)
        if self.map_window is not None:
            self.map_window.note.setText(text)

    # ------------------------------------------------------------------------------------------- drawing
    def refresh(self) -> None:
        s = self.session
        if self._refresh_compare():
            self._show_positions(False)
            self._set_note(f"{s.result_caption()}  Comparing with the pinned {s.ab.pinned.method}.")
            return
        self._draw("input", s.fed.image, "No image: File ▸ Open input" if s.graph else "")
        which = "current" if self.which.currentIndex() == 0 else "baseline"
        res = s.result if which == "current" else s.baseline
        language = s.graph is not None and s.graph.is_language_model
        if language and s.jobs.busy and (res is None or not self._labels_fit(res)):
            # a new input's map is on the way (a generated row clicked, words typed): the strip and the
            # next-token panel stay, as they will be; the image layout flashed for seconds
            self._show_positions(True)
            self.positions_panel.caption.setText("Computing the map for the new input…")
            return
        if res is None:
            self._show_positions(False)
            self._draw("map", None, "…" if s.jobs.busy else "")
            self._draw("overlay", None, "")
            self._set_note(s.fed.note)
            return
        try:
            images = s.overlay(which=which, width=max(240, self.width() - 12))  # drawn 1:1 at the pane's width
        except GradscopeError as exc:
            self._show_positions(False)
            self._draw("map", None, str(exc))
            self._draw("overlay", None, "")
            return
        where = images.node or "model input"
        per_position = bool(images.labels)
        self._show_positions(per_position)
        if per_position:
            what = "token" if s.fed.fed.kind == "tokens" else "feature"
            self.positions_panel.caption.setText(f"Score per {what} at {where} (red: for the target, blue: against)")
            tokens = images.labels if what == "token" else ()
            self.positions_panel.set_array(images.heat, tokens, images.saliency if tokens else None)
        self._caption("map", f"Map at {where}")
        values = images.saliency if images.saliency.ndim == 2 else None
        self._draw("map", images.heat, smooth=images.spatial, values=values)
        why = "No image to blend with (a random input): File ▸ Open input" if images.spatial else "(no spatial map)"
        self._draw("overlay", images.blend, why, values=values)
        finite = images.saliency[np.isfinite(images.saliency)]
        method = "baseline (no rules)" if which == "baseline" else s.result_caption()
        shape = "×".join(map(str, images.saliency.shape))
        if finite.size:
            parts = [f"{method}; map {shape}, range [{finite.min():.3g}, {finite.max():.3g}]"]
        else:  # e.g. a checkpoint whose weights are already NaN
            parts = [f"{method}; map {shape}, no finite value (NaN/Inf: see the flow plot and Diagnostics)"]
        if images.note:
            parts.append(images.note)
        empty = degenerate_note(images.saliency, s.results.method or s.editor.method_name)
        if empty:
            parts.append(empty)
        elif images.spatial:
            parts.append(concentration_note(images.saliency, s.view.normalization))
        if s.fed.note:
            parts.append(s.fed.note)
        self._set_note("  ".join(p for p in parts if p))

    def _labels_fit(self, res: Any) -> bool:
        """Whether ``res`` was computed on the input now fed (one score per token of it)."""
        fed = self.session.fed.fed
        if fed is None or fed.kind != "tokens" or not res.inputs:
            return False
        return int(np.asarray(res.inputs[0]).shape[-1]) == len(fed.ids)

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        if self.positions_panel.isVisible() and abs(event.size().width() - event.oldSize().width()) > 8:
            QTimer.singleShot(0, self.refresh)  # the strip wraps to the new width

    def _show_positions(self, shown: bool) -> None:
        self.positions_panel.setVisible(shown)
        self.panels_box.setVisible(not shown)
        graph = self.session.graph
        self.language_panel.setVisible(shown and graph is not None and graph.is_language_model)

    def current_overlay(self) -> Any:
        return self.blend_panel.pixmap() or self.map_panel.pixmap()
