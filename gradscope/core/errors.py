"""Typed errors. Every front end (CLI, GUI) shows ``str(error)`` to the user, never a traceback.

Messages are written for the person using the tool: what went wrong and what to do about it.
"""

from __future__ import annotations

EXIT_USER_ERROR = 2  # every front end's exit status for a user error (bad input, bad file): one line, no traceback
EXIT_BUG = 3  # an exception gradscope did not raise on purpose


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C: a KeyboardInterrupt, or the SystemError Python raises when the interrupt
    lands inside a C function that then returns a value (numpy's ``__array__``: "returned a result with an
    exception set", the KeyboardInterrupt as its cause)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, KeyboardInterrupt):
            return True
        if not isinstance(exc, SystemError):
            return False
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class GradscopeError(Exception):
    """Base of every error gradscope raises on purpose."""


class ModelLoadError(GradscopeError):
    """A model file could not be opened (missing, not a model, corrupt, unsupported)."""


class UnsafeModelError(ModelLoadError):
    """The model needs unsafe deserialization (e.g. a Lambda layer) and the user has not opted in."""


class CustomObjectError(ModelLoadError):
    """The model uses a custom layer/function that is not registered or supplied."""

    def __init__(self, message: str, object_name: str | None = None) -> None:
        super().__init__(message)
        self.object_name = object_name


class InputError(GradscopeError):
    """An input (image, token ids, text, array, CSV row) could not be read or does not fit the model."""


class ImageLoadError(InputError):
    """An input image could not be read or does not fit the model."""


class ArgumentError(GradscopeError, TypeError):
    """A Python API argument of the wrong type or value, named at the API's edge (never inside NumPy or TF)."""


class PlanError(GradscopeError):
    """A plan (selector -> rule) is malformed or refers to unknown nodes/rules/parameters."""


class RuleError(GradscopeError):
    """A rule failed: bad parameters, raised inside backward, or returned wrong shapes/dtypes."""


class RuleFileError(RuleError):
    """A user rule file failed to import or defines no rules."""


class TargetError(GradscopeError):
    """The requested target (class, neuron, channel, loss) does not exist in the model."""


class GraphError(GradscopeError):
    """The model's graph cannot be walked (unknown node id, unsupported model structure)."""


class MissingKernelError(GradscopeError):
    """TensorFlow on this machine has no kernel for an op a layer needs (it depends on the build and the CPU)."""

    def __init__(self, message: str, node_id: str | None = None) -> None:
        super().__init__(message)
        self.node_id = node_id


class WorkerStuckError(GradscopeError):
    """A computation did not stop when cancelled (a rule blocked in native code). TensorFlow runs on one thread
    only, so nothing else can compute until it returns."""


class Cancelled(GradscopeError):
    """Long work was cancelled by the user."""
