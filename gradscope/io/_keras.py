"""Lazy, quiet import of Keras for the io package (so ``import gradscope.io`` stays cheap)."""

from __future__ import annotations

from typing import Any


def import_keras() -> Any:
    """Keras with the TensorFlow backend, imported on first use with TensorFlow's C++ logging quietened."""
    from gradscope.backend import keras  # quiet start-up, TensorFlow backend checked

    return keras


HF_INSTALL = "pip install 'gradscope[hf]'"  # keras-hub and what its tokenizers and converters import


def missing_hf(what: str, exc: ImportError) -> str:
    """Why ``what`` cannot be opened, naming the module that failed to import (keras-hub installed with --no-deps
    lacked ``regex``: the old message, "needs keras_hub", came back after its own command) and the one fix."""
    name = getattr(exc, "name", None) or str(exc)
    return f"{what} needs keras_hub, whose import failed on the module {name!r}: `{HF_INSTALL}` installs it all."


def import_keras_hub() -> Any:
    """keras_hub (ImportError where it is not installed), without the warning its progress bars print in a
    notebook that lacks ipywidgets (tqdm.auto's "IProgress not found", shown above every first map)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import keras_hub

    return keras_hub
