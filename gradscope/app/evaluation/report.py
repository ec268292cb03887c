"""The report of an evaluation, built from its batch records alone (so a resumed run reports the same as one that
ran through): per method and metric the score with a bootstrap confidence interval over images, paired bootstrap
intervals for the differences between methods, mean deletion/insertion curves, the images that could not be
used and why. Written as ``results.csv``, ``results.json`` (with the settings: a run can be reproduced),
``differences.csv``, ``per_image.csv``, ``curves.png`` and ``bad_data.csv``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gradscope.core.display import RichDisplay
from gradscope.core.errors import GradscopeError
from gradscope.core.files import write_atomic, write_text_atomic
from gradscope.core.json_text import read_json_file
from gradscope.engine.evaluation.token_metrics import on_grid

TEXT_ORDER = ("abpc", "comprehensiveness", "sufficiency", "token_pointing")
CONFIDENCE = 0.95
BOOTSTRAP_CHUNK = 50  # resamples drawn at once (a (chunk, images) weight matrix)
HIGHER_IS_BETTER = {
    "pointing": True,
    "pointing_difficult": True,
    "deletion": False,
    "insertion": True,
    "mufidelity": True,
    "abpc": True,
    "comprehensiveness": True,
    "sufficiency": False,
    "token_pointing": True,
}
CURVE_POINTS = 21  # text curves (k = 0 .. n tokens) averaged on this grid of fractions


@dataclass
class EvalReport(RichDisplay):
    _html_maker = "gradscope.app.display.reports:evaluation_html"  # in a notebook (gradscope.core.display)

    def summary(self) -> str:
        return f"<EvalReport: {', '.join(self.methods)} x {', '.join(self.metrics)}, {self.images} images>"

    settings: dict
    header: dict
    methods: list[str]
    metrics: list[str]  # as reported: "pointing" brings "pointing_difficult"
    table: list[dict] = field(default_factory=list)  # method, metric, value, ci_low, ci_high, n
    differences: list[dict] = field(default_factory=list)  # metric, a, b, difference (a - b), ci_low, ci_high
    curves: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # metric -> method -> mean curve
    bad: list[dict] = field(default_factory=list)  # key, reason
    per_image: list[dict] = field(default_factory=list)
    classes: dict[str, dict[str, dict]] = field(default_factory=dict)  # pointing metric -> method -> per class
    seconds: dict[str, float] = field(default_factory=dict)  # method -> seconds its maps and scores took
    samples: list[dict] = field(default_factory=list)  # text: key, tokens, class, maps and curves by method
    images: int = 0  # images scored
    total: int = 0  # images in the dataset
    complete: bool = True

    @property
    def sample_curves(self) -> list[dict]:
        """Every text's MoRF and LeRF points, one row each (``curves.csv``): key, method, curve, k, value."""
        return [
            {"key": s["key"], "method": method, "curve": curve, "k": k, "value": value}
            for s in self.samples
            for curve, by_method in s["curves"].items()
            for method, values in by_method.items()
            for k, value in enumerate(values)
        ]

    @property
    def unit(self) -> str:
        """What was scored: "texts" or "images"."""
        return "texts" if any(m in TEXT_ORDER for m in self.metrics) else "images"

    @property
    def curve_axes(self) -> dict:
        """``curves_png``'s labels and range for this report's curves."""
        if self.unit == "texts":
            return {"x_label": "fraction of tokens removed", "y_label": "target logit", "y_range": None}
        return {"x_label": "fraction of pixels changed", "y_label": "class probability"}

    def value(self, method: str, metric: str) -> float | None:
        """The score of ``method`` on ``metric`` (None where there was no data, e.g. no difficult pair)."""
        for r in self.table:
            if r["method"] == method and r["metric"] == metric:
                return r["value"]
        raise KeyError(f"No {metric!r} score for {method!r}; the report has {self.methods} x {self.metrics}.")

    def to_dict(self) -> dict:
        """JSON-ready (NaN, where a score has no data, becomes null)."""
        return _no_nan(
            {
                "settings": self.settings,
                **self.header,
                "images": self.images,
                "total": self.total,
                "complete": self.complete,
                "confidence": CONFIDENCE,
                "results": self.table,
                "differences": self.differences,
                "pointing_classes": self.classes,
                "seconds": self.seconds,
                "curves": self.curves,
                "bad_data": self.bad,
                **({"texts": self.samples} if self.samples else {}),  # each text's tokens, maps and curves
            }
        )

    def to_text(self) -> str:
        unit = self.unit
        lines = [
            f"{self.images} of {self.total} {unit} scored"
            + ("" if self.complete else " (stopped: run again with the same --out to resume)")
            + (f"; {len(self.bad)} could not be used (bad_data.csv)" if self.bad else ""),
            "",
        ]
        width = max((len(m) for m in self.methods), default=6) + 2
        head = f"{'method':<{width}}" + "".join(f"{m:>26}" for m in self.metrics)
        lines.append(head)
        for method in self.methods:
            cells = []
            for metric in self.metrics:
                row = next((r for r in self.table if r["method"] == method and r["metric"] == metric), None)
                cells.append(f"{_cell(row):>26}")
            lines.append(f"{method:<{width}}" + "".join(cells))
        arrows = ", ".join(f"{m} {'higher' if HIGHER_IS_BETTER[m] else 'lower'} is better" for m in self.metrics)
        lines += ["", f"value [{CONFIDENCE:.0%} bootstrap interval over {unit}]; {arrows}"]
        clear = [d for d in self.differences if d["ci_low"] is not None and (d["ci_low"] > 0 or d["ci_high"] < 0)]
        if clear:
            lines.append(f"differences whose interval excludes 0 ({len(clear)} of {len(self.differences)}):")
            for d in clear[:12]:
                lines.append(
                    f"  {d['metric']}: {d['a']} - {d['b']} = {d['difference']:+.4f} "
                    f"[{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]"
                )
            if len(clear) > 12:
                lines.append(f"  ... {len(clear) - 12} more in differences.csv")
        return "\n".join(lines)

    def write(self, out: Path) -> list[Path]:
        """Every result file, each written atomically."""
        out = Path(out)
        written = [
            write_text_atomic(out / "results.json", json.dumps(self.to_dict(), indent=2)),
            _write_csv(out / "results.csv", self.table, ["method", "metric", "value", "ci_low", "ci_high", "n"]),
            _write_csv(
                out / "differences.csv", self.differences, ["metric", "a", "b", "difference", "ci_low", "ci_high"]
            ),
            _write_csv(out / "per_image.csv", self.per_image, ["key", "class", "method", *self.metrics]),
            _write_csv(out / "bad_data.csv", self.bad, ["key", "reason"]),
        ]
        if self.samples:
            written.append(_write_csv(out / "curves.csv", self.sample_curves, ["key", "method", "curve", "k", "value"]))
        if self.curves:
            from gradscope.render.curves import curves_png

            png = curves_png(self.curves, **self.curve_axes)
            written.append(write_atomic(out / "curves.png", lambda fh: fh.write(png)))
        return written


