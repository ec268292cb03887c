"""Training-loss targets: the gradient of a loss with user-given labels instead of a logit.

Losses (``Target(kind="loss", loss=...)``):

- ``"compiled"``: the model's own compiled loss, exactly as ``model.fit`` computes it
  (``model.compute_loss(y=labels, y_pred=output)``, which includes weight-regularisation losses), on the model's
  real output (probabilities if it ends in softmax; the compiled loss knows its ``from_logits``).
- ``"crossentropy"``: categorical cross-entropy, batch mean. Integer labels ``(batch,)`` are class indices
  (sparse); float labels ``(batch, classes)`` are one-hot/probabilities. When the engine strips a final softmax
  it is computed *from the logits* (``softmax(z)`` is the model's output, so the value is the same, but
  ``log_softmax`` is stable and the gradient at the logits is exactly ``softmax(z) - y``); a model kept with its
  softmax is read as probabilities; a model without a final softmax is read as logits.
- ``"mse"``: mean squared error between the model's output and the labels, mean over all elements.
- ``"auto"`` (or None): ``compiled`` if the model was compiled with a loss, else ``crossentropy`` for a
  ``(batch, classes)`` output, else ``mse``.

Multi-output models: ``Target(kind="loss", node=OUTPUT_ID)`` puts the loss on one output (labels for that
output); the ``compiled`` loss covers every output, as ``fit`` does (labels: a list, one array per output).

Labels are data, not part of the trace: the engine feeds them as a tensor input like the class index.
The batch is averaged (Keras' default ``sum_over_batch_size``), so weight gradients are those of one training
step; the logit targets sum over the batch instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradscope.backend import keras, tf
from gradscope.core.errors import TargetError
from gradscope.core.targets import Target

LOSS_NAMES = ("auto", "compiled", "crossentropy", "mse")
_ALIASES = {
    None: "auto",
    "ce": "crossentropy",
    "sparse_categorical_crossentropy": "crossentropy",
    "categorical_crossentropy": "crossentropy",
    "mean_squared_error": "mse",
}


def has_compiled_loss(model: Any) -> bool:
    return bool(getattr(model, "compiled", False)) and getattr(model, "loss", None) is not None


def resolve(engine: Any, target: Target) -> Target:
    """``target`` with ``auto`` replaced by the concrete loss (so the trace key is exact)."""
    name = _ALIASES.get(target.loss, target.loss)
    if name not in LOSS_NAMES:
        raise TargetError(f"Unknown loss {target.loss!r}; use one of {', '.join(LOSS_NAMES)}.")
    if name == "auto":
        if has_compiled_loss(engine.model):
            name = "compiled"
        else:
            shape = engine.graph.node(engine.graph.output_ids[0]).output_shape
            name = "crossentropy" if len(shape) == 2 and (shape[1] or 0) > 1 else "mse"
    if name == "compiled" and not has_compiled_loss(engine.model):
        raise TargetError(
            "The model has no compiled loss (it was saved without compile()). Use loss 'crossentropy' or 'mse'."
        )
    outputs = _output_nodes(engine)
    node = target.node
    if node is not None and node not in outputs:
        raise TargetError(f"{node!r} is not a model output; the outputs are {', '.join(outputs)}.")
    if len(outputs) > 1 and node is None and name != "compiled":
        raise TargetError(
            f"The model has {len(outputs)} outputs ({', '.join(outputs)}): choose the one the loss reads "
            "(node=OUTPUT, CLI --output) or use the model's compiled loss, which covers all of them."
        )
    if name == "compiled" and node is not None and len(outputs) > 1:
        raise TargetError("The compiled loss covers every output; do not choose one (or use crossentropy/mse).")
    node = node if node is not None and len(outputs) > 1 else None
    if name == "crossentropy":
        shape = engine.graph.node(_output_node(engine, node)).output_shape
        if len(shape) != 2:
            raise TargetError(
                f"Cross-entropy needs a (batch, classes) output; the model outputs {shape}. Use loss 'mse'."
            )
        if engine.graph.node(_output_node(engine, node)).activation == "sigmoid":
            raise TargetError(
                "The model ends in a sigmoid, not a softmax: categorical cross-entropy does not apply. "
                "Use loss 'compiled' (compile the model with binary_crossentropy) or 'mse'."
            )
    return Target(kind="loss", loss=name, node=node)


def _output_nodes(engine: Any) -> list[str]:
    """The node producing each model output, in the model's output order."""
    return list(engine.exec.output_nodes)


def _output_position(engine: Any, node: str | None) -> int:
    return 0 if node is None else _output_nodes(engine).index(node)


def _output_node(engine: Any, node: str | None) -> str:
    return _output_nodes(engine)[_output_position(engine, node)]


def _uses_stripped_logits(engine: Any, target: Target) -> bool:
    """The engine strips the softmax of the first output only."""
    return engine.softmax_stripped and _output_position(engine, target.node) == 0


def reads_logits(engine: Any, target: Target) -> bool:
    """Whether the cross-entropy is computed from logits (True) or from softmax probabilities."""
    activation = engine.graph.node(_output_node(engine, target.node)).activation
    return _uses_stripped_logits(engine, target) or activation != "softmax"


