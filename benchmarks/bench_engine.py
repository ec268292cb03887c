"""Engine cost against a plain tf.GradientTape gradient, measured side by side in one run.

    .venv/bin/python benchmarks/bench_engine.py                 # ResNet50 + MobileNetV2, batch 1 and 8, 224x224
    .venv/bin/python benchmarks/bench_engine.py --quick         # MobileNetV2 only, 96x96, batch 1 and 2 (a smoke run)
    .venv/bin/python benchmarks/bench_engine.py --latency       # click -> result for never-seen plans, ResNet50 b1,
                                                                # 5 fresh processes (--processes N): median, range;
                                                                # with TensorFlow's own first gradient (the floor)
    .venv/bin/python benchmarks/bench_engine.py --memory 500    # RSS over 500 plan edits (live + background compile)

Prints a table of median seconds (after warm-up) and the ratio to the plain gradient of the same model and
batch, and writes benchmarks/results/engine.{json,csv}. Targets (reported, not asserted): identity and guided
<= 1.15x at batch 8, MWP/c-MWP <= 1.6x, per-node statistics <= 1.15x, a rule change back to a traced plan -> new
overlay <= 1 s for ResNet50 batch 1, open + graph of ResNet50 <= 3 s.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from gradscope.app.work.heap import release_replaced, settle_after_load  # noqa: E402
from gradscope.app.work.running import PREPARED_PRESETS, prepare_presets  # noqa: E402
from gradscope.backend import keras, tf  # noqa: E402
from gradscope.core.targets import Target  # noqa: E402
from gradscope.engine.backward.runner import Engine  # noqa: E402
from gradscope.rules.methods import available_methods, build_method  # noqa: E402
from gradscope.rules.plan import Plan  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
C = "compiled"  # steady-state rows: the whole plan traced once (the live path has its own rows)


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def plain_gradient_fn(model: keras.Model, class_index: int) -> Callable[[tf.Tensor], tf.Tensor]:
    """The baseline: a plain GradientTape input gradient of the pre-softmax logit, in tf.function."""
    logits = keras.Model(model.inputs, model.layers[-1].input)
    w, b = model.layers[-1].kernel, model.layers[-1].bias

    @tf.function(reduce_retracing=True)
    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            score = tf.reduce_sum((tf.matmul(logits(x, training=False), w) + b)[:, class_index])
        return tape.gradient(score, x)

    return grad


def bench_model(name: str, ctor, size: int, batches: list[int], repeats: int) -> list[dict]:
    keras.utils.set_random_seed(0)
    model = ctor(weights=None, input_shape=(size, size, 3))
    rows = []
    # Open + graph extraction from a real .keras file.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.keras"
        model.save(path)
        t0 = time.perf_counter()
        from gradscope.io.models import load_model

        loaded = load_model(path)
        t1 = time.perf_counter()
        engine = Engine(loaded)
        t2 = time.perf_counter()
    rows.append({"model": name, "batch": "-", "case": "open .keras", "seconds": t1 - t0, "ratio": None})
    rows.append({"model": name, "batch": "-", "case": "graph extraction", "seconds": t2 - t1, "ratio": None})
    model = loaded
    methods = [m for m in ("guided_backprop", "mwp", "cmwp", "lrp_epsilon") if m in available_methods()]
    for batch in batches:
        rows += bench_batch(name, model, engine, batch, size, methods, repeats)
    # Rule change -> new overlay, in the engine path the GUI uses (plan seen before: no retrace).
    from gradscope.api import explain

    image = (np.random.default_rng(1).uniform(0, 255, (size, size, 3))).astype("uint8")
    plans = ["gradient"] + methods[:1]
    for m in plans:
        explain(engine, image, method=m)  # trace each once
    t0 = time.perf_counter()
    for m in plans * 2:
        explain(engine, image, method=m).render()
    latency = (time.perf_counter() - t0) / (2 * len(plans))
    rows.append(
        {"model": name, "batch": 1, "case": "rule change -> overlay (traced plan)", "seconds": latency, "ratio": None}
    )
    print(f"{name:<12} b1   rule change -> new overlay (traced plan)  {latency * 1000:9.1f} ms", flush=True)
    return rows


def tf_keras_vis_saliency(model) -> Callable | None:
    """tf-keras-vis's vanilla saliency on the same model (``pip install tf-keras-vis``), if installed."""
    try:
        from tf_keras_vis.saliency import Saliency
        from tf_keras_vis.utils.model_modifiers import ReplaceToLinear
        from tf_keras_vis.utils.scores import CategoricalScore
    except ImportError:
        print("(tf-keras-vis not installed: peer comparison skipped)", flush=True)
        return None
    saliency = Saliency(model, model_modifier=ReplaceToLinear(), clone=True)

    def run(x):
        return saliency(CategoricalScore([3] * int(x.shape[0])), x.numpy(), normalize_map=False)

    return run