def _no_nan(v: object) -> object:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _no_nan(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_no_nan(x) for x in v]
    return v


def _cell(row: dict | None) -> str:
    if row is None or row["value"] is None:
        return "-"
    lo, hi = row["ci_low"], row["ci_high"]
    ci = f" [{lo:.3f}, {hi:.3f}]" if lo is not None else ""
    return f"{row['value']:.4f}{ci}"


def _write_csv(path: Path, rows: list[dict], columns: list[str]) -> Path:
    buf = io.StringIO()
    w = csv.DictWriter(buf, columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: _fmt(row.get(k)) for k in columns})
    return write_text_atomic(path, buf.getvalue())


def _fmt(v: object) -> object:
    if isinstance(v, float):
        return "" if not math.isfinite(v) else f"{v:.6g}"
    return "" if v is None else v


# ------------------------------------------------------------------------------------------------- statistics
class _Scores:
    """Per-image data of one metric and method, and its statistic under bootstrap weights (resamples, images)."""

    def __init__(self, metric: str, values: np.ndarray, totals: np.ndarray | None = None) -> None:
        self.metric = metric
        self.values = values  # (images,) or, for the Pointing Game, (images, classes) hit counts
        self.totals = totals  # (images, classes) pair counts
        self.classes: list[int] = []  # the class of each column (Pointing Game)

    def stat(self, w: np.ndarray) -> np.ndarray:
        if self.totals is None:
            return (w @ self.values) / w.sum(axis=1)
        hits, totals = w @ self.values, w @ self.totals
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a resample without any pair: NaN, not a warning
            acc = np.where(totals > 0, hits / totals, np.nan)  # mean over the classes the resample holds
            return np.nanmean(acc, axis=1) if acc.shape[1] else np.full(len(w), np.nan)


