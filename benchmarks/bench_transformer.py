"""Transformers against a compiled plain tf.GradientTape gradient, measured side by side in one run (issue 23).

    .venv/bin/python benchmarks/bench_transformer.py                    # BERT-base-shaped encoder + ViT-B/16
    .venv/bin/python benchmarks/bench_transformer.py --processes 5      # the same in 5 fresh processes: median, range
    .venv/bin/python benchmarks/bench_transformer.py --layers 2         # the same shapes, 2 blocks (a smoke run)
    .venv/bin/python benchmarks/bench_transformer.py --memory 200       # + RSS over 200 one-node edits
    .venv/bin/python benchmarks/bench_transformer.py --save DIR         # also save the models (for bench_gui.py)
    .venv/bin/python benchmarks/bench_transformer.py --only hub_bert    # keras_hub's BertBackbone (BERT-base)
    .venv/bin/python benchmarks/bench_transformer.py --floor --only vit # TensorFlow's own first eager gradient

Models are built from Keras layers with random weights: the encoder is 12 blocks of width 768 with 12 heads at
sequence length 128 (token ids in, a 2-class head on the mean token), ViT-B/16 is a 16x16 patch convolution at
224x224, 12 blocks of width 768. Every row times what the Session runs for a click (every node's signal and
statistics to the host). Ratios are to the compiled plain gradient of the logit with respect to the first float
tensor (the embedding output for token ids, the image for ViT; for keras_hub's BERT, whose three inputs a split
model cannot take, the gradient of the token embedding table: the same pass down to the lookup). Targets
(reported, not asserted): first map <= 5x, a never-seen preset (attnlrp, gradient x input) <= 4x, a one-node
edit <= 2x, memory flat over edits. The floor rows (``--floor``; with ``--processes``, a fresh process per model)
run no gradscope code: the plain gradient run eagerly, in a process that has run only its compiled baseline.
Writes benchmarks/results/transformer.{json,csv} (other settings: transformer_<settings>.{json,csv}).
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
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from gradscope.app.work.heap import release_replaced, settle_after_load  # noqa: E402
from gradscope.app.work.running import PREPARED_PRESETS, prepare_presets  # noqa: E402
from gradscope.backend import keras, tf  # noqa: E402
from gradscope.core.targets import Target  # noqa: E402
from gradscope.engine.backward.runner import Engine  # noqa: E402
from gradscope.rules.methods import build_method  # noqa: E402
from gradscope.rules.plan import Plan  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import _NeverCancelled, median_time, over_processes  # noqa: E402
from bench_engine import _rss_mb as rss_mb  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def block(h, width: int, heads: int, k: int):
    a = keras.layers.MultiHeadAttention(heads, width // heads, name=f"block{k}_mha")(h, h)
    h = keras.layers.LayerNormalization(name=f"block{k}_ln1")(keras.layers.Add(name=f"block{k}_add1")([h, a]))
    f = keras.layers.Dense(4 * width, activation="gelu", name=f"block{k}_ff1")(h)
    f = keras.layers.Dense(width, name=f"block{k}_ff2")(f)
    return keras.layers.LayerNormalization(name=f"block{k}_ln2")(keras.layers.Add(name=f"block{k}_add2")([h, f]))


def encoder(layers: int, width: int = 768, heads: int = 12, seq: int = 128, vocab: int = 30522) -> keras.Model:
    """BERT-base-shaped: token embedding + LayerNorm, ``layers`` post-LN blocks, mean token, 2 classes."""
    i = keras.Input((seq,), dtype="int32", name="tokens")
    h = keras.layers.LayerNormalization(name="embed_ln")(keras.layers.Embedding(vocab, width, name="embed")(i))
    for k in range(layers):
        h = block(h, width, heads, k)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    return keras.Model(i, keras.layers.Dense(2, name="classifier")(h), name=f"encoder_{layers}x{width}")


def vit(layers: int, width: int = 768, heads: int = 12, size: int = 224, patch: int = 16) -> keras.Model:
    """ViT-B/16-shaped: patch convolution, ``layers`` blocks, mean patch token, 1000 classes."""
    i = keras.Input((size, size, 3), name="image")
    h = keras.layers.Conv2D(width, patch, strides=patch, name="patches")(i)
    h = keras.layers.Reshape(((size // patch) ** 2, width), name="tokens")(h)
    for k in range(layers):
        h = block(h, width, heads, k)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(keras.layers.LayerNormalization(name="final_ln")(h))
    return keras.Model(i, keras.layers.Dense(1000, name="classifier")(h), name=f"vit_{layers}x{width}")


def hub_bert(layers: int) -> keras.Model:
    """keras_hub's BertBackbone (BERT-base with 12 layers: width 768, 12 heads, 3072 hidden) with a head on its
    pooled output: its TransformerEncoder blocks open as their layers, its padding mask reaches the attention."""
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=30522,
        num_layers=layers,
        num_heads=12,
        hidden_dim=768,
        intermediate_dim=3072,
        max_sequence_length=512,
    )
    head = keras.layers.Dense(2, name="classifier")(backbone.output["pooled_output"])
    return keras.Model(backbone.input, head, name=f"keras_hub_bert_{layers}x768")


def plain_gradient(model: keras.Model, start: str | None):
    """Compiled tape gradient of logit 1 w.r.t. the model input, or w.r.t. the output of ``start`` (token ids);
    for a model of several inputs, w.r.t. the embedding table of ``start`` (the same pass down to the lookup)."""
    if start is not None and len(model.inputs) > 1:
        table = model.get_layer(start).embeddings.value  # the tf.Variable behind the Keras variable

        @tf.function
        def grad_table(xs):
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(table)
                y = model(xs)[:, 1]
            return tf.convert_to_tensor(tape.gradient(y, table))

        return grad_table
    if start is None:

        @tf.function
        def grad(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = model(x)[:, 1]
            return tape.gradient(y, x)

        return grad
    head = keras.Model(model.get_layer(start).output, model.output)  # everything after the embedding
    embed = keras.Model(model.input, model.get_layer(start).output)

    @tf.function
    def grad_tokens(ids):
        e = embed(ids)
        with tf.GradientTape() as tape:
            tape.watch(e)
            y = head(e)[:, 1]
        return tape.gradient(y, e)

    return grad_tokens


def as_feed(x: Any) -> Any:
    """The baseline gradient's argument: a tensor, or a dict of them for a model of several inputs."""
    return {k: tf.convert_to_tensor(v) for k, v in x.items()} if isinstance(x, dict) else tf.convert_to_tensor(x)


