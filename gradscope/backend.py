"""The one place TensorFlow and Keras are imported (quietly, with the TF backend forced).

It sits below rules, io and engine (which use TensorFlow) and above core (which never does)."""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")


# The versions the tests run on (README "Install" says how): older ones are refused, newer ones warned about.
SUPPORTED_TENSORFLOW = ((2, 19), (2, 21))
SUPPORTED_KERAS = ((3, 10), (3, 15))


def _range(bounds: tuple[tuple[int, int], tuple[int, int]]) -> str:
    (a, b), (c, d) = bounds
    return f"{a}.{b}-{c}.{d}"


def version_tuple(version: str, parts: int = 3) -> tuple[int, ...]:
    """``"3.15.1"`` -> ``(3, 15, 1)``; digits only per part (``"2.21.0rc1"`` -> ``(2, 21, 0)``), zero-padded."""
    numbers = [int("".join(ch for ch in p.split("rc")[0] if ch.isdigit()) or 0) for p in version.split(".")[:parts]]
    return tuple(numbers + [0] * (parts - len(numbers)))


def version_problem(name: str, version: str, bounds: tuple[tuple[int, int], tuple[int, int]]) -> tuple[bool, str]:
    """(fatal, message) when ``version`` of ``name`` lies outside ``bounds``; (False, "") when inside."""
    have = version_tuple(version, 2)
    if have < bounds[0]:
        return True, (
            f"gradscope needs {name} {_range(bounds)}; this environment has {name} {version}. "
            f"Upgrade it (`pip install '{name.lower()}>={bounds[0][0]}.{bounds[0][1]}'`)."
        )
    if have > bounds[1]:
        return False, (
            f"gradscope is tested with {name} {_range(bounds)}; this environment has {name} {version}. "
            "It may work; if something fails, please report it with this line."
        )
    return False, ""


@contextmanager
def quiet_native_stderr():
    """What C++ writes to fd 2 inside the block goes nowhere: TensorFlow's start-up chatter (oneDNN notices, absl
    warnings, printed before its log level applies) and the runtime's own lines (a check_numerics abort logged by
    ``local_rendezvous``), which a terminal shows and a Jupyter kernel turns into red blocks under a cell. Python
    errors still propagate (they are exceptions, not fd-2 writes)."""
    import sys

    saved = None
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except OSError:  # no usable fd 2 (e.g. some embedded interpreters): loudly
        saved = None
    try:
        yield
    finally:
        if saved is not None:
            os.dup2(saved, 2)
            os.close(saved)


def _import_quietly():
    """Import TensorFlow and Keras with TensorFlow's C++ start-up chatter kept off the terminal."""
    with quiet_native_stderr():
        try:
            import tensorflow as tf_module
        except ImportError as exc:
            from gradscope.core.errors import GradscopeError

            raise GradscopeError(
                f"gradscope needs TensorFlow {_range(SUPPORTED_TENSORFLOW)}, and this Python environment has none "
                f"({exc}). Install one beside gradscope: `pip install 'gradscope[cpu]'` (CPU build), "
                "`pip install 'gradscope[gpu]'` (NVIDIA GPUs), or `pip install tensorflow`."
            ) from exc
        import keras as keras_module

        tf_module.constant(0.0)  # the first op initialises the runtime, which logs too
    return keras_module, tf_module


keras, tf = _import_quietly()


def _check_versions() -> None:
    import warnings

    from gradscope.core.errors import GradscopeError

    for name, version, bounds in (
        ("TensorFlow", tf.__version__, SUPPORTED_TENSORFLOW),
        ("Keras", keras.__version__, SUPPORTED_KERAS),
    ):
        fatal, message = version_problem(name, version, bounds)
        if fatal:
            raise GradscopeError(message)
        if message:
            warnings.warn(message, RuntimeWarning, stacklevel=3)


_check_versions()


