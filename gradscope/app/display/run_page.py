"""``gradscope report RUN --out report.html``: one self-contained HTML page (pictures embedded, no script, no
address outside the file) for an evaluation folder, a training log folder or a folder of exported explanations
(PNG + sidecar), with the settings and versions that made it. The sections are the notebook's displays."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from gradscope.app.display.html import esc, figure, page, table
from gradscope.app.display.provenance import versions
from gradscope.core.errors import InputError
from gradscope.core.files import write_text_atomic

MAX_EXPLANATIONS = 200  # pictures in one page (a folder of more says how many it left out)
LEFT_OUT = "left out"  # the settings key under which a section lists the files it did not show
MAX_PICTURE_BYTES = 64 << 20  # an exported map is at most 8192 px on its long side: a few MiB
SHOWN_SIDE = 480  # px: a page shows its pictures in columns of ~300-600 px


def run_kind(run: Path) -> str:
    """ "evaluation", "training" or "explanations", or an ``InputError`` saying what a report reads."""
    if not run.exists():
        raise InputError(f"{run} does not exist.")
    if run.is_dir() and (run / "settings.json").is_file() and (run / "batches").is_dir():
        return "evaluation"
    if run.is_dir() and any(run.glob("events.out.tfevents.*")):
        return "training"
    if _sidecars(run):
        return "explanations"
    raise InputError(
        f"{run} is none of what a report reads: an evaluation folder (settings.json and batches/ from "
        "`gradscope evaluate --out`), a GradientMonitor log folder (events.out.tfevents.* files) or exported "
        "explanations (PNG files with their JSON sidecars)."
    )


def _sidecars(run: Path) -> list[Path]:
    pngs = [run] if run.is_file() else sorted(run.glob("*.png"))
    return [p for p in pngs if p.suffix.lower() == ".png" and p.with_suffix(".json").is_file()]


def _picture(png: Path) -> np.ndarray:
    """The pixels of an exported PNG, for a page meant to be shared: only a regular file that lies inside the
    folder read (a link to ``/etc/hostname`` or to a photo elsewhere is not), at most ``MAX_PICTURE_BYTES``, that
    decodes as an image within ``io.images``' pixel limit. The page embeds these pixels re-encoded, never the
    file's bytes (nothing appended to a PNG travels with it). ``InputError`` saying why not."""
    from PIL import Image

    from gradscope.core.errors import GradscopeError
    from gradscope.io.images import open_image

    for f in (png, png.with_suffix(".json")):
        if not f.resolve().is_relative_to(png.parent.resolve()) or not stat.S_ISREG(f.stat().st_mode):
            raise InputError(f"{f.name} is not a regular file inside {png.parent.name or png.parent}")
    if png.stat().st_size > MAX_PICTURE_BYTES:
        raise InputError(f"{png.name} is {png.stat().st_size >> 20} MiB, larger than any exported map")
    try:
        with open_image(png) as image:
            if image.format != "PNG":
                raise InputError(f"{png.name} is not a PNG")
            image = image.convert("RGB")
            image.thumbnail((SHOWN_SIDE, SHOWN_SIDE))  # drawn at the width a page shows it (six maps were 2 MB)
            return np.asarray(image)
    except GradscopeError as exc:
        raise InputError(str(exc)) from None
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InputError(f"{png.name} is not an image ({type(exc).__name__})") from None


def _settings_table(settings: dict[str, Any]) -> str:
    rows = [(k, v if isinstance(v, str) else json.dumps(v, sort_keys=True)) for k, v in settings.items()]
    return "<h2>Settings</h2>" + table(["setting", "value"], rows, css="meta")


def _evaluation(run: Path) -> tuple[str, str, dict]:
    from gradscope.app.display.reports import evaluation_body
    from gradscope.app.evaluation.report import build_report

    report = build_report(run)
    settings = {**report.settings, **report.header}  # the header: model, data, total, the gradscope that ran it
    return f"Evaluation: {run.name}", evaluation_body(report), settings