def floor(name: str, model: keras.Model, x: Any, start: str | None, repeats: int) -> list[dict]:
    """What TensorFlow itself takes for the first map's work, with no gradscope code: the baseline's gradient run
    eagerly (its Python function: the same forward and backward) the first and second time, in a process that
    has run only the compiled baseline (as ``bench`` has when it opens the model)."""
    grad = plain_gradient(model, start)
    feed = as_feed(x)
    base = median_time(lambda: grad(feed).numpy(), repeats)
    rows = []
    for case in ("the process's first", "second"):
        t0 = time.perf_counter()
        np.asarray(grad.python_function(feed))
        t = time.perf_counter() - t0
        rows.append({"model": name, "case": f"floor: plain eager GradientTape gradient, {case}", "seconds": t})
        rows[-1] |= {"ratio": t / base, "note": "no gradscope code"}
        print(f"{name:<16} {rows[-1]['case']:<60} {t:8.2f} s  {t / base:6.2f}x", flush=True)
    return rows


def bench(name: str, model: keras.Model, x: Any, start: str | None, repeats: int, edits: int) -> list[dict]:
    release_replaced()  # the previous model's engine (frozen by settle_after_load) goes, untimed, as in the app
    grad = plain_gradient(model, start)
    feed = as_feed(x)
    base = median_time(lambda: grad(feed).numpy(), repeats)
    if isinstance(x, dict):  # the engine takes the inputs in its graph's order
        x = [x[i] for i in Engine(model).graph.input_ids]
    rows: list[dict] = []

    def record(case: str, seconds: float, extra: str = "") -> None:
        rows.append({"model": name, "case": case, "seconds": seconds, "ratio": seconds / base, "note": extra})
        print(f"{name:<16} {case:<48} {seconds:8.2f} s  {seconds / base:6.2f}x  {extra}", flush=True)

    record("plain GradientTape gradient (compiled)", base)
    t0 = time.perf_counter()
    engine = Engine(model)
    settle_after_load()  # as the app's load job ends (gradscope.app.work.heap)
    r = engine.backward(x, Target(index=1), Plan(), capture="all")
    record("first map after opening (engine + forward + sweep)", time.perf_counter() - t0, r.meta["mode"])
    t0 = time.perf_counter()
    engine.compile(x, Target(index=1), Plan())  # the Session's background step after a live answer
    record("background step: compile kernels + identity plan", time.perf_counter() - t0, "not waited for")
    t0, rss = time.perf_counter(), rss_mb()
    prepared = prepare_presets(engine, Target(index=1), PREPARED_PRESETS, _NeverCancelled())
    note = f"{prepared} presets, RSS {rss:.0f} -> {rss_mb():.0f} MB"
    record("background step, then: the presets' block kernels", time.perf_counter() - t0, note)
    for preset in ("gradient_x_input", "attnlrp", "cp_lrp"):
        plan = build_method(preset, engine.graph).plan
        t0 = time.perf_counter()
        r = engine.backward(x, Target(index=1), plan, capture="all")
        kernels = f"{r.meta.get('compiled_nodes', '-')} nodes in block kernels"
        record(f"never-picked preset: {preset}", time.perf_counter() - t0, f"{r.meta['mode']}, {kernels}")
    engine.backward(x, Target(index=1), Plan(), capture="all", mode="live")  # the live path's memo: the opened plan
    denses = [n.id for n in engine.graph.nodes if n.op_type == "Dense"]
    picks = {"early": denses[len(denses) // 8], "middle": denses[len(denses) // 2], "late": denses[-2]}
    for where, node in picks.items():
        for factor in (2.0, 3.0):  # a never-seen rule kernel, then the same node again with a new factor
            plan = Plan().with_entry(node, "scale", {"factor": factor})
            t0 = time.perf_counter()
            r = engine.backward(x, Target(index=1), plan, capture="all")
            nodes = f"{r.meta.get('recomputed_nodes', '?')} nodes ({r.meta.get('compiled_nodes', '?')} in kernels)"
            record(f"one-node edit, {where}: scale={factor} on {node}", time.perf_counter() - t0, nodes)
            engine.backward(x, Target(index=1), Plan(), capture="all", mode="live")  # back to the opened plan
    middle = picks["middle"]
    if edits:
        before = rss_mb()
        marks = []
        for k in range(edits):
            plan = Plan().with_entry(middle, "scale", {"factor": 1.0 + (k % 50) / 10})
            engine.backward(x, Target(index=1), plan, capture="all")
            if k in (edits // 4, edits - 1):
                marks.append(rss_mb())
        record(f"RSS over {edits} edits (MB: start, 1/4, end)", 0.0, f"{before:.0f}, {marks[0]:.0f}, {marks[-1]:.0f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", type=int, default=0, metavar="EDITS", help="RSS over this many edits")
    parser.add_argument("--only", choices=("encoder", "vit", "hub_bert"), help="one model (hub_bert: keras_hub's)")
    parser.add_argument("--save", metavar="DIR", help="also save the models as .keras (for bench_gui.py)")
    parser.add_argument("--processes", type=int, default=1, help="fresh processes (median, range); 5 for the figures")
    parser.add_argument("--floor", action="store_true", help="only TensorFlow's own eager gradient (no gradscope)")
    parser.add_argument("--rows-to", help=argparse.SUPPRESS)  # one of --processes' children
    args = parser.parse_args()
    if args.processes > 1 and not args.rows_to:
        child = [sys.executable, __file__, "--layers", str(args.layers), "--repeats", str(args.repeats)]
        floors = [[*child, "--floor", "--only", m] for m in ([args.only] if args.only else ["encoder", "vit"])]
        child += [] if args.floor else ["--memory", str(args.memory)] + (["--only", args.only] if args.only else [])
        runs = ([] if args.floor else [child]) + floors  # each floor in a process of its own
        write(over_processes(args.processes, lambda out: [[*cmd, "--rows-to", str(out)] for cmd in runs]), args)
        return
    keras.utils.set_random_seed(0)
    rows: list[dict] = []

    def run(name: str, model: keras.Model, x: Any, start: str | None) -> list[dict]:
        if args.floor:
            return floor(name, model, x, start, args.repeats)
        got = bench(name, model, x, start, args.repeats, args.memory)
        if args.save:
            model.save(Path(args.save) / f"{model.name}.keras")
        return got

    if args.only in (None, "encoder"):
        model = encoder(args.layers)
        rows += run(model.name, model, np.random.default_rng(0).integers(0, 30522, (1, 128)), "embed")
    if args.only == "hub_bert":
        model = hub_bert(args.layers)
        ids = np.random.default_rng(0).integers(1, 30522, (1, 128))
        feed = {"token_ids": ids, "padding_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)}
        rows += run(model.name, model, feed, "token_embedding")
    if args.only in (None, "vit"):
        model = vit(args.layers)
        rows += run(model.name, model, np.random.default_rng(0).uniform(0, 1, (1, 224, 224, 3)).astype("float32"), None)
    if args.rows_to:
        Path(args.rows_to).write_text(json.dumps(rows))
        return
    write(rows, args)


def write(rows: list[dict], args: argparse.Namespace) -> None:
    RESULTS.mkdir(exist_ok=True)
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(), "layers": args.layers, "tf": tf.__version__}
    meta |= {"processes": args.processes}
    # the default run (12 blocks, both models) is the headline; other runs get their own files
    stem = (
        "transformer" + (f"_{args.layers}blocks" if args.layers != 12 else "") + (f"_{args.only}" if args.only else "")
    )
    stem += f"_memory{args.memory}" if args.memory else ""
    stem += "_floor" if args.floor else ""
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    with (RESULTS / f"{stem}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
