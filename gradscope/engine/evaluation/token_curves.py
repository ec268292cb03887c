"""The model's target along a token map's perturbation curves: rows of one sequence whose input embeddings at some
positions are replaced, run as batches (``token_metrics`` turns them into ABPC, comprehensiveness, sufficiency).

A row replaces the embedding node's output where its mask is True with the replacement (zeros, or the embedding of
the pad or mask token at each position); everything above runs as in the model. The rows of one sample run in
batches of at most ``POSITIONS_PER_BATCH`` token positions, each batch padded to one size (one trace per shape),
one traced function per engine, embedding node and target kind.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gradscope.backend import tf
from gradscope.core.errors import InputError
from gradscope.core.targets import Target
from gradscope.engine.patching.attribution import traced
from gradscope.engine.patching.metric import Metric
from gradscope.io.model_inputs import PAD_TOKENS

#: Token positions per batch of perturbed rows: a 128-token text's MoRF and LeRF rows (256) in two batches.
POSITIONS_PER_BATCH = 16384
REPLACEMENTS = ("zero", "pad", "mask")


def replacement_id(vocab: Any, kind: str) -> int | None:
    """The token whose embedding replaces a removed one (None: zeros). ``pad``: the vocabulary's padding token (id 0
    without one); ``mask``: its mask token (an ``InputError`` when it has none)."""
    if kind not in REPLACEMENTS:
        raise InputError(f"The replacement of a removed token is one of {', '.join(REPLACEMENTS)}; got {kind!r}.")
    if kind == "zero":
        return None
    names = PAD_TOKENS if kind == "pad" else ("[MASK]", "<mask>", "<MASK>", "[mask]")
    tokenizer = getattr(vocab, "tokenizer", None)
    own = getattr(tokenizer, f"{kind}_token_id", None) if tokenizer is not None else None
    if isinstance(own, (int, np.integer)) and own >= 0:
        return int(own)
    tokens = list(getattr(vocab, "tokens", ()) or ())
    for name in names:
        if name in tokens:
            return tokens.index(name)
    if kind == "pad":
        return 0
    raise InputError("--baseline mask needs a vocabulary with a mask token ([MASK] or <mask>); use zero or pad.")


def perturbed_targets(
    engine: Any, arrays: list[np.ndarray], node: str, masks: np.ndarray, target: Target, replacement: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """(rows,) the target's logit and probability with the embedding node's output replaced where ``masks`` (rows,
    length) is True; ``target`` a class or a token with its index resolved; ``replacement`` a token id whose
    embedding (at each position) replaces, or None for zeros."""
    if target.index is None:  # each perturbed row's own most likely would be another quantity at every k
        raise ValueError("perturbed_targets needs the target's index resolved on the clean input.")
    graph = engine.graph
    xs = [tf.constant(a) for a in arrays]
    token_at = graph.input_ids.index(graph.token_input)
    logit = Metric.for_target(engine, target, "logit", xs)
    spec = logit.spec()
    if replacement is None:
        instead = None
    else:
        ids = np.array(arrays[token_at])
        ids[:] = replacement
        _, nodes = engine._run([*xs[:token_at], tf.constant(ids), *xs[token_at + 1 :]], {})
        instead = nodes[node][0]
    rank = len(graph.node(node).output_shape)
    fn = traced(engine, ("token_curves", node, logit.position is None, instead is None),
                lambda: _rows_function(engine, node, rank, logit))  # fmt: skip
    rows, length = masks.shape
    per_batch = max(1, POSITIONS_PER_BATCH // max(length, 1))
    batches = math.ceil(rows / per_batch)
    size = math.ceil(rows / batches)
    logits_out, probs_out = np.empty(rows), np.empty(rows)
    for lo in range(0, rows, size):
        chunk = masks[lo : lo + size]
        padded = np.concatenate([chunk, np.zeros((size - len(chunk), length), bool)])
        got_logit, got_p = fn(xs, tf.constant(padded), instead, spec)
        logits_out[lo : lo + len(chunk)] = got_logit.numpy()[: len(chunk)]
        probs_out[lo : lo + len(chunk)] = got_p.numpy()[: len(chunk)]
    return logits_out, probs_out


def _rows_function(engine: Any, node: str, rank: int, logit: Metric) -> Any:
    probability = Metric("probability", logit.index, None, logit.position)

    def rows(xs: list, masks: Any, instead: Any, spec: Any) -> tuple:
        n = tf.shape(masks)[0]
        tiled = [tf.repeat(x, n, axis=0) for x in xs]
        where = tf.reshape(masks, tf.concat([tf.shape(masks), tf.ones([rank - 2], tf.int32)], axis=0))

        def replace(outs: list) -> list:
            y = outs[0]
            other = tf.zeros_like(y) if instead is None else tf.cast(instead, y.dtype)
            return [tf.where(where, other, y), *outs[1:]]

        values, _ = engine._run(tiled, {}, transforms={node: replace})
        logits = values[engine.logits_key]
        return logit.of(logits, spec), probability.of(logits, spec)

    return tf.function(rows, autograph=False, reduce_retracing=True)
