"""Combo and spin boxes take the mouse wheel only once focused (a click or Tab): scrolling a panel never changes a
choice that passes under the pointer (scrolling the inspector turned the method preset from "gradient" to
"lrp_alpha_beta" without a click). The wheel goes on to the panel beneath, which scrolls."""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractSpinBox, QComboBox, QWidget


class WheelOnlyWhenFocused(QObject):
    """An application-wide event filter (``QApplication.installEventFilter``)."""

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if event.type() != QEvent.Type.Wheel or not isinstance(obj, (QComboBox, QAbstractSpinBox)):
            return False
        if obj.focusPolicy() == Qt.FocusPolicy.WheelFocus:
            obj.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # the wheel alone never focuses it
        if obj.hasFocus():
            return False
        parent = obj.parentWidget()
        while parent is not None and isinstance(parent, (QComboBox, QAbstractSpinBox)):
            parent = parent.parentWidget()
        if isinstance(parent, QWidget):
            QCoreApplication.sendEvent(parent, event)
        return True
