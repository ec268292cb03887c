"""The peer's side of ``bench_language_model.py --folder DIR --lxt PYTHON``: LXT 2.1 on transformers opens a Hugging
Face Llama folder and computes AttnLRP maps, timed as a user of LXT meets them (issue 60).

Runs in the torch venv (torch 2.7.1, transformers 4.53.3, lxt 2.1 and torchvision --no-deps; the same venv as
``scripts/lxt_reference.py``), one process per run, never imports gradscope or TensorFlow:

    /tmp/torchvenv/bin/python benchmarks/lxt_language_model.py /tmp/lm_folders/llama3_1b [--tokens 64]

Prints one ``RESULT {json}`` line: process start -> loaded, the first AttnLRP map (LXT's ``efficient`` patches,
eager attention, the model in its stored dtype, gradient 1 on the most likely next token's logit after the last
position, relevance = embeddings x their gradient summed over the hidden dimension), the same prompt again,
another prompt, and the peak RSS. The prompts are gradscope's benchmark's (``numpy.random.default_rng(0)``).
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    import torch
    from lxt_reference import stub_torchvision
    from transformers.models.llama import modeling_llama

    stub_torchvision()
    from lxt.efficient import monkey_patch
    from lxt.efficient.models.llama import attnLRP
    from transformers import AutoModelForCausalLM

    monkey_patch(modeling_llama, attnLRP, verbose=False)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.folder, torch_dtype="auto", attn_implementation="eager").eval()
    for p in model.parameters():
        p.requires_grad_(False)
    loaded, started = time.perf_counter() - t0, time.perf_counter() - STARTED
    weights_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    rng = np.random.default_rng(0)

    def relevance(ids: np.ndarray) -> np.ndarray:
        embeds = model.get_input_embeddings()(torch.tensor(ids)).detach().requires_grad_(True)
        logits = model(inputs_embeds=embeds, use_cache=False).logits
        logits[0, -1, logits[0, -1].argmax()].backward()
        return (embeds * embeds.grad).float().sum(-1)[0].detach().numpy()

    ids = rng.integers(2, 1000, (1, args.tokens))
    timings = {}
    for case, prompt in (("first_map_s", ids), ("again_s", ids), ("other_prompt_s", rng.integers(2, 1000, ids.shape))):
        t0 = time.perf_counter()
        relevance(prompt)
        timings[case] = time.perf_counter() - t0
    row = {
        "load_s": loaded,
        "started_to_loaded_s": started,
        "started_to_first_map_s": started + timings["first_map_s"],
        **timings,
        "peak_mb": _peak_mb(),
        "weights_mb": weights_mb,
        "dtype": str(model.dtype).removeprefix("torch."),
        "torch": torch.__version__,
    }
    print("RESULT " + json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
