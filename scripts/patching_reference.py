"""Activation and attribution patching references from transformers' own modules, with forward hooks, in float64.

Runs in the torch venv (torch is never a dependency of gradscope; see scripts/hf_checkpoints.py):

    /tmp/torchvenv/bin/python scripts/patching_reference.py --data tests/data/hf

For every tiny Hugging Face folder there (written by ``scripts/hf_checkpoints.py``), a clean prompt and a corrupted
one that differs at one position, and writes ``<data>/<family>_patching.npz``: the ids, the measured token (the
clean run's most likely next token after the last position), the metric (its logit) on both, and for the residual
stream after each decoder layer (the layer's output), each attention module's output (``self_attn``, after its
output projection, before any post-norm or residual add) and each MLP's output (``mlp``, or Mixtral's
``block_sparse_moe``): the exact effect of patching each position (the module's output there replaced by its value
on the corrupted prompt, by a forward hook, the rest of the model run), and AtP's estimate ((corrupt − clean) · the
gradient of the metric at the clean run, summed over the hidden dimension). ``tests/engine/patching`` checks
gradscope's ``exact`` and ``atp`` against them to 1e-4 of the largest effect.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

COMPONENTS = ("resid", "attn", "mlp")
SEED = 5


def _modules(model) -> dict[str, list]:
    """Component -> the module whose output it is, per decoder layer."""
    layers = model.transformer.h if hasattr(model, "transformer") else model.model.layers
    return {
        "resid": list(layers),
        "attn": [layer.attn if hasattr(layer, "attn") else layer.self_attn for layer in layers],
        "mlp": [getattr(layer, "block_sparse_moe", None) or layer.mlp for layer in layers],
    }


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def _replace_first(output, value):
    return (value, *output[1:]) if isinstance(output, tuple) else value


def reference(folder: Path, clean: list[int], corrupt: list[int]) -> dict[str, np.ndarray]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float64, attn_implementation="eager")
    model.eval()
    modules = _modules(model)

    def run(ids, hooks=()):
        handles = [module.register_forward_hook(hook) for module, hook in hooks]
        try:
            return model(torch.tensor([ids])).logits[0, -1]
        finally:
            for h in handles:
                h.remove()

    cached: dict = {}

    def keep(key):
        def hook(module, inputs, output):
            cached[key] = _first(output).detach().clone()

        return hook

    every = [(m, keep((c, i))) for c, ms in modules.items() for i, m in enumerate(ms)]
    with torch.no_grad():
        corrupt_logits = run(corrupt, every)
        corrupt_values = dict(cached)
        cached.clear()
        clean_logits = run(clean, every)
    token = int(clean_logits.argmax())
    base, changed = float(clean_logits[token]), float(corrupt_logits[token])

    exact = np.zeros((len(COMPONENTS), len(modules["resid"]), len(clean)))
    with torch.no_grad():
        for ci, c in enumerate(COMPONENTS):
            for li, module in enumerate(modules[c]):
                for p in range(len(clean)):

                    def patch(mod, inputs, output, c=c, li=li, p=p):
                        value = _first(output).clone()
                        value[0, p] = corrupt_values[(c, li)][0, p]
                        return _replace_first(output, value)

                    exact[ci, li, p] = float(run(clean, [(module, patch)])[token]) - base

    clean_values: dict = {}

    def keep_grad(key):
        def hook(module, inputs, output):
            value = _first(output)
            value.retain_grad()
            clean_values[key] = value

        return hook

    logit = run(clean, [(m, keep_grad((c, i))) for c, ms in modules.items() for i, m in enumerate(ms)])[token]
    logit.backward()
    atp = np.zeros_like(exact)
    for ci, c in enumerate(COMPONENTS):
        for li in range(len(modules[c])):
            value = clean_values[(c, li)]
            diff = corrupt_values[(c, li)] - value.detach()
            atp[ci, li] = (diff * value.grad).sum(-1)[0].numpy()
    return {
        "clean": np.array(clean), "corrupt": np.array(corrupt), "token": np.array(token),
        "clean_value": np.array(base), "corrupt_value": np.array(changed), "exact": exact, "atp": atp,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("tests/data/hf"))
    args = parser.parse_args()
    import json

    rng = np.random.default_rng(SEED)
    for folder in sorted(p for p in args.data.iterdir() if (p / "config.json").is_file()):
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
        clean = rng.integers(3, min(vocab, 90), size=9).tolist()
        corrupt = list(clean)
        corrupt[4] = (clean[4] + 17) % min(vocab, 90) + 3  # one token differs: positions 0-3 must show 0
        out = reference(folder, clean, corrupt)
        np.savez(args.data / f"{folder.name}_patching.npz", **out)
        print(folder.name, "largest exact effect", float(np.abs(out["exact"]).max()), "token", int(out["token"]))


if __name__ == "__main__":
    main()
