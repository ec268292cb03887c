"""Tiny Hugging Face checkpoint folders, as users have them (``save_pretrained``: ``config.json``,
``model.safetensors``, tokenizer files), and their logits in torch for a reference.

Runs in a torch venv (torch is never a dependency of gradscope):

    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch==2.7.1 transformers==4.53.3 safetensors
    /tmp/torchvenv/bin/python scripts/hf_checkpoints.py --out tests/data/hf

Each family gets ``<out>/<family>/`` (float32, random weights, a byte-level BPE tokenizer of 96 tokens trained here
on a few sentences) and ``<out>/<family>.npz``: a prompt and torch's float64 logits for it.
``tests/io/test_checkpoint_folders.py`` opens the folders with gradscope (through keras_hub's own converters) and
checks the logits and the tokenizer against these.

With ``pip install lxt==2.1 --no-deps`` in the same venv, ``--lxt`` adds ``<out>/<family>_lxt.npz`` for the families
LXT 2.1 has maps for (Llama, Qwen 2, Qwen 3, Gemma 3, GPT-2) and three whose maps are built here from LXT's own
patches (SmolLM3; Mixtral and Qwen 3 MoE with their routers held constant): AttnLRP and CP-LRP relevance at the token
embeddings (summed over the hidden dimension; gradient 1 on the most likely next token's logit after the last
position, as float64 says)
with the model in float64 and in bfloat16: LXT's own bfloat16 error is the bound gradscope's bfloat16 result is
held to (``tests/rules/test_low_precision.py``).

``--variants`` writes the folders of ``VARIANTS`` (one config field off its default each, issue 61) and
``--fields`` writes ``<out>/config_fields.json``: every field of each family's config class, for
``tests/io/test_config_fields.py``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from lxt_reference import TINY_DECODER  # the script's own folder is on sys.path

VOCAB, SEED = 96, 11
TEXT = [
    "the cat sat on the mat",
    "a dog ran in the park and the cat saw it",
    "gradients flow back through every layer of the model",
]


#: The special tokens each family's keras_hub tokenizer looks for (ids 0, 1, ...); Mistral's folder has no
#: tokenizer (its converter wants SentencePiece's ``tokenizer.model``): a checkpoint opened with token ids only.
SPECIALS = {
    "llama": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"],
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "gpt2": ["<|endoftext|>"],
}


def _tokenizer(folder: Path, specials: list[str]) -> None:
    """A byte-level BPE of ``VOCAB`` tokens, the family's special tokens first, saved by transformers as every
    fast tokenizer is (``tokenizer.json``, Llama 3's format) and as GPT-2 and Qwen's converters read it
    (``vocab.json`` + ``merges.txt``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()[:64]
    )
    bpe.train_from_iterator(TEXT, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=specials[0], eos_token=specials[-1])
    fast.save_pretrained(folder)
    vocab = bpe.get_vocab()
    (folder / "vocab.json").write_text(json.dumps(dict(sorted(vocab.items(), key=lambda kv: kv[1]))))
    merges = json.loads(bpe.to_str())["model"]["merges"]
    lines = [" ".join(m) if isinstance(m, list) else m for m in merges]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(lines) + "\n")


def _model(family: str, **overrides):
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    gqa = dict(
        **TINY_DECODER,
        vocab_size=VOCAB,
        bos_token_id=0,
        eos_token_id=1,
        attn_implementation="eager",
    )
    gqa |= {k: v for k, v in overrides.items() if k in TINY_DECODER or not family.startswith(("gemma", "gpt2"))}
    import transformers as hf

    moe = dict(num_experts_per_tok=2, output_router_logits=False)
    gemma = dict(head_dim=8, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=8)
    gemma |= {k: v for k, v in overrides.items() if family.startswith("gemma") and k not in TINY_DECODER}
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**gqa))
    elif family == "mistral":
        model = MistralForCausalLM(MistralConfig(**{"sliding_window": None, **gqa}))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**gqa))
    elif family == "qwen3":
        model = hf.Qwen3ForCausalLM(hf.Qwen3Config(**gqa, head_dim=8))
    elif family == "smollm3":
        model = hf.SmolLM3ForCausalLM(  # tied, as its hub configs (keras_hub ties SmolLM3 always)
            hf.SmolLM3Config(**{**gqa, "tie_word_embeddings": True}, pad_token_id=2, mlp_bias=False)
        )
    elif family == "mixtral":
        model = hf.MixtralForCausalLM(hf.MixtralConfig(**gqa, num_local_experts=4, **moe))
    elif family == "qwen2_moe":
        experts = dict(num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=24, **moe)
        model = hf.Qwen2MoeForCausalLM(hf.Qwen2MoeConfig(**gqa, **experts))
    elif family == "qwen3_moe":
        config = hf.Qwen3MoeConfig(**gqa, head_dim=8, num_experts=4, moe_intermediate_size=16, **moe)
        model = hf.Qwen3MoeForCausalLM(config)
    elif family == "gemma":
        model = hf.GemmaForCausalLM(hf.GemmaConfig(**{**gqa, "tie_word_embeddings": True}, **gemma))
    elif family == "gemma2":
        config = hf.Gemma2Config(**{**gqa, "tie_word_embeddings": True}, **gemma, sliding_window=4)
        model = hf.Gemma2ForCausalLM(config)
    elif family == "gemma3":
        config = hf.Gemma3TextConfig(**{**gqa, "tie_word_embeddings": True}, **gemma, sliding_window=4)
        model = hf.Gemma3ForCausalLM(config)
    else:
        config = GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, **overrides
        )
        model = GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm = ("norm" in name or "ln_" in name) and not family.startswith("gemma")  # Gemma's scale is 1 + w
            p.copy_(
                (1.0 if norm and name.endswith("weight") else 0.0) + 0.15 * torch.randn(p.shape, generator=generator)
            )
    return model.eval()


