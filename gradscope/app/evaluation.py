"""Evaluate methods over a dataset: batched, streamed to disk batch by batch, resumable, stoppable.

``run_evaluation`` cuts the dataset's sorted keys into batches of ``settings.batch`` images; each batch is read
(the next one in a thread while the model works), explained and scored, and its record is written atomically to
``OUT/batches/NNNNNN.json``. A second run with the same ``OUT`` and settings skips the batches on disk, so an
interrupted run resumes where it stopped; the report (``gradscope.app.evaluation_report``) is built from the
records alone. Memory holds one batch at a time, whatever the dataset's size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.errors import Cancelled, GradscopeError
from gradscope.core.files import write_text_atomic
from gradscope.engine import faithfulness as fm
from gradscope.engine.evaluation import class_scores, method_maps, top_classes
from gradscope.io.datasets import IGNORE, DataProblem, Sample
from gradscope.render.normalize import resize_map
from gradscope.rules.methods import Method, available_methods, build_method
from gradscope.rules.plan import Plan

METRICS = ("pointing", "deletion", "insertion", "mufidelity")
BASELINES = ("center", "random")  # reference "methods": the image centre, a uniformly random map
SMOOTHED = ("gradient", "guided_backprop", "deconvnet")  # TorchRay's benchmark blurs these maps (smooth=0.02)
Progress = Callable[[int, int, float], None]  # (images done, images in all, seconds left estimated)


class EvaluationError(GradscopeError):
    """The evaluation cannot run as asked (an unknown method or metric, an output folder of another run)."""


@dataclass
class EvalSettings:
    """Everything that decides the scores: written to ``OUT/settings.json`` and checked on resume."""

    methods: list[str]  # "gradient", "cmwp@conv4" (a preset read at a node), "center", "random", a plan's name
    metrics: list[str] = field(default_factory=lambda: ["pointing"])
    batch: int = 16
    tolerance: float = 15.0  # Pointing Game hit distance, pixels of the image (mask) size
    steps: int = 20  # deletion / insertion: pixels changed in this many equal parts
    fidelity_samples: int = 200  # MuFidelity (Xplique's defaults)
    fidelity_grid: int = 9
    fidelity_subset: float = 0.2
    seed: int = 0  # random baseline maps and MuFidelity's subsets (per image: seed and the image's name)
    plan: dict | None = None  # the user's plan (``--plan``): evaluated as the method named by its name
    plan_name: str | None = None

    def check(self) -> None:
        unknown = [m for m in self.metrics if m not in METRICS]
        if unknown or not self.metrics:
            raise EvaluationError(
                f"Unknown metric(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(METRICS)}."
            )
        if not self.methods:
            raise EvaluationError("No method to evaluate: give --method and/or --plan.")
        if len(set(self.methods)) != len(self.methods):
            raise EvaluationError(f"A method is named twice: {', '.join(self.methods)}.")
        if self.batch < 1 or self.steps < 1 or self.fidelity_samples < 2 or self.fidelity_grid < 1:
            raise EvaluationError("batch and steps must be >= 1, fidelity samples >= 2 and the grid >= 1.")
        if not 0 < self.fidelity_subset < 1 or self.tolerance <= 0:
            raise EvaluationError("The fidelity subset must lie in (0, 1) and the tolerance be > 0.")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class EvalMethod:
    """A method as evaluated: its label, how its map is made, whether the Pointing Game blurs it."""

    label: str
    method: Method | None  # None for the baselines
    smoothed: bool = False

    @property
    def baseline(self) -> str | None:
        return self.label if self.method is None else None


def eval_methods(engine: Any, settings: EvalSettings) -> list[EvalMethod]:
    """The methods of ``settings`` built for the engine's model (unknown presets and nodes are errors here,
    before any image is read)."""
    known = available_methods()
    out = []
    for label in settings.methods:
        if label in BASELINES:
            out.append(EvalMethod(label, None))
            continue
        if settings.plan is not None and label == settings.plan_name:
            plan = Plan.from_dict(settings.plan)
            plan.resolve(engine.graph)
            out.append(EvalMethod(label, Method(name=label, plan=plan)))
            continue
        preset, _, node = label.partition("@")
        if preset not in known:
            raise EvaluationError(
                f"Unknown method {preset!r}; choose from {', '.join([*known, *BASELINES])} (or give --plan)."
            )
        if node:
            engine.graph.node(node)  # a GraphError naming the node when there is none
        options = {"readout": node} if node else {}
        try:
            method = build_method(preset, engine.graph, **options)
        except TypeError:
            raise EvaluationError(f"Method {preset!r} has a fixed read-out; drop '@{node}'.") from None
        out.append(EvalMethod(label, method, smoothed=preset in SMOOTHED))
    return out


# ------------------------------------------------------------------------------------------------- one batch
def image_rng(seed: int, key: str) -> np.random.Generator:
    """The random stream of one image: the same whatever batch, machine or worker it lands on."""
    return np.random.default_rng([seed, zlib.crc32(key.encode("utf-8"))])


def evaluate_batch(
    engine: Any, methods: list[EvalMethod], settings: EvalSettings, samples: list[Sample]
) -> tuple[list[dict], dict[str, float]]:
    """The per-image records of one batch of readable samples, and the seconds each method took."""
    seconds = {m.label: 0.0 for m in methods}
    if not samples:
        return [], seconds
    x = np.stack([s.x for s in samples]).astype(np.float32)
    size = x.shape[1:3]
    records: list[dict] = [{"key": s.key, "scores": {m.label: {} for m in methods}} for s in samples]
    metrics = settings.metrics
    if "pointing" in metrics:
        _pointing(engine, methods, settings, samples, x, records, seconds)
    causal = [m for m in ("deletion", "insertion", "mufidelity") if m in metrics]
    if not causal:
        return records, seconds
    top = top_classes(engine, x, settings.batch)
    probability = class_scores(engine, "probability")
    maps = {}
    for m in methods:
        t0 = time.perf_counter()
        maps[m.label] = _maps_at(engine, m, settings, samples, x, top, size)
        seconds[m.label] += time.perf_counter() - t0
    for rec, c in zip(records, top):
        rec["class"] = int(c)
    baselines = {"deletion": np.zeros_like(x)}
    if "insertion" in metrics:
        baselines["insertion"] = fm.insertion_baseline(x)
    for metric in ("deletion", "insertion"):
        if metric not in metrics:
            continue
        for m in methods:
            curves = fm.causal_curves(probability, x, maps[m.label], top, baselines[metric], metric, settings.steps)
            for rec, curve, auc in zip(records, curves, fm.area_under(curves)):
                rec["scores"][m.label][metric] = float(auc)
                rec["scores"][m.label][f"{metric}_curve"] = [float(v) for v in curve]
    if "mufidelity" in metrics:
        output = class_scores(engine, "output")
        for i, (rec, s) in enumerate(zip(records, samples)):
            rng = image_rng(settings.seed + 1, s.key)
            masks = fm.fidelity_masks(
                rng, settings.fidelity_samples, settings.fidelity_grid, settings.fidelity_subset, size
            )
            drops = fm.fidelity_drops(output, x[i], int(top[i]), masks, 0.0)
            for m in methods:
                rec["scores"][m.label]["mufidelity"] = fm.fidelity_score(maps[m.label][i], masks, drops)
    return records, seconds


def _pointing(engine, methods, settings, samples, x, records, seconds) -> None:
    pairs = [(i, c) for i, s in enumerate(samples) for c in s.classes()]
    for rec, s in zip(records, samples):
        n_classes = len(s.classes())
        labelled = s.mask != IGNORE
        rec["pairs"] = [[c, fm.is_difficult(s.mask == c, labelled, n_classes)] for c in s.classes()]
    if not pairs:
        return
    idx = np.array([i for i, _ in pairs])
    cls = np.array([c for _, c in pairs], np.int32)
    for m in methods:
        t0 = time.perf_counter()
        hits: list[float] = []
        if m.baseline == "random":  # the expected score of a uniformly random point
            hits = [float(fm.hit_region(samples[i].mask == c, settings.tolerance).mean()) for i, c in pairs]
        else:
            maps = None if m.method is None else method_maps(engine, m.method, x[idx], cls, settings.batch)
            points = np.zeros((len(pairs), 2), np.int64)
            for shape, ks in _by_shape([samples[i].mask.shape for i, _ in pairs]).items():
                if maps is None:  # the centre of the image
                    points[ks] = (shape[0] // 2, shape[1] // 2)
                else:  # maps of one image size: resized, blurred and maximised as one stack
                    points[ks] = fm.pointing_points(maps[ks], shape, m.smoothed)
            for k, (i, c) in enumerate(pairs):
                hits.append(float(fm.pointing_hit(tuple(points[k]), samples[i].mask == c, settings.tolerance)))
        seconds[m.label] += time.perf_counter() - t0
        at = 0
        for rec in records:
            n = len(rec["pairs"])
            rec["scores"][m.label]["pointing"] = hits[at : at + n]
            at += n


def _by_shape(shapes: list[tuple]) -> dict[tuple, list[int]]:
    groups: dict[tuple, list[int]] = {}
    for k, shape in enumerate(shapes):
        groups.setdefault(tuple(shape), []).append(k)
    return groups


def _maps_at(engine, m: EvalMethod, settings, samples, x, top, size) -> np.ndarray:
    """Each image's map for its top-1 class at the input's size (bilinear), the order deletion/insertion follow."""
    h, w = size
    if m.baseline == "random":
        return np.stack([image_rng(settings.seed, s.key).uniform(size=(h, w)) for s in samples]).astype(np.float32)
    if m.baseline == "center":  # a Gaussian bump on the centre: pixels taken from the middle outwards
        yy, xx = np.mgrid[0:h, 0:w]
        bump = -((yy - (h - 1) / 2) ** 2 + (xx - (w - 1) / 2) ** 2)
        return np.repeat(bump[None].astype(np.float32), len(samples), axis=0)
    maps = method_maps(engine, m.method, x, top, settings.batch)
    return np.stack([resize_map(np.nan_to_num(mp, nan=-np.inf), (w, h), "bilinear") for mp in maps])


# ------------------------------------------------------------------------------------------------- the run
@dataclass
class RunState:
    """What a run did: batches computed now, batches found on disk, whether it was stopped."""

    out: Path
    batches: int
    computed: int = 0
    resumed: int = 0
    stopped: bool = False
    seconds: float = 0.0


def batch_path(out: Path, index: int) -> Path:
    return out / "batches" / f"{index:06d}.json"


def fingerprint(keys: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(keys).encode("utf-8")).hexdigest()[:16]


def prepare_out(out: Path, settings: EvalSettings, header: dict, restart: bool = False) -> None:
    """Create ``out`` with its ``settings.json``, or check that the one there is this run's (to resume it)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "batches").mkdir(exist_ok=True)
    doc = {"settings": settings.to_dict(), **header}
    path = out / "settings.json"
    if path.exists() and not restart:
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            old = None
        if old != json.loads(json.dumps(doc)):
            raise EvaluationError(
                f"{out} holds an evaluation with other settings, model or data; give another --out, or --restart "
                "to replace it."
            )
        return
    for old_batch in (out / "batches").glob("*.json"):
        old_batch.unlink()
    write_text_atomic(path, json.dumps(doc, indent=2))


