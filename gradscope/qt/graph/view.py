"""The layer graph: boxes coloured by gradient magnitude, rule badges, status colours, zoom/pan/search.

The layout (positions, edge polylines) is computed off the UI thread (``gradscope.render.graph_layout``); this
view only draws it and keeps the colours, badges and selection in step with the Session.
"""

from __future__ import annotations

import math
import statistics

from PySide6.QtCore import QEvent, QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import (
    QAction,
    QBrush,
    QColor,
    QFont,
    QFontMetrics,
    QKeySequence,
    QPainter,
    QPainterPath,
    QPen,
    QPolygonF,
)
from PySide6.QtWidgets import (
    QGraphicsItem,
    QGraphicsOpacityEffect,
    QGraphicsPathItem,
    QGraphicsScene,
    QGraphicsView,
    QLineEdit,
    QStyleOptionGraphicsItem,
    QWidget,
)

from gradscope.core.results import NodeStats
from gradscope.qt.graph.minimap import Minimap
from gradscope.qt.graph.style import (
    BADGE,
    DIAG_BORDER,
    DIAG_RANK,
    DIAG_UNREACHED,
    DIAGNOSIS_COLORS,
    DIAGNOSIS_TEXT,
    HATCH,
    MATCH,
    NO_RESULT,
    SELECT,
    SKIPPED,
    STATUS_COLORS,
    STATUS_TEXT,
    GraphLegend,
    ramp_color,
    rule_abbreviation,
)
from gradscope.render.graph_layout import GraphLayout, GroupFrame, NodeBox

LEGIBLE_ZOOM = 0.6  # below this a box's text is hard to read (Fit stays above it; 0.45 drew 6 px labels)
LABEL_ZOOM = 0.25  # below this boxes are drawn without text


EMPTY_MESSAGE = "Open a model (File ▸ Open model, or drop a .keras file here)"


SHORT_VIEW_PX = 320  # a graph view shorter than this draws its key see-through
LEGEND_FADED = 0.45