@functools.cache
def check_keras_internals() -> None:
    """Raise a clear GraphError when this Keras lacks the private graph API the engine walks models with
    (``engine/backward/keras_graph.py``): without it every functional model would look like one opaque layer."""
    from gradscope.core.errors import GraphError

    inp = keras.Input((2,))
    dense = keras.layers.Dense(1)
    out = dense(inp)
    model = keras.Model(inp, out)
    node = dense._inbound_nodes[0] if getattr(dense, "_inbound_nodes", None) else None
    sequential = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    needed = {
        "Functional._nodes_by_depth": hasattr(model, "_nodes_by_depth"),
        "Functional._inputs": hasattr(model, "_inputs"),
        "Layer._inbound_nodes": node is not None,
        "Node.operation / input_tensors / is_input": node is not None
        and all(hasattr(node, a) for a in ("operation", "input_tensors", "is_input")),
        "Node.arguments.fill_in": node is not None and hasattr(getattr(node, "arguments", None), "fill_in"),
        "KerasTensor._keras_history": hasattr(out, "_keras_history"),
        "Sequential._functional": getattr(sequential, "_functional", None) is not None,
        "Layer.stateless_call": hasattr(dense, "stateless_call"),
    }
    missing = [name for name, ok in needed.items() if not ok]
    if missing:
        raise GraphError(
            f"This Keras ({keras.__version__}) no longer has the internals gradscope walks models with "
            f"({', '.join(missing)}). gradscope supports Keras {_range(SUPPORTED_KERAS)}: "
            f"`pip install 'keras<{SUPPORTED_KERAS[1][0]}.{SUPPORTED_KERAS[1][1] + 1}'`."
        )


