"""The scores of one batch of texts: each method's token map, its MoRF and LeRF curves, and the metrics of
``engine.evaluation.token_metrics`` (ABPC, comprehensiveness, sufficiency, token pointing).

A record per text: ``{"key", "class" (the token or class explained), "length", "tokens" (as shown), "scores":
{method: {"map": [one score per token], "morf": [...], "lerf": [...] (the target's logit at k = 0 .. n),
"abpc", "comprehensiveness", "sufficiency", "token_pointing"}}}``. The rows every method's curves need run
together, the unperturbed and the all-removed rows once.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gradscope.app.evaluation.scoring import image_rng
from gradscope.core.errors import GraphError, InputError
from gradscope.core.targets import Target
from gradscope.engine.backward.attribution import token_map, token_readout
from gradscope.engine.backward.generation import token_arrays
from gradscope.engine.evaluation import token_metrics as tm
from gradscope.engine.evaluation.token_curves import perturbed_targets, replacement_id
from gradscope.io.text_datasets import TextSample


def check_text_model(engine: Any) -> None:
    graph = engine.graph
    if graph.token_input is None:
        raise GraphError("The text metrics need a model that reads token ids (an Embedding); this one does not.")
    shape = graph.node(graph.output_ids[0]).output_shape
    if len(shape) not in (2, 3):
        raise GraphError(
            f"The text metrics read a (batch, classes) or (batch, sequence, vocabulary) output; got {shape}."
        )


def evaluate_text_batch(
    engine: Any, methods: list, settings: Any, samples: list[TextSample], vocab: Any = None
) -> tuple[list[dict], dict[str, float], list[dict]]:
    """The records of a batch of texts, the seconds each method took, and the texts that could not be used."""
    seconds = {m.label: 0.0 for m in methods}
    records, bad = [], []
    replacement = replacement_id(vocab, settings.baseline)
    for s in samples:
        try:
            arrays, target = _fed(engine, s)
        except (InputError, GraphError) as exc:
            bad.append({"key": s.key, "reason": str(exc)})
            continue
        n = len(s.ids)
        tokens = vocab.decode(s.ids) if vocab is not None else [str(i) for i in s.ids.tolist()]
        rec: dict[str, Any] = {"key": s.key, "class": int(target.index), "length": n, "tokens": list(tokens)}
        maps = {}
        for m in methods:
            t0 = time.perf_counter()
            if m.baseline == "random":
                maps[m.label] = image_rng(settings.seed, s.key).uniform(size=n)
            else:
                maps[m.label] = method_token_map(engine, m.method, arrays, target)[:n]
            seconds[m.label] += time.perf_counter() - t0
        t0 = time.perf_counter()
        curves = _curves(engine, arrays, target, maps, n, replacement)
        per_method = (time.perf_counter() - t0) / max(len(methods), 1)
        rec["scores"] = {}
        for m in methods:
            seconds[m.label] += per_method
            rec["scores"][m.label] = _scores(maps[m.label], *curves[m.label], settings.metrics, s.rationale)
        records.append(rec)
    return records, seconds, bad


def _fed(engine: Any, s: TextSample) -> tuple[list[np.ndarray], Target]:
    """The model's inputs for the text (padded to a fixed length with id 0 and the padding mask) and its target,
    the index resolved on the clean input: the given one, else the model's top class or next token."""
    from gradscope.io.model_inputs import check_sequence_fits, check_token_ids

    graph = engine.graph
    n = len(s.ids)
    length = graph.node(graph.token_input).output_shape[1]
    if length is not None and n > length:
        raise InputError(f"the model reads {length} tokens; the text has {n}.")
    check_sequence_fits(graph, length or n)
    check_token_ids(graph, graph.token_input, s.ids)
    ids = np.zeros(length or n, np.int64)
    ids[:n] = s.ids
    arrays = token_arrays(graph, ids, n)
    language = engine.is_language_model()
    logits = np.asarray(engine.logits(arrays), np.float64)
    scores = logits[0, n - 1] if language else logits[0]
    index = int(np.argmax(scores)) if s.target is None else s.target
    if not 0 <= index < scores.shape[-1]:
        raise InputError(f"the target {index} does not exist: the output has {scores.shape[-1]} entries.")
    if language:
        return arrays, Target(kind="token", index=int(index), position=n - 1)
    return arrays, Target(index=int(index))


def method_token_map(engine: Any, method: Any, arrays: list[np.ndarray], target: Target) -> np.ndarray:
    """(length,) the method's score of each token, read at the token embedding as ``gradscope.explain`` reads it
    (``eval_methods`` refused the sampling methods)."""
    graph = engine.graph
    node = method.readout_node
    if node is None or graph.node(node).is_input:
        node = graph.embedding_of(graph.token_input).id
    r = engine.backward(arrays, target, method.plan, capture=[node], stats=False)
    readout = token_readout(r.rules.values(), times_input=method.times_input)
    return token_map(r.node_grads[node][0], r.node_values[node][0], readout)


def _curves(engine, arrays, target, maps, n, replacement) -> dict[str, tuple[np.ndarray, ...]]:
    """Each method's MoRF and LeRF logits and probabilities (k = 0 .. n), from one set of perturbed rows."""
    graph = engine.graph
    node = graph.embedding_of(graph.token_input).id
    length = arrays[graph.input_ids.index(graph.token_input)].shape[1]
    positions = np.arange(n)
    blocks = [np.zeros((1, length), bool), np.zeros((1, length), bool)]
    blocks[1][0, :n] = True  # every real token removed
    spans = {}
    for label, scores in maps.items():
        morf, lerf = tm.removal_masks(tm.token_order(scores), positions, length)
        start = sum(len(b) for b in blocks)
        blocks += [morf[1:n], lerf[1:n]]
        spans[label] = start
    logits, probs = perturbed_targets(engine, arrays, node, np.concatenate(blocks), target, replacement)

    def curve(values: np.ndarray, at: int) -> np.ndarray:  # the shared ends around a method's own rows
        return np.concatenate([values[:1], values[at : at + n - 1], values[1:2]])

    return {
        label: (curve(logits, at), curve(logits, at + n - 1), curve(probs, at), curve(probs, at + n - 1))
        for label, at in spans.items()
    }


def _scores(scores, morf, lerf, morf_p, lerf_p, metrics, rationale) -> dict[str, Any]:
    got: dict[str, Any] = {"map": [float(v) for v in scores]}
    if "abpc" in metrics:
        got.update(abpc=tm.abpc(morf, lerf), morf=morf.tolist(), lerf=lerf.tolist())
    if "comprehensiveness" in metrics:
        got["comprehensiveness"] = tm.comprehensiveness(morf_p)
    if "sufficiency" in metrics:
        got["sufficiency"] = tm.sufficiency(lerf_p)
    if "token_pointing" in metrics:
        got["token_pointing"] = tm.token_pointing(scores, rationale) if rationale else None
    return got
