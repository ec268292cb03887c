"""How large the model a checkpoint config describes is, from the config alone, so that a folder whose config
cannot be built here is refused before keras_hub builds it (``num_hidden_layers: 1000000`` built blocks for 100 s
and 2.2 GB and kept going). Two checks, both generous: the parameters cannot exceed what the weights on disk can
hold (every parameter takes at least a byte), and their bytes in the dtype the model is built in must fit in
the memory the machine has now."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gradscope.core.errors import ModelLoadError

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Field names across Hugging Face families (Llama, GPT-2, Gemma, Qwen, Mixtral) and keras_hub backbone configs.
_HIDDEN = ("hidden_size", "n_embd", "d_model", "hidden_dim")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
_VOCAB = ("vocab_size", "vocabulary_size")
_INTERMEDIATE = ("moe_intermediate_size", "intermediate_size", "n_inner", "intermediate_dim")
_HEADS = ("num_attention_heads", "n_head", "num_query_heads", "num_heads")
_KV_HEADS = ("num_key_value_heads",)
_EXPERTS = ("num_local_experts", "num_experts")
_SLACK = 1_000_000  # norms, biases, position tables: never enough to matter, always enough to never refuse wrongly


def parameter_estimate(config: dict[str, Any]) -> tuple[int, str] | None:
    """About how many parameters the model has (embeddings, attention and MLP weights; norms and biases left out),
    and the field that makes it large; None where the config lacks the sizes (keras_hub says then)."""
    fields = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    fields = fields.get("config", fields) if isinstance(fields.get("config"), dict) else fields  # keras_hub preset
    hidden, layers, vocab = (_int(fields, names) for names in (_HIDDEN, _LAYERS, _VOCAB))
    if hidden is None or layers is None or vocab is None:
        return None
    heads = _int(fields, _HEADS) or 1
    kv_heads = _int(fields, _KV_HEADS) or heads
    head_dim = _int(fields, ("head_dim",)) or max(hidden // max(heads, 1), 1)
    intermediate = _int(fields, _INTERMEDIATE) or 4 * hidden
    experts = max(_int(fields, _EXPERTS) or 1, 1)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, k, v and the output projection
    mlp = 2 * hidden * intermediate * experts  # up and down (a gated MLP's third matrix is left out: a lower bound)
    embedding = vocab * hidden * (1 if fields.get("tie_word_embeddings", True) else 2)
    blocks = layers * (attention + mlp)
    names = _LAYERS if blocks >= embedding else _VOCAB
    name = next(n for n in names if _int(fields, (n,)) is not None)
    return embedding + blocks, f"{name} {fields[name]:,}"


def check_buildable(folder: Path, config: dict[str, Any], weights: Iterable[Path], dtype: str | None) -> None:
    """``ModelLoadError`` when the config describes more parameters than ``weights`` (the files the parameters are
    read from) can hold, or more bytes in ``dtype`` (None: float32, keras_hub's default) than are available."""
    estimate = parameter_estimate(config)
    if estimate is None:
        return
    parameters, why = estimate
    on_disk = sum(p.stat().st_size for p in weights)
    if parameters > on_disk + _SLACK:
        raise ModelLoadError(
            f"{folder}: config.json describes a model of about {_count(parameters)} parameters ({why}), but its "
            f"weight files ({on_disk / 2**20:,.1f} MiB) hold at most {_count(on_disk)}: the config does not match "
            "the weights."
        )
    from gradscope.io.memory import available_bytes

    need, free = parameters * _BYTES.get(dtype or "float32", 4), available_bytes()
    if free is not None and need > free:
        raise ModelLoadError(
            f"{folder}: a model of about {_count(parameters)} parameters needs about {need / 2**30:,.1f} GiB in "
            f"{dtype or 'float32'}; this machine has {free / 2**30:,.1f} GiB available."
        )


def _int(fields: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = fields.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _count(n: int) -> str:
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return str(n)
