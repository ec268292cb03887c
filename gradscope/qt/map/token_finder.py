"""Finding one's way in a long token strip (2,048 tokens wrap into ~100 lines): find a token by its text, step
through the tokens with the largest scores, each framed on the strip and scrolled into view."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QToolButton, QWidget


class TokenFinder(QWidget):
    """A find field and a "Top" button over the strip; ``on_pick(index, scroll)`` frames token ``index`` (None: no
    frame) and, with ``scroll``, scrolls it into view.
    Enter finds the next token holding the text (Shift+Enter: the one before), Top the next largest |score|,
    Esc clears the field and the frame."""

    def __init__(self, on_pick: Callable[[int | None, bool], None], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._on_pick = on_pick
        self._labels: list[str] = []
        self._scores = np.zeros(0)
        self._order: list[int] = []  # token indices by |score|, largest first
        self._current: int | None = None
        self._top_rank = -1
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        self.field = QLineEdit()
        self.field.setObjectName("token_find")
        self.field.setPlaceholderText("Find a token…")
        self.field.setToolTip(
            "Part of a token's text. Enter: the next token holding it; Shift+Enter: the one before; Esc: clear"
        )
        self.field.setClearButtonEnabled(True)
        self.field.returnPressed.connect(lambda: self.find(forward=True))
        self.field.installEventFilter(self)
        self.top = QToolButton()
        self.top.setText("Top ▸")
        self.top.setToolTip("The token with the next largest score (|score|), framed on the strip")
        self.top.clicked.connect(self.next_top)
        self.status = QLabel()
        self.status.setStyleSheet("color:#546e7a")
        lay.addWidget(self.field, 2)
        lay.addWidget(self.top)
        lay.addWidget(self.status, 3)

    def set_tokens(self, labels: Sequence[str], scores: np.ndarray) -> None:
        """The strip's tokens and scores; a frame on a token that is still there stays."""
        same = list(labels) == self._labels
        self._labels = list(labels)
        self._scores = np.asarray(scores, np.float64).reshape(-1)
        magnitude = np.nan_to_num(np.abs(self._scores), nan=-1.0)
        self._order = [int(i) for i in np.argsort(-magnitude, kind="stable")]
        if not same:
            self._current, self._top_rank = None, -1
            self.status.setText(f"{len(self._labels):,} tokens")
        elif self._current is not None:
            self._show(self._current, scroll=False)  # a new picture of the same tokens (another method, colormap)

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt's name
        """In the field: Shift+Enter finds backwards; Esc clears the field and the frame, claimed before the
        window's Esc shortcut (Cancel) sees it."""
        if obj is self.field and event.type() in (QEvent.Type.ShortcutOverride, QEvent.Type.KeyPress):
            if event.key() == Qt.Key.Key_Escape:
                if event.type() == QEvent.Type.ShortcutOverride:
                    event.accept()
                else:
                    self.clear()
                return True
            shift = event.modifiers() & Qt.KeyboardModifier.ShiftModifier
            if event.type() == QEvent.Type.KeyPress and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and shift:
                self.find(forward=False)
                return True
        return super().eventFilter(obj, event)

    def clear(self) -> None:
        """No text, no frame."""
        self.field.clear()
        self._current, self._top_rank = None, -1
        self._on_pick(None, False)
        self.status.setText(f"{len(self._labels):,} tokens")

    def find(self, forward: bool = True) -> int | None:
        """The next (or previous) token after the framed one whose text holds the field's text, ignoring case."""
        needle = self.field.text().strip().casefold()
        if not needle or not self._labels:
            return None
        n = len(self._labels)
        start = self._current if self._current is not None else (-1 if forward else n)
        step = 1 if forward else -1
        for k in range(1, n + 1):
            i = (start + step * k) % n
            if needle in self._labels[i].casefold():
                self._top_rank = -1
                self._show(i)
                return i
        self.status.setText(f"No token holds {self.field.text().strip()!r}")
        return None

    def next_top(self) -> int | None:
        """The token with the next largest |score| (after the last, the largest again)."""
        if not self._order:
            return None
        self._top_rank = (self._top_rank + 1) % len(self._order)
        i = self._order[self._top_rank]
        self._show(i)
        return i

    def _show(self, i: int, scroll: bool = True) -> None:
        self._current = i
        rank = self._order.index(i) + 1
        self.status.setText(
            f"token {i + 1:,} of {len(self._labels):,}: {self._labels[i]!r}, score {self._scores[i]:.3g} "
            f"(#{rank:,} by size)"
        )
        self._on_pick(i, scroll)