class NodeItem(QGraphicsItem):
    """One box of the graph (a node, or a collapsed nested model)."""

    def __init__(self, box: NodeBox, view: GraphView) -> None:
        super().__init__()
        self.box = box
        self._view = view
        self.fill = NO_RESULT
        self.status = "ok"
        self.rule: str | None = None
        self.matched = False
        self.diag_role: str | None = None  # set by path diagnostics (see DIAGNOSIS_TEXT)
        self.diag_note = ""  # e.g. the type of the op that cuts the path
        self.setFlag(QGraphicsItem.GraphicsItemFlag.ItemIsSelectable, True)
        self.setAcceptHoverEvents(True)
        self.setPos(box.x, box.y)
        self.setZValue(2)
        self.setCursor(Qt.CursorShape.PointingHandCursor)

    @property
    def node_id(self) -> str:
        return self.box.id

    def boundingRect(self) -> QRectF:
        w, h = self.box.w, self.box.h
        return QRectF(-w / 2 - 4, -h / 2 - 10, w + 14, h + 14)

    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget: QWidget | None = None) -> None:
        w, h = self.box.w, self.box.h
        rect = QRectF(-w / 2, -h / 2, w, h)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        collapsed = self.box.collapsed_group is not None
        fill = SKIPPED if self.status == "skipped" else STATUS_COLORS.get(self.status, self.fill)
        border = QPen(QColor("#5f6b7a"), 1.2)
        if self.status in STATUS_COLORS:
            border = QPen(fill.darker(150), 2.0, Qt.PenStyle.DashLine)
        if collapsed:
            border = QPen(QColor("#37474f"), 2.0)
        role = self.diag_role
        if role in DIAGNOSIS_COLORS:  # a cut path outranks the magnitude colours: it is why they are grey
            fill = DIAGNOSIS_COLORS[role]
            border = QPen(DIAG_BORDER, 3.0 if role == "cut" else 2.4)
        elif role is not None:
            border = QPen(DIAG_UNREACHED, 2.4, Qt.PenStyle.DashLine)
        if self.matched:
            border = QPen(MATCH, 3.0)
        if self.isSelected():
            border = QPen(SELECT, 3.2)
        p.setPen(border)
        p.setBrush(QBrush(fill))
        p.drawRoundedRect(rect, 7, 7)
        if role == "cut":  # hatched: not to be mistaken for the red end of the magnitude ramp
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(QBrush(HATCH, Qt.BrushStyle.BDiagPattern))
            p.drawRoundedRect(rect, 7, 7)
        if collapsed:  # a stacked look: this box stands for many nodes
            p.drawLine(QPointF(-w / 2 + 6, h / 2 + 3), QPointF(w / 2 - 6, h / 2 + 3))
        if abs(p.worldTransform().m11()) < LABEL_ZOOM:
            return  # level of detail: text nobody can read costs most of a frame on large graphs
        nan_or_none = self.status in ("none", "nan") and role not in DIAGNOSIS_COLORS
        dark = role == "cut" or fill.lightnessF() < 0.45 or nan_or_none
        p.setPen(QColor("#ffffff") if dark else QColor("#1d232a"))
        title_font = QFont(self._view.font())
        title_font.setPointSizeF(9.0)
        title_font.setBold(True)
        p.setFont(title_font)
        fm = QFontMetrics(title_font)
        title = fm.elidedText(self.box.title, Qt.TextElideMode.ElideMiddle, int(w - 16))
        p.drawText(QRectF(-w / 2 + 8, -h / 2 + 3, w - 16, h / 2), Qt.AlignmentFlag.AlignVCenter, title)
        sub_font = QFont(self._view.font())
        sub_font.setPointSizeF(8.0)
        p.setFont(sub_font)
        sub = self.box.subtitle
        if role == "cut":
            sub = f"✂ cut: {self.diag_note}" if self.diag_note else "✂ cuts the gradient"
        elif self.status in STATUS_TEXT:
            sub = f"{STATUS_TEXT[self.status]}  {sub}"
        elif self.status == "skipped":
            sub = "skipped: logits explained"
        sub = QFontMetrics(sub_font).elidedText(sub, Qt.TextElideMode.ElideRight, int(w - 16))
        p.drawText(QRectF(-w / 2 + 8, 0, w - 16, h / 2 - 3), Qt.AlignmentFlag.AlignVCenter, sub)
        if self.rule:
            self._paint_badge(p, w, h)

    def _paint_badge(self, p: QPainter, w: float, h: float) -> None:
        text = rule_abbreviation(self.rule or "")
        font = QFont(self._view.font())
        font.setPointSizeF(7.5)
        font.setBold(True)
        p.setFont(font)
        tw = QFontMetrics(font).horizontalAdvance(text) + 10
        badge = QRectF(w / 2 - tw + 6, -h / 2 - 9, tw, 16)
        p.setPen(QPen(QColor("#ffffff"), 1.5))
        p.setBrush(BADGE)
        p.drawRoundedRect(badge, 8, 8)
        p.setPen(QColor("#ffffff"))
        p.drawText(badge, Qt.AlignmentFlag.AlignCenter, text)

    def mouseDoubleClickEvent(self, event) -> None:  # noqa: N802  (Qt naming)
        if self.box.collapsed_group is not None:
            self._view.toggle_group_later(self.box.collapsed_group, False)
        else:
            super().mouseDoubleClickEvent(event)


class GroupFrameItem(QGraphicsItem):
    """The frame of an expanded group (nested model or block); double-click its title bar to collapse it."""

    def __init__(self, frame: GroupFrame, view: GraphView) -> None:
        super().__init__()
        self.frame = frame
        self._view = view
        self.setZValue(0)
        self.setToolTip(f"{frame.id}: double-click the title to collapse it")

    def boundingRect(self) -> QRectF:
        f = self.frame
        return QRectF(f.x0, f.y0, f.x1 - f.x0, f.y1 - f.y0)

    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget: QWidget | None = None) -> None:
        r = self.boundingRect()
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        p.setPen(QPen(QColor("#90a4ae"), 1.3, Qt.PenStyle.DashLine))
        p.setBrush(QColor(236, 239, 241, 120))
        p.drawRoundedRect(r, 10, 10)
        font = QFont(self._view.font())
        font.setPointSizeF(8.5)
        font.setItalic(True)
        p.setFont(font)
        p.setPen(QColor("#455a64"))
        p.drawText(
            QRectF(r.x() + 10, r.y() + 2, r.width() - 20, 16),
            Qt.AlignmentFlag.AlignLeft,
            f"▾ {self.frame.id.split('/')[-1]}",
        )

    def mouseDoubleClickEvent(self, event) -> None:  # noqa: N802
        if event.pos().y() < self.frame.y0 + 22:
            self._view.toggle_group_later(self.frame.id, True)