#: Issue 61: one config field off its default per folder, each one keras_hub 0.32's converter dropped or replaced
#: (``gradscope/io/checkpoints/faithful.py`` carries it over or refuses the folder). ``--variants`` writes them.
VARIANTS = {
    "llama_rms_norm_eps": ("llama", {"rms_norm_eps": 1e-5}),
    "llama_attention_bias": ("llama", {"attention_bias": True}),
    "gemma_rms_norm_eps": ("gemma", {"rms_norm_eps": 1e-5}),
    "gemma2_rms_norm_eps": ("gemma2", {"rms_norm_eps": 1e-5, "head_dim": 16, "query_pre_attn_scalar": 8}),
    "gemma2_query_pre_attn_scalar": ("gemma2", {"query_pre_attn_scalar": 256}),
    "gemma3_rms_norm_eps": ("gemma3", {"rms_norm_eps": 1e-5, "head_dim": 16, "query_pre_attn_scalar": 8}),
    "gemma3_query_pre_attn_scalar": ("gemma3", {"query_pre_attn_scalar": 256}),
    "gpt2_layer_norm_epsilon": ("gpt2", {"layer_norm_epsilon": 1e-3}),
    "gpt2_activation_function": ("gpt2", {"activation_function": "relu"}),
    # fields keras_hub's converter reads, held to transformers on a prompt longer than the window
    "llama_rope_scaling": (  # wavelengths beyond 16 / low_freq_factor scaled: two of a head of 8's four
        "llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
    "mistral_sliding_window": ("mistral", {"sliding_window": 4}),
    "mixtral_sliding_window": ("mixtral", {"sliding_window": 4}),
    "qwen3_moe_sliding_window": ("qwen3_moe", {"sliding_window": 4}),
    # Qwen 2 MoE (a family of its own): a tied head keras_hub's converter never reads, and its top-k normalisation
    "qwen2_moe_tie_word_embeddings": ("qwen2_moe", {"tie_word_embeddings": True}),
    "qwen2_moe_norm_topk_prob": ("qwen2_moe", {"norm_topk_prob": True}),
}

#: transformers' config class of each family gradscope opens, for ``--fields`` (every field it defines, as
#: ``tests/io/test_config_fields.py`` checks each is read, carried, refused or not part of the arithmetic).
CONFIG_CLASSES = {
    "llama": "LlamaConfig", "mistral": "MistralConfig", "mixtral": "MixtralConfig", "qwen2": "Qwen2Config",
    "qwen2_moe": "Qwen2MoeConfig", "qwen3": "Qwen3Config", "qwen3_moe": "Qwen3MoeConfig", "gemma": "GemmaConfig",
    "gemma2": "Gemma2Config", "gemma3_text": "Gemma3TextConfig", "gpt2": "GPT2Config", "smollm3": "SmolLM3Config",
}  # fmt: skip


def config_fields() -> dict:
    """Each family's config as transformers writes it by default, less the fields every model shares (ids,
    generation, output switches) except ``tie_word_embeddings``."""
    import transformers as hf

    shared = set(hf.PretrainedConfig().to_dict()) - {"tie_word_embeddings"}
    found = {}
    for family, name in CONFIG_CLASSES.items():
        config = getattr(hf, name)().to_dict()
        found[family] = {k: v for k, v in config.items() if k not in shared or k == "model_type"}
    return {"transformers": hf.__version__, "families": found}


#: Variants gradscope refuses: no map to compare.
LXT_REFUSED = ("llama_attention_bias", "gemma3_query_pre_attn_scalar", "gpt2_activation_function")

LXT_FAMILIES = ("llama", "qwen2", "qwen3", "gemma3", "gpt2", "smollm3", "mixtral", "qwen3_moe", "qwen2_moe")


def lxt_map(family: str, preset: str, module) -> dict:
    """LXT 2.1's patch map for ``family``: its own (``lxt.efficient.models``) where LXT has one, else one built from
    LXT's own patches as its Llama map is: RMSNorm, attention and the gated MLP (Mixtral's experts name their
    projections w1/w3/w2); a mixture of experts' router held constant, gradscope's documented choice."""
    import importlib
    from functools import partial

    if importlib.util.find_spec(f"lxt.efficient.models.{family}"):
        return getattr(
            importlib.import_module(f"lxt.efficient.models.{family}"), "attnLRP" if preset == "attnlrp" else "cp_LRP"
        )
    from lxt.efficient import patches
    from lxt.efficient.rules import divide_gradient, identity_rule_implicit, stop_gradient

    cp = preset != "attnlrp"
    prefix = {"smollm3": "SmolLM3", "mixtral": "Mixtral", "qwen3_moe": "Qwen3Moe", "qwen2_moe": "Qwen2Moe"}[family]
    mlp = patches.cp_gated_mlp_forward if cp else patches.gated_mlp_forward

    def mixtral_expert(self, x):  # MixtralBlockSparseTop2MLP: w2(act(w1 x) * w3 x), ruled as gated_mlp_forward
        if cp:
            return self.w2(self.act_fn(stop_gradient(self.w1(x))) * self.w3(x))
        return self.w2(divide_gradient(identity_rule_implicit(self.act_fn, self.w1(x)) * self.w3(x), 2))

    found = {getattr(module, f"{prefix}RMSNorm"): partial(patches.patch_method, patches.rms_norm_forward)}
    if family == "qwen2_moe":  # transformers 4.53's Qwen 2 MoE computes its attention inline: no function to wrap
        wrap = patches.cp_wrap_attention_forward if cp else patches.wrap_attention_forward
        module.Qwen2MoeAttention.forward = _attention_through(wrap)
    else:
        found[module] = patches.patch_cp_attention if cp else patches.patch_attention
    if family == "mixtral":
        found[module.MixtralBlockSparseTop2MLP] = partial(patches.patch_method, mixtral_expert)
    else:
        found[getattr(module, f"{prefix}MLP")] = partial(patches.patch_method, mlp)
    return found


def _attention_through(wrap):
    """Qwen2MoeAttention.forward as the newer families write it: projections, rotary positions, then one attention
    function (Llama's eager one, wrapped by LXT's ``wrap``); the forward is the same (checked against the logits)."""
    from transformers.models.llama.modeling_llama import eager_attention_forward
    from transformers.models.qwen2_moe.modeling_qwen2_moe import apply_rotary_pos_emb

    attend = wrap(eager_attention_forward)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None, **kwargs):
        batch, length, _ = hidden_states.size()
        q, k, v = (
            proj(hidden_states).view(batch, length, -1, self.head_dim).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        q, k = apply_rotary_pos_emb(q, k, *kwargs["position_embeddings"])
        mask = None if attention_mask is None else attention_mask[:, :, :, : k.shape[-2]]
        out, _ = attend(self, q, k, v, mask, dropout=0.0, scaling=self.head_dim**-0.5)
        return self.o_proj(out.reshape(batch, length, -1).contiguous()), None, past_key_value

    return forward


def _constant_routers(model) -> None:
    """Every mixture-of-experts router's logits detached: the routing weights are data (and Qwen 2 MoE's shared
    expert's gate, a weight of the same kind)."""
    for name, sub in model.named_modules():
        if name.endswith(("mlp.gate", "block_sparse_moe.gate", "mlp.shared_expert_gate")):
            sub.register_forward_hook(lambda _module, _inputs, out: out.detach())


def lxt_relevance(folder: Path, family: str, preset: str, dtype: str, token: int) -> np.ndarray:
    """``folder``'s prompt is ``<folder>.npz`` beside it; ``family`` names transformers' module and LXT's map."""
    """LXT's relevance per token for ``preset`` with the model in ``dtype`` (one call a process: LXT patches
    the family's classes), as its examples compute it: the target logit's backward, embeddings x their gradient."""
    import importlib
    import sys

    import torch

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    sys.path.insert(0, str(Path(__file__).parent))
    from lxt_reference import stub_torchvision

    stub_torchvision()
    from lxt.efficient import monkey_patch
    from transformers import AutoModelForCausalLM

    monkey_patch(module, lxt_map(family, preset, module), verbose=False)
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=getattr(torch, dtype), attn_implementation="eager")
    _constant_routers(model)
    prompt = np.load(folder.parent / f"{folder.name}.npz")
    ids = torch.tensor(prompt["ids"][None])
    if dtype == "float64":  # LXT's patches change gradients only: the forward is still the model's
        with torch.no_grad():
            logits = model(ids, use_cache=False).logits[0].numpy()
        assert np.allclose(logits, prompt["logits"], rtol=0, atol=1e-9 * np.abs(prompt["logits"]).max()), folder
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    model(inputs_embeds=embeds, use_cache=False).logits[0, -1, token].backward()
    return (embeds * embeds.grad).double().sum(-1)[0].detach().numpy()


