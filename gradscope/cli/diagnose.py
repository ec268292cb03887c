"""``gradscope flow`` and ``gradscope diagnose``: the gradient-flow report and the path diagnostics."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.cli import _engine
from gradscope.core.results import non_finite_input_warnings
from gradscope.core.targets import Target
from gradscope.engine.flow import gradient_flow
from gradscope.engine.paths import diagnose_model
from gradscope.io.arrays import read_arrays


def _cli_inputs(args: Any, engine: Any) -> list[np.ndarray] | None:
    """Model inputs from ``--input`` files: .npy (one array), .npz (one array per model input), or images."""
    from gradscope.core.errors import ImageLoadError

    files = list(getattr(args, "input", None) or [])
    if not files:
        return None
    input_ids = engine.graph.input_ids
    arrays: list[np.ndarray] = []
    for f in files:
        p = Path(f).expanduser()
        if not p.is_file():
            raise ImageLoadError(f"Input file not found: {p}")
        if p.suffix.lower() in (".npy", ".npz"):
            named = read_arrays(p)
            if set(named) >= set(input_ids) and len(input_ids) > 1:  # an .npz named as the inputs
                named = {k: named[k] for k in input_ids}
            arrays.extend(named.values())
        else:
            from gradscope.io.images import load_image, prepare_input

            which = input_ids[min(len(arrays), len(input_ids) - 1)]
            shape = engine.graph.node(which).output_shape
            arrays.append(prepare_input(load_image(p), shape, getattr(args, "preprocessing", "unit")))
    if len(input_ids) == 1 and len(arrays) > 1:  # several files for one input: one batch
        arrays = [
            np.concatenate(
                [a if a.ndim == len(engine.graph.node(input_ids[0]).output_shape) else a[None] for a in arrays]
            )
        ]
    if len(arrays) != len(input_ids):
        raise ImageLoadError(
            f"The model takes {len(input_ids)} inputs ({', '.join(input_ids)}); got {len(arrays)} array(s). "
            "Give one --input per model input, or one .npz file holding them in order."
        )
    return engine.checked_inputs(arrays)  # shape and dtype per input, before labels are matched to the batch


def _random_inputs(engine: Any, batch: int = 8) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for node_id in engine.graph.input_ids:
        shape = [d if d is not None else 32 for d in engine.graph.node(node_id).output_shape[1:]]
        out.append(rng.normal(size=(batch, *shape)).astype(np.float32))
    return out


def _cli_labels(text: str | None) -> np.ndarray | None:
    from gradscope.core.errors import TargetError

    if text is None:
        return None
    p = Path(text).expanduser()
    if p.suffix.lower() == ".npy":
        if not p.is_file():
            raise TargetError(f"Labels file not found: {p}")
        return np.load(p, allow_pickle=False)
    parts = [s.strip() for s in text.split(",") if s.strip()]
    try:
        values = [float(s) for s in parts]
    except ValueError:
        raise TargetError(f"Cannot read labels {text!r}: give class indices like 3 or 0,2,1, or a .npy file.") from None
    if all(v == int(v) for v in values):
        return np.array([int(v) for v in values], np.int64)
    return np.array(values, np.float32)


def _info(args: Any, message: str) -> None:
    import sys

    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr)


def cmd_flow(args: Any) -> int:
    """``gradscope flow MODEL [--input F ...] [--label L] [--loss NAME] [--csv F] [--png F] [--json]``."""
    import json

    from gradscope.rules.plan import Plan

    engine = _engine(args)
    xs = _cli_inputs(args, engine)
    if xs is None:
        xs = _random_inputs(engine)
        _info(args, f"no --input: using {len(xs[0])} seeded random samples")
    labels = _cli_labels(getattr(args, "label", None))
    if labels is not None and labels.ndim == 1 and labels.size == 1 and len(xs[0]) > 1:
        labels = np.repeat(labels, len(xs[0]))
    target = Target.parse(args.target) if getattr(args, "target", None) else None
    plan = Plan.load(args.plan) if getattr(args, "plan", None) else None
    report = gradient_flow(
        engine,
        xs if len(xs) > 1 else xs[0],
        labels=labels,
        loss=getattr(args, "loss", None),
        weight_grads=not getattr(args, "no_weights", False),
        target=target,
        plan=plan,
        output=getattr(args, "output", None),
    )
    print(json.dumps(report.to_dict(), indent=2, default=str) if getattr(args, "json", False) else report.to_text())
    if getattr(args, "csv", None):
        _info(args, f"wrote {report.to_csv(args.csv)}")
    if getattr(args, "png", None):
        _info(args, f"wrote {report.to_png(args.png)}")
    warnings = non_finite_input_warnings(xs) + engine.weight_problems()
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)  # shown even with -q: the table alone does not say why
    if warnings and getattr(args, "strict", False):
        print("--strict: warnings make this a failure.", file=sys.stderr)
        return 1
    return 0


def cmd_diagnose(args: Any) -> int:
    """``gradscope diagnose MODEL [--input F ...] [--target T | --label L [--loss NAME]] [--json]``.

    Exit code 0 when every trainable variable gets a gradient, 1 when some do not.
    """
    import json

    engine = _engine(args)
    xs = _cli_inputs(args, engine)
    labels = _cli_labels(getattr(args, "label", None))
    target = Target.parse(args.target) if getattr(args, "target", None) else None
    if labels is not None or getattr(args, "loss", None):
        target = Target(kind="loss", loss=getattr(args, "loss", None), node=getattr(args, "output", None))
    if labels is not None and labels.ndim == 1 and labels.size == 1:
        labels = np.repeat(labels, len(xs[0]) if xs else 2)
    report = diagnose_model(engine, None if xs is None else (xs if len(xs) > 1 else xs[0]), target, labels=labels)
    print(json.dumps(report.to_dict(), indent=2, default=str) if getattr(args, "json", False) else report.to_text())
    return 0 if report.ok else 1