class GraphView(QGraphicsView):
    """Draws a ``GraphLayout``; emits ``node_clicked`` and ``group_toggled``."""

    node_clicked = Signal(object)  # node id (str) or None
    group_toggled = Signal(str, bool)  # group id, collapse?
    reveal_requested = Signal(str)  # a node inside a collapsed box that Find jumps to: expand what hides it

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setScene(QGraphicsScene(self))
        self.setRenderHints(QPainter.RenderHint.Antialiasing | QPainter.RenderHint.TextAntialiasing)
        self.setDragMode(QGraphicsView.DragMode.ScrollHandDrag)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.setResizeAnchor(QGraphicsView.ViewportAnchor.AnchorViewCenter)
        self.setViewportUpdateMode(QGraphicsView.ViewportUpdateMode.SmartViewportUpdate)
        self.setBackgroundBrush(QColor("#fbfcfd"))
        self.setToolTip("")
        self.items_by_id: dict[str, NodeItem] = {}
        self._clicking = False  # a selection coming from a click in this view (see select_node)
        self.edge_items: dict[tuple[str, str], QGraphicsPathItem] = {}
        self.layout_data: GraphLayout | None = None
        self.diagnosis_roles: dict[str, str] = {}  # node id -> role (kept across re-layouts)
        self.diagnosis_paths: list[tuple[str, ...]] = []
        self.diagnosis_notes: dict[str, str] = {}
        self._state: tuple = ({}, {}, frozenset())  # last set_node_state (stats, rules, skipped) for tooltips
        self._member_of: dict[str, str] = {}
        self._matches: list[str] = []
        self._match_index = -1
        self._pending_reveal: str | None = None  # Find's node, selected once the layout that shows it comes
        self._updating_selection = False
        self.legend = GraphLegend(self)
        self.legend.move(10, 10)
        self._legend_fade = QGraphicsOpacityEffect(self.legend)
        self._legend_fade.setOpacity(1.0)
        self.legend.setGraphicsEffect(self._legend_fade)
        self.search = QLineEdit(self)
        self.search.setPlaceholderText("Find node (Ctrl+F)…")
        self.search.setClearButtonEnabled(True)
        self.search.setFixedWidth(230)
        self.search.setToolTip("Type part of a node name, id or type; Enter jumps to the next match")
        self.search.textChanged.connect(self._on_search_text)
        self.search.returnPressed.connect(self.next_match)
        self.search.hide()  # shown by Find / Ctrl+F: on a narrow pane it covered the graph's top right
        self.search.installEventFilter(self)  # Esc closes it (the window's Esc = Cancel took it first)
        self.user_zoomed = False  # until the user zooms, a resize fits the graph again
        self.scene().selectionChanged.connect(self._on_scene_selection)
        self._add_shortcuts()
        self.minimap = Minimap(self)
        self._placeholder = self.scene().addText(EMPTY_MESSAGE)
        self._placeholder.setDefaultTextColor(QColor("#78909c"))

    def toggle_group_later(self, group: str, collapse: bool) -> None:
        """Emit ``group_toggled`` once the double-click's handler has returned: the new layout, drawn at once for
        a small graph, clears the scene that holds the clicked item."""
        QTimer.singleShot(0, lambda: self.group_toggled.emit(group, collapse))

    def show_message(self, text: str) -> None:
        """Replace the graph with a line of text (while a model loads: the user sees what is happening)."""
        scene = self.scene()
        scene.clear()
        self.items_by_id, self.edge_items, self._member_of = {}, {}, {}
        self.layout_data = None
        self._placeholder = scene.addText(text)
        self._placeholder.setDefaultTextColor(QColor("#78909c"))
        scene.setSceneRect(self._placeholder.boundingRect())
        self.resetTransform()
        self.centerOn(self._placeholder)

    # ------------------------------------------------------------------------------------------- building
    def set_layout(self, layout: GraphLayout, *, keep_view: bool = False) -> None:
        old_center = self.mapToScene(self.viewport().rect().center())
        selected = self.selected_id()
        scene = self.scene()
        self._updating_selection = True
        scene.clear()
        self._placeholder = None
        self.items_by_id = {}
        self.edge_items = {}
        self._member_of = {}
        self.layout_data = layout
        for frame in layout.frames:
            scene.addItem(GroupFrameItem(frame, self))
        for edge in layout.edges:
            item = _edge_item(edge.points)
            scene.addItem(item)
            self.edge_items[(edge.src, edge.dst)] = item
        for box in layout.boxes.values():
            item = NodeItem(box, self)
            scene.addItem(item)
            self.items_by_id[box.id] = item
            for m in box.members:
                self._member_of[m] = box.id
        x0, y0, x1, y1 = layout.bounds
        scene.setSceneRect(QRectF(x0 - 200, y0 - 300, x1 - x0 + 400, y1 - y0 + 420))  # room above: the legend
        self._updating_selection = False
        self._apply_diagnosis()
        if keep_view:
            self.centerOn(old_center)
        else:
            self.initial_view()
        if selected:
            self.select_node(selected, center=False)
        pending, self._pending_reveal = self._pending_reveal, None
        self._on_search_text(self.search.text(), jump=pending is None)
        if pending in self.items_by_id:  # Find's node, now shown
            self._match_index = self._matches.index(pending) if pending in self._matches else -1
            self._go_to(pending)

    def initial_view(self) -> None:
        self.fit_all()  # as Fit shows it, with the overview when the graph does not fit
        self.minimap.invalidate()

    def set_node_state(
        self,
        stats: dict[str, NodeStats],
        rules: dict[str, str],
        caption: str = "mean |g| (log scale)",
        skipped: set[str] | frozenset[str] = frozenset(),
        *,
        magnitude: bool = True,
    ) -> None:
        """Colour boxes by log mean|g| (collapsed boxes: their largest member) and badge ruled nodes.
        ``magnitude=False`` leaves the boxes neutral (the path-diagnostics view): only the marks of
        ``set_diagnosis`` are coloured, so their red is not confused with the red end of the ramp."""
        self._state = (stats, rules, skipped)
        self.legend.set_magnitude(magnitude)
        if not magnitude:
            stats, skipped = {}, frozenset()
        logs: dict[str, float] = {}
        status: dict[str, str] = {}
        for box_id, item in self.items_by_id.items():
            members = item.box.members or (box_id,)
            got = [stats[m] for m in members if m in stats]
            if not got:
                status[box_id] = "ok"
                continue
            ok = [s for s in got if s.status == "ok"]
            if ok:
                status[box_id] = "ok"
                logs[box_id] = max((math.log10(s.mean_abs) for s in ok if s.mean_abs > 0), default=-30.0)
            else:
                status[box_id] = got[0].status
        finite = [v for v in logs.values() if v > -30]
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
        span = hi - lo if hi > lo else 1.0
        for box_id, item in self.items_by_id.items():
            item.status = "skipped" if box_id in skipped else status.get(box_id, "ok")
            item.fill = ramp_color((logs[box_id] - lo) / span) if box_id in logs else NO_RESULT
            members = item.box.members or (box_id,)
            ruled = [rules[m] for m in members if m in rules]
            item.rule = (ruled[0] if len(set(ruled)) == 1 else f"{len(ruled)} rules") if ruled else None
            item.setToolTip(_tooltip(item, stats, rules, box_id in skipped))
            item.update()
        self.legend.set_range(10**lo if finite else None, 10**hi if finite else None, caption)
        self.minimap.invalidate()  # its picture shows the colours

    def set_diagnosis(
        self,
        roles: dict[str, str],
        paths: list[tuple[str, ...]] | None = None,
        notes: dict[str, str] | None = None,
    ) -> None:
        """Draw path diagnostics: ``roles`` node id -> "cut" / "blocked" / "path" (red) or "unused" /
        "never_read" (orange outline); ``paths`` node-id sequences whose edges turn red; ``notes`` short text
        for a cut node's box (the op type). Empty ``roles`` clears it."""
        self.diagnosis_roles = dict(roles)
        self.diagnosis_paths = [tuple(p) for p in (paths or [])]
        self.diagnosis_notes = dict(notes or {})
        self._apply_diagnosis()

    def _apply_diagnosis(self) -> None:
        box_role: dict[str, str] = {}
        for node, role in self.diagnosis_roles.items():
            item = self.item_for(node)
            if item is None or role not in DIAG_RANK:
                continue
            old = box_role.get(item.node_id)
            if old is None or DIAG_RANK[role] < DIAG_RANK[old]:
                box_role[item.node_id] = role
        for box_id, item in self.items_by_id.items():
            item.diag_role = box_role.get(box_id)
            members = item.box.members or (box_id,)
            item.diag_note = next((self.diagnosis_notes[m] for m in members if m in self.diagnosis_notes), "")
            stats, rules, skipped = self._state
            item.setToolTip(_tooltip(item, stats, rules, box_id in skipped))
            item.update()
        red_edges: set[tuple[str, str]] = set()
        for path in self.diagnosis_paths:
            boxes = [b.node_id for b in (self.item_for(n) for n in path) if b is not None]
            red_edges.update(zip(boxes, boxes[1:]))
        for key, edge in self.edge_items.items():
            _style_edge(edge, key in red_edges)
        self.legend.set_diagnosis(bool(box_role))

    def show_diagnosis(self) -> None:
        """Bring the diagnosis into view: the whole graph when it is readable that way, and the cut nodes."""
        self.initial_view()
        cuts = [i for i in self.items_by_id.values() if i.diag_role == "cut"]
        if cuts:
            self.ensureVisible(cuts[0], 60, 60)

    # ------------------------------------------------------------------------------------------- selection
    def selected_id(self) -> str | None:
        sel = [i for i in self.scene().selectedItems() if isinstance(i, NodeItem)]
        return sel[0].node_id if sel else None

    def item_for(self, node_id: str) -> NodeItem | None:
        return self.items_by_id.get(node_id) or self.items_by_id.get(self._member_of.get(node_id, ""))

    def select_node(self, node_id: str | None, *, center: bool = True) -> None:
        self._updating_selection = True
        try:
            self.scene().clearSelection()
            item = self.item_for(node_id) if node_id else None
            if item is not None:
                item.setSelected(True)
                if center and not self._clicking:  # a box the user just clicked is in sight: never scroll it
                    self.ensureVisible(item, 80, 80)  # away under the second click of a double-click
        finally:
            self._updating_selection = False

    def _on_scene_selection(self) -> None:
        self.minimap.refresh()  # it steps aside from the selected box
        if self._updating_selection:
            return
        node = self.selected_id()
        if node is not None and node.startswith("group:"):
            node = None  # a collapsed box is no node: the inspector shows the model, not a member never picked
        self._clicking = True
        try:
            self.node_clicked.emit(node)
        finally:
            self._clicking = False

    # ------------------------------------------------------------------------------------------- zoom, search
    def zoom(self, factor: float) -> None:
        self.user_zoomed = True
        current = self.transform().m11()
        factor = min(max(factor, 0.02 / current), 4.0 / current)
        self.scale(factor, factor)
        self.minimap.refresh()

    def fit_all(self) -> None:
        """Fit the whole graph if its boxes stay legible that way (zoom >= ``LEGIBLE_ZOOM``); else fit its width
        (at least at the legible zoom) and show its top: a tall graph scrolls instead of shrinking to a line. The
        graph is placed below the colour legend in the view's corner (it covered the first boxes)."""
        self.user_zoomed = False
        if not (self.layout_data and self.layout_data.boxes):
            return
        x0, y0, x1, y1 = self.layout_data.bounds
        w, h = x1 - x0 + 40, y1 - y0 + 40
        band = self.legend.geometry().bottom() + 4 if self.legend.isVisible() else 0  # px the legend takes
        vw, vh = max(self.viewport().width(), 1), max(self.viewport().height() - band, 1)
        whole = min(vw / w, vh / h, 1.2)
        self.resetTransform()
        if whole >= LEGIBLE_ZOOM:
            self.scale(whole, whole)
            self.centerOn((x0 + x1) / 2, (y0 + y1) / 2 - band / 2 / whole)
            return
        zoom = LEGIBLE_ZOOM  # as many boxes as stay legible (at 0.8, DenseNet121 opened showing five)
        self.scale(zoom, zoom)
        if self.layout_data.direction == "LR":  # a long row: from its start
            self.centerOn(x0 - 20 + vw / 2 / zoom, (y0 + y1) / 2 - band / 2 / zoom)
        else:  # (fitting a tall graph's height instead zoomed a 24-node chain in to 4 boxes)
            self.centerOn(self._spine_x(zoom), y0 - 20 - band / zoom + (vh + band) / 2 / zoom)

    def _spine_x(self, zoom: float) -> float:
        """Where a tall graph's view is centred across: its bounds' middle when its width fits, else the column
        most of the boxes in sight at its top are in (GPT-2: its token ids, embedding and their sum; the
        padding mask beside them scrolls into view), kept inside the bounds. Centred on the bounds, GPT-2 opened
        with its token embedding and its attention mask both cut."""
        x0, y0, x1, _ = self.layout_data.bounds
        half = max(self.viewport().width(), 1) / 2 / zoom
        if (x1 - x0 + 40) / 2 <= half:
            return (x0 + x1) / 2
        bottom = y0 + max(self.viewport().height(), 1) / zoom
        top = [b.x for b in self.layout_data.boxes.values() if b.y - b.h / 2 < bottom]  # x: a box's centre
        middle = statistics.median(top or [b.x for b in self.layout_data.boxes.values()])
        return min(max(middle, x0 - 20 + half), x1 + 20 - half)

    def wheelEvent(self, event) -> None:  # noqa: N802
        delta = event.angleDelta().y()
        if delta:
            self.zoom(1.0015**delta)
        event.accept()

    def focus_search(self) -> None:
        self.search.show()
        self.search.setFocus()
        self.search.selectAll()

    def _on_search_text(self, text: str, jump: bool = True) -> None:
        """Match boxes by id, title or type, and the nodes inside collapsed boxes by id (their box lights up;
        jumping to one expands what hides it)."""
        text = text.strip().lower()
        self._matches = []
        for box_id, item in self.items_by_id.items():
            hit = bool(text) and (
                text in box_id.lower() or text in item.box.title.lower() or text in item.box.subtitle.lower()
            )
            item.matched = hit
            if hit:
                self._matches.append(box_id)
        for member, box_id in self._member_of.items() if text else ():
            if member not in self.items_by_id and text in member.lower():
                self._matches.append(member)
                self.items_by_id[box_id].matched = True
        for item in self.items_by_id.values():
            item.update()
        self._match_index = -1
        if self._matches and jump:
            self.next_match()

    def next_match(self) -> None:
        if not self._matches:
            return
        self._match_index = (self._match_index + 1) % len(self._matches)
        node = self._matches[self._match_index]
        if node in self.items_by_id:
            self._go_to(node)
        else:  # inside a collapsed box: expand it, select the node when the new layout is drawn
            self._pending_reveal = node
            self.select_node(self._member_of[node])
            self.reveal_requested.emit(node)

    def _go_to(self, node: str) -> None:
        self.select_node(node)
        self.centerOn(self.items_by_id[node])
        self.node_clicked.emit(node)

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt's name
        """Esc in the Find box closes it: claimed before the window's Esc shortcut (Cancel) sees it."""
        keys = (QEvent.Type.ShortcutOverride, QEvent.Type.KeyPress)
        if obj is self.search and event.type() in keys and event.key() == Qt.Key.Key_Escape:
            if event.type() == QEvent.Type.ShortcutOverride:
                event.accept()
            else:
                self.search.clear()
                self.search.hide()
                self.setFocus()
            return True
        return super().eventFilter(obj, event)

    def _add_shortcuts(self) -> None:
        for keys, slot, tip in (
            ((QKeySequence.StandardKey.ZoomIn, "Ctrl+="), lambda: self.zoom(1.25), "Zoom in"),
            ((QKeySequence.StandardKey.ZoomOut, "Ctrl+-"), lambda: self.zoom(0.8), "Zoom out"),
            (("F",), self.fit_all, "Fit the graph"),
        ):
            action = QAction(tip, self)
            action.setShortcuts([QKeySequence(k) for k in keys])
            action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            action.triggered.connect(slot)
            self.addAction(action)

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self.search.move(self.viewport().width() - self.search.width() - 10, 10)
        # a short view (a dock open at 1024x640): the key lets the boxes under it show through (it hid the top
        # ones); the boxes stay clickable through it either way
        self._legend_fade.setOpacity(LEGEND_FADED if self.viewport().height() < SHORT_VIEW_PX else 1.0)
        if not self.user_zoomed and event.oldSize().isValid() and event.size() != event.oldSize():
            self.fit_all()  # (the window was resized or a dock opened: the graph follows until the user zooms)
            chosen = [i for i in self.scene().selectedItems() if isinstance(i, NodeItem)]
            if chosen:  # ...and the selected box (or a diagnosis' cut) stays in sight
                self.ensureVisible(chosen[0], 60, 60)
        self.minimap.refresh()


