"""The one place TensorFlow and Keras are imported (quietly, with the TF backend forced).

It sits below rules, io and engine (which use TensorFlow) and above core (which never does)."""

from __future__ import annotations

import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def _import_quietly():
    """Import TensorFlow with C++ start-up chatter (oneDNN notices, absl warnings) kept off the terminal.

    TF 2.21 prints these through absl before its log level applies, so only redirecting fd 2 hides them.
    Python errors still propagate (they are exceptions, not fd-2 writes).
    """
    import sys

    saved = None
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except OSError:  # no usable fd 2 (e.g. some embedded interpreters): import loudly
        saved = None
    try:
        import keras as keras_module
        import tensorflow as tf_module

        tf_module.constant(0.0)  # the first op initialises the runtime, which logs too
    finally:
        if saved is not None:
            os.dup2(saved, 2)
            os.close(saved)
    return keras_module, tf_module


keras, tf = _import_quietly()


class _NoRetracingWarning(logging.Filter):
    """Drop TF's "N out of the last N calls ... triggered tf.function retracing" warning: the live engine makes
    one small tf.function per kernel on purpose, and the warning would tell the user to change their code."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()


tf.get_logger().addFilter(_NoRetracingWarning())

if keras.backend.backend() != "tensorflow":  # pragma: no cover - depends on the user's environment
    from gradscope.core.errors import GradscopeError

    raise GradscopeError(
        f"gradscope needs the TensorFlow backend of Keras, but KERAS_BACKEND is {keras.backend.backend()!r}. "
        "Unset KERAS_BACKEND or set it to 'tensorflow'."
    )

__all__ = ["keras", "tf"]
