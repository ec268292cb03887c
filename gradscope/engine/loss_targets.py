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
    if len(engine.exec.output_keys) > 1:
        raise TargetError("Loss targets support single-output models only (this model has several outputs).")
    if name == "crossentropy":
        shape = engine.graph.node(engine.graph.output_ids[0]).output_shape
        if len(shape) != 2:
            raise TargetError(
                f"Cross-entropy needs a (batch, classes) output; the model outputs {shape}. Use loss 'mse'."
            )
        if _output_activation(engine) == "sigmoid":
            raise TargetError(
                "The model ends in a sigmoid, not a softmax: categorical cross-entropy does not apply. "
                "Use loss 'compiled' (compile the model with binary_crossentropy) or 'mse'."
            )
    return Target(kind="loss", loss=name)


def _output_activation(engine: Any) -> str | None:
    return engine.graph.node(engine.graph.output_ids[0]).activation


def reads_logits(engine: Any, target: Target) -> bool:
    """Whether the cross-entropy is computed from logits (True) or from softmax probabilities."""
    return engine.softmax_stripped or _output_activation(engine) != "softmax"


def describe(engine: Any, target: Target) -> str:
    if target.loss == "compiled":
        loss = engine.model.loss
        return f"compiled loss ({getattr(loss, 'name', loss)})"
    if target.loss == "crossentropy":
        source = (
            "from the logits (softmax stripped)"
            if engine.softmax_stripped
            else ("from the logits" if reads_logits(engine, target) else "from the softmax probabilities")
        )
        return f"cross-entropy {source}, batch mean"
    return "mean squared error, mean over all elements"


def prepare_labels(engine: Any, target: Target, labels: Any, batch: int) -> Any:
    """Labels as a tensor the traced function takes (an empty tensor for the logit targets)."""
    if target.kind != "loss":
        return tf.zeros([0], tf.float32)
    if labels is None:
        raise TargetError("A loss target needs labels (one class index per sample, or targets for 'mse').")
    arr = np.asarray(labels)
    if arr.dtype.kind not in "biuf":
        raise TargetError(f"Labels must be numbers, got {arr.dtype}.")
    out_shape = engine.graph.node(engine.graph.output_ids[0]).output_shape
    if target.loss == "crossentropy" and (arr.dtype.kind != "f" or arr.ndim <= 1):
        return _class_labels(arr, batch, out_shape[-1])
    if target.loss == "compiled":  # the compiled loss decides what it accepts: check only the batch
        arr = arr.astype(np.int32 if arr.dtype.kind in "biu" else np.float32)
        if arr.ndim == 0 or (arr.shape[0] == 1 and batch > 1):  # one label for every sample
            arr = np.broadcast_to(arr.reshape(arr.shape[1:]) if arr.ndim else arr, (batch, *arr.shape[1:]))
        if arr.shape[0] != batch:
            raise TargetError(f"Got labels for {arr.shape[0]} samples; the batch has {batch}.")
        return tf.convert_to_tensor(np.ascontiguousarray(arr))
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
    output = values[engine.exec.output_keys[0]]
    if target.loss == "compiled":
        return engine.model.compute_loss(x=None, y=labels, y_pred=output, training=False)
    if target.loss == "mse":
        return tf.reduce_mean(tf.square(tf.cast(output, tf.float32) - labels))
    from_logits = reads_logits(engine, target)
    scores = tf.cast(values[engine.logits_key] if engine.softmax_stripped else output, tf.float32)
    if labels.dtype.is_integer:
        per_sample = keras.losses.sparse_categorical_crossentropy(labels, scores, from_logits=from_logits)
    else:
        per_sample = keras.losses.categorical_crossentropy(labels, scores, from_logits=from_logits)
    return tf.reduce_mean(per_sample)
