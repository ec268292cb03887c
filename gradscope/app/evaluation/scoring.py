"""What an evaluation computes: its settings, its methods, and the scores of one batch of images.

A batch record per image: ``{"key", "class" (top-1, for deletion/insertion/MuFidelity), "pairs" ([class,
difficult] per class in its mask), "scores": {method: {"pointing": [hit per pair], "deletion": area,
"deletion_curve": [...], "insertion": ..., "mufidelity": rho}}}``. Random draws are per image (seed and name),
so a record is the same whatever batch, machine or worker computes it.
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradscope.core.errors import GradscopeError
from gradscope.engine.evaluation import faithfulness as fm
from gradscope.engine.evaluation.maps import class_scores, method_maps, top_classes
from gradscope.io.datasets import IGNORE, Sample
from gradscope.render.normalize import resize_map
from gradscope.rules.methods import Method, available_methods, build_method
from gradscope.rules.plan import Plan

METRICS = ("pointing", "deletion", "insertion", "mufidelity")
TEXT_METRICS = ("abpc", "comprehensiveness", "sufficiency", "token_pointing")  # of token maps (``text_scoring``)
TEXT_DEFAULT = ["abpc", "comprehensiveness", "sufficiency"]
BASELINES = ("center", "random")  # reference "methods": the image centre, a uniformly random map
SMOOTHED = ("gradient", "guided_backprop", "deconvnet")  # TorchRay's benchmark blurs these maps (smooth=0.02)


MAX_BATCH = 4096  # images per batch: more only costs memory (maps of every method are held per batch)


class EvaluationError(GradscopeError):
    """The evaluation cannot run as asked (an unknown method or metric, an output folder of another run)."""


class OtherEvaluationError(EvaluationError):
    """The output folder holds an evaluation with other settings, model or data (not this run's to resume)."""


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
    baseline: str = "zero"  # text: what replaces a removed token's input embedding (zero, pad, mask)

    @property
    def text(self) -> bool:
        """Metrics of token maps (a text dataset), not of images."""
        return any(m in TEXT_METRICS for m in self.metrics)

    def check(self) -> None:
        from gradscope.engine.evaluation.token_curves import REPLACEMENTS

        unknown = [m for m in self.metrics if m not in (*METRICS, *TEXT_METRICS)]
        if unknown or not self.metrics:
            raise EvaluationError(
                f"Unknown metric(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(METRICS)} (images) or "
                f"{', '.join(TEXT_METRICS)} (text)."
            )
        if self.text and not all(m in TEXT_METRICS for m in self.metrics):
            raise EvaluationError(
                f"{', '.join(self.metrics)}: image metrics ({', '.join(METRICS)}) and text metrics "
                f"({', '.join(TEXT_METRICS)}) are not evaluated together."
            )
        if self.text and self.baseline not in REPLACEMENTS:
            raise EvaluationError(f"The baseline is one of {', '.join(REPLACEMENTS)}; got {self.baseline!r}.")
        if self.text and "center" in self.methods:
            raise EvaluationError("'center' is an image baseline; for text compare with 'random'.")
        if not self.methods:
            raise EvaluationError("No method to evaluate: give --method and/or --plan.")
        if len(set(self.methods)) != len(self.methods):
            raise EvaluationError(f"A method is named twice: {', '.join(self.methods)}.")
        # Bounds before anything is allocated: the last batch is padded to a full one (a batch of 10^8 images
        # asked for terabytes), and the curves hold steps + 1 points per image.
        for name, value, low, high in (
            ("batch", self.batch, 1, MAX_BATCH),
            ("steps", self.steps, 1, 10_000),
            ("fidelity samples", self.fidelity_samples, 2, 100_000),
            ("fidelity grid", self.fidelity_grid, 1, 1_000),
        ):
            if not (isinstance(value, int) and low <= value <= high):
                raise EvaluationError(f"The {name} must be a whole number from {low} to {high}; got {value}.")
        if not 0 < self.fidelity_subset < 1:
            raise EvaluationError(f"The fidelity subset must lie in (0, 1); got {self.fidelity_subset}.")
        if not 0 < self.tolerance < 1e6:  # NaN fails too
            raise EvaluationError(f"The tolerance must be a distance in pixels above 0; got {self.tolerance}.")

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        if not self.text:  # an image run's settings file as before (a run started earlier still resumes)
            out.pop("baseline")
        return out


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
        if settings.text and method.sampling is not None:
            raise EvaluationError(f"{label} averages over noisy inputs; token ids cannot be made noisy. Drop it.")
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
        rec["pairs"] = [
            [c, c in s.difficult if s.difficult is not None else fm.is_difficult(s.mask == c, labelled, n_classes)]
            for c in s.classes()
        ]
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
    if m.baseline == "center":  # minus the squared distance to the centre: pixels taken from the middle outwards
        yy, xx = np.mgrid[0:h, 0:w]
        bump = -((yy - (h - 1) / 2) ** 2 + (xx - (w - 1) / 2) ** 2)
        return np.repeat(bump[None].astype(np.float32), len(samples), axis=0)
    maps = method_maps(engine, m.method, x, top, settings.batch)
    return np.stack([resize_map(np.nan_to_num(mp, nan=-np.inf), (w, h), "bilinear") for mp in maps])
