"""Patching at the sizes users have, against the peer a user would measure it by (issue 59 item 5).

    .venv/bin/python benchmarks/bench_patching.py                  # the 309 M Llama-3 shape at 64 tokens, ResNet50
    .venv/bin/python benchmarks/bench_patching.py --tokens 512     # ... at 512 tokens (AtP only: exact takes hours)
    .venv/bin/python benchmarks/bench_patching.py --only resnet

Random weights (nothing downloaded), batch 1, this machine's CPU, medians of warm runs (the first, with its
traces, reported beside them). Measured in one process, side by side:

- AtP over every block x position x (resid, attn, mlp) for a language model, or over ResNet50's four stage
  outputs x a 7 x 7 grid, against what AtP is made of when written by hand: one compiled forward on the corrupted
  input plus one compiled plain gradient of the metric on the clean input (goal: <= 2x).
- Exact patching's cells per second against the model's own batched forward at the batch patching runs (a cell
  costs a forward of the layers above its node; goal: >= 0.8x), for the first block (all layers above: the
  worst case) and the last.

Results in ``benchmarks/results/patching*.csv`` and ``.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from bench_engine import median_time  # noqa: E402
from bench_language_model import _write, llama3, plain_next_token_gradient  # noqa: E402

from gradscope.backend import keras, tf  # noqa: E402
from gradscope.core.targets import Target  # noqa: E402
from gradscope.engine.backward.runner import Engine  # noqa: E402
from gradscope.engine.patching import blocks, patch_effects  # noqa: E402
from gradscope.engine.patching.exact import CELLS_PER_BATCH, POSITIONS_PER_BATCH  # noqa: E402

RESNET_NODES = ("conv2_block3_out", "conv3_block4_out", "conv4_block6_out", "conv5_block3_out")


def timed(fn, repeats: int) -> tuple[float, float]:
    """(the first call, the median of ``repeats`` more)."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    return first, median_time(fn, repeats, warmup=0)


def row(model: str, case: str, seconds: float, reference: float, goal: str, note: str = "") -> dict:
    ratio = round(seconds / reference if reference else float("nan"), 3)
    out = {"model": model, "case": case, "seconds": round(seconds, 4), "reference_s": round(reference, 4),
           "ratio": ratio, "goal": goal, "note": note}  # fmt: skip
    print(f"{model:22} {case:44} {seconds:8.3f} s  ref {reference:8.3f} s  {out['ratio']:6.3f}x  {goal}  {note}")
    return out


def language_model(tokens: int, repeats: int, exact: bool) -> list[dict]:
    model = llama3(16)
    engine = Engine(model)
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 1000, (1, tokens))
    other = ids.copy()
    other[0, tokens // 2] = (ids[0, tokens // 2] + 7) % 1000 + 2
    mask = np.ones((1, tokens), "int32")
    feed = lambda x: [x if i.endswith("token_ids") else mask for i in engine.graph.input_ids]  # noqa: E731
    logits = tf.function(lambda f: model(f))
    token = int(np.argmax(logits({"token_ids": ids, "padding_mask": mask})[0, -1]))
    grad = plain_next_token_gradient(model, tokens - 1, token)
    forward_s = median_time(lambda: logits({"token_ids": other, "padding_mask": mask}).numpy(), repeats)
    gradient_s = median_time(
        lambda: grad({"token_ids": tf.constant(ids), "padding_mask": tf.constant(mask)}).numpy(), repeats
    )
    reference = forward_s + gradient_s
    name, target, rows = f"llama3 309M, {tokens} tok", Target(kind="token", index=token), []

    def atp() -> None:
        patch_effects(engine, feed(ids), feed(other), target, components=("resid", "attn", "mlp"), method="atp")

    first, warm = timed(atp, repeats)
    cells = 3 * len(blocks(engine.graph)) * tokens
    rows.append(row(name, f"AtP, {cells} cells (first, traces)", first, reference, "", "forward + compiled gradient"))
    rows.append(row(name, f"AtP, {cells} cells", warm, reference, "<= 2x", "forward + compiled gradient"))
    if exact:
        batch = min(tokens, POSITIONS_PER_BATCH // tokens) + 1  # the patches of a batch, and its baseline row
        wide = np.repeat(other, batch, axis=0)
        full_s = median_time(lambda: logits({"token_ids": wide, "padding_mask": np.repeat(mask, batch, 0)}).numpy(), 2)
        per_cell_ref = full_s / (batch - 1)
        for which, block in (("first", 0), ("last", -1)):
            node = blocks(engine.graph)[block].resid
            first, warm = timed(lambda node=node: patch_effects(engine, feed(ids), feed(other), target, nodes=[node],
                                                                method="exact"), 1)  # fmt: skip
            for when, seconds in (("first, traces", first), ("", warm)):
                case = f"exact, {which} block's resid, per cell" + (f" ({when})" if when else "")
                rows.append(row(name, case, seconds / tokens, per_cell_ref, "" if when else ">= 0.8x: ratio <= 1.25",
                                f"batched forward at batch {batch}"))  # fmt: skip
    return rows


def resnet(repeats: int) -> list[dict]:
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, classifier_activation=None)
    engine = Engine(model)
    rng = np.random.default_rng(0)
    clean, corrupt = (rng.uniform(0, 1, (1, 224, 224, 3)).astype("float32") for _ in range(2))
    logits = tf.function(lambda x: model(x))
    top = int(np.argmax(logits(clean)[0]))

    @tf.function
    def gradient(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = model(x)[:, top]
        return tape.gradient(y, x)

    reference = median_time(lambda: logits(corrupt).numpy(), repeats) + median_time(
        lambda: gradient(tf.constant(clean)).numpy(), repeats
    )
    name, target, rows = "ResNet50 224, 7x7 grid", Target(index=top), []

    def atp() -> None:
        patch_effects(engine, clean, corrupt, target, nodes=list(RESNET_NODES), method="atp", grid=7)

    first, warm = timed(atp, repeats)
    cells = len(RESNET_NODES) * 49
    rows.append(row(name, f"AtP, {cells} cells (first, traces)", first, reference, "", "forward + compiled gradient"))
    rows.append(row(name, f"AtP, {cells} cells", warm, reference, "<= 2x", "forward + compiled gradient"))
    batch = CELLS_PER_BATCH + 1
    wide = np.repeat(corrupt, batch, axis=0)
    per_cell_ref = median_time(lambda: logits(wide).numpy(), 2) / CELLS_PER_BATCH
    for which, node in (("first stage", RESNET_NODES[0]), ("last stage", RESNET_NODES[-1])):
        first, warm = timed(lambda node=node: patch_effects(engine, clean, corrupt, target, nodes=[node],
                                                            method="exact", grid=7), repeats)  # fmt: skip
        for when, seconds in (("first, traces", first), ("", warm)):
            case = f"exact, {which} output, per cell" + (f" ({when})" if when else "")
            rows.append(row(name, case, seconds / 49, per_cell_ref, "" if when else ">= 0.8x: ratio <= 1.25",
                            f"batched forward at batch {batch}"))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--only", choices=("llama", "resnet"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    if args.only in (None, "llama"):
        rows += language_model(args.tokens, args.repeats, exact=args.tokens <= 64)
    if args.only in (None, "resnet"):
        rows += resnet(args.repeats)
    stem = "patching_resnet" if args.only == "resnet" else f"patching_{args.only or 'all'}_{args.tokens}"
    _write(stem, rows, {"tokens": args.tokens})


if __name__ == "__main__":
    main()
