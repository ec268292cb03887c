"""``gradscope evaluate MODEL DATA``: score methods over a dataset (exit 2 when some images could not be used)."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

from gradscope.cli.common import (
    PREPROCESSING,
    add_command,
    info,
    model_argument,
    model_options,
    open_engine,
    ray_options,
    ray_options_of,
    warn,
)
from gradscope.cli.interrupt import INTERRUPT_GRACE
from gradscope.core.errors import EXIT_USER_ERROR


def _progress_printer(enabled: bool) -> Any:
    if not enabled:
        return None
    start = time.perf_counter()

    def show(done: int, total: int, left: float) -> None:
        bar = int(30 * done / max(total, 1))
        eta = "" if not math.isfinite(left) else f" ETA {_duration(left)}"
        elapsed = _duration(time.perf_counter() - start)
        sys.stderr.write(f"\r[{'#' * bar}{'.' * (30 - bar)}] {done}/{total} samples, {elapsed}{eta}    ")
        sys.stderr.flush()
        if done >= total:
            sys.stderr.write("\n")

    return show


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def run(args: Any) -> int:
    """Run (or resume) an evaluation into ``--out``; print the table; list the images that could not be used."""
    from gradscope.api import evaluate

    ray = ray_options_of(args)
    INTERRUPT_GRACE["seconds"] = 120.0  # Ctrl-C: the batch in flight ends, the report of what is done is written
    engine = open_engine(args)  # also here: the settings are checked and the report is built in this process
    out = Path(args.out)
    info(args, f"evaluating {args.method or ''}{' + plan ' + args.plan if args.plan else ''} on {args.data} -> {out}")
    report = evaluate(
        engine,
        args.data,
        methods=args.method or ([] if args.plan else ["gradient"]),
        plan=args.plan,
        metrics=args.metric,
        out=out,
        class_map=args.class_map,
        difficult=args.difficult,
        class_names=_class_names(args.model),
        split=args.split,
        preprocessing=args.preprocessing,
        batch=args.batch,
        tolerance=args.tolerance,
        steps=args.steps,
        fidelity_samples=args.fidelity_samples,
        seed=args.seed,
        restart=args.restart,
        progress=_progress_printer(not args.quiet),
        ray=ray,
        safe_mode=not args.unsafe,
        vocab=args.vocab or _vocabulary_beside(args.model),
        baseline=args.baseline,
    )
    print(report.to_text())
    print(
        f"\nresults in {out}: results.csv, results.json, differences.csv, per_image.csv"
        + (", curves.png" if report.curves else "")
        + (", curves.csv" if report.samples else "")
    )
    if report.bad:
        warn(args, f"\n{len(report.bad)} image(s) could not be used:")
        for item in report.bad:
            warn(args, f"  {item['key']}: {item['reason']}")
    if not report.complete:
        warn(
            args,
            f"stopped after {report.images + len(report.bad)} of {report.total} images; run the same "
            "command again to resume",
        )
        return 130
    return EXIT_USER_ERROR if report.bad else 0


def add_parser(sub: Any) -> None:
    p = add_command(
        sub,
        "evaluate",
        run,
        help="score methods over a dataset: Pointing Game, deletion, insertion, MuFidelity (resumable; exit 2 on "
        "bad data)",
        description="Score methods over a folder of images. For the Pointing Game, masks/<image stem>.png holds "
        "each image's class mask (pixel = class index + 1, 0 background, 255 ignore). A second run with the same "
        "--out resumes where the first stopped.",
    )
    model_argument(p)
    p.add_argument(
        "data",
        help="folder of images (with masks/ for the Pointing Game), or text: a .jsonl or .csv file or a folder of .txt",
    )
    p.add_argument("--method", help="comma-separated presets, PRESET@NODE, center, random (default: gradient)")
    p.add_argument("--plan", help="plan JSON file: evaluated as one more method, named by the plan")
    p.add_argument(
        "--metric",
        help="comma-separated: pointing, deletion, insertion, mufidelity (images; default pointing), or abpc, "
        "comprehensiveness, sufficiency, token_pointing (text; default the first three)",
    )
    p.add_argument(
        "--baseline",
        default="zero",
        choices=("zero", "pad", "mask"),
        help="text: what replaces a removed token's input embedding (default zero)",
    )
    p.add_argument("--vocab", help="text: vocabulary file or tokenizer folder (default: the model's own)")
    p.add_argument("--out", default="evaluation", help="results folder (default: ./evaluation); resumed if it exists")
    p.add_argument("--restart", action="store_true", help="discard the run in --out and start again")
    p.add_argument(
        "--class-map",
        metavar="FILE",
        help="JSON {mask value: model class index} (default: value - 1; a Pascal VOC folder: by class name when the "
        "model's class names are beside it)",
    )
    p.add_argument("--split", default="val", help="a Pascal VOC folder's split (ImageSets/Segmentation; default val)")
    p.add_argument(
        "--difficult",
        metavar="FILE",
        help="TorchRay's difficult-pairs file (image stem, a 0/1 flag per class); default: from the masks",
    )
    p.add_argument(
        "--preprocessing",
        default="unit",
        choices=PREPROCESSING,
        help="how pixels are scaled for the model (default unit: /255)",
    )
    p.add_argument("--batch", type=int, default=16, help="images per batch (default 16)")
    p.add_argument("--tolerance", type=float, default=15.0, help="Pointing Game hit distance in pixels (default 15)")
    p.add_argument("--steps", type=int, default=20, help="deletion/insertion steps (default 20)")
    p.add_argument("--fidelity-samples", type=int, default=200, help="MuFidelity subsets per image (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of random maps, subsets and the bootstrap (default 0)")
    ray_options(p, "run the batches")
    model_options(p)


def _vocabulary_beside(model: Any) -> Any:
    """The vocabulary beside the model file, or a checkpoint folder's tokenizer (None: the texts give ids)."""
    from gradscope.app.files.session_files import find_vocabulary

    return find_vocabulary(model) if model else None


def _class_names(model: Any) -> list[str]:
    """The model's class names from a description beside it (to map a VOC folder's classes by name)."""
    from gradscope.app.files.session_files import find_class_names

    return find_class_names(model) if model else []
