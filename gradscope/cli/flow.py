"""``gradscope flow``: per-layer gradient flow (of a training loss with ``--label``) as a table, CSV, PNG."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from gradscope.cli import loss_inputs
from gradscope.cli.common import add_command, distinct_outputs, info, model_argument, open_engine
from gradscope.cli.loss_inputs import random_inputs, read_inputs, read_labels


def add_parser(sub: Any) -> None:
    p = add_command(
        sub, "flow", run, help="per-layer gradient flow (of a training loss with --label) as a table, CSV, PNG"
    )
    model_argument(p)
    loss_inputs.add_options(p)
    p.add_argument("--plan", help="plan JSON file: the flow under these rules (default: the plain gradient)")
    p.add_argument("--no-weights", action="store_true", help="skip weight gradients (faster; no |grad W|/|W|)")
    p.add_argument("--strict", action="store_true", help="exit 1 on a warning (NaN/Inf in the input or weights)")
    p.add_argument("--csv", metavar="FILE", help="write one row per node to FILE")
    p.add_argument("--png", metavar="FILE", help="write a chart of the flow to FILE")


def run(args: Any) -> int:
    """``gradscope flow MODEL [--input F ...] [--label L] [--loss NAME] [--csv F] [--png F] [--json]``."""
    import json

    from gradscope.core.results import non_finite_input_warnings
    from gradscope.core.targets import Target
    from gradscope.engine.diagnostics.flow import gradient_flow
    from gradscope.rules.plan import Plan

    inputs = (args.model, getattr(args, "plan", None), *(getattr(args, "input", None) or ()))
    distinct_outputs({"--csv": getattr(args, "csv", None), "--png": getattr(args, "png", None)}, inputs)
    engine = open_engine(args)
    xs = read_inputs(args, engine)
    if xs is None:
        xs = random_inputs(engine)
        info(args, f"no --input: using {len(xs[0])} seeded random samples")
    labels = read_labels(getattr(args, "label", None))
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
        info(args, f"wrote {report.to_csv(args.csv)}")
    if getattr(args, "png", None):
        info(args, f"wrote {report.to_png(args.png)}")
    warnings = non_finite_input_warnings(xs) + engine.weight_problems()
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)  # shown even with -q: the table alone does not say why
    if warnings and getattr(args, "strict", False):
        print("--strict: warnings make this a failure.", file=sys.stderr)
        return 1
    return 0
