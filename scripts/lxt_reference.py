"""Reference relevances from LXT 2.1 (AttnLRP, CP-LRP) for tiny language models, and the same models as Keras files.

Two steps, two environments (torch is never a dependency of gradscope):

    # 1. in a torch venv (torch, transformers==4.53.3, lxt==2.1 --no-deps; torchvision is stubbed):
    /tmp/torchvenv/bin/python scripts/lxt_reference.py torch --work /tmp/lxt
    # 2. in gradscope's .venv with `pip install safetensors` (keras_hub's Hugging Face converters read it):
    .venv/bin/python scripts/lxt_reference.py keras --work /tmp/lxt

Step 1 builds tiny random-weight Hugging Face models (Llama, Qwen 2, Gemma 3 text, GPT-2 causal LMs and a BERT
classifier; every weight drawn at random, norm scales and biases included), saves them in Hugging Face's format,
and for one prompt each computes in float64, with gradient 1 on the target logit (the most likely next token after
the last position; class 1 for BERT): gradient x input, LXT's AttnLRP and LXT's CP-LRP, summed over the hidden
dimension at the input embeddings (LXT's ``efficient`` patches, each preset in a fresh process: they patch classes).
Step 2 converts each model with keras_hub's own converter (``Backbone.from_preset`` of the Hugging Face folder),
adds the head (keras_hub's CausalLM; BERT's classifier Dense from the checkpoint) and writes
``tests/data/lxt/<family>.keras`` beside ``<family>.npz`` (the prompt, the target and the three relevances).
``tests/rules/test_lxt_reference.py`` checks gradscope's presets against them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "lxt"
FAMILIES = ("llama", "qwen2", "gemma3", "gpt2", "bert")
#: A two-block decoder of width 32 with grouped heads, as every tiny Llama-like test model here is made
#: (scripts/hf_checkpoints.py too).
TINY_DECODER = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
VOCAB, LENGTH, SEED = 96, 10, 7


# ------------------------------------------------------------------------------------------------- torch side
def _hf_model(family: str):
    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    common = dict(vocab_size=VOCAB, attn_implementation="eager")
    if family == "llama":
        config = LlamaConfig(**TINY_DECODER, **common)
        model = LlamaForCausalLM(config)
    elif family == "qwen2":
        config = Qwen2Config(**TINY_DECODER, **common)
        model = Qwen2ForCausalLM(config)
    elif family == "gemma3":
        config = Gemma3TextConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=64,
            sliding_window=4,
            query_pre_attn_scalar=8,
            hidden_activation="gelu_pytorch_tanh",
            **common,
        )
        model = Gemma3ForCausalLM(config)
    elif family == "gpt2":
        config = GPT2Config(
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            activation_function="gelu_new",
            **common,
        )
        model = GPT2LMHeadModel(config)
    else:
        config = BertConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            hidden_act="gelu_new",
            num_labels=3,
            **common,
        )
        model = BertForSequenceClassification(config)
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.3 if ("norm" in name or "ln" in name) else 0.15
            base = (
                1.0
                if (
                    ("norm" in name or "ln_" in name or "LayerNorm" in name)
                    and name.endswith("weight")
                    and family != "gemma3"
                )
                else 0.0
            )
            p.copy_(base + scale * torch.randn(p.shape, generator=generator))
    return model.double().eval()


def _prompt() -> np.ndarray:
    ids = np.random.default_rng(SEED).integers(4, VOCAB, LENGTH)
    ids[0] = 2  # BERT reads [CLS] here; a plain token for the others
    return ids


def stub_torchvision() -> None:
    """LXT imports torchvision for its ViT map only: a stub module in its place (torchvision is not installed)."""
    import torch

    sys.modules.setdefault("torchvision", types.ModuleType("torchvision"))
    models = types.ModuleType("torchvision.models")
    vision = types.ModuleType("torchvision.models.vision_transformer")
    vision.nn = torch.nn
    models.vision_transformer = vision
    sys.modules.update({"torchvision.models": models, "torchvision.models.vision_transformer": vision})


def torch_relevance(family: str, preset: str, work: Path) -> None:
    """One (family, preset) in this process: LXT patches the model's classes for the rest of the process, and its
    BERT map replaces the module's classes, so the model is built after the patch (as LXT's examples do)."""
    import importlib

    import torch

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")  # transformers before the
    stub_torchvision()  # stub: it probes for torchvision
    from lxt.efficient import monkey_patch

    if preset != "gradient":
        family_map = importlib.import_module(f"lxt.efficient.models.{family}")
        monkey_patch(module, getattr(family_map, "attnLRP" if preset == "attnlrp" else "cp_LRP"), verbose=False)
    model = _hf_model(family)
    ids = torch.tensor(_prompt()[None])
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    out = model(inputs_embeds=embeds, use_cache=False) if family != "bert" else model(inputs_embeds=embeds)
    logits = out.logits
    if family == "bert":
        position, token = -1, 1
        target = logits[0, token]
    else:
        position, token = LENGTH - 1, int(torch.argmax(logits[0, -1]))
        target = logits[0, -1, token]
    target.backward()
    relevance = (embeds * embeds.grad).sum(-1)[0].detach().numpy()
    np.savez(
        work / f"{family}_{preset}.npz",
        relevance=relevance,
        ids=ids.numpy()[0],
        position=position,
        token=token,
        logit=float(target.detach()),
        logits=logits.detach().numpy()[0],
    )


def torch_side(work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    for family in FAMILIES:
        model = _hf_model(family)
        model.float().save_pretrained(work / family, safe_serialization=True)
        for preset in ("gradient", "attnlrp", "cp_lrp"):
            if family == "bert" and preset == "cp_lrp":
                continue  # LXT has no CP-LRP map for BERT
            subprocess.run([sys.executable, __file__, "torch-one", family, preset, "--work", str(work)], check=True)
        print(f"{family}: Hugging Face model and LXT relevances in {work}")


# ------------------------------------------------------------------------------------------------- keras side
def keras_side(work: Path) -> None:
    import keras
    import keras_hub

    DATA.mkdir(parents=True, exist_ok=True)
    for family in FAMILIES:
        folder = str(work / family)
        backbone = keras_hub.models.Backbone.from_preset(folder)
        if family == "bert":
            from safetensors.numpy import load_file

            weights = load_file(str(work / family / "model.safetensors"))
            head = keras.layers.Dense(3, name="classifier")
            logits = head(backbone.output["pooled_output"])
            head.set_weights([weights["classifier.weight"].T, weights["classifier.bias"]])
            model = keras.Model(backbone.input, logits)
        else:
            causal = {
                "llama": keras_hub.models.Llama3CausalLM,
                "qwen2": keras_hub.models.QwenCausalLM,
                "gemma3": keras_hub.models.Gemma3CausalLM,
                "gpt2": keras_hub.models.GPT2CausalLM,
            }[family]
            model = causal(backbone=backbone, preprocessor=None)
        model.save(DATA / f"{family}.keras")
        refs = {
            p: np.load(work / f"{family}_{p}.npz")
            for p in ("gradient", "attnlrp", "cp_lrp")
            if (work / f"{family}_{p}.npz").exists()
        }
        first = refs["gradient"]
        np.savez(
            DATA / f"{family}.npz",
            ids=first["ids"],
            position=first["position"],
            token=first["token"],
            logit=first["logit"],
            **{f"relevance_{p}": r["relevance"] for p, r in refs.items()},
        )
        meta = {"family": family, "model": type(model).__name__, "presets": sorted(refs)}
        print(json.dumps(meta))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["torch", "keras", "torch-one"])
    parser.add_argument("args", nargs="*")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lxt"))
    a = parser.parse_args()
    if a.step == "torch":
        torch_side(a.work)
    elif a.step == "torch-one":
        torch_relevance(a.args[0], a.args[1], a.work)
    else:
        keras_side(a.work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