def run_batches(
    engine: Any,
    source: Any,
    settings: EvalSettings,
    out: Path,
    keys: list[str],
    *,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> RunState:
    """Compute the batches of ``keys`` that are not on disk yet; Ctrl-C (KeyboardInterrupt) or ``should_stop``
    end the run after the batch in flight is written or dropped, never half-written."""
    methods = eval_methods(engine, settings)
    engine.trace_cache_size = max(engine.trace_cache_size, len(methods) + 1)  # one trace per method, kept
    chunks = [keys[i : i + settings.batch] for i in range(0, len(keys), settings.batch)]
    state = RunState(out, len(chunks))
    todo = [i for i in range(len(chunks)) if not batch_path(out, i).exists()]
    state.resumed = len(chunks) - len(todo)
    done_images = sum(len(chunks[i]) for i in range(len(chunks)) if i not in set(todo))
    total = len(keys)
    start = time.perf_counter()
    images_now = 0
    if progress is not None:
        progress(done_images, total, float("nan"))
    with ThreadPoolExecutor(1, thread_name_prefix="gradscope-read") as reader:
        pending = reader.submit(load_samples, source, chunks[todo[0]]) if todo else None
        try:
            for n, index in enumerate(todo):
                if should_stop is not None and should_stop():
                    raise Cancelled("stopped")
                samples, bad = pending.result()
                pending = reader.submit(load_samples, source, chunks[todo[n + 1]]) if n + 1 < len(todo) else None
                records, seconds = evaluate_batch(engine, methods, settings, samples)
                doc = {"batch": index, "keys": chunks[index], "images": records, "bad": bad, "seconds": seconds}
                write_text_atomic(batch_path(out, index), json.dumps(doc))
                state.computed += 1
                done_images += len(chunks[index])
                images_now += len(chunks[index])
                if progress is not None:
                    rate = (time.perf_counter() - start) / images_now
                    progress(done_images, total, rate * (total - done_images))
        except (KeyboardInterrupt, Cancelled):
            state.stopped = True
            if pending is not None:
                pending.cancel()
    state.seconds = time.perf_counter() - start
    return state


def load_samples(source: Any, keys: list[str]) -> tuple[list[Sample], list[dict]]:
    """The readable samples of ``keys`` and, for the others, ``{"key", "reason"}``."""
    samples, bad = [], []
    for key in keys:
        try:
            samples.append(source.load(key))
        except DataProblem as exc:
            bad.append({"key": key, "reason": str(exc)})
    return samples, bad


def run_evaluation(
    engine: Any,
    source: Any,
    settings: EvalSettings,
    out: Path,
    *,
    model: str = "",
    restart: bool = False,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    ray: Any = None,
) -> tuple[RunState, Any]:
    """Evaluate ``settings.methods`` on every image of ``source`` into ``out`` and write the report there.
    ``ray``: None (this process), or a ``RayOptions`` (``gradscope.app.evaluation_ray``: the same batches on a
    Ray cluster). Returns the run's state and its ``EvalReport`` (of every batch on disk, also when stopped)."""
    from gradscope import __version__
    from gradscope.app.evaluation_report import build_report

    settings.check()
    eval_methods(engine, settings)  # an unknown method or node fails before the folder is touched
    keys = source.keys()
    if not keys:
        raise EvaluationError("The dataset holds no images.")
    header = {
        "model": model or getattr(engine.model, "name", "model"),
        "data": source.describe(),
        "total": len(keys),
        "keys_sha256": fingerprint(keys),
        "gradscope": __version__,
    }
    out = Path(out)
    prepare_out(out, settings, header, restart)
    if ray is None:
        state = run_batches(engine, source, settings, out, keys, progress=progress, should_stop=should_stop)
    else:
        from gradscope.app.evaluation_ray import run_batches_ray

        state = run_batches_ray(ray, source, settings, out, keys, progress=progress, should_stop=should_stop)
    report = build_report(out)
    report.write(out)
    return state, report
