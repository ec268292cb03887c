"""Evaluate methods over a dataset: batched, streamed to disk batch by batch, resumable, stoppable.

``run_evaluation`` cuts the dataset's sorted keys into batches of ``settings.batch`` images; each batch is read
(the next one in a thread while the model works), explained and scored (``gradscope.app.evaluation.scoring``),
and its record is written atomically to ``OUT/batches/NNNNNN.json``. A second run with the same ``OUT`` and
settings skips the batches on disk, so an interrupted run resumes where it stopped; the report
(``gradscope.app.evaluation.report``) is built from the records alone. Memory holds one batch at a time,
whatever the dataset's size.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gradscope.app.evaluation.records import (
    BatchClock,
    Progress,
    RunState,
    batch_path,
    batch_record,
    load_samples,
    pending_batches,
)
from gradscope.app.evaluation.scoring import (
    BASELINES,
    METRICS,
    SMOOTHED,
    EvalSettings,
    EvaluationError,
    OtherEvaluationError,
    eval_methods,
)
from gradscope.core.errors import Cancelled, GradscopeError, is_interrupt
from gradscope.core.files import write_text_atomic
from gradscope.core.json_text import read_json_file

__all__ = ["BASELINES", "METRICS", "SMOOTHED", "EvalSettings", "EvaluationError", "run_evaluation"]


# ------------------------------------------------------------------------------------------------- the run
def fingerprint(keys: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(keys).encode("utf-8")).hexdigest()[:16]


def prepare_out(out: Path, settings: EvalSettings, header: dict, restart: bool = False) -> None:
    """Create ``out`` with its ``settings.json``, or check that the one there is this run's (to resume it)."""
    if out.exists() and not out.is_dir():
        raise EvaluationError(f"{out} is a file; the results go into a folder: give another --out.")
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "batches").mkdir(exist_ok=True)
    except OSError as exc:
        raise EvaluationError(f"Cannot create the results folder {out}: {exc.strerror or exc}.") from None
    doc = {"settings": settings.to_dict(), **header}
    path = out / "settings.json"
    if path.exists() and not restart:
        try:
            old = read_json_file(path, "settings file", EvaluationError)
        except EvaluationError:
            old = None
        if old != json.loads(json.dumps(doc)):
            raise OtherEvaluationError(
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
    kept = engine.trace_cache_size
    engine.trace_cache_size = max(kept, len(methods) + 1)  # one trace per method, kept for the run (not after)
    try:
        return _run_batches(engine, source, settings, out, keys, methods, progress, should_stop)
    finally:
        engine.trace_cache_size = kept


def _run_batches(engine, source, settings, out, keys, methods, progress, should_stop) -> RunState:
    chunks, todo, state = pending_batches(keys, settings, out)
    clock = BatchClock(state.images_done, len(keys), progress)
    with ThreadPoolExecutor(1, thread_name_prefix="gradscope-read") as reader:
        pending = reader.submit(load_samples, source, chunks[todo[0]]) if todo else None
        try:
            for n, index in enumerate(todo):
                if should_stop is not None and should_stop():
                    raise Cancelled("stopped")
                loaded = pending.result()
                pending = reader.submit(load_samples, source, chunks[todo[n + 1]]) if n + 1 < len(todo) else None
                doc = batch_record(engine, methods, settings, index, chunks[index], loaded, source)
                write_text_atomic(batch_path(out, index), json.dumps(doc))
                state.computed += 1
                clock.add(len(chunks[index]))
        except (KeyboardInterrupt, SystemError, Cancelled) as exc:
            if not isinstance(exc, Cancelled) and not is_interrupt(exc):
                raise
            state.stopped = True
            if pending is not None:
                pending.cancel()
    state.seconds = clock.seconds
    return state


def evaluation_settings(methods: Any, metrics: Any, plan: Any = None, **options: Any) -> EvalSettings:
    """Settings from comma-separated text or lists; ``plan`` (a ``Plan`` or its file) is one more method, named
    by its name (else its file's stem, else "plan")."""
    from gradscope.rules.plan import Plan

    methods, plan_doc, plan_name = _listed("methods", methods), None, None
    if plan is not None:
        if not isinstance(plan, Plan):
            plan_name = Path(plan).stem
            plan = Plan.load(plan)
        plan_name = plan.name or plan_name or "plan"
        plan_doc = plan.to_dict()
        methods.append(plan_name)
    return EvalSettings(
        methods=methods, metrics=_listed("metrics", metrics), plan=plan_doc, plan_name=plan_name, **options
    )


def _listed(what: str, value: Any) -> list[str]:
    """``"a,b"`` or a list of names as a list of names; anything else one line (``methods=[1, 2]``)."""
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        bad = next((n for n in names if not isinstance(n, str)), names) if isinstance(names, (list, tuple)) else names
        raise EvaluationError(
            f"{what} are names, as text ('gradient,cmwp') or a list of text; got {type(bad).__name__} {bad!r:.60}."
        )
    return [n.strip() for n in names if n.strip()]


def source_of(
    engine: Any,
    data: Any,
    settings: EvalSettings,
    *,
    masks: Any = None,
    class_map: Any = None,
    difficult: Any = None,
    preprocessing: str = "unit",
    class_names: Any = None,
    split: str = "val",
    vocab: Any = None,
) -> Any:
    """The samples of ``data``: for the text metrics a ``TextDataset`` (a JSONL or CSV file or a folder of
    ``.txt`` files, read with ``vocab``); a folder (``ImageFolder`` in any layout ``find_layout`` reads: masks
    read for the Pointing Game only; a Pascal VOC folder's classes mapped to the model's by name when it has
    ``class_names`` and no class map is given), an array of model inputs with ``masks``, or anything with ``keys()`` and
    ``load(key)``."""
    import numpy as np

    from gradscope.io.datasets import (
        VOC_CLASSES,
        ArraySamples,
        ImageFolder,
        class_map_by_name,
        find_layout,
        load_class_map,
        load_difficult_flags,
    )

    if settings.text and isinstance(data, (str, Path)):
        from gradscope.io.text_datasets import TextDataset

        return TextDataset(data, vocab)
    if isinstance(data, (str, Path)):
        if isinstance(class_map, (str, Path)):
            class_map = load_class_map(class_map)
        pointing = "pointing" in settings.metrics
        if class_map is None and class_names and pointing and find_layout(data, split).name == "voc":
            class_map = class_map_by_name(VOC_CLASSES, class_names)
        graph = engine.graph
        return ImageFolder(
            Path(data).expanduser(),
            tuple(graph.node(graph.input_ids[0]).output_shape),
            preprocessing,
            with_masks=pointing,
            class_map=class_map,
            classes=graph.class_count(),
            difficult_flags=load_difficult_flags(difficult) if difficult is not None else None,
            split=split,
        )
    if isinstance(data, np.ndarray):
        return ArraySamples(data, masks)
    return data


def check_model(engine: Any, settings: EvalSettings) -> None:
    """The image metrics are defined for image classifiers: one (H, W, 1 or 3) input, a (batch, classes) output;
    the text metrics for a model that reads token ids."""
    if settings.text:
        from gradscope.app.evaluation.text_scoring import check_text_model

        try:
            return check_text_model(engine)
        except GradscopeError as exc:
            raise EvaluationError(str(exc)) from None
    graph = engine.graph
    shapes = [graph.node(i).output_shape for i in graph.input_ids]
    if len(shapes) != 1 or len(shapes[0]) != 4 or shapes[0][-1] not in (1, 3):
        raise EvaluationError(
            f"gradscope evaluate scores image classifiers (one (height, width, 1 or 3) input) on the image metrics; "
            f"this model takes {', '.join(str(tuple(s)) for s in shapes)}. A text model: --metric abpc (see "
            "docs/evaluation.md)."
        )
    if not graph.class_count():
        raise EvaluationError(
            f"gradscope evaluate needs a (batch, classes) output to pick a class; this model outputs "
            f"{graph.node(graph.output_ids[0]).output_shape}."
        )


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
    ``ray``: None (this process), or a ``RayOptions`` (``gradscope.app.evaluation.on_ray``: the same batches on a
    Ray cluster). Returns the run's state and its ``EvalReport`` (of every batch on disk, also when stopped)."""
    from gradscope import __version__
    from gradscope.app.evaluation.report import build_report

    settings.check()
    check_model(engine, settings)
    eval_methods(engine, settings)  # an unknown method or node fails before the folder is touched
    if settings.text:  # a mask baseline without a mask token, too
        from gradscope.engine.evaluation.token_curves import replacement_id

        try:
            replacement_id(source.vocabulary() if hasattr(source, "vocabulary") else None, settings.baseline)
        except GradscopeError as exc:
            raise EvaluationError(str(exc)) from None
    keys = source.keys()
    if not keys:
        raise EvaluationError(f"The dataset holds no {'texts' if settings.text else 'images'}.")
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
        from gradscope.app.evaluation.on_ray import run_batches_ray

        state = run_batches_ray(ray, source, settings, out, keys, progress=progress, should_stop=should_stop)
    report = build_report(out)
    report.write(out)
    return state, report