def _training(run: Path) -> tuple[str, str, dict]:
    from gradscope.app.display.reports import training_body
    from gradscope.io.training_events import read_training_log

    log = read_training_log(run)
    settings = {
        "model": log.model_name,
        "recorded every": f"{log.every} steps",
        "statistics": log.statistics,
        "records": len(log.records),
        "run": log.run_id or "",
        "replicas": log.replicas,
        "plan": log.plan or "none (the standard gradient)",
        "clipping": log.clipping or "none",
        "written by": ", ".join(f"{k} {v}" for k, v in log.writer.items() if k in ("host", "pid")) or "",
    }
    return f"Training: {log.model_name} ({run.name})", training_body(log), settings


def _explanations(run: Path) -> tuple[str, str, dict]:
    from gradscope.app.files.exports import read_sidecar
    from gradscope.core.targets import describe_next_token

    pngs = _sidecars(run)
    cells, notes, methods, models, made_by, skipped = [], [], set(), set(), set(), []
    for png in pngs[:MAX_EXPLANATIONS]:
        try:
            pixels = _picture(png)
        except InputError as exc:
            skipped.append(str(exc))
            continue
        sidecar = read_sidecar(png)
        method, model = sidecar.get("method", "?"), sidecar.get("model", "?")
        methods.add(method)
        models.add(model)
        made_by.add(sidecar.get("gradscope_version", "?"))
        what = describe_next_token(sidecar["explained_token"]) if sidecar.get("explained_token") else ""
        patching = sidecar.get("patching") or {}
        if patching:  # a patching export: what it measured
            what = (
                f"{patching['metric']} (clean {patching['clean_value']:.4g}, corrupted {patching['corrupt_value']:.4g})"
            )
        if not what:
            target = sidecar.get("target") or {}
            index = target.get("index", sidecar.get("predicted_class"))
            what = f"class {index}" if index is not None else "top class"
        source = Path(str(sidecar.get("image") or "")).name
        caption = " · ".join(str(p) for p in (png.name, model, method, what, f"input {source}" if source else "") if p)
        cell = [figure(pixels, caption, photo=not patching)]  # a map over an image; a heat map stays PNG
        for component, a in (patching.get("agreement") or {}).items():  # how far an estimate held against exact
            words = f"{component}: {patching['method']} against exact, correlation {float(a['correlation']):.3f}"
            cell.append(f"<div class='note'>{esc(words)}</div>")
        plan = (sidecar.get("plan") or {}).get("rules") or (sidecar.get("plan") or {}).get("entries")
        if plan:
            cell.append(f"<div class='note'>plan: {esc(json.dumps(plan, sort_keys=True)[:400])}</div>")
        cells.append(f"<div>{''.join(cell)}</div>")
    if skipped:
        notes.append(f"<div class='note'>{len(skipped)} file(s) left out: {esc('; '.join(skipped))}</div>")
    if len(pngs) > MAX_EXPLANATIONS:
        notes.append(f"<div class='note'>… {len(pngs) - MAX_EXPLANATIONS} more pictures left out of this page</div>")
    settings = {
        "pictures": len(pngs) - len(skipped),
        "models": ", ".join(sorted(map(str, models))),
        "methods": ", ".join(sorted(map(str, methods))),
        "exported by gradscope": ", ".join(sorted(map(str, made_by))),
        LEFT_OUT: skipped,
    }
    name = run.name if run.is_dir() else run.stem
    return f"Explanations: {name}", f'<div class="grid">{"".join(cells)}</div>' + "".join(notes), settings


class WrittenReport(NamedTuple):
    path: Path
    left_out: list[str]  # files of the run the page does not show, each with why (a link out of the folder, ...)


def report_html(run: str | Path) -> str:
    """The page of ``run`` (see ``run_kind``)."""
    return _report(Path(run))[0]


def _report(run: Path) -> tuple[str, list[str]]:
    kind = run_kind(run)
    title, body, settings = {"evaluation": _evaluation, "training": _training, "explanations": _explanations}[kind](run)
    left_out = settings.pop(LEFT_OUT, [])
    html = page(title, body + _settings_table(settings), [("read from", str(run.resolve())), *versions()])
    return html, left_out


def write_report(run: str | Path, out: str | Path) -> WrittenReport:
    """Write ``report_html(run)`` to ``out``, atomically (an ``.html`` file: no run writes one, so a report never
    replaces what it was read from); with the files the page leaves out."""
    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise InputError(f"The report is an .html file; got {out.name}.")
    text, left_out = _report(Path(run))
    out.parent.mkdir(parents=True, exist_ok=True)
    return WrittenReport(write_text_atomic(out, text), left_out)
