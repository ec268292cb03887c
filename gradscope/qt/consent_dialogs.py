"""The questions asked before code from a file runs: a model that runs code when opened, a custom-objects file."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget


def _agreed(parent: QWidget, title: str, message: str, advice: str, accept: str) -> bool:
    """A warning with ``accept`` and Cancel; True only when the user pressed ``accept``."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Warning)
    box.setWindowTitle(title)
    box.setText(message)
    box.setInformativeText(advice)
    yes = box.addButton(accept, QMessageBox.ButtonRole.AcceptRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.exec()
    return box.clickedButton() is yes


def ask_unsafe(parent: QWidget, message: str) -> bool:
    """Whether to open a model whose loading runs code from the file (a Lambda layer): the user's explicit yes."""
    return _agreed(
        parent,
        "This model runs code when it is opened",
        message,
        "Only open it if you trust where the file came from.",
        "Open anyway (runs code from the file)",
    )


def ask_custom_objects(parent: QWidget, path: str, message: str, file_filter: str) -> str | None:
    """The Python file that defines a model's custom objects, chosen by the user (None: give up)."""
    if not _agreed(
        parent,
        "This model uses custom objects",
        message,
        "Choose the Python file that defines them (it is imported, i.e. run: only files you trust).",
        "Choose custom-objects file…",
    ):
        return None
    chosen, _ = QFileDialog.getOpenFileName(parent, "Custom objects file", str(Path(path).parent), file_filter)
    return chosen or None
