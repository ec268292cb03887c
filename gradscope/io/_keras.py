"""Lazy, quiet import of Keras for the io package (so ``import gradscope.io`` stays cheap)."""

from __future__ import annotations

from typing import Any


def import_keras() -> Any:
    """Keras with the TensorFlow backend, imported on first use with TensorFlow's C++ logging quietened."""
    from gradscope.backend import keras  # quiet start-up, TensorFlow backend checked

    return keras
