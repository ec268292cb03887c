"""Text evaluation throughput (issue 63): a token map's MoRF and LeRF curves against plain batched forwards.

    .venv/bin/python benchmarks/bench_text_evaluation.py --folder /tmp/lm_folders/llama3_309m --tokens 128

The folder is a Hugging Face checkpoint (``benchmarks/make_lm_folders.py --only llama3_309m`` writes the 309 M
Llama shape). One text of ``--tokens`` random ids: its curves are 2n rows (k = 0 .. n of MoRF and LeRF, the two
shared ends once), run by ``engine.evaluation.token_curves.perturbed_targets`` in batches of at most 16,384 token
positions. The peer is what a user would write: the Keras model called on the same 2n rows in the same batch size,
compiled (``tf.function``), reading the same logit. Each side runs once untimed (its trace), then ``--rounds``
times interleaved; reported: rows per second (median) and the ratio (goal: curves >= 0.5x plain forwards). Then
the whole ``gradscope.evaluate`` of ``--samples`` texts (map and curves, ``gradient_x_input``): texts per second.
Writes benchmarks/results/text_evaluation.{json,csv}.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", required=True, help="a Hugging Face checkpoint folder (a causal LM)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--samples", type=int, default=2, help="texts of the whole evaluate run")
    args = parser.parse_args()

    import gradscope as gs
    from gradscope.backend import tf
    from gradscope.core.targets import Target
    from gradscope.engine.backward.generation import token_arrays
    from gradscope.engine.evaluation import token_metrics as tm
    from gradscope.engine.evaluation.token_curves import POSITIONS_PER_BATCH, perturbed_targets

    engine = gs.open_engine(args.folder)
    graph = engine.graph
    n = args.tokens
    rng = np.random.default_rng(0)
    vocab_size = graph.vocabulary_size(graph.token_input) or 1000
    ids = rng.integers(3, vocab_size, size=n)
    arrays = token_arrays(graph, ids, n)
    order = tm.token_order(rng.normal(size=n))
    morf, lerf = tm.removal_masks(order, np.arange(n), n)
    masks = np.concatenate([morf, lerf[1:n]])  # 2n rows
    logits = np.asarray(engine.logits(arrays))
    target = Target(kind="token", index=int(np.argmax(logits[0, n - 1])), position=n - 1)
    node = graph.embedding_of(graph.token_input).id
    rows = len(masks)
    per_batch = max(1, POSITIONS_PER_BATCH // n)

    model = engine.model
    names = list(graph.input_ids)

    @tf.function(reduce_retracing=True)
    def forward(feed):
        return model(feed, training=False)[:, n - 1, target.index]

    batches = -(-rows // per_batch)
    size = -(-rows // batches)  # the balanced batch size the curves use

    def plain() -> float:
        t0 = time.perf_counter()
        for _ in range(batches):
            feed = {k: tf.constant(np.repeat(a, size, axis=0)) for k, a in zip(names, arrays)}
            forward(feed).numpy()
        return time.perf_counter() - t0

    def curves() -> float:
        t0 = time.perf_counter()
        perturbed_targets(engine, arrays, node, masks, target, None)
        return time.perf_counter() - t0

    plain(), curves()  # traces
    times: dict[str, list[float]] = {"plain": [], "curves": []}
    for _ in range(args.rounds):
        times["plain"].append(plain())
        times["curves"].append(curves())
    plain_rate = rows / statistics.median(times["plain"])
    curve_rate = rows / statistics.median(times["curves"])

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "texts.jsonl"
        data.write_text(
            "".join(
                json.dumps({"ids": rng.integers(3, vocab_size, size=n).tolist()}) + "\n" for _ in range(args.samples)
            )
        )
        t0 = time.perf_counter()
        gs.evaluate(engine, data, methods=["gradient_x_input"], out=Path(tmp) / "out")
        whole = time.perf_counter() - t0

    result = {
        "model": Path(args.folder).name,
        "tokens": n,
        "rows": rows,
        "rows_per_batch": size,
        "plain_rows_per_s": round(plain_rate, 2),
        "curves_rows_per_s": round(curve_rate, 2),
        "ratio": round(curve_rate / plain_rate, 3),
        "evaluate_texts_per_s": round(args.samples / whole, 4),
        "evaluate_seconds": round(whole, 1),
        "samples": args.samples,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
    }
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "text_evaluation.json").write_text(json.dumps(result, indent=2) + "\n")
    with open(RESULTS / "text_evaluation.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, list(result))
        w.writeheader()
        w.writerow(result)


if __name__ == "__main__":
    main()
