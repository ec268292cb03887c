"""Causal language models against a compiled plain tf.GradientTape gradient, measured side by side (issue 37).

    .venv/bin/python benchmarks/bench_language_model.py                       # Llama-3-shaped 309 M + Gemma-3-270M
    .venv/bin/python benchmarks/bench_language_model.py --only llama3 --layers 2   # a smoke run
    .venv/bin/python benchmarks/bench_language_model.py --memory 200          # + RSS over 200 one-node edits
    .venv/bin/python benchmarks/bench_language_model.py --save DIR            # save the models as .keras, then
    .venv/bin/python benchmarks/bench_language_model.py --open DIR/llama3_16x1024.keras   # open + first map + RSS
                                                                              # in this fresh process (as the app)

Random weights (nothing downloaded), prompt of 64 tokens, batch 1, this machine's CPU. The Llama-3 shape: 16
blocks of width 1024, 16 query / 4 key-value heads, MLP 4096, vocabulary 32,000 (309 M parameters, untied head);
the Gemma-3-270M shape: 18 blocks of width 640, 4 query / 1 key-value head of 256, MLP 2048, vocabulary 262,144
(tied), sliding windows of 512. Every row is timed as the window runs a click (every node's statistics to the
host). Ratios are to the compiled plain gradient of the same next-token logit (the most likely token after the
last position) with respect to the token embedding's output, where the map is read. Goals
(reported, not asserted): first map after opening <= 5x; a never-seen attnlrp / cp_lrp <= 4x and the same plan
again <= 1.1x; a one-node edit <= 1.5x; 16 generated tokens attributed in <= 1.5 x (16 plain gradients + Keras'
own ``generate`` of 16 tokens, its first call); RSS <= 3x the weights, flat over edits.
Writes benchmarks/results/language_model.{json,csv} (other settings: language_model_<settings>.{json,csv}).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from gradscope.app.work.heap import release_replaced, settle_after_load  # noqa: E402
from gradscope.backend import keras, tf  # noqa: E402
from gradscope.core.targets import Target  # noqa: E402
from gradscope.engine.backward.runner import Engine  # noqa: E402
from gradscope.rules.methods import build_method  # noqa: E402
from gradscope.rules.plan import Plan  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import median_time  # noqa: E402
from bench_transformer import rss_mb  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = 64


def llama3(layers: int) -> keras.Model:
    import keras_hub

    backbone = keras_hub.models.Llama3Backbone(
        vocabulary_size=32_000,
        num_layers=layers,
        num_query_heads=16,
        num_key_value_heads=4,
        hidden_dim=1024,
        intermediate_dim=4096,
        tie_word_embeddings=False,
    )
    return keras_hub.models.Llama3CausalLM(backbone=backbone, preprocessor=None, name=f"llama3_{layers}x1024")


def gemma3(layers: int) -> keras.Model:
    import keras_hub

    backbone = keras_hub.models.Gemma3Backbone(
        vocabulary_size=262_144,
        image_size=896,
        num_layers=layers,
        num_query_heads=4,
        num_key_value_heads=1,
        hidden_dim=640,
        intermediate_dim=2048,
        head_dim=256,
        sliding_window_size=512,
        vision_encoder=None,
        use_query_key_norm=True,
        query_head_dim_normalize=True,
    )
    return keras_hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=None, name=f"gemma3_{layers}x640")


def plain_next_token_gradient(model: keras.Model, position: int, token: int):
    """The compiled tape gradient of logit[position, token] with respect to the token embedding's output (what
    the map is read from): the embedding layer's output is watched as the traced call makes it."""
    layer = model.backbone.get_layer("token_embedding")

    @tf.function
    def grad(feed):
        made = {}
        with tf.GradientTape() as tape:

            def call(*args, **kwargs):
                out = type(layer).call(layer, *args, **kwargs)
                if not kwargs.get("reverse") and "e" not in made:
                    tape.watch(out)
                    made["e"] = out
                return out

            object.__setattr__(layer, "call", call)
            try:
                y = model(feed)[0, position, token]
            finally:
                object.__delattr__(layer, "call")
        return tape.gradient(y, made["e"])

    return grad


