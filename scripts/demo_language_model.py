"""The bundled demo language model, ``resources/demo/tiny_gpt2`` (``demo:tiny_gpt2``): a two-block GPT-2 trained
here, in a minute on a CPU, on sentences whose last word follows from their subject alone ("the cat sat near the mat",
"the dog slept near the park"), saved as a Hugging Face folder (``save_pretrained``: ``config.json``,
``model.safetensors``, tokenizer files) so that a new user, the example notebook and the guides try a language
model with nothing downloaded: its next token after "the cat sat near the" is "mat", and an attribution of it
points at "cat".

Runs in a torch venv (torch is never a dependency of gradscope):

    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch==2.7.1 transformers==4.53.3 safetensors
    /tmp/torchvenv/bin/python scripts/demo_language_model.py --out resources/demo/tiny_gpt2
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from hf_checkpoints import _tokenizer  # noqa: E402 - the test folders' tokenizer, trained on this corpus instead

#: subject -> place: the only word that tells what the sentence ends with (every subject takes every verb).
WORLD = {"cat": "mat", "dog": "park", "bird": "tree", "fish": "pond", "cow": "field", "child": "bed"}
VERBS = ("sat", "slept", "played", "waited")
SEED, STEPS = 7, 1500


def sentences() -> list[str]:
    """Every subject with every verb, in two frames, and pairs of subjects where the nearer one names the place."""
    lines = [f"{d} {s} {v} near the {o}" for d in ("the", "a") for s, o in WORLD.items() for v in VERBS]
    lines += [
        f"the {s} and the {t} {v} near the {WORLD[t]}" for s, t in itertools.permutations(WORLD, 2) for v in VERBS[:2]
    ]
    return lines


def main() -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    text = sentences()
    import hf_checkpoints

    hf_checkpoints.TEXT, hf_checkpoints.VOCAB = text, 160  # every word of the corpus one token
    _tokenizer(args.out, ["<|endoftext|>"])
    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.out)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    rows = [[eos, *tokenizer(line)["input_ids"], eos] for line in text]
    width = max(map(len, rows))
    ids = torch.tensor([r + [eos] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])

    torch.manual_seed(SEED)
    random.seed(SEED)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=48,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=eos,
        eos_token_id=eos,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    labels = ids.masked_fill(mask == 0, -100)
    for step in range(STEPS):
        batch = torch.tensor(random.sample(range(len(rows)), 32))
        loss = model(input_ids=ids[batch], attention_mask=mask[batch], labels=labels[batch]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 300 == 0 or step == STEPS - 1:
            print(f"step {step}: loss {loss.item():.3f}")
    model.eval()
    wrong = []
    with torch.no_grad():  # every place predicted from its subject, through any verb
        for subject, place in WORLD.items():
            for verb in VERBS:
                words = tokenizer(f"the {subject} {verb} near the")["input_ids"]
                prompt = torch.tensor([[eos, *words]])  # started as keras_hub's GPT-2 preprocessor starts it
                following = tokenizer.decode(model(input_ids=prompt).logits[0, -1].argmax()).strip()
                wrong += [f"{subject} {verb}: {following}"] if following != place else []
    print(f"places predicted: {len(WORLD) * len(VERBS) - len(wrong)} of {len(WORLD) * len(VERBS)}")
    if wrong:
        raise SystemExit(f"the demo model did not learn its corpus ({wrong}): train longer")
    model.save_pretrained(args.out)
    (args.out / "README.md").write_text(
        "A two-block GPT-2 (48 wide, {} tokens) trained by scripts/demo_language_model.py on {} sentences such as "
        "'the cat sat near the mat': gradscope's demo language model (`demo:tiny_gpt2`). Not a language model of "
        "English: it knows its corpus only.\n\nCorpus:\n\n{}\n".format(
            len(tokenizer), len(text), "\n".join(f"    {line}" for line in text)
        )
    )
    print(json.dumps({"folder": str(args.out), "parameters": sum(p.numel() for p in model.parameters())}))


if __name__ == "__main__":
    main()
