"""A causal language model's next-token target (``Target(kind="token")``) as the scalar the engine
differentiates: the logit of a token at a position of the (batch, sequence, vocabulary) output, minus a contrast
token's logit there. The position defaults to the last real one: the last the model's padding mask keeps."""

from __future__ import annotations

from typing import Any

from gradscope.backend import tf
from gradscope.core.errors import TargetError
from gradscope.core.targets import Target


def token_scalar(engine: Any, target: Target, values: dict, token_idx: Any) -> tuple:
    """(The summed logits, each sample's token): ``token_idx`` -1 stands for that sample's most likely token."""
    logits = values[engine.logits_key]
    if logits.shape.rank != 3:
        raise TargetError(
            f"A next-token target needs a (batch, sequence, vocabulary) output; the model outputs {logits.shape}."
        )
    at = tf.gather(logits, positions(engine, target, values, logits), axis=1, batch_dims=1)  # (batch, vocabulary)
    idx = tf.where(token_idx < 0, tf.argmax(at, axis=-1, output_type=tf.int32), token_idx)
    picked = tf.gather(at, idx, axis=1, batch_dims=1)
    if target.contrast is not None:
        picked = picked - at[:, target.contrast]
    return tf.reduce_sum(picked), idx


def positions(engine: Any, target: Target, values: dict, logits: Any) -> Any:
    """Per sample, the position the target reads: the given one, else the last the padding mask (when the model
    has one) keeps, else the last."""
    batch, length = tf.shape(logits)[0], tf.shape(logits)[1]
    if target.position is not None:
        p = target.position if target.position >= 0 else length + target.position
        return tf.fill([batch], tf.cast(p, tf.int32))
    masks = [i for i, kind in engine.graph.token_companions.items() if kind == "mask"]
    if masks:
        key = engine.exec.input_keys[engine.graph.input_ids.index(masks[0])]
        real = tf.reduce_sum(tf.cast(values[key], tf.int32), axis=1)
        return tf.maximum(real - 1, 0)
    return tf.fill([batch], length - 1)


def first_position(engine: Any, target: Target, xs: list) -> int:
    """The position the target reads in the first sample of the model inputs ``xs``."""
    graph = engine.graph
    values = dict(zip(engine.exec.input_keys, xs))
    length = int(xs[graph.input_ids.index(graph.token_input)].shape[1]) if graph.token_input else 0
    shape_only = tf.zeros([int(xs[0].shape[0]), length, 1])
    return int(positions(engine, target, values, shape_only)[0])