def _edge_item(points: tuple[tuple[float, float], ...]) -> QGraphicsPathItem:
    path = QPainterPath(QPointF(*points[0]))
    if len(points) == 2:
        path.lineTo(QPointF(*points[1]))
    else:  # smooth through the routing points
        for i in range(1, len(points) - 1):
            mid = QPointF((points[i][0] + points[i + 1][0]) / 2, (points[i][1] + points[i + 1][1]) / 2)
            path.quadTo(QPointF(*points[i]), mid)
        path.lineTo(QPointF(*points[-1]))
    end = QPointF(*points[-1])
    arrow = QPolygonF([end, end + QPointF(-4.5, -8), end + QPointF(4.5, -8)])
    item = QGraphicsPathItem(path)
    item.setBrush(Qt.BrushStyle.NoBrush)
    head = QGraphicsPathItem(item)
    hp = QPainterPath()
    hp.addPolygon(arrow)
    head.setPath(hp)
    head.setPen(Qt.PenStyle.NoPen)
    _style_edge(item, False)
    return item


def _style_edge(item: QGraphicsPathItem, on_cut_path: bool) -> None:
    color = DIAG_BORDER if on_cut_path else QColor("#8a96a3")
    item.setPen(QPen(color, 2.6 if on_cut_path else 1.3))
    item.setZValue(1.5 if on_cut_path else 1)
    for child in item.childItems():
        if isinstance(child, QGraphicsPathItem):
            child.setBrush(color)