class _NoRetracingWarning(logging.Filter):
    """Drop TF's "N out of the last N calls ... triggered tf.function retracing" warning: the live engine makes
    one small tf.function per kernel on purpose, and the warning would tell the user to change their code."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()


tf.get_logger().addFilter(_NoRetracingWarning())


def gradient_function(op):
    """The gradient function TF registered for a graph op, or None (the registry has no public accessor)."""
    from tensorflow.python.framework import ops as tf_ops

    try:
        return tf_ops.get_gradient_function(op)
    except LookupError:
        return None


def keras_saving_steps():
    """Keras's saving module if it has the two steps ``load_model`` is made of (model from config, then
    weights), else None. They are internal, so a Keras without them is simply loaded in one step."""
    try:
        from keras.src.saving import saving_lib
    except ImportError:
        return None
    needed = ("_model_from_config", "_load_state", "_raise_loading_failure", "H5IOStore")
    return saving_lib if all(hasattr(saving_lib, name) for name in needed) else None


_PENDING = "uninitialized_variables"  # Keras's per-thread list of variables made in a stateless scope


def build_without_initializers(build: Any) -> tuple[Any, list[Any] | None]:
    """``build()`` (a model from its config) with the Keras variables it creates left uninitialized: Keras's
    stateless scope defers their initializers, and ``loaded_in_place`` later gives each its loaded value.
    Returns ``(model, pending variables)``; ``(model, None)`` where this Keras lacks the pieces or the build
    needs initialized variables (a layer that writes one while building): then it ran as Keras runs it."""
    try:
        from keras import StatelessScope, Variable
        from keras.src.backend.common import global_state
    except ImportError:
        return build(), None
    if not (hasattr(Variable, "_initialize") and hasattr(Variable, "_deferred_initialize")):
        return build(), None
    before = list(global_state.get_global_attribute(_PENDING, None) or [])
    try:
        with StatelessScope(initialize_variables=False):
            model = build()
    except Exception:
        global_state.set_global_attribute(_PENDING, before)  # the half-built model's variables
        return build(), None  # a real error in the config is raised again, from Keras's own path
    pending = list(global_state.get_global_attribute(_PENDING, None) or [])[len(before) :]
    # Off Keras's list: its next stateless scope would otherwise run their initializers after all.
    global_state.set_global_attribute(_PENDING, before)
    return model, pending


@contextmanager
def loaded_in_place(model: Any, pending: list[Any] | None) -> Iterator[None]:
    """Load weights (Keras's ``variable.assign`` calls) into ``model``: with ``pending`` (from
    ``build_without_initializers``) the assignments are collected in a stateless scope and each pending
    variable is created from its value (no initial tensor to overwrite); a pending variable the weights do
    not name gets its initializer, as Keras would. Without ``pending``, a plain load."""
    if pending is None:
        yield
        return
    from keras import StatelessScope

    with StatelessScope(initialize_variables=False) as scope:
        yield
    uninitialized = {id(v) for v in pending}
    for v in {id(v): v for v in [*pending, *model.variables]}.values():
        value = scope.get_current_value(v)
        if id(v) in uninitialized and v._value is None:
            if value is None:
                v._deferred_initialize()
            else:
                v._initialize(value)
        elif value is not None:
            v.assign(value)


# ------------------------------------------------------------------------------------- checkpoint folders
# keras_hub's converters build the model, which runs every variable's initializer (random numbers over a billion
# weights, in float32 before the cast), then read each checkpoint tensor and ``assign`` it: the model's memory was
# taken twice and most of an open was spent drawing numbers that are thrown away (1 B Llama: 23 s, peak 6.3 GB).
# While a folder is opened, a variable's initializer is held back (Keras' own deferred state: no value, the
# initializer kept for shape inference) and the converter's ``assign`` creates the variable from the checkpoint's
# tensor; a variable the converter does not write is initialised at the end, as Keras would have. Unlike
# ``build_without_initializers`` (a stateless scope that collects every value until its end), each variable takes
# its memory as its tensor arrives, so the peak is the weights and one tensor.
_WRITTEN_ONCE_LOCK = threading.Lock()  # the patch is the process's: two opens at once would restore each other's


@contextmanager
def weights_written_once(held: list[Any] | None = None, *, finish: bool = True) -> Iterator[list[Any]]:
    """Inside: every Keras variable this thread creates with an initializer waits for its first ``assign`` to take
    memory (other threads' variables are created as usual: the window computes maps while a model opens). Yields
    the list of waiting variables (``held``: continue an earlier block's). At the end, with ``finish``, a variable
    nothing assigned gets its initializer, unless the block raised (a cancelled open: the model is thrown away);
    without, they keep waiting for a later block. Keras' TensorFlow backend only; elsewhere a plain block."""
    held = [] if held is None else held
    try:
        from keras.src.backend.common.variables import Variable as KerasVariable
        from keras.src.backend.tensorflow.core import Variable
    except ImportError:  # another Keras layout: open as keras_hub does
        yield held
        return
    opener = threading.get_ident()
    initialize_with = Variable._initialize_with_initializer
    assign = KerasVariable.assign

    def hold(self: Any, initializer: Any) -> None:
        if threading.get_ident() != opener:
            initialize_with(self, initializer)
            return
        self._value = None  # Keras' uninitialised state: shape inference reads ``_initializer`` instead
        self._initializer = initializer
        self._gradscope_held = initializer
        held.append(self)

    def write(self: Any, value: Any) -> Any:
        if self._value is None and getattr(self, "_gradscope_held", None) is not None:
            tensor = self._convert_to_tensor(laid_out(value), dtype=self._dtype)
            if tuple(tensor.shape) != tuple(self.shape):
                return assign(self, value)  # Keras' own message about the shapes
            self._initialize(tensor)
            self._initializer = self._gradscope_held = None
            return tensor
        return assign(self, value)

    with _WRITTEN_ONCE_LOCK:
        Variable._initialize_with_initializer = hold
        KerasVariable.assign = write
        try:
            yield held
        except BaseException:
            finish = False
            raise
        finally:
            Variable._initialize_with_initializer = initialize_with
            KerasVariable.assign = assign
        if finish:
            for variable in held:  # what the converter did not write: its initializer, as Keras would have run it
                if variable._value is None:
                    initialize_with(variable, variable._gradscope_held)
                    variable._initializer = None
                variable._gradscope_held = None


def laid_out(value: Any) -> Any:
    """A checkpoint tensor as a TensorFlow tensor in order, made without the copies ``convert_to_tensor`` makes:
    TensorFlow copies every array it converts, through numpy for an ml_dtypes type (a 1 B Llama's 512 MB bfloat16
    embedding: 2.8-3.7 s, where a memcpy takes 0.16 s), and numpy copies a transposed view element by element. An
    array in its stored order is handed over as it lies (DLPack: no copy, 64-byte aligned as TensorFlow's kernels
    need) and a transposed one is laid out by ``tf.transpose``, blocked and threaded."""
    if not isinstance(value, np.ndarray):
        return value
    order = np.argsort(value.strides, kind="stable")[::-1]  # the axes as they lie in memory
    stored = value.transpose(order)
    if not stored.flags.c_contiguous:  # a slice, not a permutation: numpy's copy
        stored, order = np.ascontiguousarray(value), np.arange(value.ndim)
    tensor = _handed_over(stored)
    inverse = np.argsort(order)
    return tensor if (inverse == np.arange(value.ndim)).all() else tf.transpose(tensor, inverse)


def _handed_over(array: np.ndarray) -> Any:
    """``array`` (C-contiguous) as a tensor sharing its memory where DLPack can carry its bits, else converted."""
    dtype = array.dtype
    if dtype.kind not in "fiuV" or dtype.itemsize not in (1, 2, 4, 8) or array.size == 0:
        return tf.convert_to_tensor(array)
    if array.ctypes.data % 64:
        aligned = aligned_empty(array.shape, dtype)
        aligned[...] = array
        array = aligned
    bits = array.view(f"u{dtype.itemsize}")
    try:
        tensor = tf.experimental.dlpack.from_dlpack(bits.__dlpack__())
        return tf.bitcast(tensor, tf.as_dtype(dtype))
    except (TypeError, ValueError, AttributeError, tf.errors.InvalidArgumentError):
        return tf.convert_to_tensor(array)


def aligned_empty(shape: tuple[int, ...], dtype: Any, align: int = 64) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``align``-byte boundary (TensorFlow's kernels
    check 64 bytes on memory they did not allocate)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def keras_train_step_internals(model) -> list[str]:
    """What ``GradientMonitor`` needs of Keras' TensorFlow trainer to run its train step as Keras does (the loss
    tracker, the loss wrapper, the step-function builder, the loss unscaling); the names this Keras lacks."""
    try:
        from keras.src.losses.loss import unscale_loss_for_distribution  # noqa: F401
    except ImportError:
        missing = ["keras.src.losses.loss.unscale_loss_for_distribution"]
    else:
        missing = []
    try:
        from keras.src.backend.tensorflow.trainer import reduce_per_replica  # noqa: F401
    except ImportError:
        missing.append("keras.src.backend.tensorflow.trainer.reduce_per_replica")
    for name in ("_loss_tracker", "_compute_loss", "_make_function"):
        if not hasattr(model, name):
            missing.append(f"Model.{name}")
    optimizer = getattr(model, "optimizer", None)
    reducer = getattr(optimizer, "inner_optimizer", optimizer)
    if reducer is not None and not hasattr(reducer, "_all_reduce_sum_gradients"):  # used under tf.distribute
        missing.append("TFOptimizer._all_reduce_sum_gradients")
    return missing


def reduce_per_replica(values, strategy):
    """The step's logs of every replica made one, as Keras' own train function makes them."""
    from keras.src.backend.tensorflow.trainer import reduce_per_replica as reduce

    return reduce(values, strategy, reduction="auto")


def unscale_loss_for_distribution(loss):
    """The loss as Keras' train step gives it to the loss tracker (per-replica scaling undone)."""
    from keras.src.losses.loss import unscale_loss_for_distribution as unscale

    return unscale(loss)


def write_summary(writer, tag: str, tensor, step, metadata: bytes):
    """One event into ``writer`` (a ``tf.summary`` file writer), as ``tf.summary.write`` writes it, in one op.
    The public function adds a cond, a name scope and an identity per event (ResNet50's record has ~800 events,
    every op lengthening the first trace), and needs ``writer.as_default()``, whose exit flushes the file inside
    the step: a full disk then fails the step itself. Here nothing flushes; the monitor flushes from Python,
    where a failure is caught."""
    from tensorflow.python.ops import gen_summary_ops

    with tf.device("cpu:0"):
        return gen_summary_ops.write_summary(writer._resource, step, tensor, tag, metadata)


def tape_vjp(tape, targets: list, sources: list, output_gradients: list) -> list:
    """``tape.gradient(targets, sources, output_gradients)`` for flat lists of plain eager tensors, without
    the public method's structure handling (flattening, composite tensors, variables): ~0.6 ms a call, a
    fifth of a cold live sweep on ResNet50 (one call per node). Falls back to the public method."""
    try:
        from tensorflow.python.eager import imperative_grad
        from tensorflow.python.ops.unconnected_gradients import UnconnectedGradients
    except ImportError:  # pragma: no cover - a TensorFlow without these internals
        return tape.gradient(targets, sources, output_gradients=output_gradients)
    return imperative_grad.imperative_grad(
        tape._tape,
        targets,
        sources,
        output_gradients=output_gradients,
        sources_raw=sources,
        unconnected_gradients=UnconnectedGradients.NONE,
    )


_CONV_GRADIENTS_LOCK = threading.Lock()
_conv_gradients_users = 0
_conv_gradients_saved: dict[str, object] = {}


def _input_only(original, backprop_input, attrs: tuple[str, ...]):
    def gradient(op, grad):
        skip = getattr(op, "skip_input_indices", None)
        if skip is None or 1 not in skip or 0 in skip:
            return original(op, grad)
        kwargs = {name: op.get_attr(name) for name in attrs}
        return [backprop_input(tf.shape(op.inputs[0]), op.inputs[1], grad, **kwargs), None]

    return gradient


@contextmanager
def input_only_conv_gradients():
    """Inside this block, a tape that needs only a convolution's input gradient does not compute its filter
    gradient. TF's Conv2D and depthwise gradients compute both whatever the tape asks (MatMul's and Mul's skip
    what is not needed, through ``op.skip_input_indices``); the live sweep asks only for input gradients, and
    the unused filter gradients were ~30 % of its eager work on ResNet50. The result is the same op TF runs
    for the input gradient; a filter gradient that is asked for is computed as before. Swapped into TF's
    gradient registry for the block only (other threads meanwhile get the same, equally correct, gradients).
    """
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.ops import gen_nn_ops

    global _conv_gradients_users
    registry = getattr(getattr(tf_ops, "_gradient_registry", None), "_registry", None)
    common = ("dilations", "strides", "padding", "explicit_paddings", "data_format")
    replacements = {
        "Conv2D": (gen_nn_ops.conv2d_backprop_input, (*common, "use_cudnn_on_gpu")),
        "DepthwiseConv2dNative": (gen_nn_ops.depthwise_conv2d_native_backprop_input, common),
    }
    with _CONV_GRADIENTS_LOCK:
        if _conv_gradients_users == 0 and isinstance(registry, dict):
            for name, (backprop_input, attrs) in replacements.items():
                entry = registry.get(name)
                if isinstance(entry, dict) and callable(entry.get("type")):
                    _conv_gradients_saved[name] = entry["type"]
                    registry[name] = {**entry, "type": _input_only(entry["type"], backprop_input, attrs)}
        _conv_gradients_users += 1
    try:
        yield
    finally:
        with _CONV_GRADIENTS_LOCK:
            _conv_gradients_users -= 1
            if _conv_gradients_users == 0:
                for name, original in _conv_gradients_saved.items():
                    registry[name] = {**registry[name], "type": original}
                _conv_gradients_saved.clear()


_TRACE_LOCK = threading.RLock()


@contextmanager
def custom_gradients_released():
    """Trace a function that differentiates its own ``tf.custom_gradient`` nodes without leaking them.

    In graph mode TF registers each custom gradient's function under a fresh name in a process-wide registry
    that is never cleared, and the function closes over the traced tensors (one entry per rule node per trace,
    growing without bound; the larger leak, the tape, is avoided in ``Engine._traced``). The entries are needed
    only while the trace builds its own backward pass, so the ones it added are removed when it ends.
    Traces are serialised so that one trace never removes another's entries.
    """
    from tensorflow.python.framework import ops as tf_ops

    registry = getattr(getattr(tf_ops, "_gradient_registry", None), "_registry", None)
    with _TRACE_LOCK:
        before = set(registry) if isinstance(registry, dict) else None
        try:
            yield
        finally:
            if before is not None:
                for name in set(registry) - before:
                    if name.startswith("CustomGradient-"):
                        registry.pop(name, None)


if keras.backend.backend() != "tensorflow":  # pragma: no cover - depends on the user's environment
    from gradscope.core.errors import GradscopeError

    raise GradscopeError(
        f"gradscope needs the TensorFlow backend of Keras, but KERAS_BACKEND is {keras.backend.backend()!r}. "
        "Unset KERAS_BACKEND or set it to 'tensorflow'."
    )

__all__ = [
    "SUPPORTED_KERAS",
    "SUPPORTED_TENSORFLOW",
    "check_keras_internals",
    "custom_gradients_released",
    "gradient_function",
    "input_only_conv_gradients",
    "keras",
    "keras_saving_steps",
    "tf",
    "version_problem",
    "version_tuple",
    "weights_written_once",
]
