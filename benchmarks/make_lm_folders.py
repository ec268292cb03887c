"""Billion-parameter Hugging Face checkpoint folders with random weights, as users download them (issue 50 item 4).

Runs in a torch venv (torch is never a dependency of gradscope; the same venv as ``scripts/hf_checkpoints.py``):

    /tmp/torchvenv/bin/python benchmarks/make_lm_folders.py --out /tmp/lm_folders

Writes ``llama3_1b/`` (Llama-3.2-1B's shape: 16 blocks of width 2048, 32 query / 8 key-value heads, MLP 8192,
vocabulary 128,256, tied head, llama3 rope scaling: 1.24 B parameters), ``llama3_8b/`` (Llama-3-8B's shape: 32
blocks of width 4096, 32 query / 8 key-value heads, MLP 14,336, untied head: 8.0 B parameters, 16 GB in shards of
2 GB with their index; only with ``--only llama3_8b``: it needs 18 GB of memory to write) and ``gemma3_1b/``
(Gemma-3-1B's shape: 26 blocks of width 1152, 4 query / 1 key-value head of 256, MLP 6912, vocabulary 262,144,
tied, sliding windows of 512: 1.0 B parameters), each ``save_pretrained`` in bfloat16 (``torch_dtype: bfloat16``,
one safetensors file per 5 GB) with weights drawn N(0, 0.02) as transformers initialises them. No tokenizer: the
benchmark feeds token ids. ``llama3_309m/`` is the 309 M Llama-3 shape of ``bench_language_model.py`` in float32
(16 blocks of width 1024, vocabulary 32,000, untied), for 2,048-token prompts against LXT.
``benchmarks/bench_language_model.py --folder DIR`` measures them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM


def _llama3(**shape: object) -> tuple[type, LlamaConfig]:
    """A Llama 3 of ``shape`` on Llama 3's own settings (grouped heads of 8, rotary base 500,000, norm epsilon 1e-5,
    its special tokens, bfloat16)."""
    base = dict(
        vocab_size=128_256,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=500_000.0,
        bos_token_id=128_000,
        eos_token_id=128_001,
        torch_dtype="bfloat16",
    )
    return LlamaForCausalLM, LlamaConfig(**(base | shape))


#: name -> (the model class, its config); each model is built in its config's dtype (a float32 copy is never made)
SHAPES = {
    "llama3_1b": _llama3(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        max_position_embeddings=131_072,
        rope_scaling={
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        tie_word_embeddings=True,
    ),
    "llama3_8b": _llama3(hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32, tie_word_embeddings=False),
    # bench_language_model.py's Keras Llama shape, in float32, for long prompts
    "llama3_309m": _llama3(
        vocab_size=32_000,
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=4,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    ),
    "gemma3_1b": (
        Gemma3ForCausalLM,
        Gemma3TextConfig(
            vocab_size=262_144,
            hidden_size=1152,
            intermediate_size=6912,
            num_hidden_layers=26,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            sliding_window=512,
            query_pre_attn_scalar=256,
            rope_theta=1_000_000.0,
            rope_local_base_freq=10_000.0,
            max_position_embeddings=32_768,
            tie_word_embeddings=True,
            torch_dtype="bfloat16",
        ),
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", choices=sorted(SHAPES))
    args = parser.parse_args()
    torch.manual_seed(0)
    for name, (model_class, config) in SHAPES.items():
        if args.only == name or args.only is None and name != "llama3_8b":
            torch.set_default_dtype(config.torch_dtype)  # built in the checkpoint's dtype: no float32 copy
            model = model_class(config)
            folder = args.out / name
            model.save_pretrained(folder, safe_serialization=True, max_shard_size="2GB" if "8b" in name else "5GB")
            count = sum(p.numel() for p in model.parameters())
            print(f"{folder}: {count / 1e9:.2f} B parameters, {model.dtype}")
            del model


if __name__ == "__main__":
    main()
