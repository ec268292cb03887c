"""Any input, checked against the model before it runs: an image, token ids or text (through a vocabulary), a CSV
row, or arrays (``.npy``, ``.npz`` with one array per model input, by input name). Plain numpy: the checks read
the model's graph (input shapes and dtypes, the embedding's vocabulary size), not TensorFlow.

Every refusal is one ``InputError`` line naming the input: wrong length, an id outside the embedding's
vocabulary, a value that is not a number, a missing input of a multi-input model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.errors import InputError
from gradscope.core.graph import LONG_INPUT_TOKENS, LayerGraph
from gradscope.io.sequences import TableRow, Vocabulary, parse_token_ids, read_csv_row, read_token_file

PAD_TOKENS = ("", "[PAD]", "<pad>", "<PAD>", "[pad]")
TOKEN_SUFFIXES = (".txt", ".json")
ARRAY_SUFFIXES = (".npy", ".npz")
INPUT_FILE_SUFFIXES = (*ARRAY_SUFFIXES, ".csv", *TOKEN_SUFFIXES)  # files that are inputs but not images


@dataclass(frozen=True)
class ModelInput:
    """What the model is fed (one array per model input, batch axis first) and how to show it."""

    arrays: tuple[np.ndarray, ...]
    kind: str  # "image", "tokens", "table" or "array"
    source: str  # a path, "<text>", "<ids>" or "<array>"
    image: np.ndarray | None = None  # uint8 (H, W, 3) for an image
    ids: np.ndarray | None = None  # int64 (seq,) for tokens
    tokens: tuple[str, ...] = ()  # what each position shows: the word, or the id when there is no vocabulary
    names: tuple[str, ...] = ()  # feature names of a table row
    note: str = ""  # what was done to fit the model (padding), to tell the user
    warnings: tuple[str, ...] = ()  # what may make the result misleading (a vocabulary of another model)

    @property
    def labels(self) -> tuple[str, ...]:
        """Position labels of a per-position map: tokens, feature names, or nothing."""
        return self.tokens or self.names


def token_input(graph: LayerGraph, ids: Any, *, vocab: Vocabulary | None = None, source: str = "<ids>") -> ModelInput:
    """Token ids for a model whose input is integer: checked for length (shorter input is padded at the end
    when the vocabulary's id 0 is a padding token) and for the embedding's vocabulary size."""
    input_id = graph.token_input or _single_input(graph, "token ids")
    if not graph.is_integer_input(input_id):
        shape = graph.node(input_id).output_shape
        raise InputError(
            f"Input {input_id!r} takes real numbers of shape {shape}, not token ids: give an image, a CSV row or "
            "an array."
        )
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise InputError(f"Token ids for {input_id!r} are one sequence of whole numbers; got {ids.dtype} {ids.shape}.")
    if ids.dtype == np.uint64 and ids.size and ids.max() >= 2**63:  # astype(int64) would make it negative
        raise InputError(f"Token id {int(ids.max())} of input {input_id!r} is far beyond any vocabulary.")
    ids = ids.astype(np.int64)
    note = ""
    companions = graph.token_companions
    pad_token = vocab is not None and len(vocab) and vocab.tokens[0] in PAD_TOKENS
    given = len(ids)
    length = (graph.node(input_id).output_shape + (None, None))[1]
    if length is not None and len(ids) != length:
        masked = "mask" in companions.values()  # the model's padding mask hides what is padded
        if len(ids) > length or not (pad_token or masked):
            raise InputError(
                f"Input {input_id!r} takes {length} token ids; got {len(ids)}"
                + ("." if len(ids) > length else _why_not_padded(vocab))
            )
        what = f"id 0 ({vocab.tokens[0]!r})" if pad_token else "id 0, hidden by the padding mask"
        note = f"Padded {length - len(ids)} position(s) at the end with {what}."
        ids = np.concatenate([ids, np.zeros(length - len(ids), np.int64)])
    check_sequence_fits(graph, len(ids), input_id)
    check_token_ids(graph, input_id, ids)
    tokens = tuple(vocab.decode(ids)) if vocab is not None else tuple(str(i) for i in ids.tolist())
    real = np.arange(len(ids)) < given
    if pad_token:
        real &= ids != 0
    arrays = {input_id: ids, **{i: _companion(kind, real) for i, kind in companions.items()}}
    size = graph.vocabulary_size(input_id)
    warnings = ()
    # a tokenizer of another model: it knows ids the model lacks, or fewer than half of its ids (an embedding is
    # often padded past its tokenizer: Qwen's 151,936 rows for 151,665 tokens)
    if vocab is not None and size is not None and not size / 2 <= len(vocab) <= size:
        warnings = (
            f"The vocabulary {Path(vocab.source).name or ''} has {len(vocab):,} tokens and the model's embedding "
            f"{size:,}: it may belong to another model, and the words shown may not be what the ids mean to it.",
        )
    return ModelInput(
        tuple(arrays[i][None] for i in graph.input_ids),
        "tokens",
        source,
        ids=ids,
        tokens=tokens,
        note=note,
        warnings=warnings,
    )


#: float32 copies of one attention head's (L, L) scores that an explanation holds at its peak: the scores and
#: probabilities kept from the forward pass, their signals and the softmax's temporaries. Measured (peak RSS over
#: the loaded model, gradient method): the tests' tiny Llama 6.6 at 2,048 tokens and 8 at 1,024, Gemma 5.7 at 2,048.
ATTENTION_COPIES = 8
#: On a long prompt (``LONG_INPUT_TOKENS``) nothing keeps an attention layer's scores: one layer's are alive at a
#: time, while its rule runs (scores, probabilities, their signals, the rule's products), and every node's output,
#: signal and contributions (``LayerGraph.bytes_per_token``) are kept for the next edit. Measured on a 309 M Llama at
#: 2,048 tokens (2.07 MB a token; AttnLRP with every node's signal captured, then an edit): 10.9 GB over the loaded
#: model = one layer's scores x 8 + 2.0 copies of every node's output; one more copy for the window's baseline.
#: (``benchmarks/bench_language_model.py --long 2048``.)
LONG_ATTENTION_COPIES = 8
LONG_NODE_COPIES = 3


def sequence_bytes(graph: LayerGraph, length: int) -> tuple[int, int]:
    """(bytes of attention scores, bytes of every node's outputs and signals) that explaining ``length`` tokens
    holds at its peak beyond the loaded model: below ``LONG_INPUT_TOKENS`` every layer's scores are kept for the
    backward pass; from there on one layer's at a time (``Engine.is_long_input``)."""
    heads = graph.attention_heads()
    if not heads:
        return 0, 0
    if length < LONG_INPUT_TOKENS:
        return sum(heads) * length**2 * 4 * ATTENTION_COPIES, 0
    return max(heads) * length**2 * 4 * LONG_ATTENTION_COPIES, LONG_NODE_COPIES * length * graph.bytes_per_token()


def _most_tokens(graph: LayerGraph, free: int) -> int:
    """The longest sequence ``sequence_bytes`` fits in ``free`` bytes."""
    heads = graph.attention_heads()
    a = max(heads) * 4 * LONG_ATTENTION_COPIES
    b = LONG_NODE_COPIES * graph.bytes_per_token()
    longest = int((-b + (b * b + 4 * a * free) ** 0.5) / (2 * a))
    if longest >= LONG_INPUT_TOKENS:
        return longest
    return min(int((free / (sum(heads) * 4 * ATTENTION_COPIES)) ** 0.5), LONG_INPUT_TOKENS - 1)


def check_sequence_fits(graph: LayerGraph, length: int, input_id: str = "") -> None:
    """Refuse, before anything runs, a sequence longer than the model's positions (a learned position
    embedding's table; past it Keras fails inside the layer) or one whose explanation would not fit in the memory
    available now (``sequence_bytes``: attention's (heads, L, L) scores, and on a long prompt every node's outputs
    and signals)."""
    from gradscope.io.memory import available_bytes

    name = f"Input {input_id!r}" if input_id else "The model"
    limit = graph.position_limit()
    if limit is not None and length > limit[0]:
        raise InputError(
            f"{name} reads at most {limit[0]:,} tokens (its position embedding {limit[1]} has {limit[0]:,} "
            f"positions); got {length:,}."
        )
    attention, nodes = sequence_bytes(graph, length)
    free = available_bytes() if attention else None
    if free is not None and attention + nodes > free:
        heads = graph.attention_heads()
        what = (
            f"{attention / 2**30:,.1f} GiB for the attention ({sum(heads)} heads in all, each {length:,} x {length:,} "
            "scores kept for the backward pass)"
            if length < LONG_INPUT_TOKENS
            else f"{attention / 2**30:,.1f} GiB for one attention layer's {max(heads)} heads of {length:,} x "
            f"{length:,} scores at a time, {nodes / 2**30:,.1f} GiB for every layer's outputs and signals"
        )
        raise InputError(
            f"{length:,} tokens need about {(attention + nodes) / 2**30:,.1f} GiB ({what}); {free / 2**30:.1f} GiB "
            f"of memory is available. Give at most about {_most_tokens(graph, free):,} tokens."
        )


def check_token_ids(graph: LayerGraph, input_id: str, ids: np.ndarray) -> None:
    size = graph.vocabulary_size(input_id)
    bad = [(p, int(i)) for p, i in enumerate(ids) if i < 0 or (size is not None and i >= size)]
    if bad:
        pos, value = bad[0]
        allowed = f"0..{size - 1}" if size is not None else "0 or more"
        raise InputError(
            f"Token {pos} of input {input_id!r} is id {value}, outside the embedding's vocabulary ({allowed})"
            + (f"; {len(bad)} such ids." if len(bad) > 1 else ".")
        )


def _companion(kind: str, real: np.ndarray) -> np.ndarray:
    """An input derived from the token ids: the padding mask (1 where a token is, 0 where padding is) or the
    segment ids (0: one segment)."""
    return real.astype(np.int64) if kind == "mask" else np.zeros(len(real), np.int64)


def text_input(graph: LayerGraph, text: str, vocab: Vocabulary) -> ModelInput:
    """Raw text, split into words and looked up in ``vocab``."""
    return token_input(graph, vocab.encode(text), vocab=vocab, source="<text>")


def table_input(graph: LayerGraph, row: TableRow, source: str = "<row>") -> ModelInput:
    """One CSV row for a model whose input is a vector of features."""
    input_id = _single_input(graph, "a CSV row")
    shape = graph.node(input_id).output_shape
    if graph.is_integer_input(input_id) or len(shape) != 2:
        raise InputError(f"Input {input_id!r} has shape {shape}: a CSV row fits an input of shape (None, features).")
    if shape[1] is not None and shape[1] != len(row.values):
        raise InputError(f"Input {input_id!r} takes {shape[1]} features; the row has {len(row.values)}.")
    return ModelInput((row.values[None],), "table", source, names=row.names)


def array_input(graph: LayerGraph, path: str | Path, vocab: Vocabulary | None = None) -> ModelInput:
    """Arrays from ``.npy`` (a one-input model) or ``.npz`` (one array per model input, named as the inputs,
    else in order), a single sample or a batch. Token ids for a token model (one integer sequence) are token
    input, as ``--tokens`` with the same ids: the map is read per token, companions derived."""
    from gradscope.io.arrays import read_arrays

    p = Path(path).expanduser()
    named = read_arrays(p)
    token = graph.token_input
    if token is not None and len(named) == 1:
        (only,) = named.values()
        if only.dtype.kind in "iu" and (only.ndim == 1 or (only.ndim == 2 and only.shape[0] == 1)):
            return token_input(graph, only.reshape(-1), vocab=vocab, source=str(p))
    ids = list(graph.input_ids)
    if set(named) >= set(ids):
        arrays = [named[i] for i in ids]
    elif len(named) == len(ids) and not set(named) & set(ids):
        arrays = list(named.values())  # unnamed (arr_0, ...): in order
    else:
        missing = [i for i in ids if i not in named]
        raise InputError(
            f"{p.name} lacks input(s) {', '.join(map(repr, missing))} of the model (it holds "
            f"{', '.join(map(repr, named)) or 'nothing'}); name the arrays as the inputs: {', '.join(ids)}."
        )
    fitted = []
    for node_id, a in zip(ids, arrays):
        want = graph.node(node_id).output_shape
        a = a[None] if a.ndim == len(want) - 1 else a
        if a.dtype.kind not in "biuf":
            raise InputError(f"Input {node_id!r} must hold real numbers; {p.name} holds {a.dtype}.")
        if a.ndim != len(want) or any(w is not None and w != d for w, d in zip(want[1:], a.shape[1:])):
            raise InputError(f"Input {node_id!r} takes shape {want}; {p.name} holds {a.shape}.")
        fitted.append(a)
    if token is not None and fitted[ids.index(token)].shape[0] == 1:  # all inputs given, one sequence: read per token
        seq = fitted[ids.index(token)][0].astype(np.int64)
        check_sequence_fits(graph, len(seq), token)
        check_token_ids(graph, token, seq)
        labels = tuple(vocab.decode(seq)) if vocab is not None else tuple(str(i) for i in seq.tolist())
        return ModelInput(tuple(fitted), "tokens", str(p), ids=seq, tokens=labels)
    return ModelInput(tuple(fitted), "array", str(p))


def read_model_input(
    graph: LayerGraph, source: str | Path, *, vocab: Vocabulary | None = None, row: int = 0
) -> ModelInput:
    """A file as the model's input, by its kind: ``.npy``/``.npz`` arrays, a ``.csv`` row, a ``.txt``/``.json``
    of token ids (for an integer input). Images go through ``io.images`` (they need the pixel scaling)."""
    p = Path(source).expanduser()
    suffix = p.suffix.lower()
    if suffix in ARRAY_SUFFIXES:
        return array_input(graph, p, vocab)
    if suffix == ".csv":
        return table_input(graph, read_csv_row(p, row), str(p))
    if suffix in TOKEN_SUFFIXES:
        return token_input(graph, read_token_file(p), vocab=vocab, source=str(p))
    raise InputError(f"{p.name}: an input file is .npy, .npz, .csv, .txt or .json (or an image).")


def typed_input(graph: LayerGraph, text: str, vocab: Vocabulary | None = None) -> ModelInput:
    """What a user typed: token ids ("12 7 99"), or words when a vocabulary is given and the text is not ids."""
    try:
        ids = parse_token_ids(text)
    except InputError:
        if vocab is None:
            raise
        return text_input(graph, text, vocab)
    return token_input(graph, ids, vocab=vocab, source="<ids>")


def _single_input(graph: LayerGraph, what: str) -> str:
    if len(graph.input_ids) != 1:
        raise InputError(
            f"The model takes {len(graph.input_ids)} inputs ({', '.join(graph.input_ids)}); {what} feed one. Give "
            "an .npz file with one array per input, named as the inputs."
        )
    return graph.input_ids[0]


def _why_not_padded(vocab: Any) -> str:
    if vocab is None:  # nothing says id 0 means padding in this model
        return (
            " (with no vocabulary, id 0 is not known to be padding: give all of them, or a vocabulary whose id 0 is"
            " a padding token such as [PAD])."
        )
    return f" (and the vocabulary's id 0, {vocab.tokens[0]!r}, is no padding token to fill it)."
