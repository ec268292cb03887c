"""Lazy, quiet import of Keras for the io package (so ``import gradscope.io`` stays cheap)."""

from __future__ import annotations

import os
from typing import Any


def import_keras() -> Any:
    """Keras with the TensorFlow backend, imported on first use with TensorFlow's C++ logging quietened."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    return keras
