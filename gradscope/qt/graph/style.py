"""The graph's colours and their key: the gradient-magnitude ramp, the status and path-diagnostics colours, rule
badges, and the legend drawn in the view's corner (``GraphLegend``)."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics, QLinearGradient, QPainter, QPen
from PySide6.QtWidgets import QWidget

# A light sequential ramp: black text stays readable on every step but the last.
RAMP = [QColor("#eef3fa"), QColor("#c6dbef"), QColor("#fde3a7"), QColor("#fc9d5f"), QColor("#d7301f")]
STATUS_COLORS = {
    "none": QColor("#4e5d6c"),  # no gradient reaches the node (cut / disconnected)
    "zero": QColor("#b9a7e0"),  # a gradient exists but is exactly zero everywhere
    "nan": QColor("#e0218a"),  # NaN or Inf in the gradient
}
STATUS_TEXT = {"none": "no gradient", "zero": "all zero", "nan": "NaN/Inf"}
SKIPPED = QColor("#e6e9ec")  # the final softmax when the logits are explained: not reached on purpose
NO_RESULT = QColor("#f7f7f7")
SELECT = QColor("#1a73e8")
MATCH = QColor("#fbbc04")
BADGE = QColor("#1565c0")
# Path diagnostics: the op that cuts a gradient path, and the nodes/edges on the path it cuts.
DIAGNOSIS_COLORS = {
    "cut": QColor("#c62828"),
    "blocked": QColor("#ffcdd2"),
    "path": QColor("#ffcdd2"),
}
DIAG_BORDER = QColor("#b71c1c")
HATCH = QColor(255, 255, 255, 45)
DIAG_UNREACHED = QColor("#ef6c00")  # variables that are unused / never read: not a cut, worth a look
DIAGNOSIS_TEXT = {
    "cut": "cuts the gradient",
    "blocked": "its weights get no gradient",
    "path": "on a cut path",
    "unused": "weights never reach the target",
    "never_read": "weights never read",
}
DIAG_RANK = {"cut": 0, "blocked": 1, "path": 2, "unused": 3, "never_read": 4}


def ramp_color(t: float) -> QColor:
    t = min(max(t, 0.0), 1.0) * (len(RAMP) - 1)
    i = min(int(t), len(RAMP) - 2)
    f = t - i
    a, b = RAMP[i], RAMP[i + 1]
    return QColor(
        round(a.red() + f * (b.red() - a.red())),
        round(a.green() + f * (b.green() - a.green())),
        round(a.blue() + f * (b.blue() - a.blue())),
    )


def rule_abbreviation(rule: str) -> str:
    parts = [p for p in rule.replace("-", "_").split("_") if p]
    if len(parts) == 1:
        return parts[0][:4]
    return "".join(p[0] for p in parts[:4]).upper()


class GraphLegend(QWidget):
    """Colour key in the view's corner: the magnitude ramp and the status colours."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.low = self.high = None
        self.caption = "mean |g| (log scale)"
        self.diagnosis = False  # add the path-diagnostics key
        self.magnitude = True  # False: nodes are not coloured by gradient magnitude (no ramp to explain)
        self.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents, True)
        self._resize()

    def set_diagnosis(self, shown: bool) -> None:
        self.diagnosis = shown
        self._resize()

    def set_magnitude(self, shown: bool) -> None:
        self.magnitude = shown
        self._resize()

    def _resize(self) -> None:
        if self.magnitude:
            self.setFixedSize(236, 104 if self.diagnosis else 86)
        else:
            self.setFixedSize(236, 78 if self.diagnosis else 40)
        self.update()

    def set_range(self, low: float | None, high: float | None, caption: str) -> None:
        self.low, self.high, self.caption = low, high, caption
        self.update()

    def paintEvent(self, event) -> None:  # noqa: N802
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        p.setPen(QPen(QColor("#c0c6cc")))
        p.setBrush(QColor(255, 255, 255, 235))
        p.drawRoundedRect(QRectF(0.5, 0.5, self.width() - 1, self.height() - 1), 6, 6)
        font = QFont(self.font())
        font.setPointSizeF(8.0)
        p.setFont(font)
        p.setPen(QColor("#263238"))
        p.drawText(QRectF(8, 3, self.width() - 16, 15), Qt.AlignmentFlag.AlignLeft, self.caption)
        if not self.magnitude:
            self._paint_diagnosis_key(p, font, 22)
            p.end()
            return
        grad = QLinearGradient(8, 0, self.width() - 8, 0)
        for i, c in enumerate(RAMP):
            grad.setColorAt(i / (len(RAMP) - 1), c)
        p.setPen(QPen(QColor("#90a4ae")))
        p.setBrush(QBrush(grad))
        p.drawRect(QRectF(8, 20, self.width() - 16, 11))
        p.setPen(QColor("#263238"))
        lo = "-" if self.low is None else f"{self.low:.1e}"
        hi = "-" if self.high is None else f"{self.high:.1e}"
        p.drawText(QRectF(8, 32, 100, 14), Qt.AlignmentFlag.AlignLeft, lo)
        p.drawText(QRectF(self.width() - 108, 32, 100, 14), Qt.AlignmentFlag.AlignRight, hi)
        x = 8.0
        for status, color in STATUS_COLORS.items():
            p.setPen(QPen(color.darker(150), 1.2, Qt.PenStyle.DashLine))
            p.setBrush(color)
            p.drawRoundedRect(QRectF(x, 51, 12, 12), 3, 3)
            p.setPen(QColor("#263238"))
            label = STATUS_TEXT[status]
            p.drawText(QPointF(x + 16, 61), label)
            x += 22 + QFontMetrics(font).horizontalAdvance(label)
        p.setBrush(BADGE)
        p.setPen(Qt.PenStyle.NoPen)
        p.drawRoundedRect(QRectF(8, 68, 20, 12), 6, 6)
        p.setPen(QColor("#263238"))
        p.drawText(QPointF(34, 79), "rule on the node (badge)")
        self._paint_diagnosis_key(p, font, 86)
        p.end()

    def _paint_diagnosis_key(self, p: QPainter, font: QFont, y: float) -> None:
        if not self.diagnosis:
            if not self.magnitude:
                p.drawText(QPointF(8, y + 10), "no cut found: nothing to mark")
            return
        x = 8.0
        for role in ("cut", "path"):
            color, label = DIAGNOSIS_COLORS[role], DIAGNOSIS_TEXT[role]
            p.setPen(QPen(DIAG_BORDER, 1.6))
            p.setBrush(color)
            p.drawRoundedRect(QRectF(x, y, 12, 12), 3, 3)
            if role == "cut":
                p.setBrush(QBrush(HATCH, Qt.BrushStyle.BDiagPattern))
                p.drawRoundedRect(QRectF(x, y, 12, 12), 3, 3)
            p.setPen(QColor("#263238"))
            p.drawText(QPointF(x + 16, y + 10), label)
            x += 26 + QFontMetrics(font).horizontalAdvance(label)
        if not self.magnitude:
            p.setPen(QPen(DIAG_UNREACHED, 1.6, Qt.PenStyle.DashLine))
            p.setBrush(NO_RESULT)
            p.drawRoundedRect(QRectF(8, y + 18, 12, 12), 3, 3)
            p.setPen(QColor("#263238"))
            p.drawText(QPointF(24, y + 28), "weights unused / never read")
            p.setBrush(BADGE)
            p.setPen(Qt.PenStyle.NoPen)
            p.drawRoundedRect(QRectF(8, y + 36, 20, 12), 6, 6)
            p.setPen(QColor("#263238"))
            p.drawText(QPointF(34, y + 47), "rule on the node (badge)")