def _fmt(x: float) -> str:
    return "nan" if x != x else f"{x:.3g}"


def _tooltip(item: NodeItem, stats: dict[str, NodeStats], rules: dict[str, str], skipped: bool = False) -> str:
    box = item.box
    if skipped:
        return (
            f"<b>{box.title}</b> <code>{box.id}</code><br>{box.subtitle}<br>The final softmax is skipped for class "
            "targets: the pre-softmax logit is explained, so no gradient arrives here."
        )
    if box.collapsed_group is not None:
        return f"<b>{box.collapsed_group}</b> ({box.subtitle})<br>Double-click to expand."
    lines = [f"<b>{box.title}</b> <code>{box.id}</code>", box.subtitle]
    if item.diag_role is not None:
        note = f" ({item.diag_note})" if item.diag_note and item.diag_role == "cut" else ""
        lines.append(f"<span style='color:#b71c1c'><b>diagnostics: {DIAGNOSIS_TEXT[item.diag_role]}{note}</b></span>")
    s = stats.get(box.id)
    if s is not None:
        if s.status != "ok":
            lines.append(f"<span style='color:#c2185b'><b>{STATUS_TEXT[s.status]}</b></span>")
        lines.append(f"mean|g| {_fmt(s.mean_abs)} · max|g| {_fmt(s.max_abs)} · norm {_fmt(s.norm)}")
        lines.append(f"zeros {s.zero_fraction:.0%}" if s.zero_fraction == s.zero_fraction else "")
    if box.id in rules:
        lines.append(f"rule: <b>{rules[box.id]}</b>")
    return "<br>".join(line for line in lines if line)