def main() -> None:
    import subprocess
    import sys

    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--families", default="llama,mistral,qwen2,qwen3,gemma,gemma2,gemma3,gpt2,smollm3,mixtral,qwen3_moe"
    )
    parser.add_argument("--variants", action="store_true", help="the folders of VARIANTS instead (issue 61)")
    parser.add_argument("--lxt", action="store_true", help="also LXT 2.1's relevances in float64 and bfloat16")
    parser.add_argument("--fields", action="store_true", help="write <out>/config_fields.json (transformers' fields)")
    parser.add_argument(
        "--lxt-one", nargs=5, metavar=("NAME", "FAMILY", "PRESET", "DTYPE", "TOKEN"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.fields:
        (args.out / "config_fields.json").write_text(json.dumps(config_fields(), indent=1, sort_keys=True) + "\n")
        return
    if args.lxt_one:
        name, family, preset, dtype, token = args.lxt_one
        np.save(
            args.out / f"{name}_{preset}_{dtype}.npy",
            lxt_relevance(args.out / name, family, preset, dtype, int(token)),
        )
        return
    if args.lxt:
        if args.variants:  # the carried fields of the families LXT has a map for, in float64 (float32 is held to it)
            named = {n: f for n, (f, _) in VARIANTS.items() if f in LXT_FAMILIES and (args.out / f"{n}.npz").exists()}
            named = {n: f for n, f in named.items() if n not in LXT_REFUSED}
        else:
            named = {f: f for f in args.families.split(",") if f in LXT_FAMILIES}
        for name, family in named.items():
            token = int(np.load(args.out / f"{name}.npz")["logits"][-1].argmax())
            found = {"token": token}
            for preset in ("attnlrp", "cp_lrp"):
                for dtype in ("float64",) if args.variants else ("float64", "bfloat16"):
                    cmd = [
                        sys.executable,
                        __file__,
                        "--out",
                        str(args.out),
                        "--lxt-one",
                        name,
                        family,
                        preset,
                        dtype,
                        str(token),
                    ]
                    subprocess.run(cmd, check=True)
                    part = args.out / f"{name}_{preset}_{dtype}.npy"
                    found[f"{preset}_{dtype}"] = np.load(part)
                    part.unlink()
            np.savez(args.out / f"{name}_lxt.npz", **found)
            print(name, "LXT", {k: float(np.abs(v).max()) for k, v in found.items() if k != "token"})
        return
    names = list(VARIANTS) if args.variants else args.families.split(",")
    for family in names:
        folder = args.out / family
        folder.mkdir(parents=True, exist_ok=True)
        model = _model(VARIANTS[family][0], **VARIANTS[family][1]) if args.variants else _model(family)
        model.save_pretrained(folder, safe_serialization=True)
        if family in SPECIALS and not args.variants:
            _tokenizer(folder, SPECIALS[family])
        ids = np.random.default_rng(SEED).integers(3, VOCAB, 9)
        with torch.no_grad():
            logits = model.double()(torch.tensor(ids[None])).logits[0].numpy()
        extra = {}
        if (
            family in SPECIALS and not args.variants
        ):  # how transformers tokenizes a sentence, for the converted tokenizer
            from transformers import AutoTokenizer

            extra["text_ids"] = np.array(
                AutoTokenizer.from_pretrained(folder)(TEXT[0], add_special_tokens=False)["input_ids"]
            )
        np.savez(args.out / f"{family}.npz", ids=ids, logits=logits, **extra)
        print(family, sorted(p.name for p in folder.iterdir()), sum(p.stat().st_size for p in folder.iterdir()))


if __name__ == "__main__":
    main()
