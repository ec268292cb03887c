"""The questions asked before code from a file runs: a model that runs code when opened, a custom-objects file."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget


def ask_unsafe(parent: QWidget, message: str) -> bool:
    """Whether to open a model whose loading runs code from the file (a Lambda layer): the user's explicit yes."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Warning)
    box.setWindowTitle("This model runs code when it is opened")
    box.setText(message)
    box.setInformativeText("Only open it if you trust where the file came from.")
    anyway = box.addButton("Open anyway (runs code from the file)", QMessageBox.ButtonRole.AcceptRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.exec()
    return box.clickedButton() is anyway


def ask_custom_objects(parent: QWidget, path: str, message: str, file_filter: str) -> str | None:
    """The Python file that defines a model's custom objects, chosen by the user (None: give up)."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Warning)
    box.setWindowTitle("This model uses custom objects")
    box.setText(message)
    box.setInformativeText("Choose the Python file that defines them (it is imported, i.e. run: only files you trust).")
    choose = box.addButton("Choose custom-objects file…", QMessageBox.ButtonRole.AcceptRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.exec()
    if box.clickedButton() is not choose:
        return None
    chosen, _ = QFileDialog.getOpenFileName(parent, "Custom objects file", str(Path(path).parent), file_filter)
    return chosen or None
