"""The one place TensorFlow and Keras are imported for the engine (quietly, with the TF backend forced)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

if keras.backend.backend() != "tensorflow":  # pragma: no cover - depends on the user's environment
    from gradscope.core.errors import GradscopeError

    raise GradscopeError(
        f"gradscope needs the TensorFlow backend of Keras, but KERAS_BACKEND is {keras.backend.backend()!r}. "
        "Unset KERAS_BACKEND or set it to 'tensorflow'."
    )

__all__ = ["keras", "tf"]