def bench_batch(name: str, model, engine: Engine, batch: int, size: int, methods: list[str], repeats: int) -> list:
    x = tf.convert_to_tensor(np.random.default_rng(0).uniform(0, 1, (batch, size, size, 3)).astype("float32"))
    grad = plain_gradient_fn(model, 3)
    base = median_time(lambda: grad(x).numpy(), repeats)
    forward = tf.function(lambda t: model(t, training=False), reduce_retracing=True)
    cases: dict[str, Callable[[], object]] = {
        "model(x) (tf.function)": lambda: forward(x).numpy(),
        "plain GradientTape gradient": lambda: grad(x).numpy(),
        "identity plan (input gradient only)": lambda: engine.backward(x, Target(index=3), stats=False, mode=C),
        "identity + all-node statistics": lambda: engine.backward(x, Target(index=3), mode=C),
        "identity + all-node gradient capture": lambda: engine.backward(x, Target(index=3), capture="all", mode=C),
    }
    peer = tf_keras_vis_saliency(model)
    if peer is not None:
        cases["peer: tf-keras-vis vanilla Saliency"] = lambda: peer(x)
    for m in methods:
        plan = build_method(m, engine.graph).plan
        cases[m] = lambda plan=plan: engine.backward(x, Target(index=3), plan, stats=False, mode=C)
    rows = []
    for case, fn in cases.items():
        t = base if case == "plain GradientTape gradient" else median_time(fn, repeats)
        rows.append({"model": name, "batch": batch, "case": case, "seconds": t, "ratio": t / base})
        print(f"{name:<12} b{batch:<3} {case:<40} {t * 1000:9.1f} ms  {t / base:5.2f}x", flush=True)
    return rows


PRESETS = ("guided_backprop", "mwp", "lrp_epsilon")


class _NeverCancelled:
    """A worker's cancel token for work the bench runs to the end."""

    cancelled = False

    def check(self) -> None:
        pass


