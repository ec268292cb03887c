"""Generation, attributed (Inseq's view of a language model): decode greedily and explain every generated token
by the prompt and the tokens generated before it, one backward pass per token.

The sequence is padded to its final length from the start (the padding mask hides what is not there yet; a
causal model never looks ahead), so every step has the same shapes. Each step's target is the next token at the
last real position; its most likely token is the one generated (greedy), so no separate decoding pass is needed.

With a padding mask, that position is the one the mask's last 1 marks (the target names no position), so every
step is the same computation on new data: the plan is traced once and each step runs compiled. Measured on the
Llama-3 shape of ``benchmarks/bench_language_model.py`` (64-token prompt, 16 tokens, AttnLRP, 2-core CPU): 4
blocks 24.9 s (trace 8.3 s, then 1.05 s a step = 1.25 plain gradients) where live steps took 33.5 s; 16 blocks
59.1 s (trace 27.7 s, then 2.1 s a step). Without a padding mask the target names its position (a new trace
each step), and a model that takes no fixed length grows its sequence a token a step: those steps run live.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradscope.core.errors import InputError, TargetError
from gradscope.core.targets import Target
from gradscope.engine.backward.attribution import token_map
from gradscope.io.model_inputs import check_sequence_fits

#: The most tokens one call generates (each costs one backward pass).
MAX_GENERATE = 512


@dataclass
class Generation:
    """A generation and its attribution: ``matrix[i, j]`` is context token ``j``'s score for generated token
    ``i`` (NaN where token ``j`` came after it); ``tokens`` are the ids of the prompt and every generated token."""

    prompt: np.ndarray  # int64 (L,)
    generated: np.ndarray  # int64 (N,)
    probabilities: np.ndarray  # (N,) each generated token's probability when it was chosen
    matrix: np.ndarray  # (N, L + N - 1)
    node: str  # where the scores were read (the token embedding)
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> np.ndarray:
        return np.concatenate([self.prompt, self.generated])


def attribute_generation(
    engine: Any,
    prompt: np.ndarray,
    steps: int,
    plan: Any,
    *,
    readout: str = "gradient_x_embedding",
    progress: Callable[[int, int], None] | None = None,
) -> Generation:
    """Generate ``steps`` tokens after ``prompt`` greedily and attribute each (``plan``: the method's plan;
    ``readout``: how a token's score is read, ``attribution.token_readout``)."""
    import time

    graph = engine.graph
    if not engine.is_language_model():
        raise TargetError("Generation needs a language model: an output of (batch, sequence, vocabulary) logits.")
    if not isinstance(steps, int) or not 1 <= steps <= MAX_GENERATE:
        raise InputError(f"The number of tokens to generate is 1 to {MAX_GENERATE}; got {steps}.")
    prompt = np.asarray(prompt, np.int64).reshape(-1)
    if prompt.size == 0:
        raise InputError("Give a prompt of at least one token.")
    token_input = graph.token_input
    length = graph.node(token_input).output_shape[1]
    total = prompt.size + steps
    fed = total - 1  # the last generated token is never fed back
    positions = graph.position_limit()
    limits = [n for n in (length, positions[0] if positions else None) if n is not None]
    most = min(limits, default=None)
    if most is not None and fed > most:
        if prompt.size > most:
            raise InputError(f"The model reads at most {most} tokens; the prompt has {prompt.size}.")
        raise InputError(
            f"The model reads at most {most} tokens; a prompt of {prompt.size} leaves room to generate "
            f"{most - prompt.size + 1}."
        )
    masks = [i for i, kind in graph.token_companions.items() if kind == "mask"]
    padded = bool(masks) and length is None  # one shape for every step (see the module docstring)
    width = length or (fed if padded else None)  # None: the sequence grows by a token a step
    check_sequence_fits(graph, width or fed)
    node = graph.embedding_of(token_input).id
    ids = np.zeros(max(width or 0, total), np.int64)
    ids[: prompt.size] = prompt
    rows, probs, chosen = [], [], []
    by_mask = bool(width) and bool(masks)  # the last real position is the mask's: one trace serves every step
    mode = "compiled" if by_mask and steps > 1 else "live"
    t0 = time.perf_counter()
    for i in range(steps):
        real = prompt.size + i
        arrays = token_arrays(graph, ids[: width or real], real)
        target = Target(kind="token") if by_mask else Target(kind="token", position=real - 1)
        result = engine.backward(arrays, target, plan, capture=[node], stats=False, mode=mode)
        token = int(result.target_indices[0])
        logits = np.asarray(result.logits[0, real - 1], np.float64)
        p = np.exp(logits - logits.max())
        probs.append(float(p[token] / p.sum()))
        rows.append(token_map(result.node_grads[node][0], result.node_values[node][0], readout)[:real])
        chosen.append(token)
        ids[real] = token
        if progress is not None:
            progress(i + 1, steps)
    matrix = np.full((steps, total - 1), np.nan)
    for i, row in enumerate(rows):
        matrix[i, : row.size] = row
    return Generation(prompt, np.array(chosen, np.int64), np.array(probs), matrix, node, time.perf_counter() - t0)


def token_arrays(graph: Any, ids: np.ndarray, real: int) -> list[np.ndarray]:
    """The model's inputs for ``ids`` of which the first ``real`` are there: token ids, the padding mask (1 where
    a token is), segment ids 0."""
    out = []
    for input_id in graph.input_ids:
        kind = graph.token_companions.get(input_id)
        if input_id == graph.token_input:
            out.append(ids[None])
        elif kind == "mask":
            out.append((np.arange(ids.size) < real).astype(np.int64)[None])
        else:
            out.append(np.zeros((1, ids.size), np.int64))
    return out