def describe(engine: Any, target: Target) -> str:
    if target.loss == "compiled":
        loss = engine.model.loss
        return f"compiled loss ({getattr(loss, 'name', loss)})"
    where = f" of output {target.node!r}" if target.node else ""
    if target.loss == "crossentropy":
        source = (
            "from the logits (softmax stripped)"
            if _uses_stripped_logits(engine, target)
            else ("from the logits" if reads_logits(engine, target) else "from the softmax probabilities")
        )
        return f"cross-entropy{where} {source}, batch mean"
    return f"mean squared error{where}, mean over all elements"


def prepare_labels(engine: Any, target: Target, labels: Any, batch: int) -> Any:
    """Labels as a tensor the traced function takes (an empty tensor for the logit targets)."""
    if target.kind != "loss":
        return tf.zeros([0], tf.float32)
    if labels is None:
        raise TargetError("A loss target needs labels (one class index per sample, or targets for 'mse').")
    n_outputs = len(engine.exec.output_keys)
    if target.loss == "compiled" and n_outputs > 1:
        if not isinstance(labels, (list, tuple)) or len(labels) != n_outputs:
            raise TargetError(f"The compiled loss of a {n_outputs}-output model needs a list of {n_outputs} labels.")
        return [_compiled_labels(np.asarray(one), batch) for one in labels]
    arr = np.asarray(labels)
    if arr.dtype.kind not in "biuf":
        raise TargetError(f"Labels must be numbers, got {arr.dtype}.")
    out_shape = engine.graph.node(_output_node(engine, target.node)).output_shape
    if target.loss == "crossentropy" and (arr.dtype.kind != "f" or arr.ndim <= 1):
        return _class_labels(arr, batch, out_shape[-1])
    if target.loss == "compiled":  # the compiled loss decides what it accepts: check only the batch
        return _compiled_labels(arr, batch)
    arr = arr.astype(np.float32)
    if arr.ndim == len(out_shape) - 1:  # one target for every sample
        arr = np.broadcast_to(arr, (batch, *arr.shape))
    if (
        arr.ndim != len(out_shape)
        or arr.shape[0] != batch
        or any(w is not None and w != d for w, d in zip(out_shape[1:], arr.shape[1:]))
    ):
        raise TargetError(f"Labels of shape {arr.shape} do not match the model output {out_shape} (batch {batch}).")
    return tf.convert_to_tensor(np.ascontiguousarray(arr))


def _compiled_labels(arr: np.ndarray, batch: int) -> Any:
    if arr.dtype.kind not in "biuf":
        raise TargetError(f"Labels must be numbers, got {arr.dtype}.")
    arr = arr.astype(np.int32 if arr.dtype.kind in "biu" else np.float32)
    if arr.ndim == 0 or (arr.shape[0] == 1 and batch > 1):  # one label for every sample
        arr = np.broadcast_to(arr.reshape(arr.shape[1:]) if arr.ndim else arr, (batch, *arr.shape[1:]))
    if arr.shape[0] != batch:
        raise TargetError(f"Got labels for {arr.shape[0]} samples; the batch has {batch}.")
    return tf.convert_to_tensor(np.ascontiguousarray(arr))


def _class_labels(arr: np.ndarray, batch: int, n_classes: int | None) -> Any:
    if arr.dtype.kind == "f" and not np.all(arr == np.round(arr)):
        raise TargetError("Class labels must be whole numbers (class indices).")
    arr = arr.astype(np.int64).reshape(-1)
    if arr.size == 1:
        arr = np.repeat(arr, batch)
    if arr.size != batch:
        raise TargetError(f"Got {arr.size} labels for a batch of {batch} samples.")
    if n_classes is not None and (arr.min() < 0 or arr.max() >= n_classes):
        raise TargetError(f"Labels must be class indices in [0, {n_classes - 1}]; got {sorted(set(arr.tolist()))}.")
    return tf.convert_to_tensor(arr.astype(np.int32))


def loss_scalar(engine: Any, target: Target, values: dict, labels: Any) -> Any:
    """The loss as a scalar tensor, inside the engine's traced function."""
    if target.loss == "compiled":
        outputs = [values[k] for k in engine.exec.output_keys]
        y_pred = outputs if len(outputs) > 1 else outputs[0]
        return engine.model.compute_loss(x=None, y=labels, y_pred=y_pred, training=False)
    output = values[engine.exec.output_keys[_output_position(engine, target.node)]]
    if target.loss == "mse":
        return tf.reduce_mean(tf.square(tf.cast(output, tf.float32) - labels))
    from_logits = reads_logits(engine, target)
    scores = tf.cast(values[engine.logits_key] if _uses_stripped_logits(engine, target) else output, tf.float32)
    if labels.dtype.is_integer:
        per_sample = keras.losses.sparse_categorical_crossentropy(labels, scores, from_logits=from_logits)
    else:
        per_sample = keras.losses.categorical_crossentropy(labels, scores, from_logits=from_logits)
    return tf.reduce_mean(per_sample)
