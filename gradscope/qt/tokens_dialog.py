"""The Type tokens dialog (Ctrl+T): a prompt or token ids as the input, in a box wide enough to read a sentence
(QInputDialog's was 219 x 94 px, most of a sentence out of sight). Enter takes it, Shift+Enter starts a line."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

MIN_WIDTH, LINES = 560, 4


class _PromptEdit(QPlainTextEdit):
    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt's name
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.window().accept()
            return
        super().keyPressEvent(event)


class TypeTokensDialog(QDialog):
    def __init__(self, how: str, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Type tokens")
        lay = QVBoxLayout(self)
        label = QLabel(f"The input, as {how} (Enter to explain, Shift+Enter for a new line):")
        label.setWordWrap(True)
        self.edit = _PromptEdit()
        self.edit.setPlainText(text)
        self.edit.setObjectName("typed_tokens")
        self.edit.setMinimumHeight(self.edit.fontMetrics().lineSpacing() * LINES + 12)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay.addWidget(label)
        lay.addWidget(self.edit)
        lay.addWidget(buttons)
        width = MIN_WIDTH if parent is None else max(MIN_WIDTH, min(900, int(parent.width() * 0.6)))
        self.resize(width, self.sizeHint().height())
        self.edit.selectAll()

    def text(self) -> str:
        return self.edit.toPlainText().strip()