def _pointing_scores(records: list[dict], method: str, difficult: bool) -> _Scores:
    classes = sorted({c for r in records for c, _ in r.get("pairs", [])})
    col = {c: j for j, c in enumerate(classes)}
    hits = np.zeros((len(records), len(classes)))
    totals = np.zeros((len(records), len(classes)))
    for i, r in enumerate(records):
        for (c, hard), hit in zip(r.get("pairs", []), r["scores"][method].get("pointing", [])):
            if difficult and not hard:
                continue
            hits[i, col[c]] += hit
            totals[i, col[c]] += 1
    keep = totals.sum(axis=0) > 0
    out = _Scores("pointing_difficult" if difficult else "pointing", hits[:, keep], totals[:, keep])
    out.classes = [c for c, k in zip(classes, keep) if k]
    return out


def _where_given(metric: str, values: list) -> _Scores:
    """A score some samples lack (None or NaN): its mean over the samples that have it, as one column of counts."""
    v = np.array([np.nan if x is None else x for x in values], np.float64)
    given = np.isfinite(v)
    return _Scores(metric, np.where(given, v, 0.0)[:, None], given.astype(np.float64)[:, None])


def _bootstrap(scores: list[_Scores], n: int, resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(statistic of each score on the data, (resamples, scores) statistics on resamples of the images) — the
    same resamples for every score, so differences are paired."""
    point = np.array([s.stat(np.ones((1, n)))[0] for s in scores])
    rng = np.random.default_rng(seed)
    draws = []
    for lo in range(0, resamples, BOOTSTRAP_CHUNK):
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=min(BOOTSTRAP_CHUNK, resamples - lo)).astype(np.float64)
        draws.append(np.stack([s.stat(w) for s in scores], axis=1))
    return point, (np.concatenate(draws) if draws else np.zeros((0, len(scores))))


def _finite(v: float) -> float | None:
    """A score as reported: None where there is no data (no difficult pair, too few images for an interval)."""
    return float(v) if np.isfinite(v) else None


def _interval(samples: np.ndarray) -> tuple[float, float]:
    finite = samples[np.isfinite(samples)]
    if finite.size < 2:
        return float("nan"), float("nan")
    a = (1.0 - CONFIDENCE) / 2.0
    lo, hi = np.quantile(finite, [a, 1.0 - a])
    return float(lo), float(hi)


def build_report(out: Path, resamples: int = 2000) -> EvalReport:
    """The report of the run in ``out`` from its ``settings.json`` and batch records."""
    out = Path(out)
    doc = read_json_file(out / "settings.json", "evaluation settings", GradscopeError)
    settings, header = doc["settings"], {k: v for k, v in doc.items() if k != "settings"}
    records, bad, seconds = [], [], {}
    for path in sorted((out / "batches").glob("*.json")):
        batch = read_json_file(path, "batch record", GradscopeError)
        records += batch["images"]
        bad += batch["bad"]
        for method, secs in batch.get("seconds", {}).items():
            seconds[method] = seconds.get(method, 0.0) + secs
    methods, metrics_in = settings["methods"], settings["metrics"]
    metrics = [
        m
        for m in ("pointing", "pointing_difficult", "deletion", "insertion", "mufidelity", *TEXT_ORDER)
        if m in metrics_in or (m == "pointing_difficult" and "pointing" in metrics_in)
    ]
    total = int(header.get("total", len(records) + len(bad)))
    report = EvalReport(settings, header, methods, metrics, bad=bad, images=len(records), total=total, seconds=seconds)
    report.complete = len(records) + len(bad) >= total
    if not records:
        return report
    scores: list[_Scores] = []
    where: list[tuple[str, str]] = []
    for metric in metrics:
        for method in methods:
            if metric.startswith("pointing"):
                s = _pointing_scores(records, method, metric == "pointing_difficult")
            elif metric in TEXT_ORDER:  # a text without a rationale (or too short for AOPC) has no value
                s = _where_given(metric, [r["scores"][method].get(metric) for r in records])
            else:
                s = _Scores(metric, np.array([r["scores"][method][metric] for r in records], np.float64))
            scores.append(s)
            where.append((metric, method))
    point, draws = _bootstrap(scores, len(records), resamples, int(settings.get("seed", 0)))
    for k, (metric, method) in enumerate(where):
        lo, hi = _interval(draws[:, k])
        n = int(scores[k].totals.sum()) if scores[k].totals is not None else len(records)
        report.table.append(
            {
                "method": method,
                "metric": metric,
                "value": _finite(point[k]),
                "ci_low": _finite(lo),
                "ci_high": _finite(hi),
                "n": n,
            }
        )
    for k, (metric, method) in enumerate(where):
        s = scores[k]
        if metric.startswith("pointing") and s.totals is not None and s.totals.size:
            hits, totals = s.values.sum(axis=0), s.totals.sum(axis=0)
            report.classes.setdefault(metric, {})[method] = {
                "overall": float(hits.sum() / totals.sum()),
                "per_class": {str(c): float(h / t) for c, h, t in zip(s.classes, hits, totals)},
                "pairs": {str(c): int(t) for c, t in zip(s.classes, totals)},
            }
    for metric in metrics:
        ks = [k for k, (m, _) in enumerate(where) if m == metric]
        for i, a in enumerate(ks):
            for b in ks[i + 1 :]:
                diff = point[a] - point[b]
                if not np.isfinite(diff):
                    continue
                lo, hi = _interval(draws[:, a] - draws[:, b])
                report.differences.append(
                    {
                        "metric": metric,
                        "a": where[a][1],
                        "b": where[b][1],
                        "difference": float(diff),
                        "ci_low": _finite(lo),
                        "ci_high": _finite(hi),
                    }
                )
    if report.unit == "texts":
        for r in records:
            got = r["scores"]
            curves = {c: {m: got[m][c] for m in methods if c in got[m]} for c in ("morf", "lerf")}
            maps = {m: got[m].get("map", []) for m in methods}
            report.samples.append(
                {
                    "key": r["key"],
                    "tokens": r.get("tokens", []),
                    "class": r.get("class"),
                    "maps": maps,
                    "curves": curves,
                }
            )
    if "abpc" in metrics:  # MoRF and LeRF, each text's curve on one grid of fractions removed
        for curve in ("morf", "lerf"):
            report.curves[curve] = {
                m: np.mean([on_grid(r["scores"][m][curve], CURVE_POINTS) for r in records], axis=0).tolist()
                for m in methods
            }
    for metric in ("deletion", "insertion"):
        if metric in metrics:
            report.curves[metric] = {
                m: np.mean([r["scores"][m][f"{metric}_curve"] for r in records], axis=0).tolist() for m in methods
            }
    for r in records:
        for method in methods:
            row = {"key": r["key"], "class": r.get("class", ""), "method": method}
            got = r["scores"][method]
            for metric in metrics:
                if metric == "pointing":
                    hits = got.get("pointing", [])
                    row[metric] = float(np.mean(hits)) if hits else None
                elif metric != "pointing_difficult":
                    row[metric] = got.get(metric)
            report.per_image.append(row)
    return report