def bench_latency(name: str, ctor, size: int, repeats: int, rounds: int = 3) -> list[dict]:
    """Click -> result for plans the engine has never seen (issue 9), ResNet50-style, batch 1, as the Session
    runs them (every node's signal to the host and statistics), against the compiled plain gradient measured
    in the same run. Each edit is a never-seen plan. A cold edit is timed once per engine, so the "cold" rows
    are the median over ``rounds`` fresh engines (each a new activation, so no round repeats a plan); the first
    result is the first engine's (the process's first: every one-time cost included), timed from the engine's
    construction and ``settle_after_load`` (what the app's load job ends with: ``gradscope.app.work.heap``) to the
    result. Edits are timed right after the first map, and again (new activations: cold rule kernels) after the
    background step the Session runs once a map is shown (``Engine.compile``: block kernels of the true
    gradient, ``engine.backward.segments``, then the whole plan; then ``prepare_presets``: the block kernels of the
    menu's presets). Presets are timed right after opening (first round: nothing prepared) and after that step
    (each a plan the engine has never run, its block kernels prepared). "Warm" rows ran after the
    background step for that very plan (its rule kernels compiled)."""
    keras.utils.set_random_seed(0)
    model = ctor(weights=None, input_shape=(size, size, 3))
    x = np.random.default_rng(0).uniform(0, 1, (1, size, size, 3)).astype("float32")
    grad = plain_gradient_fn(model, 3)
    base = median_time(lambda: grad(tf.convert_to_tensor(x)).numpy(), repeats)
    rows = []

    def record(case: str, seconds: float, extra: str = "") -> None:
        rows.append({"model": name, "batch": 1, "case": case, "seconds": seconds, "ratio": seconds / base})
        print(f"{name:<12} b1   {case:<52} {seconds * 1000:9.1f} ms  {seconds / base:5.2f}x {extra}", flush=True)

    def timed(plan, **kw) -> tuple[float, object]:
        t0 = time.perf_counter()
        r = engine.backward(x, Target(), plan, capture="all", **kw)
        return time.perf_counter() - t0, r

    record("plain GradientTape gradient (compiled)", base)
    cold: dict[str, list[float]] = {}
    notes: dict[str, str] = {}

    def edits(activation: str, phase: str) -> None:
        for where, node in picks.items():
            t, r = timed(Plan().with_entry(node, "backward_as", {"activation": activation}))
            case = f"one-node edit, cold kernels, {phase}: backward_as on {where} ReLU"
            cold.setdefault(case, []).append(t)
            notes[case] = f"{r.meta['recomputed_nodes']} nodes ({r.meta['compiled_nodes']} in block kernels)"
            timed(Plan(), mode="live")  # back to the opened plan (the memo now holds it)

    activations = list(zip(("sigmoid", "tanh", "elu"), ("selu", "softplus", "swish")))[:rounds]
    for round_, (before, after) in enumerate(activations):
        if cold:
            release_replaced()  # the app frees a replaced model once the new one is shown (untimed)
        t0 = time.perf_counter()
        engine = Engine(model)
        settle_after_load()  # as the app's load job ends (gradscope.app.work.heap)
        t, r = timed(Plan())
        if not cold:
            record("first result after opening (engine + forward + sweep)", time.perf_counter() - t0, r.meta["mode"])
        relus = [n.id for n in engine.graph.nodes if n.activation == "relu"]
        picks = {"early": relus[len(relus) // 8], "middle": relus[len(relus) // 2], "late": relus[-2]}
        edits(before, "right after opening")
        if round_ == 0:  # presets before anything is prepared: once per process (a second round reuses its eager ops)
            for preset in PRESETS:
                t, r = timed(build_method(preset, engine.graph).plan)
                cold.setdefault(f"new preset, right after opening (nothing prepared): {preset}", []).append(t)
                timed(Plan(), mode="live")
        # what the Session runs in the background once the first map is shown (``background_job``): block
        # kernels + the whole plan, then the presets' block kernels
        t0 = time.perf_counter()
        engine.compile(x, Target(), Plan())
        cold.setdefault("background step after the first map (block kernels + identity plan)", []).append(
            time.perf_counter() - t0
        )
        t0, rss = time.perf_counter(), _rss_mb()
        prepare_presets(engine, Target(), PREPARED_PRESETS, _NeverCancelled())
        case = "background step, then: the presets' block kernels"
        cold.setdefault(case, []).append(time.perf_counter() - t0)
        notes[case] = f"RSS {rss:.0f} -> {_rss_mb():.0f} MB"
        timed(Plan(), mode="live")
        edits(after, "after the background step")
        for preset in PRESETS:  # live, as for a plan never seen (the first round ran it before: auto would trace)
            t, r = timed(build_method(preset, engine.graph).plan, mode="live")
            case = f"new preset, after the background step prepared it: {preset}"
            cold.setdefault(case, []).append(t)
            notes[case] = f"{r.meta['recomputed_nodes']} nodes ({r.meta['compiled_nodes']} in block kernels)"
            timed(Plan(), mode="live")
    for case, times in cold.items():
        record(case, statistics.median(times), f"{notes.get(case, 'live')}, median of {len(times)} engines")
    for where, node in picks.items():
        plan = Plan().with_entry(node, "backward_as", {"activation": "sigmoid"})
        engine.compile(x, Target(), plan)  # the background step after this plan was shown once
        timed(Plan(), mode="live")
        t, r = timed(plan, mode="live")  # a plan seen before: force the live answer
        record(f"one-node edit, warm kernels: backward_as on {where} ReLU", t, f"{r.meta['recomputed_nodes']} nodes")
    timed(Plan(), mode="live")
    node = picks["middle"]
    for factor in (2.0, 3.0):
        t, r = timed(Plan().with_entry(node, "scale", {"factor": factor}))
        record(f"parameter change (scale={factor}) on the middle ReLU", t, r.meta["mode"])
    # steady state of a seen plan: median of repeats (single calls are too noisy on a shared machine)
    t, r = timed(Plan(), mode="auto")
    t = median_time(lambda: timed(Plan(), mode="auto"), repeats)
    record("plan seen before (identity, compiled)", t, r.meta["mode"])
    guided = build_method("guided_backprop", engine.graph).plan
    engine.compile(x, Target(), guided)
    t, r = timed(guided)
    t = median_time(lambda: timed(guided), repeats)
    record("plan seen before (guided, compiled)", t, r.meta["mode"])
    return rows


def bench_floor(name: str, ctor, size: int, repeats: int) -> list[dict]:
    """What TensorFlow itself takes for a process's first gradient, with no gradscope code: the floor under "first
    result after opening". Run in a fresh process of its own (the eager rows must be its first ops): the
    baseline's own gradient (``plain_gradient_fn``) run eagerly, first and second, then its trace and first
    call, as ratios to that compiled gradient's steady time (measured last, in the same process)."""
    keras.utils.set_random_seed(0)
    model = ctor(weights=None, input_shape=(size, size, 3))
    x = tf.convert_to_tensor(np.random.default_rng(0).uniform(0, 1, (1, size, size, 3)).astype("float32"))
    grad = plain_gradient_fn(model, 3)
    times = {}
    for case in ("plain eager GradientTape gradient, the process's first", "plain eager GradientTape gradient, second"):
        t0 = time.perf_counter()
        grad.python_function(x).numpy()  # the same gradient, run eagerly
        times[case] = time.perf_counter() - t0
    t0 = time.perf_counter()
    grad.get_concrete_function(x)
    times["compiled plain gradient: its trace"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    grad(x).numpy()
    times["compiled plain gradient: its first call after the trace"] = time.perf_counter() - t0
    base = median_time(lambda: grad(x).numpy(), repeats)
    rows = []
    for case, t in times.items():
        rows.append({"model": name, "batch": 1, "case": f"floor: {case}", "seconds": t, "ratio": t / base})
        print(f"{name:<12} b1   floor: {case:<60} {t * 1000:9.1f} ms  {t / base:5.2f}x", flush=True)
    return rows


def over_processes(processes: int, commands: Callable[[Path], list[list[str]]]) -> list[dict]:
    """Run ``commands(out)`` (each writes its rows to the JSON file ``out``) in fresh processes, ``processes``
    times: a first result is a process's first, so only a new process shows it. Each (model, case) row comes
    back as the median of its ratios (and seconds) with their range."""
    runs: list[list[dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        for i in range(processes):
            print(f"--- process {i + 1} of {processes}", flush=True)
            rows: list[dict] = []
            for cmd in commands(out):  # each command rewrites ``out`` with its own rows
                subprocess.run(cmd, check=True)
                rows += json.loads(out.read_text())
            runs.append(rows)
    rows = []
    print(f"\n{'case':<84} {'median':>7} {'range':>13}  ({processes} processes)")
    for first in runs[0]:
        same = [r for run in runs for r in run if (r["model"], r["case"]) == (first["model"], first["case"])]
        ratios = [r["ratio"] for r in same]
        row = {
            **first,
            "seconds": statistics.median(r["seconds"] for r in same),
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
        rows.append(row)
        label = f"{first['model']}: {first['case']}"
        print(f"{label:<84} {row['ratio']:6.2f}x {min(ratios):5.2f}-{max(ratios):5.2f}x")
    return rows


def latency_over_processes(processes: int, repeats: int) -> list[dict]:
    """``bench_latency`` and ``bench_floor`` (TensorFlow's own first gradient: a process of its own) in fresh
    processes."""
    base = [sys.executable, __file__, "--latency", "--repeats", str(repeats), "--rows-to"]
    return over_processes(processes, lambda out: [[*base, str(out)], [*base, str(out), "--floor"]])


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench_memory(edits: int) -> list[dict]:
    """Memory over many edits, as the GUI runs them: each edit is a never-seen plan (a new ``scale`` factor on
    one of the ReLUs, in rotation), answered live, then compiled in the background (``Engine.compile``), on
    the bundled demo model. Reports RSS and the sizes of the engine's caches (kernels, whole-plan traces)."""
    from gradscope.io.demo import demo_model_path
    from gradscope.io.models import load_model

    engine = Engine(load_model(demo_model_path()))
    shape = engine.graph.node(engine.graph.input_ids[0]).output_shape
    x = np.random.default_rng(0).uniform(0, 1, (1, *shape[1:])).astype("float32")
    relus = [n.id for n in engine.graph.nodes if n.activation == "relu"]
    rows = []
    start = None
    for i in range(1, edits + 1):
        plan = Plan().with_entry(relus[i % len(relus)], "scale", {"factor": 1.0 + i / 1000})
        engine.backward(x, Target(), plan, capture="all")
        engine.compile(x, Target(), plan)
        if i == 1:
            start = _rss_mb()
        if i in (1, 50) or i % 100 == 0 or i == edits:
            rss = _rss_mb()
            case = f"RSS after {i} edits (kernels {len(engine.live._kernels)}, traces {len(engine._cache)})"
            rows.append({"model": "demo", "batch": 1, "case": case, "seconds": None, "ratio": None, "rss_mb": rss})
            print(f"demo b1   {case:<60} {rss:8.0f} MB  (+{rss - start:.0f} MB since edit 1)", flush=True)
    return rows


def bench_layout(sizes: list[int]) -> list[dict]:
    """Graph layout of model-shaped DAGs: flat (every node a box) and as the GUI opens them (blocks collapsed)."""
    from gradscope.render.graph_layout import compute_layout, default_collapsed
    from tests.render.graphs import model_shaped_graph

    rows = []
    for n in sizes:
        graph = model_shaped_graph(n)
        for case, collapsed_of in (("collapsed (as opened)", default_collapsed), ("flat", lambda g: set())):
            if case == "flat" and n > 2000:
                continue  # minutes in grandalf; the GUI never lays out a big graph flat at once
            t0 = time.perf_counter()
            layout = compute_layout(graph, collapsed_of(graph))
            t = time.perf_counter() - t0
            rows.append(
                {
                    "model": f"model-shaped {n} nodes",
                    "batch": "-",
                    "case": f"graph layout, {case}",
                    "seconds": t,
                    "ratio": None,
                }
            )
            print(f"layout {n:>5} nodes, {case:<22} {len(layout.boxes):>5} boxes {t * 1000:9.1f} ms", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="MobileNetV2 only at 96x96, batch 1 and 2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--latency", action="store_true", help="only the click -> result rows (ResNet50 b1)")
    parser.add_argument("--processes", type=int, default=5, help="--latency: fresh processes (median, range)")
    parser.add_argument("--rows-to", help=argparse.SUPPRESS)
    parser.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)  # with --rows-to: bench_floor
    parser.add_argument("--memory", type=int, metavar="EDITS", help="only RSS over EDITS plan edits (demo model)")
    parser.add_argument("--layout", action="store_true", help="only the graph layout rows (200 to 5,000 nodes)")
    args = parser.parse_args()
    if args.layout:
        write_rows(bench_layout([200, 1000, 2000, 5000]), "layout", {})
        return
    if args.memory:
        write_rows(bench_memory(args.memory), "memory", {"edits": args.memory})
        return
    if args.latency:
        if args.rows_to:  # one of --processes' children
            bench = bench_floor if args.floor else bench_latency
            rows = bench("ResNet50", keras.applications.ResNet50, 224, args.repeats)
            Path(args.rows_to).write_text(json.dumps(rows))
            return
        rows = latency_over_processes(args.processes, args.repeats)
        write_rows(rows, "latency", {"repeats": args.repeats, "processes": args.processes})
        return
    if args.quick:
        specs = [("MobileNetV2", keras.applications.MobileNetV2, 96, [1, 2])]
        layouts = [200]
    else:
        specs = [
            ("ResNet50", keras.applications.ResNet50, 224, [1, 8]),
            ("MobileNetV2", keras.applications.MobileNetV2, 224, [1, 8]),
        ]
        layouts = [200, 1000, 5000]
    rows = []
    for name, ctor, size, batches in specs:
        rows += bench_model(name, ctor, size, batches, args.repeats)
    rows += bench_layout(layouts)
    write_rows(rows, "engine", {"repeats": args.repeats, "quick": args.quick})


def write_rows(rows: list[dict], stem: str, extra: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    meta = {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "cpu_count": os.cpu_count(),
        **extra,
    }
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    with open(RESULTS / f"{stem}.csv", "w", newline="") as f:
        fields = ["model", "batch", "case", "seconds", "ratio", "ratio_min", "ratio_max", "rss_mb"]
        w = csv.DictWriter(f, fieldnames=fields, restval="")
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {RESULTS / stem}.json and {stem}.csv")


if __name__ == "__main__":
    main()