def bench(name: str, model: keras.Model, repeats: int, edits: int, steps: int) -> list[dict]:
    from gradscope.api import explain_generation

    release_replaced()
    ids = np.random.default_rng(0).integers(2, 1000, (1, PROMPT))
    feed = {"token_ids": tf.constant(ids), "padding_mask": tf.ones_like(ids, tf.int32)}
    forward = tf.function(lambda f: model(f))
    logits = forward(feed).numpy()
    token = int(np.argmax(logits[0, -1]))
    grad = plain_next_token_gradient(model, PROMPT - 1, token)
    base = median_time(lambda: grad(feed).numpy(), repeats)
    decode = median_time(lambda: forward(feed).numpy(), repeats)
    weights_mb = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.weights) / 2**20
    rows: list[dict] = []

    def record(case: str, seconds: float, extra: str = "") -> None:
        rows.append({"model": name, "case": case, "seconds": seconds, "ratio": seconds / base, "note": extra})
        print(f"{name:<16} {case:<52} {seconds:8.2f} s  {seconds / base:6.2f}x  {extra}", flush=True)

    record("plain GradientTape gradient (compiled)", base, f"{weights_mb:.0f} MB of weights")
    record("compiled forward pass (one decoding step)", decode)
    target = Target(kind="token")
    t0 = time.perf_counter()
    engine = Engine(model)
    settle_after_load()
    x = [ids if i == "token_ids" else np.ones_like(ids) for i in engine.graph.input_ids]
    r = engine.backward(x, target, Plan(), capture="all")
    record(
        "first map after opening (engine + forward + sweep)",
        time.perf_counter() - t0,
        f"{r.meta['mode']}, {len(engine.graph)} nodes",
    )
    assert int(r.target_indices[0]) == token
    record(
        "RSS after the first map (MB)",
        0.0,
        f"{rss_mb():.0f} MB; weights {weights_mb:.0f} MB ({rss_mb() / weights_mb:.1f}x)",
    )
    t0 = time.perf_counter()
    engine.compile(x, target, Plan())
    record("background step: compile kernels + identity plan", time.perf_counter() - t0, "not waited for")
    for preset in ("attnlrp", "cp_lrp"):
        plan = build_method(preset, engine.graph).plan
        t0 = time.perf_counter()
        r = engine.backward(x, target, plan, capture="all")
        record(f"never-seen preset: {preset}", time.perf_counter() - t0, f"{r.meta['mode']}, {len(r.rules)} rules")
        t0 = time.perf_counter()
        engine.compile(x, target, plan)  # the Session's background step after the live answer
        record(f"background step: compile {preset}", time.perf_counter() - t0, "not waited for")
        t0 = time.perf_counter()
        r = engine.backward(x, target, plan, capture="all")
        record(f"the same plan again: {preset}", time.perf_counter() - t0, r.meta["mode"])
    engine.backward(x, target, Plan(), capture="all")
    downs = [n.id for n in engine.graph.nodes if n.id.endswith(("feedforward_output_dense", "ffw_linear"))]
    middle = downs[len(downs) // 2]  # the MLP output of the middle block
    for factor in (2.0, 3.0):
        t0 = time.perf_counter()
        r = engine.backward(x, target, Plan().with_entry(middle, "scale", {"factor": factor}), capture="all")
        record(
            f"one-node edit: scale={factor} on {middle.split('/', 1)[1]}",
            time.perf_counter() - t0,
            f"{r.meta.get('recomputed_nodes', '?')} nodes",
        )
    if steps:
        t0 = time.perf_counter()
        g = explain_generation(engine, ids[0], steps=steps, method="attnlrp")
        seconds = time.perf_counter() - t0
        generate = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
        cold = median_time(lambda: model.generate(generate, max_length=PROMPT + steps, stop_token_ids=None), 1, 0)
        warm = median_time(lambda: model.generate(generate, max_length=PROMPT + steps, stop_token_ids=None), 1, 0)
        record(f"Keras' own generate of {steps} tokens, first call", cold, "key/value cache; traces once")
        record(f"Keras' own generate of {steps} tokens, again", warm)
        budget = 1.5 * (steps * base + cold)  # issue 50: 16 plain gradients + Keras' generate, times 1.5
        record(
            f"{steps} generated tokens attributed (attnlrp)",
            seconds,
            f"goal {budget:.1f} s = 1.5 x ({steps} gradients + generate's first call); {len(g.generated)} tokens",
        )
    if edits:
        before = rss_mb()
        marks = []
        for k in range(edits):  # every plan new (a plan seen before is traced whole: not what this measures)
            engine.backward(x, target, Plan().with_entry(middle, "scale", {"factor": 10 + k / 100}), capture="all")
            if k in (edits // 4, edits - 1):
                marks.append(rss_mb())
        record(
            f"RSS over {edits} edits (MB: start, 1/4, end)",
            0.0,
            f"{before:.0f}, {marks[0]:.0f}, {marks[-1]:.0f}; weights {weights_mb:.0f} MB",
        )
    else:
        record("RSS now (MB)", 0.0, f"{rss_mb():.0f} MB; weights {weights_mb:.0f} MB ({rss_mb() / weights_mb:.1f}x)")
    return rows


def open_saved(path: Path) -> None:
    """Open a saved model as the app does (``open_engine``: safe mode, the graph, the weights read in place), the
    first map of the most likely next token, and the process's RSS against the weights' size."""
    from gradscope.api import open_engine

    t0 = time.perf_counter()
    engine = open_engine(path)
    settle_after_load()
    opened = time.perf_counter() - t0
    ids = np.random.default_rng(0).integers(2, 1000, (1, PROMPT))
    x = [ids if i == "token_ids" else np.ones_like(ids) for i in engine.graph.input_ids]
    t0 = time.perf_counter()
    engine.backward(x, Target(kind="token"), Plan(), capture="all")
    first = time.perf_counter() - t0
    weights_mb = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in engine.model.weights) / 2**20
    print(
        f"{path.name}: open {opened:.2f} s, first map {first:.2f} s, RSS {rss_mb():.0f} MB for {weights_mb:.0f} MB of "
        f"weights ({rss_mb() / weights_mb:.1f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("llama3", "gemma3"))
    parser.add_argument("--layers", type=int, help="blocks (default: the model's shape: 16 Llama, 18 Gemma)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", type=int, default=0, metavar="EDITS", help="RSS over this many edits")
    parser.add_argument("--generate", type=int, default=16, metavar="N", help="tokens to generate (0: skip)")
    parser.add_argument("--save", metavar="DIR", help="only build and save the models as .keras into DIR")
    parser.add_argument("--open", metavar="FILE", help="only open FILE as the app does, first map, RSS (fresh process)")
    args = parser.parse_args()
    if args.open:
        return open_saved(Path(args.open))
    keras.utils.set_random_seed(0)
    rows: list[dict] = []
    for name, build, default in (("llama3", llama3, 16), ("gemma3", gemma3, 18)):
        if args.only in (None, name):
            model = build(args.layers or default)
            if args.save:
                model({"token_ids": np.ones((1, 4), "int32"), "padding_mask": np.ones((1, 4), "int32")})
                model.save(Path(args.save) / f"{model.name}.keras")
                continue
            rows += bench(name, model, args.repeats, args.memory, args.generate)
    if args.save:
        return
    RESULTS.mkdir(exist_ok=True)
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(), "layers": args.layers, "tf": tf.__version__}
    stem = "language_model" + (f"_{args.layers}blocks" if args.layers else "") + (f"_{args.only}" if args.only else "")
    stem += f"_memory{args.memory}" if args.memory else ""
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    with (RESULTS / f"{stem}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
